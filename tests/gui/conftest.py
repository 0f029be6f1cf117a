"""GUI test setup: no message box or dialog ever blocks a test; a ``window`` to drive;
every window a test opens is closed and freed when it ends.

Every ``QMessageBox.exec`` is answered by :class:`~memfit.gui.monkey.MessageBoxes`: with the
answers a test queues, else Discard (when offered) or OK. What each box said, and in which
text format, is recorded for the test to check. Any other modal dialog a test does not
answer itself (by patching its ``exec``) fails the test: a real modal loop offscreen may
never return, or end the run early.

pytest-qt closes the widgets given to ``qtbot.addWidget`` and calls ``deleteLater()`` on
them, but no event loop delivers those deletes: without :func:`windows_freed` each closed
window lived on, with its tens of thousands of widgets, to the end of the run, and every
later test ran slower among them.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication, QDialog, QMessageBox
from pytestqt.qtbot import QtBot

from memfit.gui.main_window import MainWindow
from memfit.gui.monkey import MessageBoxes
from memfit.gui.store import default_scenario
from tests.gui.helpers import free_top_levels, ini


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


@pytest.fixture(autouse=True)
def windows_freed(
    qapp: QApplication, monkeypatch: pytest.MonkeyPatch, message_boxes: MessageBoxes
) -> Iterator[None]:
    """When the test ends (after pytest-qt has closed what it was given), each top-level
    widget it left is closed -- a window's close stops its workers and timers and frees
    its recovery file -- and the main windows are deleted at once, with every delete
    pytest-qt queued. A window that will not close fails the test."""
    before = QApplication.topLevelWidgets()
    yield
    # answers the test queued and did not use are dropped: closing is answered Discard
    monkeypatch.setattr(QMessageBox, "exec", MessageBoxes().exec_function())
    left = free_top_levels(before)
    assert not left, f"windows the test left would not close: {left}"


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


@pytest.fixture
def start(qtbot: QtBot, tmp_path: Path):  # type: ignore[no-untyped-def]
    """``start(**kwargs)``: a shown main window with its settings and recovery file in
    ``tmp_path`` (unless given)."""

    def make(**kwargs: object) -> MainWindow:
        kwargs.setdefault("data_dir", tmp_path)
        if "settings_path" not in kwargs:
            kwargs.setdefault("settings", ini(tmp_path))
        window = MainWindow(**kwargs)  # type: ignore[arg-type]
        qtbot.addWidget(window)
        window.resize(1280, 800)
        window.show()
        return window

    return make
