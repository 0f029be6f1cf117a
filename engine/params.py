"""Every parameter tensor of a model, and exact counts by component.

:func:`model_tensors` lists the parameter tensors a Hugging Face implementation of the
architecture creates, grouped: one :class:`TensorGroup` stands for ``count`` tensors of one
shape (the ``q_proj.weight`` of 32 layers is one group). The list is what the memory model
walks -- storage dtype, trainability, LoRA adapters, 4-bit quantization and per-tensor
optimizer state are all decided tensor by tensor -- and :func:`count_parameters` sums it.

>>> from memfit.engine.presets import load_model
>>> count_parameters(load_model("gpt2")).total
124439808

Components: ``embeddings`` (token, position and token-type tables and an embedding norm),
``attention``, ``mlp`` (dense MLPs and MoE shared experts), ``experts`` (routed experts),
``router``, ``norms`` (every norm inside the blocks and the final norm), ``lm_head``
(untied output projection, its bias, BERT's masked-LM transform) and ``pooler``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from math import prod

from memfit.engine import memo
from memfit.engine.specs import ModelSpec

COMPONENTS = ("embeddings", "attention", "mlp", "experts", "router", "norms", "lm_head", "pooler")

#: The linear roles that LoRA can target; ``"qkv"`` and ``"gate_up"`` are fused modules.
LINEAR_ROLES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "qkv",
    "o_proj",
    "gate_proj",
    "up_proj",
    "gate_up",
    "down_proj",
    "q_a_proj",
    "q_b_proj",
    "kv_a_proj",
    "kv_b_proj",
)


@dataclass(frozen=True, slots=True)
class TensorGroup:
    """``count`` parameter tensors of one ``shape`` in one component.

    ``linear`` is the LoRA role of a linear layer's weight (``None`` for biases, norms,
    embeddings, routers and the LM head); ``layers`` is the half-open range of block
    indices the group covers, or ``None`` for tensors outside the blocks.
    """

    component: str
    module: str
    shape: tuple[int, ...]
    count: int
    linear: str | None = None
    layers: tuple[int, int] | None = None
    #: the weight of an ``nn.Linear`` (a matmul's weight matrix, whether LoRA can target
    #: it or not: routers and the LM head too): what bitsandbytes quantizes
    matrix: bool = False
    #: a LoRA adapter (``lora_A``/``lora_B``), not a tensor of the base model
    adapter: bool = False

    @property
    def numel(self) -> int:
        """Elements of one tensor of the group."""
        return prod(self.shape)

    @property
    def total(self) -> int:
        """Elements of all ``count`` tensors."""
        return self.numel * self.count


@dataclass(frozen=True, slots=True)
class ParamCounts:
    """Parameter counts by component; ``total`` is their sum."""

    by_component: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.by_component)

    def __getitem__(self, component: str) -> int:
        for name, n in self.by_component:
            if name == component:
                return n
        raise KeyError(component)

    def as_dict(self) -> dict[str, int]:
        return dict(self.by_component)


def _norm(
    model: ModelSpec,
    component: str,
    module: str,
    size: int,
    count: int,
    layers: tuple[int, int] | None,
) -> list[TensorGroup]:
    """Weight (and bias) of one kind of norm; a non-parametric LayerNorm has none (OLMo-1)."""
    if model.norm == "layernorm-nonparam" or count == 0:
        return []
    groups = [TensorGroup(component, module + ".weight", (size,), count, None, layers)]
    if model.norm == "layernorm":
        groups.append(TensorGroup(component, module + ".bias", (size,), count, None, layers))
    return groups


def _linear(
    component: str,
    module: str,
    out_f: int,
    in_f: int,
    count: int,
    layers: tuple[int, int] | None,
    role: str | None,
    bias: bool,
) -> list[TensorGroup]:
    """``nn.Linear(in_f, out_f)``: weight ``out_f x in_f`` and an optional bias ``out_f``."""
    groups = [TensorGroup(component, module + ".weight", (out_f, in_f), count, role, layers, True)]
    if bias:
        groups.append(TensorGroup(component, module + ".bias", (out_f,), count, None, layers))
    return groups


def _attention(m: ModelSpec, n: int, layers: tuple[int, int]) -> list[TensorGroup]:
    h = m.hidden_size
    g: list[TensorGroup] = []
    if m.is_mla:
        # DeepSeek-V2/V3 multi-head latent attention (DeepSeek-V2 report, section 2.1):
        # queries through an optional low-rank bottleneck, keys/values through a shared
        # latent of kv_lora_rank plus a decoupled RoPE key of qk_rope_head_dim.
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        heads = m.num_attention_heads
        if m.q_lora_rank:
            g += _linear("attention", "q_a_proj", m.q_lora_rank, h, n, layers, "q_a_proj", False)
            g += _norm(m, "norms", "q_a_layernorm", m.q_lora_rank, n, layers)
            g += _linear(
                "attention", "q_b_proj", heads * qk, m.q_lora_rank, n, layers, "q_b_proj", False
            )
        else:
            g += _linear("attention", "q_proj", heads * qk, h, n, layers, "q_proj", False)
        g += _linear(
            "attention",
            "kv_a_proj_with_mqa",
            m.kv_lora_rank + m.qk_rope_head_dim,
            h,
            n,
            layers,
            "kv_a_proj",
            False,
        )
        g += _norm(m, "norms", "kv_a_layernorm", m.kv_lora_rank, n, layers)
        g += _linear(
            "attention",
            "kv_b_proj",
            heads * (m.qk_nope_head_dim + m.v_head_dim),
            m.kv_lora_rank,
            n,
            layers,
            "kv_b_proj",
            False,
        )
        g += _linear(
            "attention",
            "o_proj",
            h,
            heads * m.v_head_dim,
            n,
            layers,
            "o_proj",
            m.attention_out_bias,
        )
        return g
    q_out = m.num_attention_heads * m.head_dim
    kv_out = m.num_key_value_heads * m.head_dim
    if m.fused_qkv:
        g += _linear(
            "attention", "qkv_proj", q_out + 2 * kv_out, h, n, layers, "qkv", m.attention_bias
        )
    else:
        for name, out_f in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
            g += _linear("attention", name, out_f, h, n, layers, name, m.attention_bias)
    g += _linear("attention", "o_proj", h, q_out, n, layers, "o_proj", m.attention_out_bias)
    if m.attention_sinks:  # gpt-oss: one learned sink logit per query head
        g.append(TensorGroup("attention", "sinks", (m.num_attention_heads,), n, None, layers))
    if m.qk_norm == "head":  # Qwen3, Gemma-3: RMSNorm over each head's head_dim
        g += _norm(m, "norms", "q_norm", m.head_dim, n, layers)
        g += _norm(m, "norms", "k_norm", m.head_dim, n, layers)
    elif m.qk_norm == "full":  # OLMo-2: RMSNorm over the whole projection
        g += _norm(m, "norms", "q_norm", q_out, n, layers)
        g += _norm(m, "norms", "k_norm", kv_out, n, layers)
    return g


def _mlp(
    m: ModelSpec, component: str, prefix: str, inter: int, count: int, layers: tuple[int, int]
) -> list[TensorGroup]:
    h, bias = m.hidden_size, m.mlp_bias
    g: list[TensorGroup] = []
    if m.mlp == "gated":  # SwiGLU / GeGLU: down(act(gate(x)) * up(x))
        if m.fused_gate_up:
            g += _linear(
                component, prefix + "gate_up_proj", 2 * inter, h, count, layers, "gate_up", bias
            )
        else:
            g += _linear(
                component, prefix + "gate_proj", inter, h, count, layers, "gate_proj", bias
            )
            g += _linear(component, prefix + "up_proj", inter, h, count, layers, "up_proj", bias)
    else:  # plain: down(act(up(x)))
        g += _linear(component, prefix + "up_proj", inter, h, count, layers, "up_proj", bias)
    g += _linear(component, prefix + "down_proj", h, inter, count, layers, "down_proj", bias)
    return g


def _moe(m: ModelSpec, n: int, layers: tuple[int, int]) -> list[TensorGroup]:
    h = m.hidden_size
    g = _linear("router", "gate", m.num_experts, h, n, layers, None, m.mlp_bias)
    if m.router_bias:  # DeepSeek-V3's e_score_correction_bias, stored with the checkpoint
        g.append(
            TensorGroup("router", "gate.e_score_correction_bias", (m.num_experts,), n, None, layers)
        )
    g += _mlp(m, "experts", "experts.", m.moe_intermediate_size, n * m.local_experts, layers)
    shared = m.shared_expert_intermediate_size or m.moe_intermediate_size * m.num_shared_experts
    if m.num_shared_experts and shared:
        g += _mlp(m, "mlp", "shared_experts.", shared, n, layers)
    if m.shared_expert_gate:  # Qwen2-MoE: sigmoid gate on the shared expert's output
        g += _linear("router", "shared_expert_gate", 1, h, n, layers, None, False)
    return g


def layer_segments(model: ModelSpec, cuts: tuple[int, ...] = ()) -> list[tuple[int, int, bool]]:
    """Runs of identical blocks as ``(start, stop, is_moe)``, split also at ``cuts``."""
    bounds = {0, model.num_layers}
    if model.is_moe:
        bounds.add(model.first_dense_layers)
    bounds.update(c for c in cuts if 0 < c < model.num_layers)
    edges = sorted(bounds)
    return [
        (a, b, model.is_moe and a >= model.first_dense_layers)
        for a, b in itertools.pairwise(edges)
        if b > a
    ]


def largest_layer_params(model: ModelSpec) -> int:
    """Parameters of the largest transformer block (the unit ZeRO-3 / FSDP gathers)."""
    per_layer: dict[tuple[int, int], int] = {}
    for g in model_tensors(model):
        if g.layers:
            span = g.layers[1] - g.layers[0]
            per_layer[g.layers] = per_layer.get(g.layers, 0) + g.total // span
    return max(per_layer.values(), default=0)


@memo.cached(maxsize=512)
def model_tensors(model: ModelSpec, cuts: tuple[int, ...] = ()) -> tuple[TensorGroup, ...]:
    """All parameter tensors of ``model`` as groups; block groups are split at ``cuts``.

    Shapes follow ``torch.nn.Linear`` (``out x in``) and the Hugging Face implementations
    of each family; see :class:`~memfit.engine.specs.ModelSpec` for the switches.
    """
    h, m = model.hidden_size, model
    g: list[TensorGroup] = [TensorGroup("embeddings", "embed_tokens.weight", (m.vocab_size, h), 1)]
    if m.position_embedding == "learned":
        g.append(
            TensorGroup("embeddings", "embed_positions.weight", (m.max_position_embeddings, h), 1)
        )
    if m.type_vocab_size:
        g.append(
            TensorGroup("embeddings", "token_type_embeddings.weight", (m.type_vocab_size, h), 1)
        )
    if m.embedding_norm:
        g += _norm(m, "embeddings", "embeddings.LayerNorm", h, 1, None)
    for start, stop, is_moe in layer_segments(m, cuts):
        n, span = stop - start, (start, stop)
        g += _attention(m, n, span)
        g += _norm(m, "norms", "layer_norms", h, n * m.norms_per_layer, span)
        if is_moe:
            g += _moe(m, n, span)
        elif m.intermediate_size:
            g += _mlp(m, "mlp", "", m.intermediate_size, n, span)
    if m.final_norm:
        g += _norm(m, "norms", "final_norm", h, 1, None)
    if m.pooler:
        g += _linear("pooler", "pooler.dense", h, h, 1, None, None, True)
    if m.lm_head_transform:  # BERT's MLM head: dense + activation + LayerNorm
        g += _linear("lm_head", "lm_head.transform.dense", h, h, 1, None, None, True)
        g += _norm(m, "lm_head", "lm_head.transform.LayerNorm", h, 1, None)
    if not m.tie_word_embeddings:
        g.append(TensorGroup("lm_head", "lm_head.weight", (m.vocab_size, h), 1, matrix=True))
    if m.lm_head_bias:
        g.append(TensorGroup("lm_head", "lm_head.bias", (m.vocab_size,), 1))
    return tuple(g)


@memo.cached(maxsize=512)
def count_parameters(model: ModelSpec) -> ParamCounts:
    """Exact parameter counts of ``model`` by component (tied weights counted once)."""
    sums = dict.fromkeys(COMPONENTS, 0)
    for group in model_tensors(model):
        sums[group.component] += group.total
    return ParamCounts(tuple(sums.items()))
