"""The training stack and its Conventions in the strategy panel: choosing a stack, the
values each convention takes from it (the modeling code, the previous step and QLoRA's
head and dequantization as well), overriding them and giving them back, the CUDA runtime,
the what-if that releases the outputs, and files that keep all of it."""

from __future__ import annotations

import dataclasses
import html
import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QComboBox, QToolButton
from pytestqt.qtbot import QtBot

import memfit.engine.stacks
import memfit.gui.panels
from memfit.engine import memo
from memfit.engine.errors import EstimateError
from memfit.engine.presets import load_model
from memfit.engine.scenario_io import (
    load_scenario,
    save_scenario,
    scenario_from_dict,
    scenario_to_dict,
)
from memfit.engine.specs import STACKS, Scenario
from memfit.engine.stacks import as_built, conventions, load_stack, with_stack
from memfit.engine.whatif import WHATIFS
from memfit.gui.main_window import MainWindow
from memfit.gui.panels import FROM_STACK, TrainingPanel, conventions_summary
from memfit.gui.store import ScenarioStore, default_scenario
from memfit.gui.whatif_bar import WhatIfBar
from tests.gui.helpers import bad_mesh, field_mismatches, ini

CONVENTION_ROWS = (
    "training.outputs_held_through_backward",
    "training.kv_cache_in_outputs",
    "training.frozen_weights_dtype",
    "training.lora.adapter_dtype",
)
#: the conventions of the modeling code, the loop's previous step, and QLoRA's
QLORA_ROWS = (
    "training.qlora.quantize_lm_head",
    "training.qlora.dequant_dtype",
    "training.qlora.prepare_kbit",
    "training.qlora.matmul_keeps_input",
)
NEW_ROWS = (
    "training.model_implementation",
    "training.previous_step_held",
    "training.reentrant_checkpointing",
    *QLORA_ROWS,
)
ALL_ROWS = (*CONVENTION_ROWS, *NEW_ROWS)


def combo(panel: TrainingPanel, path: str) -> QComboBox:
    widget = panel.rows[path].widget
    assert isinstance(widget, QComboBox)
    return widget


def choose(panel: TrainingPanel, path: str, value: object) -> None:
    """Pick the item of ``value`` in the combo of ``path``, as a user does."""
    box = combo(panel, path)
    index = box.findData(value)
    assert index >= 0, (path, value)
    box.setCurrentIndex(index)


def on_stack(name: str, **fields: object) -> Scenario:
    s = default_scenario()
    training = dataclasses.replace(with_stack(s.training, name), **fields)  # type: ignore[arg-type]
    return dataclasses.replace(s, training=training)


@pytest.fixture
def panel(qtbot: QtBot) -> TrainingPanel:
    """The strategy panel alone on a store of the default scenario, shown: for what it
    does with its own rows and the store (the window's wiring is tested with a window)."""
    panel = TrainingPanel(ScenarioStore(default_scenario()))
    qtbot.addWidget(panel)
    panel.show()
    return panel


# -- the stack ---------------------------------------------------------------------------


def test_choosing_a_stack_sets_it_with_its_defaults(window: MainWindow) -> None:
    panel = window.training_panel
    stack = combo(panel, "training.stack")
    assert [stack.itemData(i) for i in range(stack.count())] == list(STACKS)
    torchtune = load_stack("torchtune")
    index = stack.findData("torchtune")
    assert stack.itemText(index) == torchtune.label
    tip = stack.itemData(index, Qt.ItemDataRole.ToolTipRole)
    assert tip.startswith("<qt>") and torchtune.source[:40] in tip
    choose(panel, "training.stack", "torchtune")
    t = window.store.scenario.training
    assert t.stack == "torchtune"
    assert (t.loss, t.optimizer_impl) == ("chunked-output", "fused")  # the stack's defaults
    assert combo(panel, "training.loss").currentData() == "chunked-output"
    assert panel.rows["training.loss_chunks"].widget.isEnabled()
    assert "torchtune" in stack.toolTip()
    window.undo_act.trigger()  # one undoable step
    assert window.store.scenario.training.stack == "hf-trainer"
    assert field_mismatches(window) == []


def test_an_explicit_convention_survives_a_change_of_stack(panel: TrainingPanel) -> None:
    choose(panel, "training.outputs_held_through_backward", True)
    choose(panel, "training.stack", "torchtitan")
    t = panel.store.scenario.training
    assert (t.stack, t.outputs_held_through_backward) == ("torchtitan", True)


# -- the Conventions section -------------------------------------------------------------


def test_the_section_is_folded_and_its_summary_shows_the_values(panel: TrainingPanel) -> None:
    section = panel.conventions
    assert not section.is_expanded()
    assert section.summary.isVisibleTo(panel)
    assert not panel.rows["training.frozen_weights_dtype"].widget.isVisibleTo(panel)
    # the default scenario: LoRA on the Hugging Face Trainer
    assert section.summary.text() == (
        "outputs released · KV cache built · frozen bf16 · adapters fp32 · loss on fp32 logits"
    )
    QTest.keyClick(section.button, Qt.Key.Key_Space)
    assert section.is_expanded()
    assert panel.rows["training.frozen_weights_dtype"].widget.isVisibleTo(panel)


def test_each_row_shows_the_stacks_value_and_why(panel: TrainingPanel) -> None:
    choose(panel, "training.stack", "lightning")  # bf16-mixed: frozen weights kept in fp32
    lightning = load_stack("lightning")
    texts = {path: combo(panel, path).itemText(0) for path in CONVENTION_ROWS}
    assert texts == {
        "training.outputs_held_through_backward": "from stack (held)",
        "training.kv_cache_in_outputs": "from stack (not built)",
        "training.frozen_weights_dtype": "from stack (fp32)",
        "training.lora.adapter_dtype": "from stack (auto: fp32)",
    }
    for path in CONVENTION_ROWS:
        assert combo(panel, path).currentData() == FROM_STACK
        assert not panel.resets[path].isEnabled()
    tip = combo(panel, "training.outputs_held_through_backward").toolTip()
    assert lightning.label in tip and lightning.why["outputs_held_through_backward"][:30] in tip
    summary = panel.conventions.summary.text()
    assert summary.startswith(
        "LitGPT model · outputs held · no KV cache · previous step held · frozen fp32 · "
        "adapters fp32 · loss"
    )
    assert "*" not in summary
    auto = combo(panel, "training.frozen_weights_dtype")
    assert auto.itemText(auto.findData("auto")) == "auto (bf16)"


def test_overriding_writes_the_value_and_from_stack_writes_none(panel: TrainingPanel) -> None:
    values = {
        "training.outputs_held_through_backward": (True, "outputs held*"),
        "training.kv_cache_in_outputs": (False, "no KV cache*"),
        "training.frozen_weights_dtype": ("fp32", "frozen fp32*"),
        "training.lora.adapter_dtype": ("bf16", "adapters bf16*"),
    }
    for path, (value, words) in values.items():
        choose(panel, path, value)
        assert panel.rows[path].get(panel.store.scenario) == value
        assert panel.resets[path].isEnabled()
        assert words in panel.conventions.summary.text()
    t = panel.store.scenario.training
    assert t.outputs_held_through_backward is True and t.kv_cache_in_outputs is False
    assert (t.frozen_weights_dtype, t.lora.adapter_dtype) == ("fp32", "bf16")
    assert conventions(t).outputs_held
    assert panel.conventions.summary.text().endswith("(* set here)")
    # back to the stack: by the combo's first item, or by the row's reset button
    choose(panel, "training.outputs_held_through_backward", FROM_STACK)
    assert panel.store.scenario.training.outputs_held_through_backward is None
    for path in CONVENTION_ROWS[1:]:
        panel.resets[path].click()
        assert panel.rows[path].get(panel.store.scenario) == FROM_STACK
        assert not panel.resets[path].isEnabled()
    t = panel.store.scenario.training
    assert (t.kv_cache_in_outputs, t.frozen_weights_dtype, t.lora.adapter_dtype) == (None,) * 3
    assert "*" not in panel.conventions.summary.text()


def test_the_adapter_dtype_applies_to_lora_only(panel: TrainingPanel) -> None:
    adapters = combo(panel, "training.lora.adapter_dtype")
    frozen = combo(panel, "training.frozen_weights_dtype")
    assert adapters.isEnabled() and frozen.isEnabled()  # LoRA
    choose(panel, "training.method", "full")
    assert not adapters.isEnabled() and "only LoRA and QLoRA" in adapters.toolTip()
    assert not frozen.isEnabled() and "freezes no weight" in frozen.toolTip()
    assert "adapters" not in panel.conventions.summary.text()
    assert "frozen" not in panel.conventions.summary.text()
    choose(panel, "training.method", "freeze")
    assert frozen.isEnabled() and not adapters.isEnabled()
    choose(panel, "training.method", "qlora")
    assert adapters.isEnabled()


def test_an_adapter_dtype_left_from_lora_shows_but_cannot_be_reset(window: MainWindow) -> None:
    panel = window.training_panel
    choose(panel, "training.lora.adapter_dtype", "bf16")
    choose(panel, "training.method", "full")  # the value stays in the scenario, unused
    assert combo(panel, "training.lora.adapter_dtype").currentData() == "bf16"
    assert not panel.resets["training.lora.adapter_dtype"].isEnabled()
    assert field_mismatches(window) == []


def test_the_loss_choices_chunks_and_the_stacks_loss(panel: TrainingPanel) -> None:
    loss = combo(panel, "training.loss")
    assert [loss.itemData(i) for i in range(loss.count())] == [
        "standard",
        "chunked",
        "no-upcast",
        "chunked-output",
    ]
    chunks = panel.rows["training.loss_chunks"].widget
    reset = panel.resets["training.loss"]
    assert not chunks.isEnabled() and not reset.isEnabled()
    choose(panel, "training.loss", "chunked-output")
    assert chunks.isEnabled() and reset.isEnabled()
    chunks.setValue(16)  # type: ignore[attr-defined]
    assert panel.store.scenario.training.loss_chunks == 16
    assert "loss in 16 chunks" in panel.conventions.summary.text()
    reset.click()  # the Trainer's loss
    assert panel.store.scenario.training.loss == "standard"
    assert not chunks.isEnabled()


def test_checkpointing_offers_per_op_and_names_the_stacks_selective_policy(
    panel: TrainingPanel,
) -> None:
    box = combo(panel, "training.activation_checkpointing")
    assert box.itemText(box.findData("per-op")) == "per-op (torchtitan)"
    selective = box.findData("selective")
    assert box.itemText(selective) == "selective (attention core)"
    choose(panel, "training.stack", "torchtitan")
    assert box.itemText(selective) == "selective (per-op)"
    choose(panel, "training.activation_checkpointing", "selective")
    assert "selective = per-op" in panel.conventions.summary.text()
    choose(panel, "training.activation_checkpointing", "per-op")
    assert panel.store.scenario.training.activation_checkpointing == "per-op"


def test_moe_experts_show_for_moe_models(panel: TrainingPanel) -> None:
    row = panel.rows["training.moe_implementation"].widget
    assert not row.isVisibleTo(panel)  # Llama 3 8B is dense
    mixtral = dataclasses.replace(panel.store.scenario, model=load_model("mixtral-8x7b"))
    panel.store.edit(mixtral)
    assert row.isVisibleTo(panel)
    choose(panel, "training.moe_implementation", "eager")
    assert panel.store.scenario.training.moe_implementation == "eager"


def test_the_optimizer_in_backward_box_needs_no_gradient_accumulation(window: MainWindow) -> None:
    panel = window.training_panel
    box = panel.rows["training.optimizer_in_backward"].widget
    box.setChecked(True)
    assert window.store.scenario.training.optimizer_in_backward
    assert window.store.estimate is not None
    assert window.store.estimate.breakdown["gradients"] == 0
    accumulation = panel.rows["training.gradient_accumulation_steps"].widget
    accumulation.setValue(4)  # refused with the field's message, nothing stored
    assert window.store.scenario.training.gradient_accumulation_steps == 1
    assert panel.is_pending("training.gradient_accumulation_steps")
    window.undo_act.trigger()
    assert field_mismatches(window) == []


def test_the_cuda_runtime_is_in_the_hardware_panel(window: MainWindow) -> None:
    rows = window.hardware_panel.rows
    box = rows["hardware.cuda_runtime"].widget
    assert isinstance(box, QComboBox) and box.currentData() == "cuda12-lazy"
    assert "nvidia-smi" in box.toolTip()
    box.setCurrentIndex(box.findData("cuda11-eager"))
    assert window.store.scenario.hardware.cuda_runtime == "cuda11-eager"


def test_the_sections_fold_is_kept_between_sessions(qtbot: QtBot, tmp_path: Path) -> None:
    first = MainWindow(settings=ini(tmp_path), data_dir=tmp_path)
    qtbot.addWidget(first)
    first.training_panel.conventions.set_expanded(True)
    first.close()
    second = MainWindow(settings=ini(tmp_path), data_dir=tmp_path)
    qtbot.addWidget(second)
    assert second.training_panel.conventions.is_expanded()


# -- the modeling code, the previous step, QLoRA's head and dequantization ----------------


def test_the_new_rows_show_each_stacks_value_and_why(panel: TrainingPanel) -> None:
    choose(panel, "training.method", "qlora")
    texts = {path: combo(panel, path).itemText(0) for path in NEW_ROWS}
    assert texts == {  # the Hugging Face Trainer
        "training.model_implementation": "from stack (transformers)",
        "training.previous_step_held": "from stack (released)",
        "training.reentrant_checkpointing": "from stack (non-reentrant)",
        "training.qlora.quantize_lm_head": "from stack (not quantized)",
        "training.qlora.dequant_dtype": "from stack (auto: bf16)",
        "training.qlora.prepare_kbit": "from stack (not run)",
        "training.qlora.matmul_keeps_input": "from stack (not kept)",
    }
    dequant = combo(panel, "training.qlora.dequant_dtype")
    assert dequant.itemText(dequant.findData("auto")) == "auto (bf16)"
    choose(panel, "training.stack", "lightning")
    lightning = load_stack("lightning")
    texts = {path: combo(panel, path).itemText(0) for path in NEW_ROWS}
    assert texts == {
        "training.model_implementation": "from stack (LitGPT)",
        "training.previous_step_held": "from stack (held)",
        "training.reentrant_checkpointing": "from stack (non-reentrant)",
        "training.qlora.quantize_lm_head": "from stack (quantized)",
        "training.qlora.dequant_dtype": "from stack (fp16)",
        "training.qlora.prepare_kbit": "from stack (not run)",
        "training.qlora.matmul_keeps_input": "from stack (kept)",
    }
    for path in NEW_ROWS:
        box = combo(panel, path)
        assert box.isEnabled() and box.currentData() == FROM_STACK
        assert not panel.resets[path].isEnabled()
        why = html.escape(lightning.why[path.removeprefix("training.")][:30])
        assert lightning.label in box.toolTip() and why in box.toolTip()
    assert panel.conventions.summary.text() == (
        "LitGPT model · outputs held · no KV cache · previous step held · frozen fp32 · "
        "adapters fp32 · 4-bit LM head · dequant fp16 · 4-bit matmul keeps its input · "
        "loss on 16-bit logits"
    )


def test_the_usual_new_conventions_stay_out_of_the_summary(panel: TrainingPanel) -> None:
    choose(panel, "training.method", "qlora")  # on the Trainer: transformers, released, ...
    summary = panel.conventions.summary.text()
    assert summary == (
        "outputs released · KV cache built · frozen bf16 · adapters fp32 · loss on fp32 logits"
    )
    choose(panel, "training.previous_step_held", False)  # the usual value, but set here
    assert "previous step released*" in panel.conventions.summary.text()
    choose(panel, "training.qlora.dequant_dtype", "auto")
    assert "dequant bf16*" in panel.conventions.summary.text()


def test_setting_each_new_convention_writes_its_field(window: MainWindow) -> None:
    panel = window.training_panel
    choose(panel, "training.method", "qlora")
    values = {
        "training.model_implementation": ("litgpt", "LitGPT model*"),
        "training.previous_step_held": (True, "previous step held*"),
        "training.qlora.quantize_lm_head": (True, "4-bit LM head*"),
        "training.qlora.dequant_dtype": ("fp32", "dequant fp32*"),
    }
    for path, (value, words) in values.items():
        choose(panel, path, value)
        assert panel.rows[path].get(window.store.scenario) == value
        assert panel.resets[path].isEnabled()
        assert "Set in this scenario" in combo(panel, path).toolTip()
        assert words in panel.conventions.summary.text()
    t = window.store.scenario.training
    assert (t.model_implementation, t.previous_step_held) == ("litgpt", True)
    assert (t.qlora.quantize_lm_head, t.qlora.dequant_dtype) == (True, "fp32")
    c = conventions(t)
    assert (c.implementation, c.previous_held, c.quantize_head, c.dequant_dtype) == (
        "litgpt",
        True,
        True,
        "fp32",
    )
    assert window.store.estimate is not None
    assert field_mismatches(window) == []
    # back to the stack: by the combo's first item, or by the row's reset button
    choose(panel, "training.model_implementation", FROM_STACK)
    assert window.store.scenario.training.model_implementation is None
    for path in NEW_ROWS[1:]:
        panel.resets[path].click()
        assert panel.rows[path].get(window.store.scenario) == FROM_STACK
        assert not panel.resets[path].isEnabled()
    t = window.store.scenario.training
    assert (t.previous_step_held, t.qlora.quantize_lm_head, t.qlora.dequant_dtype) == (None,) * 3
    assert "*" not in panel.conventions.summary.text()


def test_quantizing_the_head_shrinks_the_parameters(panel: TrainingPanel) -> None:
    choose(panel, "training.method", "qlora")
    assert panel.store.estimate is not None
    before = panel.store.estimate.breakdown["parameters"]
    choose(panel, "training.qlora.quantize_lm_head", True)  # Llama 3 8B: an untied head
    assert panel.store.estimate.breakdown["parameters"] < before


def test_the_qlora_rows_apply_to_qlora_only(panel: TrainingPanel) -> None:
    boxes = [combo(panel, path) for path in QLORA_ROWS]
    for method in ("lora", "full", "freeze"):  # the default scenario is LoRA
        choose(panel, "training.method", method)
        for box in boxes:
            assert not box.isEnabled() and "only QLoRA" in box.toolTip()
        for path in NEW_ROWS[:2]:  # the modeling code and the previous step apply to all
            assert combo(panel, path).isEnabled()
    choose(panel, "training.stack", "lightning")  # quantizes the head, from fp16
    summary = panel.conventions.summary.text()
    assert "LM head" not in summary and "dequant" not in summary
    choose(panel, "training.method", "qlora")
    assert all(box.isEnabled() for box in boxes)
    assert "4-bit LM head · dequant fp16" in panel.conventions.summary.text()


def test_a_qlora_value_left_from_qlora_shows_but_cannot_be_reset(window: MainWindow) -> None:
    panel = window.training_panel
    choose(panel, "training.method", "qlora")
    choose(panel, "training.qlora.quantize_lm_head", True)
    choose(panel, "training.qlora.dequant_dtype", "fp16")
    choose(panel, "training.method", "lora")  # the values stay in the scenario, unused
    assert combo(panel, "training.qlora.quantize_lm_head").currentData() is True
    assert combo(panel, "training.qlora.dequant_dtype").currentData() == "fp16"
    for path in QLORA_ROWS:
        assert not panel.resets[path].isEnabled()
    assert "*" not in panel.conventions.summary.text()
    assert field_mismatches(window) == []


def test_a_scenario_with_the_new_conventions_set_reads_into_the_panel(
    window: MainWindow, tmp_path: Path
) -> None:
    s = on_stack("lightning", method="qlora", model_implementation="transformers")
    training = dataclasses.replace(
        s.training,
        previous_step_held=False,
        reentrant_checkpointing=True,
        qlora=dataclasses.replace(
            s.training.qlora,
            quantize_lm_head=False,
            dequant_dtype="bf16",
            prepare_kbit=True,
            matmul_keeps_input=False,
        ),
    )
    scenario = dataclasses.replace(s, training=training)
    path = tmp_path / "new-conventions.memfit.json"
    save_scenario(scenario, path)
    assert window.open_path(path)
    assert window.store.scenario == scenario
    panel = window.training_panel
    shown = {p: combo(panel, p).currentData() for p in NEW_ROWS}
    assert shown == {
        "training.model_implementation": "transformers",
        "training.previous_step_held": False,
        "training.reentrant_checkpointing": True,
        "training.qlora.quantize_lm_head": False,
        "training.qlora.dequant_dtype": "bf16",
        "training.qlora.prepare_kbit": True,
        "training.qlora.matmul_keeps_input": False,
    }
    assert all(panel.resets[p].isEnabled() for p in NEW_ROWS)
    assert panel.conventions.summary.text() == (
        "transformers model* · outputs held · no KV cache · previous step released* · "
        "frozen fp32 · adapters fp32 · LM head unquantized* · dequant bf16* · "
        "k-bit prepared* · 4-bit matmul input freed* · reentrant checkpointing* · "
        "loss on 16-bit logits  (* set here)"
    )
    assert field_mismatches(window) == []
    # given back to the stack, each is written as None and saved so
    for p in NEW_ROWS:
        choose(panel, p, FROM_STACK)
    assert window.save_to(path)
    data = json.loads(path.read_text(encoding="utf-8"))["training"]
    assert data["model_implementation"] is None and data["previous_step_held"] is None
    assert data["qlora"]["quantize_lm_head"] is None and data["qlora"]["dequant_dtype"] is None
    assert data["qlora"]["prepare_kbit"] is None
    assert data["qlora"]["matmul_keeps_input"] is None
    assert data["reentrant_checkpointing"] is None
    assert load_scenario(path) == window.store.scenario
    window.undo_act.trigger()  # the 4-bit matmul's input, explicit again
    assert window.store.scenario.training.qlora.matmul_keeps_input is False
    window.undo_act.trigger()  # the k-bit preparation, explicit again
    assert window.store.scenario.training.qlora.prepare_kbit is True
    window.undo_act.trigger()  # the dequantization dtype, explicit again
    assert window.store.scenario.training.qlora.dequant_dtype == "bf16"
    assert combo(panel, "training.qlora.dequant_dtype").currentData() == "bf16"


# -- bad states --------------------------------------------------------------------------


def test_a_rejected_convention_shows_its_reason_and_unfolds_the_section(
    window: MainWindow,
) -> None:
    panel = window.training_panel
    before = window.store.scenario
    choose(panel, "training.frozen_weights_dtype", "fp16")  # under bf16 mixed: not modelled
    assert window.store.scenario == before  # nothing stored: the value is pending
    assert panel.is_pending("training.frozen_weights_dtype")
    assert panel.conventions.is_expanded()
    error = panel.rows["training.frozen_weights_dtype"].error
    assert error.isVisibleTo(panel) and error.text()
    window.undo_act.trigger()  # Undo discards it first
    assert combo(panel, "training.frozen_weights_dtype").currentData() == FROM_STACK
    assert field_mismatches(window) == []


def test_every_value_on_every_stack_keeps_the_fields_in_step(window: MainWindow) -> None:
    panel = window.training_panel
    for name in STACKS:
        choose(panel, "training.stack", name)
        for method in ("full", "lora", "qlora", "freeze"):
            choose(panel, "training.method", method)
            for path in ALL_ROWS:
                box = combo(panel, path)
                for index in range(box.count()):
                    box.setCurrentIndex(index)
                    assert field_mismatches(window) == []
                box.setCurrentIndex(0)
    assert conventions_summary(window.store.scenario.training)


def test_an_invalid_scenario_still_shows_its_conventions(panel: TrainingPanel) -> None:
    panel.store.edit(
        dataclasses.replace(bad_mesh(), training=with_stack(bad_mesh().training, "megatron"))
    )
    assert panel.store.error
    assert panel.conventions.summary.text().startswith("outputs released · no KV cache")
    assert combo(panel, "training.stack").currentData() == "megatron"


def test_a_stack_file_that_cannot_be_read_is_named_not_fatal(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = memfit.engine.stacks.load_stack

    def broken(name: str) -> memfit.engine.stacks.Stack:
        if name == "axolotl":
            raise EstimateError("stacks/axolotl.json", "cannot be read: broken")
        return real(name)

    monkeypatch.setattr(memfit.engine.stacks, "load_stack", broken)
    monkeypatch.setattr("memfit.gui.panels.load_stack", broken)
    memo.clear("memfit.engine.stacks.conventions")
    store = ScenarioStore(on_stack("hf-trainer"))
    panel = TrainingPanel(store)
    qtbot.addWidget(panel)
    stack = combo(panel, "training.stack")
    assert stack.itemText(stack.findData("axolotl")) == "axolotl"
    training = dataclasses.replace(store.scenario.training, stack="axolotl")
    store.edit(dataclasses.replace(store.scenario, training=training))
    assert "cannot be read" in panel.conventions.summary.text()
    assert combo(panel, "training.outputs_held_through_backward").itemText(0) == (
        "from stack (unknown)"
    )
    assert "cannot be read" in stack.toolTip()
    memo.clear("memfit.engine.stacks.conventions")


def test_a_file_with_an_unknown_stack_is_refused_with_its_reason(
    window: MainWindow, tmp_path: Path
) -> None:
    path = tmp_path / "bad.memfit.json"
    data = scenario_to_dict(default_scenario())
    data["training"]["stack"] = "no-such-stack"
    path.write_text(json.dumps(data), encoding="utf-8")
    before = window.store.scenario
    assert not window.open_path(path)
    assert window.store.scenario == before


# -- files -------------------------------------------------------------------------------


def test_a_saved_scenario_keeps_its_stack_and_overrides(window: MainWindow, tmp_path: Path) -> None:
    panel = window.training_panel
    choose(panel, "training.stack", "lightning")
    choose(panel, "training.outputs_held_through_backward", False)
    choose(panel, "training.frozen_weights_dtype", "bf16")
    choose(panel, "training.lora.adapter_dtype", "bf16")
    choose(panel, "training.loss", "chunked-output")
    scenario = window.store.scenario
    assert scenario_from_dict(json.loads(json.dumps(scenario_to_dict(scenario)))) == scenario
    path = tmp_path / "stack.memfit.json"
    assert window.save_to(path)
    window.new_act.trigger()
    assert window.store.scenario.training.stack == "hf-trainer"
    assert window.open_path(path)
    assert window.store.scenario == scenario
    assert combo(panel, "training.stack").currentData() == "lightning"
    assert combo(panel, "training.outputs_held_through_backward").currentData() is False
    assert combo(panel, "training.kv_cache_in_outputs").currentData() == FROM_STACK


def test_an_old_file_opens_on_the_hugging_face_trainer(window: MainWindow, tmp_path: Path) -> None:
    path = tmp_path / "old.memfit.json"
    old = {
        "memfit_scenario": 1,
        "model": {"preset": "llama-3-8b"},
        "hardware": {"gpu": "h100-sxm-80gb"},
        "training": {"method": "lora", "micro_batch_size": 2},
    }
    path.write_text(json.dumps(old), encoding="utf-8")
    assert window.open_path(path)
    t = window.store.scenario.training
    assert t.stack == "hf-trainer"
    assert t.outputs_held_through_backward is None and t.kv_cache_in_outputs is None
    assert t.frozen_weights_dtype is None and t.lora.adapter_dtype is None
    assert t.model_implementation is None and t.previous_step_held is None
    assert t.qlora.quantize_lm_head is None and t.qlora.dequant_dtype is None
    for path_ in ALL_ROWS:
        assert combo(window.training_panel, path_).currentData() == FROM_STACK


def test_a_saved_scenario_keeps_its_cuda_runtime(tmp_path: Path) -> None:
    s = default_scenario()
    s = dataclasses.replace(
        s, hardware=dataclasses.replace(s.hardware, cuda_runtime="cuda11-eager")
    )
    save_scenario(s, tmp_path / "cuda.memfit.json")
    assert load_scenario(tmp_path / "cuda.memfit.json") == s


# -- the what-if -------------------------------------------------------------------------


def places(bar: WhatIfBar) -> list[str]:
    """The keys of the shown toggles in their order on the bar (row by row)."""
    key_of = {button: key for key, button in bar.buttons.items()}
    return [key_of[w] for w in bar._grid.widgets() if w in key_of and not w.isHidden()]


def test_the_release_outputs_toggle_follows_the_held_convention(qtbot: QtBot) -> None:
    key = "release-outputs"
    store = ScenarioStore(on_stack("lightning"))  # holds the outputs through backward
    bar = WhatIfBar(store)
    qtbot.addWidget(bar)
    bar.show()
    button: QToolButton = bar.buttons[key]
    assert button.isVisible() and button.isEnabled()
    # one GPU: no DDP buckets, so their toggle is not offered either
    assert places(bar) == [w.key for w in WHATIFS if w.key != "gradient-bucket-view"]
    button.setChecked(True)
    bar.apply(key)
    assert store.scenario.training.outputs_held_through_backward is False
    assert not button.isVisible()  # released now: nothing to offer
    store.edit(on_stack("hf-trainer"))
    assert not button.isVisible()
    # the others close up: no gap where it was (the Trainer carries no previous step either)
    hidden = {key, "release-previous-step", "gradient-bucket-view"}
    assert places(bar) == [w.key for w in WHATIFS if w.key not in hidden]
    store.edit(on_stack("hf-trainer", outputs_held_through_backward=True))
    assert button.isVisible() and button.isEnabled()
    store.edit(dataclasses.replace(bad_mesh(), training=with_stack(bad_mesh().training, "custom")))
    assert store.estimate is None and not button.isVisible()


def test_lora_targets_given_as_module_names_check_their_roles(qtbot: QtBot, tmp_path: Path) -> None:
    s = scenario_from_dict(
        {
            "memfit_scenario": 1,
            "model": {"preset": "gpt2"},
            "hardware": {"gpu": "l4"},
            "training": {"method": "lora", "lora": {"targets": ["c_attn", "c_fc"]}},
        }
    )
    w = MainWindow(settings=ini(tmp_path), data_dir=tmp_path, scenario=s)
    qtbot.addWidget(w)
    assert w.store.scenario.training.lora.targets == ("c_attn", "c_fc")  # kept as written
    assert w.training_panel.targets.value() == ("q_proj", "k_proj", "v_proj", "up_proj")


def test_the_model_panel_counts_the_model_litgpt_builds(qtbot: QtBot) -> None:
    from memfit.engine.params import count_parameters
    from memfit.gui.panels import ModelPanel

    tied = load_model("llama-3.2-1b")
    assert tied.tie_word_embeddings
    store = ScenarioStore(dataclasses.replace(on_stack("lightning"), model=tied))
    panel = ModelPanel(store)
    qtbot.addWidget(panel)
    built = as_built(tied, store.scenario.training)
    # LitGPT gives a tied model a head of its own: the panel counts it, and says so
    assert count_parameters(built).total > count_parameters(tied).total
    text = panel.count.text()
    assert f"{count_parameters(built).total:,}" in text
    assert "LM head of its own" in text
    store.edit(dataclasses.replace(on_stack("hf-trainer"), model=tied))
    text = panel.count.text()
    assert f"{count_parameters(tied).total:,}" in text
    assert "LitGPT" not in text


def test_the_ddp_row_comes_from_the_convention_table(panel: TrainingPanel) -> None:
    """The DDP gradients row is built from its entry of engine.stacks.CONVENTION_FIELDS
    alone: its list, its tooltip with the stack's value, its summary part and its reset."""
    path = "training.gradient_as_bucket_view"
    box = combo(panel, path)
    assert panel.rows[path].label == "DDP gradients"
    assert [box.itemData(i) for i in range(box.count())] == [FROM_STACK, True, False]
    assert box.itemText(0) == "from stack (copied)"
    assert "second copy of the gradients" in box.toolTip()
    assert "DDP" not in conventions_summary(panel.store.scenario.training)
    choose(panel, path, True)
    assert panel.store.scenario.training.gradient_as_bucket_view is True
    assert "DDP gradients as bucket views*" in conventions_summary(panel.store.scenario.training)
    assert panel.resets[path].isEnabled()
    panel.resets[path].click()
    assert panel.store.scenario.training.gradient_as_bucket_view is None


def test_the_rows_are_shown_again_only_where_more_than_the_shape_changes(
    panel: TrainingPanel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Editing the micro-batch, sequence length or accumulation leaves the convention
    rows as they are (no convention reads the shape) without working them out again;
    any other field works them out again."""
    choose(panel, "training.stack", "lightning")
    frozen = combo(panel, "training.frozen_weights_dtype")
    before = (frozen.itemText(0), frozen.itemText(frozen.findData("auto")), frozen.toolTip())
    summaries: list[object] = []
    real = memfit.gui.panels.conventions_summary

    def counted(training: object) -> str:
        summaries.append(training)
        return real(training)  # type: ignore[arg-type]

    monkeypatch.setattr(memfit.gui.panels, "conventions_summary", counted)
    store = panel.store
    for field, value in (
        ("micro_batch_size", 3),
        ("sequence_length", 1024),
        ("gradient_accumulation_steps", 2),
    ):
        t = dataclasses.replace(store.scenario.training, **{field: value})  # type: ignore[arg-type]
        store.edit(dataclasses.replace(store.scenario, training=t))
        assert getattr(store.scenario.training, field) == value
    assert summaries == []
    after = (frozen.itemText(0), frozen.itemText(frozen.findData("auto")), frozen.toolTip())
    assert after == before
    t = dataclasses.replace(store.scenario.training, precision="fp16-mixed")
    store.edit(dataclasses.replace(store.scenario, training=t))
    assert len(summaries) == 1
    assert frozen.itemText(frozen.findData("auto")) == "auto (fp16)"
