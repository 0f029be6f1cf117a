"""Python's cycle collector in the app, its pauses kept short (:class:`Collector`).

The engine keeps what it works out in its caches (block profiles, step plans, estimates,
sweeps), and the window keeps its widgets and charts: after 5,000 monkey actions the
collector tracks 800,000 objects. A full collection walks every one of them, whichever
thread's allocation started it, and holds the interpreter while it does: the GUI thread
stood still for up to 0.59 s in those actions (``benchmarks/monkey.py --no-collector``).
Those pauses grow with what the caches hold, so a long session meets longer ones.

Here, once a second, the collector's young generations are collected -- what was made
lately, where most cycles die -- and every object that survives is moved out of its
generations (:func:`gc.freeze`): each later collection walks only what was made since.
Collecting everything new instead took 0.1 s a second while the map swept Llama 3 70B
on 64 GPUs (its worker makes 200,000 objects a second); the young generations take under
2 ms. A cycle that dies after it was moved (a closed dialog's widgets, a cache entry
dropped) waits for a collection of everything (:func:`reclaim`), made when the app goes
to the background, where its pause meets no user: 2,000 monkey actions left 3,700 such
objects (0.35 MB) until then.
"""

from __future__ import annotations

import gc
import time

from PySide6.QtCore import QObject, Qt, QTimer
from PySide6.QtGui import QGuiApplication

#: how often what survived is moved out of the collector's reach (ms)
EVERY_MS = 1000
#: the collector's generations collected by :func:`settle`: the young ones (0 and 1)
YOUNG = 1
#: the least time between two collections of everything (s): a desktop that moves the
#: focus with the mouse makes the app inactive and active again many times a minute
RECLAIM_GAP_S = 60.0


def settle() -> None:
    """Collect the young generations, then move every object that survives out of the
    collector's generations."""
    gc.collect(YOUNG)
    gc.freeze()


def reclaim() -> None:
    """Collect everything, what was moved out of the generations too, and move what
    survives out again: the cycles that died after they were moved are freed."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


class Collector(QObject):
    """Keeps the collector's pauses short while the app runs (see the module): settles
    every ``every_ms`` and reclaims when the app goes to the background, at most once in
    ``reclaim_gap_s``. What exists when it starts (the modules, the window shown) is
    moved out of the generations at once, uncollected: a start leaves no cycle to free (a
    collection found none, in 20 ms). :meth:`stop` gives every object back to the
    collector."""

    def __init__(
        self, app: QGuiApplication, every_ms: int = EVERY_MS, reclaim_gap_s: float = RECLAIM_GAP_S
    ) -> None:
        super().__init__(app)
        gc.freeze()
        self._app = app
        self._gap = reclaim_gap_s
        self._reclaimed = time.monotonic()
        self._timer = QTimer(self)
        self._timer.setInterval(every_ms)
        self._timer.timeout.connect(settle)
        self._timer.start()
        app.applicationStateChanged.connect(self._state_changed)

    def _state_changed(self, state: Qt.ApplicationState) -> None:
        now = time.monotonic()
        if state != Qt.ApplicationState.ApplicationActive and now - self._reclaimed >= self._gap:
            reclaim()
            self._reclaimed = now

    def stop(self) -> None:
        self._timer.stop()
        self._app.applicationStateChanged.disconnect(self._state_changed)
        gc.unfreeze()
