"""``memfit`` with no arguments opens the window (run as its own process) and quits cleanly."""

from pathlib import Path

from memfit.gui.app import version
from memfit.gui.background import SWITCH_INTERVAL_S
from tests.gui.helpers import run_offscreen

SMOKE = """
import sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
from memfit.gui.app import make_app
from memfit.gui.collector import Collector
from memfit.gui.main_window import MainWindow

make_app()  # the launcher reuses it; the timer needs its event loop

def close_all():
    app = QApplication.instance()
    for widget in app.topLevelWidgets():
        if isinstance(widget, MainWindow) and widget.isVisible():
            print("window:", widget.windowTitle(), widget.width(), widget.height(), flush=True)
            widget.close()
    print("collector running:", app.findChild(Collector) is not None, flush=True)
    print("switch interval (us):", round(sys.getswitchinterval() * 1e6), flush=True)
    app.quit()

QTimer.singleShot(500, close_all)
from memfit.gui.launcher import main
raise SystemExit(main([]))
"""


def test_memfit_without_arguments_opens_the_window(tmp_path: Path) -> None:
    dirs = {"XDG_CONFIG_HOME": "cfg", "XDG_DATA_HOME": "data"}
    env = {k: str(tmp_path / v) for k, v in dirs.items()}
    proc = run_offscreen(SMOKE, HOME=str(tmp_path), **env)
    assert proc.returncode == 0, proc.stderr
    assert "window: Untitled" in proc.stdout and "MemFit" in proc.stdout
    assert "collector running: True" in proc.stdout  # its pauses kept short (gui.collector)
    # the GUI thread's turn at the interpreter comes soon (gui.background)
    assert f"switch interval (us): {round(SWITCH_INTERVAL_S * 1e6)}" in proc.stdout
    # its recovery file was in the user's data folder, and a clean close removed it
    (recovery,) = (tmp_path / "data").rglob("recovery")
    assert recovery.is_dir() and list(recovery.iterdir()) == []
    assert list((tmp_path / "cfg").rglob("MemFit.conf"))


def test_version_comes_from_the_package() -> None:
    assert version().count(".") >= 2
