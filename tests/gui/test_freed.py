"""Closed windows are freed: :func:`memfit.gui.lifetime.delete_now` at once, and the windows a test
opens when it ends (``windows_freed`` in the conftest), so they never pile up and slow
the tests after it."""

import gc
from pathlib import Path

import shiboken6
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from memfit.gui.lifetime import delete_now
from memfit.gui.main_window import MainWindow
from tests.gui.helpers import cluster, ini

#: the windows :func:`test_a_test_leaves_windows_open` leaves, for the test after it
LEFT: list[MainWindow] = []


def main_windows() -> list[MainWindow]:
    return [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow)]


def test_delete_now_frees_closed_windows_and_every_widget_they_held(
    qtbot: QtBot, tmp_path: Path
) -> None:
    gc.collect()  # what earlier tests' windows left to collect, pyqtgraph's menus, goes
    widgets = len(QApplication.allWidgets())
    windows = [MainWindow(settings=ini(tmp_path), data_dir=tmp_path) for _ in range(3)]
    windows[0].store.reset(cluster())
    for window in windows:
        window.show()
    with qtbot.waitSignal(windows[0].tradeoffs.sweeper.progressed, timeout=10_000):
        assert windows[0].tradeoffs.start_sweep()  # still running when its window closes
    for window in windows:
        window.close()
        window.deleteLater()
    QApplication.processEvents()
    # outside an event loop the deferred deletes wait: every window and widget lives on
    assert all(shiboken6.isValid(w) for w in windows)
    delete_now()
    assert not any(shiboken6.isValid(w) for w in windows)
    qtbot.wait(50)  # the stopped sweep sends nothing to its deleted window
    # what is left, pyqtgraph's context menus, goes with the windows' Python objects
    del windows, window
    gc.collect()
    assert len(QApplication.allWidgets()) == widgets


def test_a_test_leaves_windows_open(window: MainWindow, tmp_path: Path) -> None:
    other = MainWindow(settings=ini(tmp_path), data_dir=tmp_path)  # not given to qtbot
    other.show()
    LEFT.extend((window, other))
    assert len(main_windows()) == 2


def test_no_window_of_an_earlier_test_is_alive() -> None:
    # run after the test above (the file's order): its windows are gone, though held here
    assert not any(shiboken6.isValid(w) for w in LEFT)
    assert main_windows() == []
    LEFT.clear()  # their Python side, pyqtgraph's menus with it, may go now


def test_a_view_deleted_before_it_catches_up_runs_nothing(qtbot: QtBot, tmp_path: Path) -> None:
    window = MainWindow(settings=ini(tmp_path), data_dir=tmp_path)
    window.show()
    window.views.setCurrentWidget(window.tradeoffs)  # its show catches up at the next turn
    window.close()
    delete_now(window)  # before that turn: what was asked of the view is dropped with it
