"""The chart's labels by their geometry: totals and line labels never overlap, a line never
strikes through a total, a line's label never covers a bar, a what-if ten times the
capacity is cut and keeps the capacity line readable, the peak is named, and exported files
carry the scenario and verdict."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from functools import cache
from itertools import combinations
from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtCore import QPointF, QRectF, QSettings, QSize
from PySide6.QtGui import QImage
from pytestqt.qtbot import QtBot

from memfit.engine.estimate import GIB, Estimate, estimate
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.gui import chart as chart_module
from memfit.gui import chart_export
from memfit.gui.chart import CUT_MARK, BreakdownChart, Ghost, axis_top, gib_text, scenario_caption
from memfit.gui.chart_export import export_png, export_svg, png_bytes
from memfit.gui.main_window import MainWindow

SIZES = [QSize(1280, 800), QSize(1024, 640)]


@cache
def est(model: str, gpu: str = "h100-sxm-80gb", **training: object) -> Estimate:
    hardware = HardwareSpec(load_gpu(gpu))
    return estimate(Scenario(load_model(model), hardware, TrainingSpec(**training)))  # type: ignore[arg-type]


def lora() -> Estimate:
    return est("llama-3-8b", method="lora", micro_batch_size=4, sequence_length=2048)


def full_8b() -> Estimate:
    return est("llama-3-8b", method="full", micro_batch_size=8, sequence_length=4096)


def huge() -> Estimate:
    """Llama 3 70B, full fine-tuning on one H100: over 16 x the capacity."""
    return est("llama-3-70b", method="full")


def some_ghosts() -> list[Ghost]:
    """Ghosts near the capacity and the budget, and one huge."""
    return [
        Ghost(
            "ckpt",
            "Gradient checkpointing",
            est("llama-3-8b", method="lora", micro_batch_size=4, activation_checkpointing="full"),
            "fits · −35.6 GiB",
        ),
        Ghost(
            "qlora",
            "QLoRA (4-bit base)",
            est("llama-3-8b", method="qlora", micro_batch_size=4),
            "fits · −0.20 GiB · +2 % step time",
        ),
        Ghost(
            "8bit",
            "8-bit AdamW",
            est("llama-3-8b", method="lora", micro_batch_size=4, optimizer="adamw-8bit"),
            "fits · −0.04 GiB · same step time",
        ),
        Ghost("full", "Full fine-tuning of a 70B model", huge(), "does not fit · +1249.3 GiB"),
        Ghost(
            "b5",
            "Micro-batch 5",
            est("llama-3-8b", method="lora", micro_batch_size=5),
            "tight · +12.3 GiB",
        ),
    ]


def labels(chart: BreakdownChart) -> list[tuple[str, QRectF]]:
    """Every visible text item in the plot's scene, by its scene bounding rectangle."""
    return [
        (item.toPlainText(), item.sceneBoundingRect())
        for item in chart.plot.scene().items()
        if isinstance(item, pg.TextItem) and item.isVisible() and item.toPlainText()
    ]


def overlapping(chart: BreakdownChart) -> list[tuple[str, str]]:
    found = labels(chart)
    assert len(found) >= 3  # the totals and the two line labels
    return [
        (a, b)
        for (a, ra), (b, rb) in combinations(found, 2)
        if ra.adjusted(0.5, 0.5, -0.5, -0.5).intersects(rb.adjusted(0.5, 0.5, -0.5, -0.5))
    ]


def struck_totals(chart: BreakdownChart) -> list[str]:
    """Totals a capacity or budget line passes through."""
    view = chart.plot_item.getViewBox()
    ys = [
        view.mapViewToScene(pg.Point(0, line.value())).y()
        for line in (chart.capacity_line, chart.budget_line)
    ]
    out = []
    for text in chart._total_texts:
        if not text.isVisible():
            continue
        rect = text.sceneBoundingRect()
        out += [text.toPlainText() for y in ys if rect.top() < y < rect.bottom()]
    return out


def outside(chart: BreakdownChart) -> list[str]:
    area = chart.plot_item.getViewBox().sceneBoundingRect().adjusted(-2, -2, 2, 2)
    return [text for text, rect in labels(chart) if not area.contains(rect)]


def bar_rects(chart: BreakdownChart) -> list[QRectF]:
    """Every drawn bar segment (current, pinned baseline, ghost) by its scene rectangle."""
    view = chart.plot_item.getViewBox()
    rects = []
    for items in (chart.bars, chart.baseline_bars, chart.ghost_bars):
        for item in items.values():
            o = item.opts
            for x0, x1, y0, h in zip(o["x0"], o["x1"], o["y0"], o["height"], strict=True):
                corner = view.mapViewToScene(QPointF(float(x0), float(y0)))
                other = view.mapViewToScene(QPointF(float(x1), float(y0 + h)))
                rects.append(QRectF(corner, other).normalized())
    return rects


def lines_over_bars(chart: BreakdownChart) -> list[str]:
    """The capacity and budget labels drawn over a bar (they would hide its colours)."""
    bars = [r.adjusted(0.5, 0.5, -0.5, -0.5) for r in bar_rects(chart)]
    assert bars
    out = []
    for line in (chart.capacity_line, chart.budget_line):
        rect = line.label.sceneBoundingRect().adjusted(0.5, 0.5, -0.5, -0.5)
        if line.isVisible() and any(rect.intersects(bar) for bar in bars):
            out.append(line.label.toPlainText())
    return out


def settle(qtbot: QtBot) -> None:
    qtbot.wait(30)


@pytest.fixture
def chart(qtbot: QtBot) -> BreakdownChart:
    widget = BreakdownChart()
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s.width()}x{s.height()}")
@pytest.mark.parametrize("current", [lora, full_8b, huge], ids=["lora", "full-8b", "70b"])
def test_chart_labels_never_overlap(
    chart: BreakdownChart, qtbot: QtBot, size: QSize, current: object
) -> None:
    chart.resize(size * 0.7)  # about the chart's share of a window that size
    chart.set_estimates(current(), some_ghosts())  # type: ignore[operator]
    settle(qtbot)
    assert overlapping(chart) == []
    assert struck_totals(chart) == []
    assert outside(chart) == []


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s.width()}x{s.height()}")
@pytest.mark.parametrize("current", [lora, full_8b, huge], ids=["lora", "full-8b", "70b"])
def test_line_labels_never_cover_a_bar(
    chart: BreakdownChart, qtbot: QtBot, size: QSize, current: object
) -> None:
    """The capacity and budget labels sit beside the bars, never over one: over a bar they
    hid its colours and were hard to read."""
    chart.resize(size * 0.7)
    chart.set_estimates(current(), some_ghosts())  # type: ignore[operator]
    settle(qtbot)
    assert lines_over_bars(chart) == []


def test_capacity_and_budget_labels_apart_when_bars_tower(
    chart: BreakdownChart, qtbot: QtBot
) -> None:
    """The review's case: bars far above the capacity put its line and the budget's a
    few pixels apart; their labels still do not overprint each other."""
    chart.resize(QSize(900, 560))
    chart.set_estimates(huge(), some_ghosts()[:3])
    settle(qtbot)
    view = chart.plot_item.getViewBox()
    gap = abs(
        view.mapViewToScene(pg.Point(0, chart.capacity_line.value())).y()
        - view.mapViewToScene(pg.Point(0, chart.budget_line.value())).y()
    )
    capacity = chart.capacity_line.label.sceneBoundingRect()
    assert gap < capacity.height()  # closer than a label is tall
    assert not capacity.intersects(chart.budget_line.label.sceneBoundingRect())
    assert overlapping(chart) == []
    assert lines_over_bars(chart) == []


def test_labels_stay_apart_after_a_resize(chart: BreakdownChart, qtbot: QtBot) -> None:
    chart.resize(QSize(1100, 700))
    chart.set_estimates(lora(), some_ghosts())
    settle(qtbot)
    for size in (QSize(700, 480), QSize(1400, 800)):
        chart.resize(size)
        qtbot.waitUntil(lambda s=size: chart.size() == s)
        settle(qtbot)
        assert overlapping(chart) == []
        assert struck_totals(chart) == []
        assert outside(chart) == []
        assert lines_over_bars(chart) == []


def make_window(qtbot: QtBot, tmp_path: Path, scenario: Scenario, size: QSize) -> MainWindow:
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings, data_dir=tmp_path, scenario=scenario)
    qtbot.addWidget(window)
    window.resize(size)
    window.show()
    qtbot.waitExposed(window)
    window.compare_all_act.trigger()  # every what-if as a ghost
    qtbot.waitUntil(lambda: window.chart.current_bar_count() < len(window.chart.x_labels()))
    settle(qtbot)
    return window


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s.width()}x{s.height()}")
@pytest.mark.parametrize(
    "scenario",
    [
        huge().scenario,
        full_8b().scenario,
        lora().scenario,
    ],
    ids=["70b-full", "8b-full", "8b-lora"],
)
def test_window_chart_labels_never_overlap(
    qtbot: QtBot, tmp_path: Path, size: QSize, scenario: Scenario
) -> None:
    window = make_window(qtbot, tmp_path, scenario, size)
    chart = window.chart
    assert len(chart.x_labels()) >= 4  # several ghosts
    assert overlapping(chart) == []
    assert struck_totals(chart) == []
    assert outside(chart) == []
    # ghost labels are wrapped, never cut
    assert not any("…" in label for label in chart.x_labels())
    # the capacity and budget labels sit beside the bars, never over one
    assert lines_over_bars(chart) == []


def test_line_labels_take_short_words_where_their_column_is_narrow(
    qtbot: QtBot, tmp_path: Path
) -> None:
    """At 1024x640 with every ghost the full words (the GPU's name, the budget's share)
    would take a third of the plot: the labels say the short ones and the tooltips the
    full ones. A lone bar leaves room for the full words."""
    window = make_window(qtbot, tmp_path, full_8b().scenario, QSize(1024, 640))
    chart = window.chart
    assert chart.capacity_line.label.toPlainText() == "capacity 79.6 GiB"
    assert chart.budget_line.label.toPlainText() == "budget 67.7 GiB"
    assert "NVIDIA H100 SXM 80GB capacity 79.6 GiB" in chart.capacity_line.label.toolTip()
    assert "budget 85 % · 67.7 GiB" in chart.budget_line.label.toolTip()
    view = chart.plot_item.getViewBox()
    last_bar = max(rect.right() for rect in bar_rects(chart))
    for line in (chart.capacity_line, chart.budget_line):
        rect = line.label.sceneBoundingRect()
        assert last_bar < rect.left() and rect.right() <= view.sceneBoundingRect().right()
    window.clear_whatifs_act.trigger()
    qtbot.waitUntil(lambda: len(chart.x_labels()) == 1)
    assert chart.capacity_line.label.toPlainText() == "NVIDIA H100 SXM 80GB capacity 79.6 GiB"
    assert chart.budget_line.label.toPlainText() == "budget 85 % · 67.7 GiB"
    assert lines_over_bars(chart) == []


def test_a_ghost_ten_times_the_capacity_is_cut(chart: BreakdownChart, qtbot: QtBot) -> None:
    current = lora()
    big = huge()
    assert big.device_bytes > 10 * current.capacity_bytes
    chart.resize(QSize(900, 560))
    chart.set_estimates(current, [Ghost("full", "70B full", big, "does not fit")])
    settle(qtbot)
    view = chart.plot_item.getViewBox()
    _xr, (y0, y1) = view.viewRange()
    capacity = chart.capacity_line.value()
    assert (capacity - y0) / (y1 - y0) >= 0.25  # the capacity line in the plot's upper part
    assert y1 < big.device_bytes / GIB
    # the ghost is drawn up to the cut, with its true total and an arrow
    tops = [y + h for _x, y, h in zip(*_stacks(chart.ghost_bars.values()), strict=True)]
    assert max(tops) < y1
    texts = [text for text, _rect in labels(chart)]
    assert f"{gib_text(big.device_bytes)} {CUT_MARK}" in texts
    assert gib_text(current.device_bytes) in texts  # the current bar, under the cut, is whole
    # the numbers behind the bar stay true
    assert sum(h for _b, h in chart.segments(1).values()) == pytest.approx(big.device_bytes / GIB)
    assert overlapping(chart) == []


def _stacks(items: object) -> tuple[list[float], list[float], list[float]]:
    xs: list[float] = []
    y0s: list[float] = []
    hs: list[float] = []
    for item in items:  # type: ignore[attr-defined]
        o = item.opts
        xs += ((np.asarray(o["x0"]) + np.asarray(o["x1"])) / 2).tolist()
        y0s += np.asarray(o["y0"]).tolist()
        hs += np.asarray(o["height"]).tolist()
    return xs, y0s, hs


def test_axis_top() -> None:
    assert axis_top(80.0, [40.0, 60.0]) == (pytest.approx(88.0), float("inf"))
    top, cut = axis_top(80.0, [40.0, 800.0])
    assert top == pytest.approx(240.0) and cut == pytest.approx(200.0)
    # a current bar far over the capacity is cut too: the capacity line stays readable
    top, cut = axis_top(80.0, [1316.0, 4000.0])
    assert top == pytest.approx(240.0) and cut < top
    assert axis_top(0.0, []) == (1.0, float("inf"))


def test_a_current_bar_far_over_the_capacity_leaves_the_capacity_line_readable(
    chart: BreakdownChart, qtbot: QtBot
) -> None:
    """A current bar of 1,316 GiB flattened the 80 GiB capacity line to the floor."""
    big = huge()
    assert big.device_bytes > 10 * big.capacity_bytes
    chart.resize(QSize(900, 560))
    chart.set_estimates(big, [])
    settle(qtbot)
    _xr, (y0, y1) = chart.plot_item.getViewBox().viewRange()
    capacity = chart.capacity_line.value()
    assert (capacity - y0) / (y1 - y0) >= 0.25
    texts = [text for text, _rect in labels(chart)]
    assert f"{gib_text(big.device_bytes)} {CUT_MARK}" in texts  # its true total, cut
    assert sum(h for _b, h in chart.segments(0).values()) == pytest.approx(big.device_bytes / GIB)
    assert overlapping(chart) == []


def test_the_peak_is_named(chart: BreakdownChart) -> None:
    chart.set_estimates(huge())
    assert huge().peak_phase == "optimizer"
    assert chart.peak_caption() == "Peak: optimizer step — activations are freed by then"
    assert "optimizer step" in chart.plot_item.titleLabel.text
    chart.set_estimates(lora())
    assert chart.peak_caption() == "Peak: backward (loss and LM head)"
    layer = dataclasses.replace(lora(), peak_layer=31)
    chart.set_estimates(layer)
    assert chart.peak_caption() == "Peak: backward (layer 31)"
    chart.clear()
    assert chart.peak_caption() == ""


def svg_texts(data: bytes) -> list[str]:
    root = ET.fromstring(data)
    return ["".join(el.itertext()) for el in root.iter() if el.tag.endswith("text")]


def test_scenario_caption() -> None:
    text = scenario_caption(lora())
    assert text == (
        "Llama 3 8B · LoRA · bf16-mixed · micro-batch 4 x 2,048 tokens · "
        "1 x NVIDIA H100 SXM 80GB · Hugging Face Trainer"
    )
    many = dataclasses.replace(
        lora().scenario,
        hardware=HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8, nodes=4),
        training=TrainingSpec(parallelism=ParallelismSpec(tp=8, pp=4, zero_stage=1)),
    )
    text = scenario_caption(dataclasses.replace(lora(), scenario=many))
    assert "32 x NVIDIA H100 SXM 80GB (4 nodes x 8; tp 8, pp 4, ZeRO-1)" in text
    assert text.startswith("Llama 3 8B · full fine-tuning · bf16-mixed · micro-batch 1 x 2,048")


def test_exports_carry_the_scenario_and_verdict(
    chart: BreakdownChart, qtbot: QtBot, tmp_path: Path
) -> None:
    chart.resize(QSize(900, 560))
    chart.set_estimates(lora(), some_ghosts())
    settle(qtbot)
    svg = tmp_path / "chart.svg"
    export_svg(chart, svg)
    texts = svg_texts(svg.read_bytes())
    joined = " ".join(texts)
    assert "Llama 3 8B" in joined and "micro-batch 4 x 2,048 tokens" in joined
    assert chart.verdict_text() in texts  # the banner, as text
    assert chart.verdict_text().startswith("Fits under the budget · 66.0 GiB per GPU of 79.6")
    assert "Peak: backward" in joined
    assert "…" not in joined  # ghost labels are whole in the file
    assert "Gradient" in texts and "checkpointing" in texts
    root = ET.fromstring(svg.read_bytes())
    title = next(el for el in root.iter() if el.tag.endswith("title"))
    assert title.text == "MemFit memory breakdown"
    # caption and verdict can be given, or left out
    data = chart_export.svg_bytes(chart, caption="my run", verdict="")
    assert "my run" in svg_texts(data) and chart.verdict_text() not in svg_texts(data)

    png = tmp_path / "chart.png"
    export_png(chart, png)
    image = QImage(str(png))
    alone = QImage.fromData(png_bytes(chart, caption=""))
    assert image.width() == alone.width() == 900
    assert image.height() > alone.height() == 560
    header = image.copy(0, 0, image.width(), image.height() - alone.height())
    assert _dark_pixels(header) > 200  # the caption's glyphs, not a blank strip
    scaled = QImage.fromData(png_bytes(chart, 2))
    assert scaled.size() == image.size() * 2


def test_svg_fallback_keeps_the_caption(
    chart: BreakdownChart, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken:
        def __init__(self, item: object) -> None:
            pass

        def export(self, **kwargs: object) -> None:
            raise RuntimeError("exporter broken")

    monkeypatch.setattr(chart_export, "SVGExporter", Broken)
    chart.resize(QSize(900, 560))
    chart.set_estimates(lora())
    path = tmp_path / "fallback.svg"
    export_svg(chart, path)
    joined = " ".join(svg_texts(path.read_bytes()))
    assert "Llama 3 8B" in joined


def test_window_export_has_the_caption(qtbot: QtBot, tmp_path: Path) -> None:
    window = make_window(qtbot, tmp_path, huge().scenario, QSize(1280, 800))
    svg = tmp_path / "w.svg"
    window.export_chart(svg)
    joined = " ".join(svg_texts(svg.read_bytes()))
    assert "Llama 3 70B · full fine-tuning" in joined
    assert "Does not fit · 1315.3 GiB per GPU of 79.6 GiB" in joined
    png = tmp_path / "w.png"
    window.export_chart(png, 2)
    image = QImage(str(png))
    assert image.width() == window.chart.width() * 2
    assert image.height() > window.chart.height() * 2


def _dark_pixels(image: QImage) -> int:
    gray = image.convertToFormat(QImage.Format.Format_Grayscale8)
    data = np.frombuffer(gray.constBits(), dtype=np.uint8).reshape(
        gray.height(), gray.bytesPerLine()
    )
    return int((data[:, : gray.width()] < 128).sum())


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s.width()}x{s.height()}")
def test_many_bars_keep_their_totals_apart(
    chart: BreakdownChart, qtbot: QtBot, size: QSize
) -> None:
    """Eight pipeline stages and five what-ifs: thirteen bars, their totals narrow."""
    staged = estimate(
        Scenario(
            load_model("llama-3-8b"),
            HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8),
            TrainingSpec(gradient_accumulation_steps=8, parallelism=ParallelismSpec(pp=8)),
        )
    )
    assert len(staged.rank_groups) >= 4
    chart.resize(size * 0.7)
    chart.set_estimates(staged, some_ghosts())
    settle(qtbot)
    assert len(chart.x_labels()) >= 9
    assert overlapping(chart) == []
    assert struck_totals(chart) == []
    assert outside(chart) == []
    assert lines_over_bars(chart) == []


@pytest.mark.parametrize(
    "size", [*SIZES, QSize(640, 400)], ids=lambda s: f"{s.width()}x{s.height()}"
)
@pytest.mark.parametrize("current", [lora, full_8b, huge], ids=["lora", "full-8b", "70b"])
def test_the_line_labels_spots_made_as_read_are_the_whole_list(
    chart: BreakdownChart,
    qtbot: QtBot,
    size: QSize,
    current: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The line labels' places are chosen from spots made as they are read: the same
    places as choosing from every spot made first, and a second reading of the spots
    gives the same spots without making them again."""
    chart.resize(size * 0.7)
    chart.set_estimates(current(), some_ghosts())  # type: ignore[operator]
    settle(qtbot)
    lazy = [(t, r.getRect()) for t, r in chart.label_rects()]
    made: list[int] = []
    real = BreakdownChart._label_spots

    def eager(self: BreakdownChart, *args: object) -> object:
        spots = list(real(self, *args))  # type: ignore[arg-type]
        made.append(len(spots))
        return iter(spots)

    monkeypatch.setattr(BreakdownChart, "_label_spots", eager)
    chart.layout_labels()
    assert [(t, r.getRect()) for t, r in chart.label_rects()] == lazy
    assert made and all(n > 10 for n in made)
    spots = chart_module._Spots(iter(range(5)))  # type: ignore[arg-type]
    first = iter(spots)
    assert [next(first), next(first)] == [0, 1]
    assert list(spots) == [0, 1, 2, 3, 4] == list(spots)
