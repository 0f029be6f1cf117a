"""Every field shows the scenario's value; Undo after a rejected value discards it first;
text from files and the engine is plain text; what-ifs that do not apply say why."""

from __future__ import annotations

import json
import re
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QLabel

from memfit.engine.presets import gpu_names, load_model
from memfit.engine.scenario_io import scenario_to_dict
from memfit.gui.chart import rich_text
from memfit.gui.main_window import MainWindow
from memfit.gui.monkey import MessageBoxes
from memfit.gui.store import default_scenario
from tests.gui.helpers import field_mismatches, type_into


def write(path: Path, **sections: object) -> Path:
    data = {"memfit_scenario": 1, **scenario_to_dict(default_scenario()), **sections}
    path.write_text(json.dumps(data))
    return path


# -- Undo after a rejected value -------------------------------------------------------


def test_undo_first_discards_a_rejected_value(window: MainWindow) -> None:
    type_into(window.hardware_panel.rows["hardware.nodes"].widget, "2")
    assert window.store.scenario.hardware.nodes == 2
    kv = window.model_panel.rows["model.num_key_value_heads"]
    type_into(kv.widget, "5")  # does not divide 32 heads: the spec refuses it
    assert window.store.scenario.model.num_key_value_heads == 8  # nothing stored
    assert kv.widget.value() == 5 and not kv.error.isHidden()
    assert window.undo_act.text() == "&Undo Rejected KV heads" and window.undo_act.isEnabled()
    window.undo_act.trigger()
    assert kv.widget.value() == 8 and kv.error.isHidden()
    assert window.store.scenario.hardware.nodes == 2  # the earlier edit stays
    assert window.undo_act.text() == "&Undo Change Nodes"
    window.undo_act.trigger()
    assert window.store.scenario.hardware.nodes == 1
    assert window.hardware_panel.rows["hardware.nodes"].widget.value() == 1


def test_typing_the_scenarios_value_again_clears_the_rejected_one(window: MainWindow) -> None:
    kv = window.model_panel.rows["model.num_key_value_heads"]
    type_into(kv.widget, "5")
    type_into(kv.widget, "8")  # the scenario's own value: nothing to store
    assert kv.error.isHidden() and window.pending_rows() == []
    assert not window.undo_act.isEnabled()


def test_a_rejected_value_naming_another_field_shows_on_the_edited_row(
    window: MainWindow,
) -> None:
    heads = window.model_panel.rows["model.num_attention_heads"]
    type_into(heads.widget, "7")  # 8 KV heads do not divide 7: the spec names KV heads
    assert heads.widget.value() == 7 and not heads.error.isHidden()
    assert field_mismatches(window) == []


# -- every field shows the scenario's value --------------------------------------------


def combo_text(window: MainWindow, path: str) -> str:
    panel = next(p for p in window.panels if path in p.rows)
    combo = panel.rows[path].widget
    assert isinstance(combo, QComboBox)
    return combo.currentText()


def test_a_custom_gpu_from_a_file_shows_in_the_gpu_combo(
    window: MainWindow, tmp_path: Path
) -> None:
    path = write(
        tmp_path / "custom.memfit.json",
        hardware={"gpu": "custom", "memory_gib": 20.5, "utilization_target": 0.855},
    )
    assert window.open_path(path)
    assert window.store.scenario.hardware.gpu.name == "custom"
    gpu = window.hardware_panel.rows["hardware.gpu"].widget
    assert isinstance(gpu, QComboBox)
    assert gpu.currentData() == "custom" and gpu.currentText().startswith("Custom GPU (20.5 GiB)")
    budget = window.hardware_panel.rows["hardware.utilization_target"].widget
    assert budget.text() == "85.5 %"  # not rounded to 86 %
    assert field_mismatches(window) == []
    gpu.setCurrentIndex(gpu.findData("l4"))  # a preset: the custom item is a choice again
    assert window.store.scenario.hardware.gpu.name == "l4"
    assert gpu.count() == len(gpu_names()) + 1
    assert gpu.itemText(gpu.findData("custom")) == "Custom GPU (no preset)"
    window.undo_act.trigger()
    assert gpu.currentData() == "custom" and field_mismatches(window) == []


def test_trainable_parts_no_choice_lists_show(window: MainWindow, tmp_path: Path) -> None:
    training = scenario_to_dict(default_scenario())["training"]
    training.update(method="freeze", freeze={"trainable": ["norms", "embeddings"]})
    training["lora"].update(alpha=16.25, targets=["v_proj", "q_proj", "q_proj"])
    assert window.open_path(write(tmp_path / "freeze.memfit.json", training=training))
    assert combo_text(window, "training.freeze.trainable") == "embeddings, norms"
    assert field_mismatches(window) == []
    combo = window.training_panel.rows["training.freeze.trainable"].widget
    assert isinstance(combo, QComboBox)
    combo.setCurrentIndex(0)
    assert window.store.scenario.training.freeze.trainable == ("lm_head",)
    assert combo.findText("embeddings, norms") < 0  # no stale choice left behind
    method = window.training_panel.rows["training.method"].widget
    assert isinstance(method, QComboBox)
    method.setCurrentIndex(method.findData("lora"))
    alpha = window.training_panel.rows["training.lora.alpha"].widget
    assert alpha.text() == "16.25" and field_mismatches(window) == []


def test_latent_attention_targets_show_for_deepseek(window: MainWindow, tmp_path: Path) -> None:
    training = scenario_to_dict(default_scenario())["training"]
    training["lora"].update(targets=["kv_a_proj"])
    path = write(
        tmp_path / "mla.memfit.json",
        model={"preset": "deepseek-v3"},
        hardware={"gpu": "h200-sxm-141gb", "gpus_per_node": 8},
        training=training,
    )
    assert window.open_path(path)
    box = window.training_panel.targets.boxes["kv_a_proj"]
    assert box.isVisibleTo(window.training_panel) and box.isChecked()
    assert field_mismatches(window) == []


def test_the_preset_combo_never_shows_a_stale_name(window: MainWindow, tmp_path: Path) -> None:
    panel = window.model_panel
    panel.preset.setCurrentIndex(panel.preset.findData("mistral-7b-v0.1"))
    panel.preset.activated.emit(panel.preset.currentIndex())
    type_into(panel.rows["model.num_layers"].widget, "16")
    assert panel.preset.currentText() == "Mistral 7B v0.1 (edited)"
    panel.search.setText("mistral")  # the filter keeps Mistral presets
    path = write(tmp_path / "70b.memfit.json", model={"preset": "llama-3.1-70b"})
    assert window.open_path(path)
    assert panel.preset_shows_current()
    assert panel.preset.currentText().startswith("Llama 3.1 70B")
    texts = [panel.preset.itemText(i) for i in range(panel.preset.count())]
    assert not any("(edited)" in t for t in texts)
    panel.search.setText("gemma")
    assert panel.preset_shows_current()
    window.store.edit(
        window.store.scenario.__class__(
            load_model("gemma-2-9b"), window.store.scenario.hardware, window.store.scenario.training
        )
    )
    assert panel.preset_shows_current() and panel.preset.currentData() == "gemma-2-9b"


# -- plain text --------------------------------------------------------------------------


HTML = '<img src="x" onerror="alert(1)"><b>bold</b>'


def test_file_names_in_messages_are_plain_text(
    window: MainWindow, tmp_path: Path, message_boxes: MessageBoxes
) -> None:
    bad = tmp_path / f"{HTML.replace('/', '')}.memfit.json"
    bad.write_text('{"memfit_scenario": 1, "model": 5}')
    assert not window.open_path(bad)
    shown = message_boxes.shown[-1]
    assert shown.text_format == Qt.TextFormat.PlainText and bad.name in shown.text


def test_labels_that_carry_engine_text_are_plain(window: MainWindow) -> None:
    labels: list[QLabel] = [row.error for p in window.panels for row in p.rows.values()]
    chart = window.chart
    labels += [chart.verdict_label, chart.host_label, chart.note_label, window.summary]
    labels.append(window.notice.label)
    for label in labels:
        assert label.textFormat() == Qt.TextFormat.PlainText, label.objectName()
    chart.set_stale(HTML)
    assert HTML in chart.verdict_text()
    window.notify(HTML)
    assert HTML in window.notice.label.text()


def test_tooltips_escape_engine_text(window: MainWindow) -> None:
    assert "<img" not in rich_text(HTML) and "&lt;img" in rich_text(HTML)
    for button in window.whatif.buttons.values():
        assert button.toolTip().startswith("<qt>")
    cell = window.table.item(0, 0)
    assert cell is not None and cell.toolTip().startswith("<qt>")


# -- what-ifs ----------------------------------------------------------------------------


def test_whatifs_that_do_not_apply_say_why(window: MainWindow) -> None:
    buttons = window.whatif.buttons  # one H100, LoRA, SDPA under bf16 mixed precision
    assert not buttons["zero3"].isEnabled() and "one GPU" in buttons["zero3"].toolTip()
    flash = buttons["flash-attention"]
    assert not flash.isEnabled() and "flash kernel" in flash.toolTip()
    assert not buttons["lora"].isEnabled() and "already" in buttons["lora"].toolTip()
    qlora = buttons["qlora"]
    qlora.setChecked(True)
    (ghost,) = window._ghosts
    # the ghost's note and the tooltip give the same compute cost (over LoRA)
    cost = re.search(r"[+-]\d+ % step time$", ghost.note)
    assert cost is not None and cost.group() + ":" in qlora.toolTip()
    window.hardware_panel.rows["hardware.gpus_per_node"].widget.setValue(8)
    assert buttons["zero3"].isEnabled()


def test_modules_to_save_is_one_choice_of_the_lora_rows(qtbot) -> None:  # type: ignore[no-untyped-def]
    """PEFT's modules_to_save in the app: none, the LM head, the embeddings or both, shown
    with the adapters' rows; each choice is the scenario's field, and back."""
    import dataclasses

    from memfit.engine.presets import load_gpu, load_model
    from memfit.engine.specs import HardwareSpec, LoraSpec, Scenario, TrainingSpec
    from memfit.gui.panels import _modules_to_save_field

    read, write = _modules_to_save_field()
    s = Scenario(load_model("llama-3-8b"), HardwareSpec(load_gpu("h100-sxm-80gb")),
                 TrainingSpec(method="lora"))  # fmt: skip
    assert read(s) == "none"
    for choice, names in (("lm_head", ("lm_head",)), ("embed_tokens", ("embed_tokens",)),
                          ("both", ("embed_tokens", "lm_head")), ("none", ())):  # fmt: skip
        changed = write(s, choice)
        assert tuple(sorted(changed.training.lora.modules_to_save)) == names
        assert read(changed) == choice
    both = dataclasses.replace(
        s.training, lora=LoraSpec(modules_to_save=("lm_head", "embed_tokens"))
    )
    assert read(dataclasses.replace(s, training=both)) == "both"


def test_mixtrals_expert_targets_are_written_as_peft_names_them(
    window: MainWindow, tmp_path: Path
) -> None:
    """PEFT adapts Mixtral's fused experts by the names w1, w3 and w2 only: the gate, up
    and down boxes say so and write those names, which the engine then adapts."""
    training = scenario_to_dict(default_scenario())["training"]
    training.update(method="lora")
    training["lora"].update(targets=["q_proj", "w1", "w3"])
    path = write(
        tmp_path / "mixtral.memfit.json",
        model={"preset": "mixtral-8x7b"},
        hardware={"gpu": "h200-sxm-141gb", "gpus_per_node": 8},
        training=training,
    )
    assert window.open_path(path)
    boxes = window.training_panel.targets.boxes
    assert boxes["gate_proj"].isChecked() and boxes["gate_proj"].text() == "gate (w1)"
    boxes["down_proj"].setChecked(True)
    assert window.store.scenario.training.lora.targets == ("q_proj", "w1", "w3", "w2")
    assert field_mismatches(window) == []
