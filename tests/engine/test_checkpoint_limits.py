"""Safetensors headers at and past their limits: sizes no 64-bit file can hold, headers
too large to be real, and a long read that reports progress and can be stopped.

Real headers are small: DeepSeek-V3's largest shard header is well under 1 MiB and its
163 shards' headers take about 12 MB together. A header or a folder of headers far past
that is refused, with the file and the bound named, before it is parsed.

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

from memfit.engine import checkpoint
from memfit.engine.checkpoint import (
    MAX_ELEMENTS,
    ReadCancelled,
    model_from_folder,
    read_checkpoint,
    read_safetensors_header,
)
from memfit.engine.cli import main
from memfit.engine.errors import EstimateError
from memfit.engine.imports import import_cached, import_path
from memfit.engine.scenario_io import scenario_from_dict
from tests.engine.test_checkpoint import (
    CONFIG,
    model_folder,
    plain_tensors,
    write_raw,
    write_safetensors,
)
from tests.engine.test_imports import cached

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


# -- headers too large to be real ----------------------------------------------------------


def reads_of(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of every read of a safetensors file from now on."""
    reads: list[int] = []
    real = checkpoint._read_exact

    def read_exact(fd: int, n: int) -> bytes:
        reads.append(n)
        return real(fd, n)

    monkeypatch.setattr(checkpoint, "_read_exact", read_exact)
    return reads


def claiming(path: Path, n: int) -> Path:
    """A file whose header claims ``n`` bytes and that is long enough for it (sparse)."""
    with open(path, "wb") as f:
        f.write(n.to_bytes(8, "little"))
        f.truncate(8 + n + 16)
    return path


def test_bounds_are_stated_and_real_checkpoints_fit_them() -> None:
    # DeepSeek-V3's largest shard header is under 1 MiB, its 163 headers ~12 MB together
    assert checkpoint.MAX_HEADER_BYTES >= 8 << 20
    assert checkpoint.MAX_FOLDER_HEADER_BYTES >= 32 << 20
    assert checkpoint.MAX_HEADER_BYTES < 60_000_000 < checkpoint.MAX_FOLDER_HEADER_BYTES * 10


@pytest.mark.parametrize("n", [checkpoint.MAX_HEADER_BYTES + 1, 60_000_000, 2**40])
def test_a_header_over_the_bound_is_refused_unread(
    tmp_path: Path, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = claiming(tmp_path / "big.safetensors", n)
    reads = reads_of(monkeypatch)
    with pytest.raises(EstimateError) as info:
        read_safetensors_header(path)
    message = str(info.value)
    assert "big.safetensors" in message and f"{checkpoint.MAX_HEADER_BYTES:,}" in message
    assert reads == [8]  # its length only


def test_a_folder_whose_headers_together_are_over_the_bound_is_refused_unparsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))
    per_file = checkpoint.MAX_HEADER_BYTES - 8
    files = checkpoint.MAX_FOLDER_HEADER_BYTES // per_file + 1
    for i in range(files):
        claiming(folder / f"model-{i:05d}.safetensors", per_file)
    reads = reads_of(monkeypatch)
    with pytest.raises(EstimateError) as info:
        read_checkpoint(folder)
    message = str(info.value)
    assert f"model-{files - 1:05d}.safetensors" in message
    assert f"{checkpoint.MAX_FOLDER_HEADER_BYTES:,}" in message
    assert reads == [8] * files  # the lengths only


def test_a_folder_of_too_many_files_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint, "MAX_FILES", 3)
    folder = model_folder(tmp_path / "m", plain_tensors())
    for i in range(3):
        write_safetensors(folder / f"extra-{i}.safetensors", {f"extra.{i}": ("F32", [1])})
    with pytest.raises(EstimateError, match="4 safetensors files; over 3"):
        read_checkpoint(folder)


# -- progress and cancel --------------------------------------------------------------------


def many_tensors(folder: Path, files: int = 3, per_file: int = 9000) -> Path:
    """A model folder of ``files`` shards of ``per_file`` tiny tensors each."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))
    for f in range(files):
        tensors = {f"t.{f}.{i}.weight": ("F32", [1]) for i in range(per_file)}
        write_safetensors(folder / f"model-{f:05d}-of-{files:05d}.safetensors", tensors)
    return folder


def header_bytes(folder: Path) -> int:
    return sum(int.from_bytes(p.read_bytes()[:8], "little") for p in folder.glob("*.safetensors"))


def test_progress_counts_header_bytes_up_to_the_total(tmp_path: Path) -> None:
    folder = many_tensors(tmp_path / "m")
    seen: list[tuple[int, int]] = []
    info = read_checkpoint(folder, progress=lambda done, total: seen.append((done, total)))
    assert info.tensor_count == 27000
    total = header_bytes(folder)
    assert {t for _, t in seen} == {total}
    dones = [d for d, _ in seen]
    assert dones == sorted(dones) and dones[0] == 0 and dones[-1] == total
    assert len(seen) > 2 * 3  # within files too, not only between them


@pytest.mark.parametrize("after", [0, 1, 3, 7])
def test_cancel_stops_the_reading_at_the_next_poll(tmp_path: Path, after: int) -> None:
    folder = many_tensors(tmp_path / "m")
    polls: list[int] = []

    def cancelled() -> bool:
        polls.append(1)
        return len(polls) > after

    with pytest.raises(ReadCancelled):
        read_checkpoint(folder, cancelled=cancelled)
    assert len(polls) == after + 1


def test_every_entry_point_takes_progress_and_cancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = many_tensors(tmp_path / "files", files=2, per_file=5000)
    root = tmp_path / "hub"
    cached(root, "org/many", folder)
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    base = scenario_from_dict(
        {"memfit_scenario": 1, "model": {"preset": "gpt2"}, "hardware": {"gpu": "l4"}}
    )
    reads = {
        "model_from_folder": lambda **kw: model_from_folder(folder, **kw),
        "read_checkpoint": lambda **kw: read_checkpoint(folder, **kw),
        "import_path": lambda **kw: import_path(folder, base, **kw),
        "import_cached": lambda **kw: import_cached("org/many", base, **kw),
    }
    for name, read in reads.items():
        seen: list[int] = []
        read(progress=lambda done, total, seen=seen: seen.append(done))
        assert seen[-1] == header_bytes(folder), name
        with pytest.raises(ReadCancelled):
            read(cancelled=lambda: True)
