"""Start the MemFit desktop app."""

from __future__ import annotations

import sys

from PySide6.QtCore import QCoreApplication
from PySide6.QtWidgets import QApplication

from memfit.engine.cli import version
from memfit.gui.background import share_the_interpreter
from memfit.gui.collector import Collector

APP_NAME = "MemFit"
ORG_NAME = "MemFit"


def make_app(argv: list[str] | None = None) -> QApplication:
    existing = QApplication.instance()
    if isinstance(existing, QApplication):
        return existing
    QCoreApplication.setOrganizationName(ORG_NAME)
    QCoreApplication.setApplicationName(APP_NAME)
    QCoreApplication.setApplicationVersion(version())
    app = QApplication(argv if argv is not None else sys.argv[:1])
    app.setApplicationDisplayName(APP_NAME)
    app.setDesktopFileName("memfit")
    return app


def keep_responsive(app: QApplication) -> Collector:
    """How the app's process runs once its window is shown: the GUI thread's turn at the
    interpreter comes soon while workers compute (:func:`share_the_interpreter`), and the
    cycle collector's pauses stay short, an app's objects living long (:class:`Collector`,
    returned)."""
    share_the_interpreter()
    return Collector(app)


def run(argv: list[str] | None = None) -> int:
    """Open the main window and run the event loop; returns the exit status."""
    app = make_app(argv)
    from memfit.gui.main_window import MainWindow, app_icon

    app.setWindowIcon(app_icon())
    window = MainWindow()
    window.show()
    keep_responsive(app)
    return app.exec()
