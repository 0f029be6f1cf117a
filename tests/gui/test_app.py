"""The app starts from the console script's entry point and quits cleanly."""

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from gui.app import version
from gui.launcher import main
from gui.main_window import MainWindow


def test_memfit_without_arguments_opens_the_window(qapp: QApplication) -> None:
    seen: list[str] = []

    def close_all() -> None:
        for widget in qapp.topLevelWidgets():
            if isinstance(widget, MainWindow) and widget.isVisible():
                seen.append(widget.windowTitle())
                widget.close()
        qapp.quit()

    QTimer.singleShot(300, close_all)
    assert main([]) == 0
    assert seen and seen[0].endswith("MemFit")


def test_version_comes_from_the_package() -> None:
    assert version().count(".") >= 2
