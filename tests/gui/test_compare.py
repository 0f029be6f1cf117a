"""Comparisons: a pinned baseline drawn as a hatched bar of its own beside the current one,
with the difference; several ticked what-ifs drawn as one combined ghost, applied in one
undoable step."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings, QSize, Qt
from PySide6.QtGui import QColor, QKeySequence
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QMenu
from pytestqt.qtbot import QtBot

from memfit.engine.estimate import GIB, Estimate, estimate
from memfit.engine.model_state import CATEGORIES
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import Scenario
from memfit.engine.whatif import COMBINED_KEY, WhatIfResult, combined
from memfit.gui.chart import BASELINE_PATTERN, CATEGORY_COLOURS, BreakdownChart, Ghost, gib_text
from memfit.gui.main_window import MainWindow
from memfit.gui.store import default_scenario
from memfit.gui.whatif_bar import COMBINED_LABEL
from tests.gui.helpers import bad_mesh, type_into
from tests.gui.test_chart import double_click
from tests.gui.test_chart_labels import (
    SIZES,
    full_8b,
    huge,
    lines_over_bars,
    lora,
    outside,
    overlapping,
    settle,
    some_ghosts,
    struck_totals,
)


def seventy_b_on_a100(s: Scenario) -> Scenario:
    hardware = dataclasses.replace(s.hardware, gpu=load_gpu("a100-sxm-80gb"))
    return dataclasses.replace(s, model=load_model("llama-3.1-70b"), hardware=hardware)


def full(s: Scenario) -> Scenario:
    return dataclasses.replace(s, training=dataclasses.replace(s.training, method="full"))


# -- the pinned baseline ---------------------------------------------------------------


def test_pin_and_clear_are_view_menu_actions_with_free_keys(window: MainWindow) -> None:
    assert window.pin_baseline_act.shortcut() == QKeySequence("Ctrl+Shift+P")
    view = next(m for m in window.menuBar().findChildren(QMenu) if m.title() == "&View")
    assert window.pin_baseline_act in view.actions()
    assert window.clear_baseline_act in view.actions()
    assert not window.clear_baseline_act.isEnabled()  # nothing pinned yet
    taken = [
        a.shortcut().toString()
        for a in window.findChildren(type(window.pin_baseline_act))
        if a is not window.pin_baseline_act and not a.shortcut().isEmpty()
    ]
    assert "Ctrl+Shift+P" not in taken


def test_a_pinned_baseline_is_a_bar_of_its_own_with_the_difference(window: MainWindow) -> None:
    chart = window.chart
    pinned = window.store.estimate
    assert pinned is not None
    window.pin_baseline_act.trigger()
    assert window.baseline is pinned
    assert window.clear_baseline_act.isEnabled()
    assert "Pinned as the baseline: Llama 3 8B" in window.statusBar().currentMessage()
    # the same scenario: said, not drawn twice
    assert chart.baseline_bar() is None
    assert chart.current_bar_count() == 1 and len(chart.x_labels()) == 1
    assert chart.x_labels()[0] == "current\nsame as pinned"
    assert chart.baseline_text() == "same as the current scenario"

    window.store.edit(seventy_b_on_a100(window.store.scenario), "Change Model")
    current = window.store.estimate
    assert current is not None and current.scenario.model.name == "llama-3.1-70b"
    assert chart.current_bar_count() == 1
    index = chart.baseline_bar()
    assert index == 1
    label = chart.x_labels()[index].replace("\n", " ")
    assert label.startswith("Pinned: Llama 3 8B, LoRA, 1 x H100 SXM 80GB")
    more = current.device_bytes - pinned.device_bytes
    assert more > 0
    assert label.endswith(f"current +{gib_text(more)}")
    assert chart.baseline_text().endswith(f"current +{gib_text(more)}")
    assert chart.x_labels()[0] == "current"
    # the bar is the pinned estimate's breakdown, to the byte
    heights = chart.segments(index)
    for cat in CATEGORIES:
        assert heights[cat][1] == pytest.approx(pinned.breakdown[cat] / GIB)
    assert sum(h for _b, h in heights.values()) == pytest.approx(pinned.device_bytes / GIB)
    # drawn hatched and outlined in the category colours, not as a ghost or a current bar
    for cat in CATEGORIES:
        item = chart.baseline_bars[cat]
        assert item.opts["brush"].style() == BASELINE_PATTERN
        assert item.opts["pen"].color().name().lower() == CATEGORY_COLOURS[cat].lower()
    assert chart.ghost_key(index) is None  # double-clicking it applies nothing
    tip = chart.tooltip_at(index, 1.0)
    assert "Pinned baseline: Llama 3 8B · LoRA" in tip and "H100" in tip


def test_the_baseline_survives_edits_undo_and_a_new_document(window: MainWindow) -> None:
    pinned = window.store.estimate
    window.pin_baseline_act.trigger()
    window.store.edit(seventy_b_on_a100(window.store.scenario), "Change Model")
    type_into(window.training_panel.rows["training.micro_batch_size"].widget, "1")
    assert window.store.scenario.training.micro_batch_size == 1
    assert window.baseline is pinned  # frozen: never re-estimated
    assert window.chart.baseline_bar() == 1
    window.undo_act.trigger()
    window.undo_act.trigger()
    assert window.store.scenario == pinned.scenario  # type: ignore[union-attr]
    assert window.chart.baseline_text() == "same as the current scenario"
    window.new_scenario()
    assert window.baseline is pinned
    if window.store.scenario != pinned.scenario:  # type: ignore[union-attr]
        assert window.chart.baseline_bar() == 1


def test_clear_baseline_removes_its_bar(window: MainWindow) -> None:
    window.pin_baseline_act.trigger()
    window.store.edit(seventy_b_on_a100(window.store.scenario), "Change Model")
    assert window.chart.baseline_bar() == 1
    window.clear_baseline_act.trigger()
    assert window.baseline is None
    assert window.chart.baseline_bar() is None and window.chart.baseline_text() == ""
    assert window.chart.x_labels() == ["current"]
    assert not window.clear_baseline_act.isEnabled()


def test_nothing_is_pinned_while_the_scenario_is_invalid(window: MainWindow) -> None:
    window.store.edit(bad_mesh(), "Break it")
    assert window.store.estimate is None
    window.pin_baseline_act.trigger()
    assert window.baseline is None
    assert "Nothing to pin" in window.statusBar().currentMessage()


def test_pinning_again_replaces_the_baseline(window: MainWindow) -> None:
    window.pin_baseline_act.trigger()
    window.store.edit(seventy_b_on_a100(window.store.scenario), "Change Model")
    window.pin_baseline_act.trigger()
    assert window.baseline is window.store.estimate
    assert window.chart.baseline_text() == "same as the current scenario"


def test_ghosts_come_after_the_baseline_and_still_apply(window: MainWindow, qtbot: QtBot) -> None:
    window.pin_baseline_act.trigger()
    window.store.edit(seventy_b_on_a100(window.store.scenario), "Change Model")
    window.whatif.buttons["checkpointing"].setChecked(True)
    chart = window.chart
    assert chart.baseline_bar() == 1 and chart.ghost_key(2) == "checkpointing"
    expected = window.whatif.results["checkpointing"].scenario
    with qtbot.waitSignal(chart.ghostActivated, timeout=1000):
        double_click(qtbot, chart, 2.0, 3.0)
    assert window.store.scenario == expected
    assert chart.baseline_bar() == 1  # still pinned after applying a what-if


def test_baseline_keeps_its_style_in_the_dark_theme(window: MainWindow) -> None:
    window.pin_baseline_act.trigger()
    window.store.edit(seventy_b_on_a100(window.store.scenario), "Change Model")
    window.set_theme("dark", save=False)
    QApplication.processEvents()  # the palette reaches the chart
    try:
        chart = window.chart
        background = chart.palette().color(chart.palette().ColorRole.Base)
        assert background.lightness() < 100  # dark indeed
        for cat in CATEGORIES:
            pen = chart.baseline_bars[cat].opts["pen"]
            assert pen.color().name().lower() == CATEGORY_COLOURS[cat].lower()
            assert chart.baseline_bars[cat].opts["brush"].style() == BASELINE_PATTERN
        assert chart.baseline_bar() == 1
    finally:
        window.set_theme("light", save=False)


def test_a_stale_chart_greys_the_baseline_and_drops_its_difference(window: MainWindow) -> None:
    window.pin_baseline_act.trigger()
    window.store.edit(full(seventy_b_on_a100(window.store.scenario)), "Change Model")
    window.store.edit(bad_mesh(), "Break it")
    chart = window.chart
    assert chart.is_stale()
    index = chart.baseline_bar()
    assert index is not None
    assert "current" not in chart.x_labels()[index].split("\n")[-1]
    colours = {QColor(chart.baseline_bars[cat].opts["pen"].color()).name() for cat in CATEGORIES}
    assert len(colours) == 1  # one grey


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s.width()}x{s.height()}")
@pytest.mark.parametrize("current", [lora, full_8b, huge], ids=["lora", "full-8b", "70b"])
def test_baseline_labels_never_overlap(qtbot: QtBot, size: QSize, current: object) -> None:
    chart = BreakdownChart()
    qtbot.addWidget(chart)
    chart.show()
    qtbot.waitExposed(chart)
    chart.resize(size * 0.7)
    now: Estimate = current()  # type: ignore[operator]
    pinned = lora() if now is not lora() else full_8b()
    combined_ghost = Ghost(
        COMBINED_KEY, COMBINED_LABEL, full_8b(), "fits · -1.00 GiB · without LoRA (r=16)"
    )
    chart.set_estimates(now, [*some_ghosts(), combined_ghost], pinned)
    settle(qtbot)
    assert chart.baseline_bar() == 1
    assert overlapping(chart) == []
    assert struck_totals(chart) == []
    assert outside(chart) == []
    assert lines_over_bars(chart) == []


# -- combined what-ifs -----------------------------------------------------------------


def tick(window: MainWindow, *keys: str) -> None:
    for key in keys:
        button = window.whatif.buttons[key]
        assert button.isEnabled(), key
        button.setChecked(True)


def together(window: MainWindow, *keys: str) -> None:
    """Tick ``keys`` and All Together, as a user clicks them."""
    tick(window, *keys)
    button = window.whatif.together
    assert button.isEnabled() and button.isVisible()
    if not button.isChecked():
        QTest.mouseClick(button, Qt.MouseButton.LeftButton)
    assert button.isChecked()


def test_all_together_needs_two_ticked_what_ifs(window: MainWindow) -> None:
    bar = window.whatif
    assert not bar.together.isEnabled()
    tick(window, "checkpointing")
    assert not bar.together.isEnabled()  # one: its own ghost says it all
    assert "tick two or more" in bar.together.toolTip()
    bar.together.setChecked(True)
    assert bar.combined is None
    assert window.chart.x_labels()[-1].split("\n")[0] != COMBINED_LABEL


def test_the_combined_ghost_is_opt_in(window: MainWindow) -> None:
    """Ticking several shows each alone; All Together adds the one with all of them."""
    window.store.edit(full(window.store.scenario), "Full")
    tick(window, "8bit-optimizer", "checkpointing")
    assert window.whatif.together.isEnabled()
    assert window.whatif.combined is None and len(window.chart.x_labels()) == 3
    # its tooltip already says what it would hold
    assert "Combined: 8-bit AdamW + Gradient checkpointing" in window.whatif.together.toolTip()
    QTest.mouseClick(window.whatif.together, Qt.MouseButton.LeftButton)
    assert window.whatif.combined is not None and len(window.chart.x_labels()) == 4
    QTest.mouseClick(window.whatif.together, Qt.MouseButton.LeftButton)
    assert window.whatif.combined is None and len(window.chart.x_labels()) == 3


def test_two_ticked_what_ifs_add_a_combined_ghost(window: MainWindow) -> None:
    window.store.edit(full(window.store.scenario), "Full")
    together(window, "8bit-optimizer", "checkpointing")
    bar = window.whatif
    labels = window.chart.x_labels()
    assert len(labels) == 4  # current, two ghosts, combined
    assert labels[-1].split("\n")[0] == COMBINED_LABEL
    assert window.chart.ghost_key(3) == COMBINED_KEY
    scenario, current = window.store.scenario, window.store.estimate
    assert current is not None
    expected = combined(scenario, current, ["8bit-optimizer", "checkpointing"])
    assert isinstance(expected, WhatIfResult)
    assert bar.combined == expected
    by_hand = dataclasses.replace(
        scenario,
        training=dataclasses.replace(
            scenario.training, optimizer="adamw-8bit", activation_checkpointing="full"
        ),
    )
    assert bar.combined.estimate.device_bytes == estimate(by_hand).device_bytes
    total = sum(h for _b, h in window.chart.segments(3).values())
    assert total == pytest.approx(estimate(by_hand).device_bytes / GIB)
    assert "without" not in labels[-1]
    tip = window.chart.tooltip_at(3, 1.0)
    assert "Combined: 8-bit AdamW + Gradient checkpointing" in tip


def test_applying_the_combined_ghost_is_one_undo_step(window: MainWindow) -> None:
    window.store.edit(full(window.store.scenario), "Full")
    before = window.store.scenario
    together(window, "8bit-optimizer", "checkpointing")
    assert window.whatif.combined is not None
    expected = window.whatif.combined.scenario
    window.whatif._together_menu().actions()[1].trigger()
    assert window.store.scenario == expected
    t = window.store.scenario.training
    assert (t.optimizer, t.activation_checkpointing) == ("adamw-8bit", "full")
    assert window.store.undo_stack.undoText() == "Apply 2 What-ifs Together"
    assert not window.whatif.buttons["checkpointing"].isChecked()
    assert window.whatif.combined is None
    window.undo_act.trigger()
    assert window.store.scenario == before


def test_the_combined_ghost_applies_by_double_click_enter_and_menu(
    window: MainWindow, qtbot: QtBot
) -> None:
    window.store.edit(full(window.store.scenario), "Full")
    before = window.store.scenario
    bar = window.whatif

    together(window, "8bit-optimizer", "checkpointing")
    expected = bar.combined.scenario  # type: ignore[union-attr]
    with qtbot.waitSignal(window.chart.ghostActivated, timeout=1000) as blocker:
        double_click(qtbot, window.chart, 3.0, 3.0)
    assert blocker.args == [COMBINED_KEY]
    assert window.store.scenario == expected
    window.undo_act.trigger()
    assert window.store.scenario == before

    together(window, "8bit-optimizer", "checkpointing")
    bar.together.setFocus()
    QTest.keyClick(bar.together, Qt.Key.Key_Return)
    assert window.store.scenario == expected
    window.undo_act.trigger()

    together(window, "8bit-optimizer", "checkpointing")
    menu = bar._menu("checkpointing")
    entry = menu.actions()[-1]
    assert entry.text() == "Apply All Ticked Together"
    entry.trigger()
    assert window.store.scenario == expected
    # with nothing combined, the menus have no such entry, or have it off
    texts = [a.text() for a in bar._menu("checkpointing").actions()]
    assert texts == ["Show Ghost Bar", "Apply This Change"]
    assert not bar._together_menu().actions()[1].isEnabled()


def test_conflicting_what_ifs_are_skipped_with_a_note(window: MainWindow) -> None:
    window.store.edit(full(window.store.scenario), "Full")
    bar = window.whatif
    together(window, "lora", "qlora")
    # only QLoRA can be made: the combined ghost is QLoRA, saying what it is without
    assert bar.combined is not None and bar.combined.applied == ("qlora",)
    last = window.chart.x_labels()[-1].replace("\n", " ")
    assert last.startswith(COMBINED_LABEL) and last.endswith("without LoRA (r=16)")
    tip = bar.together.toolTip()
    assert "skipped LoRA (r=16): conflicts with QLoRA (4-bit base)" in tip
    assert "conflicts with QLoRA" in window.chart.tooltip_at(3, 1.0)
    bar.apply(COMBINED_KEY)
    assert window.store.scenario.training.method == "qlora"
    assert window.store.undo_stack.undoText() == "Apply QLoRA (4-bit base)"
    window.undo_act.trigger()

    together(window, "lora", "qlora", "checkpointing")
    assert bar.combined is not None
    assert bar.combined.applied == ("qlora", "checkpointing")
    assert bar.combined.scenario.training.method == "qlora"


def test_the_combined_ghost_goes_while_the_scenario_is_invalid(window: MainWindow) -> None:
    window.store.edit(full(window.store.scenario), "Full")
    together(window, "8bit-optimizer", "checkpointing")
    assert window.whatif.combined is not None
    window.store.edit(bad_mesh(), "Break it")
    assert window.whatif.combined is None and not window.whatif.together.isEnabled()


def test_all_together_sits_after_the_shown_toggles(window: MainWindow) -> None:
    bar = window.whatif
    order = bar._grid.widgets()
    shown = [b for b in bar.buttons.values() if not b.isHidden()]
    assert order.index(bar.together) == max(order.index(b) for b in shown) + 1


def test_render_a_comparison(window: MainWindow, qtbot: QtBot, tmp_path: Path) -> None:
    """The whole window with a pinned baseline and a combined ghost grabs as an image."""
    window.pin_baseline_act.trigger()
    window.store.edit(full(seventy_b_on_a100(window.store.scenario)), "Change Model")
    window.set_theme("light", save=False)
    together(window, "8bit-optimizer", "checkpointing")
    settle(qtbot)
    assert window.chart.baseline_bar() == 1
    assert window.chart.x_labels()[-1].startswith(COMBINED_LABEL.split()[0])
    assert overlapping(window.chart) == []
    assert window.grab().save(str(tmp_path / "compare.png"))


def test_the_pinned_baseline_is_kept_across_a_restart(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The pinned baseline was lost when the app closed."""
    first = start(scenario=default_scenario())
    first.store.edit(seventy_b_on_a100(first.store.scenario), "Change Model")
    pinned = first.store.estimate
    assert pinned is not None
    first.pin_baseline_act.trigger()
    first.close()
    second = start(scenario=default_scenario())
    assert second.baseline is not None
    assert second.baseline.scenario == pinned.scenario
    assert second.baseline.device_bytes == pinned.device_bytes
    assert second.clear_baseline_act.isEnabled()
    assert second.chart.baseline_bar() == 1  # drawn beside the (default) current scenario
    second.clear_baseline_act.trigger()
    second.close()
    third = start(scenario=default_scenario())
    assert third.baseline is None and not third.clear_baseline_act.isEnabled()
    third.close()
    # a baseline that no longer reads is dropped, and said
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    settings.setValue("view/baseline", '{"memfit_scenario": 1, "model": 7}')
    settings.sync()
    fourth = start(scenario=default_scenario())
    assert fourth.baseline is None
    assert any("the pinned baseline" in m for m in fourth.notice.messages())
