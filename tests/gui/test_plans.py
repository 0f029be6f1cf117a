"""Plans a user can run, in the app: the map says what the stack cannot run and left out,
a configuration that trains differently is marked, an estimate of a layout the stack
cannot run is warned of, and make-it-fit marks its numerics changes."""

from __future__ import annotations

import dataclasses
import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QComboBox
from pytestqt.qtbot import QtBot

from memfit.engine.estimate import estimate
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.engine.stacks import refusals
from memfit.engine.sweep import NUMERICS_MARK, Space, numerics_changed
from memfit.gui.chart import gib_text
from memfit.gui.main_window import MainWindow
from memfit.gui.readout import BOUND_WORDS, seconds_text
from memfit.gui.sweep_map import point_text
from tests.gui.helpers import bad_mesh, cluster
from tests.gui.test_make_fit import shown, too_big
from tests.gui.test_tradeoffs import WAIT_MS, show

#: pipeline sizes the Hugging Face Trainer cannot run, pure bf16 beside mixed
PIPED = Space(precisions=("bf16-mixed", "bf16"), checkpointing=("full",),
              parallel=(("pp", (1, 2)),), micro_batches=(1,))  # fmt: skip


def test_the_map_leaves_out_and_names_what_the_stack_cannot_run(
    window: MainWindow, qtbot: QtBot
) -> None:
    window.store.reset(cluster())
    view = show(window, qtbot, 0)
    with qtbot.waitSignal(view.sweeper.finished, timeout=WAIT_MS):
        assert view.start_sweep(PIPED)
    points = view.map.points()
    assert points and all(p.scenario.training.parallelism.pp == 1 for p in points)
    status = view.sweep_status.text()
    assert "left out: Hugging Face Trainer cannot run them" in status
    tip = view.sweep_status.toolTip()
    assert "strategies left out: Hugging Face Trainer cannot run pipeline parallelism" in tip
    assert "torchtitan" in tip
    base = window.store.scenario
    pure = next(p for p in points if p.scenario.training.precision == "bf16")
    mixed = next(p for p in points if p.scenario.training.precision == "bf16-mixed")
    assert numerics_changed(base, pure.scenario)
    text = point_text(pure, base)
    assert f"{NUMERICS_MARK} Trains differently: bf16 weights" in text
    assert NUMERICS_MARK not in point_text(mixed, base)


def test_a_layout_the_stack_cannot_run_is_estimated_with_a_warning(window: MainWindow) -> None:
    s = cluster()
    piped = dataclasses.replace(
        s,
        training=dataclasses.replace(
            s.training,
            parallelism=ParallelismSpec(pp=2, zero_stage=s.training.parallelism.zero_stage),
        ),
    )
    assert refusals(piped)
    window.store.reset(piped)
    note = window.chart.note_label
    assert not note.isHidden()
    assert "Warning: Hugging Face Trainer cannot run pipeline parallelism (pp 2)" in note.text()
    assert "accelerate" in note.toolTip()  # the stack file's reason, with its source
    window.store.reset(s)
    note = window.chart.note_label
    assert note.isHidden() or "cannot run" not in note.text()


def test_make_it_fit_marks_the_fixes_that_train_differently(
    window: MainWindow, qtbot: QtBot
) -> None:
    view = shown(window, qtbot, too_big())
    fv = view.fit_view
    fixes = fv.fixes()
    marked = [i for i, f in enumerate(fixes) if numerics_changed(too_big(), f.scenario)]
    assert marked and len(marked) < len(fixes)
    for i, _fix in enumerate(fixes):
        assert fv.cell_text(i, "Changes").endswith(f" {NUMERICS_MARK}") == (i in marked)


def test_make_it_fit_says_the_floor_where_nothing_fits(window: MainWindow, qtbot: QtBot) -> None:
    """It said "try more GPUs or a smaller model" where no change of three fitted, without
    saying how far down the scenario can go, or what is left."""
    s = Scenario(load_model("llama-3.1-405b"), HardwareSpec(load_gpu("rtx-4090")),
                 TrainingSpec(method="full"))  # fmt: skip
    view = shown(window, qtbot, s)
    result = view.fit_view.result()
    assert result is not None and result.fixes == () and result.floor is not None
    text = view.fit_view.summary.text()
    assert text.startswith("Does not fit:")
    assert f"the least it goes down to is {gib_text(result.floor.device_bytes)}" in text
    assert "that floor is parameters" in text and "activations" in text


def test_make_it_fit_finds_the_four_change_fix_for_70b_qlora_on_two_4090s(
    window: MainWindow, qtbot: QtBot
) -> None:
    s = Scenario(
        load_model("llama-3-70b"),
        HardwareSpec(load_gpu("rtx-4090"), gpus_per_node=2),
        TrainingSpec(method="qlora", micro_batch_size=4, sequence_length=2048),
    )
    view = shown(window, qtbot, s)
    fixes = view.fit_view.fixes()
    assert fixes and all(f.device_bytes <= f.budget_bytes for f in fixes)
    assert (
        "ways to make it fit" in view.fit_view.summary.text()
        or "1 way" in view.fit_view.summary.text()
    )


def test_the_step_time_sits_beside_the_memory(window: MainWindow) -> None:
    """The step time -- half of every tradeoff -- was only on the Tradeoffs tab."""
    strip = window.step_readout
    est = window.store.estimate
    assert est is not None and strip.isVisible()
    t = est.time
    text = strip.text()
    assert text.startswith(f"Step {seconds_text(t.step_time_s)} = forward ")
    assert f"{t.tokens_per_s:,.0f} tokens/s" in text and f"MFU {t.mfu * 100:.1f} %" in text
    assert BOUND_WORDS[t.bound] in text
    tip = strip.toolTip()
    assert all(html.escape(term.name) in tip for term in t.terms)
    # an edit moves it: full checkpointing adds recomputation to the step
    mode = window.training_panel.rows["training.activation_checkpointing"].widget
    assert isinstance(mode, QComboBox)
    mode.setCurrentIndex(mode.findData("full"))
    after = window.store.estimate
    assert after is not None and after.time.step_time_s > t.step_time_s
    assert strip.text().startswith(f"Step {seconds_text(after.time.step_time_s)}")
    assert "recomputation" in strip.toolTip() or "recompute" in strip.toolTip()
    # one line, never cut: the terms go to the tooltip where the width is short
    window.resize(1100, 760)
    QApplication.processEvents()
    assert strip.isVisible() and strip.height() < 2 * strip.fontMetrics().lineSpacing()
    assert strip.text().startswith(f"Step {seconds_text(after.time.step_time_s)}")
    assert strip.fontMetrics().horizontalAdvance(strip.text()) <= strip.width()
    # a short window keeps the chart's height; the status bar says the step time
    window.resize(1024, 640)
    QApplication.processEvents()
    assert not strip.isVisible()
    assert f"step {seconds_text(after.time.step_time_s)}" in window.summary.text()
    window.store.edit(bad_mesh(), "Break it")
    assert strip.text() == "Step —" and not strip.isEnabled()


def test_seconds_read_as_a_step_time_is() -> None:
    assert [seconds_text(x) for x in (12.345, 0.6501, 0.01234, 0.000084)] == [
        "12.35 s",
        "0.650 s",
        "12.3 ms",
        "84 µs",
    ]


def test_hardware_is_compared_at_the_user_s_count_too(window: MainWindow, qtbot: QtBot) -> None:
    """Each GPU was shown only at its fewest (24 H100s, 16 B200s) when the user has 64."""
    s = Scenario(
        load_model("llama-3-70b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8, nodes=8),
        TrainingSpec(
            method="full", sequence_length=4096, parallelism=ParallelismSpec(zero_stage=3)
        ),
    )
    window.store.reset(s)
    view = show(window, qtbot, 2)
    hv = view.hardware_view
    hv.set_checked(["h100-sxm-80gb"])
    item = next(
        hv.gpu_list.item(i)
        for i in range(hv.gpu_list.count())
        if hv.gpu_list.item(i).data(Qt.ItemDataRole.UserRole) == "a100-sxm-80gb"
    )
    with qtbot.waitSignal(view.comparer.finished, timeout=WAIT_MS):
        item.setCheckState(Qt.CheckState.Checked)
    rows = hv.rows()
    assert sorted(r.gpu for r in rows) == ["a100-sxm-80gb", "h100-sxm-80gb"]
    assert all(r.at_count is not None and r.at_count.scenario.hardware.world_size == 64
               for r in rows)  # fmt: skip
    fewest = [hv.cell_text(i, "GPUs needed") for i in range(len(rows))]
    hv.mode.setCurrentIndex(hv.mode.findData("yours"))
    assert [hv.cell_text(i, "GPUs needed") for i in range(len(rows))] == ["64 (8 nodes x 8)"] * 2
    assert "on your 64 GPUs" in hv.note.text()
    assert all(line.split(",")[1] == "64" for line in hv.csv_text().splitlines()[1:])
    hv.mode.setCurrentIndex(hv.mode.findData("fewest"))
    assert [hv.cell_text(i, "GPUs needed") for i in range(len(rows))] == fewest


def test_keep_as_set_locks_the_map_and_make_it_fit(window: MainWindow, qtbot: QtBot) -> None:
    """The user could not lock precision or the optimizer in the app: the map offered pure
    bf16 and 8-bit AdamW beside the scenario's own."""
    window.store.reset(cluster())
    view = show(window, qtbot, 0)
    view.lock_actions["precision"].setChecked(True)
    with qtbot.waitSignal(view.sweeper.finished, timeout=WAIT_MS):
        assert view.start_sweep(PIPED)
    precisions = {p.scenario.training.precision for p in view.map.points()}
    assert precisions == {"bf16-mixed"}
    assert view.lock_button.text() == "Keep as set (1)"
    # make it fit leaves out what would change the locked settings
    for key in ("precision", "optimizer", "loss"):
        view.lock_actions[key].setChecked(True)
    view2 = shown(window, qtbot, too_big())
    assert view2 is view
    fixes = view.fit_view.fixes()
    assert fixes and all(numerics_changed(too_big(), f.scenario) == () for f in fixes)
    for key in ("precision", "optimizer", "loss"):
        view.lock_actions[key].setChecked(False)


def test_the_shapes_heat_map_and_a_double_click(window: MainWindow, qtbot: QtBot) -> None:
    """Memory and tokens/s at every micro-batch and sequence length (it was a CLI table)."""
    view = show(window, qtbot, 4)
    qtbot.waitUntil(lambda: view.shapes_view.shapes() is not None, timeout=WAIT_MS)
    shapes = view.shapes_view.shapes()
    assert shapes is not None and shapes.scenario == window.store.scenario
    assert shapes.micro_batches[0] == 1 and 512 in shapes.sequence_lengths
    s = window.store.scenario
    cell = shapes.cells[shapes.micro_batches.index(2)][shapes.sequence_lengths.index(1024)]
    shaped = dataclasses.replace(
        s, training=dataclasses.replace(s.training, micro_batch_size=2, sequence_length=1024)
    )
    est = estimate(shaped)
    assert cell.device_bytes == est.device_bytes
    assert view.shapes_view.cell_text(2, 1024).startswith(gib_text(est.device_bytes))
    view.shapes_view.shapeActivated.emit(2, 1024)
    assert window.store.scenario == shaped
    window.undo_act.trigger()
    assert window.store.scenario == s
