"""Validation cases of LitGPT's own model code (the ``lightning`` stack).

Each case is a MemFit scenario on the ``lightning`` stack -- LitGPT's ``GPT``
(``model_implementation`` ``litgpt``), its loop holding the logits and the previous step
(``previous_step_held``), the no-upcast chunked loss -- with real widths and 2 layers, and
the LitGPT config it is traced with (:mod:`validation.litgpt_step`). MHA (Llama-2),
GQA (Llama-3, Mistral), MQA (Falcon, Gemma), a tied model (Llama-3.2-1B, which LitGPT
unties), Phi-1.5's parallel block with partial RoPE; LoRA on q/v and on every linear,
QLoRA, full fine-tuning; the previous step held and not.
"""

from __future__ import annotations

import copy
from typing import Any

from validation.cases import GPU, model_config

LAYERS = 2

#: LitGPT's own configs of models not among :data:`validation.cases.MODELS` (MemFit specs)
SPECS: dict[str, dict[str, Any]] = {
    # litgpt/config.py 'phi-1_5': padded vocabulary 51200, rotary_percentage 0.5, one
    # LayerNorm shared by the parallel attention and MLP, biased fused q/k/v and head
    "phi-1.5": {
        "name": "phi-1_5", "family": "phi", "num_layers": LAYERS, "hidden_size": 2048,
        "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 64,
        "intermediate_size": 8192, "vocab_size": 51200, "max_position_embeddings": 2048,
        "mlp": "plain", "activation": "gelu_tanh", "norm": "layernorm", "norms_per_layer": 1,
        "attention_bias": True, "attention_out_bias": True, "mlp_bias": True,
        "lm_head_bias": True, "fused_qkv": True, "parallel_attention": True,
        "tie_word_embeddings": False, "position_embedding": "rotary",
    },
    # litgpt/config.py 'gemma-2b': multi-query attention, head size 256, GeGLU MLP
    "gemma-2b": {
        "name": "gemma-2b", "family": "gemma", "num_layers": LAYERS, "hidden_size": 2048,
        "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
        "intermediate_size": 16384, "vocab_size": 256000, "max_position_embeddings": 8192,
        "mlp": "gated", "activation": "gelu_tanh", "norm": "rmsnorm",
        "tie_word_embeddings": True, "position_embedding": "rotary",
    },
}  # fmt: skip


def _model(name: str) -> dict[str, Any]:
    if name in SPECS:
        return {"spec": copy.deepcopy(SPECS[name])}
    return model_config(name, LAYERS)


def litgpt_case(
    model: str,
    method: str,
    *,
    held: bool,
    batch: int = 2,
    seq: int = 512,
    rank: int = 8,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    dropout: float = 0.05,
) -> dict[str, Any]:
    training: dict[str, Any] = {
        "stack": "lightning",
        "method": method,
        "precision": "bf16",
        "optimizer": "adamw",
        "optimizer_impl": "foreach",
        "micro_batch_size": batch,
        "sequence_length": seq,
        "gradient_accumulation_steps": 1,
        "activation_checkpointing": "none",
        "attention": "sdpa",
        "previous_step_held": held,
    }
    if method in ("lora", "qlora"):
        training["lora"] = {"rank": rank, "alpha": 16.0, "targets": list(targets),
                            "dropout": dropout}  # fmt: skip
    if method == "qlora":
        training["qlora"] = {"quant_type": "nf4", "block_size": 64, "double_quant": False,
                             "compute_dtype": "bf16"}  # fmt: skip
    target = (
        "all" if "all-linear" in targets else "+".join(t.removesuffix("_proj") for t in targets)
    )
    parts = [model, f"L{LAYERS}", method]
    if method != "full":
        parts.append(f"r{rank}-{target}")
    parts += [f"b{batch}", f"s{seq}", "held" if held else "released"]
    return {
        "id": "litgpt_" + "_".join(parts),
        "family": model,
        "model_name": model,
        "layers": LAYERS,
        "scenario": {
            "memfit_scenario": 1,
            "model": _model(model),
            "hardware": {"gpu": GPU},
            "training": training,
        },
    }


def all_cases() -> list[dict[str, Any]]:
    every = ("all-linear",)
    c = []
    for held in (True, False):
        c += [
            litgpt_case("llama-2-7b", "lora", held=held, rank=32),
            litgpt_case("llama-2-7b", "qlora", held=held, rank=32),
            litgpt_case("llama-3-8b", "qlora", held=held, rank=32),
            litgpt_case("falcon-7b", "qlora", held=held, batch=1, rank=32),
            litgpt_case("gemma-2b", "qlora", held=held, rank=16, targets=every, dropout=0.1),
        ]
    c += [
        litgpt_case("llama-2-7b", "lora", held=True, targets=every, batch=4),
        litgpt_case("llama-2-7b", "full", held=True, batch=1),
        litgpt_case("llama-3-8b", "lora", held=True, rank=32),
        litgpt_case("llama-3-8b", "lora", held=True, targets=every, seq=1024),
        litgpt_case("llama-3.2-1b", "lora", held=True, batch=4),
        litgpt_case("llama-3.2-1b", "qlora", held=True, batch=4, targets=every),
        litgpt_case("llama-3.2-1b", "full", held=True, batch=4),
        litgpt_case("mistral-7b-v0.1", "qlora", held=True, rank=32),
        litgpt_case("falcon-7b", "lora", held=True, batch=1, rank=32),
        litgpt_case("phi-1.5", "lora", held=True, batch=4),
        litgpt_case("phi-1.5", "qlora", held=True, batch=4),
        litgpt_case("gemma-2b", "lora", held=True, rank=8, targets=every, dropout=0.1),
        litgpt_case("gemma-2b", "full", held=True, batch=1),
        litgpt_case("llama-2-7b", "lora", held=True, rank=32, dropout=0.0, seq=2048),
    ]
    return c
