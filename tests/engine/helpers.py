"""Small specs the engine tests share: a tiny Llama-style model, a step context, and a
scenario from a preset, a GPU and the sections as a scenario file writes them."""

import dataclasses
import json
from typing import Any

from memfit.engine.layers import Ctx
from memfit.engine.locate import resources
from memfit.engine.scenario_io import scenario_from_dict
from memfit.engine.specs import ModelSpec, Scenario


def tiny_model(**changes: object) -> ModelSpec:
    """Two layers, hidden 64, 4 heads of 16 (2 KV heads), MLP 128, vocabulary 1000."""
    base = ModelSpec(
        name="tiny",
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=1000,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def full_ctx(**changes: object) -> Ctx:
    """Full fine-tuning, no LoRA, SDPA; batch and sequence 1 unless changed."""
    base = Ctx(
        batch=1,
        seq=1,
        mode="fp32",
        attention="sdpa",
        lora_rank=0,
        lora_roles=frozenset(),
        trainable=frozenset({"all"}),
        frozen_bytes=4,
        quantized=False,
        dropout=0.0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def preset_scenario(model: str, gpu: str, training: dict[str, Any], **hardware: int) -> Scenario:
    """The preset ``model`` on the GPU preset ``gpu``, with ``training`` and ``hardware``
    as a scenario file's sections hold them."""
    return scenario_from_dict(
        {
            "memfit_scenario": 1,
            "model": {"preset": model},
            "hardware": {"gpu": gpu, **hardware},
            "training": training,
        }
    )


def builtin_preset(kind: str, name: str) -> dict[str, Any]:
    """The built-in preset file ``kind/name.json`` as it is written (a custom preset's
    starting point)."""
    data = json.loads((resources() / kind / f"{name}.json").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data
