"""``memfit --selftest``: in process, through its failures, and as the command users run."""

import csv
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from memfit.engine.estimate import estimate
from memfit.gui import selftest
from memfit.gui.main_window import MainWindow

CHECKS = ["platform", "version", "resources", "window", "estimate", "png", "svg", "csv", "fonts"]
ROOT = Path(__file__).resolve().parents[2]


def check_names(lines: list[str]) -> list[str]:
    return [line.split()[1] for line in lines]


def test_every_check_passes_and_the_exports_are_right(qapp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reported: list[str] = []
    lines = selftest.run_selftest(tmp_path / "out", report=reported.append)
    assert check_names(lines) == CHECKS
    assert reported == lines
    assert all(line.startswith("ok  ") for line in lines)

    out = tmp_path / "out"
    image = QImage(str(out / selftest.PNG_NAME))
    assert not image.isNull() and image.width() > 400 and image.height() > 300
    assert ET.parse(out / selftest.SVG_NAME).getroot().tag == "{http://www.w3.org/2000/svg}svg"
    with (out / selftest.CSV_NAME).open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    device = estimate(selftest.selftest_scenario()).device_bytes
    items = [r for r in rows if r["category"] not in ("scenario", "total", "whatif")]
    assert sum(int(r["bytes"]) for r in items) == device


def test_a_failing_check_is_named_with_its_reason(  # type: ignore[no-untyped-def]
    qapp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def wrong_csv(self: MainWindow, path: Path) -> None:
        path.write_text("category,item,bytes,gib,formula,source\nparameters,w,1,0,,\n")

    monkeypatch.setattr(MainWindow, "export_data", wrong_csv)
    with pytest.raises(selftest.SelfTestError) as failure:
        selftest.run_selftest(tmp_path)
    assert failure.value.check == "csv"
    assert "sum to 1 bytes" in failure.value.reason
    assert check_names(failure.value.lines) == CHECKS[: CHECKS.index("csv")]


def test_missing_fonts_fail_the_font_check(monkeypatch: pytest.MonkeyPatch, qapp) -> None:  # type: ignore[no-untyped-def]
    def blank(text: str, size: tuple[int, int] | None = None) -> QImage:
        image = QImage(40, 20, QImage.Format.Format_ARGB32)
        image.fill(0xFFFFFFFF)
        return image

    monkeypatch.setattr(selftest, "render_text", blank)
    with pytest.raises(selftest.CheckFailed, match="no usable font"):
        selftest.check_fonts()


def test_main_exits_non_zero_with_the_reason(  # type: ignore[no-untyped-def]
    qapp, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    assert selftest.main([str(not_a_folder)]) == 1
    assert "selftest: FAIL png: FileExistsError" in capsys.readouterr().err


def clean_env(home: Path) -> dict[str, str]:
    """No display and no platform chosen (the self-test must pick offscreen itself), and a
    home of its own, to see that nothing is written there."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("QT_QPA_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")
    }
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_CACHE_HOME=str(home / ".cache"),
    )
    return env


def test_the_command_runs_headless_and_leaves_the_home_alone(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "memfit.gui.launcher", "--selftest", str(out)],
        capture_output=True,
        text=True,
        env=clean_env(home),
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Qt platform plugin 'offscreen'" in proc.stdout
    assert check_names([ln for ln in proc.stdout.splitlines() if ln.startswith("ok ")]) == CHECKS
    assert proc.stdout.rstrip().endswith(f"all {len(CHECKS)} checks passed")
    for name in (selftest.PNG_NAME, selftest.SVG_NAME, selftest.CSV_NAME, selftest.REPORT_NAME):
        assert (out / name).stat().st_size > 0
    assert len((out / selftest.REPORT_NAME).read_text().splitlines()) == len(CHECKS)
    # settings and autosave went to a temporary folder: nothing of the user's is written
    # (a font cache is not ours to forbid)
    assert [p for p in home.rglob("*") if p.is_file() and ".cache" not in p.parts] == []


def test_the_first_paint_probe_prints_a_time(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "memfit.gui.launcher", "--selftest", "--first-paint-probe"],
        capture_output=True,
        text=True,
        env=clean_env(tmp_path),
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (mark,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("first-paint ")]
    assert float(mark.split()[1]) > 0
