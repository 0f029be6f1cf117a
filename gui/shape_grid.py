"""Shapes: memory and tokens/s at every micro-batch size and sequence length, as a heat
map (Tradeoffs > Shapes) -- the shapes a run can take on its GPUs at a glance.

:func:`compute_shapes` (no Qt; run it in a worker) evaluates
:func:`memfit.engine.solve.shape_grid` over powers of two: micro-batches 1 to 64 and
sequence lengths 512 up to the model's context (at most 131,072). :class:`ShapeGridView`
colours each cell by its verdict and names its memory and speed; a double-click makes that
shape the scenario.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from memfit.engine.solve import GridCell, shape_grid
from memfit.engine.specs import Scenario
from memfit.gui.chart import gib_text

MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
#: the longest sequence the grid shows, whatever the model's context
MAX_SEQUENCE = 131_072
#: cell colours by verdict (light, so the text stays readable in either theme's table)
VERDICT_COLOURS = {"fits": "#cfe8d4", "tight": "#f6e2b3", "oom": "#f2c7c7"}


@dataclass(frozen=True, slots=True)
class Shapes:
    """The grid of one scenario: rows by micro-batch, columns by sequence length."""

    scenario: Scenario
    micro_batches: tuple[int, ...]
    sequence_lengths: tuple[int, ...]
    cells: tuple[tuple[GridCell, ...], ...]


def sequence_lengths(scenario: Scenario) -> tuple[int, ...]:
    """Powers of two from 512 to the model's context (at most :data:`MAX_SEQUENCE`),
    and the scenario's own length among them."""
    top = min(MAX_SEQUENCE, max(512, scenario.model.max_position_embeddings or MAX_SEQUENCE))
    out = []
    n = 512
    while n <= top:
        out.append(n)
        n *= 2
    return tuple(sorted({*out, scenario.training.sequence_length}))


def compute_shapes(
    scenario: Scenario, keep_going: Callable[[int, int], bool] | None = None
) -> Shapes | None:
    """The grid around ``scenario`` (``None`` when stopped)."""
    seqs = sequence_lengths(scenario)
    rows = []
    for i, b in enumerate(MICRO_BATCHES):
        if keep_going is not None and not keep_going(i, len(MICRO_BATCHES)):
            return None
        rows.append(tuple(shape_grid(scenario, (b,), seqs)[0]))
    return Shapes(scenario, MICRO_BATCHES, seqs, tuple(rows))


def cell_words(cell: GridCell) -> str:
    if cell.device_bytes is None:
        return "—"
    speed = f"{cell.tokens_per_s:,.0f} tok/s" if cell.tokens_per_s else ""
    return f"{gib_text(cell.device_bytes)}\n{speed}"


def verdict_of(cell: GridCell, capacity: int) -> str:
    if cell.device_bytes is None:
        return ""
    if cell.device_bytes <= cell.budget_bytes:
        return "fits"
    return "tight" if cell.device_bytes <= capacity else "oom"


class ShapeGridView(QWidget):
    """The heat map; :attr:`shapeActivated` carries ``(micro_batch, sequence_length)``."""

    shapeActivated = Signal(int, int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._shapes: Shapes | None = None
        self.table = QTableWidget(0, 0)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setWordWrap(True)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.setToolTip(
            "Memory per GPU (GiB = 2^30 bytes) and tokens/s at each micro-batch (down) and "
            "sequence length (across): green fits the budget, amber fits the card only, red "
            "does not fit. Double-click a cell to make it the scenario (Ctrl+Z undoes)."
        )
        self.table.cellDoubleClicked.connect(self._on_double_click)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.table)

    def shapes(self) -> Shapes | None:
        return self._shapes

    def set_shapes(self, shapes: Shapes, capacity: int) -> None:
        self._shapes = shapes
        self.table.setEnabled(True)
        self.table.clear()
        self.table.setRowCount(len(shapes.micro_batches))
        self.table.setColumnCount(len(shapes.sequence_lengths))
        self.table.setHorizontalHeaderLabels([f"{n:,}" for n in shapes.sequence_lengths])
        self.table.setVerticalHeaderLabels([f"mb {b}" for b in shapes.micro_batches])
        t = shapes.scenario.training
        for r, row in enumerate(shapes.cells):
            for c, cell in enumerate(row):
                item = QTableWidgetItem(cell_words(cell))
                item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                verdict = verdict_of(cell, capacity)
                if verdict:
                    item.setBackground(QBrush(QColor(VERDICT_COLOURS[verdict])))
                    item.setForeground(QBrush(QColor("#202020")))
                if (cell.micro_batch_size, cell.sequence_length) == (
                    t.micro_batch_size,
                    t.sequence_length,
                ):
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                self.table.setItem(r, c, item)

    def set_stale(self, reason: str | None) -> None:
        self.table.setEnabled(reason is None)
        self.table.setToolTip(reason or self.table.toolTip())

    def cell_text(self, micro_batch: int, sequence_length: int) -> str:
        shapes = self._shapes
        assert shapes is not None
        r = shapes.micro_batches.index(micro_batch)
        c = shapes.sequence_lengths.index(sequence_length)
        item = self.table.item(r, c)
        return item.text() if item is not None else ""

    @Slot(int, int)
    def _on_double_click(self, row: int, column: int) -> None:
        shapes = self._shapes
        if shapes is None or not self.table.isEnabled():
            return
        self.shapeActivated.emit(shapes.micro_batches[row], shapes.sequence_lengths[column])
