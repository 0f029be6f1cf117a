"""The map of a strategy sweep: memory per GPU against speed (or cost), one dot a
configuration.

:class:`SweepMap` wraps one pyqtgraph plot. Each configuration of a sweep
(:func:`memfit.engine.sweep.sweep`) is a dot at its device total per GPU (GiB, 2^30 bytes) and
its training tokens per second -- or its cost per million tokens, where a price per
GPU-hour is known -- coloured and shaped by its verdict (fits: circle, tight: triangle,
does not fit: cross). The Pareto front (:func:`memfit.engine.sweep.pareto`: no other
configuration has both less memory and more speed) is a line; the budget and capacity
are vertical lines; the current scenario is a star.

Hovering a dot names its configuration (:func:`memfit.engine.sweep.describe`) with its memory,
speed, MFU and bound; clicking one emits :attr:`SweepMap.pointActivated` with it. The map
applies nothing itself, and never while it is marked stale (its dots were swept around
another scenario).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from pyqtgraph.GraphicsScene.mouseEvents import MouseClickEvent
from PySide6.QtCore import QEvent, QPointF, Qt, Signal, Slot
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from memfit.engine.estimate import GIB
from memfit.engine.specs import Scenario
from memfit.engine.sweep import NUMERICS_MARK, Point, describe, numerics_changed, pareto
from memfit.gui.chart import gib_text, rich_text, view_point
from memfit.gui.plot_style import (
    VERDICT_WORDS,
    capacity_colour,
    is_dark_background,
    line_label_fill,
    palette_changed,
    palette_colours,
    style_plot,
    verdict_colour,
)

X_LABEL = "Memory per GPU (GiB, 2^30 bytes)"
Y_LABELS = {
    "tokens": "Training tokens per second (all GPUs)",
    "cost": "Cost per million tokens (price x GPU-hours)",
}
SYMBOLS = {"fits": "o", "tight": "t1", "oom": "x"}
SIZES = {"fits": 8, "tight": 9, "oom": 7}
#: what an empty map says
NO_SWEEP = "No sweep yet: press Sweep"
#: a hover or click within this many pixels of a dot is on it
PICK_PIXELS = 10
#: the view shows memory up to this multiple of the capacity; dots beyond are reached by
#: panning or zooming out
X_CAP = 2.0


def number_text(value: float) -> str:
    """``91,234`` / ``1.23`` / ``0.0012``: a readable number for ticks and tooltips."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:,.2f}".rstrip("0").rstrip(".")
    return f"{value:.2g}"


class NumberAxis(pg.AxisItem):
    """An axis whose ticks have thousands separators instead of exponents."""

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        if spacing >= 1:
            return [f"{v * scale:,.0f}" for v in values]
        decimals = max(0, min(6, -math.floor(math.log10(spacing)))) if spacing > 0 else 2
        return [f"{v * scale:,.{decimals}f}" for v in values]


def point_text(p: Point, base: Scenario | None = None) -> str:
    """Plain text of a configuration for the hover label and tooltip; marked, with how,
    where it trains differently from the scenario ``base`` it was swept around."""
    t = p.time
    differs = numerics_changed(base, p.scenario) if base is not None else ()
    lines = [
        describe(p.scenario),
        f"{gib_text(p.device_bytes)} per GPU of {gib_text(p.capacity_bytes)} "
        f"(budget {gib_text(p.budget_bytes)}) · {VERDICT_WORDS[p.verdict]}",
        f"{t.tokens_per_s:,.0f} tokens/s ({t.tokens_per_s_per_gpu:,.0f} per GPU) · "
        f"step {t.step_time_s:.3g} s · MFU {t.mfu * 100:.1f} % · {t.bound.replace('_', ' ')}"
        " bound",
    ]
    if p.cost_per_token is not None:
        lines[-1] += f" · {number_text(p.cost_per_token)} per million tokens"
    hw = p.scenario.hardware
    lines[0] += f" · {hw.world_size} x {hw.gpu.display_name}"
    if differs:
        lines[0] += f" {NUMERICS_MARK}"
        lines.append(f"{NUMERICS_MARK} Trains differently: " + "; ".join(differs))
    return "\n".join(lines)


class SweepMap(QWidget):
    """Memory per GPU against tokens/s (or cost) of a sweep's configurations.

    Contract: :meth:`set_points` gives it a sweep's points (never modified);
    :meth:`set_current` the current scenario's position; :meth:`set_stale` marks the
    points as swept around another scenario; :meth:`set_metric` chooses the y axis.
    Clicking a dot emits :attr:`pointActivated` with its :class:`~memfit.engine.sweep.Point`.
    """

    pointActivated = Signal(object)  # engine.sweep.Point

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._built = False  # palette changes wait for the plot
        self._base: Scenario | None = None
        self._points: list[Point] = []
        self._front: list[Point] = []
        self._metric = "tokens"
        self._show_oom = True
        self._current: Point | None = None
        self._stale: str | None = None
        self._note = ""
        self._empty = NO_SWEEP
        self._xs = np.zeros(0)
        self._ys = np.zeros(0)
        self._shown = np.zeros(0, dtype=bool)
        self._hovered: int | None = None
        self._beyond = 0  # shown points right of the view
        self._dark = False

        self.plot = pg.PlotWidget(
            axisItems={"left": NumberAxis("left"), "bottom": NumberAxis("bottom")}
        )
        self.plot.setAntialiasing(True)
        self.plot_item: pg.PlotItem = self.plot.getPlotItem()
        self._build_plot()

        self.hover_label = QLabel()
        self.hover_label.setObjectName("mapHover")
        self.hover_label.setTextFormat(Qt.TextFormat.PlainText)
        self.hover_label.setWordWrap(True)
        self.hover_label.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.hover_label.setMinimumHeight(self.fontMetrics().lineSpacing() * 3 + 8)
        self.hover_label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)

        self.setBackgroundRole(QPalette.ColorRole.Base)
        self.setAutoFillBackground(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(2)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.hover_label)

        scene = self.plot.scene()
        scene.sigMouseMoved.connect(self._on_mouse_moved)
        scene.sigMouseClicked.connect(self._on_mouse_clicked)
        self._built = True
        self.apply_palette()
        self._draw()

    # -- construction ----------------------------------------------------------------------

    def _build_plot(self) -> None:
        item = self.plot_item
        item.hideButtons()
        item.setMenuEnabled(False)
        item.showGrid(x=True, y=True, alpha=0.25)
        item.setLabel("bottom", X_LABEL)
        item.setLabel("left", Y_LABELS["tokens"])
        for name in ("left", "bottom"):
            item.getAxis(name).enableAutoSIPrefix(False)
        item.getAxis("left").setWidth(64)
        item.getViewBox().disableAutoRange()

        empty = np.zeros(0)
        self.scatters: dict[str, pg.ScatterPlotItem] = {}
        for verdict in ("oom", "tight", "fits"):  # fitting dots drawn on top
            scatter = pg.ScatterPlotItem(
                x=empty, y=empty, symbol=SYMBOLS[verdict], size=SIZES[verdict], pxMode=True
            )
            scatter.setZValue({"oom": 1, "tight": 2, "fits": 3}[verdict])
            item.addItem(scatter)
            self.scatters[verdict] = scatter
        self.front_line = pg.PlotDataItem(x=empty, y=empty)
        self.front_line.setZValue(4)
        item.addItem(self.front_line)
        self.current_marker = pg.ScatterPlotItem(x=empty, y=empty, symbol="star", size=18)
        self.current_marker.setZValue(6)
        item.addItem(self.current_marker)
        self.hover_marker = pg.ScatterPlotItem(x=empty, y=empty, symbol="o", size=16)
        self.hover_marker.setZValue(7)
        item.addItem(self.hover_marker)

        self.capacity_line = pg.InfiniteLine(
            angle=90, label="", labelOpts={"position": 0.97, "anchors": [(0, 0), (0, 0)]}
        )
        self.budget_line = pg.InfiniteLine(
            angle=90, label="", labelOpts={"position": 0.97, "anchors": [(1, 0), (1, 0)]}
        )
        for line in (self.capacity_line, self.budget_line):
            line.setZValue(10)
            line.label.setZValue(11)
            item.addItem(line, ignoreBounds=True)

        self.empty_text = pg.TextItem("", anchor=(0.5, 0.5))
        self.empty_text.setZValue(30)
        item.addItem(self.empty_text, ignoreBounds=True)

        # the legend sits in its own row under the x axis, so it never covers a dot
        self.legend = pg.LegendItem(colCount=5, frame=False, labelTextSize="9pt")
        for verdict in ("fits", "tight", "oom"):
            self.legend.addItem(self.scatters[verdict], VERDICT_WORDS[verdict])
        self.legend.addItem(self.front_line, "Pareto front")
        self.legend.addItem(self.current_marker, "current scenario")
        self.legend.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)
        item.layout.addItem(self.legend, 4, 1)
        item.layout.setAlignment(self.legend, Qt.AlignmentFlag.AlignHCenter)
        # clicking a legend entry would hide its dots
        for sample, _label in self.legend.items:
            sample.setAcceptedMouseButtons(Qt.MouseButton.NoButton)

    # -- the one way in --------------------------------------------------------------------

    def set_points(
        self,
        points: Sequence[Point],
        note: str = "",
        empty: str = NO_SWEEP,
        base: Scenario | None = None,
    ) -> None:
        """Show ``points`` (a sweep's, in any order); ``note`` goes under the plot when
        nothing is hovered (e.g. how many there are), ``empty`` in it when there are no
        points; ``base``: the scenario swept around (a point that trains differently from
        it is marked when hovered)."""
        self._points = list(points)
        self._base = base
        self._note = note
        self._empty = empty
        self._hovered = None
        self._stale = None
        if self._metric == "cost" and not self.cost_known():
            self._metric = "tokens"
        self._draw()

    def set_current(self, current: Point | None) -> None:
        """The current scenario as a point (its memory and time), or ``None``."""
        self._current = current
        self._draw_current()
        if not self._points:  # the star alone sets the scale
            self._draw_lines()
            self.reset_view()

    def set_empty(self, text: str) -> None:
        """What the map says while it has no points (``Sweeping...``)."""
        self._empty = text
        self._restyle()

    def set_stale(self, reason: str | None) -> None:
        """Mark the dots as not about the current scenario (``None``: they are)."""
        if reason == self._stale:
            return
        self._stale = reason
        self._restyle()
        self._show_hover(None)

    def set_metric(self, metric: str) -> None:
        """``"tokens"`` (tokens/s, higher is better) or ``"cost"`` (per million tokens,
        lower is better; only when every point has a price)."""
        if metric not in Y_LABELS:
            raise ValueError(f"unknown metric: {metric!r}")
        if metric == "cost" and not self.cost_known():
            metric = "tokens"
        if metric != self._metric:
            self._metric = metric
            self._draw()

    def set_show_oom(self, show: bool) -> None:
        if show != self._show_oom:
            self._show_oom = show
            self._draw()

    def clear(self) -> None:
        self._current = None
        self.set_points([])

    # -- queries (hover, click, tests) -----------------------------------------------------

    def points(self) -> list[Point]:
        return list(self._points)

    def front(self) -> list[Point]:
        """The Pareto front drawn, by increasing memory."""
        return list(self._front)

    def y_metric(self) -> str:
        return self._metric

    def is_stale(self) -> bool:
        return self._stale is not None

    def cost_known(self) -> bool:
        """Every point has a cost per token (a price per GPU-hour is known)."""
        return bool(self._points) and all(p.cost_per_token is not None for p in self._points)

    def value(self, p: Point) -> float:
        """``p``'s y value: tokens/s, or cost per million tokens."""
        if self._metric == "cost":
            return p.cost_per_token if p.cost_per_token is not None else math.nan
        return p.time.tokens_per_s

    def view_position(self, index: int) -> QPointF:
        """Where point ``index`` is drawn, in view coordinates (GiB, y value)."""
        return QPointF(float(self._xs[index]), float(self._ys[index]))

    def index_near(self, x: float, y: float, pixels: float = PICK_PIXELS) -> int | None:
        """The shown point nearest to view coordinates ``(x, y)`` within ``pixels``."""
        if not self._shown.any():
            return None
        px, py = self.plot_item.getViewBox().viewPixelSize()
        if not (px > 0 and py > 0):
            return None
        d2 = ((self._xs - x) / px) ** 2 + ((self._ys - y) / py) ** 2
        d2 = np.where(self._shown, d2, np.inf)
        index = int(np.argmin(d2))
        return index if d2[index] <= pixels**2 else None

    def hover_text(self) -> str:
        return self.hover_label.text()

    # -- drawing ---------------------------------------------------------------------------

    def _draw(self) -> None:
        points = self._points
        self._xs = np.array([p.device_bytes / GIB for p in points], dtype=float)
        self._ys = np.array([self.value(p) for p in points], dtype=float)
        verdicts = np.array([p.verdict for p in points], dtype=object)
        self._shown = np.isfinite(self._ys) & (
            np.ones(len(points), dtype=bool) if self._show_oom else verdicts != "oom"
        )
        for verdict, scatter in self.scatters.items():
            mask = self._shown & (verdicts == verdict) if points else np.zeros(0, dtype=bool)
            scatter.setData(x=self._xs[mask], y=self._ys[mask])
        cost = (lambda p: self.value(p)) if self._metric == "cost" else None
        shown = [p for p, s in zip(points, self._shown, strict=True) if s]
        self._front = pareto(shown, cost=cost) if shown else []
        self.front_line.setData(
            x=np.array([p.device_bytes / GIB for p in self._front], dtype=float),
            y=np.array([self.value(p) for p in self._front], dtype=float),
        )
        self.plot_item.setLabel("left", Y_LABELS[self._metric])
        self._draw_lines()
        self._draw_current()
        self.reset_view()
        self._restyle()
        self._show_hover(None)

    def _reference(self) -> Point | None:
        return self._current or (self._points[0] if self._points else None)

    def _draw_lines(self) -> None:
        ref = self._reference()
        for line in (self.capacity_line, self.budget_line):
            line.setVisible(ref is not None)
        if ref is None:
            return
        self.capacity_line.setPos(ref.capacity_bytes / GIB)
        self.capacity_line.label.setFormat(f"capacity {gib_text(ref.capacity_bytes)}")
        target = ref.scenario.hardware.utilization_target
        self.budget_line.setPos(ref.budget_bytes / GIB)
        self.budget_line.label.setFormat(
            f"budget {target * 100:g} % · {gib_text(ref.budget_bytes)}"
        )

    def _draw_current(self) -> None:
        current = self._current
        y = self.value(current) if current is not None else math.nan
        if current is None or not math.isfinite(y):
            self.current_marker.setData(x=np.zeros(0), y=np.zeros(0))
            return
        self.current_marker.setData(x=[current.device_bytes / GIB], y=[y])
        self.current_marker.setBrush(verdict_colour(current.verdict, self._dark))

    def reset_view(self) -> None:
        """Show every fitting dot and the capacity, up to :data:`X_CAP` x the capacity."""
        ref = self._reference()
        capacity = ref.capacity_bytes / GIB if ref is not None else 0.0
        xs = self._xs[self._shown] if self._shown.any() else np.zeros(0)
        ys = self._ys[self._shown] if self._shown.any() else np.zeros(0)
        if self._current is not None and math.isfinite(self.value(self._current)):
            xs = np.append(xs, self._current.device_bytes / GIB)
            ys = np.append(ys, self.value(self._current))
        # room right of the capacity line for its label
        x_top = max(float(xs.max()) if xs.size else 0.0, 1.3 * capacity)
        if capacity:
            x_top = min(x_top, X_CAP * capacity)
        x_top = x_top * 1.06 or 1.0
        in_view = xs <= x_top
        y_top = float(ys[in_view].max()) if in_view.any() else 0.0
        self.plot_item.setXRange(0.0, x_top, padding=0.0)
        self.plot_item.setYRange(0.0, y_top * 1.12 or 1.0, padding=0.0)
        self.empty_text.setPos(x_top / 2, (y_top * 1.12 or 1.0) / 2)
        self._beyond = int((xs > x_top).sum())

    def _restyle(self) -> None:
        stale = self._stale is not None
        background, foreground, muted = palette_colours(self.palette())
        dark = self._dark
        for verdict, scatter in self.scatters.items():
            colour = QColor(muted) if stale else verdict_colour(verdict, dark)
            colour.setAlpha(120 if stale else (150 if verdict == "oom" else 215))
            if verdict == "oom":
                scatter.setPen(pg.mkPen(None))
            else:  # a thin edge in the background colour keeps crowded dots apart
                scatter.setPen(pg.mkPen(background, width=0.8))
            scatter.setBrush(pg.mkBrush(colour))
        self.front_line.setPen(pg.mkPen(muted if stale else foreground, width=2))
        self.current_marker.setPen(pg.mkPen(foreground, width=1.5))
        self.hover_marker.setPen(pg.mkPen(foreground, width=2))
        self.hover_marker.setBrush(pg.mkBrush(None))
        cap = muted if stale else capacity_colour(dark)
        self.capacity_line.setPen(pg.mkPen(cap, width=2))
        self.capacity_line.label.setColor(cap)
        self.budget_line.setPen(pg.mkPen(foreground, width=1.5, style=Qt.PenStyle.DashLine))
        self.budget_line.label.setColor(foreground)
        for line in (self.capacity_line, self.budget_line):
            line.label.fill = line_label_fill(self.palette())
            line.label.update()
        self.empty_text.setColor(muted)
        self.empty_text.setText("" if self._points else self._empty)
        self.empty_text.setVisible(not self._points)
        self.legend.setLabelTextColor(foreground)
        for _sample, label in self.legend.items:
            label.setText(label.text)  # a legend label re-renders only when its text is set

    def _default_note(self) -> str:
        parts = [self._note] if self._note else []
        if self._beyond:
            parts.append(
                f"{self._beyond:,} configurations need more than {X_CAP:g} x the capacity: "
                "scroll or drag to see them"
            )
        if self._stale:
            parts.append(self._stale)
        elif self._points:
            parts.append("Hover a dot for its configuration; click it to make it current.")
        return "\n".join(parts)

    def _show_hover(self, index: int | None) -> None:
        self._hovered = index
        if index is None:
            self.hover_marker.setData(x=np.zeros(0), y=np.zeros(0))
            self.hover_label.setText(self._default_note())
            self.plot.setToolTip("")
            return
        p = self._points[index]
        self.hover_marker.setData(x=[self._xs[index]], y=[self._ys[index]])
        text = point_text(p, self._base)
        if not self._stale:
            text += "\nClick to make this the current scenario (Ctrl+Z undoes)."
        self.hover_label.setText(text)
        self.plot.setToolTip(rich_text(text))

    # -- mouse -----------------------------------------------------------------------------

    def _view_point(self, scene_pos: QPointF) -> QPointF | None:
        return view_point(self.plot_item, scene_pos)

    @Slot(object)
    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        point = self._view_point(scene_pos)
        index = None if point is None else self.index_near(point.x(), point.y())
        if index != self._hovered:
            self._show_hover(index)

    @Slot(object)
    def _on_mouse_clicked(self, event: MouseClickEvent) -> None:
        if event.button() != Qt.MouseButton.LeftButton or event.double() or self._stale:
            return
        point = self._view_point(event.scenePos())
        index = None if point is None else self.index_near(point.x(), point.y())
        if index is not None:
            event.accept()
            self.pointActivated.emit(self._points[index])

    # -- light and dark --------------------------------------------------------------------

    def changeEvent(self, event: QEvent) -> None:
        if palette_changed(self, event):
            self.apply_palette()
        super().changeEvent(event)

    def apply_palette(self) -> None:
        background, foreground, _muted = palette_colours(self.palette())
        self._dark = is_dark_background(background)
        self.plot.setBackground(background)
        style_plot(self.plot_item, self.palette())
        self.hover_label.setStyleSheet(f"QLabel#mapHover {{ color: {foreground.name()}; }}")
        self._restyle()
        self._draw_current()
