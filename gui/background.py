"""Engine work off the GUI thread, one job at a time per :class:`Channel`, the newest wins.

A sweep of a few thousand configurations takes seconds of pure-Python work; the window
must stay responsive and a newer request must replace an older one. A :class:`Channel`
runs a *work* function in a thread of its own pool (one thread: a cancelled job finishes
its current step before the next one starts, so two jobs never compete for the
interpreter). The work function receives ``keep_going(done, total) -> bool``: it reports
progress through it and stops early, returning what it has, once it answers ``False``.

Results come back to the GUI thread as signals, tagged with the job that made them; a
result of a job that has been replaced or cancelled is dropped, so nobody ever shows a
stale answer as a current one. The engine is read-only and its objects are frozen, so
the work function may read any scenario it was given.

The work function must not touch Qt objects: everything it returns travels through
signals.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal, Slot

from memfit.engine.errors import EstimateError
from memfit.gui.forms import in_user_words

#: how long a thread keeps the interpreter once another asks for it (Python's default is
#: 5 ms; see :func:`share_the_interpreter`)
SWITCH_INTERVAL_S = 0.0002


def share_the_interpreter() -> None:
    """Let a thread that asks for the interpreter have it within
    :data:`SWITCH_INTERVAL_S`, not Python's 5 ms. The GUI thread gives the interpreter up
    in every call into Qt and asks for it again for every slot and event handler written
    in Python, so while a worker computes, each of those waited behind it: an edit took
    0.22-0.27 s (median) with the map sweeping Llama 3 70B on 64 GPUs, 8 ms without. With
    0.2 ms it takes 0.023-0.032 s; a worker alone is never asked to switch, so it runs as
    fast as before (``benchmarks/gui_latency.py``)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


#: ``keep_going(done, total)``: report progress; ``False`` means stop now
KeepGoing = Callable[[int, int], bool]
Work = Callable[[KeepGoing], Any]


class _Job(QRunnable):
    def __init__(self, channel: Channel, ident: int, work: Work, cancel: threading.Event) -> None:
        super().__init__()
        self.setAutoDelete(True)
        self._channel, self._ident, self._work, self._cancel = channel, ident, work, cancel

    def run(self) -> None:
        ident, cancel = self._ident, self._cancel
        channel = self._channel

        def keep_going(done: int, total: int) -> bool:
            if cancel.is_set():
                return False
            _send(channel._progress, ident, done, total)
            return True

        if cancel.is_set():
            _send(channel._done, ident, None, False)
            return
        try:
            result = self._work(keep_going)
        except EstimateError as exc:  # put in the panels' words on the GUI thread
            _send(channel._failed, ident, str(exc), exc)
        except Exception as exc:  # a bug in the engine: reported on the GUI thread
            _send(channel._failed, ident, f"the work failed ({type(exc).__name__}: {exc})", exc)
        else:
            _send(channel._done, ident, result, not cancel.is_set())


def _send(signal: Any, *args: object) -> None:
    """Emit from the worker thread; a channel deleted meanwhile has no one to tell."""
    # RuntimeError: the channel's C++ object is gone (its window was destroyed)
    with contextlib.suppress(RuntimeError):
        signal.emit(*args)


class Channel(QObject):
    """Runs one job at a time; :meth:`start` replaces whatever runs.

    Signals (GUI thread, current job only): :attr:`progressed` ``(done, total)``,
    :attr:`finished` ``(result, complete)`` -- ``complete`` is ``False`` when the job was
    cancelled and ``result`` holds what it had so far (or ``None``) --, :attr:`failed`
    ``(message)``; :attr:`busyChanged` ``(busy)`` when a job starts or ends.
    """

    progressed = Signal(int, int)
    finished = Signal(object, bool)
    failed = Signal(str)
    busyChanged = Signal(bool)

    # emitted from the worker thread, delivered queued to this object's thread
    _progress = Signal(int, int, int)
    _done = Signal(int, object, bool)
    _failed = Signal(int, str, object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(1)
        self._ident = 0
        self._cancel: threading.Event | None = None
        self._busy = False
        self._progress.connect(self._on_progress)
        self._done.connect(self._on_done)
        self._failed.connect(self._on_failed)

    @property
    def busy(self) -> bool:
        """A job runs (or waits to run) whose result will be shown."""
        return self._busy

    def start(self, work: Work) -> None:
        """Cancel the current job, if any, and run ``work`` after it."""
        self.cancel(emit=False)
        self._ident += 1
        self._cancel = threading.Event()
        self._pool.start(_Job(self, self._ident, work, self._cancel))
        self._set_busy(True)

    def cancel(self, emit: bool = True) -> None:
        """Ask the current job to stop; its partial result arrives through
        :attr:`finished` with ``complete`` false (unless ``emit`` is false: then nothing
        more of it arrives)."""
        if self._cancel is not None:
            self._cancel.set()
        if not emit:
            self._ident += 1  # whatever the old job still sends is dropped
            self._cancel = None
            self._set_busy(False)

    def wait(self, msecs: int = 10_000) -> bool:
        """Block until the pool's jobs have returned (tests, shutdown); ``True`` if so."""
        return bool(self._pool.waitForDone(msecs))

    def shutdown(self) -> None:
        """Cancel, drop queued jobs and wait for the running one (closing the window)."""
        self.cancel(emit=False)
        self._pool.clear()
        self._pool.waitForDone(30_000)

    def _set_busy(self, busy: bool) -> None:
        if busy != self._busy:
            self._busy = busy
            self.busyChanged.emit(busy)

    @Slot(int, int, int)
    def _on_progress(self, ident: int, done: int, total: int) -> None:
        if ident == self._ident:
            self.progressed.emit(done, total)

    @Slot(int, object, bool)
    def _on_done(self, ident: int, result: object, complete: bool) -> None:
        if ident != self._ident:
            return
        self._cancel = None
        self._set_busy(False)
        self.finished.emit(result, complete)

    @Slot(int, str, object)
    def _on_failed(self, ident: int, message: str, exc: object) -> None:
        if isinstance(exc, EstimateError):  # the field it names, as its row is labelled
            message = in_user_words(exc)
        elif isinstance(exc, BaseException):  # report the bug, keep running (as the store does)
            sys.excepthook(type(exc), exc, exc.__traceback__)
        if ident != self._ident:
            return
        self._cancel = None
        self._set_busy(False)
        self.failed.emit(message)
