"""Read a Hugging Face ``config.json`` as it is into a :class:`~memfit.engine.specs.ModelSpec`.

Each family (``model_type``) has a reader of its own, written from the keys and the
module layout of the family's ``configuration_*.py`` and ``modeling_*.py`` in
``transformers`` (GPT-2 says ``n_layer``, Falcon ``n_head`` or ``num_attention_heads``,
DeepSeek ``n_routed_experts``...), and each reader is checked against the published
parameter total of a public checkpoint of its family (``tests/engine/test_hf_families.py``).
Keys the estimate does not need are ignored; a key it needs and cannot default is an error
naming it.

A ``model_type`` without a reader is an error, never a guess: a config of a family built
like a supported one is read as that family with ``read_as``, and the model records it
(:attr:`ModelSpec.read_as`), so every estimate of it says so. Families the engine cannot
count exactly (hybrid and state-space models, encoder-decoders, ...) are refused with the
reason. A multimodal config's text model (``text_config``) is read on its own; the model
records the multimodal type (:attr:`ModelSpec.text_model_of`) and the estimate lists its
vision tower as not modelled.

>>> spec = model_from_hf_config({"model_type": "llama", "num_hidden_layers": 2,
...     "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
...     "vocab_size": 1000})
>>> (spec.num_key_value_heads, spec.head_dim, spec.tie_word_embeddings)
(4, 16, False)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from memfit.engine.errors import EstimateError, check_bool, check_float, check_text, shown
from memfit.engine.specs import DROPOUT, MAX_DIM, MAX_EXPERTS, MAX_LAYERS, ModelSpec

Config = Mapping[str, Any]


class _Keys:
    """The keys of one config object, read strictly; an error names ``where + key``.

    ``defaults`` stand in for keys the object leaves out: a nested ``text_config`` is saved
    with only the values that differ from its family's configuration class.
    """

    def __init__(self, data: Config, where: str, defaults: Config | None = None) -> None:
        self.data = data
        self.where = where
        self.defaults: Config = defaults or {}

    def raw(self, *keys: str, default: Any = None, required: bool = False) -> Any:
        for key in keys:
            if self.data.get(key) is not None:
                return self.data[key]
        for key in keys:  # a key saved as null is off (a sliding window), not defaulted
            if key not in self.data and self.defaults.get(key) is not None:
                return self.defaults[key]
        if required:
            raise EstimateError(self.where + keys[0], "missing from the config (required)")
        return default

    def field(self, *keys: str) -> str:
        """The field an error names: the key the config used, else the first one read."""
        return self.where + next((k for k in keys if self.data.get(k) is not None), keys[0])

    def integer(
        self, *keys: str, default: int | None = None, lo: int = 0, hi: int = MAX_DIM
    ) -> int:
        """An integer in ``[lo, hi]``; a string, a bool or a float is an error."""
        value = self.raw(*keys, default=default, required=default is None)
        if isinstance(value, bool) or not isinstance(value, int):
            raise EstimateError(self.field(*keys), f"got {shown(value)}, expected an integer")
        if not lo <= value <= hi:
            raise EstimateError(
                self.field(*keys), f"got {shown(value)}, expected an integer in [{lo}, {hi}]"
            )
        return value

    def flag(self, key: str, default: bool) -> bool:
        """``true`` or ``false``; the string "false" is not false, so it is an error."""
        return check_bool(self.where + key, self.raw(key, default=default))

    def dropout(self, *keys: str, default: float) -> float:
        """A dropout probability in :data:`~memfit.engine.specs.DROPOUT` (an integer of thousands
        of digits is refused as one, never turned into a float)."""
        return check_float(self.field(*keys), self.raw(*keys, default=default), *DROPOUT)

    def activation(self, *keys: str, default: str) -> str:
        name = check_text(self.field(*keys), self.raw(*keys, default=default)).lower()
        if name in ("silu", "swish", "swiglu"):
            return "silu"
        if name in ("gelu_new", "gelu_fast", "quick_gelu"):  # Python ops in transformers
            return name
        if name in ("gelu_accurate", "gelu_python_tanh"):
            # AccurateGELUActivation and GELUTanh(use_gelu_tanh_python): NewGELU's formula,
            # op for op
            return "gelu_new"
        if "tanh" in name or name == "gelu_pytorch_tanh":
            return "gelu_tanh"
        if name.startswith("gelu"):
            return "gelu"
        if name in ("relu2", "relu_squared"):
            return "relu2"
        if name == "relu":
            return "relu"
        raise EstimateError(
            self.field(*keys), f"got {shown(name)}, expected silu, gelu or relu variants"
        )

    def refuse(self, key: str, why: str) -> EstimateError:
        return EstimateError(self.where + key, why)


Reader = Callable[[_Keys], dict[str, Any]]


def _layers(c: _Keys, *keys: str) -> int:
    return c.integer(*keys, lo=1, hi=MAX_LAYERS)


def _common(c: _Keys) -> dict[str, Any]:
    """The keys Llama's config names them by, which most families share."""
    heads = c.integer("num_attention_heads", lo=1, hi=65536)
    hidden = c.integer("hidden_size", lo=1)
    return {
        "num_layers": _layers(c, "num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": c.integer("num_key_value_heads", default=heads, lo=1, hi=heads),
        "head_dim": c.integer("head_dim", default=max(1, hidden // heads), lo=1, hi=65536),
        "intermediate_size": c.integer("intermediate_size", lo=1),
        "vocab_size": c.integer("vocab_size", lo=1),
        "max_position_embeddings": c.integer("max_position_embeddings", default=4096, lo=1),
        "tie_word_embeddings": c.flag("tie_word_embeddings", False),
        "activation": c.activation("hidden_act", "hidden_activation", default="silu"),
        "attention_bias": False,
        "attention_out_bias": False,
        "mlp_bias": False,
        "attention_dropout": c.dropout("attention_dropout", default=0.0),
        # Qwen2/3 configs carry a sliding_window that is off unless use_sliding_window
        "sliding_window": c.integer("sliding_window", default=0)
        if c.flag("use_sliding_window", True)
        else 0,
    }


def _biases(spec: dict[str, Any], c: _Keys, key: str = "attention_bias") -> dict[str, Any]:
    """Every attention projection (q, k, v and o) biased or not by one key."""
    spec["attention_bias"] = spec["attention_out_bias"] = c.flag(key, False)
    return spec


def _divides(c: _Keys, hidden_keys: tuple[str, ...], head_keys: tuple[str, ...]) -> None:
    """Families whose heads split the hidden size refuse a split that leaves a remainder
    (their modules raise too)."""
    hidden, heads = c.integer(*hidden_keys, lo=1), c.integer(*head_keys, lo=1, hi=65536)
    if hidden % heads:
        named = c.field(*hidden_keys)[len(c.where) :]
        raise EstimateError(
            c.field(*head_keys), f"got {heads}, expected a divisor of {named} ({hidden})"
        )


def _experts(
    spec: dict[str, Any], c: _Keys, count_keys: tuple[str, ...], size_key: str = "intermediate_size"
) -> dict[str, Any]:
    """The routed experts: their count under any of ``count_keys`` -- the family's own name
    first, then the name its config class maps it to (``attribute_map``: transformers 5
    saves Qwen3-MoE's ``num_experts`` as ``num_local_experts``), -- the experts per token
    and each expert's width."""
    spec["num_experts"] = c.integer(*count_keys, lo=1, hi=MAX_EXPERTS)
    spec["num_experts_per_tok"] = c.integer("num_experts_per_tok", lo=1, hi=spec["num_experts"])
    spec["moe_intermediate_size"] = c.integer(size_key, lo=1)
    return spec


def _dense_prefix(c: _Keys, num_layers: int) -> int:
    """Qwen-MoE's dense layers (``mlp_only_layers``, and those ``decoder_sparse_step`` skips),
    which the engine counts only as a run before the first MoE layer."""
    step = c.integer("decoder_sparse_step", default=1, lo=1, hi=MAX_LAYERS)
    only = c.raw("mlp_only_layers", default=[])
    if not isinstance(only, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in only
    ):
        raise c.refuse("mlp_only_layers", f"got {shown(only)}, expected a list of layer indices")
    dense = {i for i in range(num_layers) if i in only or (i + 1) % step}
    prefix = len(dense)
    if dense != set(range(prefix)):
        raise c.refuse(
            "mlp_only_layers" if only else "decoder_sparse_step",
            f"dense layers {sorted(dense)[:8]} between MoE layers: not modelled (the engine "
            "counts dense layers only as a run before the first MoE layer)",
        )
    return prefix


# -- the readers, one per family -------------------------------------------------------------


def _llama(c: _Keys) -> dict[str, Any]:
    spec = _biases(_common(c), c)
    spec["mlp_bias"] = c.flag("mlp_bias", False)
    return spec


def _mistral(c: _Keys) -> dict[str, Any]:
    return _common(c)  # MistralAttention and MistralMLP have no biases


def _mixtral(c: _Keys) -> dict[str, Any]:
    return _experts(_common(c), c, ("num_local_experts", "num_experts"))


def _qwen2(c: _Keys) -> dict[str, Any]:
    spec = _common(c)
    spec["attention_bias"] = True  # q, k and v carry biases; o_proj does not
    return spec


def _qwen2_moe(c: _Keys) -> dict[str, Any]:
    spec = _experts(_qwen2(c), c, ("num_experts",), "moe_intermediate_size")
    spec["first_dense_layers"] = _dense_prefix(c, spec["num_layers"])
    shared = c.integer("shared_expert_intermediate_size", default=0)
    if shared:
        spec["num_shared_experts"] = 1
        spec["shared_expert_intermediate_size"] = shared
        spec["shared_expert_gate"] = True  # sigmoid(Linear(hidden, 1)) on its output
    return spec


def _qwen3(c: _Keys) -> dict[str, Any]:
    spec = _biases(_common(c), c)
    spec["qk_norm"] = "head"
    return spec


def _qwen3_moe(c: _Keys) -> dict[str, Any]:
    spec = _experts(_qwen3(c), c, ("num_experts", "num_local_experts"), "moe_intermediate_size")
    spec["first_dense_layers"] = _dense_prefix(c, spec["num_layers"])
    return spec


def _gemma(c: _Keys) -> dict[str, Any]:
    spec = _biases(_common(c), c)
    spec["tie_word_embeddings"] = c.flag("tie_word_embeddings", True)
    spec["activation"] = "gelu_tanh"  # hidden_activation, gelu_pytorch_tanh for all sizes
    spec["norm"] = "rmsnorm-fp32"  # (x * (1 + weight)) in fp32, then cast back
    return spec


def _full_every(c: _Keys, default: int) -> int:
    """Every how many layers one attends over the whole sequence: transformers'
    ``layer_types`` where the config lists them (periodic: ``full_attention`` at layers
    n-1, 2n-1, ...), else ``sliding_window_pattern``, else the family's ``default``."""
    types = c.raw("layer_types", default=None)
    if isinstance(types, list) and types:
        layers = c.integer("num_hidden_layers", lo=1, hi=MAX_LAYERS)
        kinds = ("sliding_attention", "full_attention")
        wrong = next((t for t in types if t not in kinds), None)
        if wrong is not None or len(types) != layers:
            got = f"an entry {shown(wrong)}" if wrong is not None else f"{len(types)} entries"
            raise EstimateError(
                c.field("layer_types"),
                f"got {got}, expected {layers} entries (num_hidden_layers), each "
                f"{kinds[0]!r} or {kinds[1]!r}",
            )
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        if not full:
            return 0
        n = full[0] + 1
        if full != list(range(n - 1, len(types), n)):
            raise EstimateError(
                c.field("layer_types"),
                "expected full_attention every n-th layer (layers n-1, 2n-1, ...): "
                "another pattern is not modelled",
            )
        return n
    return c.integer("sliding_window_pattern", default=default, lo=0)


def _gemma2(c: _Keys) -> dict[str, Any]:
    spec = _gemma(c)
    spec["norms_per_layer"] = 4  # input, post-attention, pre- and post-feedforward
    spec["norm_placement"] = "sandwich"
    # sliding and global layers alternate (modeling_gemma2.py: layer_types)
    spec["full_attention_every"] = _full_every(c, 2)
    # soft-capping of the final logits and of the attention scores (transformers 5.24
    # modeling_gemma2.py); null in Gemma 3's configs
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        cap = c.raw(key, default=None)
        if cap is not None:
            spec[key] = check_float(c.field(key), cap, 0.0, 1e6)
    return spec


def _gemma3_text(c: _Keys) -> dict[str, Any]:
    spec = _gemma2(c)
    spec["qk_norm"] = "head"
    # five sliding layers, then a global one (configuration_gemma3.py)
    spec["full_attention_every"] = _full_every(c, 6)
    return spec


def _gpt_oss(c: _Keys) -> dict[str, Any]:
    """gpt-oss (transformers 5 ``configuration_gpt_oss.py``, ``modeling_gpt_oss.py``):
    sliding-window (128) and full attention layers alternating (``layer_types``), biased
    q/k/v/o projections (``attention_bias``, true by default), a learned sink logit per
    head in every attention layer, and in every layer ``num_local_experts`` experts of
    ``intermediate_size`` with a biased router, biased fused ``gate_up_proj`` and
    ``down_proj``, and a clamped SwiGLU; RMSNorms that multiply the weight in fp32 before
    the cast back. YaRN's rope scaling changes no byte.

    The checkpoints store the experts' matrices in MXFP4 (``quantization_config``). For
    training, transformers dequantizes them to bf16 on loading (``Mxfp4Config(dequantize=
    True)``, ``quantizers/quantizer_mxfp4.py``; it also falls back to it on a device
    without the MXFP4 kernels): the engine counts every parameter in the precision's
    dtype, as for any bf16 checkpoint, and the quantization config is not read."""
    spec = _experts(_common(c), c, ("num_local_experts", "num_experts"))
    bias = c.flag("attention_bias", True)
    # GptOssConfig's defaults where a config leaves the key out; a null window is off
    window = 128 if c.data.get("sliding_window", 128) is not None else 0
    # the clamp's bound and the sigmoid's gain change no byte or FLOP, but must be numbers
    limit = check_float(c.field("swiglu_limit"), c.raw("swiglu_limit", default=7.0), 1e-3, 1e6)
    check_float(c.field("swiglu_alpha"), c.raw("swiglu_alpha", default=1.702), 1e-3, 1e6)
    spec.update(
        head_dim=c.integer("head_dim", default=64, lo=1, hi=65536),
        max_position_embeddings=c.integer("max_position_embeddings", default=131072, lo=1),
        sliding_window=c.integer("sliding_window", default=window),
        full_attention_every=_full_every(c, 2),
        attention_bias=bias,
        attention_out_bias=bias,
        attention_sinks=True,
        mlp_bias=True,  # router.bias, experts.gate_up_proj_bias, experts.down_proj_bias
        fused_gate_up=True,
        swiglu_limit=limit,
        norm="rmsnorm-fp32",  # (self.weight * hidden_states).to(input_dtype)
    )
    return spec


def _phi(c: _Keys) -> dict[str, Any]:
    """Phi-1/1.5/2: one LayerNorm feeding attention and MLP in parallel, biases everywhere
    (the LM head too), ``fc1``/``fc2``; ``qk_layernorm`` adds LayerNorms over head_dim."""
    _divides(c, ("hidden_size",), ("num_attention_heads",))
    spec = _common(c)
    spec.update(
        mlp="plain",
        activation=c.activation("hidden_act", default="gelu_new"),
        norm="layernorm",
        norms_per_layer=1,
        parallel_attention=True,
        attention_bias=True,
        attention_out_bias=True,
        mlp_bias=True,
        lm_head_bias=True,
        max_position_embeddings=c.integer("max_position_embeddings", default=2048, lo=1),
        hidden_dropout=c.dropout("resid_pdrop", default=0.0),
        qk_norm="head" if c.flag("qk_layernorm", False) else "none",
    )
    return spec


def _phi3(c: _Keys) -> dict[str, Any]:
    spec = _common(c)
    spec["fused_qkv"] = True
    spec["fused_gate_up"] = True
    return spec


def _phimoe(c: _Keys) -> dict[str, Any]:
    """Phi-3.5-MoE: LayerNorms with biases, biased attention and LM head, 16 experts."""
    spec = _experts(_biases(_common(c), c), c, ("num_local_experts",))
    spec["norm"] = "layernorm"
    spec["lm_head_bias"] = c.flag("lm_head_bias", False)
    return spec


def _olmo(c: _Keys) -> dict[str, Any]:
    spec = _biases(_common(c), c)
    spec["norm"] = "layernorm-nonparam"  # no weights or biases; no final-norm parameters
    return spec


def _olmo2(c: _Keys) -> dict[str, Any]:
    spec = _biases(_common(c), c)
    spec["qk_norm"] = "full"  # RMSNorm over the whole q and k projections
    spec["norm_placement"] = "post"  # on each sublayer's output, before the residual sum
    spec["norm"] = "rmsnorm-fp32"  # (weight * x) in fp32, then cast back
    spec["rope_keeps_dtype"] = True  # q_embed.to(q_type), k_embed.to(k_type)
    return spec


def _olmoe(c: _Keys) -> dict[str, Any]:
    # OLMoE: OLMo-2's q/k norms over the whole projections, but Llama's norms, before the
    # sublayers, and RoPE (transformers 5.24 modeling_olmoe.py)
    spec = _experts(_olmo2(c), c, ("num_experts", "num_local_experts"))
    spec.update(norm="rmsnorm", norm_placement="pre", rope_keeps_dtype=False)
    return spec


def _granite(c: _Keys) -> dict[str, Any]:
    return _llama(c)  # Llama's modules; its multipliers scale activations, not weights


def _granitemoe(c: _Keys) -> dict[str, Any]:
    return _experts(_biases(_common(c), c), c, ("num_local_experts",))


def _cohere(c: _Keys) -> dict[str, Any]:
    """Command-R: one LayerNorm without bias feeding attention and MLP in parallel, a tied
    head; ``use_qk_norm`` adds LayerNorms over each head (weights heads x head_dim)."""
    spec = _biases(_common(c), c)
    spec.update(
        norm="layernorm-nobias",
        norms_per_layer=1,
        parallel_attention=True,
        tie_word_embeddings=c.flag("tie_word_embeddings", True),
        qk_norm="full" if c.flag("use_qk_norm", False) else "none",
    )
    return spec


def _starcoder2(c: _Keys) -> dict[str, Any]:
    spec = _common(c)
    bias = c.flag("use_bias", True)
    spec.update(
        mlp="plain",
        activation=c.activation("hidden_act", default="gelu_pytorch_tanh"),
        norm="layernorm",
        attention_bias=bias,
        attention_out_bias=bias,
        mlp_bias=bias,
        tie_word_embeddings=c.flag("tie_word_embeddings", True),
        hidden_dropout=c.dropout("residual_dropout", default=0.0),
    )
    return spec


def _stablelm(c: _Keys) -> dict[str, Any]:
    if c.flag("qk_layernorm", False):
        raise c.refuse(
            "qk_layernorm",
            "true: per-head LayerNorms without bias beside LayerNorms with bias; the "
            "engine has one kind of norm per model, so it cannot count this exactly",
        )
    spec = _common(c)
    parallel = c.flag("use_parallel_residual", False)
    spec.update(
        norm="layernorm",
        norms_per_layer=1 if parallel else 2,
        parallel_attention=parallel,
        attention_bias=c.flag("use_qkv_bias", False),  # q, k and v; o_proj has none
        hidden_dropout=c.dropout("hidden_dropout", default=0.0),
    )
    return spec


def _internlm2(c: _Keys) -> dict[str, Any]:
    spec = _biases(_common(c), c, "bias")
    spec["fused_qkv"] = True  # wqkv
    return spec


def _deepseek(c: _Keys) -> dict[str, Any]:
    """DeepSeek-V2/V3: multi-head latent attention, routed and shared experts after the
    first ``first_k_dense_replace`` dense layers."""
    if c.flag("attention_bias", False):
        raise c.refuse("attention_bias", "true: biased latent projections are not modelled")
    if c.integer("moe_layer_freq", default=1, lo=1) != 1:
        raise c.refuse(
            "moe_layer_freq",
            "dense layers between MoE layers: not modelled (only a run of dense layers "
            "before the first MoE layer is)",
        )
    spec = _experts(
        _common(c),
        c,
        ("n_routed_experts", "num_local_experts", "num_experts"),
        "moe_intermediate_size",
    )
    rope = c.integer("qk_rope_head_dim", lo=1, hi=65536)
    nope = c.integer("qk_nope_head_dim", lo=1, hi=65536)
    spec.update(
        num_shared_experts=c.integer("n_shared_experts", default=0, hi=MAX_EXPERTS),
        first_dense_layers=c.integer("first_k_dense_replace", default=0, hi=spec["num_layers"]),
        router_bias=c.raw("topk_method") == "noaux_tc",
        q_lora_rank=c.integer("q_lora_rank", default=0),
        kv_lora_rank=c.integer("kv_lora_rank", lo=1),
        qk_rope_head_dim=rope,
        qk_nope_head_dim=nope,
        v_head_dim=c.integer("v_head_dim", lo=1, hi=65536),
        head_dim=rope + nope,
    )
    return spec


def _gpt_blocks(c: _Keys) -> dict[str, Any]:
    """GPT-2's keys and blocks: LayerNorms, biases everywhere, a plain MLP of ``n_inner``."""
    _divides(c, ("n_embd", "hidden_size"), ("n_head", "num_attention_heads"))
    hidden = c.integer("n_embd", "hidden_size", lo=1)
    heads = c.integer("n_head", "num_attention_heads", lo=1)
    return {
        "num_layers": _layers(c, "n_layer", "num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": hidden // heads,
        "intermediate_size": c.integer("n_inner", default=4 * hidden, lo=1),
        "vocab_size": c.integer("vocab_size", lo=1),
        "mlp": "plain",
        "norm": "layernorm",
        "attention_bias": True,
        "attention_out_bias": True,
        "mlp_bias": True,
        "attention_dropout": c.dropout("attn_pdrop", default=0.1),
        "hidden_dropout": c.dropout("resid_pdrop", default=0.1),
    }


def _gpt2(c: _Keys) -> dict[str, Any]:
    spec = _gpt_blocks(c)
    spec.update(
        max_position_embeddings=c.integer("n_positions", "max_position_embeddings", lo=1),
        activation=c.activation("activation_function", default="gelu_new"),
        position_embedding="learned",
        tie_word_embeddings=c.flag("tie_word_embeddings", True),
        fused_qkv=True,
        # GPT2Attention's own eager attention: its softmax in the scores' dtype
        # (transformers 5.24 modeling_gpt2.py)
        eager_attention="plain",
    )
    return spec


def _gpt_bigcode(c: _Keys) -> dict[str, Any]:
    """SantaCoder/StarCoder: GPT-2's blocks with one key/value head (``multi_query``)."""
    spec = {**_gpt2(c), "eager_attention": "hf"}  # its softmax upcasts to fp32
    if c.flag("multi_query", True):
        spec["num_key_value_heads"] = 1
    spec["activation"] = c.activation("activation_function", default="gelu_pytorch_tanh")
    return spec


def _gptj(c: _Keys) -> dict[str, Any]:
    """GPT-J: one LayerNorm feeding attention and MLP in parallel; unbiased q/k/v/out,
    biased MLP and LM head; rotary positions."""
    spec = _gpt_blocks(c)
    spec.update(
        max_position_embeddings=c.integer(
            "n_positions", "max_position_embeddings", default=2048, lo=1
        ),
        activation=c.activation("activation_function", default="gelu_new"),
        norms_per_layer=1,
        parallel_attention=True,
        attention_bias=False,
        attention_out_bias=False,
        lm_head_bias=True,
        tie_word_embeddings=c.flag("tie_word_embeddings", False),
        attention_dropout=c.dropout("attn_pdrop", default=0.0),
        hidden_dropout=c.dropout("resid_pdrop", default=0.0),
    )
    return spec


def _gpt_neox(c: _Keys) -> dict[str, Any]:
    spec = _common(c)
    bias = c.flag("attention_bias", True)
    heads = spec["num_attention_heads"]
    spec.update(
        num_key_value_heads=heads,
        head_dim=spec["hidden_size"] // heads,
        mlp="plain",
        norm="layernorm",
        attention_bias=bias,
        attention_out_bias=bias,
        mlp_bias=True,
        fused_qkv=True,
        parallel_attention=c.flag("use_parallel_residual", True),
        activation=c.activation("hidden_act", default="gelu"),
        hidden_dropout=c.dropout("hidden_dropout", default=0.0),
    )
    return spec


def _falcon(c: _Keys) -> dict[str, Any]:
    hidden = c.integer("hidden_size", "n_embed", lo=1)
    heads = c.integer("num_attention_heads", "n_head", lo=1, hi=65536)
    new_arch = c.flag("new_decoder_architecture", False)
    if new_arch:
        kv = c.integer("num_kv_heads", "n_head_kv", default=heads, lo=1, hi=heads)
    else:
        kv = 1 if c.flag("multi_query", True) else heads
    bias = c.flag("bias", False)
    parallel = c.flag("parallel_attn", True)
    if new_arch:  # ln_attn and ln_mlp, or (Falcon2-11B) one input_layernorm
        norms = c.integer("num_ln_in_parallel_attn", default=2, lo=1, hi=2)
    else:
        norms = 1 if parallel else 2
    return {
        "num_layers": _layers(c, "num_hidden_layers", "n_layer"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": max(1, hidden // heads),
        "intermediate_size": c.integer("ffn_hidden_size", default=4 * hidden, lo=1),
        "vocab_size": c.integer("vocab_size", lo=1),
        "max_position_embeddings": c.integer("max_position_embeddings", default=2048, lo=1),
        "mlp": "plain",
        "activation": "gelu",
        "norm": "layernorm",
        "norms_per_layer": norms,
        # FalconAttention hands SDPA the single key/value head as it is, with a mask
        "sdpa_math": not new_arch and kv == 1 < heads,
        # FalconAttention's own eager path: scores scaled in place, softmax in the hidden
        # states' dtype (transformers 5.24 modeling_falcon.py)
        "eager_attention": "falcon",
        "attention_bias": bias,
        "attention_out_bias": bias,
        "mlp_bias": bias,
        "position_embedding": "alibi" if c.flag("alibi", False) else "rotary",
        "tie_word_embeddings": c.flag("tie_word_embeddings", True),
        "fused_qkv": True,
        "parallel_attention": parallel or new_arch,
    }


def _bloom(c: _Keys) -> dict[str, Any]:
    """BLOOM: ALiBi, a LayerNorm after the embedding, fused biased q/k/v, a 4h GELU MLP."""
    _divides(c, ("hidden_size", "n_embed"), ("n_head", "num_attention_heads"))
    hidden = c.integer("hidden_size", "n_embed", lo=1)
    heads = c.integer("n_head", "num_attention_heads", lo=1)
    return {
        "num_layers": _layers(c, "n_layer", "num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": hidden // heads,
        "intermediate_size": 4 * hidden,
        "vocab_size": c.integer("vocab_size", lo=1),
        "max_position_embeddings": c.integer("seq_length", default=2048, lo=1),
        "mlp": "plain",
        "activation": "gelu_tanh",  # bloom_gelu: the tanh approximation, input saved
        "norm": "layernorm",
        "embedding_norm": True,
        "attention_bias": True,
        "attention_out_bias": True,
        "mlp_bias": True,
        "position_embedding": "alibi",
        "tie_word_embeddings": c.flag("tie_word_embeddings", True),
        "fused_qkv": True,
        "attention_dropout": c.dropout("attention_dropout", default=0.0),
        "hidden_dropout": c.dropout("hidden_dropout", default=0.0),
    }


def _bert(c: _Keys) -> dict[str, Any]:
    position = c.raw("position_embedding_type", default="absolute")
    if position != "absolute":
        raise c.refuse(
            "position_embedding_type",
            f"got {shown(position)}: relative position embeddings are not modelled; "
            "expected 'absolute'",
        )
    spec = _common(c)
    spec.update(
        architecture="encoder",
        mlp="plain",
        activation=c.activation("hidden_act", default="gelu"),
        norm="layernorm",
        final_norm=False,
        attention_bias=True,
        attention_out_bias=True,
        mlp_bias=True,
        position_embedding="learned",
        type_vocab_size=c.integer("type_vocab_size", default=2, hi=1024),
        embedding_norm=True,
        tie_word_embeddings=c.flag("tie_word_embeddings", True),
        pooler=True,
        lm_head_transform=True,
        lm_head_bias=True,
        attention_dropout=c.dropout("attention_probs_dropout_prob", default=0.1),
        hidden_dropout=c.dropout("hidden_dropout_prob", default=0.1),
        sliding_window=0,
        # BertSelfAttention's eager attention: its softmax in the scores' dtype
        # (transformers 5.24 modeling_bert.py, modeling_roberta.py)
        eager_attention="plain",
    )
    return spec


#: model_type -> its reader. Each is checked against the published parameter total of a
#: public checkpoint of the family in tests/engine/test_hf_families.py.
READERS: dict[str, Reader] = {
    "llama": _llama,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "gemma": _gemma,
    "gemma2": _gemma2,
    "gemma3_text": _gemma3_text,
    "phi": _phi,
    "phi3": _phi3,
    "phimoe": _phimoe,
    "gpt_oss": _gpt_oss,
    "gpt2": _gpt2,
    "gpt_bigcode": _gpt_bigcode,
    "gpt_neox": _gpt_neox,
    "gptj": _gptj,
    "falcon": _falcon,
    "bloom": _bloom,
    "olmo": _olmo,
    "olmo2": _olmo2,
    "olmoe": _olmoe,
    "starcoder2": _starcoder2,
    "stablelm": _stablelm,
    "cohere": _cohere,
    "granite": _granite,
    "granitemoe": _granitemoe,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "internlm2": _internlm2,
    "bert": _bert,
    "roberta": _bert,
}

_HYBRID = (
    "a hybrid or state-space model: its recurrent (Mamba, RWKV, linear-attention) layers "
    "are not modelled, so neither its parameters nor its memory can be counted"
)
_SEQ2SEQ = (
    "an encoder-decoder model: the engine models decoder-only and encoder-only "
    "transformers, not an encoder and a decoder with cross-attention"
)
#: model_type -> why it is refused
REFUSED: dict[str, str] = {
    **dict.fromkeys(
        (
            "jamba", "mamba", "mamba2", "falcon_mamba", "falcon_h1", "zamba", "zamba2",
            "recurrent_gemma", "rwkv", "rwkv7", "bamba", "nemotron_h", "granitemoehybrid",
            "lfm2", "plamo2", "xlstm", "qwen3_next", "minimax",
        ),
        _HYBRID,
    ),
    **dict.fromkeys(
        (
            "t5", "mt5", "umt5", "longt5", "t5gemma", "switch_transformers", "bart",
            "mbart", "pegasus", "pegasus_x", "marian", "led", "prophetnet",
            "xlm-prophetnet", "fsmt", "blenderbot", "blenderbot-small", "m2m_100",
            "nllb-moe", "plbart", "bigbird_pegasus", "mvp", "encoder-decoder", "whisper",
        ),
        _SEQ2SEQ,
    ),
    "mllama": (
        "Llama 3.2 Vision: its text model interleaves cross-attention layers (with gates "
        "and norms of their own) among its self-attention layers, which the engine cannot "
        "count"
    ),
    "llama4": (
        "Llama 4: its text model mixes MoE layers (routed and shared experts) with dense "
        "ones by interleave_moe_layer_step and has not been checked against a published "
        "parameter count"
    ),
    "llama4_text": "Llama 4's text model: see llama4",
    "gemma3n": (
        "Gemma 3n: per-layer embeddings, AltUp and LAuReL blocks are not modelled"
    ),
}  # fmt: skip

#: multimodal model_type -> the family of its text model when ``text_config`` does not name
#: one (the configuration class's default text model). Only the text model is read.
MULTIMODAL: dict[str, str] = {
    "llava": "llama",
    "llava_next": "llama",
    "vipllava": "llama",
    "idefics3": "llama",
    "idefics2": "mistral",
    "mistral3": "mistral",
    "paligemma": "gemma",
    "gemma3": "gemma3_text",
    "llava_onevision": "qwen2",
    "qwen2_vl": "qwen2",
    "qwen2_5_vl": "qwen2",
}
#: multimodal configs that may keep their text model's keys at the top level (Qwen2-VL
#: checkpoints were saved so, with only ``vision_config`` nested)
_TOP_LEVEL_TEXT = ("qwen2_vl", "qwen2_5_vl")
#: model_type names of text models nested in multimodal configs -> the family read
_TEXT_TYPES = {"qwen2_vl_text": "qwen2", "qwen2_5_vl_text": "qwen2"}
#: the defaults of the text families' configuration classes in transformers: a nested
#: ``text_config`` is saved with only the keys whose values differ from these
_TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 2048,
    },
    "mistral": {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "sliding_window": 4096,
    },
    "gemma": {
        "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
        "head_dim": 256, "max_position_embeddings": 8192,
    },
    "gemma2": {
        "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "max_position_embeddings": 8192, "sliding_window": 4096,
    },
    "gemma3_text": {
        "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "max_position_embeddings": 131072, "sliding_window": 4096,
    },
    "qwen2": {
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "max_position_embeddings": 32768,
    },
    "qwen2_vl_text": {
        "vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568,
        "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
    },
}  # fmt: skip
_TEXT_DEFAULTS["qwen2_5_vl_text"] = _TEXT_DEFAULTS["qwen2_vl_text"]


def supported_families() -> tuple[str, ...]:
    """The ``model_type`` values read, and so the values ``read_as`` takes."""
    return tuple(READERS)


def _unknown(field: str, model_type: str) -> EstimateError:
    return EstimateError(
        field,
        f"{shown(model_type)} is not a family MemFit reads; read a look-alike as one it "
        f"reads with read_as (--read-as TYPE), e.g. llama: {', '.join(READERS)}",
    )


def _text_model(cfg: Config, outer: str | None) -> tuple[_Keys, str | None]:
    """The keys of the text model of a multimodal config, and its model_type."""
    text = cfg["text_config"]
    if not isinstance(text, Mapping):
        raise EstimateError("model.text_config", f"got {shown(text)}, expected an object")
    inner = text.get("model_type")
    if inner is None:
        inner = MULTIMODAL.get(outer or "")
    else:
        inner = check_text("model.text_config.model_type", inner)
    defaults = _TEXT_DEFAULTS.get(inner or "")
    return _Keys(text, "model.text_config.", defaults), inner


def model_from_hf_config(
    cfg: Config, name: str | None = None, read_as: str | None = None
) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` mapping.

    ``read_as`` (a name of :func:`supported_families`) reads the config with that family's
    reader in place of its own ``model_type``'s, for a family built like it; the model
    records it in :attr:`ModelSpec.read_as`. A multimodal config is read as its text model
    (``text_config``, or the top-level keys of Qwen2-VL); the model records the multimodal
    type in :attr:`ModelSpec.text_model_of`.
    """
    if not isinstance(cfg, Mapping):
        raise EstimateError("model", f"expected a JSON object, got {type(cfg).__name__}")
    outer = cfg.get("model_type")
    if outer is not None:
        outer = check_text("model.model_type", outer)
    if read_as is not None and read_as != "":
        read_as = check_text("model.read_as", read_as)
        if read_as not in READERS:
            raise EstimateError(
                "model.read_as",
                f"got {shown(read_as)}, expected a family MemFit reads: {', '.join(READERS)}",
            )
    else:
        read_as = None
    wrapper = ""
    keys = _Keys(cfg, "model.")
    model_type = outer
    if cfg.get("text_config") is not None:
        if outer in REFUSED and read_as is None:
            raise EstimateError("model.model_type", f"{outer!r} is not supported: {REFUSED[outer]}")
        keys, model_type = _text_model(cfg, outer)
        wrapper = outer or "multimodal"
    elif outer in _TOP_LEVEL_TEXT:
        wrapper, model_type = outer or "", MULTIMODAL[outer or ""]
    elif outer in MULTIMODAL:
        raise EstimateError(
            "model.text_config", f"missing: a {outer} config holds its text model there"
        )
    model_type = _TEXT_TYPES.get(model_type or "", model_type)
    where = keys.where + "model_type"
    if read_as is None:
        if model_type is None:
            raise EstimateError(
                where,
                "missing: a config.json names its family in model_type (or read it as a "
                "family with read_as, CLI --read-as TYPE)",
            )
        if model_type in REFUSED:
            raise EstimateError(where, f"{model_type!r} is not supported: {REFUSED[model_type]}")
        if model_type not in READERS:
            raise _unknown(where, model_type)
    reader = READERS[read_as or model_type or ""]
    fields = reader(keys)
    path = cfg.get("_name_or_path")
    label = name or (check_text("model._name_or_path", path) if path else None)
    family = model_type or "unnamed"
    fields.update(
        name=label or family,
        family=family,
        source="Hugging Face config.json",
        read_as=read_as if read_as and read_as != model_type else "",
        text_model_of=wrapper,
    )
    return ModelSpec(**fields)
