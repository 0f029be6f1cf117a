"""The row of what-if toggles: each checked one adds a ghost bar with that change alone.

A toggle that does not apply is disabled, and its tooltip says why (the engine's
:func:`~engine.whatif.assess`); with no valid estimate of the current scenario every toggle
is disabled and no ghost is drawn. The toggles of :data:`ONLY_WHEN_OFFERED` are hidden
instead: they undo a convention of the training stack that most stacks do not have.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, Signal, Slot
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QGridLayout, QLabel, QMenu, QToolButton, QWidget

from engine.estimate import GIB, Estimate
from engine.specs import Scenario
from engine.whatif import WHATIFS, WhatIfResult, assess, compute_text
from gui.chart import Ghost, rich_text
from gui.store import ScenarioStore

#: toggles per row of the what-if bar, so that it fits a 1280-pixel window
PER_ROW = 5
#: what-ifs shown only where they apply; the shown toggles close up, so no gap is left
ONLY_WHEN_OFFERED = frozenset({"release-outputs", "release-previous-step"})


def saving_note(result: WhatIfResult) -> str:
    """``fits · -12.3 GiB · +33 % compute`` for a tick label."""
    gib = result.saved_bytes / GIB
    memory = "no change" if abs(gib) < 0.005 else f"{-gib:+.2f} GiB"
    compute = compute_text(result.compute_factor)
    verdict = {"fits": "fits", "tight": "tight", "oom": "does not fit"}[result.estimate.verdict]
    return f"{verdict} · {memory} · {compute}"


class WhatIfBar(QWidget):
    """Checkable toggles; emits the ghost bars for the checked ones on every change."""

    ghostsChanged = Signal(list)  # list[Ghost]

    def __init__(self, store: ScenarioStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.results: dict[str, WhatIfResult] = {}
        self._grid = layout = QGridLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setHorizontalSpacing(4)
        layout.setVerticalSpacing(2)
        title = QLabel("What if:")
        title.setToolTip(
            "Each toggle adds a ghost bar: the estimate with that change alone. "
            "Double-click a ghost bar, press Enter on a toggle, or right-click it and "
            "choose Apply, to make the change current (Ctrl+Return: the first shown)."
        )
        layout.addWidget(title, 0, 0)
        self.buttons: dict[str, QToolButton] = {}
        for whatif in WHATIFS:
            button = QToolButton(self)
            button.setText(whatif.label)
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
            button.setAccessibleName(f"What if: {whatif.label}")
            button.toggled.connect(self.update_ghosts)
            # right-click: show the ghost or apply the change; Enter on a focused toggle
            # applies it
            button.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
            button.customContextMenuRequested.connect(
                lambda pos, key=whatif.key: self._menu(key).exec(self.buttons[key].mapToGlobal(pos))
            )
            button.installEventFilter(self)
            self.buttons[whatif.key] = button
        self._shown: tuple[str, ...] = ()
        layout.setColumnStretch(PER_ROW + 1, 1)
        store.estimateChanged.connect(self.update_ghosts)
        self.update_ghosts()

    def _menu(self, key: str) -> QMenu:
        """The context menu of the toggle ``key``: show or hide its ghost, apply it."""
        menu = QMenu(self)
        button = self.buttons[key]
        show = menu.addAction("Hide Ghost Bar" if button.isChecked() else "Show Ghost Bar")
        show.setEnabled(button.isEnabled())
        show.triggered.connect(button.toggle)
        apply = menu.addAction("Apply This Change")
        apply.setEnabled(key in self.results)
        apply.triggered.connect(lambda: self.apply(key))
        return menu

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.KeyPress and isinstance(event, QKeyEvent):
            keys = (Qt.Key.Key_Return, Qt.Key.Key_Enter)
            for key, button in self.buttons.items():
                if watched is button and event.key() in keys and key in self.results:
                    self.apply(key)
                    return True
        return super().eventFilter(watched, event)

    def _place(self, shown: tuple[str, ...]) -> None:
        """Lay out the toggles ``shown``, :data:`PER_ROW` to a row in the engine's order;
        hide the others."""
        if shown == self._shown:
            return
        self._shown = shown
        for key, button in self.buttons.items():
            self._grid.removeWidget(button)
            button.setVisible(key in shown)
        for index, key in enumerate(shown):
            row, col = divmod(index, PER_ROW)
            self._grid.addWidget(self.buttons[key], row, col + 1)

    def checked(self) -> list[str]:
        return [key for key, b in self.buttons.items() if b.isChecked() and b.isEnabled()]

    @Slot()
    def update_ghosts(self, *_: object) -> None:
        scenario: Scenario = self.store.scenario
        current: Estimate | None = self.store.estimate
        self.results.clear()
        if current is None:  # nothing to compare with: the chart says why
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
        self.ghostsChanged.emit(ghosts)

    @Slot(str)
    def apply(self, key: str) -> None:
        """Make the what-if ``key`` the current scenario (one undoable step)."""
        result = self.results.get(key)
        if result is None:
            return
        self.buttons[key].setChecked(False)
        self.store.edit(result.scenario, f"Apply {result.whatif.label}")
