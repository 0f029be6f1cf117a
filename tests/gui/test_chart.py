"""The breakdown chart: bars, lines, verdict, tooltips, ghosts, palettes and export."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtCore import QPoint, QPointF, QSize, Qt
from PySide6.QtGui import QColor, QFontMetrics, QImage, QPalette
from PySide6.QtWidgets import QApplication, QLabel
from pytestqt.qtbot import QtBot

from memfit.engine.estimate import Estimate, estimate
from memfit.engine.model_state import CATEGORIES
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, OffloadSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.gui import chart_export
from memfit.gui.chart import (
    CATEGORY_COLOURS,
    GIB,
    BreakdownChart,
    Ghost,
    gib_text,
    short_not_modelled,
    shown_groups,
    tick_lines,
)
from memfit.gui.chart_export import chart_image, export_png, export_svg

SIZE = QSize(900, 560)


@cache
def est(model: str, gpu: str, **training: str) -> Estimate:
    return estimate(
        Scenario(load_model(model), HardwareSpec(load_gpu(gpu)), TrainingSpec(**training))
    )


def fits() -> Estimate:
    return est("gpt2", "l4")


def tight() -> Estimate:
    return est("llama-3-8b", "h100-sxm-80gb", optimizer="adamw-8bit")


def oom() -> Estimate:
    return est("llama-3-70b", "l4")


def ghosts() -> list[Ghost]:
    base = est("llama-3-8b", "h100-sxm-80gb")
    out = []
    for key, label, training in (
        ("adamw-8bit", "8-bit optimizer", {"optimizer": "adamw-8bit"}),
        ("lora", "LoRA r=16", {"method": "lora"}),
        ("qlora", "QLoRA 4-bit", {"method": "qlora"}),
    ):
        e = est("llama-3-8b", "h100-sxm-80gb", **training)
        saved = (base.device_bytes - e.device_bytes) / GIB
        out.append(Ghost(key, label, e, f"−{saved:.1f} GiB · no compute cost"))
    return out


@pytest.fixture
def chart(qtbot: QtBot) -> BreakdownChart:
    widget = BreakdownChart()
    qtbot.addWidget(widget)
    widget.resize(SIZE)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def stacks(item: pg.BarGraphItem) -> list[tuple[float, float, float]]:
    """(x centre, bottom, height) of each rectangle an item draws."""
    o = item.opts
    x = (np.asarray(o["x0"]) + np.asarray(o["x1"])) / 2
    return list(
        zip(x.tolist(), np.asarray(o["y0"]).tolist(), np.asarray(o["height"]).tolist(), strict=True)
    )


def to_widget(chart: BreakdownChart, x: float, y: float) -> QPoint:
    """A point in view (data) coordinates as a pixel of the plot's viewport."""
    scene = chart.plot_item.getViewBox().mapViewToScene(QPointF(x, y))
    return chart.plot.mapFromScene(scene)


def test_bar_heights_are_breakdown_bytes_in_gib(chart: BreakdownChart) -> None:
    e = est("llama-3-8b", "h100-sxm-80gb")
    chart.set_estimates(e)
    bottom = 0.0
    for cat in CATEGORIES:
        drawn = stacks(chart.bars[cat])
        n_bytes = e.breakdown[cat]
        if n_bytes == 0:
            assert drawn == []  # no zero-height outline left on top of the stack
            continue
        assert drawn == [(0.0, pytest.approx(bottom), pytest.approx(n_bytes / 2**30))]
        bottom += n_bytes / 2**30
    assert bottom == pytest.approx(e.device_bytes / 2**30)
    assert all(stacks(g) == [] for g in chart.ghost_bars.values())
    assert chart.segments(0)["gradients"][1] == pytest.approx(e.breakdown["gradients"] / GIB)


def test_category_colours_are_okabe_ito(chart: BreakdownChart) -> None:
    chart.set_estimates(fits(), ghosts())
    for cat in CATEGORIES:
        solid = chart.bars[cat].opts["brush"]
        see_through = chart.ghost_bars[cat].opts["brush"]
        assert QColor(solid).name() == CATEGORY_COLOURS[cat].lower()
        assert QColor(see_through).name() == CATEGORY_COLOURS[cat].lower()
        assert QColor(see_through).alpha() < 255
    assert chart.ghost_bars["parameters"].opts["pen"].style() == Qt.PenStyle.DashLine
    names = [label.text for _sample, label in chart.legend.items]
    assert names == ["Parameters", "Gradients", "Optimizer states", "Activations", "Overhead"]


def test_capacity_and_budget_lines(chart: BreakdownChart) -> None:
    e = est("llama-3-8b", "h100-sxm-80gb")
    chart.set_estimates(e)
    assert chart.capacity_line.value() == pytest.approx(e.capacity_bytes / GIB)
    assert chart.budget_line.value() == pytest.approx(e.budget_bytes / GIB)
    assert chart.capacity_line.label.toPlainText() == ("NVIDIA H100 SXM 80GB capacity 79.6 GiB")
    assert chart.budget_line.label.toPlainText() == "budget 85 % · 67.7 GiB"
    assert chart.budget_line.pen.style() == Qt.PenStyle.DashLine


@pytest.mark.parametrize(
    ("make", "verdict", "words"),
    [
        (fits, "fits", "Fits under the budget"),
        (tight, "tight", "Tight: over the budget line, under capacity"),
        (oom, "oom", "Does not fit"),
    ],
)
def test_verdict_banner(chart: BreakdownChart, make: object, verdict: str, words: str) -> None:
    e = make()  # type: ignore[operator]
    assert e.verdict == verdict
    chart.set_estimates(e)
    assert chart.verdict_text().startswith(words)
    assert gib_text(e.device_bytes) in chart.verdict_text()
    assert chart.verdict_label.isVisible()


def test_y_range_covers_capacity_and_tallest_bar(chart: BreakdownChart) -> None:
    e = oom()
    chart.set_estimates(e)
    (_x0, _x1), (y0, y1) = chart.plot_item.getViewBox().viewRange()
    assert y0 == pytest.approx(0.0)
    # a bar over the capacity, up to 3 x it, is covered whole; a taller one is cut there
    expected = min(e.device_bytes / GIB * 1.1, 3 * e.capacity_bytes / GIB)
    assert y1 == pytest.approx(expected)
    chart.set_estimates(fits())
    _xr, (_y0, y1) = chart.plot_item.getViewBox().viewRange()
    assert y1 == pytest.approx(fits().capacity_bytes / GIB * 1.1)
    left = chart.plot_item.getAxis("left")
    assert "GiB, 2^30 bytes" in left.labelText
    assert not left.autoSIPrefix
    assert chart.plot_item.getViewBox().state["mouseEnabled"] == [False, False]


def test_totals_printed_above_bars(chart: BreakdownChart) -> None:
    base = est("llama-3-8b", "h100-sxm-80gb")
    chart.set_estimates(base, ghosts())
    texts = [
        (t.pos().x(), t.pos().y(), t.toPlainText())
        for t in chart.plot_item.items
        if isinstance(t, pg.TextItem) and t.isVisible()
    ]
    expected = [base, *(g.estimate for g in ghosts())]
    assert len(texts) == len(expected)
    for (x, y, text), (i, e) in zip(sorted(texts), enumerate(expected), strict=True):
        assert (x, text) == (i, gib_text(e.device_bytes))
        # at the bar's top, or lifted above a line that would strike through it
        top = e.device_bytes / GIB
        assert top - 1e-9 <= y < top * 1.1


def test_tooltip_lists_items_with_gib_and_formula(chart: BreakdownChart) -> None:
    e = est("llama-3-8b", "h100-sxm-80gb")
    chart.set_estimates(e, ghosts())
    tip = chart.tooltip_at(0, 1.0)
    assert "Parameters" in tip
    assert "trainable weights (fp32)" in tip
    assert "29.9 GiB" in tip
    assert "8,030,261,248 x 4 B" in tip
    top = e.device_bytes / GIB - 1.0
    assert "adamw states" in chart.tooltip_at(0, top)
    assert chart.tooltip_at(0, e.device_bytes / GIB + 1.0) == ""
    ghost_tip = chart.tooltip_at(1, 1.0)
    assert "8-bit optimizer" in ghost_tip
    assert "Parameters" in ghost_tip


def test_hovering_a_segment_sets_its_tooltip(chart: BreakdownChart, qtbot: QtBot) -> None:
    chart.set_estimates(est("llama-3-8b", "h100-sxm-80gb"), ghosts())
    qtbot.wait(40)  # pyqtgraph's scene drops moves that come faster than 60 a second
    qtbot.mouseMove(chart.plot.viewport(), to_widget(chart, 0.0, 10.0))
    tip = chart.tooltip_at(0, 10.0)
    assert chart.plot.toolTip() == tip
    assert chart.bars["parameters"].toolTip() == tip
    qtbot.wait(40)
    qtbot.mouseMove(chart.plot.viewport(), to_widget(chart, 0.5, 10.0))  # between bars
    assert chart.plot.toolTip() == ""
    assert chart.bars["parameters"].toolTip() == ""


def test_ghosts_add_bars_and_tick_labels(chart: BreakdownChart) -> None:
    gs = ghosts()
    chart.set_estimates(est("llama-3-8b", "h100-sxm-80gb"), gs)
    params = stacks(chart.ghost_bars["parameters"])
    assert [x for x, _y0, _h in params] == [1.0, 2.0, 3.0]
    for (_x, _y0, h), g in zip(params, gs, strict=True):
        assert h == pytest.approx(g.estimate.breakdown["parameters"] / GIB)
    assert chart.x_labels()[0] == "current"
    for shown, g in zip(chart.x_labels()[1:], gs, strict=True):
        label, *note = shown.split("\n")
        assert label == g.label
        assert " · ".join(note) == g.note  # on one line, or broken at its "·"
    (x0, x1), _yr = chart.plot_item.getViewBox().viewRange()
    assert x0 < -0.3 and x1 > 3.3

    chart.set_estimates(est("llama-3-8b", "h100-sxm-80gb"), gs[:1])
    assert [x for x, _y0, _h in stacks(chart.ghost_bars["parameters"])] == [1.0]
    assert len(chart.x_labels()) == 2
    visible = [t for t in chart.plot_item.items if isinstance(t, pg.TextItem) and t.isVisible()]
    assert len(visible) == 2


def test_tick_lines_fit_the_width(chart: BreakdownChart) -> None:
    metrics = QFontMetrics(chart.font())
    note = "−12.3 GiB · no compute cost"
    assert tick_lines("8-bit optimizer", note, 1e6, metrics) == ["8-bit optimizer", note]
    narrow = metrics.horizontalAdvance("no compute cost") + 2
    assert tick_lines("8-bit", note, narrow, metrics) == ["8-bit", "−12.3 GiB", "no compute cost"]
    small = metrics.horizontalAdvance("a very") + 2
    tiny = tick_lines("a very long what-if label", note, small, metrics)
    assert all(metrics.horizontalAdvance(line) <= small for line in tiny)
    assert tiny[0] == "a very"  # wrapped, never elided: every word is on some line
    assert " ".join(tiny).replace("- ", "") == "a very long what-if label −12.3 GiB no compute cost"
    assert not any("…" in line for line in tiny)
    # a word wider than the bar is broken with a hyphen, not cut
    narrow_word = tick_lines("checkpointing", "", metrics.horizontalAdvance("check") + 2, metrics)
    assert len(narrow_word) > 1 and all(line.endswith("-") for line in narrow_word[:-1])
    assert "".join(line.removesuffix("-") for line in narrow_word) == "checkpointing"
    wide = metrics.horizontalAdvance("Gradient") + 2
    assert tick_lines("Gradient checkpointing", "", wide, metrics)[:1] == ["Gradient"]


def test_narrow_chart_wraps_tick_labels(chart: BreakdownChart, qtbot: QtBot) -> None:
    gs = ghosts()
    chart.set_estimates(est("llama-3-8b", "h100-sxm-80gb"), gs)
    chart.resize(QSize(420, 400))
    qtbot.waitUntil(lambda: len(chart.x_labels()[1].split("\n")) >= 3)
    lines = max(len(label.split("\n")) for label in chart.x_labels())
    axis = chart.plot_item.getAxis("bottom")
    height = lines * QFontMetrics(axis.style["tickFont"]).lineSpacing()
    qtbot.waitUntil(lambda: axis.height() >= height)  # the axis grows to fit them


def double_click(qtbot: QtBot, chart: BreakdownChart, x: float, y: float) -> None:
    """Press, release, double-click, release: pyqtgraph reports clicks on release."""
    viewport, pos = chart.plot.viewport(), to_widget(chart, x, y)
    qtbot.mouseClick(viewport, Qt.MouseButton.LeftButton, pos=pos)
    qtbot.mouseDClick(viewport, Qt.MouseButton.LeftButton, pos=pos)
    qtbot.mouseRelease(viewport, Qt.MouseButton.LeftButton, pos=pos)


def test_double_clicking_a_ghost_emits_its_key(chart: BreakdownChart, qtbot: QtBot) -> None:
    chart.set_estimates(est("llama-3-8b", "h100-sxm-80gb"), ghosts())
    with qtbot.waitSignal(chart.ghostActivated, timeout=1000) as blocker:
        double_click(qtbot, chart, 2.0, 3.0)
    assert blocker.args == ["lora"]
    with qtbot.assertNotEmitted(chart.ghostActivated):
        double_click(qtbot, chart, 0.0, 3.0)  # the current bar
        double_click(qtbot, chart, 1.5, 3.0)  # between bars
    assert chart.ghost_key(0) is None
    assert chart.ghost_key(3) == "qlora"


def test_not_modelled_note(chart: BreakdownChart) -> None:
    e = dataclasses.replace(
        est("llama-3-8b", "h100-sxm-80gb"),
        not_modelled=("activations saved for backward", "logits and loss buffers"),
    )
    chart.set_estimates(e)
    assert chart.note_label.isVisible()
    assert chart.note_label.text() == (
        "Not modelled: activations saved for backward; logits and loss buffers (hover for each)"
    )
    for note in e.not_modelled:
        assert note in chart.note_label.toolTip()
    chart.set_estimates(dataclasses.replace(e, not_modelled=()))
    assert not chart.note_label.isVisible()


def test_the_not_modelled_note_names_whole_clauses_and_counts_the_rest() -> None:
    notes = (
        "DTensor returns a vocabulary-parallel embedding's gradient whole (V x h) on every "
        "rank; counted here as Megatron's V/tp x h",
        "expert-parallel load imbalance beyond expert_capacity_factor; the router's tensors",
        "the vision tower and projector of llava (only its text model is counted)",
    )
    assert short_not_modelled(notes) == (
        "DTensor returns a vocabulary-parallel embedding's gradient whole; expert-parallel "
        "load imbalance beyond expert_capacity_factor; and 1 more"
    )
    assert short_not_modelled(notes[:1]) == (
        "DTensor returns a vocabulary-parallel embedding's gradient whole"
    )


def test_follows_the_palette(chart: BreakdownChart) -> None:
    chart.set_estimates(oom(), ghosts())
    dark = QPalette(chart.palette())
    dark.setColor(QPalette.ColorRole.Base, QColor("#181818"))
    dark.setColor(QPalette.ColorRole.Text, QColor("#e8eaed"))
    chart.setPalette(dark)  # sends PaletteChange
    assert chart.plot.backgroundBrush().color().name() == "#181818"
    axis = chart.plot_item.getAxis("left")
    assert axis.textPen().color().name() == "#e8eaed"
    assert chart.ghost_bars["gradients"].opts["pen"].color().name() == "#e8eaed"


def test_png_export_size_at_scale_1_and_2(chart: BreakdownChart, tmp_path: Path) -> None:
    chart.set_estimates(oom(), ghosts())
    for scale in (1, 2):
        path = tmp_path / f"chart@{scale}.png"
        export_png(chart, path, scale=scale, caption="")  # the chart alone
        image = QImage(str(path))
        assert not image.isNull()
        assert image.size() == SIZE * scale
        export_png(chart, path, scale=scale)  # under the scenario's caption
        captioned = QImage(str(path))
        assert captioned.width() == SIZE.width() * scale
        assert captioned.height() > SIZE.height() * scale
    assert chart.size() == SIZE


def test_chart_image_at_a_given_size_restores_the_widget(chart: BreakdownChart) -> None:
    chart.set_estimates(tight(), ghosts())
    image = chart_image(chart, size=QSize(1280, 720))
    assert image.size() == QSize(1280, 720)
    assert chart.size() == SIZE
    # the verdict banner (amber for "tight") is part of the image
    banner = image.pixelColor(image.width() // 4, 12)
    assert banner.name() == "#f0b400"
    with pytest.raises(ValueError, match="scale"):
        chart_image(chart, 0)


def svg_text(path: Path) -> str:
    root = ET.parse(path).getroot()
    return " ".join("".join(el.itertext()) for el in root.iter())


def test_svg_export_parses_and_has_axis_label(chart: BreakdownChart, tmp_path: Path) -> None:
    chart.set_estimates(fits(), ghosts())
    path = tmp_path / "chart.svg"
    export_svg(chart, path)
    text = svg_text(path)
    assert "GiB" in text
    assert "Memory per GPU" in text


def test_svg_falls_back_to_qt_generator(
    chart: BreakdownChart, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken:
        def __init__(self, item: object) -> None:
            pass

        def export(self, **kwargs: object) -> None:
            raise RuntimeError("exporter broken")

    monkeypatch.setattr(chart_export, "SVGExporter", Broken)
    chart.set_estimates(fits())
    path = tmp_path / "fallback.svg"
    export_svg(chart, path)
    assert "GiB" in svg_text(path)


def dark_pixels(image: QImage) -> int:
    gray = image.convertToFormat(QImage.Format.Format_Grayscale8)
    ptr = gray.constBits()
    data = np.frombuffer(ptr, dtype=np.uint8).reshape(gray.height(), gray.bytesPerLine())
    return int((data[:, : gray.width()] < 128).sum())


def label_image(qtbot: QtBot, text: str) -> QImage:
    label = QLabel(text)
    qtbot.addWidget(label)
    palette = label.palette()
    palette.setColor(QPalette.ColorRole.Window, QColor("white"))
    palette.setColor(QPalette.ColorRole.WindowText, QColor("black"))
    label.setPalette(palette)
    label.setAutoFillBackground(True)
    font = label.font()
    font.setPixelSize(32)
    label.setFont(font)
    label.resize(200, 60)
    return label.grab().toImage()


def test_text_actually_renders(qtbot: QtBot) -> None:
    empty = dark_pixels(label_image(qtbot, ""))
    hello = dark_pixels(label_image(qtbot, "Hello GiB"))
    assert empty == 0
    assert hello > 100  # glyphs, not a blank
    # a missing font draws every glyph as the same box ("tofu"): H and I would look alike
    h = label_image(qtbot, "H")
    i = label_image(qtbot, "I")
    assert h != i
    assert dark_pixels(h) > dark_pixels(i)


def test_same_estimates_twice_is_a_no_op(chart: BreakdownChart) -> None:
    e = fits()
    chart.set_estimates(e, ghosts())
    before = stacks(chart.bars["parameters"])
    chart.set_estimates(e, ghosts())
    assert stacks(chart.bars["parameters"]) == before
    assert chart.x_labels()[0] == "current"


def test_follows_an_application_palette_change(
    chart: BreakdownChart, qapp: QApplication, qtbot: QtBot
) -> None:
    chart.set_estimates(fits())
    old = qapp.palette()
    dark = QPalette(old)
    dark.setColor(QPalette.ColorRole.Base, QColor("#1e2024"))
    dark.setColor(QPalette.ColorRole.Text, QColor("#e6e8eb"))
    try:
        qapp.setPalette(dark)  # reaches widgets through posted events
        qtbot.waitUntil(lambda: chart.plot.backgroundBrush().color().name() == "#1e2024")
        assert chart.legend.items[0][1].opts["color"].name() == "#e6e8eb"
    finally:
        qapp.setPalette(old)
    light = old.color(QPalette.ColorRole.Base)
    qtbot.waitUntil(lambda: chart.plot.backgroundBrush().color() == light)


def test_png_export_to_a_missing_folder_names_the_file(
    chart: BreakdownChart, tmp_path: Path
) -> None:
    chart.set_estimates(fits())
    path = tmp_path / "missing" / "chart.png"
    with pytest.raises(chart_export.ExportError, match=r"chart\.png"):
        export_png(chart, path)


@cache
def pipeline() -> Estimate:
    """Llama 3.1 70B, tp=8, pp=4 on 4 nodes x 8 H100: four rank groups that differ."""
    return estimate(
        Scenario(
            load_model("llama-3.1-70b"),
            HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8, nodes=4),
            TrainingSpec(
                method="full",
                sequence_length=4096,
                gradient_accumulation_steps=8,
                activation_checkpointing="full",
                parallelism=ParallelismSpec(tp=8, pp=4, zero_stage=1, sequence_parallel=True),
            ),
        )
    )


@cache
def offloaded(host_memory_gib: float | None) -> Estimate:
    return estimate(
        Scenario(
            load_model("llama-3-8b"),
            HardwareSpec(
                load_gpu("h100-sxm-80gb"), gpus_per_node=8, host_memory_gib=host_memory_gib
            ),
            TrainingSpec(
                method="full",
                parallelism=ParallelismSpec(zero_stage=3),
                offload=OffloadSpec(optimizer="cpu", parameters="cpu"),
            ),
        )
    )


def test_one_solid_bar_per_rank_group_the_worst_outlined(chart: BreakdownChart) -> None:
    e = pipeline()
    groups = e.rank_groups
    assert len(groups) == 4
    worst = [g.group for g in groups].index(e.worst_group)
    chart.set_estimates(e, ghosts())
    assert chart.current_bar_count() == 4 and chart.worst_bar() == worst
    for cat in CATEGORIES:  # every stage stacks its own items, solid
        drawn = {x: h for x, _y0, h in stacks(chart.bars[cat])}
        for i, g in enumerate(groups):
            assert drawn.get(float(i), 0.0) == pytest.approx(g.category_bytes(cat) / GIB)
    assert [x for x, _y0, _h in stacks(chart.ghost_bars["parameters"])] == [4.0, 5.0, 6.0]
    # the outline frames the worst stage's whole bar
    [(x, y0, h)] = stacks(chart.worst_outline)
    assert (x, y0) == (worst, 0.0) and h == pytest.approx(groups[worst].device_bytes / GIB)
    assert chart.worst_outline.opts["pen"].widthF() >= 2
    labels = chart.x_labels()
    assert [label.split("\n")[0] for label in labels[:4]] == [f"pp stage {i}" for i in range(4)]
    assert [label.endswith("worst") for label in labels[:4]] == [i == worst for i in range(4)]
    totals = sorted(
        (t.pos().x(), t)
        for t in chart.plot_item.items
        if isinstance(t, pg.TextItem) and t.isVisible()
    )
    bold = ["font-weight:700" in t.textItem.toHtml() for _x, t in totals]
    assert bold == [i == worst for i in range(len(totals))]
    assert totals[worst][1].toPlainText() == gib_text(groups[worst].device_bytes)
    # hovering a stage lists that stage's items under its whole name
    other = (worst + 1) % 4
    tip = chart.tooltip_at(other, 1.0)
    assert groups[other].group in tip and "Parameters" in tip
    assert chart.ghost_key(other) is None and chart.ghost_key(4) == "adamw-8bit"


def test_no_outline_when_the_ranks_agree(chart: BreakdownChart) -> None:
    chart.set_estimates(pipeline())
    chart.set_estimates(fits(), ghosts())
    assert stacks(chart.worst_outline) == [] and chart.worst_bar() is None
    assert chart.current_bar_count() == 1 and chart.x_labels()[0] == "current"


@pytest.mark.parametrize(
    ("host_gib", "ending", "verdict"),
    [
        (256, "of 256.0 GiB — fits", "fits"),
        (64, "of 64.0 GiB — does not fit", "oom"),
        (None, "for offload — give the host RAM per node to check it", "unknown"),
    ],
)
def test_host_ram_badge(
    chart: BreakdownChart, host_gib: float | None, ending: str, verdict: str
) -> None:
    e = offloaded(host_gib)
    assert e.host_verdict == verdict
    chart.set_estimates(e)
    per_gpu = sum(i.bytes for i in e.host_items)
    assert chart.host_text() == f"Host RAM per node: {gib_text(8 * per_gpu)} {ending}"
    assert chart.host_label.isVisible()
    for item in e.host_items:
        assert item.name in chart.host_label.toolTip()
    # the badge is not a bar: the GPU axis still ends at 1.1 x capacity
    _xr, (_y0, y1) = chart.plot_item.getViewBox().viewRange()
    assert y1 == pytest.approx(e.capacity_bytes / GIB * 1.1)
    style = chart.host_label.styleSheet()
    assert ("background: #B3261E" in style) == (verdict == "oom")
    chart.set_estimates(fits())
    assert chart.host_text() == "" and not chart.host_label.isVisible()


def test_host_badge_follows_the_palette(chart: BreakdownChart) -> None:
    chart.set_estimates(offloaded(256))
    dark = QPalette(chart.palette())
    dark.setColor(QPalette.ColorRole.Base, QColor("#181818"))
    dark.setColor(QPalette.ColorRole.Text, QColor("#e8eaed"))
    chart.setPalette(dark)
    assert "color: #e8eaed" in chart.host_label.styleSheet()
    assert chart.worst_outline.opts["pen"].color().name() == "#e8eaed"


def test_a_deep_pipeline_draws_at_most_twelve_stage_bars(chart: BreakdownChart) -> None:
    """1,024 pipeline stages are 1,024 rank groups; the chart draws the first, the worst,
    the last and evenly spaced ones between, twelve in all, and says so."""
    model = dataclasses.replace(load_model("llama-3.2-1b"), num_layers=1024)
    deep = estimate(
        Scenario(
            model,
            HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8, nodes=128),
            TrainingSpec(gradient_accumulation_steps=16, parallelism=ParallelismSpec(pp=1024)),
        )
    )
    assert len(deep.rank_groups) == 1024
    shown = shown_groups(deep)
    worst = next(i for i, g in enumerate(deep.rank_groups) if g.group == deep.worst_group)
    assert len(shown) == 12 and shown == sorted(shown)
    assert {0, worst, 1023} <= set(shown)
    chart.set_estimates(deep)
    assert chart.current_bar_count() == 12
    assert chart.worst_bar() == shown.index(worst)
    assert "12 of 1,024 pipeline stages drawn" in chart.note_label.text()


def test_the_banner_says_what_its_verdict_means(chart: BreakdownChart) -> None:
    e = est("llama-3-8b", "h100-sxm-80gb")
    chart.set_estimates(e)
    tip = chart.verdict_label.toolTip()
    assert gib_text(e.budget_bytes) in tip and gib_text(e.capacity_bytes) in tip
    assert "tight" in tip and "nvidia-smi" in tip
    chart.set_stale("training.lora.rank: got 0")
    assert "No verdict" in chart.verdict_label.toolTip()


def test_the_activations_segment_says_where_they_come_from(chart: BreakdownChart) -> None:
    from memfit.engine.explain import explained

    e = est("llama-3-8b", "h100-sxm-80gb", method="lora", precision="bf16-mixed")
    assert e.breakdown["activations"] > 0  # the peak is in backward
    chart.set_estimates(e, ghosts())
    segments = chart._segments[0]
    bottom, height = segments["activations"]
    tip = chart.tooltip_at(0, (bottom + height / 2))
    groups = explained(e, remedies=False)
    assert "By source: " in tip and "Ctrl+3" in tip
    assert f"{groups[0].title.lower()} {gib_text(groups[0].bytes)}" in tip
    # other segments list their items only
    assert "By source" not in chart.tooltip_at(0, 1.0)
    # a ghost's activations are its own estimate's
    g_bottom, g_height = chart._segments[1]["activations"]
    assert "By source: " in chart.tooltip_at(1, g_bottom + g_height / 2)


def test_a_broken_word_leaves_no_stub_of_a_letter_or_two(chart: BreakdownChart) -> None:
    """A ghost's label read ``checkpointin-`` over ``g`` where the bar was a little narrower
    than the word."""
    metrics = QFontMetrics(chart.font())
    for word in ("checkpointing", "offloading", "activations"):
        width = metrics.horizontalAdvance(word[:-1] + "-") + 1
        lines = tick_lines(word, "", width, metrics)
        assert "".join(line.removesuffix("-") for line in lines) == word
        assert all(len(line.removesuffix("-")) >= 3 for line in lines), lines
        assert all(metrics.horizontalAdvance(line) <= width for line in lines)
