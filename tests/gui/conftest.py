"""GUI test setup: no message box or dialog ever blocks a test; a ``window`` to drive.

Every ``QMessageBox.exec`` is answered by :class:`~gui.monkey.MessageBoxes`: with the
answers a test queues, else Discard (when offered) or OK. What each box said, and in which
text format, is recorded for the test to check. Any other modal dialog a test does not
answer itself (by patching its ``exec``) fails the test: a real modal loop offscreen may
never return, or end the run early.
"""

from pathlib import Path

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QDialog, QMessageBox
from pytestqt.qtbot import QtBot

from gui.main_window import MainWindow
from gui.monkey import MessageBoxes
from gui.store import default_scenario


@pytest.fixture(autouse=True)
def message_boxes(monkeypatch: pytest.MonkeyPatch) -> MessageBoxes:
    boxes = MessageBoxes()
    monkeypatch.setattr(QMessageBox, "exec", boxes.exec_function())
    return boxes


@pytest.fixture(autouse=True)
def unanswered_dialogs(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(dialog: QDialog) -> int:
        raise AssertionError(
            f"a modal {type(dialog).__name__} ({dialog.windowTitle()!r}) opened that the "
            "test does not answer"
        )

    monkeypatch.setattr(QDialog, "exec", refuse)


@pytest.fixture
def window(qtbot: QtBot, tmp_path: Path) -> MainWindow:
    """The main window on the default scenario, shown at 1280x800, its settings and
    recovery file in ``tmp_path``."""
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(settings=settings, data_dir=tmp_path, scenario=default_scenario())
    qtbot.addWidget(w)
    w.resize(1280, 800)
    w.show()
    return w
