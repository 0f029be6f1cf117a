"""Which parameters of an MoE model QLoRA's 4-bit loading quantizes, and which PEFT's
target names adapt, recorded.

    VENV/bin/python -m validation.measure_qlora_moe    # -> tests/validation/qlora_moe_params.json

A Qwen3-MoE and a Mixtral of two small layers (random weights, saved and loaded back) are
loaded with ``BitsAndBytesConfig(load_in_4bit=True)`` on the CPU, as ``from_pretrained``
quantizes a checkpoint; each parameter of the first layer is recorded with its class, shape
and dtype. bitsandbytes replaces ``nn.Linear`` modules with ``Linear4bit``; transformers 5
holds an MoE layer's routed experts as fused 3-D parameters and its router's weight as a
parameter, so neither is a linear to replace (``engine.model_state.quantizable``).

The same models then take LoRA (rank 4, alpha 8) by each naming of the experts -- Mixtral's
``w1``/``w3``/``w2`` and the Qwen2-MoE pattern's ``gate_proj``/``up_proj``/``down_proj`` --
with and without ``q_proj``, and ``all-linear``: the trainable elements PEFT 0.21.2 gives,
or the error it raises (``engine.model_state.expert_lora_roles``).
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

from validation.measure import ROOT

DEFAULT_OUT = ROOT / "tests" / "validation" / "qlora_moe_params.json"

#: the LoRA targets tried on each model
TARGETS: list[Any] = [
    ["w1", "w2", "w3"], ["gate_proj", "up_proj", "down_proj"],
    ["q_proj", "w1", "w3"], ["q_proj", "gate_proj", "up_proj"], "all-linear",
]  # fmt: skip

#: two small layers of each family, the experts' layout as the released configs have it
MODELS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {
        "model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512,
        "moe_intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "vocab_size": 1000,
    },
    "mixtral": {
        "model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512,
        "num_local_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
    },
}  # fmt: skip


def measure(family: str) -> dict[str, Any]:
    import bitsandbytes
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig

    torch.manual_seed(0)
    config = AutoConfig.for_model(**MODELS[family])
    with tempfile.TemporaryDirectory() as folder:
        AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(folder)
        quant = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16
        )
        model = AutoModelForCausalLM.from_pretrained(
            folder, quantization_config=quant, dtype=torch.bfloat16, device_map="cpu"
        )
    trainable: dict[str, Any] = {}
    for targets in TARGETS:
        import peft

        lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets)
        try:
            net = peft.get_peft_model(AutoModelForCausalLM.from_config(config), lora)
        except ValueError as exc:  # NoMatchingPeftModuleError
            trainable[json.dumps(targets)] = f"error: {type(exc).__name__}"
            continue
        trainable[json.dumps(targets)] = sum(p.numel() for p in net.parameters() if p.requires_grad)
    params = {
        name.removeprefix("model.layers.0."): {
            "class": type(p).__name__,
            "shape": list(p.shape),
            "dtype": str(p.dtype).removeprefix("torch."),
        }
        for name, p in model.named_parameters()
        if name.startswith("model.layers.0.")
    }
    return {
        "family": family,
        "config": MODELS[family],
        "layer_0": params,
        "lora_trainable": trainable,
        "environment": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "bitsandbytes": bitsandbytes.__version__,
            "peft": __import__("peft").__version__,
        },
    }


def main() -> None:
    records = [measure(family) for family in MODELS]
    DEFAULT_OUT.write_text(json.dumps(records, indent=1) + "\n")
    for r in records:
        print(r["family"], {k: v["class"] for k, v in r["layer_0"].items()})


if __name__ == "__main__":
    main()
