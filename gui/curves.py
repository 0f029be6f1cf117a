"""Curves: memory and step time against the micro-batch and the sequence length.

:func:`compute_curves` (no Qt; run it in a worker) evaluates the scenario at powers of two
of the micro-batch and of the sequence length (:func:`memfit.engine.sweep.curve`), once without
activation checkpointing and once with full checkpointing, and asks the solvers for the
largest value that fits each (:func:`memfit.engine.solve.max_micro_batch`,
:func:`memfit.engine.solve.max_sequence_length`). The axes reach the solver's answer when it
lies outside the usual range.

:class:`CurvesView` draws them in a 2 x 2 grid of pyqtgraph plots -- memory and step time
by rows of micro-batch and sequence length -- with the capacity and budget lines on the
memory plots and the largest fitting value of each variant marked by a dashed line.
The x axes are logarithmic in base 2 (each doubling one step).

>>> axis_values("micro_batch_size", None)[:3], axis_values("micro_batch_size", 200)[-1]
((1, 2, 4), 256)
>>> tick_text("sequence_length", 131072), tick_text("micro_batch_size", 8)
('128k', '8')
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QPointF, Qt, Slot
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from memfit.engine.estimate import GIB
from memfit.engine.solve import max_micro_batch, max_sequence_length
from memfit.engine.specs import Scenario
from memfit.engine.sweep import Point, curve
from memfit.gui.chart import gib_text, rich_text
from memfit.gui.plot_style import (
    VERDICT_WORDS,
    capacity_colour,
    is_dark_background,
    line_label_fill,
    palette_changed,
    palette_colours,
    series_colour,
    style_plot,
)
from memfit.gui.sweep_map import NumberAxis

FIELDS = ("micro_batch_size", "sequence_length")
CHECKPOINTING = ("none", "full")
FIELD_NAMES = {"micro_batch_size": "micro-batch", "sequence_length": "sequence length"}
X_LABELS = {
    "micro_batch_size": "Micro-batch (sequences per GPU)",
    "sequence_length": "Sequence length (tokens; k = 1,024)",
}
SERIES_NAMES = {"none": "no checkpointing", "full": "full checkpointing"}
#: the usual range of each axis, as powers of two (inclusive)
RANGES = {"micro_batch_size": (0, 6), "sequence_length": (9, 17)}
#: how far an axis may grow to reach the solver's answer
LIMITS = {"micro_batch_size": (0, 16), "sequence_length": (0, 24)}
MEMORY_LABEL = "Memory per GPU (GiB, 2^30 B)"
TIME_LABEL = "Step time (s)"
#: the memory plots show up to this multiple of the capacity
Y_CAP = 2.5


def axis_values(field: str, largest: int | None) -> tuple[int, ...]:
    """Powers of two over the usual range of ``field``, widened to reach ``largest``."""
    lo, hi = RANGES[field]
    min_exp, max_exp = LIMITS[field]
    if largest is not None and largest > 0:
        exp = math.log2(largest)
        lo = max(min_exp, min(lo, math.floor(exp)))
        hi = min(max_exp, max(hi, math.ceil(exp)))
    return tuple(2**e for e in range(lo, hi + 1))


def tick_text(field: str, value: float) -> str:
    """``8`` for a micro-batch; ``512``, ``4k``, ``128k`` for a sequence length."""
    n = round(value)
    if field == "sequence_length" and n >= 1024 and n % 1024 == 0:
        return f"{n // 1024:,}k"
    return f"{n:,}"


@dataclass(frozen=True, slots=True)
class Curve:
    """One variant's points along one axis, and the largest fitting value of it."""

    field: str
    checkpointing: str
    values: tuple[int, ...]
    points: tuple[Point | None, ...]  # None: the engine rejects that value
    largest: int | None  # None: not even the smallest value fits


@dataclass(frozen=True, slots=True)
class Curves:
    scenario: Scenario
    curves: tuple[Curve, ...]
    capacity_bytes: int
    budget_bytes: int

    def get(self, field: str, checkpointing: str) -> Curve:
        return next(c for c in self.curves if c.field == field and c.checkpointing == checkpointing)


def with_checkpointing(scenario: Scenario, checkpointing: str) -> Scenario:
    training = dataclasses.replace(scenario.training, activation_checkpointing=checkpointing)
    return dataclasses.replace(scenario, training=training)


def compute_curves(
    scenario: Scenario, keep_going: Callable[[int, int], bool] | None = None
) -> Curves | None:
    """Both axes, both variants (see the module docstring); ``None`` when stopped."""
    solvers = {"micro_batch_size": max_micro_batch, "sequence_length": max_sequence_length}
    curves: list[Curve] = []
    total = len(FIELDS) * len(CHECKPOINTING)
    for field in FIELDS:
        for ckpt in CHECKPOINTING:
            if keep_going is not None and not keep_going(len(curves), total):
                return None
            variant = with_checkpointing(scenario, ckpt)
            largest = solvers[field](variant)
            values = axis_values(field, largest)
            points = tuple(curve(variant, field, values))
            curves.append(Curve(field, ckpt, values, points, largest))
    if keep_going is not None:
        keep_going(total, total)
    hw = scenario.hardware
    return Curves(scenario, tuple(curves), hw.capacity_bytes, hw.budget_bytes)


CSV_FIELDS = (
    "axis",
    "value",
    "checkpointing",
    "device_bytes",
    "budget_bytes",
    "capacity_bytes",
    "verdict",
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "bound",
    "largest_fitting",
)


def curves_csv(curves: Curves) -> str:
    """One row per axis, variant and value; empty cells where the engine rejects it."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for c in curves.curves:
        for value, p in zip(c.values, c.points, strict=True):
            row: dict[str, object] = {
                "axis": c.field,
                "value": value,
                "checkpointing": c.checkpointing,
                "largest_fitting": "" if c.largest is None else c.largest,
            }
            if p is not None:
                row.update(
                    device_bytes=p.device_bytes,
                    budget_bytes=p.budget_bytes,
                    capacity_bytes=p.capacity_bytes,
                    verdict=p.verdict,
                    step_time_s=p.time.step_time_s,
                    tokens_per_s=p.time.tokens_per_s,
                    tokens_per_s_per_gpu=p.time.tokens_per_s_per_gpu,
                    mfu=p.time.mfu,
                    bound=p.time.bound,
                )
            writer.writerow(row)
    return buffer.getvalue()


class Log2Axis(pg.AxisItem):
    """Ticks at each doubling of an axis drawn as log2(value)."""

    def __init__(self, field: str, orientation: str = "bottom") -> None:
        super().__init__(orientation)
        self.field = field
        self.enableAutoSIPrefix(False)

    def tickValues(
        self, minVal: float, maxVal: float, size: float
    ) -> list[tuple[float, list[float]]]:
        lo, hi = math.ceil(minVal - 1e-9), math.floor(maxVal + 1e-9)
        exps = list(range(lo, hi + 1))
        # every doubling while the labels have room, else every second or fourth
        step = 1
        while len(exps) // step > max(2, size // 46):
            step *= 2
        return [(1.0, [float(e) for e in exps if e % step == 0])]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        return [tick_text(self.field, 2**v) for v in values]


class CurvesView(QWidget):
    """Four plots of a :class:`Curves`; :meth:`set_curves` is the one way in.

    :meth:`set_stale` greys the curves out with a reason (the current scenario has no
    valid estimate, or they are being recomputed)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._built = False  # palette changes wait for the plots
        self._curves: Curves | None = None
        self._stale: str | None = None
        self._dark = False
        self.layout_widget = pg.GraphicsLayoutWidget()
        self.layout_widget.setAntialiasing(True)
        self.graphics = self.layout_widget.ci
        self.plots: dict[tuple[str, str], pg.PlotItem] = {}
        self.lines: dict[tuple[str, str, str], pg.PlotDataItem] = {}
        self.markers: dict[tuple[str, str, str], pg.InfiniteLine] = {}
        self.limit_lines: dict[tuple[str, str], pg.InfiniteLine] = {}
        for row, field in enumerate(FIELDS):
            for col, metric in enumerate(("memory", "time")):
                self._add_plot(row, col, field, metric)
        # one legend for the four plots, in a row of its own under them
        self.legend = pg.LegendItem(colCount=2, frame=False, labelTextSize="9pt")
        for ckpt in CHECKPOINTING:
            self.legend.addItem(
                self.lines[("micro_batch_size", "memory", ckpt)], SERIES_NAMES[ckpt]
            )
        for sample, _label in self.legend.items:  # a click would hide a curve
            sample.setAcceptedMouseButtons(Qt.MouseButton.NoButton)
        self.graphics.addItem(self.legend, row=len(FIELDS), col=0, colspan=2)
        self.graphics.layout.setAlignment(self.legend, Qt.AlignmentFlag.AlignHCenter)
        self.note = QLabel()
        self.note.setObjectName("curvesNote")
        self.note.setTextFormat(Qt.TextFormat.PlainText)
        self.note.setWordWrap(True)
        self.note.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.setBackgroundRole(QPalette.ColorRole.Base)
        self.setAutoFillBackground(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(2)
        layout.addWidget(self.layout_widget, 1)
        layout.addWidget(self.note)
        self.layout_widget.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self._built = True
        self.apply_palette()

    def _add_plot(self, row: int, col: int, field: str, metric: str) -> None:
        axis = Log2Axis(field)
        left = NumberAxis("left")
        left.enableAutoSIPrefix(False)
        item = self.graphics.addPlot(row=row, col=col, axisItems={"bottom": axis, "left": left})
        item.hideButtons()
        item.setMenuEnabled(False)
        item.setMouseEnabled(False, False)
        item.showGrid(x=True, y=True, alpha=0.25)
        item.setLabel("bottom", X_LABELS[field])
        item.setLabel("left", MEMORY_LABEL if metric == "memory" else TIME_LABEL)
        item.getAxis("left").setWidth(58)
        item.getViewBox().disableAutoRange()
        self.plots[(field, metric)] = item
        for ckpt in CHECKPOINTING:
            line = pg.PlotDataItem(x=np.zeros(0), y=np.zeros(0), symbol="o", symbolSize=6)
            line.setZValue(5)
            item.addItem(line)
            self.lines[(field, metric, ckpt)] = line
            label = "largest fitting: {value}" if metric == "memory" else ""
            marker = pg.InfiniteLine(
                angle=90,
                label=label,
                labelOpts={
                    "position": 0.93 if ckpt == "none" else 0.8,
                    "anchors": [(0, 0), (0, 0)],
                },
            )
            marker.setZValue(8)
            item.addItem(marker, ignoreBounds=True)
            self.markers[(field, metric, ckpt)] = marker
        if metric == "memory":
            # the capacity's label above its line, the budget's below its own
            anchors = {"capacity": [(0, 1), (0, 1)], "budget": [(0, 0), (0, 0)]}
            for key in ("capacity", "budget"):
                opts = {"position": 0.02, "anchors": anchors[key]}
                limit = pg.InfiniteLine(angle=0, label="", labelOpts=opts)
                limit.setZValue(9)
                item.addItem(limit, ignoreBounds=True)
                self.limit_lines[(field, key)] = limit

    # -- the one way in --------------------------------------------------------------------

    def set_curves(self, curves: Curves | None) -> None:
        self._curves = curves
        self._stale = None
        self._draw()

    def set_stale(self, reason: str | None) -> None:
        if reason != self._stale:
            self._stale = reason
            self._restyle()
            self._set_note()

    def curves(self) -> Curves | None:
        return self._curves

    def is_stale(self) -> bool:
        return self._stale is not None

    def marker_value(self, field: str, checkpointing: str) -> float | None:
        """The value the marker of the largest fitting ``field`` stands at (``None`` when
        hidden)."""
        marker = self.markers[(field, "memory", checkpointing)]
        if not marker.isVisible():
            return None
        return float(2 ** marker.value())

    # -- drawing ---------------------------------------------------------------------------

    def _draw(self) -> None:
        curves = self._curves
        for field in FIELDS:
            x_lo, x_hi, mem_top, time_top = math.inf, -math.inf, 0.0, 0.0
            capacity = curves.capacity_bytes / GIB if curves else 0.0
            for ckpt in CHECKPOINTING:
                c = curves.get(field, ckpt) if curves else None
                xs = np.log2(np.array(c.values, dtype=float)) if c else np.zeros(0)
                mem = np.array(
                    [p.device_bytes / GIB if p else np.nan for p in c.points] if c else [],
                    dtype=float,
                )
                time = np.array(
                    [p.time.step_time_s if p else np.nan for p in c.points] if c else [],
                    dtype=float,
                )
                if xs.size:
                    x_lo, x_hi = min(x_lo, float(xs[0])), max(x_hi, float(xs[-1]))
                for metric, ys in (("memory", mem), ("time", time)):
                    ok = np.isfinite(ys)
                    self.lines[(field, metric, ckpt)].setData(x=xs[ok], y=ys[ok])
                if np.isfinite(mem).any():
                    in_cap = mem[np.isfinite(mem)]
                    mem_top = max(mem_top, float(min(in_cap.max(), Y_CAP * capacity or np.inf)))
                if np.isfinite(time).any():
                    time_top = max(time_top, float(np.nanmax(time)))
                for metric in ("memory", "time"):
                    marker = self.markers[(field, metric, ckpt)]
                    largest = c.largest if c else None
                    marker.setVisible(largest is not None)
                    if largest is not None:
                        marker.setPos(math.log2(largest))
                        if metric == "memory":
                            marker.label.setFormat(
                                f"largest fitting: {tick_text(field, largest)}"
                                if field == "micro_batch_size"
                                else f"largest fitting: {largest:,}"
                            )
            if not math.isfinite(x_lo):
                x_lo, x_hi = RANGES[field]
            for metric in ("memory", "time"):
                self.plots[(field, metric)].setXRange(x_lo - 0.3, x_hi + 0.3, padding=0.0)
            top = max(mem_top, capacity) * 1.1 or 1.0
            self.plots[(field, "memory")].setYRange(0.0, top, padding=0.0)
            self.plots[(field, "time")].setYRange(0.0, time_top * 1.1 or 1.0, padding=0.0)
            for key in ("capacity", "budget"):
                limit = self.limit_lines[(field, key)]
                limit.setVisible(curves is not None)
                if curves is None:
                    continue
                target = curves.scenario.hardware.utilization_target
                if key == "capacity":
                    limit.setPos(capacity)
                    limit.label.setFormat(f"capacity {gib_text(curves.capacity_bytes)}")
                else:
                    limit.setPos(curves.budget_bytes / GIB)
                    limit.label.setFormat(
                        f"budget {target * 100:g} % · {gib_text(curves.budget_bytes)}"
                    )
        titles = {
            ("micro_batch_size", "memory"): "Memory against the micro-batch",
            ("micro_batch_size", "time"): "Step time against the micro-batch",
            ("sequence_length", "memory"): "Memory against the sequence length",
            ("sequence_length", "time"): "Step time against the sequence length",
        }
        _bg, foreground, _muted = palette_colours(self.palette())
        for plot_key, item in self.plots.items():
            item.setTitle(titles[plot_key], color=foreground.name(), size="10pt")
        self._restyle()
        self._set_note()

    def _set_note(self) -> None:
        curves = self._curves
        if self._stale:
            self.note.setText(self._stale)
            return
        if curves is None:
            self.note.setText("")
            return
        t, hw = curves.scenario.training, curves.scenario.hardware
        parts = []
        for field in FIELDS:
            found = []
            for ckpt in CHECKPOINTING:
                largest = curves.get(field, ckpt).largest
                words = "none" if largest is None else f"{largest:,}"
                found.append(f"{words} with {SERIES_NAMES[ckpt]}")
            parts.append(f"largest {FIELD_NAMES[field]} that fits: " + ", ".join(found))
        self.note.setText(
            f"On {hw.world_size} x {hw.gpu.display_name}, {parts[0]}; {parts[1]}.\n"
            f"Each curve keeps the rest of the scenario (micro-batch {t.micro_batch_size}, "
            f"sequence {t.sequence_length:,}, gradient accumulation "
            f"{t.gradient_accumulation_steps})."
        )

    def _restyle(self) -> None:
        stale = self._stale is not None
        _background, foreground, muted = palette_colours(self.palette())
        for (_field, _metric, ckpt), line in self.lines.items():
            colour = muted if stale else series_colour(ckpt, self._dark)
            style = Qt.PenStyle.SolidLine if ckpt == "none" else Qt.PenStyle.DashLine
            line.setPen(pg.mkPen(colour, width=2, style=style))
            line.setSymbolBrush(pg.mkBrush(colour))
            line.setSymbolPen(pg.mkPen(colour))
        for (_field, _metric, ckpt), marker in self.markers.items():
            colour = muted if stale else series_colour(ckpt, self._dark)
            marker.setPen(pg.mkPen(colour, width=1.5, style=Qt.PenStyle.DotLine))
            marker.label.setColor(colour)
            marker.label.fill = line_label_fill(self.palette())
            marker.label.update()
        for (_field, key), limit in self.limit_lines.items():
            if key == "capacity":
                colour = muted if stale else capacity_colour(self._dark)
                limit.setPen(pg.mkPen(colour, width=2))
            else:
                colour = foreground
                limit.setPen(pg.mkPen(colour, width=1.2, style=Qt.PenStyle.DashLine))
            limit.label.setColor(colour)
            limit.label.fill = line_label_fill(self.palette())
            limit.label.update()
        self.legend.setLabelTextColor(foreground)
        for _sample, label in self.legend.items:
            label.setText(label.text)

    # -- hover -----------------------------------------------------------------------------

    def text_at(self, field: str, x: float) -> str:
        """Both variants at the axis value nearest to ``x`` (log2 of the value)."""
        if self._curves is None:
            return ""
        c0 = self._curves.get(field, "none")
        if not c0.values:
            return ""
        index = int(np.argmin(np.abs(np.log2(np.array(c0.values, dtype=float)) - x)))
        value = c0.values[index]
        lines = [f"{FIELD_NAMES[field]} {value:,}"]
        for ckpt in CHECKPOINTING:
            c = self._curves.get(field, ckpt)
            p = c.points[index] if index < len(c.points) else None
            if p is None:
                lines.append(f"{SERIES_NAMES[ckpt]}: rejected by the estimate")
                continue
            lines.append(
                f"{SERIES_NAMES[ckpt]}: {gib_text(p.device_bytes)} per GPU "
                f"({VERDICT_WORDS[p.verdict]}), step {p.time.step_time_s:.3g} s, "
                f"{p.time.tokens_per_s:,.0f} tokens/s, MFU {p.time.mfu * 100:.1f} %"
            )
        return "\n".join(lines)

    @Slot(object)
    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        tip = ""
        for (field, _metric), item in self.plots.items():
            view = item.getViewBox()
            if view.sceneBoundingRect().contains(scene_pos):
                tip = self.text_at(field, view.mapSceneToView(scene_pos).x())
                break
        self.layout_widget.setToolTip(rich_text(tip) if tip else "")

    # -- light and dark --------------------------------------------------------------------

    def changeEvent(self, event: QEvent) -> None:
        if palette_changed(self, event):
            self.apply_palette()
        super().changeEvent(event)

    def apply_palette(self) -> None:
        background, foreground, _muted = palette_colours(self.palette())
        self._dark = is_dark_background(background)
        self.layout_widget.setBackground(background)
        for item in self.plots.values():
            style_plot(item, self.palette())
        self.note.setStyleSheet(f"QLabel#curvesNote {{ color: {foreground.name()}; }}")
        self._draw()  # titles, lines and labels take the new colours
