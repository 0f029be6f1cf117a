"""Safe file I/O: bounded reads that never block, saves that behave like an editor's."""

import json
import os
import stat
from pathlib import Path

import pytest

from engine.errors import EstimateError
from engine.files import (
    MAX_READ_BYTES,
    FileRefused,
    parse_json,
    read_json,
    read_text,
    write_bytes,
    write_text,
)
from engine.scenario_io import load_scenario, save_scenario, scenario_from_dict

SCENARIO = {"memfit_scenario": 1, "model": {"preset": "gpt2"}, "hardware": {"gpu": "l4"}}


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(EstimateError, match="FIFO"):
        read_text(fifo)


def test_a_device_is_refused_not_read_until_memory_runs_out() -> None:
    with pytest.raises(EstimateError, match="character device"):
        read_text("/dev/zero")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EstimateError, match="directory"):
        read_text(tmp_path)


def test_a_file_over_the_limit_is_refused_with_its_size(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_READ_BYTES + 1))
    with pytest.raises(EstimateError, match=f"{MAX_READ_BYTES + 1:,} bytes"):
        read_text(big)


def test_a_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(EstimateError, match=r"nope\.json"):
        read_text(tmp_path / "nope.json", "model")


def test_a_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.memfit.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(SCENARIO).encode())
    assert load_scenario(path).model.name == "gpt2"


def test_bytes_that_are_not_utf8_are_an_error(tmp_path: Path) -> None:
    path = tmp_path / "latin.json"
    path.write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(EstimateError, match="not UTF-8"):
        read_json(path)


@pytest.mark.parametrize(
    "text, words",
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"a": ' + "9" * 5000 + "}", "not valid JSON"),
        ("{", "not valid JSON"),
    ],
)
def test_hostile_json_is_one_named_error(text: str, words: str) -> None:
    with pytest.raises(EstimateError, match=words):
        parse_json(text)


def test_save_follows_a_symlink_and_keeps_it(tmp_path: Path) -> None:
    target = tmp_path / "real.memfit.json"
    target.write_text("{}")
    link = tmp_path / "link.memfit.json"
    link.symlink_to(target)
    save_scenario(scenario_from_dict(SCENARIO), link)
    assert link.is_symlink()
    assert json.loads(target.read_text())["model"] == {"preset": "gpt2"}


def test_save_keeps_the_mode_of_the_file_it_replaces(tmp_path: Path) -> None:
    path = tmp_path / "shared.memfit.json"
    path.write_text("{}")
    path.chmod(0o640)
    write_text(path, "new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert path.read_text() == "new"


def test_a_new_file_gets_the_users_default_mode(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        write_bytes(tmp_path / "new.csv", b"a,b\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.csv").stat().st_mode) == 0o640


@pytest.mark.parametrize("kind", ["fifo", "directory", "device link"])
def test_save_refuses_a_target_that_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "target"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/null")
    with pytest.raises(FileRefused, match="not a file"):
        write_text(path, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]  # no temp file left


def test_a_failed_save_leaves_no_temporary_file_and_names_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "keep.csv"
    path.write_text("old")

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(FileRefused, match=r"cannot write .*keep\.csv: No space left"):
        write_text(path, "new")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.csv"]


def test_text_that_is_not_unicode_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(FileRefused, match="not valid Unicode"):
        write_text(tmp_path / "a.json", "\ud800")
    assert list(tmp_path.iterdir()) == []
