"""``memfit`` with no arguments opens the window (run as its own process) and quits cleanly."""

import os
import subprocess
import sys
from pathlib import Path

from gui.app import version

SMOKE = """
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
from gui.app import make_app
from gui.main_window import MainWindow

make_app()  # the launcher reuses it; the timer needs its event loop

def close_all():
    app = QApplication.instance()
    for widget in app.topLevelWidgets():
        if isinstance(widget, MainWindow) and widget.isVisible():
            print("window:", widget.windowTitle(), widget.width(), widget.height(), flush=True)
            widget.close()
    app.quit()

QTimer.singleShot(500, close_all)
from gui.launcher import main
raise SystemExit(main([]))
"""


def test_memfit_without_arguments_opens_the_window(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        XDG_CONFIG_HOME=str(tmp_path / "cfg"),
        XDG_DATA_HOME=str(tmp_path / "data"),
        HOME=str(tmp_path),
    )
    proc = subprocess.run(
        [sys.executable, "-c", SMOKE],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "window: Untitled" in proc.stdout and "MemFit" in proc.stdout
    # closing autosaved the scenario, which reopens on the next start
    assert list((tmp_path / "data").rglob("last.memfit.json"))


def test_version_comes_from_the_package() -> None:
    assert version().count(".") >= 2
