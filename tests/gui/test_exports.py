"""Exports with their context: the chart's size chosen in the export dialog (the PNG has
exactly those pixels, its caption never cut), Copy Chart with the caption, Copy Summary as
Markdown, and the shown what-ifs in the data exports."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from pathlib import Path

import pytest
from PySide6.QtCore import QRect, QSize
from PySide6.QtGui import QGuiApplication, QImage, QKeySequence
from PySide6.QtWidgets import QApplication, QFileDialog

from memfit.engine.estimate import GIB
from memfit.engine.model_state import CATEGORIES
from memfit.engine.presets import load_model
from memfit.engine.specs import ParallelismSpec
from memfit.gui import chart_export
from memfit.gui.chart_export import (
    CAPTION_MARGIN,
    IMAGE_SIZES,
    ImageSize,
    captioned_image,
    chart_image,
    layout_for,
)
from memfit.gui.main_window import SVG_FILTER, MainWindow

PIXELS = re.compile(r": (\d+) x (\d+) px \(\*\.png\)$")


def answer_save_dialog(
    monkeypatch: pytest.MonkeyPatch, name: Path, chosen: str
) -> list[tuple[object, ...]]:
    """The export dialog answers ``name`` and the file type ``chosen``; what it was asked
    is recorded."""
    asked: list[tuple[object, ...]] = []

    def dialog(*args: object) -> tuple[str, str]:
        asked.append(args)
        return str(name), chosen

    monkeypatch.setattr(QFileDialog, "getSaveFileName", dialog)
    return asked


def long_caption(window: MainWindow) -> None:
    """A scenario whose caption is long: two nodes, a parallel mesh, ZeRO."""
    s = window.store.scenario
    window.store.edit(
        dataclasses.replace(
            s,
            model=load_model("llama-3.1-70b"),
            hardware=dataclasses.replace(s.hardware, gpus_per_node=8, nodes=2),
            training=dataclasses.replace(
                s.training,
                method="full",
                parallelism=ParallelismSpec(tp=4, pp=2, zero_stage=1),
            ),
        )
    )
    assert window.store.estimate is not None, window.store.error


# -- the size choice ----------------------------------------------------------------------
def test_the_export_dialog_offers_each_size_with_its_pixels(
    window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    filters = window.chart_filters()
    assert list(filters.values()) == [*IMAGE_SIZES, None]
    assert [s.label for s in IMAGE_SIZES] == [
        "1x",
        "2x",
        "3x",
        "1200 px wide",
        "1920 px wide",
    ]
    chart = window.chart.size()
    for i, (name, size) in enumerate(filters.items()):
        if size is None:
            continue
        found = PIXELS.search(name)
        assert found, name
        want = QSize(int(found.group(1)), int(found.group(2)))
        answer_save_dialog(monkeypatch, tmp_path / f"chart-{i}", name)  # no suffix given
        window.export_chart_dialog()
        image = QImage(str(tmp_path / f"chart-{i}.png"))
        assert image.size() == want, name
        assert image.width() == (size.width or size.scale * chart.width())
        # the chart's own height at that scale, under the caption strip
        assert image.height() > round(chart.height() * image.width() / chart.width())
        assert f"{want.width()} x {want.height()} px" in window.statusBar().currentMessage()


def test_the_svg_type_writes_an_svg_and_the_last_choice_is_offered_first(
    window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = next(iter(window.chart_filters()))
    asked = answer_save_dialog(monkeypatch, tmp_path / "chart", SVG_FILTER)
    window.export_chart_dialog()
    assert asked[-1][4] == first  # nothing chosen yet: 1x is offered
    assert (tmp_path / "chart.svg").read_bytes().lstrip().startswith(b"<?xml")
    slides = next(n for n, s in window.chart_filters().items() if s and s.width == 1920)
    asked = answer_save_dialog(monkeypatch, tmp_path / "again.png", slides)
    window.export_chart_dialog()
    assert asked[-1][4] == SVG_FILTER and str(asked[-1][2]).endswith("memfit-chart.svg")
    assert QImage(str(tmp_path / "again.png")).width() == 1920
    window.export_chart_dialog()
    assert asked[-1][4] == slides


def background_only(image: QImage, rect: QRect, colour: int) -> bool:
    return all(
        image.pixel(x, y) == colour
        for x in range(rect.left(), rect.right() + 1)
        for y in range(rect.top(), rect.bottom() + 1)
    )


def assert_caption_whole(image: QImage, chart: QImage, header_logical: int) -> None:
    """The strip above the chart: as tall as its lines need at the image's scale, with
    text in it, nothing in its margins (no line ran past them), and the chart's pixels
    under it unchanged."""
    ratio = image.width() / chart.width() * chart.devicePixelRatio()
    header = image.height() - chart.height()
    assert header == round(header_logical * ratio) > 0
    colour = image.pixel(0, 0)
    margin = int(CAPTION_MARGIN * ratio) - 2
    strip = QRect(0, 0, image.width(), header)
    assert not background_only(image, strip.adjusted(margin, margin, -margin, -margin), colour)
    right = QRect(image.width() - margin, 0, margin, header)
    bottom = QRect(0, header - margin, image.width(), margin)
    assert background_only(image, right, colour), "a caption line runs into the margin"
    assert background_only(image, bottom, colour), "the last caption line is cut"
    plain = QImage(chart)
    plain.setDevicePixelRatio(1.0)
    assert image.copy(0, header, image.width(), chart.height()) == plain.convertToFormat(
        image.format()
    )


@pytest.mark.parametrize("size", IMAGE_SIZES, ids=[s.label for s in IMAGE_SIZES])
def test_caption_and_verdict_are_whole_at_every_size(window: MainWindow, size: ImageSize) -> None:
    """From the smallest (1x of the narrowest chart) to the largest (3x, 1920 px wide)."""
    window.resize(window.minimumSize())  # the narrowest chart: the caption wraps the most
    long_caption(window)
    QApplication.sendPostedEvents()  # the window laid out for the new labels
    on_screen = window.chart.size()
    verdict = "Does not fit · " + "a verdict long enough to need several lines · " * 3
    logical, _ratio = layout_for(on_screen, size.scale, size.width)
    layout = chart_export._caption(window.chart, None, verdict, logical.width())
    assert sum(len(lines) for _f, lines in layout.blocks) >= 3  # wrapped, not cut
    (_bold, caption), (_font, verdict_lines) = layout.blocks
    assert " ".join(caption).split() == window.chart.export_context().caption.split()
    assert " ".join(verdict_lines).split() == verdict.split()
    image = captioned_image(window.chart, size.scale, width=size.width, verdict=verdict)
    chart = chart_image(window.chart, size.scale, width=size.width)
    assert image.width() == chart.width() == (size.width or size.scale * on_screen.width())
    assert_caption_whole(image, chart, layout.height)
    assert window.chart.size() == on_screen  # laid out again for the image, then put back
    # the banner on the chart itself keeps all its words at this width
    banner = window.chart.verdict_label
    assert "…" not in banner.text()
    assert banner.sizeHint().height() <= banner.height() or banner.wordWrap()


def test_a_fixed_width_is_drawn_at_one_to_two_pixels_per_logical_pixel(
    window: MainWindow,
) -> None:
    with pytest.raises(ValueError, match="width must be"):
        chart_image(window.chart, width=0)
    # as on screen where that takes 1 to 2 pixels per logical pixel
    assert layout_for(QSize(880, 500), width=1200) == (QSize(880, 500), 1200 / 880)
    assert layout_for(QSize(880, 500), scale=3) == (QSize(880, 500), 3.0)
    # a narrow chart is laid out at half the width, a wide one at the width itself
    assert layout_for(QSize(600, 300), width=1920) == (QSize(960, 480), 2.0)
    assert layout_for(QSize(2000, 900), width=1200) == (QSize(1200, 540), 1.0)
    window.resize(2400, 1300)
    wide = window.chart.size()
    assert wide.width() > 1200
    image = captioned_image(window.chart, width=1200)
    assert image.width() == 1200 and image.devicePixelRatio() == 1.0
    assert image.size() == chart_export.image_pixels(window.chart, IMAGE_SIZES[3])
    assert window.chart.size() == wide


# -- the clipboard --------------------------------------------------------------------------
def test_copy_chart_puts_the_chart_under_its_caption(window: MainWindow) -> None:
    window.copy_chart_act.trigger()
    copied = QGuiApplication.clipboard().image()
    bare = chart_image(window.chart)
    header = chart_export._caption(window.chart, None, None).height
    assert copied.width() == bare.width()
    assert copied.height() == bare.height() + header and header > 0
    assert_caption_whole(copied, bare, header)


def test_copy_summary_puts_markdown_on_the_clipboard(window: MainWindow) -> None:
    assert window.copy_summary_act in window.menuBar().actions()[1].menu().actions()
    shortcut = window.copy_summary_act.shortcut()
    assert shortcut == QKeySequence("Ctrl+Shift+M")
    others = [a for a in window.findChildren(type(window.copy_summary_act)) if a.shortcuts()]
    assert [a for a in others if shortcut in a.shortcuts()] == [window.copy_summary_act]
    window.whatif.buttons["checkpointing"].setChecked(True)
    window.copy_summary_act.trigger()
    text = QGuiApplication.clipboard().text()
    est = window.store.estimate
    assert est is not None
    head = text.splitlines()[0]
    for part in ("Llama 3 8B", "lora", "bf16-mixed", "micro-batch 4 x 2,048 tokens"):
        assert part in head
    assert "1 x NVIDIA H100 SXM 80GB" in head and "framework pytorch" in head
    assert f"Verdict: **{est.verdict}**" in text
    for name in ("device", "allocated", "reserved"):
        assert f"{name} {getattr(est, f'{name}_bytes') / GIB:,.2f} GiB" in text
    assert "GiB = 2^30 bytes" in text
    assert "| category | item | GiB | formula |" in text
    for item in est.items:
        assert f"| {item.category} | {item.name} | {item.bytes / GIB:.4f} |" in text
    result = window.whatif.results["checkpointing"]
    row = next(r for r in text.splitlines() if r.startswith(f"| {result.whatif.label} |"))
    assert f"| {result.saved_bytes / GIB:+.2f} |" in row and result.compute_note in row
    assert window.statusBar().currentMessage().startswith("Summary copied")


def test_copy_summary_of_an_invalid_scenario_says_so(window: MainWindow) -> None:
    QGuiApplication.clipboard().setText("before")
    s = window.store.scenario
    window.store.edit(
        dataclasses.replace(
            s,
            hardware=dataclasses.replace(s.hardware, gpus_per_node=8),
            training=dataclasses.replace(s.training, parallelism=ParallelismSpec(tp=3)),
        )
    )
    assert window.store.estimate is None
    window.copy_summary()
    assert QGuiApplication.clipboard().text() == "before"
    assert "no valid estimate" in window.statusBar().currentMessage()


# -- the what-ifs in the data exports ------------------------------------------------------
def test_data_exports_carry_the_shown_whatifs(window: MainWindow, tmp_path: Path) -> None:
    window.export_data(tmp_path / "none.csv")
    assert "whatif" not in (tmp_path / "none.csv").read_text()
    for key in ("checkpointing", "8bit-optimizer"):
        window.whatif.buttons[key].setChecked(True)
    shown = window.shown_whatifs()
    assert all(window.whatif.results[key] in shown for key in window.whatif.checked())
    assert {"checkpointing", "8bit-optimizer"} <= {w.whatif.key for w in shown}
    est = window.store.estimate
    assert est is not None

    window.export_data(tmp_path / "d.csv")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "d.csv").read_text())))
    current = [r for r in rows if r["category"] != "whatif"]
    assert sum(int(r["bytes"]) for r in current if r["category"] in CATEGORIES) == (
        est.device_bytes
    )
    cells = {r["item"]: int(r["bytes"]) for r in rows if r["category"] == "whatif"}
    for w in shown:
        label = w.whatif.label
        assert cells[f"{label}: device"] == w.estimate.device_bytes
        assert cells[f"{label}: allocated"] == w.estimate.allocated_bytes
        assert cells[f"{label}: reserved"] == w.estimate.reserved_bytes
        for c in CATEGORIES:
            assert cells[f"{label}: {c}"] == w.estimate.breakdown[c]
        assert cells[f"{label}: saving vs current"] == est.device_bytes - w.estimate.device_bytes

    window.export_data(tmp_path / "d.json")
    data = json.loads((tmp_path / "d.json").read_text())
    assert [w["label"] for w in data.pop("whatifs")] == [w.whatif.label for w in shown]
    assert data == est.to_dict()

    window.export_data(tmp_path / "d.md")
    text = (tmp_path / "d.md").read_text()
    assert all(f"| {w.whatif.label} |" in text for w in shown)


def test_a_pinned_baseline_goes_into_the_data_and_the_summary(
    window: MainWindow, tmp_path: Path
) -> None:
    window.pin_baseline_act.trigger()
    baseline = window.baseline
    assert baseline is not None
    s = window.store.scenario
    window.store.edit(
        dataclasses.replace(s, training=dataclasses.replace(s.training, micro_batch_size=8))
    )
    est = window.store.estimate
    assert est is not None and est != baseline
    window.export_data(tmp_path / "b.json")
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["baseline"]["device_bytes"] == baseline.device_bytes
    assert data["baseline"]["current_minus_baseline_bytes"] == (
        est.device_bytes - baseline.device_bytes
    )
    window.copy_summary_act.trigger()
    assert "Pinned baseline: " in QGuiApplication.clipboard().text()
    window.clear_baseline_act.trigger()
    window.export_data(tmp_path / "c.json")
    assert "baseline" not in json.loads((tmp_path / "c.json").read_text())
