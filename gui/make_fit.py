"""Make it fit: the changes that bring a scenario under its memory budget, fastest first.

:func:`find_fixes` (no Qt; run it in a worker) estimates the scenario and, when it does not
fit, asks :func:`memfit.engine.solve.make_it_fit` for the changes -- alone and combined, every
change of a combination needed -- that make it fit. The result, a :class:`FitResult`,
holds the scenario's own total and step time, so each fix reads as a difference from it.

:class:`FitView` shows one line about the scenario (its total against the budget) above a
table of the fixes; double-clicking a row, or Apply on the selected one, emits
:attr:`FitView.fixActivated` with that :class:`~memfit.engine.solve.Fix`. The view never edits a
scenario itself.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QModelIndex, Qt, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from memfit.engine.estimate import GIB, estimate
from memfit.engine.model_state import CATEGORIES
from memfit.engine.solve import (
    CHANGES,
    EXHAUSTIVE,
    MAX_CHANGES,
    MAX_TRIES,
    Fix,
    Floor,
    search,
)
from memfit.engine.specs import Scenario
from memfit.engine.steptime import StepTime
from memfit.engine.sweep import NUMERICS_MARK, describe, numerics_changed
from memfit.gui.chart import CATEGORY_NAMES, gib_text, rich_text

#: how many fixes to list, and how many changes one may combine
TOP = 10
COLUMNS = (
    "#",
    "Changes",
    "Memory per GPU",
    "Memory change",
    "Tokens/s",
    "Step time change",
    "MFU",
    "Bound",
)
HEADERS = {
    "Memory per GPU": "Memory\nper GPU",
    "Memory change": "Memory\nchange",
    "Tokens/s": "Tokens/s\n(all GPUs)",
    "Step time change": "Step time\nchange",
    "MFU": "MFU\n",
    "Bound": "Bound\n",
}
CSV_FIELDS = (
    "rank",
    "changes",
    "keys",
    "device_bytes",
    "budget_bytes",
    "device_change_bytes",
    "tokens_per_s",
    "step_time_s",
    "step_time_change",
    "mfu",
    "bound",
)
MINUS = "\u2212"


@dataclass(frozen=True, slots=True)
class FitResult:
    """The scenario's own total, budget and step time, and the fixes (none when it fits
    already)."""

    scenario: Scenario
    device_bytes: int
    budget_bytes: int
    time: StepTime
    fixes: tuple[Fix, ...]
    #: where nothing fits, the least memory the search reached and what it is made of
    floor: Floor | None = None
    floor_breakdown: tuple[tuple[str, int], ...] = ()

    @property
    def fits(self) -> bool:
        return self.device_bytes <= self.budget_bytes


def find_fixes(
    scenario: Scenario,
    keep_going: Callable[[int, int], bool] | None = None,
    leave_out: tuple[str, ...] = (),
) -> FitResult:
    """The scenario's total and the fixes that make it fit, as a worker runs it (no Qt):
    the search of :func:`memfit.engine.solve.search`, which tells ``keep_going`` how far
    it is and stops when it returns ``False``; ``leave_out``: changes not to make (what
    the user keeps as set)."""
    if keep_going is not None:
        keep_going(0, MAX_TRIES)
    est = estimate(scenario)
    if est.device_bytes <= est.budget_bytes:
        return FitResult(scenario, est.device_bytes, est.budget_bytes, est.time, ())
    found = search(scenario, top=TOP, leave_out=leave_out, progress=keep_going)
    breakdown: tuple[tuple[str, int], ...] = ()
    if not found.fixes and found.floor is not None:
        lowest = estimate(found.floor.scenario)
        breakdown = tuple((c, lowest.breakdown[c]) for c in CATEGORIES if lowest.breakdown[c])
    if keep_going is not None:
        keep_going(MAX_TRIES, MAX_TRIES)
    return FitResult(
        scenario,
        est.device_bytes,
        est.budget_bytes,
        est.time,
        found.fixes,
        found.floor,
        breakdown,
    )


def changes_text(fix: Fix, base: Scenario | None = None) -> str:
    """The fix's changes, marked :data:`memfit.engine.sweep.NUMERICS_MARK` where they
    change what is trained against ``base`` (pure bf16, an 8-bit optimizer, another loss)."""
    text = " + ".join(fix.labels)
    if base is not None and numerics_changed(base, fix.scenario):
        text += f" {NUMERICS_MARK}"
    return text


def step_change(fix: Fix, base: StepTime) -> float:
    """The fix's step time relative to the scenario's: ``0.1`` is 10 % slower."""
    return fix.time.step_time_s / base.step_time_s - 1.0


def signed(text: str, value: float) -> str:
    """``text`` (of ``abs(value)``) with a sign: ``+``, or a minus sign."""
    return (MINUS if value < 0 else "+") + text


def row_texts(rank: int, fix: Fix, result: FitResult) -> list[str]:
    """The table's cells for the fix ranked ``rank`` (see :data:`COLUMNS`)."""
    t = fix.time
    delta = fix.device_bytes - result.device_bytes
    change = step_change(fix, result.time) * 100
    return [
        f"{rank}",
        changes_text(fix, result.scenario),
        gib_text(fix.device_bytes),
        signed(gib_text(abs(delta)), delta),
        f"{t.tokens_per_s:,.0f}",
        signed(f"{abs(change):.1f} %", change),
        f"{t.mfu * 100:.1f} %",
        t.bound.replace("_", " "),
    ]


def summary_text(result: FitResult) -> str:
    """The line above the table."""
    used, budget = result.device_bytes / GIB, result.budget_bytes / GIB
    if result.fits:
        return f"Fits already: {used:,.1f} of {budget:,.1f} GiB per GPU; nothing to change."
    head = f"Does not fit: {used:,.1f} GiB per GPU, over the budget of {budget:,.1f} GiB."
    if not result.fixes:
        return f"{head} {floor_text(result)}"
    n = len(result.fixes)
    ways = "1 way" if n == 1 else f"{n} ways"
    return f"{head} {ways} to make it fit, fastest first; double-click one to apply it."


def floor_text(result: FitResult) -> str:
    """Where nothing fits: the least memory per GPU the search reached, with which
    changes, and what that floor is made of (GiB = 2^30 bytes)."""
    floor = result.floor
    if floor is None:
        return "No change of the registry applies to it: try another GPU or a smaller model."
    how = " + ".join(floor.labels) if floor.labels else "the scenario as it is"
    parts = ", ".join(
        f"{CATEGORY_NAMES.get(c, c).lower()} {gib_text(b)}" for c, b in result.floor_breakdown
    )
    return (
        f"Nothing fits: the least it goes down to is {gib_text(floor.device_bytes)} per GPU "
        f"({how}), over the budget of {gib_text(floor.budget_bytes)}"
        + (f"; that floor is {parts}" if parts else "")
        + ". Try a larger GPU, more GPUs or a smaller model."
    )


def fixes_csv(result: FitResult | None) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    if result is not None:
        for rank, fix in enumerate(result.fixes, 1):
            t = fix.time
            writer.writerow(
                {
                    "rank": rank,
                    "changes": changes_text(fix, result.scenario),
                    "keys": " ".join(fix.changes),
                    "device_bytes": fix.device_bytes,
                    "budget_bytes": fix.budget_bytes,
                    "device_change_bytes": fix.device_bytes - result.device_bytes,
                    "tokens_per_s": t.tokens_per_s,
                    "step_time_s": t.step_time_s,
                    "step_time_change": step_change(fix, result.time),
                    "mfu": t.mfu,
                    "bound": t.bound,
                }
            )
    return buffer.getvalue()


class FitView(QWidget):
    """A line about the scenario above its fixes.

    :meth:`set_result` shows a result; :meth:`set_stale` greys the table with a reason
    (no fix of it can be applied then); :attr:`fixActivated` asks for a fix to be
    applied (a double-click, or Apply).
    """

    fixActivated = Signal(object)  # Fix

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._result: FitResult | None = None
        self._stale: str | None = None

        self.summary = QLabel()
        self.summary.setObjectName("fitSummary")
        self.summary.setTextFormat(Qt.TextFormat.PlainText)
        self.summary.setWordWrap(True)
        self.apply_button = QPushButton("Apply")
        self.apply_button.setToolTip("Make the selected fix the current scenario (Ctrl+Z undoes)")
        self.apply_button.clicked.connect(self.apply_selected)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels([HEADERS.get(c, c) for c in COLUMNS])
        self.table.setAccessibleName("Changes that make it fit")
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        # the changes wrap, each row as tall as its text, so that none is cut off
        self.table.setWordWrap(True)
        self.table.setTextElideMode(Qt.TextElideMode.ElideNone)
        rows = self.table.verticalHeader()
        rows.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.setStyleSheet("QTableWidget::item { padding: 3px 2px; }")
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(COLUMNS.index("Changes"), QHeaderView.ResizeMode.Stretch)
        tips = {
            "#": "Rank: the fastest fix first",
            "Changes": "What to change; combined changes are each needed (none of them alone, "
            "nor any smaller part, fits)",
            "Memory per GPU": "The device total with the fix (GiB, 2^30 bytes)",
            "Memory change": "Against the current scenario's device total",
            "Tokens/s": "Training tokens per second, all GPUs together",
            "Step time change": "The optimizer step's time against the current scenario's "
            "(+ is slower)",
            "MFU": "Model FLOPs utilisation",
            "Bound": "The kind of work with the largest share of the step",
        }
        for col, name in enumerate(COLUMNS):
            cell = self.table.horizontalHeaderItem(col)
            if cell is not None:
                cell.setToolTip(tips[name])
        self.table.doubleClicked.connect(self._on_double_clicked)
        self.table.itemSelectionChanged.connect(self._update_apply)

        self.note = QLabel()
        self.note.setObjectName("fitNote")
        self.note.setTextFormat(Qt.TextFormat.PlainText)
        self.note.setWordWrap(True)

        top = QHBoxLayout()
        top.addWidget(self.summary, 1)
        top.addWidget(self.apply_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(top)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.note)
        self._update_apply()

    # -- results ---------------------------------------------------------------------------

    def result(self) -> FitResult | None:
        return self._result

    def fixes(self) -> list[Fix]:
        return [] if self._result is None else list(self._result.fixes)

    def set_result(self, result: FitResult | None) -> None:
        """Show ``result`` (``None``: nothing yet)."""
        self._result = result
        self._stale = None
        self.table.setEnabled(True)
        self.table.setRowCount(0 if result is None else len(result.fixes))
        if result is not None:
            self._fill(result)
        if self.fixes():
            self.table.selectRow(0)
        if result is None:
            self.summary.setText("")
            self.note.setText("")
        else:
            self.summary.setText(summary_text(result))
            base = result.time
            self.note.setText(
                f"As it is: {base.tokens_per_s:,.0f} tokens/s, step {base.step_time_s:.3g} s, "
                f"MFU {base.mfu * 100:.1f} %. {len(CHANGES)} changes tried, every "
                f"combination of up to {EXHAUSTIVE} and deeper ones lowest memory first "
                f"(up to {MAX_CHANGES} at once); hover a row for its whole configuration."
            )
        self._update_apply()

    def _fill(self, result: FitResult) -> None:
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        for r, fix in enumerate(result.fixes):
            differs = numerics_changed(result.scenario, fix.scenario)
            words = describe(fix.scenario)
            if differs:
                words += f"\n{NUMERICS_MARK} Trains differently: " + "; ".join(differs)
            tip = rich_text(words)
            for c, text in enumerate(row_texts(r + 1, fix, result)):
                cell = QTableWidgetItem(text)
                if COLUMNS[c] not in ("Changes", "Bound"):
                    cell.setTextAlignment(right)
                cell.setToolTip(tip)
                self.table.setItem(r, c, cell)

    def set_stale(self, reason: str | None) -> None:
        """Grey the table with ``reason`` (``None``: current again)."""
        self._stale = reason
        self.table.setEnabled(reason is None)
        if reason:
            self.summary.setText(reason)
        elif self._result is not None:
            self.summary.setText(summary_text(self._result))
        self._update_apply()

    def is_stale(self) -> bool:
        return self._stale is not None

    def csv_text(self) -> str:
        return fixes_csv(self._result)

    def cell_text(self, row: int, column: str) -> str:
        item = self.table.item(row, COLUMNS.index(column))
        return item.text() if item is not None else ""

    # -- applying --------------------------------------------------------------------------

    def selected_fix(self) -> Fix | None:
        rows = self.table.selectionModel().selectedRows()
        fixes = self.fixes()
        if self.is_stale() or not rows or rows[0].row() >= len(fixes):
            return None
        return fixes[rows[0].row()]

    @Slot()
    def apply_selected(self) -> None:
        fix = self.selected_fix()
        if fix is not None:
            self.fixActivated.emit(fix)

    @Slot(QModelIndex)
    def _on_double_clicked(self, index: QModelIndex) -> None:
        fixes = self.fixes()
        if not self.is_stale() and 0 <= index.row() < len(fixes):
            self.fixActivated.emit(fixes[index.row()])

    @Slot()
    def _update_apply(self) -> None:
        self.apply_button.setEnabled(self.selected_fix() is not None)
