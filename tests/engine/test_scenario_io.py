"""Scenario files: strict load, atomic save, round trips, Hugging Face configs as they are."""

import dataclasses
import json
from pathlib import Path

import pytest

from memfit.engine.errors import EstimateError
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.scenario_io import (
    load_scenario,
    save_scenario,
    scenario_from_dict,
    scenario_to_dict,
)
from memfit.engine.specs import (
    FreezeSpec,
    HardwareSpec,
    LoraSpec,
    ParallelismSpec,
    Scenario,
    TrainingSpec,
)

DESIGN_EXAMPLE = {
    "memfit_scenario": 1,
    "model": {"preset": "llama-3-8b"},
    "hardware": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nodes": 1},
    "training": {
        "method": "lora",
        "lora": {"rank": 16, "alpha": 32, "targets": ["q_proj", "v_proj"], "dropout": 0.0},
        "precision": "bf16-mixed",
        "optimizer": "adamw",
        "optimizer_impl": "foreach",
        "micro_batch_size": 4,
        "sequence_length": 2048,
        "gradient_accumulation_steps": 1,
        "activation_checkpointing": "none",
        "attention": "sdpa",
        "parallelism": {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero_stage": 0},
        "offload": {"optimizer": "none", "parameters": "none"},
    },
}


def test_design_example_loads() -> None:
    s = scenario_from_dict(DESIGN_EXAMPLE)
    assert s.model == load_model("llama-3-8b")
    assert s.hardware.world_size == 8
    assert s.training.lora.targets == ("q_proj", "v_proj")
    assert s.training.micro_batch_size == 4


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    s = Scenario(
        dataclasses.replace(load_model("qwen2.5-7b"), num_layers=10),  # an edited model
        HardwareSpec(
            load_gpu("a100-sxm-80gb"), gpus_per_node=4, memory_gib=70.5, utilization_target=0.8
        ),
        TrainingSpec(
            method="freeze",
            freeze=FreezeSpec(trainable=("lm_head", "norms"), last_layers=2),
            lora=LoraSpec(rank=8, targets=("all-linear",)),
            parallelism=ParallelismSpec(zero_stage=2),
            precision="fp16-mixed",
        ),
    )
    path = tmp_path / "run.memfit.json"
    save_scenario(s, path)
    assert load_scenario(path) == s
    data = json.loads(path.read_text())
    assert data["memfit_scenario"] == 1
    assert "spec" in data["model"]  # edited: the whole architecture is saved
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_preset_model_is_saved_by_name() -> None:
    assert scenario_to_dict(scenario_from_dict(DESIGN_EXAMPLE))["model"] == {"preset": "llama-3-8b"}


def test_hf_config_keys_as_they_are() -> None:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
        "rope_scaling": {"rope_type": "llama3"},
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 131072,
    }
    s = scenario_from_dict({"memfit_scenario": 1, "model": cfg, "hardware": {"gpu": "l4"}})
    assert dataclasses.replace(
        s.model,
        name="llama-3.2-1b",
        display_name="Llama 3.2 1B",
        source=load_model("llama-3.2-1b").source,
        family="llama",
    ) == load_model("llama-3.2-1b")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({**DESIGN_EXAMPLE, "memfit_scenario": 2}, r"memfit_scenario: got 2, expected 1"),
        ({**DESIGN_EXAMPLE, "extra": 1}, r"extra: unknown key"),
        ({**DESIGN_EXAMPLE, "training": {"batch": 4}}, r"training\.batch: unknown key"),
        (
            {**DESIGN_EXAMPLE, "training": {"lora": {"rank": 8, "scale": 2}}},
            r"training\.lora\.scale: unknown key",
        ),
        (
            {**DESIGN_EXAMPLE, "training": {"lora": {"targets": "q_proj"}}},
            r"training\.lora\.targets: got 'q_proj', expected a list",
        ),
        ({**DESIGN_EXAMPLE, "hardware": {"gpu": "h100"}}, r"hardware\.gpu: unknown preset"),
        ({**DESIGN_EXAMPLE, "hardware": {"gpu": "l4", "vram": 3}}, r"hardware\.vram: unknown key"),
        (
            {**DESIGN_EXAMPLE, "model": {"model_type": "llama", "hidden_size": 64}},
            r"model\.num_attention_heads: missing from the config",
        ),
        ({**DESIGN_EXAMPLE, "model": {"preset": "gpt2", "layers": 3}}, r"model\.layers: unknown"),
        ({"memfit_scenario": 1, "hardware": {"gpu": "l4"}}, r"model: missing"),
        ([1, 2], r"scenario: expected a JSON object"),
    ],
)
def test_strict_load_names_the_problem(data: object, message: str) -> None:
    with pytest.raises(EstimateError, match=message):
        scenario_from_dict(data)


def test_custom_gpu_from_memory_alone() -> None:
    s = scenario_from_dict({**DESIGN_EXAMPLE, "hardware": {"memory_gib": 24}})
    assert s.hardware.capacity_bytes == 24 * 2**30
    assert scenario_from_dict(scenario_to_dict(s)) == s


def test_not_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.memfit.json"
    path.write_text('{"memfit_scenario": 1,')
    with pytest.raises(EstimateError, match=r"scenario: broken\.memfit\.json is not valid JSON"):
        load_scenario(path)


def test_failed_save_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "keep.memfit.json"
    path.write_text("old")
    s = scenario_from_dict(DESIGN_EXAMPLE)

    def boom(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("memfit.engine.scenario_io.os.replace", boom)
    with pytest.raises(OSError):
        save_scenario(s, path)
    assert path.read_text() == "old"
    assert list(tmp_path.iterdir()) == [path]
