"""The one source of truth of the app: the current scenario, its estimate, and undo.

Panels call :meth:`ScenarioStore.edit` with a new frozen :class:`~memfit.engine.specs.Scenario`;
the store pushes an undo command, estimates once, and emits -- only when something really
changed -- ``scenarioChanged``, then ``errorChanged``, then ``estimateChanged``.

The store holds any scenario, including one the engine rejects: then :attr:`estimate` is
``None`` and :attr:`error` holds the engine's message, so nobody can show another
scenario's estimate as this one's. A document is the scenario plus its file (``path``)
and whether it differs from that file (``modified``); both survive a restart through the
recovery file (:mod:`memfit.gui.session`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtGui import QUndoCommand, QUndoStack

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import Estimate, estimate
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, Scenario, TrainingSpec


def default_scenario() -> Scenario:
    """What a new document starts with: Llama 3 8B, LoRA, on an H100."""
    return Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb")),
        TrainingSpec(method="lora", micro_batch_size=4, sequence_length=2048),
    )


class _SetScenario(QUndoCommand):
    def __init__(self, store: ScenarioStore, old: Scenario, new: Scenario, text: str) -> None:
        super().__init__(text)
        self._store, self._old, self._new = store, old, new

    def redo(self) -> None:
        self._store._apply(self._new)

    def undo(self) -> None:
        self._store._apply(self._old)


class ScenarioStore(QObject):
    """Holds the current scenario; emits on real change; undoable edits."""

    scenarioChanged = Signal(object)  # Scenario
    estimateChanged = Signal(object)  # Estimate, or None when the engine rejects the scenario
    errorChanged = Signal(str)  # "" when the current scenario estimates fine
    pathChanged = Signal(str)  # "" for an unsaved document
    modifiedChanged = Signal(bool)
    #: a new document is about to replace the current one (New, Open): whatever shows the
    #: old document's results drops them
    documentReset = Signal()
    #: the document -- scenario, path or modified state -- changed, and all of it is in
    #: place (``modifiedChanged`` comes after the scenario, and during a reset the undo
    #: history is cleared before the new scenario arrives): once per edit, undo, redo,
    #: reset or save, for whatever records the document as a whole
    documentChanged = Signal()

    def __init__(
        self,
        scenario: Scenario | None = None,
        parent: QObject | None = None,
        *,
        path: Path | None = None,
        modified: bool = False,
    ) -> None:
        super().__init__(parent)
        self._scenario = scenario or default_scenario()
        self._estimate, self._error, self._refusal = self._estimated(self._scenario)
        self._path = path
        self.undo_stack = QUndoStack(self)
        self.undo_stack.cleanChanged.connect(self._clean_changed)
        if modified:
            self.undo_stack.resetClean()
        self._resetting = False
        # the stack's index and clean state are up to date when it says its index changed
        self.undo_stack.indexChanged.connect(self._index_changed)

    @staticmethod
    def _estimated(scenario: Scenario) -> tuple[Estimate | None, str, EstimateError | None]:
        """The estimate, the engine's message and its refusal (which carries the field)."""
        try:
            return estimate(scenario), "", None
        except EstimateError as exc:
            return None, str(exc), exc
        except Exception as exc:  # a bug in the engine: say so, report it, keep running
            sys.excepthook(type(exc), exc, exc.__traceback__)
            bug = EstimateError("scenario", f"the estimate failed ({type(exc).__name__}: {exc})")
            return None, str(bug), bug

    @Slot(bool)
    def _clean_changed(self, clean: bool) -> None:
        self.modifiedChanged.emit(not clean)

    @Slot(int)
    def _index_changed(self, _index: int) -> None:
        if not self._resetting:
            self.documentChanged.emit()

    # -- reading -------------------------------------------------------------------------
    @property
    def scenario(self) -> Scenario:
        return self._scenario

    @property
    def estimate(self) -> Estimate | None:
        """The estimate of the current scenario; ``None`` when the engine rejects it."""
        return self._estimate

    @property
    def error(self) -> str:
        """The engine's message about the current scenario; ``""`` when it estimates."""
        return self._error

    @property
    def refusal(self) -> EstimateError | None:
        """The engine's refusal of the current scenario, with the field it names; ``None``
        when it estimates."""
        return self._refusal

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def modified(self) -> bool:
        return not self.undo_stack.isClean()

    # -- writing -------------------------------------------------------------------------
    def edit(self, scenario: Scenario, text: str = "Edit") -> bool:
        """Make ``scenario`` current as an undoable step; ``False`` if nothing changed."""
        if scenario == self._scenario:
            return False
        self.undo_stack.push(_SetScenario(self, self._scenario, scenario, text))
        return True

    def reset(self, scenario: Scenario, path: Path | None = None, modified: bool = False) -> None:
        """Start a new document (New, Open, a recovered session): no undo history; not
        modified unless ``modified`` (unsaved changes recovered from the last session)."""
        self.documentReset.emit()
        self._resetting = True
        try:
            self.undo_stack.clear()
            self._path = path
            self._apply(scenario, force=True)
            if modified:
                self.undo_stack.resetClean()
            else:
                self.undo_stack.setClean()
        finally:
            self._resetting = False
        self.pathChanged.emit(str(path) if path else "")
        self.documentChanged.emit()

    def mark_saved(self, path: Path) -> None:
        self._path = path
        self.undo_stack.setClean()
        self.pathChanged.emit(str(path))
        self.documentChanged.emit()

    def _apply(self, scenario: Scenario, force: bool = False) -> None:
        if scenario == self._scenario and not force:
            return
        result, error, refusal = self._estimated(scenario)
        old_estimate, old_error = self._estimate, self._error
        # every reader sees the new state, whichever signal reaches it first
        self._scenario, self._estimate, self._error = scenario, result, error
        self._refusal = refusal
        self.scenarioChanged.emit(scenario)
        if error != old_error:
            self.errorChanged.emit(error)
        if force or result is not None or old_estimate is not None:  # not None again
            self.estimateChanged.emit(result)
