"""The app keeps the cycle collector's pauses short (:mod:`memfit.gui.collector`): what
survives a second leaves the collector's generations, young cycles are still freed, and
the cycles that die after they left are freed when the app goes to the background.

The automatic collector is off in each test, so that only the code under test frees a
cycle; every object is given back to the collector after it."""

import gc
import weakref
from collections.abc import Iterator

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from memfit.gui.collector import RECLAIM_GAP_S, Collector, reclaim, settle


class _Cycle:
    """An object in a reference cycle with itself: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def collector_to_itself() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def _in_generations(obj: object) -> bool:
    """Whether the collector still walks ``obj`` (it is not frozen)."""
    return any(o is obj for o in gc.get_objects())


def test_settle_frees_young_cycles_and_moves_what_survives_out_of_reach() -> None:
    dead, alive = _Cycle(), _Cycle()
    dead_ref = weakref.ref(dead)
    del dead
    gc.collect()  # nothing frozen yet: everything is young
    gone = _Cycle()
    gone_ref = weakref.ref(gone)
    del gone
    assert gone_ref() is not None and _in_generations(alive)
    settle()
    assert dead_ref() is None and gone_ref() is None
    assert not _in_generations(alive)
    assert gc.get_freeze_count() > 0


def test_a_cycle_that_dies_after_it_was_moved_waits_for_reclaim() -> None:
    cycle = _Cycle()
    ref = weakref.ref(cycle)
    settle()
    del cycle
    gc.collect()
    assert ref() is not None  # out of the collector's reach
    reclaim()
    assert ref() is None
    assert gc.get_freeze_count() > 0  # what survived is out of reach again


def test_the_app_settles_as_it_runs_and_reclaims_in_the_background(
    qapp: QApplication, qtbot: QtBot
) -> None:
    before = _Cycle()
    collector = Collector(qapp, every_ms=10, reclaim_gap_s=0)
    try:
        assert not _in_generations(before)  # what existed at its start, moved at once
        young = _Cycle()
        young_ref = weakref.ref(young)
        del young
        qtbot.waitUntil(lambda: young_ref() is None, timeout=2000)
        old = _Cycle()
        old_ref = weakref.ref(old)
        qtbot.waitUntil(lambda: not _in_generations(old_ref()), timeout=2000)
        del old
        qapp.applicationStateChanged.emit(Qt.ApplicationState.ApplicationActive)
        assert old_ref() is not None  # in front: no collection of everything
        qapp.applicationStateChanged.emit(Qt.ApplicationState.ApplicationInactive)
        assert old_ref() is None
    finally:
        collector.stop()
        collector.deleteLater()
    assert _in_generations(before)  # stopped: every object is the collector's again


def test_the_background_collection_waits_its_gap(qapp: QApplication) -> None:
    """Focus that follows the mouse makes the app inactive many times a minute: one
    collection of everything in :data:`~memfit.gui.collector.RECLAIM_GAP_S`."""
    collector = Collector(qapp, every_ms=60_000)
    try:
        cycle = _Cycle()
        ref = weakref.ref(cycle)
        settle()
        del cycle
        qapp.applicationStateChanged.emit(Qt.ApplicationState.ApplicationInactive)
        assert ref() is not None  # started just now: the gap has not passed
        collector._reclaimed -= RECLAIM_GAP_S
        qapp.applicationStateChanged.emit(Qt.ApplicationState.ApplicationInactive)
        assert ref() is None
    finally:
        collector.stop()
        collector.deleteLater()
