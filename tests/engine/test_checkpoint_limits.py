"""Safetensors headers at and past their limits: sizes no 64-bit file can hold, headers
too large to be real, and a long read that reports progress and can be stopped.

safetensors stores sizes as unsigned 64-bit integers, so a dimension or an element count
over 2^64 - 1 describes no tensor any file holds; such a header is refused with a short
error before any arithmetic on it (a float division of a 400-digit byte count overflows).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from engine.checkpoint import MAX_ELEMENTS, read_safetensors_header
from engine.cli import main
from engine.errors import EstimateError
from tests.engine.test_checkpoint import CONFIG, write_raw

#: shapes no safetensors file holds: a dimension or the element count over 2^64 - 1
ABSURD_SHAPES: dict[str, list[int]] = {
    "400 digits": [10**400],
    "4,000 digits": [10**4000],
    "2^64": [2**64],
    "2^64 x 2^64": [2**64, 2**64],
    "2^32 x 2^32": [2**32, 2**32],
    "2^63 x 3": [2**63, 3],
    "64 dimensions of 2": [2] * 64,
    "a zero beside 2^64": [0, 2**64],
    "2^64 beside a zero": [2**64, 0],
    "odd and huge": [3**40, 3**40],
    "odd, 400 digits": [3**840],
}
#: dtypes of every width, odd ones among them, and one MemFit does not know
DTYPES = ("F32", "BF16", "U8", "F4", "F6_E2M3", "F6_E3M2", "F8_E4M3", "C64", "Q3_K")


def header(path: Path, shape: Any, dtype: str, offsets: Any = (0, 16)) -> Path:
    raw = json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": list(offsets)}})
    return write_raw(path, raw.encode(), 16)


def no_long_numbers(message: str) -> bool:
    return not re.search(r"\d{25,}", message.replace(",", ""))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(ABSURD_SHAPES))
def test_absurd_shapes_are_refused_in_a_short_line(tmp_path: Path, case: str, dtype: str) -> None:
    path = header(tmp_path / "model.safetensors", ABSURD_SHAPES[case], dtype)
    with pytest.raises(EstimateError) as info:
        read_safetensors_header(path)
    message = str(info.value)
    assert "model.safetensors" in message and "tensor 't'" in message
    assert "2^64 - 1" in message
    assert len(message) < 300 and no_long_numbers(message)


@pytest.mark.parametrize("dtype", ("F4", "F6_E2M3", "F6_E3M2"))
@pytest.mark.parametrize("shape", ([2**63 - 1], [3**39, 3], [1], [7, 9]))
def test_odd_bit_widths_with_large_counts_say_the_exact_size(
    tmp_path: Path, dtype: str, shape: list[int]
) -> None:
    path = header(tmp_path / "model.safetensors", shape, dtype)
    with pytest.raises(EstimateError, match="takes") as info:
        read_safetensors_header(path)
    message = str(info.value)
    assert len(message) < 300 and no_long_numbers(message)
    bits = {"F4": 4}.get(dtype, 6)
    count = 1
    for d in shape:
        count *= d
    whole, part = divmod(count * bits, 8)
    assert f"{whole:,}" in message
    if part:  # the fraction is exact, not a float's rounding
        assert f"{whole:,}.{part * 125:03d}".rstrip("0") + " bytes" in message


def test_the_largest_count_a_file_can_describe_is_read(tmp_path: Path) -> None:
    # an unknown dtype has no size to check, so 2^64 - 1 elements of it stand
    path = header(tmp_path / "model.safetensors", [MAX_ELEMENTS], "Q3_K", (0, 0))
    assert read_safetensors_header(path)["t"]["shape"] == [2**64 - 1]
    path = header(tmp_path / "model.safetensors", [2**32, 2**32 - 1, 1], "Q3_K", (0, 0))
    read_safetensors_header(path)


@pytest.mark.parametrize("case", sorted(ABSURD_SHAPES))
def test_memfit_checkpoint_says_so_in_one_line(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))
    header(folder / "model.safetensors", ABSURD_SHAPES[case], "F4")
    assert main(["checkpoint", str(folder)], io.StringIO()) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("memfit: error: checkpoint:")
    assert no_long_numbers(err)


@pytest.mark.parametrize("where", ("shape", "data_offsets", "metadata"))
def test_numbers_no_integer_holds_are_refused_in_words(tmp_path: Path, where: str) -> None:
    huge = "9" * 5000
    entries = {
        "shape": f'{{"t": {{"dtype": "F32", "shape": [{huge}], "data_offsets": [0, 16]}}}}',
        "data_offsets": f'{{"t": {{"dtype": "F32", "shape": [4], "data_offsets": [0, {huge}]}}}}',
        "metadata": f'{{"__metadata__": {{"n": {huge}}}}}',
    }
    path = write_raw(tmp_path / "model.safetensors", entries[where].encode(), 16)
    with pytest.raises(EstimateError, match="over 4,300 digits") as info:
        read_safetensors_header(path)
    assert len(str(info.value)) < 120 and "sys." not in str(info.value)
