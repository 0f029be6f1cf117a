"""The main window driven as a user would: panels, toggles, undo, files, exports, errors."""

import csv
import dataclasses
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtGui import QImage

from memfit.engine.estimate import estimate
from memfit.engine.params import count_parameters
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.report import to_csv, to_markdown
from memfit.engine.scenario_io import save_scenario
from memfit.engine.specs import HardwareSpec, OffloadSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.engine.whatif import WHATIFS
from memfit.gui.chart import gib_text
from memfit.gui.main_window import MainWindow
from memfit.gui.monkey import MessageBoxes
from memfit.gui.store import default_scenario


@pytest.fixture
def make_window(qtbot, tmp_path: Path):  # type: ignore[no-untyped-def]
    def make(**kwargs: object) -> MainWindow:
        settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
        window = MainWindow(settings=settings, data_dir=tmp_path, **kwargs)
        qtbot.addWidget(window)
        window.resize(1280, 800)
        window.show()
        return window

    return make


@pytest.fixture
def window(make_window) -> MainWindow:  # type: ignore[no-untyped-def]
    return make_window(scenario=default_scenario())


def test_training_panel_edits_reach_the_store(window: MainWindow) -> None:
    rows = window.training_panel.rows
    rows["training.micro_batch_size"].widget.setValue(8)
    rows["training.sequence_length"].widget.setValue(4096)
    rows["training.lora.rank"].widget.setValue(64)
    t = window.store.scenario.training
    assert (t.micro_batch_size, t.sequence_length, t.lora.rank) == (8, 4096, 64)
    combo = rows["training.optimizer"].widget
    combo.setCurrentIndex(combo.findData("adamw-8bit"))
    assert window.store.scenario.training.optimizer == "adamw-8bit"
    assert window.store.estimate == estimate(window.store.scenario)


def test_method_switch_shows_only_its_fields(window: MainWindow) -> None:
    panel = window.training_panel
    method = panel.rows["training.method"].widget
    method.setCurrentIndex(method.findData("full"))
    assert window.store.scenario.training.method == "full"
    assert not panel.rows["training.lora.rank"].widget.isVisibleTo(panel)
    method.setCurrentIndex(method.findData("qlora"))
    assert panel.rows["training.lora.rank"].widget.isVisibleTo(panel)
    assert panel.rows["training.qlora.double_quant"].widget.isVisibleTo(panel)


def test_lora_targets_checkboxes(window: MainWindow) -> None:
    targets = window.training_panel.targets
    targets.boxes["o_proj"].setChecked(True)
    assert window.store.scenario.training.lora.targets == ("q_proj", "v_proj", "o_proj")
    targets.boxes["all-linear"].setChecked(True)
    assert window.store.scenario.training.lora.targets == ("all-linear",)
    assert not targets.boxes["q_proj"].isEnabled()
    # the output layer is not a part of all-linear: its box stays its own
    assert targets.boxes["lm_head"].isEnabled()
    targets.boxes["lm_head"].setChecked(True)
    assert window.store.scenario.training.lora.targets == ("all-linear", "lm_head")


def test_model_panel_search_filters_and_picks_a_preset(window: MainWindow) -> None:
    panel = window.model_panel
    panel.search.setText("mixtral")
    # the first item keeps showing the current model, which the filter leaves out
    assert panel.preset.currentIndex() == 0 and panel.preset.itemData(0) == "llama-3-8b"
    assert panel.preset_shows_current()
    names = [panel.preset.itemData(i) for i in range(1, panel.preset.count())]
    assert names and all("mixtral" in n for n in names)
    panel.search.clear()
    panel.family.setCurrentIndex(panel.family.findData("gemma2"))
    names = [panel.preset.itemData(i) for i in range(1, panel.preset.count())]
    assert set(names) == {"gemma-2-2b", "gemma-2-9b", "gemma-2-27b"}
    panel.preset.setCurrentIndex(panel.preset.findData("gemma-2-9b"))
    panel.preset.activated.emit(panel.preset.currentIndex())
    assert window.store.scenario.model == load_model("gemma-2-9b")
    assert "9,241,705,984" in panel.count.text()


def test_model_panel_architecture_edit_counts_live(window: MainWindow) -> None:
    panel = window.model_panel
    panel.rows["model.num_layers"].widget.setValue(16)
    assert window.store.scenario.model.num_layers == 16
    assert f"{count_parameters(window.store.scenario.model).total:,}" in panel.count.text()
    assert "(edited)" in panel.preset.currentText()


def test_hardware_panel(window: MainWindow) -> None:
    rows = window.hardware_panel.rows
    gpu = rows["hardware.gpu"].widget
    gpu.setCurrentIndex(gpu.findData("a10g"))
    assert window.store.scenario.hardware.gpu == load_gpu("a10g")
    rows["hardware.memory_gib"].widget.setValue(20.0)
    assert window.store.estimate.capacity_bytes == 20 * 2**30
    rows["hardware.memory_gib"].widget.setValue(0.0)  # back to the preset's memory
    assert window.store.scenario.hardware.memory_gib is None
    rows["hardware.utilization_target"].widget.setValue(50)
    assert window.store.estimate.budget_bytes == window.store.estimate.capacity_bytes // 2
    rows["hardware.gpus_per_node"].widget.setValue(8)
    rows["hardware.nodes"].widget.setValue(2)
    assert window.store.scenario.hardware.world_size == 16


def test_invalid_value_shows_inline_and_keeps_the_last_valid(window: MainWindow) -> None:
    before = window.store.scenario
    kv = window.model_panel.rows["model.num_key_value_heads"]
    kv.widget.setValue(7)  # does not divide 32 attention heads
    assert window.store.scenario == before
    assert not kv.error.isHidden()
    # in the panel's words: the heads field by its label
    heads = window.model_panel.rows["model.num_attention_heads"].label.rstrip(":")
    assert f"expected a divisor of {heads} (32)" in kv.error.text()
    kv.widget.setValue(4)
    assert kv.error.isHidden() and window.store.scenario.model.num_key_value_heads == 4


def test_rank_above_hidden_size_is_explained(window: MainWindow) -> None:
    rank = window.training_panel.rows["training.lora.rank"]
    rank.widget.setValue(5000)
    assert not rank.error.isHidden()
    assert "[1, 4096]" in rank.error.text()
    assert window.store.scenario.training.lora.rank == 16


def test_a_preset_the_lora_rank_does_not_fit_is_refused_in_words(window: MainWindow) -> None:
    training = window.store.scenario.training
    window.store.edit(
        dataclasses.replace(
            window.store.scenario,
            training=dataclasses.replace(
                training, method="lora", lora=dataclasses.replace(training.lora, rank=4096)
            ),
        )
    )
    before = window.store.scenario
    panel = window.model_panel
    panel.preset.setCurrentIndex(panel.preset.findData("gpt2"))
    panel.preset.activated.emit(panel.preset.currentIndex())  # hidden size 768 < rank 4096
    assert window.store.scenario == before
    assert panel.preset.itemData(panel.preset.currentIndex()) == "llama-3-8b"
    said = window.statusBar().currentMessage()
    assert said.startswith("Could not choose GPT-2") and "LoRA rank" in said
    assert "[1, 768]" in said and said in window.notice.messages()
    # a preset it fits is taken as before
    panel.preset.setCurrentIndex(panel.preset.findData("llama-2-13b"))
    panel.preset.activated.emit(panel.preset.currentIndex())
    assert window.store.scenario.model == load_model("llama-2-13b")


def test_engine_error_marks_the_chart_stale_and_says_why(window: MainWindow) -> None:
    window.model_panel.preset.setCurrentIndex(window.model_panel.preset.findData("deepseek-v3"))
    window.model_panel.preset.activated.emit(window.model_panel.preset.currentIndex())
    # q_proj/v_proj match nothing in DeepSeek-V3's latent attention
    assert "training.lora.targets" in window.store.error
    assert window.store.estimate is None
    # the chart says it in the panel's words: the row's label, not the field's path
    assert window.chart.is_stale()
    assert window.chart.stale_reason() == window.in_user_words(window.store.error)
    assert window.chart.verdict_text().startswith("Out of date: LoRA targets")
    window.training_panel.targets.boxes["all-linear"].setChecked(True)
    assert window.store.error == "" and not window.chart.is_stale()


@pytest.mark.parametrize("whatif", [w.key for w in WHATIFS])
def test_every_toggle_adds_a_ghost_and_applies(window: MainWindow, whatif: str) -> None:
    start = window.store.scenario
    if whatif == "mixed-precision":  # only applies to fp32 runs
        combo = window.training_panel.rows["training.precision"].widget
        combo.setCurrentIndex(combo.findData("fp32"))
    if whatif == "lora":  # only applies when LoRA is not already on
        combo = window.training_panel.rows["training.method"].widget
        combo.setCurrentIndex(combo.findData("full"))
    if whatif in ("zero3", "gradient-bucket-view"):  # more than one GPU (DDP's buckets)
        window.hardware_panel.rows["hardware.gpus_per_node"].widget.setValue(8)
    if whatif == "flash-attention":  # only when the kernel is not already flash
        combo = window.training_panel.rows["training.attention"].widget
        combo.setCurrentIndex(combo.findData("eager"))
    if whatif in ("release-outputs", "release-previous-step"):  # only where Lightning's loop
        combo = window.training_panel.rows["training.stack"].widget
        combo.setCurrentIndex(combo.findData("lightning"))
    button = window.whatif.buttons[whatif]
    assert button.isEnabled()
    button.setChecked(True)
    assert [g.key for g in window._ghosts] == [whatif]
    expected = window.whatif.results[whatif].scenario
    window.whatif.apply(whatif)
    assert window.store.scenario == expected
    assert not button.isChecked()
    window.undo_act.trigger()
    assert window.store.scenario != expected
    while window.store.undo_stack.canUndo():
        window.undo_act.trigger()
    assert window.store.scenario == start


def test_compare_all_shows_which_change_fits(make_window) -> None:  # type: ignore[no-untyped-def]
    scenario = Scenario(
        load_model("llama-3-8b"), HardwareSpec(load_gpu("l40s")), TrainingSpec(method="full")
    )
    window = make_window(scenario=scenario)
    assert window.store.estimate.verdict == "oom"
    window.compare_all()
    verdicts = {g.key: g.estimate.verdict for g in window._ghosts}
    assert verdicts["lora"] == "fits" and verdicts["qlora"] == "fits"
    assert verdicts["8bit-optimizer"] == "oom"


def test_undo_redo_shortcuts(window: MainWindow, qtbot) -> None:  # type: ignore[no-untyped-def]
    spin = window.training_panel.rows["training.micro_batch_size"].widget
    spin.setValue(2)
    spin.setValue(3)
    window.undo_act.trigger()
    assert window.store.scenario.training.micro_batch_size == 2
    assert spin.value() == 2  # the panel follows the store
    window.redo_act.trigger()
    assert window.store.scenario.training.micro_batch_size == 3
    assert "Ctrl+Shift+Z" in [s.toString() for s in window.redo_act.shortcuts()]
    assert window.undo_act.shortcut().toString() == "Ctrl+Z"


def test_save_and_open_round_trip(make_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    window = make_window(scenario=default_scenario())
    window.training_panel.rows["training.micro_batch_size"].widget.setValue(6)
    window.model_panel.rows["model.num_layers"].widget.setValue(20)
    assert window.isWindowModified()
    path = tmp_path / "run.memfit.json"
    assert window.save_to(path)
    assert not window.isWindowModified()
    assert "run.memfit.json" in window.windowTitle()
    other = make_window(scenario=default_scenario())
    assert other.open_path(path)
    assert other.store.scenario == window.store.scenario
    assert str(path) in other.recent_files()


def test_malformed_file_shows_a_message(
    window: MainWindow, tmp_path: Path, message_boxes: MessageBoxes
) -> None:
    messages = message_boxes.shown
    bad = tmp_path / "bad.memfit.json"
    bad.write_text('{"memfit_scenario": 1, "model": {"preset": "gpt2"}, "hardware": {"gpu": 5}}')
    before = window.store.scenario
    assert not window.open_path(bad)
    assert window.store.scenario == before
    assert "hardware.gpu" in messages[0].text and "bad.memfit.json" in messages[0].text
    bad.write_text("{oops")
    assert not window.open_path(bad)
    assert "not valid JSON" in messages[1].text


def test_last_scenario_reopens(make_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    window = make_window(scenario=default_scenario())
    window.training_panel.rows["training.sequence_length"].widget.setValue(1024)
    assert window.save_to(tmp_path / "run.memfit.json")
    window.training_panel.rows["training.micro_batch_size"].widget.setValue(2)
    saved_and_edited = window.store.scenario
    window.write_autosave()
    window.store.undo_stack.undo()
    window.save()  # the document as saved, closed unmodified
    window.close()
    again = make_window()  # no scenario given: restores the autosaved one
    assert again.store.scenario.training.sequence_length == 1024
    assert again.store.scenario != saved_and_edited
    assert again.store.path == tmp_path / "run.memfit.json" and not again.store.modified


def test_exports_match_the_engine(window: MainWindow, tmp_path: Path) -> None:
    window.export_chart(tmp_path / "c1.png", 1)
    window.export_chart(tmp_path / "c2.png", 2)
    one, two = QImage(str(tmp_path / "c1.png")), QImage(str(tmp_path / "c2.png"))
    assert not one.isNull() and one.width() == window.chart.width()
    assert two.width() == 2 * one.width() and two.height() == 2 * one.height()
    window.export_chart(tmp_path / "c.svg")
    root = ET.parse(tmp_path / "c.svg").getroot()
    assert root.tag.endswith("svg")
    est = window.store.estimate
    window.export_data(tmp_path / "d.csv")
    assert (tmp_path / "d.csv").read_text() == to_csv(est)
    rows = list(csv.DictReader(io.StringIO((tmp_path / "d.csv").read_text())))
    items = [r for r in rows if r["category"] not in ("scenario", "total")]
    assert sum(int(r["bytes"]) for r in items) == est.device_bytes
    window.export_data(tmp_path / "d.json")
    assert json.loads((tmp_path / "d.json").read_text()) == est.to_dict()
    window.export_data(tmp_path / "d.md")
    assert (tmp_path / "d.md").read_text() == to_markdown(est)
    with pytest.raises(ValueError, match="unknown data format"):
        window.export_data(tmp_path / "d.xlsx")


def test_copy_chart_puts_an_image_on_the_clipboard(window: MainWindow) -> None:
    from PySide6.QtGui import QGuiApplication

    window.copy_chart()
    assert not QGuiApplication.clipboard().image().isNull()


def test_new_after_saving_starts_fresh(window: MainWindow, tmp_path: Path) -> None:
    window.training_panel.rows["training.micro_batch_size"].widget.setValue(5)
    window.save_to(tmp_path / "x.memfit.json")
    window.new_scenario()
    assert window.store.scenario == default_scenario()
    assert not window.store.undo_stack.canUndo()


def test_settings_persist_geometry_and_view(make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(scenario=default_scenario())
    window.resize(1100, 700)
    window.table_act.setChecked(False)
    window.set_theme("dark")
    window.close()
    again = make_window(scenario=default_scenario())
    assert not again.table_act.isChecked()
    assert again.theme_acts["dark"].isChecked()
    again.set_theme("light")


def test_menus_have_the_actions(window: MainWindow) -> None:
    texts = [a.text().replace("&", "") for a in window.menuBar().actions()]
    assert texts == ["File", "Edit", "View", "Help"]
    file_actions = [a.text().replace("&", "") for a in window.file_menu.actions()]
    for name in (
        "New",
        "Open...",
        "Open Recent",
        "Save",
        "Save As...",
        "Export Chart...",
        "Export Data...",
        "Copy Chart",
        "Quit",
    ):
        assert name in file_actions
    assert window.save_act.shortcut().toString() == "Ctrl+S"
    assert window.save_act.statusTip()


def test_save_scenario_file_then_open_from_disk(make_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "given.memfit.json"
    save_scenario(default_scenario(), path)
    window = make_window(scenario=default_scenario())
    assert window.open_path(path)
    assert not window.isWindowModified()


def test_step_options_in_the_strategy_panel(window: MainWindow) -> None:
    rows = window.training_panel.rows
    every = rows["training.checkpoint_every_k"].widget
    assert not every.isVisibleTo(window.training_panel)
    combo = rows["training.activation_checkpointing"].widget
    combo.setCurrentIndex(combo.findData("every-k-layers"))
    assert every.isVisibleTo(window.training_panel)
    every.setValue(4)
    assert window.store.scenario.training.checkpoint_every_k == 4
    before = window.store.estimate.allocated_bytes
    loss = rows["training.loss"].widget
    loss.setCurrentIndex(loss.findData("chunked"))
    assert window.store.scenario.training.loss == "chunked"
    assert window.store.estimate.allocated_bytes < before  # the logits are never held
    for key, field in (("training.attention", "eager"), ("training.optimizer_impl", "fused")):
        widget = rows[key].widget
        widget.setCurrentIndex(widget.findData(field))
    assert window.store.scenario.training.attention == "eager"
    assert window.store.scenario.training.optimizer_impl == "fused"


def test_overhead_tooltip_lists_its_parts(window: MainWindow) -> None:
    est = window.store.estimate
    top = sum(v for k, v in est.breakdown.items() if k != "overhead") / 2**30
    tip = window.chart.tooltip_at(0, top + est.breakdown["overhead"] / 2**31)
    for part in ("allocator fragmentation", "CUDA context", "cuBLAS workspace"):
        assert part in tip


def test_parallelism_controls_and_mesh_errors(window: MainWindow) -> None:
    rows = window.parallelism_panel.rows
    window.hardware_panel.rows["hardware.gpus_per_node"].widget.setValue(8)
    zero = rows["training.parallelism.zero_stage"].widget
    zero.setCurrentIndex(zero.findData(3))
    assert window.store.scenario.training.parallelism.zero_stage == 3
    rows["training.parallelism.tp"].widget.setValue(3)  # does not divide 8 GPUs
    assert window.store.scenario.training.parallelism.tp == 3  # stored, not estimated
    assert window.store.estimate is None and window.chart.is_stale()
    tp_row = rows["training.parallelism.tp"]
    assert not tp_row.error.isHidden() and "must divide the 8 GPUs" in tp_row.error.text()
    rows["training.parallelism.tp"].widget.setValue(2)
    assert window.store.error == ""
    offload = rows["training.offload.optimizer"].widget
    offload.setCurrentIndex(offload.findData("cpu"))
    assert window.store.estimate is not None and window.store.estimate.host_bytes > 0


def pipeline_scenario(**parallelism: object) -> Scenario:
    """Llama 3.1 70B on 2 nodes x 8 H100, tp=8, pp=2, 8 micro-batches."""
    return Scenario(
        load_model("llama-3.1-70b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8, nodes=2),
        TrainingSpec(
            method="full",
            micro_batch_size=1,
            sequence_length=4096,
            gradient_accumulation_steps=8,
            activation_checkpointing="full",
            parallelism=ParallelismSpec(**{"tp": 8, "pp": 2, "zero_stage": 1, **parallelism}),  # type: ignore[arg-type]
        ),
    )


def offload_scenario(host_memory_gib: float | None = 256) -> Scenario:
    """Llama 3 8B on 8 H100, ZeRO-3 with the optimizer and parameters offloaded to CPU."""
    return Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8, host_memory_gib=host_memory_gib),
        TrainingSpec(
            method="full",
            parallelism=ParallelismSpec(zero_stage=3),
            offload=OffloadSpec(optimizer="cpu", parameters="cpu"),
        ),
    )


def test_pipeline_stages_get_a_bar_each(make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(scenario=pipeline_scenario(sequence_parallel=True))
    est = window.store.estimate
    labels = window.chart.x_labels()
    assert len(est.rank_groups) == 2 and window.chart.current_bar_count() == 2
    assert [label.split("\n")[0] for label in labels] == ["pp stage 0", "pp stage 1"]
    worst = [g.group for g in est.rank_groups].index(est.worst_group)
    assert window.chart.worst_bar() == worst
    assert labels[worst].endswith("worst") and "worst" not in labels[1 - worst]
    window.whatif.buttons["lora"].setChecked(True)  # what-ifs come after the stages
    assert window.chart.current_bar_count() == 2 and window.chart.ghost_key(2) == "lora"
    assert window.chart.x_labels()[2].startswith("LoRA")


def test_parallelism_panel_edits_reach_the_store(make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(scenario=pipeline_scenario())
    panel = window.parallelism_panel
    rows = panel.rows

    def choose(path: str, value: object) -> None:
        combo = rows[path].widget
        combo.setCurrentIndex(combo.findData(value))

    def par() -> ParallelismSpec:
        return window.store.scenario.training.parallelism

    choose("training.parallelism.framework", "megatron")
    assert par().framework == "megatron"
    rows["training.parallelism.sequence_parallel"].widget.setChecked(True)
    assert par().sequence_parallel
    rows["training.parallelism.hybrid_shard"].widget.setChecked(True)
    assert par().hybrid_shard
    choose("training.parallelism.pp_schedule", "gpipe")
    assert par().pp_schedule == "gpipe"
    assert not rows["training.parallelism.vpp"].widget.isVisibleTo(panel)
    choose("training.parallelism.pp_schedule", "interleaved-1f1b")
    assert (par().pp_schedule, par().vpp) == ("interleaved-1f1b", 2)  # needs 2: given
    assert rows["training.parallelism.vpp"].widget.isVisibleTo(panel)
    rows["training.parallelism.vpp"].widget.setValue(4)
    assert par().vpp == 4 and window.store.estimate.mesh is not None
    assert window.store.estimate.mesh.vpp == 4
    choose("training.parallelism.pp_schedule", "1f1b")
    assert (par().pp_schedule, par().vpp) == ("1f1b", 1)
    assert rows["training.parallelism.pp_split"].widget.isVisibleTo(panel)  # pp = 2
    choose("training.parallelism.pp_split", "balanced")
    assert par().pp_split == "balanced"
    choose("training.parallelism.pp_split", "even")
    assert window.store.error == ""
    assert "16 GPUs</b> = tp 8 × pp 2 × cp 1 × dp 1" in panel.mesh.text()

    capacity = rows["training.parallelism.expert_capacity_factor"].widget
    assert not capacity.isVisibleTo(panel)  # a dense model with ep = 1
    capacity.setValue(1.5)
    assert par().expert_capacity_factor == 1.5
    checkpointing = window.training_panel.rows["training.activation_checkpointing"].widget
    checkpointing.setCurrentIndex(checkpointing.findData("full"))
    choose("training.offload.activations", "cpu")
    assert window.store.scenario.training.offload.activations == "cpu"
    assert window.store.estimate.host_node_bytes > 0
    assert window.store.estimate == estimate(window.store.scenario)


def test_invalid_vpp_shows_an_inline_error_on_its_row(make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(scenario=pipeline_scenario(pp_schedule="interleaved-1f1b", vpp=2))
    vpp = window.parallelism_panel.rows["training.parallelism.vpp"]
    vpp.widget.setValue(3)  # pp x vpp = 6 does not divide 80 layers
    assert not vpp.error.isHidden()
    assert vpp.error.text().startswith("pp x vpp = 6 must divide the 80 layers")
    assert window.store.estimate is None and "training.parallelism.vpp" in window.store.error
    vpp.widget.setValue(1)  # the interleaved schedule needs 2 or more: refused at once
    assert "expected at least 2 for the interleaved schedule" in vpp.error.text()
    assert window.store.scenario.training.parallelism.vpp == 3
    vpp.widget.setValue(5)
    assert vpp.error.isHidden() and window.store.error == ""
    assert window.store.scenario.training.parallelism.vpp == 5
    for path, row in window.parallelism_panel.rows.items():
        assert row.error.isHidden(), path


def test_a_split_broken_in_another_panel_is_explained_on_tp(make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(scenario=pipeline_scenario())
    panel = window.parallelism_panel
    panel.rows["training.parallelism.framework"].widget.setCurrentIndex(1)  # edited last here
    window.hardware_panel.rows["hardware.nodes"].widget.setValue(3)  # 24 GPUs, tp x pp = 16
    tp = panel.rows["training.parallelism.tp"]
    assert not tp.error.isHidden() and "must divide the 24 GPUs" in tp.error.text()
    assert panel.rows["training.parallelism.framework"].error.isHidden()
    assert "does not work" in panel.mesh.text()


def test_activation_offload_needs_checkpointing(window: MainWindow) -> None:
    row = window.parallelism_panel.rows["training.offload.activations"]
    row.widget.setCurrentIndex(row.widget.findData("cpu"))  # checkpointing is "none"
    ckpt = window.training_panel.rows["training.activation_checkpointing"].label.rstrip(":")
    assert not row.error.isHidden() and f"needs {ckpt} full" in row.error.text()


def test_host_ram_per_node_field(make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(scenario=offload_scenario(host_memory_gib=None))
    host = window.hardware_panel.rows["hardware.host_memory_gib"].widget
    assert host.value() == 0 and host.text() == "not given"
    est = window.store.estimate
    assert est.host_verdict == "unknown"
    assert "give the host RAM per node to check it" in window.chart.host_text()
    host.setValue(512)
    assert window.store.scenario.hardware.host_memory_gib == 512
    assert window.store.estimate.host_capacity_bytes == 512 * 2**30
    assert window.chart.host_text().endswith("of 512.0 GiB — fits")
    host.setValue(100)
    assert window.store.estimate.host_verdict == "oom"
    assert window.chart.host_text().endswith("of 100.0 GiB — does not fit")
    assert "#B3261E" in window.chart.host_label.styleSheet()
    assert "does not fit" not in window.chart.verdict_text()  # the GPUs still fit
    assert "host RAM" in window.summary.text() and window.summary.text().endswith("oom")
    host.setValue(0)
    assert window.store.scenario.hardware.host_memory_gib is None


def test_host_ram_badge_has_the_engine_number(make_window) -> None:  # type: ignore[no-untyped-def]
    window = make_window(scenario=offload_scenario())
    est = window.store.estimate
    per_gpu = sum(i.bytes for i in est.host_items)
    assert per_gpu > 0 and est.host_node_bytes == 8 * per_gpu
    text = window.chart.host_text()
    assert text == f"Host RAM per node: {gib_text(8 * per_gpu)} of 256.0 GiB — fits"
    assert window.chart.host_label.isVisible()
    window.parallelism_panel.rows["training.offload.parameters"].widget.setCurrentIndex(0)
    window.parallelism_panel.rows["training.offload.optimizer"].widget.setCurrentIndex(0)
    assert window.store.estimate.host_node_bytes == 0
    assert window.chart.host_text() == "" and window.chart.host_label.isHidden()


def test_a_dialog_no_test_answers_fails_the_test(window: MainWindow) -> None:
    from PySide6.QtWidgets import QDialog, QInputDialog

    # the guard of conftest.py: a real modal loop offscreen could end the run early
    with pytest.raises(AssertionError, match=r"QInputDialog .*does not answer"):
        QInputDialog(window).exec()
    with pytest.raises(AssertionError, match="does not answer"):
        QDialog(window).exec()
