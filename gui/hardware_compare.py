"""The same run on other GPUs: how many each needs, how fast it goes, what it costs.

:func:`compare` (no Qt; run it in a worker) takes the scenario to each GPU preset asked
for and finds the fewest GPUs of it that fit (:func:`memfit.engine.solve.min_gpus`: the same
parallel layout, micro-batch and accumulation), then the step time there; and the run on
as many of it as the scenario has, fitting or not (a user with 64 GPUs asks what each kind
would do on 64, not only that 24 H100s would do). Prices come
only from what is known: the scenario's own price per GPU-hour for the scenario's GPU,
else the GPU preset's; a price given for one GPU is never carried to another. Without a
price, or without a token budget, the cost is "—".

:class:`HardwareView` is a checkable list of the GPU presets beside a table of the
results.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHeaderView,
    QLabel,
    QListView,
    QListWidget,
    QListWidgetItem,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from memfit.engine.errors import EstimateError
from memfit.engine.presets import gpu_names, load_gpu
from memfit.engine.solve import hardware_with, min_gpus
from memfit.engine.specs import Scenario
from memfit.engine.sweep import Point, describe, point
from memfit.gui.chart import gib_text, rich_text
from memfit.gui.forms import guard_field

#: ticked by default beside the scenario's own GPU
COMMON_GPUS = ("h100-sxm-80gb", "a100-sxm-80gb", "h200-sxm-141gb")
DASH = "—"
COLUMNS = (
    "GPU",
    "GPUs needed",
    "Memory per GPU",
    "Tokens/s",
    "Tokens/s per GPU",
    "MFU",
    "Step time",
    "Price per GPU-hour",
    "Run time",
    "GPU-hours",
    "Cost",
)
#: the column headers as shown: two short lines each, so that the table fits its pane
HEADERS = {
    "GPUs needed": "GPUs\nneeded",
    "Memory per GPU": "Memory\nper GPU",
    "Tokens/s": "Tokens/s\n(all GPUs)",
    "Tokens/s per GPU": "Tokens/s\nper GPU",
    "MFU": "MFU\n",
    "Step time": "Step\ntime",
    "Price per GPU-hour": "Price per\nGPU-hour",
    "Run time": "Run time\n(budget)",
    "GPU-hours": "GPU-\nhours",
    "Cost": "Cost\n(budget)",
}
CSV_FIELDS = (
    "gpu",
    "gpus",
    "gpus_per_node",
    "nodes",
    "fits",
    "device_bytes",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "step_time_s",
    "price_per_gpu_hour",
    "run_time_s",
    "gpu_hours",
    "cost",
)


#: what the table compares each GPU at: the fewest of it that fit, or the user's count
MODES = (("fewest", "the fewest GPUs that fit"), ("yours", "your GPU count"))


@dataclass(frozen=True, slots=True)
class HardwareRow:
    """One GPU's answer: ``point`` is ``None`` when no count of it fits (``problem``
    then says why, or is empty); ``at_count`` is the run on as many of it as the
    scenario has (``None`` where the layout does not hold there), fitting or not."""

    gpu: str
    display_name: str
    point: Point | None
    problem: str = ""
    at_count: Point | None = None

    @property
    def fits(self) -> bool:
        return self.point is not None

    def shown(self, mode: str) -> Point | None:
        """The point the table shows in ``mode`` (:data:`MODES`)."""
        return self.at_count if mode == "yours" else self.point


def on_gpu(scenario: Scenario, gpu: str) -> Scenario:
    """``scenario`` on the GPU preset ``gpu``: its own hardware for its own GPU; for
    another, the preset's memory and price (the scenario's overrides are for its GPU)."""
    if gpu == scenario.hardware.gpu.name:
        return scenario
    moved = hardware_with(scenario, gpu)
    hw = dataclasses.replace(moved.hardware, price_per_gpu_hour=None)
    return dataclasses.replace(moved, hardware=hw)


def compare_one(scenario: Scenario, gpu: str) -> HardwareRow:
    try:
        base = on_gpu(scenario, gpu)
        name = base.hardware.gpu.display_name
    except EstimateError as exc:
        return HardwareRow(gpu, gpu, None, str(exc))
    try:
        at_count: Point | None = point(base)
    except EstimateError:
        at_count = None
    try:
        found = min_gpus(base)
    except EstimateError as exc:
        return HardwareRow(gpu, name, None, str(exc), at_count)
    return HardwareRow(gpu, name, point(found) if found else None, "", at_count)


def compare(
    scenario: Scenario, gpus: Sequence[str], keep_going: Callable[[int, int], bool] | None = None
) -> list[HardwareRow]:
    """One row per GPU of ``gpus``, in that order (fewer when stopped)."""
    rows = []
    for i, gpu in enumerate(gpus):
        if keep_going is not None and not keep_going(i, len(gpus)):
            break
        rows.append(compare_one(scenario, gpu))
    else:
        if keep_going is not None:
            keep_going(len(gpus), len(gpus))
    return rows


def duration_text(seconds: float) -> str:
    """``3.2 h``, ``12.5 days``, ``45 min``."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:,.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds / 60:,.0f} min"


def gpus_text(s: Scenario) -> str:
    hw = s.hardware
    if hw.nodes == 1:
        return f"{hw.world_size:,}"
    return f"{hw.world_size:,} ({hw.nodes:,} nodes x {hw.gpus_per_node})"


def row_texts(row: HardwareRow, mode: str = "fewest") -> list[str]:
    """The table's cells for ``row`` (see :data:`COLUMNS`) in ``mode`` (:data:`MODES`):
    at the fewest GPUs that fit, or at the scenario's own count (fitting or not)."""
    p = row.shown(mode)
    if p is None:
        words = "does not fit" if mode == "fewest" else "the layout does not hold"
        return [row.display_name, words, *([DASH] * (len(COLUMNS) - 2))]
    t = p.time
    price = t.price_per_gpu_hour
    memory = gib_text(p.device_bytes)
    if not p.fits:
        memory += ", over budget"
    return [
        row.display_name,
        gpus_text(p.scenario),
        memory,
        f"{t.tokens_per_s:,.0f}",
        f"{t.tokens_per_s_per_gpu:,.0f}",
        f"{t.mfu * 100:.1f} %",
        f"{t.step_time_s:.3g} s",
        DASH if price is None else f"{price:,.2f}",
        DASH if t.run_time_s is None else duration_text(t.run_time_s),
        DASH if t.gpu_hours is None else f"{t.gpu_hours:,.0f}",
        DASH if t.cost is None else f"{t.cost:,.0f}",
    ]


def rows_csv(rows: Sequence[HardwareRow], mode: str = "fewest") -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        p = row.shown(mode)
        out: dict[str, object] = {"gpu": row.gpu, "fits": p is not None and p.fits}
        if p is not None:
            hw, t = p.scenario.hardware, p.time
            out.update(
                gpus=hw.world_size,
                gpus_per_node=hw.gpus_per_node,
                nodes=hw.nodes,
                device_bytes=p.device_bytes,
                tokens_per_s=t.tokens_per_s,
                tokens_per_s_per_gpu=t.tokens_per_s_per_gpu,
                mfu=t.mfu,
                step_time_s=t.step_time_s,
                price_per_gpu_hour="" if t.price_per_gpu_hour is None else t.price_per_gpu_hour,
                run_time_s="" if t.run_time_s is None else t.run_time_s,
                gpu_hours="" if t.gpu_hours is None else t.gpu_hours,
                cost="" if t.cost is None else t.cost,
            )
        writer.writerow(out)
    return buffer.getvalue()


class HardwareView(QWidget):
    """GPU presets to tick on the left, the comparison on the right.

    :attr:`selectionChanged` says the ticked GPUs changed (by the user);
    :meth:`set_rows` shows a result; :meth:`set_stale` greys the table with a reason.
    """

    selectionChanged = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._rows: list[HardwareRow] = []
        self._stale: str | None = None
        self.gpu_list = QListWidget()
        self.gpu_list.setAccessibleName("GPUs to compare")
        self.gpu_list.setToolTip("Tick the GPUs to compare this run on")
        # the presets flow in columns under the table
        self.gpu_list.setFlow(QListView.Flow.LeftToRight)
        self.gpu_list.setWrapping(True)
        self.gpu_list.setResizeMode(QListView.ResizeMode.Adjust)
        self.gpu_list.setUniformItemSizes(True)
        self.gpu_list.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        for name in gpu_names():
            gpu = load_gpu(name)
            item = QListWidgetItem(gpu.display_name)
            item.setData(Qt.ItemDataRole.UserRole, name)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Unchecked)
            item.setToolTip(rich_text(f"{gpu.display_name} ({gib_text(gpu.memory_bytes)})"))
            self.gpu_list.addItem(item)
        rows = 7
        self.gpu_list.setFixedHeight(rows * self.gpu_list.sizeHintForRow(0) + 8)
        self.gpu_list.itemChanged.connect(self._on_item_changed)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels([HEADERS.get(c, c) for c in COLUMNS])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setWordWrap(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        tips = {
            "GPUs needed": "The fewest GPUs of this kind that fit, with the same parallel "
            "layout, micro-batch and accumulation (more GPUs help only through ZeRO sharding)",
            "Price per GPU-hour": "The scenario's price for its own GPU (Hardware panel), else "
            "the GPU preset's; never assumed",
            "Run time": "The token budget (Training strategy panel) at this speed",
            "Cost": "GPU-hours x price per GPU-hour, in the price's currency",
        }
        for col, name in enumerate(COLUMNS):
            cell = self.table.horizontalHeaderItem(col)
            if cell is not None:
                cell.setToolTip(tips.get(name, name))

        self.mode = QComboBox()
        for key, words in MODES:
            self.mode.addItem(f"Each GPU at {words}", key)
        self.mode.setAccessibleName("Compare each GPU at")
        self.mode.setToolTip(
            "The fewest GPUs of each kind that fit the budget, or as many as the scenario "
            "has (its GPUs per node and nodes): what each would do on your cluster"
        )
        self.mode.currentIndexChanged.connect(self._redraw)
        guard_field(self.mode)
        self._scenario: Scenario | None = None

        self.note = QLabel()
        self.note.setObjectName("hardwareNote")
        self.note.setTextFormat(Qt.TextFormat.PlainText)
        self.note.setWordWrap(True)

        heading = QLabel("GPUs to compare")
        heading.setStyleSheet("font-weight: bold;")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.mode)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.note)
        layout.addWidget(heading)
        layout.addWidget(self.gpu_list)

    # -- ticks -----------------------------------------------------------------------------

    def checked(self) -> list[str]:
        """The ticked GPU presets, in the list's order."""
        out = []
        for i in range(self.gpu_list.count()):
            item = self.gpu_list.item(i)
            if item.checkState() == Qt.CheckState.Checked:
                out.append(str(item.data(Qt.ItemDataRole.UserRole)))
        return out

    def set_checked(self, names: Sequence[str]) -> None:
        """Tick exactly ``names`` (unknown names are ignored) without emitting."""
        wanted = set(names)
        self.gpu_list.blockSignals(True)
        try:
            for i in range(self.gpu_list.count()):
                item = self.gpu_list.item(i)
                on = item.data(Qt.ItemDataRole.UserRole) in wanted
                item.setCheckState(Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)
        finally:
            self.gpu_list.blockSignals(False)

    def check(self, name: str) -> None:
        """Tick ``name`` too (without emitting)."""
        self.set_checked([*self.checked(), name])

    @Slot(QListWidgetItem)
    def _on_item_changed(self, _item: QListWidgetItem) -> None:
        self.selectionChanged.emit()

    # -- results ---------------------------------------------------------------------------

    def rows(self) -> list[HardwareRow]:
        return list(self._rows)

    def mode_key(self) -> str:
        """What the table compares at (:data:`MODES`)."""
        return str(self.mode.currentData())

    def set_rows(self, rows: Sequence[HardwareRow], scenario: Scenario) -> None:
        self._rows = list(rows)
        self._scenario = scenario
        self._stale = None
        self.table.setEnabled(True)
        self._redraw()

    @Slot()
    def _redraw(self) -> None:
        scenario = self._scenario
        if scenario is None:
            return
        mode = self.mode_key()
        self.table.setRowCount(len(self._rows))
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        for r, row in enumerate(self._rows):
            shown = row.shown(mode)
            tip = row.problem or (
                describe(shown.scenario)
                if shown is not None
                else "No number of these GPUs fits this run as it is laid out"
            )
            for c, text in enumerate(row_texts(row, mode)):
                cell = QTableWidgetItem(text)
                if c > 0:
                    cell.setTextAlignment(right)
                cell.setToolTip(rich_text(tip))
                self.table.setItem(r, c, cell)
        self._set_note(scenario)

    def _set_note(self, scenario: Scenario) -> None:
        t = scenario.training
        if self.mode_key() == "yours":
            count = scenario.hardware.world_size
            head = f"on your {count:,} GPUs, fitting the budget line or not"
        else:
            head = "the fewest GPUs that fit the budget line"
        parts = [f"Each GPU with the scenario's layout ({describe(scenario)}); {head}."]
        if t.token_budget is None:
            parts.append("Give a token budget (Training strategy) for the run time and cost.")
        else:
            parts.append(f"Run of {t.token_budget:,} tokens.")
        if not any(r.point is not None and r.point.time.price_per_gpu_hour for r in self._rows):
            parts.append(
                "No price known: give the price per GPU-hour of the scenario's GPU "
                "(Hardware) for its cost."
            )
        self.note.setText(" ".join(parts))

    def set_stale(self, reason: str | None) -> None:
        self._stale = reason
        self.table.setEnabled(reason is None)
        if reason:
            self.note.setText(reason)

    def is_stale(self) -> bool:
        return self._stale is not None

    def csv_text(self) -> str:
        return rows_csv(self._rows, self.mode_key())

    def cell_text(self, row: int, column: str) -> str:
        item = self.table.item(row, COLUMNS.index(column))
        return item.text() if item is not None else ""
