"""The memory breakdown chart: stacked bars of the current estimate, what-if ghosts beside.

What is inside:

* :class:`Ghost` -- a what-if estimate to draw beside the current one (frozen value);
* :func:`baseline_summary`, :func:`difference_text` -- a pinned baseline's short name and
  how far the current scenario is from it;
* :class:`BreakdownChart` -- a ``QWidget`` wrapping one pyqtgraph ``PlotWidget``, with a
  verdict banner and a host-RAM badge above the plot and a "not yet modelled" note below
  it. The current estimate gets one solid bar, or one per distinct rank group (pipeline
  stage) with the worst outlined; a pinned baseline (a frozen estimate of an earlier
  scenario) a hatched, outlined bar of its own after it, labelled with the difference; each
  what-if a see-through bar. Host RAM per node, which
  offload fills, is a badge rather than a bar: it is not GPU memory and has its own scale.
  :meth:`BreakdownChart.set_estimates` is the one way to give it estimates;
  :meth:`BreakdownChart.set_stale` says the current scenario has no valid estimate (the
  bars turn grey and the banner says why, with the engine's message) and
  :meth:`BreakdownChart.clear` drops the bars (a new document). The plot's title says when
  the step peaks (:func:`peak_text`); the y axis ends at most at 3 x the capacity (or
  1.2 x the current bar), and a taller what-if is drawn cut, with its true total and an
  arrow (:func:`axis_top`); the capacity and budget labels sit in a column right of the
  last bar, never over a bar (:func:`x_range`), and they and the bar totals are laid out
  so that none overlaps another (:meth:`BreakdownChart.layout_labels`); tick labels wrap,
  never elided (:func:`tick_lines`);
* :class:`ExportContext`, :func:`scenario_caption` -- what an exported file says besides
  the plot: the scenario in one line, the verdict, the note;
* :data:`CATEGORY_COLOURS`, :data:`CATEGORY_NAMES` -- the Okabe--Ito colour and the human
  name of each breakdown category, shared with anything that draws the same categories;
* :func:`gib_text` -- bytes as the GiB (2^30 bytes) text the chart prints.

The chart knows nothing about the engine beyond the :class:`~memfit.engine.estimate.Estimate`
result object, and never modifies it. Bytes stay integers until they are drawn: bar heights
are pre-scaled to GiB here, because the axis' SI prefixes would be decimal.

>>> gib_text(3 * 2**30 // 2)
'1.5 GiB'
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyqtgraph as pg
from pyqtgraph.GraphicsScene.mouseEvents import MouseClickEvent
from PySide6.QtCore import QEvent, QPointF, QRectF, Qt, Signal, Slot
from PySide6.QtGui import (
    QBrush,
    QColor,
    QFont,
    QFontMetrics,
    QFontMetricsF,
    QPainter,
    QPalette,
    QPen,
)
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import GIB, Estimate
from memfit.engine.explain import explained
from memfit.engine.model_state import CATEGORIES, MemoryItem
from memfit.engine.specs import PARALLEL_AXES, TrainingSpec
from memfit.engine.stacks import load_stack

#: Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour
#: vision deficiencies. One colour per category, the same in every chart.
CATEGORY_COLOURS: dict[str, str] = {
    "parameters": "#0072B2",
    "gradients": "#E69F00",
    "optimizer_states": "#009E73",
    "activations": "#CC79A7",
    "overhead": "#999999",
}
CATEGORY_NAMES: dict[str, str] = {
    "parameters": "Parameters",
    "gradients": "Gradients",
    "optimizer_states": "Optimizer states",
    "activations": "Activations",
    "overhead": "Overhead",
}

#: Verdict -> (banner words, banner background, banner text colour).
VERDICTS: dict[str, tuple[str, str, str]] = {
    "fits": ("Fits under the budget", "#1B7A3A", "#FFFFFF"),
    "tight": ("Tight: over the budget line, under capacity", "#F0B400", "#000000"),
    "oom": ("Does not fit", "#B3261E", "#FFFFFF"),
}

#: Host verdict -> (badge words, border colour, background, text colour); ``None`` takes
#: the palette's text colour. The colours match the GPU verdicts.
HOST_VERDICTS: dict[str, tuple[str, str | None, str, str | None]] = {
    "fits": ("fits", "#1B7A3A", "transparent", None),
    "oom": ("does not fit", "#B3261E", "#B3261E", "#FFFFFF"),
    "unknown": ("give the host RAM per node to check it", None, "transparent", None),
}

#: The banner of a stale chart: (background, text colour); grey, no verdict colour.
STALE_BANNER = ("#5F6368", "#FFFFFF")
#: the alpha of a stale chart's grey bars (solid, ghost)
STALE_ALPHA = (120, 55)
#: the pinned baseline's bars: hatched in the category colour, outlined in it
BASELINE_PATTERN = Qt.BrushStyle.BDiagPattern
BASELINE_PEN_WIDTH = 2.0

#: a training method in a caption
METHOD_WORDS = {
    "full": "full fine-tuning",
    "lora": "LoRA",
    "qlora": "QLoRA",
    "freeze": "partly frozen",
}

Y_LABEL = "Memory per GPU (GiB, 2^30 bytes)"
#: the y axis' title where the plot is too short for :data:`Y_LABEL`
SHORT_Y_LABEL = "GiB per GPU (2^30 B)"
#: and where it is too short for that (a small window with the details open)
TINY_Y_LABEL = "GiB (2^30 B)"
BAR_HALF_WIDTH = 0.32
#: how far the worst rank group's outline stands off its bar (x units)
OUTLINE_PAD = 0.03
GHOST_ALPHA = 110
CAPACITY_COLOUR = "#D55E00"  # Okabe--Ito vermillion, unused by the categories
#: The most rank groups (pipeline stages) drawn as bars of their own.
MAX_GROUP_BARS = 12
#: The y axis ends at most at this many times the capacity: a bar ten times the capacity
#: would squash the capacity line to the floor. Taller bars (the current one too) are
#: drawn cut at the top, with their true total and an arrow.
AXIS_CAPACITIES = 3.0
#: room above the cut of a cut bar, for its total
TOP_ROOM = 1.2
CUT_MARK = "↑"
#: the gap, in pixels, kept between labels and between a label and a line
LABEL_GAP = 2.0
#: The capacity and budget labels sit in a column right of the last bar, never over a bar.
#: The column takes at most this share of the plot's width for the labels' full words
#: (``NVIDIA H100 SXM 80GB capacity 79.6 GiB``); where those need more, the labels take
#: their short words (``capacity 79.6 GiB``) and say the full ones in a tooltip.
FULL_LABEL_SHARE = 0.25
#: the most of the plot's width the column takes at all: a plot too narrow even for the
#: short words keeps its bars readable and lets the labels find room among them
MAX_LABEL_SHARE = 0.4
#: the x axis' left end: the first bar, at x = 0, keeps room for its tick label
X_START = -0.6
#: How many "not modelled" entries the short note names before "and N more".
NOTE_NAMES = 2


def rich_text(text: str) -> str:
    """Plain ``text`` as escaped rich text, for a tooltip: Qt would render a tooltip that
    looks like HTML (a file or model name ``<img src=...>``) as HTML."""
    return "<qt>" + html.escape(text).replace("\n", "<br>") + "</qt>"


def gib_text(n_bytes: int) -> str:
    """``n_bytes`` in GiB (2^30 bytes), one decimal from 1 GiB up, more below."""
    gib = n_bytes / GIB
    if gib == 0 or abs(gib) >= 1:
        return f"{gib:.1f} GiB"
    if abs(gib) >= 0.01:
        return f"{gib:.2f} GiB"
    return f"{gib:.2g} GiB"


def view_point(plot_item: pg.PlotItem, scene_pos: QPointF) -> QPointF | None:
    """``scene_pos`` in the data coordinates of ``plot_item``; ``None`` outside its view."""
    view = plot_item.getViewBox()
    if not view.sceneBoundingRect().contains(scene_pos):
        return None
    point: QPointF = view.mapSceneToView(scene_pos)
    return point


def axis_top(capacity: float, totals: Sequence[float]) -> tuple[float, float]:
    """The y axis' top and the height bars are cut at (GiB; ``inf``: none is cut).

    The axis covers the capacity and the tallest bar, with 10 % room; but it ends at
    most at :data:`AXIS_CAPACITIES` x the capacity, so the capacity and budget lines stay
    in the plot's upper part whatever the bars: a taller bar -- a what-if ten times the
    capacity, or the current scenario itself (a 70B model's full fine-tune on one card is
    1,316 GiB) -- is drawn cut below the top, with its true total and an arrow.

    >>> axis_top(80.0, [40.0, 60.0])
    (88.0, inf)
    >>> axis_top(80.0, [40.0, 800.0])
    (240.0, 200.0)
    """
    tallest = max(totals, default=0.0)
    natural = max(capacity, tallest) * 1.1 or 1.0
    if capacity <= 0:
        return natural, float("inf")
    limit = AXIS_CAPACITIES * capacity
    if natural <= limit:
        return natural, float("inf")
    return limit, limit / TOP_ROOM


def x_range(bars: int, view_width: float, column: float) -> tuple[float, float]:
    """The x axis' range that draws ``bars`` bars from x = 0 and keeps a column
    ``column`` pixels wide right of the last bar (and of the outline a worst rank group's
    bar has), in a plot ``view_width`` pixels wide; the column takes at most
    :data:`MAX_LABEL_SHARE` of the width.

    Without a column the range ends 0.6 of a slot past the last bar's centre (1.4 for a
    lone bar): the tick label under it keeps its room. A column ends the range ``g``
    past the last bar's edge, ``span`` units from the range's left end, where ``g``
    units of a range ``span + g`` wide are ``column`` pixels:
    ``g = column * span / (view_width - column)``.

    >>> x_range(6, 600.0, 0.0)
    (-0.6, 5.6)
    >>> x_range(6, 600.0, 120.0)
    (-0.6, 6.8375)
    >>> x_range(1, 800.0, 120.0)  # a lone bar's room holds the column
    (-0.6, 1.4)
    """
    natural = max(bars - 0.4, 1.4)
    if bars == 0 or view_width <= 0 or column <= 0:
        return X_START, natural
    edge = bars - 1 + BAR_HALF_WIDTH + OUTLINE_PAD  # a worst bar's outline too
    column = min(column, MAX_LABEL_SHARE * view_width)
    span = edge - X_START
    return X_START, round(max(natural, edge + column * span / (view_width - column)), 6)


def peak_text(est: Estimate) -> str:
    """When the step peaks: ``Peak: backward (layer 31)``, ``Peak: backward (loss and LM
    head)``, or ``Peak: optimizer step -- activations are freed by then`` (the reason a
    bar then has no activations)."""
    phase, layer = est.peak_phase, est.peak_layer
    if phase in ("optimizer", "before"):
        if est.breakdown.get("activations", 0) == 0:
            return "Peak: optimizer step — activations are freed by then"
        return "Peak: optimizer step"
    if layer is not None:
        return f"Peak: {phase} (layer {layer})"
    where = est.steps.peak.label if est.steps is not None else ""  # "loss and LM head"
    return f"Peak: {phase}" + (f" ({where})" if where else "")


def scenario_caption(est: Estimate) -> str:
    """The scenario in one line, for an exported chart: model, method, precision,
    micro-batch x sequence, GPUs (the world size, the GPU, nodes and the parallel mesh)
    and the training stack, e.g. ``Llama 3 8B · LoRA · bf16-mixed · micro-batch 4 x
    2,048 tokens · 1 x NVIDIA H100 SXM 80GB · Hugging Face Trainer``."""
    s = est.scenario
    t, hw = s.training, s.hardware
    p = t.parallelism
    details = [f"{hw.nodes} nodes x {hw.gpus_per_node}"] if hw.nodes > 1 else []
    mesh = [f"{a.key} {p.size(a.key)}" for a in PARALLEL_AXES if p.size(a.key) > 1]
    mesh += [f"ZeRO-{p.zero_stage}"] if p.zero_stage else []
    details += [", ".join(mesh)] if mesh else []
    gpus = f"{hw.world_size} x {hw.gpu.display_name}"
    if details:
        gpus += f" ({'; '.join(details)})"
    try:
        stack = load_stack(t.stack).label
    except EstimateError:  # an unreadable stack file still names the stack
        stack = t.stack
    framework = p.framework
    if framework != "pytorch":
        stack += f", {framework}"
    return " · ".join(
        (
            s.model.label,
            METHOD_WORDS.get(t.method, t.method),
            t.precision,
            f"micro-batch {t.micro_batch_size:,} x {t.sequence_length:,} tokens",
            *([checkpointing_words(t)] if t.activation_checkpointing != "none" else []),
            gpus,
            stack,
        )
    )


def checkpointing_words(t: TrainingSpec) -> str:
    """Activation checkpointing in a caption's words: ``full checkpointing``,
    ``checkpointing every 4th layer``, ``checkpointing the first 8 layers``."""
    mode, k = t.activation_checkpointing, t.checkpoint_every_k
    if mode == "every-k-layers":
        return "checkpointing every layer" if k == 1 else f"checkpointing every {k:,} layers"
    if mode == "first-k-layers":
        return f"checkpointing the first {k:,} layers"
    return f"{mode} checkpointing"


@dataclass(frozen=True, slots=True)
class ExportContext:
    """What an exported chart says besides the plot: the scenario (:func:`scenario_caption`),
    the banner's words and colours, and the note under the plot (``""`` when hidden)."""

    caption: str
    verdict: str
    verdict_background: str
    verdict_foreground: str
    note: str = ""


@dataclass(frozen=True, slots=True)
class _Bar:
    """One bar as drawn: its tick label and note, the items it stacks, its total."""

    label: str
    note: str
    items: tuple[MemoryItem, ...]
    device_bytes: int
    ghost: Ghost | None = None  # None: the current scenario (one of its rank groups)
    worst: bool = False
    #: the pinned baseline's bar (``ghost`` is then None)
    baseline: bool = False
    #: the tooltip's title; the label and note when empty
    title: str = ""

    def heights(self) -> list[int]:
        return [sum(i.bytes for i in self.items if i.category == cat) for cat in CATEGORIES]


def shown_groups(est: Estimate) -> list[int]:
    """The rank groups that get a bar: all of them up to :data:`MAX_GROUP_BARS`; beyond,
    the first, the worst, the last and evenly spaced ones between (a deep pipeline's
    1,024 stages would be 1,024 unreadable bars)."""
    count = len(est.rank_groups)
    if count <= MAX_GROUP_BARS:
        return list(range(count))
    worst = next(i for i, g in enumerate(est.rank_groups) if g.group == est.worst_group)
    keep = {0, worst, count - 1}
    step = (count - 1) / (MAX_GROUP_BARS - 1)
    for k in range(MAX_GROUP_BARS):
        if len(keep) >= MAX_GROUP_BARS:
            break
        keep.add(round(k * step))
    return sorted(keep)


def current_bars(est: Estimate) -> list[_Bar]:
    """One bar per distinct rank group when ranks differ (at most :data:`MAX_GROUP_BARS`,
    see :func:`shown_groups`), else one bar, ``current``."""
    if len(est.rank_groups) < 2:
        return [_Bar("current", "", est.items, est.device_bytes)]
    bars = []
    shown = shown_groups(est)
    for i in shown:
        g = est.rank_groups[i]
        # "pp stage 1, any tp rank": the stage under the bar, the whole name in its tooltip
        worst = g.group == est.worst_group
        note = "worst" if worst else ""
        title = " · ".join(filter(None, (g.group, note)))
        label = g.group.split(", ")[0]
        if len(shown) > 6:  # narrow bars: "stage 93" fits where "pp stage 93" does not
            label = label.removeprefix("pp ")
        bars.append(_Bar(label, note, g.items, g.device_bytes, worst=worst, title=title))
    return bars


def host_badge_text(est: Estimate) -> str:
    """``Host RAM per node: 119.7 GiB of 256.0 GiB — fits``; ``""`` with nothing offloaded."""
    if not est.host_node_bytes:
        return ""
    need = gib_text(est.host_node_bytes)
    words = HOST_VERDICTS[est.host_verdict][0]
    if est.host_capacity_bytes is None:
        return f"Host RAM per node: {need} for offload — {words}"
    return f"Host RAM per node: {need} of {gib_text(est.host_capacity_bytes)} — {words}"


@dataclass(frozen=True, slots=True)
class Ghost:
    """A what-if: the estimate after one change, drawn as a see-through bar.

    ``key`` names the change for whoever applies it (see
    :attr:`BreakdownChart.ghostActivated`); ``label`` and ``note`` are shown under the bar,
    e.g. ``Ghost("adamw-8bit", "8-bit optimizer", est, "−12.3 GiB · no compute cost")``.
    """

    key: str
    label: str
    estimate: Estimate
    note: str = ""
    #: the bar's tooltip title; the label and note when empty
    title: str = ""


def baseline_summary(est: Estimate) -> str:
    """A pinned scenario in a few words, for the label under its bar: the model, the
    method and the GPUs, e.g. ``Llama 3 8B, LoRA, 1 x H100 SXM 80GB`` (commas: a tick label
    wraps at spaces, and a line should not start with a separator)."""
    s = est.scenario
    gpu = s.hardware.gpu.display_name.removeprefix("NVIDIA ").removeprefix("AMD ")
    method = METHOD_WORDS.get(s.training.method, s.training.method)
    return f"{s.model.label}, {method}, {s.hardware.world_size} x {gpu}"


def difference_text(current: Estimate, baseline: Estimate) -> str:
    """How far the current scenario's device memory per GPU is from the baseline's, in
    GiB (2^30 bytes): ``current +45.2 GiB``, ``current -3.1 GiB``, ``current: the same``."""
    diff = current.device_bytes - baseline.device_bytes
    if abs(diff) < GIB // 200:  # under 0.005 GiB: prints as 0.00
        return "current: the same"
    sign = "+" if diff > 0 else "-"
    return f"current {sign}{gib_text(abs(diff))}"


def verdict_tip(est: Estimate) -> str:
    """What the banner's verdict means, with this estimate's figures."""
    return (
        f"The device total per GPU (what nvidia-smi shows), {gib_text(est.device_bytes)}, "
        f"against the budget line, {gib_text(est.budget_bytes)}, and the capacity, "
        f"{gib_text(est.capacity_bytes)}: under the budget it fits; between the two it is "
        "tight (it may run, with little room for fragmentation or a longer batch); over the "
        "capacity it does not fit. GiB = 2^30 bytes."
    )


def short_not_modelled(notes: Sequence[str]) -> str:
    """The first clause of the first entries (up to a bracket or semicolon), and how many
    more: ``DTensor returns a vocabulary-parallel embedding's gradient whole; and 1 more``.
    How each entry is counted is in the note's tooltip."""
    heads = [re.split(r" \(|; ", note, maxsplit=1)[0].strip() for note in notes]
    text = "; ".join(h for h in heads[:NOTE_NAMES] if h)
    if len(notes) > NOTE_NAMES:
        text += f"; and {len(notes) - NOTE_NAMES} more"
    return text


#: the fewest letters a broken word leaves on either side of its hyphen where it can
#: (``checkpoint-`` ``ing``, not ``checkpointin-`` ``g``)
MIN_WORD_PIECE = 3


def _split_word(word: str, width: float, metrics: QFontMetrics) -> list[str]:
    """``word`` in pieces that each fit ``width``, every piece but the last ending in a
    hyphen: a word wider than a bar is broken, never cut, and no piece is shorter than
    :data:`MIN_WORD_PIECE` letters where the word is long enough."""
    if metrics.horizontalAdvance(word) <= width or len(word) < 2:
        return [word]
    pieces: list[str] = []
    rest = word
    while rest and metrics.horizontalAdvance(rest) > width:
        cut = len(rest) - 1
        while cut > 1 and metrics.horizontalAdvance(rest[:cut] + "-") > width:
            cut -= 1
        if len(rest) - cut < MIN_WORD_PIECE and len(rest) >= 2 * MIN_WORD_PIECE:
            cut = min(cut, len(rest) - MIN_WORD_PIECE)  # a shorter head still fits
        pieces.append(rest[:cut] + "-")
        rest = rest[cut:]
    if rest:
        pieces.append(rest)
    return pieces


def wrap_text(text: str, width: float, metrics: QFontMetrics) -> list[str]:
    """``text`` word-wrapped into lines that fit ``width`` pixels; a word wider than a
    line is broken with a hyphen. Nothing is cut: every character is on some line."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        for piece in _split_word(word, width, metrics):
            candidate = f"{line} {piece}" if line else piece
            if not line or metrics.horizontalAdvance(candidate) <= width:
                line = candidate
            else:
                lines.append(line)
                line = piece
    if line:
        lines.append(line)
    return lines or [text]


def tick_lines(label: str, note: str, width: float, metrics: QFontMetrics) -> list[str]:
    """``label`` over ``note``, word-wrapped into ``width`` pixels, never cut.

    A note too wide for one line breaks at its ``·`` separators first, then each part
    wraps. A word wider than the width is broken with a hyphen, so every line fits and
    nothing is elided: what is on screen is what an exported image or SVG carries.
    """
    lines = wrap_text(label, width, metrics)
    if note:
        fits = metrics.horizontalAdvance(note) <= width
        parts = [note] if fits else [part.strip() for part in note.split("·")]
        lines += [line for part in parts for line in wrap_text(part, width, metrics)]
    return lines


def _overlap(rect: QRectF, others: Sequence[QRectF]) -> float:
    """The area ``rect`` shares with ``others``."""
    total = 0.0
    for other in others:
        common = rect.intersected(other)
        total += max(common.width(), 0.0) * max(common.height(), 0.0)
    return total


#: a line label's place: (position along the line, x anchor, y anchor, rectangle)
Spot = tuple[float, float, float, QRectF]


class _Spots:
    """A line label's spots, best first, made as they are read and kept for the next
    reading: the first one or two usually serve, of a hundred."""

    def __init__(self, made: Iterator[Spot]) -> None:
        self._made = made
        self._kept: list[Spot] = []

    def __iter__(self) -> Iterator[Spot]:
        i = 0
        while True:
            if i == len(self._kept):
                spot = next(self._made, None)
                if spot is None:
                    return
                self._kept.append(spot)
            yield self._kept[i]
            i += 1


def _choose(
    options: Sequence[Iterable[Spot]],
    line_ys: Sequence[float],
    totals: Sequence[QRectF],
    bars: Sequence[QRectF],
) -> list[Spot]:
    """One spot per line label from ``options`` (each best first): the first spots, in
    order, that overlap neither each other nor the ``totals`` (nor the ``bars``, where
    spots free of them exist) and that no other line (at scene heights ``line_ys``)
    strikes through; else the spots that overlap the totals least."""

    def free(rect: QRectF, own: int, obstacles: Sequence[QRectF]) -> bool:
        # a line through a label's margins leaves its words clear
        margin = max(LABEL_GAP, 0.3 * rect.height())
        struck = any(
            rect.top() + margin < y < rect.bottom() - margin
            for k, y in enumerate(line_ys)
            if k != own
        )
        return not struck and not any(rect.intersects(o) for o in obstacles)

    def search(obstacles: Sequence[QRectF]) -> list[Spot] | None:
        picked: list[Spot] = []

        def place(k: int) -> bool:
            if k == len(options):
                return True
            taken = [spot[3] for spot in picked]
            for spot in options[k]:
                if free(spot[3], k, [*obstacles, *taken]):
                    picked.append(spot)
                    if place(k + 1):
                        return True
                    picked.pop()
            return False

        return picked if place(0) else None

    for obstacles in ([*totals, *bars], list(totals)):
        found = search(obstacles)
        if found is not None:
            return found
    picked: list[Spot] = []
    for k, spots in enumerate(options):
        taken = [spot[3] for spot in picked]
        apart = [s for s in spots if free(s[3], k, taken)] or list(spots)
        if not apart:
            return picked  # a label with no room at all keeps its place
        picked.append(min(apart, key=lambda s: _overlap(s[3], totals)))
    return picked


def _lifted(rect: QRectF, line_ys: Sequence[float], placed: Sequence[QRectF]) -> QRectF:
    """``rect`` moved up (scene y grows downwards) until no line at ``line_ys`` strikes
    through it and it overlaps none of ``placed``."""
    rect = QRectF(rect)
    for _ in range(2 * (len(line_ys) + len(placed)) + 1):
        moved = False
        for y in line_ys:
            if rect.top() - LABEL_GAP < y < rect.bottom() + LABEL_GAP:
                rect.moveBottom(y - LABEL_GAP)
                moved = True
        for other in placed:
            if rect.intersects(other):
                rect.moveBottom(other.top() - LABEL_GAP)
                moved = True
        if not moved:
            break
    return rect


class _GridAxis(pg.AxisItem):
    """pyqtgraph's axis, its grid lines drawn opaque in the colour their translucent pen
    gives over the plot's background (:attr:`background`): the same pixels where the grid
    lies behind everything, as it does here. pyqtgraph draws the grid without
    antialiasing, and Qt's raster engine draws a translucent line so some twenty times
    slower than an opaque one (a dozen lines took a millisecond and a half of every
    repaint of the chart)."""

    background = QColor(Qt.GlobalColor.white)

    def generateDrawSpecs(self, p: QPainter) -> Any:
        specs = super().generateDrawSpecs(p)
        if specs is None:
            return None
        axis, ticks, texts = specs
        return axis, [(_over(pen, self.background), a, b) for pen, a, b in ticks], texts


def _over(pen: QPen, background: QColor) -> QPen:
    """``pen`` made opaque: its colour as it shows over ``background``."""
    alpha = pen.color().alphaF()
    if alpha >= 1.0:
        return pen
    opaque = QPen(pen)
    opaque.setColor(_mix(pen.color(), background, alpha))
    return opaque


def _mix(front: QColor, back: QColor, share: float) -> QColor:
    """An opaque colour, ``share`` of ``front`` and the rest of ``back``."""
    return QColor.fromRgbF(
        share * front.redF() + (1 - share) * back.redF(),
        share * front.greenF() + (1 - share) * back.greenF(),
        share * front.blueF() + (1 - share) * back.blueF(),
    )


def palette_colours(palette: QPalette) -> tuple[QColor, QColor, QColor]:
    """(background, text, muted) of ``palette``: the plots' colours; muted is 40 % of the
    way from the text to the background."""
    background = palette.color(QPalette.ColorRole.Base)
    foreground = palette.color(QPalette.ColorRole.Text)
    return background, foreground, _mix(foreground, background, 0.6)


class BreakdownChart(QWidget):
    """Stacked bars of per-GPU memory by category: the current estimate and its ghosts.

    Contract: :meth:`set_estimates` is the one way to give it estimates; the chart reads
    them and never modifies them. :meth:`set_stale` with a reason marks what it shows as
    out of date -- grey bars, a grey banner with the reason, no verdict -- until
    ``set_stale(None)``; :meth:`clear` drops the bars. Double-clicking a ghost bar emits
    :attr:`ghostActivated` with the ghost's key (never while stale); the chart does not
    apply anything itself.
    """

    ghostActivated = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._foreground = QColor(Qt.GlobalColor.black)
        self._muted = QColor(Qt.GlobalColor.gray)
        self._current: Estimate | None = None
        self._ghosts: tuple[Ghost, ...] = ()
        self._baseline: Estimate | None = None
        # the current scenario's bars (one per rank group), then one per ghost
        self._bars: list[_Bar] = []
        # per bar: category -> (y0, height) in GiB
        self._segments: list[dict[str, tuple[float, float]]] = []
        self._tooltip = ""
        self._x_labels: list[str] = []
        self._verdict = ""
        self._host_verdict = ""
        self._x_range = (X_START, 1.4)
        # the capacity and budget labels' words, fullest first (see FULL_LABEL_SHARE)
        self._line_words: tuple[tuple[str, ...], ...] = ((), ())
        self._stale: str | None = None
        self._coloured_stale: bool | None = None  # what the bar colours show
        self._cut = float("inf")  # bars taller than this many GiB are drawn cut
        self._top = 1.0  # the y axis' top as drawn, before labels raise it
        self._peak = ""
        self._background = QColor(Qt.GlobalColor.white)

        self.verdict_label = QLabel()
        self.verdict_label.setObjectName("verdictBanner")
        self.verdict_label.setTextFormat(Qt.TextFormat.PlainText)  # holds engine messages
        self.verdict_label.setWordWrap(True)
        self.verdict_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.verdict_label.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        font = QFont(self.verdict_label.font())
        font.setBold(True)
        font.setPointSizeF(font.pointSizeF() * 1.15)
        self.verdict_label.setFont(font)
        self.verdict_label.hide()

        self.host_label = QLabel()
        self.host_label.setObjectName("hostBadge")
        self.host_label.setTextFormat(Qt.TextFormat.PlainText)
        self.host_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.host_label.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.host_label.hide()

        self.plot = pg.PlotWidget(axisItems={"left": _GridAxis("left")})
        # drawn on screen without antialiasing (text keeps its own): bars and straight
        # lines look the same either way, and antialiasing took a quarter of the chart's
        # repaint after an edit. Exported images keep it (:meth:`antialiased`), and the
        # cut marks, the one slanted line, their own
        self.plot.setAntialiasing(False)
        self.plot_item: pg.PlotItem = self.plot.getPlotItem()
        self._build_plot()

        self.note_label = QLabel()
        self.note_label.setObjectName("notModelledNote")
        self.note_label.setTextFormat(Qt.TextFormat.PlainText)
        self.note_label.setWordWrap(True)
        self.note_label.hide()

        # one background for banner, plot and note, on screen and in exported images
        self.setBackgroundRole(QPalette.ColorRole.Base)
        self.setAutoFillBackground(True)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(4)
        layout.addWidget(self.verdict_label)
        layout.addWidget(self.host_label)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.note_label)

        scene = self.plot.scene()
        scene.sigMouseMoved.connect(self._on_mouse_moved)
        scene.sigMouseClicked.connect(self._on_mouse_clicked)
        self.apply_palette()
        self._draw()  # the empty state, until estimates come

    # -- construction -------------------------------------------------------------------

    def _build_plot(self) -> None:
        item = self.plot_item
        item.setMouseEnabled(False, False)
        item.hideButtons()
        item.setMenuEnabled(False)
        item.showGrid(x=False, y=True, alpha=0.3)
        item.setLabel("left", Y_LABEL)
        left = item.getAxis("left")
        left.enableAutoSIPrefix(False)
        left.setStyle(maxTickLevel=1)  # major and one minor level: a readable grid
        left.setZValue(-1)  # the axis draws the grid: keep it behind the bars
        bottom = item.getAxis("bottom")
        bottom.setStyle(tickLength=0)
        bottom.setTickFont(QFont(self.font()))
        item.getViewBox().sigResized.connect(self._on_view_resized)
        item.getViewBox().disableAutoRange()

        # One item per category for the current bar and one for all ghost bars: a render
        # updates their arrays in place instead of creating graphics items. Read-only
        # outside this class.
        self.bars: dict[str, pg.BarGraphItem] = {}
        self.ghost_bars: dict[str, pg.BarGraphItem] = {}
        self.baseline_bars: dict[str, pg.BarGraphItem] = {}
        empty = np.zeros(0)
        for cat in CATEGORIES:
            colour = QColor(CATEGORY_COLOURS[cat])
            bar = pg.BarGraphItem(
                x0=empty, x1=empty, y0=empty, height=empty, brush=colour, name=CATEGORY_NAMES[cat]
            )
            ghost_colour = QColor(colour)
            ghost_colour.setAlpha(GHOST_ALPHA)
            ghost = pg.BarGraphItem(x0=empty, x1=empty, y0=empty, height=empty, brush=ghost_colour)
            pinned = pg.BarGraphItem(
                x0=empty, x1=empty, y0=empty, height=empty, brush=QBrush(colour, BASELINE_PATTERN)
            )
            item.addItem(bar)
            item.addItem(ghost)
            item.addItem(pinned)
            self.bars[cat] = bar
            self.ghost_bars[cat] = ghost
            self.baseline_bars[cat] = pinned

        # the worst rank group's bar, outlined (drawn only when rank groups differ)
        self.worst_outline = pg.BarGraphItem(
            x0=empty, x1=empty, y0=empty, height=empty, brush=QBrush(Qt.BrushStyle.NoBrush)
        )
        self.worst_outline.setZValue(5)
        item.addItem(self.worst_outline)

        label_opts = {"position": 1.0, "anchors": [(1, 1), (1, 1)]}
        self.capacity_line = pg.InfiniteLine(angle=0, label="", labelOpts=label_opts)
        self.budget_line = pg.InfiniteLine(angle=0, label="", labelOpts=label_opts)
        for line in (self.capacity_line, self.budget_line):
            line.setZValue(20)
            line.label.setZValue(21)
            item.addItem(line, ignoreBounds=True)

        self._total_texts: list[pg.TextItem] = []
        # per total: its words, and whether bold (the worst rank group's); its markup shown
        self._total_words: list[tuple[str, bool]] = []
        self._total_markup: dict[int, str] = {}

        # the marks across the top of a bar cut at the axis' limit (see :func:`axis_top`)
        self.cut_marks = pg.PlotCurveItem(connect="finite", antialias=True)
        self.cut_marks.setZValue(6)
        item.addItem(self.cut_marks, ignoreBounds=True)

        # what an empty plot says (a scenario with no valid estimate yet)
        self.empty_text = pg.TextItem("", anchor=(0.5, 0.5))
        self.empty_text.setZValue(30)
        item.addItem(self.empty_text, ignoreBounds=True)
        self.empty_text.hide()

        # The legend sits in its own row under the x axis, so it never covers a bar.
        self.legend = pg.LegendItem(colCount=len(CATEGORIES), frame=False, labelTextSize="9pt")
        for cat in CATEGORIES:
            self.legend.addItem(self.bars[cat], CATEGORY_NAMES[cat])
        self.legend.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)
        self.legend.layout.setContentsMargins(0, 0, 0, 0)  # one row as tall as its words
        item.layout.addItem(self.legend, 4, 1)
        item.layout.setAlignment(self.legend, Qt.AlignmentFlag.AlignHCenter)
        # Clicking a legend entry would hide a category of the current bar only.
        for sample, _label in self.legend.items:
            sample.setAcceptedMouseButtons(Qt.MouseButton.NoButton)

    def _total_text(self, index: int) -> pg.TextItem:
        while len(self._total_texts) <= index:
            text = pg.TextItem(anchor=(0.5, 1.0))
            text.setZValue(10)
            text.setColor(self._muted if self._stale else self._foreground)
            self.plot_item.addItem(text, ignoreBounds=True)
            self._total_texts.append(text)
        return self._total_texts[index]

    def _set_total(self, index: int, words: str, bold: bool, *, one_line: bool) -> None:
        """Bar ``index``'s total on one line, or with its unit under the number."""
        body = html.escape(words)
        if not one_line:
            number, _space, unit = words.partition(" ")
            body = html.escape(number) + "<br>" + html.escape(unit)
        if bold:
            body = f"<b>{body}</b>"
        markup = f"<div style='text-align:center'>{body}</div>"
        if self._total_markup.get(index) != markup:
            self._total_markup[index] = markup
            self._total_texts[index].setHtml(markup)

    def _draw_cut_marks(self, indexes: list[int], top: float, cut: float) -> None:
        """A zigzag in the background colour across each cut bar, just under its cut."""
        xs: list[float] = []
        ys: list[float] = []
        depth = top * 0.015
        for i in indexes:
            steps = np.linspace(i - BAR_HALF_WIDTH, i + BAR_HALF_WIDTH, 9)
            xs += [*steps.tolist(), np.nan]
            ys += [cut - 3 * depth + (depth if k % 2 else 0.0) for k in range(9)] + [np.nan]
        self.cut_marks.setData(np.array(xs, dtype=np.float64), np.array(ys, dtype=np.float64))
        self.cut_marks.setPen(pg.mkPen(self._background, width=3))

    def _update_peak(self) -> None:
        """The plot's title: when the step peaks (see :func:`peak_text`)."""
        text = peak_text(self._current) if self._current is not None else ""
        if text == self._peak:
            return
        self._peak = text
        if text:
            self.plot_item.setTitle(html.escape(text), size="9pt", color=self._muted.name())
            # pyqtgraph gives the title a row 30 px tall; its one line takes less, and the
            # plot takes the rest (a short window's bars need every pixel)
            height = self.plot_item.titleLabel.item.boundingRect().height()
            self.plot_item.layout.setRowFixedHeight(0, height)
        else:
            self.plot_item.setTitle(None)

    # -- label layout ---------------------------------------------------------------------

    def _on_view_resized(self, _view: object = None) -> None:
        """A new plot size: the column for the line labels, the tick labels and the axis'
        top as drawn, then the labels laid out again."""
        self._fit_x_range()
        if self._bars:
            self.plot_item.setYRange(0.0, self._top, padding=0.0)
        self._fit_y_label()
        self.layout_labels()

    def _fit_x_range(self, force: bool = False) -> None:
        """The capacity and budget labels' words, and the x range that keeps a column
        for them right of the last bar (see :func:`x_range`); then the tick labels,
        wrapped to the bars' slots. The full words where their column takes at most
        :data:`FULL_LABEL_SHARE` of the plot's width (or fits the room a lone bar leaves),
        else each label's fullest words that fit the column of the shortest ones."""
        bars = len(self._bars)
        width = self.plot_item.getViewBox().width()
        lines = (self.capacity_line, self.budget_line)
        column = 0.0
        if bars and self._current is not None:
            pad = 3 * LABEL_GAP  # a gap from the bar, and from the plot's edge
            needs = [
                [self._label_width(line, w) + pad for w in words]
                for line, words in zip(lines, self._line_words, strict=True)
            ]
            x0, x1 = x_range(bars, width, 0.0)
            edge = bars - 1 + BAR_HALF_WIDTH + OUTLINE_PAD
            room = (x1 - edge) / (x1 - x0) * width  # right of the last bar, without a column
            full = max(need[0] for need in needs)
            if full <= max(FULL_LABEL_SHARE * width, room):
                column = full
            else:
                column = max(need[-1] for need in needs)
            for line, words, need in zip(lines, self._line_words, needs, strict=True):
                text = next(
                    (w for w, px in zip(words, need, strict=True) if px <= column), words[-1]
                )
                # a format string (pyqtgraph fills in {value}): braces in a name are text
                text = text.replace("{", "{{").replace("}", "}}")
                if line.label.format != text:
                    line.label.setFormat(text)
        new = x_range(bars, width, column)
        if new != self._x_range or force:
            self._x_range = new
            self.plot_item.setXRange(*new, padding=0.0)
            self._update_ticks()

    @staticmethod
    def _label_width(line: pg.InfiniteLine, words: str) -> float:
        """How wide ``line``'s label is with ``words``, its margins counted."""
        label = line.label.textItem
        margin = float(label.document().documentMargin())
        return QFontMetricsF(label.font()).horizontalAdvance(words) + 2 * margin

    @contextlib.contextmanager
    def antialiased(self) -> Iterator[None]:
        """The chart drawn with antialiasing while in the block (an exported image)."""
        self.plot.setAntialiasing(True)
        try:
            yield
        finally:
            self.plot.setAntialiasing(False)

    def y_label(self) -> str:
        """The y axis' title as shown."""
        return str(self.plot_item.getAxis("left").labelText)

    def _fit_y_label(self) -> None:
        """The long title where the plot's height takes it, else the short one: never cut."""
        axis = self.plot_item.getAxis("left")
        metrics = QFontMetrics(axis.label.font())
        height = self.plot_item.getViewBox().height()
        text = next(
            (t for t in (Y_LABEL, SHORT_Y_LABEL) if metrics.horizontalAdvance(t) + 8 <= height),
            TINY_Y_LABEL,
        )
        colour = self._foreground.name()
        if text != axis.labelText or axis.labelStyle.get("color") != colour:
            axis.setLabel(text, color=colour)

    def layout_labels(self, grow: int = 3) -> None:
        """Place the bar totals and the capacity and budget labels so that none overlaps
        another, no line strikes through a total, and none leaves the plot.

        A total too wide for its bar's slot puts its unit under the number; a total a
        line would strike through, or that would overlap another, moves up above it. The
        two line labels take, together, the first free places above or below their lines,
        at the right end -- the column right of the last bar, kept for them (see
        :meth:`_fit_x_range`) -- else leftwards (free of bars where that can be, else over
        a bar: a plot too narrow for the column); where no place is free, the totals they
        would cover move up instead. A total lifted out of the plot raises the axis' top
        (``grow`` times at most).
        """
        view = self.plot_item.getViewBox()
        if not self._bars or view.width() <= 0 or view.height() <= 0:
            return
        area = view.sceneBoundingRect()

        def scene(x: float, y: float) -> QPointF:
            point: QPointF = view.mapViewToScene(QPointF(x, y))
            return point

        lines = [line for line in (self.capacity_line, self.budget_line) if line.isVisible()]
        line_ys = [scene(0.0, line.value()).y() for line in lines]
        slot = scene(1.0, 0.0).x() - scene(0.0, 0.0).x()
        tops = [min(sum(h for _b, h in seg.values()), self._cut) for seg in self._segments]
        totals: list[QRectF] = []
        for i, (words, bold) in enumerate(self._total_words):
            text = self._total_texts[i]
            self._set_total(i, words, bold, one_line=True)
            if text.textItem.boundingRect().width() > slot - 2 * LABEL_GAP:
                self._set_total(i, words, bold, one_line=False)
            size = text.textItem.boundingRect()
            anchor = scene(float(i), tops[i])
            rect = QRectF(
                anchor.x() - size.width() / 2,
                anchor.y() - size.height(),
                size.width(),
                size.height(),
            )
            totals.append(_lifted(rect, line_ys, totals))

        bars = [
            QRectF(scene(i - BAR_HALF_WIDTH, top), scene(i + BAR_HALF_WIDTH, 0.0))
            for i, top in enumerate(tops)
        ]
        options = [
            _Spots(self._label_spots(line, y, area)) for line, y in zip(lines, line_ys, strict=True)
        ]
        chosen = _choose(options, line_ys, totals, bars)
        labels: list[QRectF] = []
        for line, (position, ax, ay, rect) in zip(lines, chosen, strict=False):
            line.label.anchors = [(ax, ay), (ax, ay)]
            line.label.setPosition(position)
            labels.append(rect)
        # totals a line label still covers move up, above it
        for i, rect in enumerate(totals):
            if any(rect.intersects(label) for label in labels):
                others = [r for j, r in enumerate(totals) if j != i]
                totals[i] = _lifted(rect, line_ys, [*labels, *others])
        for i, rect in enumerate(totals):
            bottom = view.mapSceneToView(QPointF(rect.center().x(), rect.bottom())).y()
            self._total_texts[i].setPos(float(i), bottom)
        overflow = area.top() - min(r.top() for r in [*totals, *labels])
        if overflow > 0 and grow:  # a lifted label would leave the plot: raise its top
            _y0, top = view.viewRange()[1]
            room = max(area.height() - overflow - 4 * LABEL_GAP, area.height() / 2)
            self.plot_item.setYRange(0.0, top * area.height() / room, padding=0.0)
            self.layout_labels(grow - 1)

    def _label_spots(self, line: pg.InfiniteLine, y: float, area: QRectF) -> Iterator[Spot]:
        """Where ``line``'s label can go, best first: ``(position along the line, x
        anchor, y anchor, rectangle)`` -- above or below the line (the capacity's above
        first, the budget's below), at the right end (in the column right of the bars),
        then leftwards to the left end; then a label's height further above or below (two
        lines a few pixels apart), each made as it is asked for."""
        size = line.label.textItem.boundingRect()
        # the y anchor: 1 above the line, 0 below; a row further out when lines are close
        row = 1.0 + LABEL_GAP / max(size.height(), 1.0)
        sides = (1.0, 0.0, 1.0 + row, -row)
        if line is not self.capacity_line:
            sides = (0.0, 1.0, -row, 1.0 + row)
        width = area.width()
        spots = [(1.0 - LABEL_GAP / max(width, 1.0), 1.0)]
        steps = 24
        for k in range(steps - 1, 0, -1):  # label centres from right to left
            spots.append((k / steps, 0.5))
        spots.append((0.01, 0.0))
        inside = area.adjusted(-1, -1, 1, 1)
        for ay in sides:
            for position, ax in spots:
                x = area.left() + position * width - ax * size.width()
                rect = QRectF(x, y - ay * size.height(), size.width(), size.height())
                if inside.contains(rect):
                    yield position, ax, ay, rect

    def label_rects(self) -> list[tuple[str, QRectF]]:
        """Each visible label in the plot (bar totals, line labels) and its rectangle in
        scene coordinates: what the layout keeps apart."""
        items: list[pg.TextItem] = [t for t in self._total_texts if t.isVisible()]
        items += [line.label for line in (self.capacity_line, self.budget_line) if line.isVisible()]
        return [(t.toPlainText(), t.sceneBoundingRect()) for t in items]

    # -- the entry point ----------------------------------------------------------------

    def set_estimates(
        self,
        current: Estimate,
        ghosts: Sequence[Ghost] = (),
        baseline: Estimate | None = None,
    ) -> None:
        """Draw ``current`` from x = 0 -- one bar, or one per rank group when the ranks
        differ -- then the pinned ``baseline``, hatched, and one see-through bar per ghost.
        A baseline of the current scenario gets no bar of its own: the current bar says
        it is the same."""
        ghosts = tuple(ghosts)
        if (
            self._current is not None
            and current == self._current
            and ghosts == self._ghosts
            and baseline == self._baseline
        ):
            return
        self._current = current
        self._ghosts = ghosts
        self._baseline = baseline
        self._draw()

    def set_stale(self, reason: str | None) -> None:
        """Mark the chart out of date because of ``reason`` (the engine's message about the
        current scenario), or current again with ``None``. A stale chart keeps its bars in
        grey, or shows none after :meth:`clear`; its banner says why and gives no verdict."""
        reason = reason or None
        if reason == self._stale:
            return
        self._stale = reason
        self._update_ticks()
        self._restyle()

    def clear(self) -> None:
        """Drop the estimates: no bars until the next :meth:`set_estimates`."""
        if self._current is None and not self._bars:
            return
        self._current = None
        self._ghosts = ()
        self._baseline = None
        self._draw()

    def is_stale(self) -> bool:
        return self._stale is not None

    def stale_reason(self) -> str:
        """Why the chart is out of date; ``""`` when it is current."""
        return self._stale or ""

    def _pinned_bars(self, solid: list[_Bar]) -> list[_Bar]:
        """The pinned baseline's bar, or none: no baseline, or one of the current
        scenario (then the first current bar's note says so)."""
        current, baseline = self._current, self._baseline
        if current is None or baseline is None:
            return []
        if baseline.scenario == current.scenario:
            first = solid[0]
            note = " · ".join(filter(None, (first.note, "same as pinned")))
            solid[0] = dataclasses.replace(first, note=note)
            return []
        caption = scenario_caption(baseline)
        difference = difference_text(current, baseline)
        title = f"Pinned baseline: {caption} · {difference}"
        label = f"Pinned: {baseline_summary(baseline)}"
        bar = _Bar(label, difference, baseline.items, baseline.device_bytes, title=title)
        return [dataclasses.replace(bar, baseline=True)]

    def _draw(self) -> None:
        current = self._current
        ghosts = self._ghosts
        solid = current_bars(current) if current is not None else []
        pinned = self._pinned_bars(solid)
        self._bars = (
            solid
            + pinned
            + [
                _Bar(
                    g.label,
                    g.note,
                    g.estimate.items,
                    g.estimate.device_bytes,
                    ghost=g,
                    title=g.title,
                )
                for g in ghosts
            ]
        )

        # cumulative stacks in GiB, categories in their fixed order from the bottom up
        heights = np.array(
            [b.heights() for b in self._bars] or np.zeros((0, len(CATEGORIES))), dtype=np.float64
        ) / float(GIB)
        bottoms = np.cumsum(heights, axis=1) - heights
        self._segments = [
            {cat: (float(bottoms[i, j]), float(heights[i, j])) for j, cat in enumerate(CATEGORIES)}
            for i in range(len(self._bars))
        ]
        xs = np.arange(len(self._bars), dtype=np.float64)
        n = len(solid)
        totals = heights.sum(axis=1)
        capacity = current.capacity_bytes / GIB if current is not None else 0.0
        top, cut = axis_top(capacity, totals)
        self._cut = cut
        # a bar taller than the cut is drawn up to it: its segments above end there
        drawn = np.clip(bottoms + heights, None, cut) - np.clip(bottoms, None, cut)
        heights_shown = np.maximum(drawn, 0.0)
        for j, cat in enumerate(CATEGORIES):
            for item, rows in (
                (self.bars[cat], slice(0, n)),
                (self.baseline_bars[cat], slice(n, n + len(pinned))),
                (self.ghost_bars[cat], slice(n + len(pinned), None)),
            ):
                x = xs[rows]
                h = heights_shown[rows, j]
                keep = h > 0  # a zero-height bar would still draw its outline
                item.setOpts(
                    x0=x[keep] - BAR_HALF_WIDTH,
                    x1=x[keep] + BAR_HALF_WIDTH,
                    y0=bottoms[rows, j][keep],
                    height=h[keep],
                )
                item.setToolTip("")
        self._tooltip = ""
        self.plot.setToolTip("")
        worst = [i for i, b in enumerate(self._bars) if b.worst]
        self.worst_outline.setOpts(
            x0=np.array([i - BAR_HALF_WIDTH - OUTLINE_PAD for i in worst], dtype=np.float64),
            x1=np.array([i + BAR_HALF_WIDTH + OUTLINE_PAD for i in worst], dtype=np.float64),
            y0=np.zeros(len(worst)),
            height=np.array([min(self._bars[i].device_bytes / GIB, cut) for i in worst]),
        )
        self._draw_cut_marks([i for i, total in enumerate(totals) if total > cut], top, cut)

        # totals above the bars, the worst rank group's in bold; a cut bar's true total
        # with an arrow at its cut
        for i, bar in enumerate(self._bars):
            text = self._total_text(i)
            over = totals[i] > cut
            words = gib_text(bar.device_bytes) + (f" {CUT_MARK}" if over else "")
            self._set_total(i, words, bar.worst, one_line=True)
            text.setPos(float(i), cut if over else bar.device_bytes / GIB)
            text.show()
        self._total_words = [
            (gib_text(b.device_bytes) + (f" {CUT_MARK}" if t > cut else ""), b.worst)
            for b, t in zip(self._bars, totals, strict=True)
        ]
        for text in self._total_texts[len(self._bars) :]:
            text.hide()

        # capacity and budget lines; axes (a lone bar keeps room on its right for the labels)
        for line in (self.capacity_line, self.budget_line):
            # first: a hidden line's label ignores a new text (pyqtgraph's InfLineLabel)
            line.setVisible(current is not None)
        if current is not None:
            hardware = current.scenario.hardware
            capacity = current.capacity_bytes / GIB
            self.capacity_line.setPos(capacity)
            self.budget_line.setPos(current.budget_bytes / GIB)
            limit, budget = gib_text(current.capacity_bytes), gib_text(current.budget_bytes)
            self._line_words = (
                (f"{hardware.gpu.display_name} capacity {limit}", f"capacity {limit}"),
                (f"budget {hardware.utilization_target * 100:g} % · {budget}", f"budget {budget}"),
            )
            pair = (self.capacity_line, self.budget_line)
            for line, forms in zip(pair, self._line_words, strict=True):
                line.label.setToolTip(rich_text(forms[0]))  # the full words, shown or not
        # an empty plot has no scale to read: no numbers on its axis, no grid
        self.plot_item.getAxis("left").setStyle(showValues=bool(self._bars))
        self.plot_item.showGrid(x=False, y=bool(self._bars), alpha=0.3)
        self.empty_text.setPos(0.4, 0.5)  # the middle of the empty x and y ranges
        self.empty_text.setVisible(not self._bars)
        self._top = top
        self.plot_item.setYRange(0.0, top, padding=0.0)
        self._fit_x_range(force=True)
        self._restyle()
        self._update_peak()
        self.layout_labels()

    def _restyle(self) -> None:
        """Banner, badge, note and colours for the estimate shown, current or stale."""
        current = self._current
        stale = self._stale is not None
        self._apply_bar_colours()
        if stale:
            if current is not None:
                words = (
                    f"Out of date: {self._stale}\n"
                    "The grey bars are the last valid estimate, not this scenario's."
                )
            else:
                words = f"No estimate: {self._stale}"
                self.empty_text.setText("Nothing to show until the scenario is valid")
            self.verdict_label.setText(words)
            self.verdict_label.setToolTip(
                rich_text("No verdict while the engine rejects the scenario: fix the field named.")
            )
            self._style_banner("stale", *STALE_BANNER)
            self.verdict_label.show()
            self.host_label.hide()
            self.note_label.hide()
            return
        if current is None:
            self.empty_text.setText("")
            self.verdict_label.hide()
            self.host_label.hide()
            self.note_label.hide()
            return
        words, background, foreground = VERDICTS[current.verdict]
        self.verdict_label.setText(
            f"{words} · {gib_text(current.device_bytes)} per GPU of "
            f"{gib_text(current.capacity_bytes)}"
        )
        self._style_banner(current.verdict, background, foreground)
        self.verdict_label.setToolTip(rich_text(verdict_tip(current)))
        self.verdict_label.show()
        self._show_host(current)
        lines = []
        groups = len(current.rank_groups)
        if groups > MAX_GROUP_BARS:
            lines.append(
                f"{MAX_GROUP_BARS} of {groups:,} pipeline stages drawn: the first, the worst, "
                "the last and evenly spaced ones between"
            )
        lines += [f"Warning: {w.split(': ')[0]}" for w in current.warnings]
        if current.not_modelled:
            lines.append(
                f"Not modelled: {short_not_modelled(current.not_modelled)} (hover for each)"
            )
        if lines:
            self.note_label.setText("\n".join(lines))
            tip = [f"• {w}" for w in current.warnings]
            if current.not_modelled:
                tip += ["Left out of the estimate, or counted approximately:"]
                tip += [f"• {note}" for note in current.not_modelled]
            self.note_label.setToolTip(rich_text("\n".join(tip)) if tip else "")
            self.note_label.show()
        else:
            self.note_label.hide()

    def _style_banner(self, key: str, background: str, foreground: str) -> None:
        if key != self._verdict:  # restyling re-polishes: only on a change
            self._verdict = key
            self.verdict_label.setStyleSheet(
                f"QLabel#verdictBanner {{ background: {background}; color: {foreground};"
                " padding: 6px; border-radius: 4px; }"
            )

    def _apply_bar_colours(self, force: bool = False) -> None:
        """Category colours, or one grey for everything while stale."""
        stale = self._stale is not None
        if stale == self._coloured_stale and not force:
            return
        self._coloured_stale = stale
        solid_alpha, ghost_alpha = STALE_ALPHA
        for cat in CATEGORIES:
            colour = QColor(self._muted if stale else CATEGORY_COLOURS[cat])
            if stale:
                colour.setAlpha(solid_alpha)
            ghost = QColor(colour)
            ghost.setAlpha(ghost_alpha if stale else GHOST_ALPHA)
            self.bars[cat].setOpts(brush=colour)
            self.ghost_bars[cat].setOpts(brush=ghost)
            self.baseline_bars[cat].setOpts(
                brush=QBrush(colour, BASELINE_PATTERN),
                pen=pg.mkPen(colour, width=BASELINE_PEN_WIDTH),
            )
        text = self._muted if stale else self._foreground
        for item in self._total_texts:
            item.setColor(text)
        capacity = self._muted if stale else QColor(CAPACITY_COLOUR)
        self.capacity_line.setPen(pg.mkPen(capacity, width=2))
        self.capacity_line.label.setColor(capacity)
        self.budget_line.setPen(pg.mkPen(text, width=1.5, style=Qt.PenStyle.DashLine))
        self.budget_line.label.setColor(text)
        self.worst_outline.setOpts(pen=pg.mkPen(text, width=3))
        for line in (self.capacity_line, self.budget_line):
            line.label.update()
        self.empty_text.setColor(self._muted)

    def _show_host(self, current: Estimate) -> None:
        """The host-RAM badge: shown when offload keeps anything in host memory."""
        text = host_badge_text(current)
        self.host_label.setText(text)
        self.host_label.setVisible(bool(text))
        if not text:
            return
        per_gpu = current.host_node_bytes // current.scenario.hardware.gpus_per_node
        lines = [
            f"<b>{html.escape(text)}</b>",
            f"{current.scenario.hardware.gpus_per_node} GPUs per node × {gib_text(per_gpu)};"
            " one GPU of the worst group keeps:",
        ]
        lines += [f"{html.escape(i.name)}: {gib_text(i.bytes)}" for i in current.host_items]
        self.host_label.setToolTip("<br>".join(lines))
        if current.host_verdict != self._host_verdict:  # restyle only on a change
            self._host_verdict = current.host_verdict
            self._style_host()

    def _style_host(self) -> None:
        if not self._host_verdict:
            return
        _words, border, background, text = HOST_VERDICTS[self._host_verdict]
        foreground = self._foreground.name()
        weight = "bold" if self._host_verdict == "oom" else "normal"
        line = "solid" if border else "dashed"
        self.host_label.setStyleSheet(
            f"QLabel#hostBadge {{ border: 2px {line} {border or self._muted.name()};"
            f" background: {background}; color: {text or foreground}; font-weight: {weight};"
            " padding: 3px; border-radius: 4px; }"
        )

    def _update_ticks(self) -> None:
        """Tick labels under the bars, wrapped (never cut) to the width of one bar's slot."""
        axis = self.plot_item.getAxis("bottom")
        metrics = QFontMetrics(axis.style["tickFont"])
        view_width = self.plot_item.getViewBox().width()
        x0, x1 = self._x_range
        slot = view_width / (x1 - x0) * 0.9 if view_width > 0 else float("inf")
        # a stale chart names its bar for what it is and gives no ghost verdict
        labels = [
            tick_lines(
                "last valid" if self._stale and b.label == "current" else b.label,
                "" if self._stale and (b.ghost is not None or b.baseline) else b.note,
                slot,
                metrics,
            )
            for b in self._bars
        ]
        self._x_labels = ["\n".join(lines) for lines in labels]
        axis.setTicks([list(enumerate(self._x_labels))])
        height = max([2, *(len(lines) for lines in labels)]) * metrics.lineSpacing() + 10
        if axis.height() != height:
            axis.setHeight(height)

    # -- queries used by hover, double-click and tests ----------------------------------

    def export_context(self) -> ExportContext:
        """The caption, verdict and note an exported image or SVG carries (see
        :mod:`memfit.gui.chart_export`); all ``""`` for an empty chart."""
        current = self._current
        caption = scenario_caption(current) if current is not None else ""
        verdict = self.verdict_text() if not self.verdict_label.isHidden() else ""
        if self._stale is not None or current is None:
            background, foreground = STALE_BANNER
        else:
            _words, background, foreground = VERDICTS[current.verdict]
        note = self.note_label.text() if not self.note_label.isHidden() else ""
        return ExportContext(caption, verdict, background, foreground, note)

    def peak_caption(self) -> str:
        """When the step peaks, as the plot's title says; ``""`` for an empty chart."""
        return self._peak

    def verdict_text(self) -> str:
        """The banner's words, e.g. ``Fits under the budget · 45.1 GiB per GPU of …``."""
        return self.verdict_label.text()

    def x_labels(self) -> list[str]:
        """The tick labels shown under the bars: ``current`` (or each rank group), then
        each ghost's label over its note (wrapped to the bar's width, never cut)."""
        return list(self._x_labels)

    def current_bar_count(self) -> int:
        """How many bars the current estimate takes: 1, or one per rank group."""
        return sum(b.ghost is None and not b.baseline for b in self._bars)

    def baseline_bar(self) -> int | None:
        """The index of the pinned baseline's bar; ``None`` when none is drawn."""
        return next((i for i, b in enumerate(self._bars) if b.baseline), None)

    def baseline_text(self) -> str:
        """What the chart shows of the pinned baseline: its bar's label and the
        difference, ``same as the current scenario``, or ``""`` when none is pinned."""
        current, baseline = self._current, self._baseline
        if current is None or baseline is None:
            return ""
        index = self.baseline_bar()
        if index is None:
            return "same as the current scenario"
        bar = self._bars[index]
        return f"{bar.label} · {bar.note}"

    def worst_bar(self) -> int | None:
        """The index of the outlined worst rank group's bar; ``None`` when ranks agree."""
        return next((i for i, b in enumerate(self._bars) if b.worst), None)

    def host_text(self) -> str:
        """The host-RAM badge's words, ``""`` when it is hidden."""
        return self.host_label.text() if not self.host_label.isHidden() else ""

    def segments(self, bar_index: int) -> dict[str, tuple[float, float]]:
        """Category -> ``(bottom, height)`` in GiB of bar ``bar_index`` (0 = the first
        bar of the current estimate)."""
        return dict(self._segments[bar_index])

    def bar_at(self, x: float) -> int | None:
        """The bar under view x-coordinate ``x``, or ``None`` between bars."""
        index = round(x)
        if 0 <= index < len(self._segments) and abs(x - index) <= BAR_HALF_WIDTH:
            return index
        return None

    def category_at(self, bar_index: int, y_gib: float) -> str | None:
        """The category whose segment of bar ``bar_index`` holds height ``y_gib``."""
        if not 0 <= bar_index < len(self._segments):
            return None
        for cat, (bottom, height) in self._segments[bar_index].items():
            if height > 0 and bottom <= y_gib < bottom + height:
                return cat
        return None

    def tooltip_at(self, bar_index: int, y_gib: float) -> str:
        """Rich text listing the items of the segment under ``(bar_index, y_gib)``, or ``""``."""
        cat = self.category_at(bar_index, y_gib)
        if cat is None:
            return ""
        bar = self._bars[bar_index]
        title = bar.title or " · ".join(filter(None, (bar.label, bar.note)))
        items = [i for i in bar.items if i.category == cat]
        total = sum(i.bytes for i in items)
        lines = [
            f"<b>{html.escape(CATEGORY_NAMES[cat])}</b> ({html.escape(title)}): {gib_text(total)}"
        ]
        for i in items:
            formula = f" = {html.escape(i.formula)}" if i.formula else ""
            lines.append(f"{html.escape(i.name)}: {gib_text(i.bytes)}{formula}")
        est = self._estimate_of(bar)
        if cat == "activations" and est is not None:
            lines.append(self._sources_tip(est))
        return "<br>".join(lines)

    def _estimate_of(self, bar: _Bar) -> Estimate | None:
        """The estimate a bar of one rank group shows (a ghost's, the current one's)."""
        if bar.ghost is not None:
            return bar.ghost.estimate
        current = self._current
        if bar.baseline or current is None or len(current.rank_groups) > 1:
            return None
        return current

    def _sources_tip(self, est: Estimate) -> str:
        """The activations by source in a line (the step keeps its sources once played)."""
        groups = explained(est, remedies=False)
        parts = [f"{html.escape(g.title.lower())} {gib_text(g.bytes)}" for g in groups[:4]]
        return "<i>By source: " + " · ".join(parts) + "</i> (Ctrl+3: what removes each)"

    def ghost_key(self, bar_index: int) -> str | None:
        """The key of the ghost drawn as bar ``bar_index``; ``None`` for the current bar."""
        if 0 <= bar_index < len(self._bars):
            ghost = self._bars[bar_index].ghost
            return ghost.key if ghost is not None else None
        return None

    # -- mouse ----------------------------------------------------------------------------

    def _view_point(self, scene_pos: QPointF) -> QPointF | None:
        return view_point(self.plot_item, scene_pos)

    @Slot(object)
    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        point = self._view_point(scene_pos)
        index = None if point is None else self.bar_at(point.x())
        tip = "" if index is None or point is None else self.tooltip_at(index, point.y())
        if tip == self._tooltip:
            return
        self._tooltip = tip
        self.plot.setToolTip(tip)
        # The graphics view hands tooltip events to the scene, which shows the tooltip of
        # the item under the cursor: put the text on the hovered segment's item.
        for bars in (self.bars, self.ghost_bars, self.baseline_bars):
            for item in bars.values():
                item.setToolTip("")
        if tip and index is not None and point is not None:
            cat = self.category_at(index, point.y())
            if cat is not None:
                bar = self._bars[index]
                items = self.bars if bar.ghost is None else self.ghost_bars
                (self.baseline_bars if bar.baseline else items)[cat].setToolTip(tip)

    @Slot(object)
    def _on_mouse_clicked(self, event: MouseClickEvent) -> None:
        if not event.double() or event.button() != Qt.MouseButton.LeftButton or self._stale:
            return
        point = self._view_point(event.scenePos())
        index = None if point is None else self.bar_at(point.x())
        key = None if index is None else self.ghost_key(index)
        if key is not None:
            event.accept()
            self.ghostActivated.emit(key)

    # -- light and dark -------------------------------------------------------------------

    def changeEvent(self, event: QEvent) -> None:
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self.apply_palette()
        super().changeEvent(event)

    def apply_palette(self) -> None:
        """Take background, text and muted colours from the widget's (application) palette."""
        background, foreground, muted = palette_colours(self.palette())
        self._foreground = foreground
        self._muted = muted
        self._background = QColor(background)
        self.plot_item.getAxis("left").background = QColor(background)  # its grid's
        self.cut_marks.setPen(pg.mkPen(background, width=3))
        if self._peak:  # the title's colour is set with its text
            self._peak = ""
            self._update_peak()
        self.plot.setBackground(background)
        for name in ("left", "bottom"):
            axis = self.plot_item.getAxis(name)
            axis.setPen(pg.mkPen(foreground))
            axis.setTextPen(pg.mkPen(foreground))
        self._fit_y_label()
        self.legend.setLabelTextColor(foreground)
        for _sample, label in self.legend.items:
            label.setText(label.text)  # a legend label re-renders only when its text is set
        separator = pg.mkPen(background, width=1)
        dashed = pg.mkPen(foreground, width=1.2, style=Qt.PenStyle.DashLine)
        for cat in CATEGORIES:
            self.bars[cat].setOpts(pen=separator)
            self.ghost_bars[cat].setOpts(pen=dashed)

        label_fill = QColor(background)
        label_fill.setAlpha(200)
        for line in (self.capacity_line, self.budget_line):
            line.label.fill = pg.mkBrush(label_fill)
        self._apply_bar_colours(force=True)  # lines, totals and bars, current or stale

        self.note_label.setStyleSheet(f"QLabel#notModelledNote {{ color: {muted.name()}; }}")
        self._style_host()
