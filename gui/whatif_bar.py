"""The row of what-if toggles: each checked one adds a ghost bar with that change alone,
and the toggle *All Together*, with two or more checked, adds one more: all of them made
together (the engine's :func:`~memfit.engine.whatif.combined`, which skips -- and names -- changes
that conflict or do not apply with the others). The combined ghost is applied as one
undoable step.

A toggle that does not apply is disabled, and its tooltip says why (the engine's
:func:`~memfit.engine.whatif.assess`); with no valid estimate of the current scenario every toggle
is disabled and no ghost is drawn. The toggles of :data:`ONLY_WHEN_OFFERED` are hidden
instead: they undo a convention of the training stack that most stacks do not have.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, Signal, Slot
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QLabel, QMenu, QToolButton, QWidget

from memfit.engine.estimate import GIB, Estimate
from memfit.engine.specs import Scenario
from memfit.engine.whatif import (
    COMBINED_KEY,
    WHATIFS,
    WHATIFS_BY_KEY,
    WhatIfResult,
    assess,
    combined,
    compute_text,
)
from memfit.gui.chart import Ghost, rich_text
from memfit.gui.flow import FlowLayout
from memfit.gui.store import ScenarioStore

#: what-ifs shown only where they apply; the shown toggles close up, so no gap is left
ONLY_WHEN_OFFERED = frozenset({"release-outputs", "release-previous-step", "gradient-bucket-view"})


#: the tick label of the combined ghost
COMBINED_LABEL = "All together"


def saving_note(result: WhatIfResult) -> str:
    """``fits · -12.3 GiB · +33 % compute`` for a tick label."""
    gib = result.saved_bytes / GIB
    memory = "no change" if abs(gib) < 0.005 else f"{-gib:+.2f} GiB"
    compute = compute_text(result.compute_factor)
    verdict = {"fits": "fits", "tight": "tight", "oom": "does not fit"}[result.estimate.verdict]
    return f"{verdict} · {memory} · {compute}"


def skipped_text(result: WhatIfResult) -> str:
    """``skipped LoRA (r=16): conflicts with QLoRA ...``; ``""`` when nothing was skipped."""
    return "; ".join(f"skipped {WHATIFS_BY_KEY[key].label}: {why}" for key, why in result.skipped)


class WhatIfBar(QWidget):
    """Checkable toggles; emits the ghost bars for the checked ones on every change."""

    ghostsChanged = Signal(list)  # list[Ghost]

    def __init__(self, store: ScenarioStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.results: dict[str, WhatIfResult] = {}
        #: the checked changes made together, when All Together and two or more are checked
        self.combined: WhatIfResult | None = None
        # the toggles use the width they have, wrapping in a narrow window
        self._grid = layout = FlowLayout(self, spacing=4, row_spacing=2)
        layout.setContentsMargins(0, 0, 0, 0)
        title = QLabel("What if:")
        title.setToolTip(
            "Each toggle adds a ghost bar: the estimate with that change alone. "
            "Double-click a ghost bar, press Enter on a toggle, or right-click it and "
            "choose Apply, to make the change current (Ctrl+Return: the first shown). "
            "All Together adds one more: every ticked change made together."
        )
        layout.addWidget(title)
        self.buttons: dict[str, QToolButton] = {}
        for whatif in WHATIFS:
            button = self._toggle(whatif.label)
            self.buttons[whatif.key] = button
            button.setAccessibleName(f"What if: {whatif.label}")
            # right-click: show the ghost or apply the change; Enter on a focused toggle
            # applies it
            button.customContextMenuRequested.connect(
                lambda pos, key=whatif.key: self._menu(key).exec(self.buttons[key].mapToGlobal(pos))
            )
        # the combined ghost's toggle: placed after the others (see _place)
        self.together = self._toggle("All Together")
        self.together.setAccessibleName("What if: all ticked changes together")
        self.together.customContextMenuRequested.connect(
            lambda pos: self._together_menu().exec(self.together.mapToGlobal(pos))
        )
        self._shown: tuple[str, ...] = ()
        store.estimateChanged.connect(self.update_ghosts)
        self.update_ghosts()

    def _toggle(self, text: str) -> QToolButton:
        """A checkable toggle that redraws the ghosts when switched; Enter on it applies
        its ghost and right-click opens its menu (connected by the caller)."""
        button = QToolButton(self)
        button.setText(text)
        button.setCheckable(True)
        button.setAutoRaise(False)
        button.setStyleSheet(
            "QToolButton:checked:enabled { background: palette(highlight);"
            " color: palette(highlighted-text); border-radius: 3px; padding: 2px 4px; }"
            # checked but off while the scenario is invalid: no active-looking colour,
            # the disabled text of the palette and a dashed outline, like its ghost
            " QToolButton:checked:disabled { background: palette(button);"
            " border: 1px dashed palette(dark); border-radius: 3px; padding: 2px 4px; }"
        )
        button.toggled.connect(self.update_ghosts)
        button.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        button.installEventFilter(self)
        return button

    def _menu(self, key: str) -> QMenu:
        """The context menu of the toggle ``key``: show or hide its ghost, apply it; and
        apply the combined ghost, when there is one."""
        menu = QMenu(self)
        button = self.buttons[key]
        show = menu.addAction("Hide Ghost Bar" if button.isChecked() else "Show Ghost Bar")
        show.setEnabled(button.isEnabled())
        show.triggered.connect(button.toggle)
        apply = menu.addAction("Apply This Change")
        apply.setEnabled(key in self.results)
        apply.triggered.connect(lambda: self.apply(key))
        if self.combined is not None:  # two or more ticked changes that combine
            together = menu.addAction("Apply All Ticked Together")
            together.triggered.connect(lambda: self.apply(COMBINED_KEY))
        return menu

    def _together_menu(self) -> QMenu:
        """The context menu of All Together: show or hide the combined ghost, apply it."""
        menu = QMenu(self)
        button = self.together
        words = "Hide Combined Ghost Bar" if button.isChecked() else "Show Combined Ghost Bar"
        show = menu.addAction(words)
        show.setEnabled(button.isEnabled())
        show.triggered.connect(button.toggle)
        apply = menu.addAction("Apply All Ticked Together")
        apply.setEnabled(self.combined is not None)
        apply.triggered.connect(lambda: self.apply(COMBINED_KEY))
        return menu

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.KeyPress and isinstance(event, QKeyEvent):
            keys = (Qt.Key.Key_Return, Qt.Key.Key_Enter)
            if watched is self.together and event.key() in keys and self.combined is not None:
                self.apply(COMBINED_KEY)
                return True
            for key, button in self.buttons.items():
                if watched is button and event.key() in keys and key in self.results:
                    self.apply(key)
                    return True
        return super().eventFilter(watched, event)

    def _place(self, shown: tuple[str, ...]) -> None:
        """Lay out the toggles ``shown`` in the engine's order, All Together last; hide
        the others."""
        if shown == self._shown:
            return
        self._shown = shown
        for key, button in self.buttons.items():
            self._grid.removeWidget(button)
            button.setVisible(key in shown)
        self._grid.removeWidget(self.together)
        for key in shown:
            self._grid.addWidget(self.buttons[key])
        self._grid.addWidget(self.together)

    def checked(self) -> list[str]:
        return [key for key, b in self.buttons.items() if b.isChecked() and b.isEnabled()]

    @Slot()
    def update_ghosts(self, *_: object) -> None:
        scenario: Scenario = self.store.scenario
        current: Estimate | None = self.store.estimate
        self.results.clear()
        self.combined = None
        if current is None:  # nothing to compare with: the chart says why
            self.together.setEnabled(False)
            self.together.setToolTip(rich_text("Not available while the scenario is invalid"))
            for whatif in WHATIFS:
                button = self.buttons[whatif.key]
                button.setEnabled(False)
                button.setToolTip(
                    rich_text(f"{whatif.label}: not available while the scenario is invalid")
                )
            self._place(tuple(w.key for w in WHATIFS if w.key not in ONLY_WHEN_OFFERED))
            return
        for whatif in WHATIFS:
            result = assess(scenario, current, whatif.key)
            button = self.buttons[whatif.key]
            if isinstance(result, str):
                button.setEnabled(False)
                button.setToolTip(rich_text(f"{whatif.label}: not offered — {result}"))
                continue
            button.setEnabled(True)
            self.results[whatif.key] = result
            button.setToolTip(
                rich_text(f"{whatif.label}: {saving_note(result)}\n{result.compute_note}")
            )
        self._place(
            tuple(w.key for w in WHATIFS if w.key in self.results or w.key not in ONLY_WHEN_OFFERED)
        )
        ghosts = [
            Ghost(
                key,
                self.results[key].whatif.label,
                self.results[key].estimate,
                saving_note(self.results[key]),
            )
            for key in self.checked()
        ]
        ghost = self._combine(scenario, current)
        if ghost is not None:
            ghosts.append(ghost)
        self.ghostsChanged.emit(ghosts)

    def _combine(self, scenario: Scenario, current: Estimate) -> Ghost | None:
        """The combined ghost of the checked changes, when All Together is on and two or
        more are checked; its toggle's tooltip says what it holds and what was skipped."""
        checked = self.checked()
        self.together.setEnabled(len(checked) >= 2)
        if len(checked) < 2:
            self.together.setToolTip(
                rich_text(
                    "All Together: one more ghost bar, every ticked change made together "
                    "(tick two or more)"
                )
            )
            return None
        result = combined(scenario, current, checked)
        if isinstance(result, str):  # none of them can be made: nothing to draw
            self.together.setToolTip(rich_text(f"All Together: {result}"))
            return None
        skipped = skipped_text(result)
        detail = "\n".join(filter(None, (result.whatif.label, saving_note(result), skipped)))
        self.together.setToolTip(rich_text(f"All Together: {detail}"))
        if not self.together.isChecked():
            return None
        self.combined = result
        note = saving_note(result)
        if result.skipped:  # the tick label names them; the tooltip says why
            names = ", ".join(WHATIFS_BY_KEY[key].label for key, _why in result.skipped)
            note += f" · without {names}"
        title = " · ".join(filter(None, (result.whatif.label, skipped)))
        return Ghost(COMBINED_KEY, COMBINED_LABEL, result.estimate, note, title)

    @Slot(str)
    def apply(self, key: str) -> None:
        """Make the what-if ``key`` the current scenario (one undoable step); the key
        :data:`~memfit.engine.whatif.COMBINED_KEY` makes every checked change that combines."""
        if key == COMBINED_KEY:
            together = self.combined
            if together is None:
                return
            for made in together.applied:
                self.buttons[made].setChecked(False)
            count = len(together.applied)
            words = f"{count} What-ifs Together" if count > 1 else together.whatif.label
            self.store.edit(together.scenario, f"Apply {words}")
            return
        result = self.results.get(key)
        if result is None:
            return
        self.buttons[key].setChecked(False)
        self.store.edit(result.scenario, f"Apply {result.whatif.label}")
