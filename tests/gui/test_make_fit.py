"""The Make it fit tab driven as a user would: the fixes of a scenario that does not fit,
applying one (double-click, Apply) and undoing it, a scenario that fits, following edits,
an invalid scenario, and the exports."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage
from pytestqt.qtbot import QtBot

from memfit.engine.estimate import GIB, estimate
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.solve import fits, make_it_fit
from memfit.engine.specs import HardwareSpec, Scenario, TrainingSpec
from memfit.engine.steptime import step_time
from memfit.engine.sweep import NUMERICS_MARK, numerics_changed
from memfit.gui.main_window import MainWindow
from memfit.gui.make_fit import MINUS, find_fixes
from memfit.gui.tradeoffs import TradeoffsView
from tests.gui.helpers import bad_mesh

WAIT_MS = 60_000
FIT_TAB = 3


def too_big() -> Scenario:
    """Llama 3 8B full fine-tuning, micro-batch 8, sequence 4,096 on one H100 SXM 80GB."""
    return Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb")),
        TrainingSpec(method="full", micro_batch_size=8, sequence_length=4096),
    )


def shown(window: MainWindow, qtbot: QtBot, scenario: Scenario | None = None) -> TradeoffsView:
    """The Make it fit tab shown, its fixes for ``scenario`` (or the current one) in."""
    if scenario is not None:
        window.store.reset(scenario)
    view = window.tradeoffs
    view.tabs.setCurrentIndex(FIT_TAB)
    window.views.setCurrentWidget(view)
    qtbot.waitExposed(view)
    wait_current(view, qtbot)
    return view


def wait_current(view: TradeoffsView, qtbot: QtBot) -> None:
    def current() -> bool:
        result = view.fit_view.result()
        return (
            result is not None
            and result.scenario == view.store.scenario
            and not view.fit_view.is_stale()
        )

    qtbot.waitUntil(current, timeout=WAIT_MS)


def test_the_tab_sits_after_hardware(window: MainWindow) -> None:
    tabs = window.tradeoffs.tabs
    assert [tabs.tabText(i) for i in range(tabs.count())] == [
        "Map",
        "Curves",
        "Hardware",
        "Make it fit",
        "Shapes",
    ]


def test_fixes_of_a_scenario_that_does_not_fit_are_listed_fastest_first(
    window: MainWindow, qtbot: QtBot
) -> None:
    assert not fits(too_big())
    view = shown(window, qtbot, too_big())
    fv = view.fit_view
    fixes = fv.fixes()
    assert [f.scenario for f in fixes] == [f.scenario for f in make_it_fit(too_big())]
    assert len(fixes) >= 2 and fv.table.rowCount() == len(fixes)
    speeds = [f.time.tokens_per_s for f in fixes]
    assert speeds == sorted(speeds, reverse=True)
    for f in fixes:
        assert f.device_bytes <= f.budget_bytes and fits(f.scenario)
    est = estimate(too_big())
    assert fv.summary.text().startswith(
        f"Does not fit: {est.device_bytes / GIB:,.1f} GiB per GPU, over the budget of "
        f"{est.budget_bytes / GIB:,.1f} GiB."
    )
    base = step_time(too_big()).step_time_s
    first = fixes[0]
    assert fv.cell_text(0, "#") == "1"
    mark = f" {NUMERICS_MARK}" if numerics_changed(too_big(), first.scenario) else ""
    assert fv.cell_text(0, "Changes") == " + ".join(first.labels) + mark
    assert fv.cell_text(0, "Memory per GPU") == f"{first.device_bytes / GIB:.1f} GiB"
    assert fv.cell_text(0, "Memory change") == (
        f"{MINUS}{(est.device_bytes - first.device_bytes) / GIB:.1f} GiB"
    )
    assert fv.cell_text(0, "Tokens/s") == f"{first.time.tokens_per_s:,.0f}"
    change = (step_time(first.scenario).step_time_s / base - 1) * 100
    assert fv.cell_text(0, "Step time change").endswith(f"{abs(change):.1f} %")
    assert fv.cell_text(0, "MFU") == f"{first.time.mfu * 100:.1f} %"
    assert fv.cell_text(0, "Bound") == first.time.bound.replace("_", " ")
    assert fv.apply_button.isEnabled()  # the first row is selected


def test_double_clicking_a_fix_applies_it_and_undo_restores(
    window: MainWindow, qtbot: QtBot
) -> None:
    view = shown(window, qtbot, too_big())
    table = view.fit_view.table
    fix = view.fit_view.fixes()[1]
    rect = table.visualRect(table.model().index(1, 1))
    # a real double-click starts with a press: the view acts on the index pressed
    qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    qtbot.mouseDClick(table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert window.store.scenario == fix.scenario
    assert window.store.undo_stack.undoText() == "Apply " + " + ".join(fix.labels)
    assert view.fit_view.is_stale()  # the fixes shown are of the scenario before
    wait_current(view, qtbot)
    assert view.fit_view.summary.text().startswith("Fits already")
    window.undo_act.trigger()
    assert window.store.scenario == too_big()
    wait_current(view, qtbot)
    assert view.fit_view.fixes()


def test_apply_applies_the_selected_fix(window: MainWindow, qtbot: QtBot) -> None:
    view = shown(window, qtbot, too_big())
    fix = view.fit_view.fixes()[-1]
    view.fit_view.table.selectRow(len(view.fit_view.fixes()) - 1)
    qtbot.mouseClick(view.fit_view.apply_button, Qt.MouseButton.LeftButton)
    assert window.store.scenario == fix.scenario
    window.store.undo_stack.undo()
    assert window.store.scenario == too_big()


def test_a_stale_fix_is_never_applied(window: MainWindow, qtbot: QtBot) -> None:
    view = shown(window, qtbot, too_big())
    fix = view.fit_view.fixes()[0]
    window.training_panel.rows["training.sequence_length"].widget.setValue(2048)
    edited = window.store.scenario
    assert view.fit_view.is_stale() and not view.fit_view.apply_button.isEnabled()
    view.apply_fix(fix)
    assert window.store.scenario == edited
    wait_current(view, qtbot)  # and the tab follows the edit
    assert view.fit_view.result().scenario == edited  # type: ignore[union-attr]


def test_a_fitting_scenario_says_it_fits(window: MainWindow, qtbot: QtBot) -> None:
    small = Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb")),
        TrainingSpec(method="lora", micro_batch_size=1, sequence_length=2048),
    )
    view = shown(window, qtbot, small)
    est = window.store.estimate
    assert est is not None and est.device_bytes <= est.budget_bytes
    text = view.fit_view.summary.text()
    assert text == (
        f"Fits already: {est.device_bytes / GIB:,.1f} of {est.budget_bytes / GIB:,.1f} GiB "
        "per GPU; nothing to change."
    )
    assert view.fit_view.table.rowCount() == 0
    assert not view.fit_view.apply_button.isEnabled()


def test_an_invalid_scenario_says_why(window: MainWindow, qtbot: QtBot) -> None:
    view = shown(window, qtbot)
    window.store.edit(bad_mesh())
    qtbot.waitUntil(
        lambda: view.fit_view.summary.text().startswith("Nothing to fit: "), timeout=WAIT_MS
    )
    assert view.fit_view.is_stale()


def test_find_fixes_needs_no_qt() -> None:
    result = find_fixes(too_big())
    assert not result.fits and result.fixes
    assert find_fixes(result.fixes[0].scenario).fixes == ()


def test_exports_write_csv_png_and_svg(window: MainWindow, qtbot: QtBot, tmp_path: Path) -> None:
    view = shown(window, qtbot, too_big())
    for suffix in ("csv", "png", "svg"):
        view.export_fixes(tmp_path / f"fixes.{suffix}")
        assert (tmp_path / f"fixes.{suffix}").stat().st_size > 0
    rows = list(csv.DictReader(io.StringIO((tmp_path / "fixes.csv").read_text())))
    fixes = view.fit_view.fixes()
    assert [r["rank"] for r in rows] == [str(i) for i in range(1, len(fixes) + 1)]
    assert [r["changes"] for r in rows] == [
        " + ".join(f.labels)
        + (f" {NUMERICS_MARK}" if numerics_changed(too_big(), f.scenario) else "")
        for f in fixes
    ]
    assert [int(r["device_bytes"]) for r in rows] == [f.device_bytes for f in fixes]
    assert float(rows[0]["tokens_per_s"]) == pytest.approx(fixes[0].time.tokens_per_s)
    assert not QImage(str(tmp_path / "fixes.png")).isNull()


def test_nothing_to_export_says_so(window: MainWindow, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no fixes"):
        window.tradeoffs.export_fixes(tmp_path / "fixes.csv")
