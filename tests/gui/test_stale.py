"""A stale verdict is never shown as current: while the engine rejects the scenario the
chart, banner, status bar, table and what-ifs say so, with the engine's message."""

from __future__ import annotations

from pathlib import Path

import pyqtgraph as pg
from PySide6.QtGui import QColor
from pytestqt.qtbot import QtBot

from memfit.engine.estimate import estimate
from memfit.engine.model_state import CATEGORIES
from memfit.engine.scenario_io import save_scenario
from memfit.gui.chart import CATEGORY_COLOURS, STALE_ALPHA, BreakdownChart, Ghost
from memfit.gui.forms import in_user_words
from memfit.gui.main_window import MainWindow
from memfit.gui.readout import status_summary
from memfit.gui.store import default_scenario
from tests.gui.helpers import bad_mesh, ini, type_into


def brush(chart: BreakdownChart, cat: str, ghost: bool = False) -> QColor:
    item = (chart.ghost_bars if ghost else chart.bars)[cat]
    return QColor(pg.mkBrush(item.opts["brush"]).color())


def assert_current(window: MainWindow) -> None:
    est = window.store.estimate
    assert est is not None and not window.chart.is_stale()
    assert " per GPU of " in window.chart.verdict_text()
    assert window.summary.text().startswith(status_summary(est)) and window.table.isEnabled()
    assert (
        brush(window.chart, "parameters").name().lower() == CATEGORY_COLOURS["parameters"].lower()
    )


def test_a_rejected_edit_marks_the_chart_and_everything_else_stale(window: MainWindow) -> None:
    window.whatif.buttons["8bit-optimizer"].setChecked(True)
    par = window.parallelism_panel.rows
    window.hardware_panel.rows["hardware.gpus_per_node"].widget.setValue(8)
    assert_current(window)
    type_into(par["training.parallelism.tp"].widget, "3")  # does not divide 8 GPUs
    assert window.store.scenario.training.parallelism.tp == 3 and window.store.estimate is None
    chart = window.chart
    said = in_user_words(window.store.error)  # the engine's message in the panels' words
    assert chart.is_stale() and chart.stale_reason() == said
    banner = chart.verdict_text()
    assert banner.startswith(f"Out of date: {said}\n")
    assert window.store.error.startswith("training.parallelism")
    for verdict in ("Fits", "Tight", "Does not fit"):
        assert verdict not in banner
    # the last bars stay, in grey, named for what they are
    assert chart.current_bar_count() == 1 and chart.x_labels()[0] == "last valid"
    for cat in CATEGORIES:
        assert brush(chart, cat).alpha() == STALE_ALPHA[0]
        assert brush(chart, cat).name() == brush(chart, "parameters").name()
    assert brush(chart, "parameters", ghost=True).alpha() == STALE_ALPHA[1]
    assert "GiB per GPU" not in window.summary.text() and "invalid" in window.summary.text()
    assert not window.table.isEnabled()
    # no what-if compares with an estimate that is not there
    for button in window.whatif.buttons.values():
        assert not button.isEnabled() and "invalid" in button.toolTip()
    type_into(par["training.parallelism.tp"].widget, "2")
    assert_current(window)
    assert window.whatif.buttons["8bit-optimizer"].isChecked() and len(window._ghosts) == 1


def test_opening_an_invalid_file_shows_no_other_documents_bars(
    window: MainWindow, tmp_path: Path
) -> None:
    path = tmp_path / "bad-mesh.memfit.json"
    save_scenario(bad_mesh(), path)
    assert window.open_path(path)
    assert "bad-mesh.memfit.json" in window.windowTitle()
    chart = window.chart
    assert chart.is_stale() and chart.current_bar_count() == 0 and chart.x_labels() == []
    assert chart.verdict_text().startswith("No estimate: Parallelism: ")
    assert not chart.capacity_line.isVisible()
    assert window.table.rowCount() == 0
    assert "invalid" in window.summary.text()
    assert "its estimate is rejected" in window.statusBar().currentMessage()


def test_a_start_with_no_valid_estimate_shows_an_empty_stale_chart(
    qtbot: QtBot, tmp_path: Path
) -> None:
    w = MainWindow(settings=ini(tmp_path), data_dir=tmp_path, scenario=bad_mesh())
    qtbot.addWidget(w)
    w.show()
    assert w.chart.is_stale() and w.chart.current_bar_count() == 0
    assert w.chart.verdict_text().startswith("No estimate: Parallelism: ")
    assert w.chart.empty_text.isVisible() and "valid" in w.chart.empty_text.toPlainText()
    assert not w.chart.host_label.isVisible() and not w.chart.note_label.isVisible()
    assert w.table.rowCount() == 0
    tp = w.parallelism_panel.rows["training.parallelism.tp"]
    assert not tp.error.isHidden()  # the field that explains it says so from the start


def test_chart_set_stale_and_clear(qtbot: QtBot) -> None:
    chart = BreakdownChart()
    qtbot.addWidget(chart)
    chart.resize(900, 560)
    chart.show()
    base = estimate(default_scenario())
    ghost = Ghost("x", "ghost", base, "note")
    chart.set_estimates(base, [ghost])
    assert not chart.is_stale() and chart.stale_reason() == ""
    chart.set_stale("training.lora.rank: got 5000, expected an integer in [1, 4096]")
    assert chart.is_stale() and chart.current_bar_count() == 1
    assert chart.verdict_text().startswith("Out of date: training.lora.rank: got 5000")
    chart.set_stale(None)
    assert not chart.is_stale() and chart.x_labels()[0] == "current"
    assert chart.verdict_text().startswith(("Fits", "Tight", "Does not fit"))
    assert brush(chart, "activations").name().lower() == CATEGORY_COLOURS["activations"].lower()
    chart.set_stale("model: broken")
    chart.clear()
    assert chart.current_bar_count() == 0 and chart.verdict_text() == "No estimate: model: broken"
    chart.set_estimates(base)  # estimates come back only through set_estimates
    chart.set_stale(None)
    assert chart.current_bar_count() == 1 and chart.capacity_line.isVisible()


def test_a_stale_chart_applies_no_ghost(qtbot: QtBot) -> None:
    from tests.gui.test_chart import double_click

    chart = BreakdownChart()
    qtbot.addWidget(chart)
    chart.resize(900, 560)
    chart.show()
    qtbot.waitExposed(chart)
    base = estimate(default_scenario())
    chart.set_estimates(base, [Ghost("x", "ghost", base, "note")])
    chart.set_stale("training.parallelism: broken")
    with qtbot.assertNotEmitted(chart.ghostActivated):
        double_click(qtbot, chart, 1.0, 3.0)
