"""What QLoRA's 4-bit loading quantizes of an MoE model, against the record of a real load.

``qlora_moe_params.json`` (``validation/measure_qlora_moe.py``; transformers 5.24 and
bitsandbytes 0.50.2 on the CPU): bitsandbytes replaces ``nn.Linear`` modules, and
transformers 5's routed experts (fused 3-D parameters) and router weight are not linears,
so they stay in the dtype the checkpoint was loaded in -- for Qwen3-30B-A3B, 29 of its
30.5 billion parameters. MemFit quantized them before: 14 GiB of NF4 where bf16 takes 55.
"""

from __future__ import annotations

import json
from math import prod
from pathlib import Path

import pytest

from memfit.engine.hf_config import model_from_hf_config
from memfit.engine.model_state import split_tensors
from memfit.engine.specs import TrainingSpec

RECORDS = json.loads((Path(__file__).parent / "qlora_moe_params.json").read_text())


def _layer_elements(groups: tuple, layers: int) -> int:
    """Elements of one decoder layer among ``groups``."""
    return sum(g.numel * g.count for g in groups if g.layers is not None) // layers


@pytest.mark.parametrize("record", RECORDS, ids=[r["family"] for r in RECORDS])
def test_the_4bit_base_is_what_bitsandbytes_replaced(record: dict) -> None:
    params = record["layer_0"].values()
    # a Params4bit holds two 4-bit codes a byte
    packed = sum(2 * prod(p["shape"]) for p in params if p["class"] == "Params4bit")
    kept = sum(prod(p["shape"]) for p in params if p["class"] != "Params4bit")
    assert all(p["dtype"] == "bfloat16" for p in params if p["class"] != "Params4bit")
    model = model_from_hf_config(record["config"])
    training = TrainingSpec(method="qlora", precision="bf16-mixed")
    split = split_tensors(model, training)
    layers = model.num_layers
    assert _layer_elements(split.quantized, layers) == packed
    frozen = _layer_elements(split.frozen, layers)
    assert frozen == kept
    assert not any(g.component in ("experts", "router") for g in split.quantized)


def test_litgpts_experts_are_linears_and_quantized() -> None:
    """LitGPT's ``LLaMAMoE`` holds each expert as linears of its own: bitsandbytes
    replaces them."""
    model = model_from_hf_config(RECORDS[0]["config"])
    training = TrainingSpec(method="qlora", precision="bf16-mixed", model_implementation="litgpt")
    assert any(g.component == "experts" for g in split_tensors(model, training).quantized)


@pytest.mark.parametrize("record", RECORDS, ids=[r["family"] for r in RECORDS])
def test_lora_adapts_what_peft_adapts_by_each_naming_of_the_experts(record: dict) -> None:
    """PEFT 0.21.2 maps Mixtral's ``w1``/``w3``/``w2`` and the Qwen2-MoE pattern's
    ``gate_proj``/``up_proj``/``down_proj`` onto transformers 5's fused experts, each
    family only its own names: the other names match nothing -- an error where nothing else
    matches, skipped beside ``q_proj``. The engine trains what PEFT trains, and refuses
    what it refuses, naming the field."""
    from memfit.engine.errors import EstimateError
    from memfit.engine.model_state import model_state
    from memfit.engine.specs import LoraSpec

    model = model_from_hf_config(record["config"])
    for key, peft_trainable in record["lora_trainable"].items():
        targets = json.loads(key)
        lora = LoraSpec(
            rank=4, alpha=8, targets=(targets,) if isinstance(targets, str) else tuple(targets)
        )
        training = TrainingSpec(method="lora", lora=lora)
        if isinstance(peft_trainable, str):
            with pytest.raises(EstimateError) as info:
                model_state(model, training)
            assert info.value.field == "training.lora.targets", key
        else:
            assert model_state(model, training).trainable_params == peft_trainable, key
