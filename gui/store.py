"""The one source of truth of the app: the current scenario, its estimate, and undo.

Panels call :meth:`ScenarioStore.edit` with a new frozen :class:`~engine.specs.Scenario`;
the store pushes an undo command, estimates once, and emits ``scenarioChanged`` and
``estimateChanged`` -- only when something really changed. A scenario the engine rejects
keeps the last valid estimate on screen and emits ``errorChanged`` with the message.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtGui import QUndoCommand, QUndoStack

from engine.errors import EstimateError
from engine.estimate import Estimate, estimate
from engine.presets import load_gpu, load_model
from engine.specs import HardwareSpec, Scenario, TrainingSpec


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
    estimateChanged = Signal(object)  # Estimate
    errorChanged = Signal(str)  # "" when the current scenario estimates fine
    pathChanged = Signal(str)  # "" for an unsaved document
    modifiedChanged = Signal(bool)

    def __init__(self, scenario: Scenario | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._scenario = scenario or default_scenario()
        self._estimate = estimate(self._scenario)
        self._error = ""
        self._path: Path | None = None
        self.undo_stack = QUndoStack(self)
        self.undo_stack.cleanChanged.connect(self._clean_changed)

    @Slot(bool)
    def _clean_changed(self, clean: bool) -> None:
        self.modifiedChanged.emit(not clean)

    # -- reading -------------------------------------------------------------------------
    @property
    def scenario(self) -> Scenario:
        return self._scenario

    @property
    def estimate(self) -> Estimate:
        """The estimate of the last scenario the engine accepted."""
        return self._estimate

    @property
    def error(self) -> str:
        return self._error

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

    def reset(self, scenario: Scenario, path: Path | None = None) -> None:
        """Start a new document (New, Open): no undo history, not modified."""
        self.undo_stack.clear()
        self._path = path
        self._apply(scenario, force=True)
        self.undo_stack.setClean()
        self.pathChanged.emit(str(path) if path else "")

    def mark_saved(self, path: Path) -> None:
        self._path = path
        self.undo_stack.setClean()
        self.pathChanged.emit(str(path))

    def _apply(self, scenario: Scenario, force: bool = False) -> None:
        if scenario == self._scenario and not force:
            return
        self._scenario = scenario
        try:
            result = estimate(scenario)
        except EstimateError as exc:
            # the panels follow the scenario first, then hear what is wrong with it
            self.scenarioChanged.emit(scenario)
            self._set_error(str(exc))
            return
        self._set_error("")
        self._estimate = result
        self.scenarioChanged.emit(scenario)
        self.estimateChanged.emit(result)

    def _set_error(self, message: str) -> None:
        if message != self._error:
            self._error = message
            self.errorChanged.emit(message)
