"""Training configs of other tools (Axolotl, TrainingArguments/TRL, LitGPT, torchtune,
DeepSpeed, accelerate) read into a scenario: the fields each sets, what is ignored and
why, the merge into a scenario, and hostile input refused with a named error."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.plan import resolve
from memfit.engine.scenario_io import scenario_from_dict, scenario_to_dict
from memfit.engine.stacks import load_stack
from memfit.engine.train_configs import (
    FORMATS,
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    MAX_NODES,
    ImportedConfig,
    apply,
    detect_format,
    import_training_config,
    preset_for,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "train_configs"

#: the app's new document: Llama 3 8B, LoRA, on an H100 (gui.store.default_scenario)
DEFAULT: dict[str, Any] = {
    "memfit_scenario": 1,
    "model": {"preset": "llama-3-8b"},
    "hardware": {"gpu": "h100-sxm-80gb"},
    "training": {"method": "lora", "micro_batch_size": 4, "sequence_length": 2048},
}

#: fixture -> (format, model, preset, training fields it must set, hardware)
EXPECTED: dict[str, tuple[str, str | None, str | None, dict[str, Any], dict[str, Any]]] = {
    "axolotl-llama3-70b-qlora-fsdp.yml": (
        "axolotl",
        "meta-llama/Meta-Llama-3-70B",
        "llama-3-70b",
        {
            "stack": "axolotl",
            "torch_compile": True,
            "method": "qlora",
            "lora": {"rank": 16, "alpha": 32, "dropout": 0.05, "targets": ["all-linear"]},
            "qlora": {"compute_dtype": "bf16"},
            "precision": "bf16-mixed",
            "micro_batch_size": 1,
            "gradient_accumulation_steps": 4,
            "sequence_length": 2048,
            "optimizer": "adamw",
            "optimizer_impl": "fused",
            "activation_checkpointing": "full",
            "reentrant_checkpointing": True,
            "attention": "flash",
            "parallelism": {"framework": "pytorch", "zero_stage": 3},
            "offload": {"optimizer": "cpu", "parameters": "cpu"},
        },
        {},
    ),
    "axolotl-llama3-8b-lora-zero2.yml": (
        "axolotl",
        "NousResearch/Meta-Llama-3-8B",
        "llama-3-8b",
        {
            "stack": "axolotl",
            "method": "lora",
            "lora": {
                "rank": 32,
                "alpha": 16,
                "dropout": 0.05,
                "targets": ["q_proj", "k_proj", "v_proj", "o_proj"],
                "modules_to_save": ["embed_tokens", "lm_head"],
            },
            "precision": "bf16-mixed",
            "micro_batch_size": 2,
            "gradient_accumulation_steps": 8,
            "sequence_length": 4096,
            "optimizer": "adamw-8bit",
            "activation_checkpointing": "full",
            "attention": "sdpa",
            "parallelism": {"framework": "deepspeed", "zero_stage": 2},
        },
        {},
    ),
    "axolotl-qwen-full-zero3.yaml": (
        "axolotl",
        "Qwen/Qwen2.5-7B-Instruct",
        "qwen2.5-7b",
        {
            "stack": "axolotl",
            "method": "full",
            "precision": "bf16-mixed",
            "sequence_length": 8192,
            "micro_batch_size": 1,
            "gradient_accumulation_steps": 16,
            "optimizer": "adamw",
            "optimizer_impl": "foreach",
            "loss": "chunked",
            "attention": "flash",
            "activation_checkpointing": "full",
            "parallelism": {"framework": "deepspeed", "zero_stage": 3},
            "offload": {"optimizer": "cpu", "parameters": "cpu"},
        },
        {},
    ),
    "ds-zero3-offload.json": (
        "deepspeed",
        None,
        None,
        {
            "parallelism": {"framework": "deepspeed", "zero_stage": 3},
            "offload": {"optimizer": "cpu", "parameters": "cpu"},
        },
        {},
    ),
    "deepspeed-zero2-bf16.json": (
        "deepspeed",
        None,
        None,
        {
            "parallelism": {"framework": "deepspeed", "zero_stage": 2},
            "offload": {"optimizer": "cpu"},
            "precision": "bf16-mixed",
            "micro_batch_size": 4,
            "gradient_accumulation_steps": 2,
            "optimizer": "adamw",
            "optimizer_impl": "fused",
        },
        {},
    ),
    "trl-sft-qwen-qlora.yaml": (
        "training-arguments",
        "Qwen/Qwen2.5-7B-Instruct",
        "qwen2.5-7b",
        {
            "stack": "trl-sft",
            "method": "qlora",
            "lora": {"rank": 16, "alpha": 32, "dropout": 0.05, "targets": ["all-linear"]},
            "qlora": {"quant_type": "nf4", "double_quant": True, "compute_dtype": "bf16"},
            "precision": "bf16-mixed",
            "micro_batch_size": 2,
            "gradient_accumulation_steps": 8,
            "optimizer": "paged-adamw-8bit",
            "activation_checkpointing": "full",
            "reentrant_checkpointing": False,
            "attention": "flash",
            "sequence_length": 2048,
        },
        {},
    ),
    "hf-training-args-fsdp.json": (
        "training-arguments",
        None,
        None,
        {
            "stack": "hf-trainer",
            "torch_compile": True,
            "micro_batch_size": 4,
            "gradient_accumulation_steps": 2,
            "precision": "fp16-mixed",
            "optimizer": "adamw",
            "optimizer_impl": "fused",
            "activation_checkpointing": "none",
            "parallelism": {"framework": "pytorch", "zero_stage": 3},
        },
        {},
    ),
    "litgpt-llama-3.1-8b-qlora.yaml": (
        "litgpt",
        "meta-llama/Meta-Llama-3.1-8B",
        "llama-3.1-8b",
        {
            "stack": "lightning",
            "method": "qlora",
            "precision": "bf16",
            "lora": {
                "rank": 32,
                "alpha": 16,
                "dropout": 0.05,
                "targets": ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            },
            "qlora": {"quant_type": "nf4", "double_quant": True, "compute_dtype": "bf16"},
            "micro_batch_size": 2,
            "gradient_accumulation_steps": 4,
            "sequence_length": 512,
            "optimizer": "adamw",
        },
        {"gpus_per_node": 1, "nodes": 1},
    ),
    "litgpt-llama-2-7b-full.yaml": (
        "litgpt",
        "meta-llama/Llama-2-7b-hf",
        "llama-2-7b",
        {
            "stack": "lightning",
            "method": "full",
            "precision": "bf16",
            "micro_batch_size": 4,
            "gradient_accumulation_steps": 4,
            "sequence_length": 512,
            "optimizer": "adamw",
            "activation_checkpointing": "full",
            "parallelism": {"framework": "pytorch", "zero_stage": 3},
        },
        {"gpus_per_node": 4},
    ),
    "torchtune-llama3_1-8b-qlora-single-device.yaml": (
        "torchtune",
        "llama-3.1-8b",
        "llama-3.1-8b",
        {
            "stack": "torchtune",
            "method": "qlora",
            "lora": {
                "rank": 8,
                "alpha": 16,
                "dropout": 0.0,
                "targets": [
                    "q_proj",
                    "v_proj",
                    "k_proj",
                    "o_proj",
                    "gate_proj",
                    "up_proj",
                    "down_proj",
                ],
            },
            "precision": "bf16",
            "micro_batch_size": 2,
            "gradient_accumulation_steps": 8,
            "sequence_length": 2048,
            "activation_checkpointing": "full",
            "offload": {"activations": "cpu"},
            "optimizer": "adamw",
            "optimizer_impl": "fused",
            "loss": "chunked-output",
        },
        {},
    ),
    "torchtune-llama3_2-3b-full-distributed.yaml": (
        "torchtune",
        "llama-3.2-3b",
        "llama-3.2-3b",
        {
            "stack": "torchtune",
            "torch_compile": True,
            "method": "full",
            "precision": "bf16",
            "micro_batch_size": 4,
            "gradient_accumulation_steps": 1,
            "sequence_length": 4096,
            "activation_checkpointing": "full",
            "optimizer": "paged-adamw-8bit",
            "optimizer_in_backward": True,
            "loss": "chunked-output",
            "parallelism": {"framework": "pytorch", "zero_stage": 3},
        },
        {},
    ),
    "accelerate-fsdp2-2x8.yaml": (
        "accelerate",
        None,
        None,
        {
            "precision": "bf16-mixed",
            "activation_checkpointing": "full",
            "parallelism": {"framework": "pytorch", "zero_stage": 3},
        },
        {"gpus_per_node": 8, "nodes": 2},
    ),
    "accelerate-deepspeed-zero3.yaml": (
        "accelerate",
        None,
        None,
        {
            "precision": "bf16-mixed",
            "gradient_accumulation_steps": 4,
            "parallelism": {"framework": "deepspeed", "zero_stage": 3},
            "offload": {"optimizer": "cpu"},
        },
        {"gpus_per_node": 8, "nodes": 1},
    ),
}


def test_every_fixture_has_an_expectation_and_every_format_a_fixture() -> None:
    assert sorted(p.name for p in FIXTURES.iterdir()) == sorted(EXPECTED)
    assert {fmt for fmt, *_ in EXPECTED.values()} == set(FORMATS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_fixture_imports_to_its_fields(name: str) -> None:
    fmt, model, preset, training, hardware = EXPECTED[name]
    path = FIXTURES / name
    assert detect_format(str(path), path.read_text(encoding="utf-8")) == fmt
    imported = import_training_config(path)
    assert (imported.format, imported.source) == (fmt, name)
    assert (imported.model, imported.model_preset) == (model, preset)
    assert imported.training == training
    assert imported.hardware == hardware
    json.dumps(imported.training)  # plain JSON data, as a scenario file holds
    # every field set says which key of the file set it
    for key, value in training.items():
        if isinstance(value, dict):
            assert all(f"{key}.{leaf}" in imported.origins for leaf in value), key
        else:
            assert key in imported.origins, key


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("base", ["short", "saved"])
def test_apply_onto_the_default_scenario_loads_and_estimates(name: str, base: str) -> None:
    # "saved": the scenario as the app saves it, every training field written out
    data = DEFAULT if base == "short" else scenario_to_dict(scenario_from_dict(DEFAULT))
    imported = import_training_config(FIXTURES / name)
    merged = apply(data, imported)
    scenario = scenario_from_dict(merged)
    result = estimate(scenario)
    assert result.device_bytes > 0
    t = scenario.training
    for key, value in imported.training.items():
        if isinstance(value, dict):
            section = getattr(t, key)
            for leaf, v in value.items():
                got = getattr(section, leaf)
                assert (list(got) if isinstance(got, tuple) else got) == v, (key, leaf)
        else:
            assert getattr(t, key) == value, key
    assert scenario.model.name == "llama-3-8b"  # the model stays unless asked
    assert scenario.hardware.gpu.name == "h100-sxm-80gb"
    for key, value in imported.hardware.items():
        assert getattr(scenario.hardware, key) == value
    assert data == (DEFAULT if base == "short" else scenario_to_dict(scenario_from_dict(DEFAULT)))


def test_fields_the_file_does_not_set_keep_the_stack_defaults() -> None:
    saved = scenario_to_dict(scenario_from_dict(DEFAULT))  # loss, optimizer_impl written
    assert (saved["training"]["loss"], saved["training"]["optimizer_impl"]) == (
        "standard",
        "foreach",
    )
    # LitGPT sets neither the loss nor the optimizer's implementation: Lightning's are used
    lit = scenario_from_dict(
        apply(saved, import_training_config(FIXTURES / "litgpt-llama-3.1-8b-qlora.yaml"))
    )
    lightning = load_stack("lightning").defaults
    assert (lit.training.loss, lit.training.optimizer_impl) == (
        lightning["loss"],
        lightning["optimizer_impl"],
    )
    # Axolotl's 8-bit AdamW names no implementation: Axolotl's stack choice
    axo = scenario_from_dict(
        apply(saved, import_training_config(FIXTURES / "axolotl-llama3-8b-lora-zero2.yml"))
    )
    assert axo.training.optimizer_impl == load_stack("axolotl").defaults["optimizer_impl"]
    assert axo.training.loss == "standard"
    # conventions stay the stack's (None) and fields the file leaves out keep the scenario's
    assert axo.training.outputs_held_through_backward is None
    assert axo.training.token_budget is None
    # a DeepSpeed config names no stack: the scenario's stack and loss stay
    ds = scenario_from_dict(
        apply(saved, import_training_config(FIXTURES / "deepspeed-zero2-bf16.json"))
    )
    assert (ds.training.stack, ds.training.loss, ds.training.method) == (
        "hf-trainer",
        "standard",
        "lora",
    )


def test_nested_sections_are_merged_not_replaced() -> None:
    data = json.loads(json.dumps(DEFAULT))
    data["training"]["lora"] = {"rank": 64, "targets": ["q_proj", "k_proj"], "dropout": 0.1}
    data["training"]["parallelism"] = {"tp": 2}
    data["hardware"]["gpus_per_node"] = 8
    text = "base_model: x/y\nadapter: lora\nlora_r: 8\nfsdp_version: 2\nfsdp_config: {}\n"
    merged = apply(data, import_training_config(text=text))
    assert merged["training"]["lora"] == {
        "rank": 8,
        "targets": ["q_proj", "k_proj"],
        "dropout": 0.1,
    }
    assert merged["training"]["parallelism"] == {"tp": 2, "framework": "pytorch", "zero_stage": 3}
    assert merged["hardware"] == {"gpu": "h100-sxm-80gb", "gpus_per_node": 8}
    estimate(scenario_from_dict(merged))


def test_the_model_is_replaced_only_when_asked_and_only_by_a_preset() -> None:
    imported = import_training_config(FIXTURES / "litgpt-llama-2-7b-full.yaml")
    assert apply(DEFAULT, imported)["model"] == {"preset": "llama-3-8b"}
    assert apply(DEFAULT, imported, replace_model=True)["model"] == {"preset": "llama-2-7b"}
    unknown = import_training_config(text="base_model: acme/secret-13b\n")
    assert unknown.model == "acme/secret-13b" and unknown.model_preset is None
    assert any("not a MemFit preset" in n for n in unknown.notes)
    assert apply(DEFAULT, unknown, replace_model=True)["model"] == {"preset": "llama-3-8b"}


@pytest.mark.parametrize(
    ("name", "ignored"),
    [
        ("axolotl-llama3-70b-qlora-fsdp.yml", ["neftune_noise_alpha"]),
        ("axolotl-llama3-8b-lora-zero2.yml", ["load_in_8bit"]),
        (
            "axolotl-qwen-full-zero3.yaml",
            [
                "deepspeed[ds-zero3-offload.json].zero_optimization.stage3_max_live_parameters",
                "deepspeed[ds-zero3-offload.json].zero_optimization.stage3_max_reuse_distance",
                "deepspeed[ds-zero3-offload.json].zero_optimization.sub_group_size",
                "liger_rms_norm",
            ],
        ),
        ("hf-training-args-fsdp.json", []),
        ("torchtune-llama3_2-3b-full-distributed.yaml", []),
        (
            "deepspeed-zero2-bf16.json",
            [
                "zero_optimization.reduce_bucket_size",
                "zero_optimization.allgather_bucket_size",
                "activation_checkpointing",
            ],
        ),
    ],
)
def test_ignored_lists_the_unmodelled_keys_with_a_reason(name: str, ignored: list[str]) -> None:
    imported = import_training_config(FIXTURES / name)
    keys = [item.split(": ", 1)[0] for item in imported.ignored]
    assert keys == ignored
    assert all(len(item.split(": ", 1)[1]) > 5 for item in imported.ignored)


def test_keys_without_a_memory_effect_are_quiet_and_unknown_keys_are_listed() -> None:
    text = (
        "base_model: x/y\nlearning_rate: 0.0002\nwandb_project: p\nseed: 3\n"
        "my_own_switch: true\nlater: null\n"
    )
    imported = import_training_config(text=text)
    assert imported.ignored == ("my_own_switch: not a setting MemFit reads",)
    assert "neftune" not in " ".join(imported.ignored)
    # flags that are off are no reason to say anything
    off = import_training_config(
        text="base_model: x\ntorch_compile: false\nlora_modules_to_save: []\n"
    )
    assert off.ignored == ()


def test_notes_say_what_was_assumed() -> None:
    notes = import_training_config(FIXTURES / "axolotl-llama3-8b-lora-zero2.yml").notes
    assert "sequence_len 4096 used as the sequence length of every micro-batch" in notes[0]
    assert any("zero2.json" in n and "ZeRO stage 2 read from its name" in n for n in notes)
    packed = import_training_config(FIXTURES / "axolotl-llama3-70b-qlora-fsdp.yml").notes
    assert any("packed into rows of 2048 tokens" in n for n in packed)
    torchtune = import_training_config(FIXTURES / "torchtune-llama3_2-3b-full-distributed.yaml")
    assert any("--nproc_per_node" in n for n in torchtune.notes)


def test_a_deepspeed_file_beside_the_config_is_read_and_text_names_no_files() -> None:
    path = FIXTURES / "axolotl-qwen-full-zero3.yaml"
    from_file = import_training_config(path)
    assert from_file.training["offload"] == {"optimizer": "cpu", "parameters": "cpu"}
    assert any("deepspeed[ds-zero3-offload.json]." in item for item in from_file.ignored)
    # the same text without its folder: no file is read, the stage comes from the name
    from_text = import_training_config(text=path.read_text(encoding="utf-8"))
    assert "offload" not in from_text.training
    assert from_text.training["parallelism"] == {"framework": "deepspeed", "zero_stage": 3}
    assert any("was not found: ZeRO stage 3 read from its name" in n for n in from_text.notes)
    plain = import_training_config(text="base_model: x\ndeepspeed: my_ds.json\n")
    assert plain.training["parallelism"] == {"framework": "deepspeed"}
    assert any("the scenario's ZeRO stage" in n for n in plain.notes)


@pytest.mark.parametrize(
    ("text", "stack"),
    [
        ('{"per_device_train_batch_size": 2, "optim": "adamw_torch"}', "hf-trainer"),
        ('{"per_device_train_batch_size": 2, "max_seq_length": 1024}', "trl-sft"),
        ('{"per_device_train_batch_size": 2, "packing": false}', "trl-sft"),
        ('{"per_device_train_batch_size": 2, "dataset_text_field": "text"}', "trl-sft"),
    ],
)
def test_training_arguments_are_the_trainer_unless_sftconfig_keys_say_trl(
    text: str, stack: str
) -> None:
    imported = import_training_config(text=text)
    assert imported.format == "training-arguments"
    assert imported.training["stack"] == stack


@pytest.mark.parametrize(
    ("config", "stage", "hybrid"),
    [
        ({"fsdp_sharding_strategy": "FULL_SHARD"}, 3, False),
        ({"fsdp_sharding_strategy": "SHARD_GRAD_OP"}, 2, False),
        ({"fsdp_sharding_strategy": "NO_SHARD"}, 0, False),
        ({"fsdp_sharding_strategy": "HYBRID_SHARD"}, 3, True),
        ({"fsdp_sharding_strategy": "HYBRID_SHARD_ZERO2"}, 2, True),
        ({"fsdp_sharding_strategy": 1}, 3, False),
        ({"fsdp_sharding_strategy": 2}, 2, False),
        ({"fsdp_reshard_after_forward": "SHARD_GRAD_OP"}, 2, False),
        ({"fsdp_version": 2, "fsdp_reshard_after_forward": False}, 2, False),
        ({"fsdp_version": 2, "fsdp_reshard_after_forward": True}, 3, False),
        ({}, 3, False),
    ],
)
def test_fsdp_strategies_are_zero_stages(config: dict[str, Any], stage: int, hybrid: bool) -> None:
    data = {"distributed_type": "FSDP", "num_processes": 4, "fsdp_config": config}
    par = import_training_config(text=json.dumps(data)).training["parallelism"]
    assert par["zero_stage"] == stage
    assert par.get("hybrid_shard", False) is hybrid


def test_hsdp_replicas_are_read_from_accelerate_and_axolotl() -> None:
    """accelerate's ND parallelism (``parallelism_config_dp_replicate_size``) and Axolotl's
    ``dp_replicate_size``: groups of ranks that each hold one whole set of FSDP shards
    (``training.parallelism.dp_replicate``); the shard size is what the GPUs leave."""
    data = {
        "distributed_type": "FSDP",
        "num_processes": 8,
        "fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": True},
        "parallelism_config": {
            "parallelism_config_dp_replicate_size": 2,
            "parallelism_config_dp_shard_size": 4,
        },
    }
    imported = import_training_config(text=json.dumps(data))
    assert imported.training["parallelism"]["dp_replicate"] == 2
    assert not any("dp_shard_size" in line for line in imported.ignored)
    text = "base_model: meta-llama/Meta-Llama-3-8B\ndp_replicate_size: 2\ndp_shard_size: 4\n"
    text += "fsdp_version: 2\nfsdp_config:\n  reshard_after_forward: true\n"
    axolotl = import_training_config(text=text, fmt="axolotl")
    assert axolotl.training["parallelism"]["dp_replicate"] == 2
    eight = {**DEFAULT, "hardware": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8}}
    scenario = scenario_from_dict(apply(eight, axolotl))
    assert resolve(scenario).mesh.shard == 4


def test_what_a_tool_does_when_a_key_is_absent_is_said() -> None:
    ds = import_training_config(text='{"train_micro_batch_size_per_gpu": 2}', fmt="deepspeed")
    assert ds.training["parallelism"] == {"framework": "deepspeed", "zero_stage": 0}
    assert "zero_optimization.stage not set: DeepSpeed's default, stage 0" in ds.notes
    # YAML reads a bare no as false: accelerate's "no" mixed precision all the same
    bare = import_training_config(text="distributed_type: MULTI_GPU\nmixed_precision: no\n")
    assert bare.training == {
        "precision": "fp32",
        "parallelism": {"framework": "pytorch", "zero_stage": 0},
    }
    trl = import_training_config(FIXTURES / "trl-sft-qwen-qlora.yaml")
    assert not any("use_bnb_nested_quant" in n for n in trl.notes)
    plain = import_training_config(text='{"per_device_train_batch_size": 1, "lora_r": 8}')
    assert plain.ignored == ("lora_r: use_peft is not set, so no adapter is trained",)
    assert "method" not in plain.training


def test_yaml_anchors_and_merge_keys_still_work() -> None:
    text = (
        "defaults: &d\n  micro_batch_size: 2\n  max_seq_length: 1024\n"
        "checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\n"
        "train:\n  <<: *d\n  global_batch_size: 8\n"
        "devices: 1\n"
    )
    imported = import_training_config(text=text)
    assert imported.format == "litgpt"
    assert imported.training["micro_batch_size"] == 2
    assert imported.training["gradient_accumulation_steps"] == 4
    assert imported.training["sequence_length"] == 1024


def test_preset_names_match_up_to_the_owner_and_a_variant_suffix() -> None:
    assert preset_for("meta-llama/Llama-3.1-8B-Instruct") == "llama-3.1-8b"
    assert preset_for("/tmp/Meta-Llama-3.1-8B-Instruct/") == "llama-3.1-8b"
    assert preset_for("NousResearch/Llama-2-7b-hf") == "llama-2-7b"
    assert preset_for("casperhansen/llama-3-70b-fp16") == "llama-3-70b"
    assert preset_for("google/gemma-2-9b-it") == "gemma-2-9b"
    assert preset_for("Qwen/Qwen2.5-0.5B-Instruct") == "qwen2.5-0.5b"
    # another architecture is another model: no guess
    assert preset_for("mistralai/Mistral-7B-Instruct-v0.2") is None
    assert preset_for("TinyLlama/TinyLlama-1.1B") is None


def test_the_format_can_be_given_and_must_be_one_of_the_formats() -> None:
    text = "micro_batch_size: 3\n"
    assert import_training_config(text=text, fmt="axolotl").training["micro_batch_size"] == 3
    with pytest.raises(EstimateError, match=r"format: got 'yaml', expected one of axolotl"):
        import_training_config(text=text, fmt="yaml")
    with pytest.raises(EstimateError, match="give a file or the text"):
        import_training_config()


def test_imported_config_is_frozen() -> None:
    imported = import_training_config(text="base_model: x\n")
    assert isinstance(imported, ImportedConfig)
    with pytest.raises(AttributeError):
        imported.format = "litgpt"  # type: ignore[misc]


# --------------------------------------------------------------------------------------
# malformed and hostile input: one named error each, never a crash or a hang


def _refused(match: str, *, text: str | None = None, path: Path | None = None) -> EstimateError:
    start = time.perf_counter()
    with pytest.raises(EstimateError, match=match) as info:
        import_training_config(path=path, text=text)
    assert time.perf_counter() - start < 2.0
    assert "\n" not in str(info.value)
    return info.value


def test_truncated_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text('{"zero_optimization": {"stage": 3, "offload_param": {"dev')
    _refused(r"ds_config\.json is not valid JSON \(line 1", path=path)
    _refused("not valid JSON", text='{"per_device_train_batch_size": 4,')


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("base_model: x\nlora_target_modules: [q_proj, v_proj\n", "not valid YAML"),
        ("base_model: x\n  - adapter: lora\n bad", "not valid YAML"),
        ("model:\n  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n  lora", "YAML"),
        ("base_model: \x01\n", "not valid YAML"),
        (
            "base_model: !!python/object/apply:os.system ['true']\n",
            "could not determine a constructor",
        ),
        ("micro_batch_size: " + "9" * 5000 + "\n", "not valid YAML"),
        ("base_model: x\n[a, b]: c\n", "not valid YAML"),
        ("a: 1\n---\nb: 2\n", "not valid YAML"),
    ],
)
def test_truncated_or_invalid_yaml_is_refused(text: str, words: str) -> None:
    _refused(words, text=text)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("- base_model: x\n- adapter: lora\n", "holds a list; expected a mapping of keys"),
        ("42\n", r"holds a single value \(42\); expected a mapping"),
        ("'just text'\n", "holds a single value"),
        ("", "is empty"),
        ("# only a comment\n", "is empty"),
        ("[1, 2, 3]", "holds a list"),
    ],
)
def test_a_config_that_is_not_a_mapping_is_refused(text: str, words: str) -> None:
    _refused(words, text=text)


@pytest.mark.parametrize(
    ("text", "field_message"),
    [
        (
            "base_model: x\nmicro_batch_size: '4'\n",
            "micro_batch_size: got '4', expected an integer",
        ),
        (
            "base_model: x\nadapter: lora\nlora_r: -4\n",
            r"lora_r: got -4, expected an integer in \[1, 65536\]",
        ),
        ("base_model: x\nadapter: lora\nlora_r: '16'\n", "lora_r: got '16', expected an integer"),
        (
            "base_model: x\nadapter: lora\nlora_dropout: high\n",
            "lora_dropout: got 'high', expected a number",
        ),
        ("base_model: x\nsequence_len: 0\n", r"sequence_len: got 0, expected an integer in \[1, "),
        ("base_model: x\ngradient_checkpointing: 'yes'\n", "gradient_checkpointing: got 'yes'"),
        (
            "base_model: x\nsample_packing: 'true'\n",
            "sample_packing: got 'true', expected true or false",
        ),
        ('{"per_device_train_batch_size": "8"}', "per_device_train_batch_size: got '8'"),
        ('{"per_device_train_batch_size": 8.5}', "per_device_train_batch_size: got 8.5"),
        ('{"per_device_train_batch_size": true}', "per_device_train_batch_size: got True"),
        (
            "checkpoint_dir: c/x\ntrain:\n  micro_batch_size: two\n",
            "train.micro_batch_size: got 'two', expected an integer",
        ),
        (
            '{"zero_optimization": {"stage": "3"}}',
            "zero_optimization.stage: got '3', expected an integer",
        ),
        (
            '{"zero_optimization": {"stage": 4}}',
            r"zero_optimization.stage: got 4, expected an integer in \[0, 3\]",
        ),
        (
            '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "gpu"}}}',
            "zero_optimization.offload_optimizer.device: got 'gpu', "
            "expected one of none, cpu, nvme",
        ),
        (
            "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_rank: 8.0\n",
            "model.lora_rank: got 8.0, expected an integer",
        ),
        (
            "distributed_type: FSDP\nnum_processes: '8'\n",
            "num_processes: got '8', expected an integer",
        ),
        ("distributed_type: FSDP\nnum_processes: 8\nnum_machines: 3\n", "num_processes: got 8"),
        (
            "distributed_type: FSDP\nnum_processes: 640\n",
            r"num_processes: got 640, expected an integer in \[1, 64\]",
        ),
        (
            "checkpoint_dir: c/x\nprecision: 16-true\n",
            "precision: got '16-true', expected one of bf16-true",
        ),
        (
            "checkpoint_dir: c/x\ndevices: many\n",
            "devices: got 'many', expected a positive integer or auto",
        ),
        (
            "base_model: x\nadapter: llama-adapter\n",
            "adapter: got 'llama-adapter', expected lora or qlora",
        ),
        (
            "base_model: x\nadapter: lora\nlora_target_modules: [q_proj, mystery]\n",
            "lora_target_modules: got 'mystery'",
        ),
        ("base_model: x\nbf16: true\nfp16: true\n", "fp16: bf16 and fp16 are both on"),
        ("base_model: x\nfloat16: true\n", "float16: pure fp16 training"),
        ("distributed_type: TPU\n", "distributed_type: got 'TPU': only GPU training is modelled"),
        ('{"per_device_train_batch_size": 1, "use_cpu": true}', "use_cpu: training on the CPU"),
        (
            "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: EVERYTHING\n",
            "fsdp_config.fsdp_sharding_strategy: got 'EVERYTHING'",
        ),
        (
            "base_model: x\nfsdp: [full_shard, turbo]\n",
            "fsdp: got 'turbo', expected one of full_shard",
        ),
    ],
)
def test_wrong_values_name_the_files_key_and_the_accepted_values(
    text: str, field_message: str
) -> None:
    _refused(field_message, text=text)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            "base_model: x\noptimizer: adamw_superfast\n",
            "optimizer: got 'adamw_superfast', expected one of adamw_torch",
        ),
        (
            "base_model: x\noptimizer: rmsprop\n",
            "optimizer: got 'rmsprop', which MemFit does not model",
        ),
        (
            '{"per_device_train_batch_size": 1, "optim": "galore_adamw"}',
            "optim: got 'galore_adamw', which MemFit does not model",
        ),
        (
            '{"per_device_train_batch_size": 1, "optim": "Adam"}',
            "optim: got 'Adam', expected one of",
        ),
        (
            "enable_activation_checkpointing: true\noptimizer:\n  _component_: my.optim.Turbo\n",
            "optimizer._component_: got 'my.optim.Turbo'",
        ),
        (
            "enable_activation_checkpointing: true\n"
            "optimizer:\n  _component_: torchao.optim.AdamW4bit\n",
            "which MemFit does not model",
        ),
        (
            "checkpoint_dir: c/x\noptimizer: Adagrad\n",
            "optimizer: got 'torch.optim.Adagrad', which MemFit does not model",
        ),
        (
            '{"zero_optimization": {"stage": 2}, "optimizer": {"type": "OneBitAdam"}}',
            "optimizer.type: got 'OneBitAdam', expected one of Adam, AdamW, Lion",
        ),
    ],
)
def test_unknown_optimizer_names_are_errors(text: str, words: str) -> None:
    _refused(words, text=text)


def test_a_10_mb_file_of_junk_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"\x8f junk " * (10 << 17))
    error = _refused(f"over {MAX_CONFIG_BYTES:,} bytes are refused", path=path)
    assert "config.yaml" in str(error)
    _refused("are refused", text="x" * (10 << 20))
    _refused("are refused", text="é" * (MAX_CONFIG_BYTES // 2 + 1))  # counted in UTF-8 bytes


def test_without_libyaml_the_same_checks_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    import memfit.engine.train_configs.parse as tc

    monkeypatch.setattr(tc, "_EVENTS_LOADER", yaml.SafeLoader)
    imported = import_training_config(FIXTURES / "torchtune-llama3_1-8b-qlora-single-device.yaml")
    assert imported.training == EXPECTED["torchtune-llama3_1-8b-qlora-single-device.yaml"][3]
    _refused("a recursive alias", text="a: &a [*a]\n")
    _refused("nested deeper than", text="a: " + "[" * 5000 + "]" * 5000 + "\n")
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    _refused("more than", text="\n".join(levels))


def test_a_large_config_within_the_caps_is_read_quickly() -> None:
    keys = (MAX_NODES - 10) // 2
    text = "base_model: x/y\n" + "".join(f"extra_{n}: {n}\n" for n in range(keys))
    start = time.perf_counter()
    imported = import_training_config(text=text)
    assert time.perf_counter() - start < 5.0
    assert len(imported.ignored) == keys


def test_use_reentrant_in_the_checkpointing_kwargs_is_the_reentrant_convention() -> None:
    """transformers hands ``gradient_checkpointing_kwargs`` to ``torch.utils.checkpoint``:
    its ``use_reentrant`` is ``reentrant_checkpointing``; without checkpointing it is
    moot, and a value that is not a boolean is refused naming the key."""
    on = "gradient_checkpointing: true\ngradient_checkpointing_kwargs:\n  use_reentrant: {}\n"
    for value in (True, False):
        text = "per_device_train_batch_size: 1\n" + on.format(str(value).lower())
        imported = import_training_config(text=text, fmt="training-arguments")
        assert imported.training["reentrant_checkpointing"] is value
        assert "gradient_checkpointing_kwargs.use_reentrant" in imported.origins.values()
    off = "per_device_train_batch_size: 1\ngradient_checkpointing: false\n"
    off += "gradient_checkpointing_kwargs:\n  use_reentrant: true\n"
    imported = import_training_config(text=off, fmt="training-arguments")
    assert "reentrant_checkpointing" not in imported.training
    with pytest.raises(EstimateError) as err:
        import_training_config(text=on.format("'yes'"), fmt="training-arguments")
    assert err.value.field == "gradient_checkpointing_kwargs.use_reentrant"


def test_a_yaml_bomb_is_refused_before_it_is_built() -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        prev = f"*a{i - 1}"
        levels.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    _refused(
        f"the text is refused: more than {MAX_NODES:,} values with its aliases",
        text="\n".join(levels),
    )


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a: &a [*a]\n", r"refused: a recursive alias \(\*a\)"),
        ("a: &a {b: {c: *a}}\n", "a recursive alias"),
        ("a: " + "[" * 100_000 + "]" * 100_000 + "\n", f"nested deeper than {MAX_DEPTH} levels"),
        ("".join("  " * i + f"k{i}:\n" for i in range(MAX_DEPTH + 5)), "nested deeper than"),
        # each level within the cap, deeper than it once the alias is expanded
        (
            "b: &b " + "[" * 25 + "]" * 25 + "\nc: " + "[" * 10 + "*b" + "]" * 10 + "\n",
            "nested deeper",
        ),
        ("base_model: *nowhere\n", "not valid YAML"),
        ('{"a": ' * 30_000 + "1" + "}" * 30_000, "nested too deeply"),
    ],
)
def test_recursive_aliases_and_deep_nesting_are_refused(text: str, words: str) -> None:
    _refused(words, text=text)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("lora_r: 8\n", "not a training config MemFit recognises"),
        ("name: run\nsteps: 3\n", "not a training config MemFit recognises"),
        (
            "base_model: x\nper_device_train_batch_size: 2\n",
            "could be axolotl or training-arguments",
        ),
    ],
)
def test_a_config_of_no_format_or_of_two_is_refused(text: str, words: str) -> None:
    _refused(words, text=text)
    with pytest.raises(EstimateError, match=words):
        detect_format(None, text)


def test_cross_field_errors_name_the_files_key() -> None:
    text = (
        "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\n"
        "gradient_accumulation_steps: 4\noptimizer_in_bwd: true\n"
    )
    _refused(
        r"optimizer_in_bwd: needs gradient_accumulation_steps 1 "
        r".*\(as training.optimizer_in_backward\)",
        text=text,
    )
    # a rank the scenario's model cannot take: the file's key, found when merging
    imported = import_training_config(text="base_model: x\nadapter: lora\nlora_r: 8192\n")
    with pytest.raises(
        EstimateError, match=r"^lora_r: got 8192, expected an integer in \[1, 4096\]"
    ):
        apply(DEFAULT, imported)
    litgpt = "checkpoint_dir: c/x\nquantize: bnb.nf4\nlora_r: 8\ndevices: 2\n"
    _refused("quantize: LitGPT does not quantize on more than one device", text=litgpt)


def test_a_missing_or_special_file_is_a_named_error(tmp_path: Path) -> None:
    _refused("cannot read nothing.yaml", path=tmp_path / "nothing.yaml")
    _refused("is a directory", path=tmp_path)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("axolotl-llama3-70b-qlora-fsdp.yml", "torch_compile"),
        ("hf-training-args-fsdp.json", "torch_compile"),
        ("torchtune-llama3_2-3b-full-distributed.yaml", "compile"),
    ],
)
def test_torch_compile_is_read_as_the_field(name: str, key: str) -> None:
    """A config that turns torch.compile on sets ``training.torch_compile`` (the step time
    fuses the element-wise ops, and memory keeps what inductor's partitioner keeps): it is
    modelled, so no note says otherwise."""
    imported = import_training_config(FIXTURES / name)
    assert imported.training["torch_compile"] is True
    assert imported.origins["torch_compile"] == key
    assert not any("torch.compile" in n for n in imported.notes)
    off = import_training_config(text="base_model: x\ntorch_compile: false\n")
    assert "torch_compile" not in off.training


def test_modules_to_save_are_read_as_peft_names_them() -> None:
    """``lora_modules_to_save`` maps to ``lora.modules_to_save`` by each name's last part
    (PEFT matches suffixes); names other than lm_head and embed_tokens are reported."""
    axolotl = import_training_config(
        text="base_model: x\nadapter: lora\n"
        "lora_modules_to_save: [model.embed_tokens, lm_head, score]\n"
    )
    assert axolotl.training["lora"]["modules_to_save"] == ["embed_tokens", "lm_head"]
    assert [i for i in axolotl.ignored if i.startswith("lora_modules_to_save")] == [
        "lora_modules_to_save: 'score': only lm_head and embed_tokens are modelled as modules "
        "to save"
    ]
    full = import_training_config(text="base_model: x\nlora_modules_to_save: [lm_head]\n")
    assert "lora" not in full.training
    assert any(i.startswith("lora_modules_to_save: no adapter") for i in full.ignored)


def test_accelerates_fsdp_policy_is_read_as_the_policy_fields() -> None:
    """``mixed_precision_policy`` of accelerate's FSDP config sets the gathered and the
    reduced dtype (one dtype for both, or ``param_dtype`` and ``reduce_dtype``); a dtype
    FSDP's policy cannot take is refused, naming the key."""
    base = "distributed_type: FSDP\nmixed_precision: bf16\nfsdp_config:\n  fsdp_version: 2\n"
    both = import_training_config(
        text=base + "  mixed_precision_policy: {param_dtype: float32, reduce_dtype: bfloat16}\n"
    )
    par = both.training["parallelism"]
    assert (par["fsdp_param_dtype"], par["fsdp_reduce_dtype"]) == ("fp32", "compute")
    assert both.origins["parallelism.fsdp_reduce_dtype"] == (
        "fsdp_config.mixed_precision_policy.reduce_dtype"
    )
    one = import_training_config(text=base + "  mixed_precision_policy: fp32\n")
    assert one.training["parallelism"]["fsdp_reduce_dtype"] == "fp32"
    with pytest.raises(EstimateError, match=r"mixed_precision_policy\.param_dtype.*int8"):
        import_training_config(text=base + "  mixed_precision_policy: {param_dtype: int8}\n")
