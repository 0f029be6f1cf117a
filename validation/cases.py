"""The validation cases: MemFit scenarios of real model widths with few layers.

Each model below is the ``config.json`` of a public checkpoint (the keys that shape the
model), with ``num_hidden_layers`` cut to 2-4 and every dropout set to 0.0. A case is a
MemFit scenario file (``engine.scenario_io.scenario_from_dict`` reads it as it is) plus an
id and a family; :mod:`validation.measure` measures each one.

Ground rules that keep the cases inside what the harness reproduces faithfully:

* ``fp32`` with ``attention="sdpa"`` only on models without grouped-query attention: in
  fp32 a GPU runs SDPA with the memory-efficient kernel, whose handling of
  ``enable_gqa`` differs between PyTorch releases;
* sequence lengths stay within each model's ``max_position_embeddings``.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

GPU = "h100-sxm-80gb"

#: config.json keys of the public checkpoints (shape-relevant keys; dropout set to 0.0)
MODELS: dict[str, dict[str, Any]] = {
    "llama-2-7b": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
        "num_key_value_heads": 32, "num_hidden_layers": 32, "vocab_size": 32000,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
        "mlp_bias": False, "attention_dropout": 0.0,
    },
    "llama-3-8b": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
        "mlp_bias": False, "attention_dropout": 0.0,
    },
    "llama-3.2-1b": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 16,
        "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": True,
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
    },
    "mistral-7b-v0.1": {
        "model_type": "mistral", "architectures": ["MistralForCausalLM"],
        "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000,
        "max_position_embeddings": 32768, "sliding_window": 4096, "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "attention_dropout": 0.0,
    },
    "qwen2-7b": {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
        "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "use_sliding_window": False,
        "sliding_window": 131072, "max_window_layers": 28, "attention_dropout": 0.0,
    },
    "qwen2.5-0.5b": {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
        "num_key_value_heads": 2, "num_hidden_layers": 24, "vocab_size": 151936,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "hidden_act": "silu", "tie_word_embeddings": True, "use_sliding_window": False,
        "sliding_window": 32768, "max_window_layers": 21, "attention_dropout": 0.0,
    },
    "gpt2": {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "n_ctx": 1024,
        "vocab_size": 50257, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
        "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0,
        "summary_first_dropout": 0.0,
    },
    "gpt2-xl": {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "n_embd": 1600, "n_head": 25, "n_layer": 48, "n_positions": 1024, "n_ctx": 1024,
        "vocab_size": 50257, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
        "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0,
        "summary_first_dropout": 0.0,
    },
    "mixtral-8x7b": {
        "model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
        "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000,
        "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "hidden_act": "silu",
        "tie_word_embeddings": False, "sliding_window": None, "router_aux_loss_coef": 0.02,
        "output_router_logits": False, "attention_dropout": 0.0,
    },
    "bert-base-uncased": {
        "model_type": "bert", "architectures": ["BertForMaskedLM"],
        "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
        "num_hidden_layers": 12, "vocab_size": 30522, "max_position_embeddings": 512,
        "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
        "attention_probs_dropout_prob": 0.0, "hidden_dropout_prob": 0.0,
        "tie_word_embeddings": True,
    },
    "bert-large-uncased": {
        "model_type": "bert", "architectures": ["BertForMaskedLM"],
        "hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16,
        "num_hidden_layers": 24, "vocab_size": 30522, "max_position_embeddings": 512,
        "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
        "attention_probs_dropout_prob": 0.0, "hidden_dropout_prob": 0.0,
        "tie_word_embeddings": True,
    },
    # multi-query attention (one K/V head); used by the conventions cases
    "falcon-7b": {
        "model_type": "falcon", "architectures": ["FalconForCausalLM"],
        "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
        "vocab_size": 65024, "multi_query": True, "new_decoder_architecture": False,
        "parallel_attn": True, "alibi": False, "bias": False, "layer_norm_epsilon": 1e-05,
        "apply_residual_connection_post_layernorm": False, "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
    },
}  # fmt: skip

FAMILY = {
    "llama-2-7b": "llama",
    "llama-3-8b": "llama",
    "llama-3.2-1b": "llama",
    "mistral-7b-v0.1": "mistral",
    "qwen2-7b": "qwen2",
    "qwen2.5-0.5b": "qwen2",
    "gpt2": "gpt2",
    "gpt2-xl": "gpt2",
    "mixtral-8x7b": "mixtral",
    "bert-base-uncased": "bert",
    "bert-large-uncased": "bert",
    "falcon-7b": "falcon",
}

#: models with grouped-query attention (no fp32 + sdpa cases on them)
GQA = {"llama-3-8b", "llama-3.2-1b", "mistral-7b-v0.1", "qwen2-7b", "qwen2.5-0.5b", "mixtral-8x7b"}


def model_config(name: str, layers: int) -> dict[str, Any]:
    cfg = copy.deepcopy(MODELS[name])
    key = "n_layer" if cfg["model_type"] == "gpt2" else "num_hidden_layers"
    cfg[key] = layers
    cfg["_name_or_path"] = name
    return cfg


def scenario(
    model: str,
    layers: int,
    *,
    precision: str = "bf16-mixed",
    method: str = "full",
    optimizer: str = "adamw",
    impl: str = "foreach",
    batch: int = 1,
    seq: int = 1024,
    ckpt: str = "none",
    attention: str = "sdpa",
    lora: dict[str, Any] | None = None,
    freeze: dict[str, Any] | None = None,
    qlora: dict[str, Any] | None = None,
) -> dict[str, Any]:
    training: dict[str, Any] = {
        "method": method,
        "precision": precision,
        "optimizer": optimizer,
        "optimizer_impl": impl,
        "micro_batch_size": batch,
        "sequence_length": seq,
        "gradient_accumulation_steps": 1,
        "activation_checkpointing": ckpt,
        "attention": attention,
    }
    if method in ("lora", "qlora"):
        training["lora"] = {"rank": 16, "alpha": 32.0, "targets": ["q_proj", "v_proj"],
                            "dropout": 0.0, **(lora or {})}  # fmt: skip
    if method == "qlora":  # the harness's 4-bit stand-in: NF4, blocks of 64, no double quant
        training["qlora"] = {"quant_type": "nf4", "block_size": 64, "double_quant": False,
                             "compute_dtype": "bf16", **(qlora or {})}  # fmt: skip
    if method == "freeze":
        training["freeze"] = {"trainable": ["lm_head"], "last_layers": 0, **(freeze or {})}
    return {
        "memfit_scenario": 1,
        "model": model_config(model, layers),
        "hardware": {"gpu": GPU},
        "training": training,
    }


def case_id(model: str, layers: int, s: dict[str, Any]) -> str:
    t = s["training"]
    parts = [
        model,
        f"L{layers}",
        t["precision"],
        t["method"],
    ]
    if t["method"] in ("lora", "qlora"):
        lo = t["lora"]
        parts.append(f"r{lo['rank']}-" + "+".join(lo["targets"]))
    if t["method"] == "qlora" and t["qlora"].get("prepare_kbit"):
        parts.append("kbit")
    if t["method"] == "qlora" and t["qlora"].get("matmul_keeps_input"):
        parts.append("mmkeep")
    if t["method"] == "freeze":
        fr = t["freeze"]
        named = list(fr["trainable"]) + ([f"last{fr['last_layers']}"] if fr["last_layers"] else [])
        parts.append("+".join(named))
    opt = t["optimizer"] + ("-" + t["optimizer_impl"] if t["optimizer"] == "adamw" else "")
    parts += [opt, t["attention"], f"b{t['micro_batch_size']}", f"s{t['sequence_length']}"]
    if t["activation_checkpointing"] != "none":
        parts.append("ckpt")
    return "_".join(parts)


def _raw_cases() -> list[tuple[str, int, dict[str, Any]]]:
    c: list[tuple[str, int, dict[str, Any]]] = []

    def add(model: str, layers: int, **kw: Any) -> None:
        c.append((model, layers, scenario(model, layers, **kw)))

    # --- Llama-2-7B (MHA): the precision x attention x optimizer grid
    grid = itertools.product(("fp32", "bf16-mixed", "bf16"), ("sdpa", "eager"))
    for precision, attention in grid:
        add("llama-2-7b", 2, precision=precision, attention=attention, batch=1, seq=2048)
    add("llama-2-7b", 2, impl="fused", batch=2, seq=2048)
    add("llama-2-7b", 2, optimizer="sgd", batch=2, seq=2048)
    add("llama-2-7b", 2, precision="bf16", impl="fused", batch=4, seq=1024)
    add("llama-2-7b", 2, ckpt="full", batch=4, seq=4096)
    add("llama-2-7b", 2, ckpt="full", attention="eager", batch=1, seq=4096)
    add("llama-2-7b", 4, method="lora", batch=4, seq=2048)
    add("llama-2-7b", 4, method="lora", ckpt="full", batch=8, seq=2048)
    add("llama-2-7b", 2, method="freeze", freeze={"trainable": ["lm_head", "norms"]}, seq=2048)
    add("llama-2-7b", 4, method="freeze", freeze={"trainable": [], "last_layers": 1},
        batch=2, seq=2048)  # fmt: skip
    add("llama-2-7b", 2, precision="fp32", impl="fused", seq=4096)
    # --- Llama-3-8B (GQA, 128k vocabulary: logits dominate)
    add("llama-3-8b", 2, batch=1, seq=8192)
    add("llama-3-8b", 2, batch=2, seq=4096, attention="eager")
    add("llama-3-8b", 2, precision="bf16", optimizer="sgd", batch=4, seq=2048)
    add("llama-3-8b", 2, impl="fused", ckpt="full", batch=4, seq=4096)
    add("llama-3-8b", 4, method="lora", lora={"targets": ["all-linear"]}, batch=2, seq=4096)
    add("llama-3-8b", 2, method="lora", precision="bf16", batch=1, seq=8192)
    add("llama-3-8b", 2, method="lora", precision="fp32", attention="eager", batch=1, seq=1024)
    add("llama-3-8b", 2, precision="fp32", attention="eager", optimizer="sgd", seq=2048)
    add("llama-3-8b", 2, method="freeze", freeze={"trainable": ["lm_head"]},
        ckpt="full", batch=2, seq=4096)  # fmt: skip
    # --- Llama-3.2-1B (tied embeddings)
    add("llama-3.2-1b", 4, batch=8, seq=1024)
    add("llama-3.2-1b", 4, precision="bf16", batch=4, seq=4096, impl="fused")
    add("llama-3.2-1b", 4, method="lora", lora={"rank": 64, "targets": ["q_proj", "k_proj",
        "v_proj", "o_proj"]}, batch=4, seq=2048)  # fmt: skip
    add("llama-3.2-1b", 3, ckpt="full", attention="eager", batch=2, seq=2048)
    add("llama-3.2-1b", 4, method="freeze", freeze={"trainable": ["lm_head", "norms"]},
        batch=4, seq=2048)  # fmt: skip
    # --- Mistral-7B v0.1 (GQA, sliding window 4096)
    add("mistral-7b-v0.1", 2, batch=2, seq=4096)
    add("mistral-7b-v0.1", 2, batch=1, seq=8192)  # longer than the window: a mask
    add("mistral-7b-v0.1", 2, precision="bf16", attention="eager", batch=1, seq=2048)
    add("mistral-7b-v0.1", 2, precision="fp32", attention="eager", impl="fused", seq=1024)
    add("mistral-7b-v0.1", 3, method="lora", ckpt="full", batch=4, seq=4096)
    add("mistral-7b-v0.1", 2, optimizer="sgd", ckpt="full", batch=2, seq=8192)
    # --- Qwen2-7B and Qwen2.5-0.5B (qkv biases, 152k vocabulary)
    add("qwen2-7b", 2, batch=1, seq=4096)
    add("qwen2-7b", 2, precision="bf16", impl="fused", batch=2, seq=2048)
    add("qwen2-7b", 2, method="lora", batch=2, seq=4096)
    add("qwen2-7b", 2, ckpt="full", attention="eager", batch=1, seq=4096)
    add("qwen2.5-0.5b", 4, batch=8, seq=2048)
    add("qwen2.5-0.5b", 4, precision="fp32", attention="eager", batch=4, seq=1024)
    add("qwen2.5-0.5b", 4, precision="bf16", optimizer="sgd", ckpt="full", batch=8, seq=4096)
    add("qwen2.5-0.5b", 4, method="freeze", freeze={"trainable": ["attention", "norms"]},
        batch=4, seq=2048)  # fmt: skip
    add("qwen2.5-0.5b", 4, method="lora", lora={"rank": 8}, precision="bf16", seq=8192)
    # --- GPT-2 (fused Conv1D projections, learned positions, tied head)
    add("gpt2", 4, precision="fp32", batch=8, seq=1024)
    add("gpt2", 4, precision="fp32", attention="eager", batch=8, seq=1024)
    add("gpt2", 4, batch=8, seq=1024)
    add("gpt2", 4, attention="eager", impl="fused", batch=4, seq=1024)
    add("gpt2", 4, precision="bf16", optimizer="sgd", batch=16, seq=512)
    add("gpt2", 4, ckpt="full", batch=16, seq=1024)
    add("gpt2", 4, method="lora", batch=8, seq=1024)
    add("gpt2-xl", 3, batch=4, seq=1024)
    add("gpt2-xl", 3, precision="fp32", impl="fused", batch=2, seq=1024)
    add("gpt2-xl", 3, method="freeze", freeze={"trainable": ["mlp"]}, batch=4, seq=1024)
    # --- Mixtral-8x7B (8 experts, top-2; grouped_mm experts)
    add("mixtral-8x7b", 2, precision="bf16", batch=1, seq=2048)
    add("mixtral-8x7b", 2, batch=1, seq=1024)
    add("mixtral-8x7b", 2, method="lora", batch=2, seq=4096)
    add("mixtral-8x7b", 2, method="lora", ckpt="full", attention="eager", batch=1, seq=4096)
    add("mixtral-8x7b", 2, precision="bf16", optimizer="sgd", ckpt="full", batch=4, seq=2048)
    add("mixtral-8x7b", 2, method="freeze", freeze={"trainable": ["router", "norms"]},
        batch=2, seq=2048)  # fmt: skip
    # --- BERT (encoder, masked-LM head with labels at every position)
    add("bert-base-uncased", 4, precision="fp32", batch=32, seq=512)
    add("bert-base-uncased", 4, precision="fp32", attention="eager", batch=32, seq=512)
    add("bert-base-uncased", 4, batch=32, seq=512)
    add("bert-base-uncased", 4, optimizer="sgd", attention="eager", batch=16, seq=512)
    add("bert-base-uncased", 4, method="lora", batch=32, seq=512)
    add("bert-large-uncased", 4, impl="fused", ckpt="full", batch=16, seq=512)
    add("bert-large-uncased", 4, precision="bf16", batch=16, seq=512)
    add("bert-large-uncased", 4, method="freeze", freeze={"trainable": ["lm_head"],
        "last_layers": 2}, batch=16, seq=512)  # fmt: skip
    return c


def all_cases() -> list[dict[str, Any]]:
    """Every case: ``{"id", "family", "model_name", "scenario"}``."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for model, layers, s in _raw_cases():
        t = s["training"]
        if t["precision"] == "fp32" and t["attention"] == "sdpa" and model in GQA:
            raise ValueError(f"{model}: fp32 + sdpa on a GQA model is out of scope")
        cid = case_id(model, layers, s)
        if cid in seen:
            raise ValueError(f"duplicate case {cid}")
        seen.add(cid)
        out.append({"id": cid, "family": FAMILY[model], "model_name": model, "scenario": s})
    return out


if __name__ == "__main__":
    for case in all_cases():
        print(case["id"])
    print(len(all_cases()), "cases")
