"""The app keeps the cycle collector's pauses short (:mod:`memfit.gui.collector`): what
survives leaves the collector's generations, young cycles are still freed, and the cycles
that die after they left are freed when the app goes to the background, at most once a
gap.

Each check runs in a process of its own: freezing the collector's generations moves when
every other test's garbage is collected, and a test suite of Qt windows must not depend
on that. The automatic collector is off in each, so that only the code under test frees a
cycle."""

import pytest

from tests.gui.helpers import run_offscreen

CHECKS = '''
import gc, sys, weakref
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from memfit.gui.app import make_app
from memfit.gui.collector import RECLAIM_GAP_S, Collector, reclaim, settle

gc.disable()
app = make_app()


class Cycle:
    """An object in a reference cycle with itself: only the collector frees it."""

    def __init__(self):
        self.me = self


def in_generations(obj):
    """Whether the collector still walks ``obj`` (it is not frozen)."""
    return any(o is obj for o in gc.get_objects())


def wait_until(condition):
    for _ in range(200):
        if condition():
            return
        QTest.qWait(10)
    raise AssertionError("never")


def settles():
    dead, alive = Cycle(), Cycle()
    dead_ref = weakref.ref(dead)
    del dead
    gc.collect()  # nothing frozen yet: everything is young
    gone = Cycle()
    gone_ref = weakref.ref(gone)
    del gone
    assert gone_ref() is not None and in_generations(alive)
    settle()
    assert dead_ref() is None and gone_ref() is None
    assert not in_generations(alive)
    assert gc.get_freeze_count() > 0


def reclaims():
    cycle = Cycle()
    ref = weakref.ref(cycle)
    settle()
    del cycle
    gc.collect()
    assert ref() is not None  # out of the collector's reach
    reclaim()
    assert ref() is None
    assert gc.get_freeze_count() > 0  # what survived is out of reach again


def runs():
    before = Cycle()
    collector = Collector(app, every_ms=10, reclaim_gap_s=0)
    assert not in_generations(before)  # what existed at its start, moved at once
    young = Cycle()
    young_ref = weakref.ref(young)
    del young
    wait_until(lambda: young_ref() is None)
    old = Cycle()
    old_ref = weakref.ref(old)
    wait_until(lambda: not in_generations(old_ref()))
    del old
    app.applicationStateChanged.emit(Qt.ApplicationState.ApplicationActive)
    assert old_ref() is not None  # in front: no collection of everything
    app.applicationStateChanged.emit(Qt.ApplicationState.ApplicationInactive)
    assert old_ref() is None
    collector.stop()
    assert in_generations(before)  # stopped: every object is the collector's again


def gap():
    collector = Collector(app, every_ms=60_000)
    cycle = Cycle()
    ref = weakref.ref(cycle)
    settle()
    del cycle
    app.applicationStateChanged.emit(Qt.ApplicationState.ApplicationInactive)
    assert ref() is not None  # started just now: the gap has not passed
    collector._reclaimed -= RECLAIM_GAP_S
    app.applicationStateChanged.emit(Qt.ApplicationState.ApplicationInactive)
    assert ref() is None
    collector.stop()


{"settles": settles, "reclaims": reclaims, "runs": runs, "gap": gap}[sys.argv[1]]()
print("ok", sys.argv[1])
'''


@pytest.mark.parametrize(
    "check",
    [
        "settles",  # young cycles freed, what survives moved out of reach
        "reclaims",  # a cycle that dies after it was moved waits for reclaim
        "runs",  # the app settles as it runs and reclaims in the background
        "gap",  # one collection of everything in RECLAIM_GAP_S (focus follows mouse)
    ],
)
def test_the_collector(check: str) -> None:
    proc = run_offscreen(CHECKS, check)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"ok {check}"
