"""The biggest block explained, and the step over time.

* :class:`ActivationsView` -- the activations at the peak told apart by source
  (:func:`memfit.engine.explain.explained`): one row per kind (saved tensors, logits and loss,
  checkpointed inputs, ...) with its share of the activations and the change that removes
  it, estimated; under each, its sources with their formulas (the tooltip names where each
  formula comes from);
* :class:`StepTimelineView` -- the memory of every moment of the step the engine plays
  (:attr:`memfit.engine.estimate.Estimate.timeline`), stacked by category, the forward, backward
  and optimizer step shaded, the peak marked, and the room the tensors have under the
  device capacity once the context and the allocator's slack are counted.

Both follow the store (:class:`memfit.gui.store.ScenarioStore`) and work only while shown: a
hidden view is brought up to date when it is shown again.
"""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QPointF, Qt, Slot
from PySide6.QtGui import QBrush, QColor, QFont, QShowEvent
from PySide6.QtWidgets import (
    QHeaderView,
    QLabel,
    QSizePolicy,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from memfit.engine.estimate import GIB, Estimate
from memfit.engine.explain import SourceGroup, explained
from memfit.engine.timeline import Point
from memfit.gui.chart import CATEGORY_COLOURS, CATEGORY_NAMES, gib_text, rich_text
from memfit.gui.plot_style import (
    capacity_colour,
    is_dark_background,
    line_label_fill,
    palette_changed,
    palette_colours,
    style_plot,
)
from memfit.gui.store import ScenarioStore

__all__ = ["ActivationsView", "StepTimelineView", "moment_text", "remedy_text"]

#: the categories a moment of the step holds, bottom to top (overhead is not a tensor)
STACK = ("parameters", "gradients", "optimizer_states", "activations")
#: the phases, as the timeline's x axis names them
PHASE_WORDS = {
    "before": "before",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer step",
}
OUT_OF_DATE = "Out of date: the current scenario has no valid estimate"


def remedy_text(group: SourceGroup) -> str:
    """What removes ``group``, estimated, in words: ``a chunked loss saves 42.4 GiB``."""
    r = group.remedy
    if r is None:
        return ""
    if r.saved_bytes > 0:
        return f"saves {gib_text(r.saved_bytes)} per GPU: {r.label} ({r.compute_note})"
    return f"saves nothing here: {r.label} ({r.compute_note})"


def moment_text(point: Point) -> str:
    """``backward, layer 3 (recompute)`` or ``backward (loss and LM head)``."""
    where = PHASE_WORDS[point.phase]
    if point.layer is not None:
        where += f", layer {point.layer}"
    return f"{where} ({point.label})"


class _Lazy(QWidget):
    """A view that follows the store only while it is shown."""

    def __init__(self, store: ScenarioStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self._shown_for: object = None  # the estimate (or error) the view shows
        store.estimateChanged.connect(self.refresh)
        store.errorChanged.connect(self.refresh)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.refresh()

    @Slot()
    def refresh(self, *_: object) -> None:
        if not self.isVisible():
            return
        est = self.store.estimate
        key = est if est is not None else self.store.error
        if key is self._shown_for:
            return
        self._shown_for = key
        self.show_estimate(est)

    def show_estimate(self, est: Estimate | None) -> None:
        raise NotImplementedError


class ActivationsView(_Lazy):
    """The activations at the peak by source, with what removes each kind."""

    COLUMNS = ("Source", "GiB", "Share", "Formula")

    def __init__(self, store: ScenarioStore, parent: QWidget | None = None) -> None:
        super().__init__(store, parent)
        self.heading = QLabel()
        self.heading.setTextFormat(Qt.TextFormat.PlainText)
        self.heading.setWordWrap(True)
        self.tree = QTreeWidget()
        self.tree.setColumnCount(len(self.COLUMNS))
        self.tree.setHeaderLabels(list(self.COLUMNS))
        self.tree.setUniformRowHeights(True)
        self.tree.setAlternatingRowColors(True)
        header = self.tree.header()
        header.setStretchLastSection(True)
        for col in (1, 2):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(2)
        layout.addWidget(self.heading)
        layout.addWidget(self.tree, 1)
        self.groups: tuple[SourceGroup, ...] = ()

    def show_estimate(self, est: Estimate | None) -> None:
        self.tree.clear()
        if est is None:
            self.groups = ()
            self.heading.setText(OUT_OF_DATE)
            self.tree.setEnabled(False)
            return
        self.tree.setEnabled(True)
        self.groups = explained(est)
        total = est.breakdown["activations"]
        where = moment_text(est.steps.peak) if est.steps is not None else est.peak_phase
        if not total:
            self.heading.setText(
                f"No activations at the peak ({where}): they are freed by the optimizer step."
            )
            return
        heading = f"Activations at the peak ({where}): {gib_text(total)} per GPU, by source."
        top_group = self.groups[0] if self.groups else None
        if top_group is not None and top_group.remedy and top_group.remedy.saved_bytes > 0:
            heading += (
                f" The largest, {top_group.title.lower()} ({top_group.bytes / total:.0%}): "
                f"{top_group.remedy.label} saves {gib_text(top_group.remedy.saved_bytes)} per GPU."
            )
        self.heading.setText(heading + " Each saving is an estimate of the changed scenario.")
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        bold = QFont(self.tree.font())
        bold.setBold(True)
        for group in self.groups:
            top = QTreeWidgetItem(
                [group.title, f"{group.bytes / GIB:,.2f}", f"{group.bytes / total:.0%}", ""]
            )
            for col in range(len(self.COLUMNS)):
                top.setFont(col, bold)
            for col in (1, 2):
                top.setTextAlignment(col, right)
            for source in group.sources:
                child = QTreeWidgetItem(
                    [
                        source.name,
                        f"{source.bytes / GIB:,.2f}",
                        f"{source.bytes / total:.0%}",
                        source.formula,
                    ]
                )
                for col in (1, 2):
                    child.setTextAlignment(col, right)
                tip = rich_text(f"{source.name}\n{source.formula}\nFrom: {source.source}")
                for col in range(len(self.COLUMNS)):
                    child.setToolTip(col, tip)
                top.addChild(child)
            self.tree.addTopLevelItem(top)
            if group.remedy is not None:  # what removes the group: a row of its own
                fix = QTreeWidgetItem(["→ " + remedy_text(group)])
                top.insertChild(0, fix)
                fix.setFirstColumnSpanned(True)
                fix.setToolTip(0, rich_text(remedy_text(group)))
                italic = QFont(self.tree.font())
                italic.setItalic(True)
                fix.setFont(0, italic)
        self.tree.expandAll()
        self.tree.resizeColumnToContents(0)
        self.tree.setColumnWidth(0, min(self.tree.columnWidth(0), 420))


class StepTimelineView(_Lazy):
    """The memory of every moment of one step, stacked by category, the peak marked."""

    def __init__(self, store: ScenarioStore, parent: QWidget | None = None) -> None:
        super().__init__(store, parent)
        self._built = False
        self._est: Estimate | None = None
        self.points: tuple[Point, ...] = ()
        self.plot = pg.PlotWidget()
        self.plot.setMenuEnabled(False)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        self.item = self.plot.getPlotItem()
        self.item.setLabel("left", "GiB")
        self.item.setLabel("bottom", "moments of one training step")
        self.item.showGrid(x=False, y=True, alpha=0.25)
        self.note = QLabel()
        self.note.setObjectName("stepNote")
        self.note.setTextFormat(Qt.TextFormat.PlainText)
        self.note.setWordWrap(True)
        self.note.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(2)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.note)
        self.plot.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self._built = True

    def show_estimate(self, est: Estimate | None) -> None:
        self._est = est
        self.points = est.timeline if est is not None else ()
        self._draw()

    # -- drawing ---------------------------------------------------------------------------

    def _draw(self) -> None:
        self.item.clear()
        background, foreground, muted = palette_colours(self.palette())
        self.plot.setBackground(background)
        style_plot(self.item, self.palette())
        self.note.setStyleSheet(f"QLabel#stepNote {{ color: {foreground.name()}; }}")
        est, points = self._est, self.points
        if est is None or not points:
            self.note.setText(OUT_OF_DATE if est is None else "")
            return
        x = np.arange(len(points), dtype=float)
        lower = np.zeros(len(points))
        lower_curve = pg.PlotCurveItem(x, lower, pen=pg.mkPen(QColor(0, 0, 0, 0)))
        for cat in STACK:
            upper = lower + np.array([getattr(p, cat) for p in points], dtype=float) / GIB
            colour = QColor(CATEGORY_COLOURS[cat])
            curve = pg.PlotCurveItem(x, upper, pen=pg.mkPen(colour.darker(115), width=1))
            fill = QColor(colour)
            fill.setAlpha(200)
            area = pg.FillBetweenItem(lower_curve, curve, brush=pg.mkBrush(fill))
            self.item.addItem(area)
            self.item.addItem(curve)
            lower, lower_curve = upper, curve
        peak = est.steps.peak_index if est.steps is not None else int(lower.argmax())
        peak_gib = points[peak].total / GIB
        where = moment_text(points[peak])
        marker = pg.InfiniteLine(
            pos=peak,
            angle=90,
            pen=pg.mkPen(foreground, width=1.5, style=Qt.PenStyle.DashLine),
            label=f"Peak: {where} · {peak_gib:,.2f} GiB",
            labelOpts={
                "position": 0.75,
                "color": foreground,
                "fill": line_label_fill(self.palette()),
                "anchors": [(0, 0.5), (1, 0.5)] if peak < len(points) / 2 else [(1, 0.5), (0, 0.5)],
            },
        )
        self.item.addItem(marker)
        # the tensors' room: the capacity less what the device holds beyond the tensors
        # at the peak (the CUDA context, workspaces and the allocator's slack)
        beyond = est.device_bytes - points[peak].total
        room = (est.capacity_bytes - beyond) / GIB
        top = max(float(lower.max()), room)
        if room <= 3 * float(lower.max()):
            colour = capacity_colour(is_dark_background(background))
            line = pg.InfiniteLine(
                pos=room,
                angle=0,
                pen=pg.mkPen(colour, width=2),
                label=f"room for tensors: {room:,.1f} GiB",
                labelOpts={
                    "position": 0.02,
                    "color": colour,
                    "fill": line_label_fill(self.palette()),
                    "anchors": [(0, 0), (0, 0)],
                },
            )
            self.item.addItem(line)
        else:
            top = float(lower.max())
        self._shade_phases(points, muted)
        self.item.setXRange(0, len(points) - 1, padding=0.01)
        self.item.setYRange(0, top * 1.12 if top > 0 else 1, padding=0)
        self.note.setText(
            f"The tensors live at each of the step's {len(points)} moments (allocated), in "
            "GiB (2^30 bytes), coloured as the chart's categories; hover for a moment's "
            f"breakdown. The device holds {gib_text(beyond)} more at the peak (the CUDA "
            "context, workspaces, the allocator's slack): the red line is the capacity "
            "less that."
        )

    def _shade_phases(self, points: tuple[Point, ...], muted: QColor) -> None:
        """Backward shaded; the phases and their moments named under the x axis."""
        spans: list[tuple[str, int, int]] = []
        for i, p in enumerate(points):
            if spans and spans[-1][0] == p.phase:
                spans[-1] = (p.phase, spans[-1][1], i)
            else:
                spans.append((p.phase, i, i))
        shade = QColor(muted)
        shade.setAlpha(40)
        for phase, start, end in spans:
            if phase == "backward":
                region = pg.LinearRegionItem(
                    (start - 0.5, end + 0.5), movable=False, brush=QBrush(shade)
                )
                region.setZValue(-10)
                for line in region.lines:
                    line.setPen(pg.mkPen(None))
                self.item.addItem(region)
        named = [
            f"{phase} {start}"
            + (f"–{end}" if end > start else "")
            + (" (shaded)" if phase == "backward" else "")
            for phase, start, end in spans
            if phase != "before"
        ]
        label = "moments: " + " · ".join(named)
        self.item.setLabel("bottom", label, color=palette_colours(self.palette())[1].name())

    # -- hover -----------------------------------------------------------------------------

    def text_at(self, index: int) -> str:
        """The moment ``index`` of the step in words, by category."""
        if not 0 <= index < len(self.points):
            return ""
        p = self.points[index]
        lines = [f"{moment_text(p)} · {gib_text(p.total)}"]
        lines += [f"{CATEGORY_NAMES[cat]}: {gib_text(getattr(p, cat))}" for cat in STACK]
        return "\n".join(lines)

    @Slot(object)
    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        view = self.item.getViewBox()
        tip = ""
        if self.points and view.sceneBoundingRect().contains(scene_pos):
            tip = self.text_at(round(view.mapSceneToView(scene_pos).x()))
        self.plot.setToolTip(f"<pre>{html.escape(tip)}</pre>" if tip else "")

    # -- light and dark --------------------------------------------------------------------

    def changeEvent(self, event: QEvent) -> None:
        if palette_changed(self, event):
            self._draw()
        super().changeEvent(event)
