"""The biggest block explained (Activations by Source) and the step over time (Memory over
Time): the tabs under the chart follow the scenario while shown, add up to the estimate,
name the change that removes the largest source, and mark the peak."""

from __future__ import annotations

import dataclasses

import pyqtgraph as pg
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from memfit.engine.estimate import GIB, estimate
from memfit.engine.explain import explained
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, Scenario, TrainingSpec
from memfit.gui.main_window import MainWindow
from memfit.gui.step_view import OUT_OF_DATE, moment_text
from tests.gui.helpers import bad_mesh

LONG = Scenario(
    load_model("llama-3-8b"),
    HardwareSpec(load_gpu("h100-sxm-80gb")),
    TrainingSpec(
        method="lora",
        precision="bf16-mixed",
        micro_batch_size=4,
        sequence_length=8192,
        activation_checkpointing="full",
    ),
)


def _top_rows(window: MainWindow) -> list[list[str]]:
    tree = window.activations.tree
    return [
        [tree.topLevelItem(i).text(c) for c in range(tree.columnCount())]
        for i in range(tree.topLevelItemCount())
    ]


def test_the_activations_tab_tells_the_peak_apart_and_names_the_chunked_loss(
    window: MainWindow, qtbot: QtBot
) -> None:
    window.store.reset(LONG)
    window.activations_act.trigger()
    assert window.details.currentWidget() is window.activations
    est = estimate(LONG)
    rows = _top_rows(window)
    groups = explained(est)
    assert [r[0] for r in rows] == [g.title for g in groups]
    # the largest is the logits, and the row says what a chunked loss saves, in GiB
    assert rows[0][0] == "Logits and loss"
    # the largest is the logits, and a row of its own says what a chunked loss saves,
    # in GiB; the heading says it too
    fix = window.activations.tree.topLevelItem(0).child(0).text(0)
    assert fix.startswith("→ saves ") and "Chunked loss" in fix
    saved = f"{groups[0].remedy.saved_bytes / GIB:.1f} GiB"  # type: ignore[union-attr]
    assert saved in fix and saved in window.activations.heading.text()
    # the GiB cells add up to the activations of the breakdown (each rounded to 0.01)
    shown = sum(float(r[1].replace(",", "")) for r in rows)
    assert shown == pytest.approx(est.breakdown["activations"] / GIB, abs=0.01 * len(rows))
    # each source carries its formula, and its tooltip where the formula comes from
    child = window.activations.tree.topLevelItem(0).child(1)
    assert child.text(3) and "From: engine." in child.toolTip(0)
    assert moment_text(est.steps.peak) in window.activations.heading.text()  # type: ignore[union-attr]


def test_a_hidden_tab_waits_and_catches_up_when_shown(window: MainWindow) -> None:
    window.show_details(window.table)
    window.store.reset(LONG)
    assert window.activations.groups == ()  # never computed while hidden
    window.show_details(window.activations)
    assert window.activations.groups and window.activations.groups[0].kind == "logits"
    short = dataclasses.replace(LONG, training=dataclasses.replace(LONG.training, loss="chunked"))
    window.store.reset(short)  # shown: follows at once
    assert window.activations.groups[0].kind != "logits"


def test_both_tabs_say_when_the_scenario_is_out_of_date(window: MainWindow, qtbot: QtBot) -> None:
    window.show_details(window.activations)
    window.store.reset(bad_mesh())
    assert window.store.estimate is None
    assert window.activations.heading.text() == OUT_OF_DATE
    assert not window.activations.tree.isEnabled()
    window.show_details(window.step_view)
    assert window.step_view.note.text() == OUT_OF_DATE and window.step_view.points == ()


def test_memory_over_time_plays_every_moment_and_marks_the_peak(window: MainWindow) -> None:
    window.store.reset(LONG)
    window.step_view_act.trigger()
    assert window.details.currentWidget() is window.step_view
    est = estimate(LONG)
    view = window.step_view
    assert view.points == est.timeline
    lines = [i for i in view.item.items if isinstance(i, pg.InfiniteLine)]
    peak = [ln for ln in lines if ln.angle == 90]
    assert len(peak) == 1 and peak[0].value() == est.steps.peak_index  # type: ignore[union-attr]
    assert peak[0].label.toPlainText().startswith("Peak: backward")
    # the room for tensors: capacity less what the device holds beyond them at the peak
    room = [ln for ln in lines if ln.angle == 0]
    beyond = est.device_bytes - est.steps.peak.total  # type: ignore[union-attr]
    assert room and room[0].value() == pytest.approx((est.capacity_bytes - beyond) / GIB)
    # a stacked area per category, whose top is each moment's total
    curves = [i for i in view.item.items if isinstance(i, pg.PlotCurveItem)]
    top = curves[-1].getData()[1]
    assert top == pytest.approx([p.total / GIB for p in est.timeline])
    text = view.text_at(est.steps.peak_index)  # type: ignore[union-attr]
    assert "loss and LM head" in text and "Activations:" in text and "GiB" in text
    assert view.text_at(len(est.timeline)) == ""
    # the phases and their moments under the x axis
    first_backward = [p.phase for p in est.timeline].index("backward")
    bottom = view.item.getAxis("bottom").labelText
    assert f"backward {first_backward}–" in bottom and "optimizer " in bottom


def test_the_tabs_have_keys_and_room(window: MainWindow, qtbot: QtBot) -> None:
    assert window.details.currentWidget() is window.table  # the items come first
    qtbot.keyClick(window, Qt.Key.Key_4, Qt.KeyboardModifier.ControlModifier)
    assert window.details.currentWidget() is window.step_view
    sizes = window.memory_split.sizes()
    assert sizes[1] >= 0.39 * sum(sizes)  # a plot gets room when it is shown
    qtbot.keyClick(window, Qt.Key.Key_3, Qt.KeyboardModifier.ControlModifier)
    assert window.details.currentWidget() is window.activations
    window.table_act.setChecked(False)
    assert not window.details.isVisible()
    window.step_view_act.trigger()  # asking for a tab shows the details again
    assert window.details.isVisible() and window.table_act.isChecked()


def test_memory_over_time_follows_dark_mode(window: MainWindow, qapp: QApplication) -> None:
    window.show_details(window.step_view)
    try:
        for theme in ("dark", "light"):
            window.set_theme(theme, save=False)
            qapp.processEvents()
            background = window.step_view.plot.backgroundBrush().color()
            assert (background.lightness() < 128) == (theme == "dark")
    finally:
        window.set_theme("system", save=False)


def test_double_clicking_the_activations_item_opens_them_by_source(window: MainWindow) -> None:
    window.store.reset(LONG)
    table = window.table
    rows = {table.item(r, 1).text(): r for r in range(table.rowCount())}
    assert "Ctrl+3" in table.item(rows["activations"], 0).toolTip()
    table.cellDoubleClicked.emit(rows["parameters"], 0)
    assert window.details.currentWidget() is window.table  # other items stay put
    table.cellDoubleClicked.emit(rows["activations"], 0)
    assert window.details.currentWidget() is window.activations
    assert window.activations.groups[0].kind == "logits"
