"""Safe file I/O: bounded reads that never block, saves that behave like an editor's."""

import json
import os
import stat
from pathlib import Path

import pytest

from memfit.engine.errors import EstimateError
from memfit.engine.files import (
    MAX_READ_BYTES,
    FileRefused,
    parse_json,
    read_json,
    read_text,
    write_bytes,
    write_text,
)
from memfit.engine.scenario_io import load_scenario, save_scenario, scenario_from_dict

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


@pytest.mark.parametrize("mode", [0o444, 0o400, 0o440, 0o555], ids=oct)
def test_save_refuses_a_read_only_file_and_leaves_it_as_it_was(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "locked.memfit.json"
    path.write_text("old")
    path.chmod(mode)
    with pytest.raises(FileRefused, match=r"cannot write .*locked\.memfit\.json: it is read-only"):
        write_text(path, "new")
    assert path.read_text() == "old" and stat.S_IMODE(path.stat().st_mode) == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locked.memfit.json"]


def test_save_refuses_a_read_only_file_behind_a_link(tmp_path: Path) -> None:
    target = tmp_path / "real.csv"
    target.write_text("old")
    target.chmod(0o444)
    link = tmp_path / "link.csv"
    link.symlink_to(target.name)
    with pytest.raises(FileRefused, match=r"real\.csv: it is read-only"):
        write_text(link, "new")
    assert target.read_text() == "old" and link.is_symlink()


def test_a_file_writable_by_its_owner_only_is_saved(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("old")
    path.chmod(0o600)
    write_text(path, "new")
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o600


def _temp_file(folder: Path, target: str, age_s: float, random: str = "ab12cd_9") -> Path:
    """A temporary file of a save of ``target`` as :func:`write_bytes` names them, last
    modified ``age_s`` seconds ago."""
    tmp = folder / f".{target}.{random}.tmp"
    tmp.write_bytes(b"half a save")
    when = tmp.stat().st_mtime - age_s
    os.utime(tmp, (when, when))
    return tmp


def test_a_save_removes_stale_temporary_files_of_its_target_only(tmp_path: Path) -> None:
    path = tmp_path / "run.memfit.json"
    stale = [_temp_file(tmp_path, path.name, 3600, r) for r in ("ab12cd_9", "zz99zz99")]
    fresh = _temp_file(tmp_path, path.name, 0, "fresh123")  # another save under way
    other = _temp_file(tmp_path, "other.memfit.json", 3600)  # another target's
    odd = [
        _temp_file(tmp_path, path.name, 3600, "toolongname"),  # not a name of ours
        _temp_file(tmp_path, path.name, 3600, "UPPER123"),
    ]
    folder = tmp_path / f".{path.name}.dir12345.tmp"
    folder.mkdir()
    link = tmp_path / f".{path.name}.link1234.tmp"
    link.symlink_to(other.name)
    os.utime(link, (1, 1), follow_symlinks=False)
    write_text(path, "{}")
    assert path.read_text() == "{}"
    assert not any(p.exists() for p in stale)
    for kept in (fresh, other, *odd, folder):
        assert kept.exists(), kept.name
    assert link.is_symlink() and other.read_bytes() == b"half a save"


KILLED_SAVE = """
import os, signal, sys
from memfit.engine import files
def killed(src, dst):
    os.kill(os.getpid(), signal.SIGKILL)
files.os.replace = killed
files.write_text(sys.argv[1], "new")
"""


def test_a_save_killed_before_its_rename_leaves_a_temporary_file_the_next_save_removes(
    tmp_path: Path,
) -> None:
    import signal
    import subprocess
    import sys

    path = tmp_path / "run.memfit.json"
    path.write_text("old")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_SAVE, str(path)], env=env, timeout=60, check=False
    )
    assert proc.returncode == -signal.SIGKILL
    (left,) = (p for p in tmp_path.iterdir() if p.name.endswith(".tmp"))
    assert left.name.startswith(".run.memfit.json.") and path.read_text() == "old"
    write_text(path, "newer")
    assert left.exists()  # a minute old at most: it may be another save under way
    os.utime(left, (left.stat().st_mtime - 120,) * 2)
    write_text(path, "newest")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.memfit.json"]
    assert path.read_text() == "newest"
