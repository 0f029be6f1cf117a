"""Read a Hugging Face ``config.json`` as it is into a :class:`~engine.specs.ModelSpec`.

Keys are read by ``model_type`` the way each family's ``configuration_*.py`` in
``transformers`` defines them (GPT-2 says ``n_layer``, Falcon ``n_head`` or
``num_attention_heads``, DeepSeek ``n_routed_experts``...). Keys the estimate does not
need are ignored; a key it needs and cannot default is an error naming it.

>>> spec = model_from_hf_config({"model_type": "llama", "num_hidden_layers": 2,
...     "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
...     "vocab_size": 1000})
>>> (spec.num_key_value_heads, spec.head_dim, spec.tie_word_embeddings)
(4, 16, False)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.errors import EstimateError, check_bool, check_finite, check_text, shown
from engine.specs import ModelSpec

Config = Mapping[str, Any]

#: model_type values read with the Llama-style keys (plus the family's switches below)
LLAMA_LIKE = (
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "gemma3",
    "phi3", "olmo", "olmo2", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3",
    "granite", "cohere", "starcoder2", "internlm2", "yi",
)  # fmt: skip


def _get(cfg: Config, *keys: str, default: Any = None, required: bool = False) -> Any:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    if required:
        raise EstimateError(f"model.{keys[0]}", "missing from the config (required)")
    return default


def _field(cfg: Config, keys: tuple[str, ...]) -> str:
    """The field an error names: the key the config used, else the first one read."""
    return "model." + next((k for k in keys if cfg.get(k) is not None), keys[0])


def _int(cfg: Config, *keys: str, default: int | None = None, lo: int = 0) -> int:
    """An integer of at least ``lo``; a string, a bool or a float is an error."""
    value = _get(cfg, *keys, default=default, required=default is None)
    if isinstance(value, bool) or not isinstance(value, int):
        raise EstimateError(_field(cfg, keys), f"got {shown(value)}, expected an integer")
    if value < lo:
        raise EstimateError(_field(cfg, keys), f"got {shown(value)}, expected at least {lo}")
    return value


def _bool(cfg: Config, key: str, default: bool) -> bool:
    """``true`` or ``false``; the string "false" is not false, so it is an error."""
    value = _get(cfg, key, default=default)
    return check_bool(f"model.{key}", value)


def _float(cfg: Config, *keys: str, default: float) -> float:
    value = _get(cfg, *keys, default=default)
    return check_finite(_field(cfg, keys), value)


def _activation(cfg: Config, *keys: str, default: str) -> str:
    name = check_text(_field(cfg, keys), _get(cfg, *keys, default=default)).lower()
    if name in ("silu", "swish", "swiglu"):
        return "silu"
    if name == "gelu_new":  # NewGELUActivation, written in Python ops
        return "gelu_new"
    if "tanh" in name or name in ("gelu_fast", "gelu_pytorch_tanh"):
        return "gelu_tanh"
    if name.startswith("gelu"):
        return "gelu"
    if name in ("relu2", "relu_squared"):
        return "relu2"
    if name == "relu":
        return "relu"
    raise EstimateError(
        _field(cfg, keys), f"got {shown(name)}, expected silu, gelu or relu variants"
    )


def _common(cfg: Config, name: str) -> dict[str, Any]:
    heads = _int(cfg, "num_attention_heads", lo=1)
    hidden = _int(cfg, "hidden_size", lo=1)
    return {
        "name": name,
        "num_layers": _int(cfg, "num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": _int(cfg, "num_key_value_heads", default=heads),
        "head_dim": _int(cfg, "head_dim", default=hidden // heads),
        "intermediate_size": _int(cfg, "intermediate_size"),
        "vocab_size": _int(cfg, "vocab_size"),
        "max_position_embeddings": _int(cfg, "max_position_embeddings", default=4096),
        "tie_word_embeddings": _bool(cfg, "tie_word_embeddings", False),
        "activation": _activation(cfg, "hidden_act", "hidden_activation", default="silu"),
        "attention_bias": _bool(cfg, "attention_bias", False),
        "attention_out_bias": _bool(cfg, "attention_bias", False),
        "mlp_bias": _bool(cfg, "mlp_bias", False),
        "attention_dropout": _float(cfg, "attention_dropout", default=0.0),
        # Qwen2/3 configs carry a sliding_window that is off unless use_sliding_window
        "sliding_window": _int(cfg, "sliding_window", default=0)
        if _bool(cfg, "use_sliding_window", True)
        else 0,
    }


def _llama_like(cfg: Config, name: str) -> dict[str, Any]:
    mt = cfg.get("model_type", "llama")
    spec = _common(cfg, name)
    spec["family"] = mt
    if mt in ("qwen2", "qwen2_moe"):  # q/k/v carry biases, o_proj does not
        spec["attention_bias"] = True
        spec["attention_out_bias"] = False
        spec["tie_word_embeddings"] = _bool(cfg, "tie_word_embeddings", False)
    if mt in ("gemma", "gemma2", "gemma3_text", "gemma3"):
        spec["tie_word_embeddings"] = _bool(cfg, "tie_word_embeddings", True)
        spec["activation"] = "gelu_tanh"
        if mt != "gemma":
            spec["norms_per_layer"] = 4  # input, post-attention, pre- and post-feedforward
        if mt.startswith("gemma3"):
            spec["qk_norm"] = "head"
    if mt in ("qwen3", "qwen3_moe"):
        spec["qk_norm"] = "head"
    if mt == "phi3":
        spec["fused_qkv"] = True
        spec["fused_gate_up"] = True
    if mt == "olmo":  # LayerNorm without weights or bias; no final-norm parameters either
        spec["norm"] = "layernorm-nonparam"
    if mt == "olmo2":
        spec["qk_norm"] = "full"
    if mt == "mixtral":
        spec["num_experts"] = _int(cfg, "num_local_experts")
        spec["num_experts_per_tok"] = _int(cfg, "num_experts_per_tok")
        spec["moe_intermediate_size"] = spec["intermediate_size"]
    if mt in ("qwen2_moe", "qwen3_moe"):
        spec["num_experts"] = _int(cfg, "num_experts")
        spec["num_experts_per_tok"] = _int(cfg, "num_experts_per_tok")
        spec["moe_intermediate_size"] = _int(cfg, "moe_intermediate_size")
        shared = _int(cfg, "shared_expert_intermediate_size", default=0)
        if shared:
            spec["num_shared_experts"] = 1
            spec["shared_expert_intermediate_size"] = shared
            spec["shared_expert_gate"] = True
    if mt in ("deepseek_v2", "deepseek_v3"):
        spec["num_experts"] = _int(cfg, "n_routed_experts")
        spec["num_experts_per_tok"] = _int(cfg, "num_experts_per_tok")
        spec["moe_intermediate_size"] = _int(cfg, "moe_intermediate_size")
        spec["num_shared_experts"] = _int(cfg, "n_shared_experts", default=0)
        spec["first_dense_layers"] = _int(cfg, "first_k_dense_replace", default=0)
        spec["router_bias"] = cfg.get("topk_method") == "noaux_tc"
        spec["q_lora_rank"] = _int(cfg, "q_lora_rank", default=0)
        spec["kv_lora_rank"] = _int(cfg, "kv_lora_rank")
        spec["qk_rope_head_dim"] = _int(cfg, "qk_rope_head_dim")
        spec["qk_nope_head_dim"] = _int(cfg, "qk_nope_head_dim")
        spec["v_head_dim"] = _int(cfg, "v_head_dim")
        spec["head_dim"] = spec["qk_rope_head_dim"] + spec["qk_nope_head_dim"]
    return spec


def _gpt2(cfg: Config, name: str) -> dict[str, Any]:
    hidden = _int(cfg, "n_embd", "hidden_size", lo=1)
    heads = _int(cfg, "n_head", "num_attention_heads", lo=1)
    return {
        "name": name,
        "family": "gpt2",
        "num_layers": _int(cfg, "n_layer", "num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": hidden // heads,
        "intermediate_size": _int(cfg, "n_inner", default=4 * hidden),
        "vocab_size": _int(cfg, "vocab_size"),
        "max_position_embeddings": _int(cfg, "n_positions", "max_position_embeddings"),
        "mlp": "plain",
        "activation": _activation(cfg, "activation_function", default="gelu_new"),
        "norm": "layernorm",
        "attention_bias": True,
        "attention_out_bias": True,
        "mlp_bias": True,
        "position_embedding": "learned",
        "tie_word_embeddings": _bool(cfg, "tie_word_embeddings", True),
        "fused_qkv": True,
        "attention_dropout": _float(cfg, "attn_pdrop", default=0.1),
        "hidden_dropout": _float(cfg, "resid_pdrop", default=0.1),
    }


def _gpt_neox(cfg: Config, name: str) -> dict[str, Any]:
    spec = _common(cfg, name)
    bias = _bool(cfg, "attention_bias", True)
    spec.update(
        family="gpt_neox",
        mlp="plain",
        norm="layernorm",
        attention_bias=bias,
        attention_out_bias=bias,
        mlp_bias=True,
        fused_qkv=True,
        parallel_attention=_bool(cfg, "use_parallel_residual", True),
        activation=_activation(cfg, "hidden_act", default="gelu"),
    )
    return spec


def _falcon(cfg: Config, name: str) -> dict[str, Any]:
    hidden = _int(cfg, "hidden_size", "n_embed", lo=1)
    heads = _int(cfg, "num_attention_heads", "n_head", lo=1)
    new_arch = _bool(cfg, "new_decoder_architecture", False)
    if new_arch:
        kv = _int(cfg, "num_kv_heads", "n_head_kv", default=heads)
    else:
        kv = 1 if _bool(cfg, "multi_query", True) else heads
    bias = _bool(cfg, "bias", False)
    parallel = _bool(cfg, "parallel_attn", True)
    return {
        "name": name,
        "family": "falcon",
        "num_layers": _int(cfg, "num_hidden_layers", "n_layer"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hidden // heads,
        "intermediate_size": _int(cfg, "ffn_hidden_size", default=4 * hidden),
        "vocab_size": _int(cfg, "vocab_size"),
        "max_position_embeddings": _int(cfg, "max_position_embeddings", default=2048),
        "mlp": "plain",
        "activation": "gelu",
        "norm": "layernorm",
        "norms_per_layer": 2 if new_arch or not parallel else 1,
        # FalconAttention hands SDPA the single key/value head as it is, with a mask
        "sdpa_math": not new_arch and kv == 1 < heads,
        "attention_bias": bias,
        "attention_out_bias": bias,
        "mlp_bias": bias,
        "position_embedding": "alibi" if _bool(cfg, "alibi", False) else "rotary",
        "tie_word_embeddings": _bool(cfg, "tie_word_embeddings", True),
        "fused_qkv": True,
        "parallel_attention": parallel,
    }


def _bert(cfg: Config, name: str) -> dict[str, Any]:
    spec = _common(cfg, name)
    spec.update(
        family=cfg.get("model_type", "bert"),
        architecture="encoder",
        mlp="plain",
        activation=_activation(cfg, "hidden_act", default="gelu"),
        norm="layernorm",
        final_norm=False,
        attention_bias=True,
        attention_out_bias=True,
        mlp_bias=True,
        position_embedding="learned",
        type_vocab_size=_int(cfg, "type_vocab_size", default=2),
        embedding_norm=True,
        tie_word_embeddings=_bool(cfg, "tie_word_embeddings", True),
        pooler=True,
        lm_head_transform=True,
        lm_head_bias=True,
        attention_dropout=_float(cfg, "attention_probs_dropout_prob", default=0.1),
        hidden_dropout=_float(cfg, "hidden_dropout_prob", default=0.1),
        sliding_window=0,
    )
    return spec


_READERS: dict[str, Callable[[Config, str], dict[str, Any]]] = {
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "falcon": _falcon,
    "bert": _bert,
    "roberta": _bert,
}


def model_from_hf_config(cfg: Config, name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` mapping.

    Nested ``text_config`` (multimodal checkpoints such as Gemma-3) is read in place of the
    outer object. Families without a reader of their own are read with Llama's keys.
    """
    if not isinstance(cfg, Mapping):
        raise EstimateError("model", f"expected a JSON object, got {type(cfg).__name__}")
    if cfg.get("text_config") is not None:
        if not isinstance(cfg["text_config"], Mapping):
            raise EstimateError(
                "model.text_config", f"got {shown(cfg['text_config'])}, expected an object"
            )
        inner = dict(cfg["text_config"])
        inner.setdefault("model_type", cfg.get("model_type", "llama"))
        cfg = inner
    model_type = check_text("model.model_type", cfg.get("model_type", "llama"))
    path = cfg.get("_name_or_path")
    label = name or (check_text("model._name_or_path", path) if path else model_type)
    reader = _READERS.get(model_type, _llama_like)
    fields = reader(cfg, label)
    fields.setdefault("source", "Hugging Face config.json")
    fields.setdefault("family", model_type)
    return ModelSpec(**fields)
