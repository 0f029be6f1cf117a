"""The Tradeoffs view driven as a user would: sweep, hover, apply, cancel, curves, other
GPUs, exports; and the worker channel under it."""

from __future__ import annotations

import csv
import dataclasses
import io
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QImage
from pytestqt.qtbot import QtBot

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import GIB
from memfit.engine.solve import max_micro_batch, max_sequence_length, min_gpus
from memfit.engine.specs import Scenario
from memfit.engine.sweep import Space, default_space, describe, pareto, sweep
from memfit.gui import tradeoffs
from memfit.gui.background import Channel
from memfit.gui.curves import FIELDS, with_checkpointing
from memfit.gui.forms import in_user_words
from memfit.gui.hardware_compare import on_gpu
from memfit.gui.main_window import MainWindow
from memfit.gui.sweep_map import SweepMap
from memfit.gui.tradeoffs import TradeoffsView
from tests.gui.helpers import bad_mesh, cluster

#: a dozen configurations: fast enough for every test
SMALL = Space(precisions=("bf16-mixed", "bf16"), checkpointing=("none", "full"),
              micro_batches=(1, 2, 4))  # fmt: skip
WAIT_MS = 60_000


def show(window: MainWindow, qtbot: QtBot, tab: int) -> TradeoffsView:
    view = window.tradeoffs
    view.tabs.setCurrentIndex(tab)
    window.views.setCurrentWidget(view)
    qtbot.waitExposed(view)
    return view


def swept(view: TradeoffsView, qtbot: QtBot, space: Space | None = SMALL) -> None:
    with qtbot.waitSignal(view.sweeper.finished, timeout=WAIT_MS):
        assert view.start_sweep(space)


def to_viewport(chart: SweepMap, x: float, y: float) -> QPoint:
    scene = chart.plot_item.getViewBox().mapViewToScene(QPointF(x, y))
    return chart.plot.mapFromScene(scene)


def dot(view: TradeoffsView, want: object = None) -> int:
    """The index of a dot that a click on its centre picks (no other dot over it) and,
    unless ``want`` is None, whose scenario differs from ``want``."""
    m = view.map
    for i, p in enumerate(m.points()):
        pos = m.view_position(i)
        if m.index_near(pos.x(), pos.y()) == i and p.scenario != want:
            return i
    raise AssertionError("no dot to click")


# -- the map ---------------------------------------------------------------------------


def test_a_small_sweep_draws_every_point_the_front_and_the_lines(
    window: MainWindow, qtbot: QtBot
) -> None:
    view = show(window, qtbot, 0)
    swept(view, qtbot)
    expected = sweep(window.store.scenario, SMALL)
    m = view.map
    assert [p.scenario for p in m.points()] == [p.scenario for p in expected]
    drawn = {v: len(s.data) for v, s in m.scatters.items()}
    assert drawn == {v: sum(p.verdict == v for p in expected) for v in ("fits", "tight", "oom")}
    assert [p.scenario for p in m.front()] == [p.scenario for p in pareto(expected)]
    x, _y = m.front_line.getData()
    assert list(x) == [p.device_bytes / GIB for p in pareto(expected)]
    est = window.store.estimate
    assert est is not None
    assert m.capacity_line.value() == pytest.approx(est.capacity_bytes / GIB)
    assert m.budget_line.value() == pytest.approx(est.budget_bytes / GIB)
    assert "GiB, 2^30" in m.plot_item.getAxis("bottom").labelText
    assert f"{len(expected)} configurations" in view.sweep_status.text()
    assert view.sweep_button.isEnabled() and not view.cancel_button.isEnabled()
    assert not m.is_stale()


def test_hovering_a_dot_names_its_configuration(window: MainWindow, qtbot: QtBot) -> None:
    view = show(window, qtbot, 0)
    swept(view, qtbot)
    i = dot(view)
    p = view.map.points()[i]
    pos = view.map.view_position(i)
    qtbot.wait(40)  # pyqtgraph's scene drops moves that come faster than 60 a second
    qtbot.mouseMove(view.map.plot.viewport(), to_viewport(view.map, pos.x(), pos.y()))
    qtbot.waitUntil(lambda: describe(p.scenario) in view.map.hover_text())
    text = view.map.hover_text()
    assert f"{p.time.tokens_per_s:,.0f} tokens/s" in text
    assert "MFU" in text and p.time.bound.replace("_", " ") in text
    assert view.map.plot.toolTip().startswith("<qt>")


def test_clicking_a_dot_applies_it_and_undo_restores(window: MainWindow, qtbot: QtBot) -> None:
    view = show(window, qtbot, 0)
    before = window.store.scenario
    swept(view, qtbot)
    i = dot(view, want=before)
    p = view.map.points()[i]
    pos = view.map.view_position(i)
    qtbot.mouseClick(
        view.map.plot.viewport(),
        Qt.MouseButton.LeftButton,
        pos=to_viewport(view.map, pos.x(), pos.y()),
    )
    assert window.store.scenario == p.scenario
    assert not view.map.is_stale()  # the dot applied is one of the map's
    assert view.map.current_marker.data["x"][0] == pytest.approx(p.device_bytes / GIB)
    assert window.store.undo_stack.undoText().startswith("Apply")
    window.undo_act.trigger()
    assert window.store.scenario == before
    assert not view.map.is_stale()  # the sweep's own scenario


def test_an_edit_after_a_sweep_marks_the_map_stale(window: MainWindow, qtbot: QtBot) -> None:
    view = show(window, qtbot, 0)
    swept(view, qtbot)
    window.training_panel.rows["training.sequence_length"].widget.setValue(1024)
    assert view.map.is_stale()
    assert "Out of date" in view.map.hover_text()
    points = view.map.points()
    view.apply_point(points[0])  # a stale dot is never applied
    assert window.store.scenario.training.sequence_length == 1024
    swept(view, qtbot)
    assert not view.map.is_stale()
    assert all(p.scenario.training.sequence_length == 1024 for p in view.map.points())


def test_an_edit_during_a_sweep_restarts_it_for_the_new_scenario(
    window: MainWindow, qtbot: QtBot
) -> None:
    view = show(window, qtbot, 0)
    view.start_sweep(SMALL)
    assert view.sweeper.busy
    window.training_panel.rows["training.sequence_length"].widget.setValue(1024)
    edited = window.store.scenario

    def of_edited(result: object, complete: bool) -> bool:
        return complete and getattr(result, "scenario", None) == edited

    with qtbot.waitSignal(view.sweeper.finished, timeout=WAIT_MS, check_params_cb=of_edited):
        pass
    assert not view.map.is_stale()
    assert {p.scenario.training.sequence_length for p in view.map.points()} == {1024}


def test_cancel_stops_a_running_sweep_and_the_view_stays_usable(
    window: MainWindow, qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    window.store.reset(cluster())
    view = show(window, qtbot, 0)
    # the default space on seven GPU types and two sizes each: tens of thousands of
    # configurations, paced so that however fast the machine, Cancel comes first
    gpus = ("h100-sxm-80gb", "a100-sxm-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "l40s",
            "mi300x", "a100-sxm-40gb")  # fmt: skip
    big = dataclasses.replace(
        default_space(cluster()), hardware=tuple((g, 8, n) for g in gpus for n in (1, 2))
    )
    pacing = threading.Event()
    pacing.set()

    def paced(scenario: Scenario, space: Space, progress: Any = None, **kw: Any) -> list[Any]:
        def report(done: int, total: int) -> bool:
            if pacing.is_set():
                time.sleep(0.005)
            return bool(progress(done, total))

        return sweep(scenario, space, progress=report, **kw)

    monkeypatch.setattr(tradeoffs, "sweep", paced)
    with qtbot.waitSignal(view.sweeper.progressed, timeout=WAIT_MS):
        assert view.start_sweep(big)
    assert view.cancel_button.isEnabled() and not view.sweep_button.isEnabled()
    with qtbot.waitSignal(view.sweeper.finished, timeout=WAIT_MS) as blocker:
        qtbot.mouseClick(view.cancel_button, Qt.MouseButton.LeftButton)
    pacing.clear()
    result, complete = blocker.args
    assert not complete and len(result.points) < result.total
    assert view.sweep_status.text().startswith("Cancelled")
    assert view.sweep_button.isEnabled() and not view.cancel_button.isEnabled()
    assert view.progress.isHidden()
    assert len(view.map.points()) == len(result.points)  # what it had stays
    swept(view, qtbot)  # and a new sweep runs to the end
    assert view.map.points() and not view.map.is_stale()


def test_closing_the_window_during_a_sweep_stops_it(window: MainWindow, qtbot: QtBot) -> None:
    window.store.reset(cluster())
    view = show(window, qtbot, 0)
    with qtbot.waitSignal(view.sweeper.progressed, timeout=WAIT_MS):
        view.start_sweep()
    window.close()
    assert not view.sweeper.busy
    assert view.sweeper.wait(0)  # nothing left running


def test_an_invalid_scenario_is_not_swept(window: MainWindow, qtbot: QtBot) -> None:
    window.store.edit(bad_mesh())
    view = show(window, qtbot, 0)
    assert not view.start_sweep(SMALL)
    assert view.sweep_status.text().startswith("Nothing to sweep: ")
    assert view.sweep_button.isEnabled()


def test_the_cost_axis_needs_a_price(window: MainWindow, qtbot: QtBot) -> None:
    view = show(window, qtbot, 0)
    swept(view, qtbot)
    view.metric_box.setCurrentIndex(1)
    assert view.map.y_metric() == "tokens" and view.metric_box.currentIndex() == 0
    window.hardware_panel.rows["hardware.price_per_gpu_hour"].widget.setValue(2.5)
    swept(view, qtbot)
    view.metric_box.setCurrentIndex(1)
    assert view.map.y_metric() == "cost"
    p = view.map.points()[0]
    assert p.cost_per_token is not None
    assert view.map.value(p) == pytest.approx(2.5 / 3600 / p.time.tokens_per_s * 1e6)
    assert "Cost per million tokens" in view.map.plot_item.getAxis("left").labelText


# -- curves ----------------------------------------------------------------------------


def test_curves_mark_the_largest_fitting_values_of_the_solvers(
    window: MainWindow, qtbot: QtBot
) -> None:
    window.store.reset(cluster())
    view = show(window, qtbot, 1)
    qtbot.waitUntil(lambda: view.curves_view.curves() is not None, timeout=WAIT_MS)
    scenario = window.store.scenario
    solvers = {"micro_batch_size": max_micro_batch, "sequence_length": max_sequence_length}
    for field in FIELDS:
        for ckpt in ("none", "full"):
            largest = solvers[field](with_checkpointing(scenario, ckpt))
            assert largest is not None
            assert view.curves_view.marker_value(field, ckpt) == pytest.approx(largest)
            x, y = view.curves_view.lines[(field, "memory", ckpt)].getData()
            assert len(x) >= 7 and all(v > 0 for v in y)
        capacity = view.curves_view.limit_lines[(field, "capacity")]
        assert capacity.value() == pytest.approx(scenario.hardware.capacity_bytes / GIB)
    assert "largest micro-batch that fits: 1 with no checkpointing" in (
        view.curves_view.note.text()
    )


def test_curves_follow_an_edit_and_go_stale_when_invalid(window: MainWindow, qtbot: QtBot) -> None:
    view = show(window, qtbot, 1)
    qtbot.waitUntil(lambda: view.curves_view.curves() is not None, timeout=WAIT_MS)
    window.training_panel.rows["training.sequence_length"].widget.setValue(1024)

    def updated() -> bool:
        curves = view.curves_view.curves()
        return curves is not None and curves.scenario == window.store.scenario

    qtbot.waitUntil(updated, timeout=WAIT_MS)
    window.store.edit(bad_mesh())
    qtbot.waitUntil(view.curves_view.is_stale, timeout=WAIT_MS)
    assert view.curves_view.note.text().startswith("No curves: ")


# -- hardware --------------------------------------------------------------------------


def test_hardware_table_has_a_row_per_ticked_gpu(window: MainWindow, qtbot: QtBot) -> None:
    window.store.reset(cluster())
    view = show(window, qtbot, 2)
    hw = view.hardware_view
    # the scenario's GPU and a few common ones are ticked to start with
    assert "h100-sxm-80gb" in hw.checked() and len(hw.checked()) >= 2
    hw.set_checked(["h100-sxm-80gb"])
    items = {
        hw.gpu_list.item(i).data(Qt.ItemDataRole.UserRole): hw.gpu_list.item(i)
        for i in range(hw.gpu_list.count())
    }
    with qtbot.waitSignal(view.comparer.finished, timeout=WAIT_MS):
        items["h200-sxm-141gb"].setCheckState(Qt.CheckState.Checked)  # as a user ticks
    rows = hw.rows()
    assert [r.gpu for r in rows] == ["h100-sxm-80gb", "h200-sxm-141gb"]
    assert hw.table.rowCount() == 2
    for r, row in enumerate(rows):
        found = min_gpus(on_gpu(window.store.scenario, row.gpu))
        if found is None:
            assert hw.cell_text(r, "GPUs needed") == "does not fit"
            assert hw.cell_text(r, "Tokens/s") == "—"
        else:
            assert hw.cell_text(r, "GPUs needed") == f"{found.hardware.world_size}"
            assert row.point is not None and row.point.scenario == found
            assert hw.cell_text(r, "MFU") == f"{row.point.time.mfu * 100:.1f} %"
        assert hw.cell_text(r, "Cost") == "—"  # no price known, none invented
    assert rows[1].fits


def test_a_price_costs_the_run_on_its_own_gpu_only(window: MainWindow, qtbot: QtBot) -> None:
    scenario = dataclasses.replace(
        cluster(),
        training=dataclasses.replace(
            cluster().training, activation_checkpointing="full", token_budget=10**9
        ),
    )
    window.store.reset(scenario)
    view = show(window, qtbot, 2)
    view.hardware_view.set_checked(["h100-sxm-80gb", "a100-sxm-80gb"])
    with qtbot.waitSignal(view.comparer.finished, timeout=WAIT_MS):
        window.hardware_panel.rows["hardware.price_per_gpu_hour"].widget.setValue(3.0)
    hw = view.hardware_view
    rows = {r.gpu: i for i, r in enumerate(hw.rows())}
    h100 = hw.rows()[rows["h100-sxm-80gb"]].point
    assert h100 is not None and h100.time.cost is not None
    assert hw.cell_text(rows["h100-sxm-80gb"], "Price per GPU-hour") == "3.00"
    assert hw.cell_text(rows["h100-sxm-80gb"], "Cost") == f"{h100.time.cost:,.0f}"
    assert h100.time.cost == pytest.approx(h100.time.gpu_hours * 3.0)
    assert hw.cell_text(rows["a100-sxm-80gb"], "Price per GPU-hour") == "—"
    assert hw.cell_text(rows["a100-sxm-80gb"], "Cost") == "—"


def test_token_budget_field_reaches_the_store(window: MainWindow) -> None:
    box = window.training_panel.rows["training.token_budget"].widget
    assert box.specialValueText() == "not given" and box.value() == 0
    box.setValue(2.5e9)  # tokens
    assert window.store.scenario.training.token_budget == 2_500_000_000
    box.setValue(0)
    assert window.store.scenario.training.token_budget is None


# -- export ----------------------------------------------------------------------------


def check_png_svg_csv(export: object, tmp_path: Path, name: str) -> list[dict[str, str]]:
    for suffix in ("png", "svg", "csv"):
        path = tmp_path / f"{name}.{suffix}"
        export(path)  # type: ignore[operator]
        assert path.stat().st_size > 0, path
    image = QImage(str(tmp_path / f"{name}.png"))
    assert not image.isNull() and image.width() > 100
    ET.parse(tmp_path / f"{name}.svg")  # well-formed SVG
    return list(csv.DictReader(io.StringIO((tmp_path / f"{name}.csv").read_text())))


def test_exports_write_png_svg_and_csv(window: MainWindow, qtbot: QtBot, tmp_path: Path) -> None:
    view = show(window, qtbot, 0)
    swept(view, qtbot)
    rows = check_png_svg_csv(view.export_map, tmp_path, "map")
    assert len(rows) == len(view.map.points()) and "tokens_per_s" in rows[0]
    svg = (tmp_path / "map.svg").read_text()
    assert "GiB" in svg

    view = show(window, qtbot, 1)
    qtbot.waitUntil(lambda: view.curves_view.curves() is not None, timeout=WAIT_MS)
    rows = check_png_svg_csv(view.export_curves, tmp_path, "curves")
    assert {r["axis"] for r in rows} == set(FIELDS)
    assert {r["checkpointing"] for r in rows} == {"none", "full"}

    view = show(window, qtbot, 2)
    qtbot.waitUntil(lambda: bool(view.hardware_view.rows()), timeout=WAIT_MS)
    rows = check_png_svg_csv(view.export_hardware, tmp_path, "hardware")
    assert [r["gpu"] for r in rows] == [r.gpu for r in view.hardware_view.rows()]

    view.export_map(tmp_path / "x2.png", 2)
    assert QImage(str(tmp_path / "x2.png")).width() >= 2 * view.map.width() - 2
    with pytest.raises(ValueError, match="unknown format"):
        view.export_map(tmp_path / "map.bmp")


def test_nothing_to_export_says_so(window: MainWindow, qtbot: QtBot, tmp_path: Path) -> None:
    view = window.tradeoffs
    with pytest.raises(ValueError, match="no sweep"):
        view.export_map(tmp_path / "map.csv")
    with pytest.raises(ValueError, match="no curves"):
        view.export_curves(tmp_path / "curves.csv")


# -- the worker channel ----------------------------------------------------------------


def test_a_newer_job_replaces_an_older_one(qtbot: QtBot) -> None:
    channel = Channel()
    release = threading.Event()

    def slow(keep_going: object) -> str:
        release.wait(10)
        return "old"

    channel.start(slow)
    seen: list[object] = []
    channel.finished.connect(lambda result, complete: seen.append((result, complete)))
    with qtbot.waitSignal(channel.finished, timeout=WAIT_MS):
        channel.start(lambda keep_going: "new")
        release.set()
    channel.wait()
    qtbot.wait(50)
    assert seen == [("new", True)]  # the old result never arrives


def test_a_failing_job_reports_its_message(qtbot: QtBot) -> None:
    channel = Channel()

    def bad(keep_going: object) -> None:
        raise EstimateError("training.micro_batch_size", "must be at least 1")

    with qtbot.waitSignal(channel.failed, timeout=WAIT_MS) as blocker:
        channel.start(bad)
    # the refusal itself reaches the GUI thread, which names its field as the panels do
    refusal = EstimateError("training.micro_batch_size", "must be at least 1")
    assert blocker.args == [in_user_words(refusal)]
    assert blocker.args[0].endswith(": must be at least 1")
    assert not channel.busy
