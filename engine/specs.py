"""What a scenario is made of: frozen, validated value objects.

* :class:`ModelSpec` -- the architecture (one preset file in ``resources/models`` each);
* :class:`GpuSpec` -- one device model (one preset file in ``resources/gpus`` each);
* :class:`HardwareSpec` -- a GPU, how many of them, and an optional memory override;
* :class:`TrainingSpec` -- method, precision, optimizer, shapes, and their sub-sections
  (:class:`LoraSpec`, :class:`QuantSpec`, :class:`FreezeSpec`, :class:`ParallelismSpec`,
  :class:`OffloadSpec`);
* :class:`Scenario` -- the three together; the single source of truth of the app.

Every class validates itself on construction and raises :class:`~memfit.engine.errors.EstimateError`
naming the field, the value and the accepted range. Edits make new objects with
:func:`dataclasses.replace`, which re-runs the validation.

>>> TrainingSpec(micro_batch_size=0)
Traceback (most recent call last):
...
memfit.engine.errors.EstimateError: training.micro_batch_size: got 0, expected an integer ...
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from memfit.engine import memo
from memfit.engine.errors import (
    EstimateError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_str,
    check_text,
    shown,
)
from memfit.engine.locate import preset_files

MAX_DIM = 1 << 24  # 16,777,216: larger than any real hidden size, vocabulary or context
MAX_LAYERS = 4096
MAX_EXPERTS = 4096
#: the device memory a scenario may give (GiB, 2^30 bytes)
MEMORY_GIB = (1.0, 16384.0)
#: the accepted dropout probabilities (of a model's config, of LoRA)
DROPOUT = (0.0, 0.99)
#: accepted achievable shares of a peak throughput
EFFICIENCY_RANGE = (0.01, 1.0)
#: a board's thermal design power (its default power limit), W
TDP_W = (10.0, 5000.0)
#: a power limit as a share of the board's TDP: below about a third of it the power that
#: does not follow the SM clock takes the whole budget and the clock model
#: (:func:`memfit.engine.steptime.sustained_clock`) no longer holds
POWER_LIMIT_SHARE = (0.35, 1.0)
#: the sustained SM clock under load as a share of what the board sustains at its
#: default power limit (``hardware.clock_share``)
CLOCK_SHARE = (0.2, 1.0)
#: fabrics between nodes: GB/s one way per node, all NICs together (Gb/s x NICs / 8)
NETWORKS: dict[str, float] = {
    "infiniband-xdr-8x800": 800.0,  # ConnectX-8, one 800 Gb/s NIC per GPU (GB200/B300)
    "infiniband-ndr-8x400": 400.0,  # DGX H100/H200/B200: 8 ConnectX-7 at 400 Gb/s
    "infiniband-hdr-8x200": 200.0,  # DGX A100: 8 ConnectX-6 at 200 Gb/s
    "infiniband-hdr-4x200": 100.0,
    "infiniband-edr-4x100": 50.0,  # DGX-1/DGX-2 era: 100 Gb/s EDR
    "roce-8x400": 400.0,
    "aws-efa-3200": 400.0,  # p5: 3,200 Gb/s EFA
    "aws-efa-400": 50.0,  # p4d: 400 Gb/s EFA
    "gcp-a3-8x200": 200.0,  # A3: 8 NICs at 200 Gb/s (GPUDirect-TCPX)
    "ethernet-100g": 12.5,
    "ethernet-25g": 3.125,
}

ARCHITECTURES = ("decoder", "encoder")
MLP_KINDS = ("gated", "plain")
#: ``gelu_new`` is transformers' NewGELUActivation (GPT-2, Phi-2) and ``gelu_fast`` its
#: FastGELUActivation (SantaCoder): the tanh approximation written as separate Python ops,
#: each keeping its own tensors; ``gelu_tanh`` is the fused ``F.gelu(approximate="tanh")``
#: (``gelu_pytorch_tanh``, Gemma); ``quick_gelu`` is QuickGELUActivation, ``x * sigmoid(1.702
#: x)`` in three Python ops (CLIP's text towers and the models built on them)
ACTIVATIONS = (
    "silu", "gelu", "gelu_tanh", "gelu_new", "gelu_fast", "quick_gelu", "relu", "relu2",
    "swiglu",
)  # fmt: skip
#: ``rmsnorm-fp32``: the weight multiplies the fp32 normalized input before the cast back to
#: the input's dtype (transformers' Gemma and OLMo-2 norms; Llama's casts first)
NORMS = ("rmsnorm", "rmsnorm-fp32", "layernorm", "layernorm-nobias", "layernorm-nonparam")
QK_NORMS = ("none", "head", "full")
#: the attention a model runs without SDPA or flash (``ModelSpec.eager_attention``)
EAGER_ATTENTIONS = ("hf", "plain", "falcon")
#: where a layer's norms sit (``ModelSpec.norm_placement``)
NORM_PLACEMENTS = ("pre", "post", "sandwich")
POSITIONS = ("rotary", "learned", "alibi", "none")

METHODS = ("full", "lora", "qlora", "freeze")
PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "bf16", "fp8-mixed")
OPTIMIZERS = ("adamw", "adamw-8bit", "paged-adamw-8bit", "sgd", "sgd-momentum", "adafactor", "lion")
OPTIMIZER_IMPLS = ("foreach", "fused", "for-loop")
#: ``selective``: Korthikanti et al.'s recomputation of the attention core (or the stack's
#: own selective policy: see :data:`memfit.engine.stacks`); ``per-op``: torchtitan's per-op
#: selective checkpointing (the outputs of every other matmul and of attention are saved,
#: the rest of each layer is recomputed)
#: ``first-k-layers``: Megatron's ``--recompute-method block --recompute-num-layers k``,
#: the first k layers of each pipeline stage checkpointed (``checkpoint_every_k`` is k)
CHECKPOINTING = ("none", "selective", "full", "every-k-layers", "first-k-layers", "per-op")
ATTENTION_KERNELS = ("eager", "sdpa", "flash", "mem-efficient")
#: standard: transformers' ``ForCausalLMLoss`` (the whole logits upcast to fp32);
#: chunked: a fused linear cross-entropy that never materializes the logits (Liger,
#: Unsloth); no-upcast: ``F.cross_entropy`` on the compute-dtype logits (LitGPT, plain
#: loops); chunked-output: the LM head and an fp32 cross-entropy per chunk of the sequence,
#: every chunk's logits kept (torchtune's ``CEWithChunkedOutputLoss``)
LOSSES = ("standard", "chunked", "no-upcast", "chunked-output")
#: the built-in training stacks, one ``resources/stacks/NAME.json`` each (see
#: :mod:`memfit.engine.stacks`); a user's own stacks come after them (:func:`stack_names`)
STACKS = (
    "hf-trainer",
    "trl-sft",
    "accelerate-loop",
    "lightning",
    "torchtune",
    "axolotl",
    "torchtitan",
    "deepspeed",
    "megatron",
    "custom",
)


def stack_names() -> tuple[str, ...]:
    """The training stacks a scenario may name: :data:`STACKS`, then the user's own stack
    files by name (:func:`memfit.engine.locate.preset_files`; what each says is checked
    when it is read, :func:`memfit.engine.stacks.load_stack`)."""
    files = preset_files("stacks")
    return STACKS + tuple(sorted(files.custom))


#: storage dtype of frozen, non-quantized weights; ``auto``: the precision's compute dtype
#: (fp32 under fp32), what ``from_pretrained`` gives for a 16-bit checkpoint
FROZEN_DTYPES = ("auto", "fp32", "bf16", "fp16")
#: dtype of LoRA adapters (and so of their gradients and optimizer states); ``auto``: the
#: trainable weights' dtype under the precision (fp32, bf16 under pure bf16)
ADAPTER_DTYPES = ("auto", "fp32", "bf16")
#: the modeling code that builds the model: transformers' classes, or LitGPT's own ``GPT``
#: (fused q/k/v, no weight tying, its own LoRA layers)
MODEL_IMPLEMENTATIONS = ("transformers", "litgpt")
#: dtype QLoRA's dequantization returns: the dtype the weights were quantized from
#: (bitsandbytes keeps it in the quant state); ``auto``: the compute dtype. Another dtype
#: than the compute dtype costs a second copy of each weight for the cast
DEQUANT_DTYPES = ("auto", "fp16", "bf16", "fp32")
#: what ``nvidia-smi`` shows beyond PyTorch's pool depends on the CUDA runtime: lazy module
#: loading (the default since CUDA 12.2) or eager loading of every kernel of the libraries
CUDA_RUNTIMES = ("cuda12-lazy", "cuda12-eager", "cuda11-eager")
#: transformers' experts implementation: grouped GEMMs over the sorted tokens, or the
#: per-expert loop
MOE_IMPLEMENTATIONS = ("grouped", "eager")
#: what FSDP's mixed-precision policy gathers the parameters in and reduces the gradients
#: in under ``*-mixed`` (``training.parallelism.fsdp_param_dtype``, ``fsdp_reduce_dtype``):
#: ``compute`` -- the precision's 16-bit dtype (``MixedPrecisionPolicy(param_dtype=bf16)``);
#: ``fp32`` -- fp32 (a parameter policy of fp32 leaves autocast to compute in 16 bits)
FSDP_DTYPES = ("compute", "fp32")
#: what ``torch.compile`` compiles (``training.torch_compile_scope``): the whole model with
#: its loss (``torch.compile(model)`` on a causal LM that computes its loss from labels,
#: transformers' Trainer), each decoder layer alone (torchtitan before April 2025), or
#: each layer and the loss function on their own (torchtune; torchtitan since) -- the
#: final norm and the LM head run eager in both of the last
COMPILE_SCOPES = ("model", "layers", "layers+loss")
#: where the standard loss's fp32 copy of the logits is made (``training.logits_upcast``):
#: in the loss function (transformers' ``ForCausalLMLoss``, torchtitan's
#: ``cross_entropy_loss``) or by the model, which returns it (torchtune's
#: ``TransformerDecoder``: ``self.output(h).float()``) -- which side of a loss compiled
#: on its own the copy falls on
LOGITS_UPCASTS = ("loss", "model")
#: how FP8 GEMMs scale their inputs (``training.fp8_recipe``, under ``fp8-mixed``): one
#: scale per tensor (Transformer Engine's delayed or current scaling, torchao's
#: tensorwise), per row (torchao's rowwise), per 1x128 / 128x128 block (DeepSeek-V3's,
#: Transformer Engine's Float8BlockScaling) or per 1x32 block in hardware (MXFP8, Blackwell)
FP8_RECIPES = ("tensorwise", "rowwise", "blockwise", "mxfp8")
ZERO_STAGES = (0, 1, 2, 3)
OFFLOAD_TARGETS = ("none", "cpu", "nvme")
ACTIVATION_OFFLOAD = ("none", "cpu")
PP_SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b", "zero-bubble")
#: even: every (virtual) stage the same number of layers; balanced: the embedding and the
#: LM head count as one layer each and the remainder goes to the first stages (torchtitan)
PP_SPLITS = ("even", "balanced")
#: pytorch: AMP over fp32 weights, DDP / FSDP / FSDP2 (fp32 shards, 16-bit gathered units);
#: deepspeed: 16-bit module weights, fp32 master weights and gradient partition in ZeRO;
#: megatron: 16-bit weights, an fp32 ``main_grad`` buffer, the distributed optimizer
FRAMEWORKS = ("pytorch", "deepspeed", "megatron")
QUANT_TYPES = ("nf4", "fp4")
#: bitsandbytes' supported 4-bit block sizes (elements per absmax)
QUANT_BLOCKS = (32, 64, 128, 256)
COMPUTE_DTYPES = ("bf16", "fp16")

#: LoRA target names. Each names a role, not a Python attribute: on models whose
#: checkpoints fuse projections (GPT-2 ``c_attn``, GPT-NeoX ``query_key_value``,
#: Phi-3 ``qkv_proj``/``gate_up_proj``) a target of any fused part adapts the fused module,
#: as PEFT would when given that module's name.
LORA_TARGETS = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "q_a_proj",
    "q_b_proj",
    "kv_a_proj",
    "kv_b_proj",
    "all-linear",
    # the output layer: adapted only when named (PEFT's all-linear leaves it out)
    "lm_head",
)
#: LoRA targets as PEFT users write them: a family's module names (PEFT matches the end of
#: a module's name), each with the roles of :data:`LORA_TARGETS` it stands for. Names that
#: mean different layers in different families (``dense``) are left out.
#: the modules PEFT's ``modules_to_save`` may name here: each trains a full copy beside the
#: frozen original (``ModulesToSaveWrapper``)
MODULES_TO_SAVE = ("lm_head", "embed_tokens")

LORA_MODULE_NAMES = {
    "c_attn": ("q_proj", "k_proj", "v_proj"),  # GPT-2, GPT-BigCode: fused q, k, v
    "query_key_value": ("q_proj", "k_proj", "v_proj"),  # GPT-NeoX, Falcon, BLOOM
    "Wqkv": ("q_proj", "k_proj", "v_proj"),  # MPT, MosaicBERT
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),  # Phi-3
    "gate_up_proj": ("gate_proj", "up_proj"),  # Phi-3
    "query": ("q_proj",),  # BERT, RoBERTa
    "key": ("k_proj",),
    "value": ("v_proj",),
    "c_proj": ("o_proj", "down_proj"),  # GPT-2: attn.c_proj and mlp.c_proj both end so
    "c_fc": ("up_proj",),  # GPT-2
    "dense_h_to_4h": ("up_proj",),  # GPT-NeoX, Falcon
    "dense_4h_to_h": ("down_proj",),
    "out_proj": ("o_proj",),  # Mixtral-style attention in some ports, MPT
    "fc1": ("up_proj",),  # Phi-1/2
    "fc2": ("down_proj",),
    "w1": ("gate_proj",),  # Mixtral's experts, Meta's Llama
    "w2": ("down_proj",),
    "w3": ("up_proj",),
    "wq": ("q_proj",),  # Meta's Llama, torchtitan
    "wk": ("k_proj",),
    "wv": ("v_proj",),
    "wo": ("o_proj",),
}


def target_names(targets: tuple[str, ...]) -> tuple[str, ...]:
    """LoRA targets with each module name (:data:`LORA_MODULE_NAMES`) replaced by the
    target names of :data:`LORA_TARGETS` it stands for."""
    return tuple(r for t in targets for r in LORA_MODULE_NAMES.get(t, (t,)))


#: Parts that ``method="freeze"`` can leave trainable.
FREEZE_PARTS = ("embeddings", "attention", "mlp", "norms", "router", "lm_head")


@memo.cached(maxsize=None)
def _field_types(cls: type) -> tuple[tuple[str, Any], ...]:
    """The dataclass fields of ``cls`` with their declared types, read once per class."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


def _check_type(name: str, value: Any, kind: Any) -> None:
    """``value`` is of the field's declared ``kind``, strictly: a bool is not an int, a
    string is never a number or a bool, text is text. A float field takes an int or a
    float here; its range -- which refuses NaN, the infinities and integers no float holds
    -- is each class's :func:`~memfit.engine.errors.check_float`, so the error names the range of
    that field."""
    if isinstance(kind, types.UnionType):  # ``X | None``
        if value is None and type(None) in kind.__args__:
            return
        kind = next(k for k in kind.__args__ if k is not type(None))
    if kind is bool:
        check_bool(name, value)
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise EstimateError(name, f"got {shown(value)}, expected an integer")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise EstimateError(name, f"got {shown(value)}, expected a number")
    elif kind is str:
        check_text(name, value, empty=True)
    elif typing.get_origin(kind) is tuple:
        if not isinstance(value, tuple):
            raise EstimateError(name, f"got {shown(value)}, expected a list")
        for item in value:
            check_text(name, item)
    elif isinstance(kind, type) and not isinstance(value, kind):
        raise EstimateError(name, f"got {shown(value)}, expected a {kind.__name__}")


#: the exact types :func:`_check_type` accepts of each field type, where there is such a
#: set (a string must be text as well: :data:`_TEXTS`)
_EXACT: dict[Any, frozenset[type]] = {
    int: frozenset({int}),
    float: frozenset({int, float}),
    bool: frozenset({bool}),
    str: frozenset({str}),
}
#: strings that :func:`_check_type` accepted as text (what it accepts of a string depends
#: on the string alone), so that a string met again is not searched again
_TEXTS_KEPT = 8192
_TEXTS: memo.Table[str, bool] = memo.Table(f"{__name__}._TEXTS", _TEXTS_KEPT)


@memo.cached(maxsize=None)
def _field_checks(cls: type) -> tuple[tuple[str, Any, frozenset[type]], ...]:
    """Each field of ``cls``: its name, its declared type, and the exact types of value
    :func:`_check_type` accepts of it with no more to check (none where it has more: a
    tuple's items)."""
    out = []
    for name, kind in _field_types(cls):
        inner, optional = kind, False
        if isinstance(kind, types.UnionType) and type(None) in kind.__args__:
            inner, optional = next(k for k in kind.__args__ if k is not type(None)), True
        exact = _EXACT.get(inner, frozenset())
        if not exact and isinstance(inner, type) and typing.get_origin(inner) is None:
            exact = frozenset({inner})  # a section: one of the spec classes
        if optional and exact:
            exact |= {type(None)}
        out.append((name, kind, exact))
    return tuple(out)


def check_fields(spec: Any, prefix: str) -> None:
    """Every field of the dataclass ``spec`` holds a value of its declared type (see
    :func:`_check_type`); each class then checks its ranges (every float field has one).
    This is the one boundary all input crosses -- scenario files, Hugging Face configs, CLI
    flags, the app's fields -- so nothing of the wrong type reaches the engine. A value of
    a type the field takes as it is (an ``int``, a spec), or a string accepted before, is
    not checked again: the verdict is :func:`_check_type`'s either way."""
    for name, kind, exact in _field_checks(spec.__class__):
        value = getattr(spec, name)
        of = type(value)
        if of in exact and (of is not str or value in _TEXTS):
            continue
        _check_type(prefix + name, value, kind)
        if of is str:
            _TEXTS.keep(value, True)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A transformer architecture, precise enough to count every parameter.

    Field names follow Hugging Face ``config.json`` where one exists; the importer in
    :mod:`memfit.engine.hf_config` maps configs of each family onto these fields.
    ``head_dim`` is explicit because it need not equal ``hidden_size / num_attention_heads``
    (Gemma-7B: 16 heads x 256 = 4096 against a hidden size of 3072).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    display_name: str = ""
    family: str = "custom"
    architecture: str = "decoder"
    max_position_embeddings: int = 4096
    mlp: str = "gated"
    activation: str = "silu"
    norm: str = "rmsnorm"
    #: norms inside each block: 2 for pre-norm blocks (Llama), 4 for Gemma-2/3's
    #: pre+post norms, 1 for Falcon-7B's single norm feeding parallel attention and MLP
    norms_per_layer: int = 2
    final_norm: bool = True
    qk_norm: str = "none"
    attention_bias: bool = False
    attention_out_bias: bool = False
    #: biases on the MLP's linears: a dense MLP's, and in a mixture-of-experts layer the
    #: router's and every expert's projections (gpt-oss: ``router.bias``,
    #: ``experts.gate_up_proj_bias``, ``experts.down_proj_bias``)
    mlp_bias: bool = False
    lm_head_bias: bool = False
    position_embedding: str = "rotary"
    type_vocab_size: int = 0
    embedding_norm: bool = False
    tie_word_embeddings: bool = False
    pooler: bool = False
    #: BERT's masked-LM head: dense hidden->hidden, activation, LayerNorm, then the decoder
    lm_head_transform: bool = False
    fused_qkv: bool = False
    fused_gate_up: bool = False
    parallel_attention: bool = False
    sliding_window: int = 0
    #: every n-th layer attends over the whole sequence, the others over the sliding window
    #: (Gemma-2: 2, Gemma-3: 6; layer i is global where ``(i + 1) % n == 0``, transformers'
    #: ``layer_types``); 0: every layer slides the window, where there is one
    full_attention_every: int = 0
    #: the transformers module calls SDPA with multi-query keys and values it does not
    #: repeat, and a mask: CUDA has no fused kernel for that and runs the math fallback,
    #: which materializes the scores (Falcon's original architecture)
    sdpa_math: bool = False
    #: the attention without SDPA or flash: ``hf``, transformers' shared
    #: ``eager_attention_forward`` (scores scaled out of place, softmax in fp32 cast back to
    #: the query's dtype); ``plain``, GPT-2's and BERT's own (their softmax in the scores'
    #: dtype, fp32 under autocast, then cast to the values' dtype); ``falcon``,
    #: ``FalconAttention``'s own (scores scaled in place, softmax in the hidden states'
    #: dtype, kept as the product with the values reads it)
    eager_attention: str = "hf"
    #: Gemma-2's soft-capping of the attention scores, ``cap * tanh(scores / cap)`` before
    #: the mask (eager and flash attention; SDPA cannot); 0: none
    attn_logit_softcapping: float = 0.0
    #: a learned sink logit per query head in every attention layer (gpt-oss's
    #: ``self_attn.sinks``, ``num_attention_heads`` parameters a layer): the softmax runs
    #: over the scores and the sink, and the sink's share is dropped. No SDPA or flash
    #: kernel trains it, so the attention runs eager
    #: (:func:`memfit.engine.layers.attention_run`)
    attention_sinks: bool = False
    #: where each block's norms sit: ``pre`` (before attention and the MLP), ``post``
    #: (OLMo-2: on each sublayer's output, before the residual sum) or ``sandwich``
    #: (Gemma-2/3: before and after each sublayer)
    norm_placement: str = "pre"
    #: RoPE's output cast back to the dtype of q and k (OLMo-2's ``apply_rotary_pos_emb``:
    #: ``q_embed.to(q_type)``); otherwise it stays in the promoted dtype of the cos/sin
    #: tables (fp32 under autocast)
    rope_keeps_dtype: bool = False
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    #: Gemma-2's soft-capping of the final logits, ``cap * tanh(logits / cap)``: three
    #: logits-sized ops after the LM head; 0: none
    final_logit_softcapping: float = 0.0
    # Mixture of experts
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    first_dense_layers: int = 0
    #: DeepSeek-V3's ``e_score_correction_bias`` beside the router (not a bias of its linear)
    router_bias: bool = False
    #: the routed experts' clamped SwiGLU (gpt-oss): the gate clamped above at the limit,
    #: the up projection to [-limit, limit], then ``(up + 1) * gate * sigmoid(alpha gate)``,
    #: each an op of its own; the bounds change no byte or FLOP. 0: the plain gated
    #: activation
    swiglu_limit: float = 0.0
    # Multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank > 0 switches it on
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    source: str = ""
    #: the family (a ``model_type`` of :mod:`memfit.engine.hf_config`) whose reader read this
    #: model's config in place of its own ``family``'s, as the user asked: a look-alike,
    #: counted as that family's architecture. Empty: read as itself
    read_as: str = ""
    #: the multimodal ``model_type`` this is the text model of (``llava``, ``gemma3``, ...);
    #: its vision tower and projector are not counted. Empty: a text model of its own
    text_model_of: str = ""
    #: a per-rank view under expert parallelism: the routed experts are split over this
    #: many ranks (each holds ``num_experts / expert_shards``; the router still scores
    #: every expert). 1 for a whole model; set by the engine, not by presets.
    expert_shards: int = 1

    def __post_init__(self) -> None:
        f = "model."
        check_fields(self, f)
        check_str(f + "name", self.name)
        check_choice(f + "architecture", self.architecture, ARCHITECTURES)
        check_int(f + "num_layers", self.num_layers, 1, MAX_LAYERS)
        check_int(f + "hidden_size", self.hidden_size, 1, MAX_DIM)
        check_int(f + "num_attention_heads", self.num_attention_heads, 1, 65536)
        check_int(f + "num_key_value_heads", self.num_key_value_heads, 1, self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise EstimateError(
                f + "num_key_value_heads",
                f"got {self.num_key_value_heads}, expected a divisor of "
                f"num_attention_heads ({self.num_attention_heads})",
            )
        check_int(f + "head_dim", self.head_dim, 1, 65536)
        check_int(f + "intermediate_size", self.intermediate_size, 0, MAX_DIM)
        check_int(f + "vocab_size", self.vocab_size, 1, MAX_DIM)
        check_int(f + "max_position_embeddings", self.max_position_embeddings, 1, MAX_DIM)
        check_choice(f + "mlp", self.mlp, MLP_KINDS)
        check_choice(f + "activation", self.activation, ACTIVATIONS)
        check_choice(f + "norm", self.norm, NORMS)
        check_int(f + "norms_per_layer", self.norms_per_layer, 0, 4)
        check_choice(f + "qk_norm", self.qk_norm, QK_NORMS)
        check_choice(f + "eager_attention", self.eager_attention, EAGER_ATTENTIONS)
        check_choice(f + "norm_placement", self.norm_placement, NORM_PLACEMENTS)
        check_choice(f + "position_embedding", self.position_embedding, POSITIONS)
        check_int(f + "type_vocab_size", self.type_vocab_size, 0, 1024)
        for name in (
            "final_norm",
            "attention_bias",
            "attention_out_bias",
            "mlp_bias",
            "lm_head_bias",
            "embedding_norm",
            "tie_word_embeddings",
            "pooler",
            "lm_head_transform",
            "fused_qkv",
            "fused_gate_up",
            "parallel_attention",
            "shared_expert_gate",
            "router_bias",
            "rope_keeps_dtype",
            "attention_sinks",
        ):
            check_bool(f + name, getattr(self, name))
        check_int(f + "sliding_window", self.sliding_window, 0, MAX_DIM)
        check_int(f + "full_attention_every", self.full_attention_every, 0, MAX_DIM)
        check_float(f + "attention_dropout", self.attention_dropout, *DROPOUT)
        check_float(f + "hidden_dropout", self.hidden_dropout, *DROPOUT)
        check_float(f + "final_logit_softcapping", self.final_logit_softcapping, 0.0, 1e6)
        check_float(f + "attn_logit_softcapping", self.attn_logit_softcapping, 0.0, 1e6)
        check_float(f + "swiglu_limit", self.swiglu_limit, 0.0, 1e6)
        check_str(f + "display_name", self.display_name or self.name)
        check_str(f + "family", self.family)
        self._check_moe(f)
        self._check_mla(f)
        check_int(f + "expert_shards", self.expert_shards, 1, MAX_EXPERTS)
        if self.expert_shards > 1 and not self.num_experts:
            raise EstimateError(
                f + "expert_shards",
                f"got {self.expert_shards}, expected 1 on a dense model (num_experts is 0)",
            )
        if self.expert_shards > 1 and self.num_experts % self.expert_shards:
            raise EstimateError(
                f + "expert_shards",
                f"got {self.expert_shards}, expected a divisor of the {self.num_experts} experts",
            )
        if self.position_embedding == "learned" and self.max_position_embeddings < 1:
            raise EstimateError(f + "max_position_embeddings", "learned positions need a size")

    def _check_moe(self, f: str) -> None:
        check_int(f + "num_experts", self.num_experts, 0, MAX_EXPERTS)
        if self.num_experts == 0:
            for name in (
                "num_experts_per_tok", "moe_intermediate_size", "num_shared_experts",
                "swiglu_limit",
            ):  # fmt: skip
                if getattr(self, name):
                    raise EstimateError(f + name, "is set but num_experts is 0 (a dense model)")
            return
        if self.swiglu_limit and self.mlp != "gated":
            raise EstimateError(
                f + "swiglu_limit", f"is set but mlp is {self.mlp!r}: a clamped SwiGLU is gated"
            )
        check_int(f + "num_experts_per_tok", self.num_experts_per_tok, 1, self.num_experts)
        check_int(f + "moe_intermediate_size", self.moe_intermediate_size, 1, MAX_DIM)
        check_int(f + "num_shared_experts", self.num_shared_experts, 0, MAX_EXPERTS)
        check_int(
            f + "shared_expert_intermediate_size", self.shared_expert_intermediate_size, 0, MAX_DIM
        )
        check_int(f + "first_dense_layers", self.first_dense_layers, 0, self.num_layers)
        if self.first_dense_layers and self.intermediate_size < 1:
            raise EstimateError(
                f + "intermediate_size", "dense layers before the first MoE layer need a size"
            )

    def _check_mla(self, f: str) -> None:
        check_int(f + "kv_lora_rank", self.kv_lora_rank, 0, MAX_DIM)
        check_int(f + "q_lora_rank", self.q_lora_rank, 0, MAX_DIM)
        check_int(f + "qk_rope_head_dim", self.qk_rope_head_dim, 0, 65536)
        check_int(f + "qk_nope_head_dim", self.qk_nope_head_dim, 0, 65536)
        check_int(f + "v_head_dim", self.v_head_dim, 0, 65536)
        if self.kv_lora_rank:
            for name in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                check_int(f + name, getattr(self, name), 1, 65536)
        elif self.q_lora_rank:
            raise EstimateError(f + "q_lora_rank", "needs kv_lora_rank > 0 (MLA)")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def local_experts(self) -> int:
        """Routed experts held by one rank (all of them without expert parallelism)."""
        return self.num_experts // self.expert_shards

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def label(self) -> str:
        return self.display_name or self.name


#: the most characters of a GPU's name (its ``display_name``, ``hardware.gpu_name``)
GPU_NAME_CHARS = 64


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator model, as a preset in ``resources/gpus``.

    ``display_name`` is what every view calls the device: the preset's, or a name the
    user gave it (``hardware.gpu_name`` of a scenario file, at most
    :data:`GPU_NAME_CHARS` characters).

    ``memory_mib`` is the total that the vendor's tool reports (``nvidia-smi``,
    ``rocm-smi``, ``hl-smi``), not the marketing number: an "80 GB" H100 SXM reports
    81,559 MiB. Throughputs are dense (no 2:4 sparsity) peak figures from the datasheet.
    """

    name: str
    display_name: str
    vendor: str
    architecture: str
    memory_mib: int
    memory_source: str
    bf16_tflops: float
    fp16_tflops: float
    fp8_tflops: float
    fp32_tflops: float
    memory_bandwidth_gb_s: float
    host_link: str
    host_link_gb_s: float
    interconnect: str = ""
    interconnect_gb_s: float = 0.0
    form_factor: str = ""
    source: str = ""
    #: what one GPU-hour of this device costs the user; ``None`` (unknown) hides cost
    price_per_gpu_hour: float | None = None
    #: achievable share of the dense peak for large matmuls and for the attention
    #: kernel; ``None`` takes the architecture's figure (:data:`memfit.engine.steptime.EFFICIENCY`)
    matmul_efficiency: float | None = None
    attention_efficiency: float | None = None
    #: the board's thermal design power, its default power limit (W), and where the
    #: figure comes from; ``None``: not known, a power limit cannot be given
    tdp_w: float | None = None
    tdp_source: str = ""
    #: the figures a custom GPU did not give, taken from a reference device (see
    #: :func:`memfit.engine.scenario_io.custom_gpu`); a preset's are all its own
    assumed: tuple[str, ...] = ()

    VENDORS = ("nvidia", "amd", "intel")
    HOST_LINKS = ("pcie-gen3", "pcie-gen4", "pcie-gen5", "pcie-gen6", "nvlink-c2c")

    def __post_init__(self) -> None:
        f = "gpu."
        check_fields(self, f)
        check_str(f + "name", self.name)
        check_str(f + "display_name", self.display_name)
        if len(self.display_name) > GPU_NAME_CHARS:
            raise EstimateError(
                f + "display_name",
                f"got {len(self.display_name):,} characters, expected 1 to {GPU_NAME_CHARS}",
            )
        check_choice(f + "vendor", self.vendor, self.VENDORS)
        check_str(f + "architecture", self.architecture)
        check_int(f + "memory_mib", self.memory_mib, 1024, 16 << 20)
        check_str(f + "memory_source", self.memory_source)
        for name in ("bf16_tflops", "fp16_tflops", "fp32_tflops"):
            check_float(f + name, getattr(self, name), 0.001, 1e6)
        check_float(f + "fp8_tflops", self.fp8_tflops, 0.0, 1e6)
        check_float(f + "memory_bandwidth_gb_s", self.memory_bandwidth_gb_s, 1.0, 1e6)
        check_choice(f + "host_link", self.host_link, self.HOST_LINKS)
        check_float(f + "host_link_gb_s", self.host_link_gb_s, 1.0, 1e5)
        check_float(f + "interconnect_gb_s", self.interconnect_gb_s, 0.0, 1e5)
        if self.price_per_gpu_hour is not None:
            check_float(f + "price_per_gpu_hour", self.price_per_gpu_hour, 0.0, 1e6)
        for name in ("matmul_efficiency", "attention_efficiency"):
            if getattr(self, name) is not None:
                check_float(f + name, getattr(self, name), *EFFICIENCY_RANGE)
        if self.tdp_w is not None:
            check_float(f + "tdp_w", self.tdp_w, *TDP_W)

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib << 20


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """The devices a run uses.

    ``memory_gib`` (2^30 bytes) overrides the preset's device memory; ``utilization_target``
    places the budget line, the share of capacity a plan should stay under (0.85 by default:
    real runs vary, and the last few percent go to fragmentation).
    """

    gpu: GpuSpec
    gpus_per_node: int = 1
    nodes: int = 1
    memory_gib: float | None = None
    utilization_target: float = 0.85
    #: host RAM of one node in GiB, for the host-memory verdict of offload (None: unknown)
    host_memory_gib: float | None = None
    #: the fabric between nodes, a name of :data:`NETWORKS`; ``network_gb_s`` (GB/s one
    #: way, all of a node's NICs together) overrides it. Unset: the GPU generation's
    #: usual fabric (:func:`memfit.engine.steptime.network_gb_s`)
    network: str | None = None
    network_gb_s: float | None = None
    #: overrides of the GPU preset's price and efficiencies (see :class:`GpuSpec`)
    price_per_gpu_hour: float | None = None
    matmul_efficiency: float | None = None
    attention_efficiency: float | None = None
    #: :data:`CUDA_RUNTIMES`: what the CUDA context takes beyond PyTorch's pool
    cuda_runtime: str = "cuda12-lazy"
    #: the board's power cap in W (``nvidia-smi -pl``), within :data:`POWER_LIMIT_SHARE`
    #: of the GPU's TDP; or the sustained SM clock as a share of the stock board's
    #: (:data:`CLOCK_SHARE`). Neither: the stock board (the step time's
    #: :func:`memfit.engine.steptime.sustained_clock`)
    power_limit_w: float | None = None
    clock_share: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.gpu, GpuSpec):
            raise EstimateError("hardware.gpu", f"got {shown(self.gpu)}, expected a GPU preset")
        check_fields(self, "hardware.")
        check_int("hardware.gpus_per_node", self.gpus_per_node, 1, 64)
        check_int("hardware.nodes", self.nodes, 1, 100_000)
        if self.memory_gib is not None:
            check_float("hardware.memory_gib", self.memory_gib, *MEMORY_GIB)
        check_float("hardware.utilization_target", self.utilization_target, 0.1, 1.0)
        check_choice("hardware.cuda_runtime", self.cuda_runtime, CUDA_RUNTIMES)
        if self.host_memory_gib is not None:
            check_float("hardware.host_memory_gib", self.host_memory_gib, 1.0, 1 << 20)
        if self.network is not None and self.network not in NETWORKS:
            check_choice("hardware.network", self.network, tuple(NETWORKS))
        if self.network_gb_s is not None:
            check_float("hardware.network_gb_s", self.network_gb_s, 0.1, 1e5)
        if self.price_per_gpu_hour is not None:
            check_float("hardware.price_per_gpu_hour", self.price_per_gpu_hour, 0.0, 1e6)
        for name in ("matmul_efficiency", "attention_efficiency"):
            if getattr(self, name) is not None:
                check_float("hardware." + name, getattr(self, name), *EFFICIENCY_RANGE)
        if self.clock_share is not None:
            check_float("hardware.clock_share", self.clock_share, *CLOCK_SHARE)
        if self.power_limit_w is not None:
            self._check_power_limit(self.power_limit_w)

    def _check_power_limit(self, watts: float) -> None:
        field_ = "hardware.power_limit_w"
        tdp = self.gpu.tdp_w
        if tdp is None:
            raise EstimateError(
                field_,
                f"{self.gpu.display_name} has no TDP on record; give hardware.clock_share "
                "instead (or hardware.tdp_w for a custom GPU)",
            )
        if self.clock_share is not None:
            raise EstimateError(
                field_, "give hardware.power_limit_w or hardware.clock_share, not both"
            )
        lo, hi = POWER_LIMIT_SHARE[0] * tdp, POWER_LIMIT_SHARE[1] * tdp
        try:
            check_float(field_, watts, lo, hi)
        except EstimateError as exc:
            raise EstimateError(
                field_,
                f"{exc.detail} W: {100 * POWER_LIMIT_SHARE[0]:g} to "
                f"{100 * POWER_LIMIT_SHARE[1]:g} % of the {tdp:g} W TDP of "
                f"{self.gpu.display_name}",
            ) from None

    @property
    def capacity_bytes(self) -> int:
        """Memory of one device in bytes (an integer; ``memory_gib`` is in 2^30 bytes)."""
        if self.memory_gib is not None:
            return round(self.memory_gib * (1 << 30))
        return self.gpu.memory_bytes

    @property
    def budget_bytes(self) -> int:
        """``capacity_bytes x utilization_target``, rounded down to a whole byte."""
        per_10k = round(self.utilization_target * 10_000)
        return self.capacity_bytes * per_10k // 10_000

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def host_capacity_bytes(self) -> int | None:
        """Host RAM of one node in bytes, when the user gave it."""
        if self.host_memory_gib is None:
            return None
        return round(self.host_memory_gib * (1 << 30))


@dataclass(frozen=True, slots=True)
class LoraSpec:
    """LoRA adapters (Hu et al. 2021): ``W x + (alpha/r) B A x``, ``A: r x in``, ``B: out x r``."""

    rank: int = 16
    alpha: float = 32.0
    targets: tuple[str, ...] = ("q_proj", "v_proj")
    dropout: float = 0.0
    #: a name of :data:`ADAPTER_DTYPES`; None: the training stack's convention
    adapter_dtype: str | None = None
    #: PEFT's ``modules_to_save``: names of :data:`MODULES_TO_SAVE`, each trained as a full
    #: copy (in the base's dtype) beside the frozen original
    modules_to_save: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_fields(self, "training.lora.")
        for name in self.modules_to_save:
            check_choice("training.lora.modules_to_save", name, MODULES_TO_SAVE)
        if len(set(self.modules_to_save)) != len(self.modules_to_save):
            raise EstimateError(
                "training.lora.modules_to_save",
                f"got {list(self.modules_to_save)}, expected each of "
                f"{', '.join(MODULES_TO_SAVE)} at most once",
            )
        if self.adapter_dtype is not None:
            check_choice("training.lora.adapter_dtype", self.adapter_dtype, ADAPTER_DTYPES)
        check_int("training.lora.rank", self.rank, 1, 65536)
        check_float("training.lora.alpha", self.alpha, 0.0, 1e6)
        check_float("training.lora.dropout", self.dropout, *DROPOUT)
        if not self.targets:
            raise EstimateError(
                "training.lora.targets",
                f"got an empty list, expected a non-empty list of {', '.join(LORA_TARGETS)}",
            )
        for target in self.targets:
            if target not in LORA_MODULE_NAMES:
                check_choice(
                    "training.lora.targets", target, LORA_TARGETS + tuple(LORA_MODULE_NAMES)
                )


@dataclass(frozen=True, slots=True)
class QuantSpec:
    """The 4-bit storage of QLoRA's frozen base (Dettmers et al. 2023, section 3)."""

    quant_type: str = "nf4"
    block_size: int = 64
    double_quant: bool = True
    compute_dtype: str = "bf16"
    #: the LM head is quantized too (Lightning's bitsandbytes plugin replaces every
    #: ``nn.Linear``); None: the training stack's convention
    quantize_lm_head: bool | None = None
    #: a name of :data:`DEQUANT_DTYPES`; None: the training stack's convention
    dequant_dtype: str | None = None
    #: PEFT's ``prepare_model_for_kbit_training`` runs on the 4-bit model: every weight
    #: left unquantized (norms, embeddings, the LM head, biases) upcast to fp32; None: the
    #: training stack's convention
    prepare_kbit: bool | None = None
    #: bitsandbytes' 4-bit matmul keeps its input for backward (before 0.43.2; 0.43.2 and
    #: later keep only the 4-bit weight); None: the training stack's convention
    matmul_keeps_input: bool | None = None

    def __post_init__(self) -> None:
        check_fields(self, "training.qlora.")
        if self.prepare_kbit is not None:
            check_bool("training.qlora.prepare_kbit", self.prepare_kbit)
        if self.matmul_keeps_input is not None:
            check_bool("training.qlora.matmul_keeps_input", self.matmul_keeps_input)
        if self.dequant_dtype is not None:
            check_choice("training.qlora.dequant_dtype", self.dequant_dtype, DEQUANT_DTYPES)
        check_choice("training.qlora.quant_type", self.quant_type, QUANT_TYPES)
        if self.block_size not in QUANT_BLOCKS:
            raise EstimateError(
                "training.qlora.block_size",
                f"got {shown(self.block_size)}, expected one of "
                f"{', '.join(map(str, QUANT_BLOCKS))}",
            )
        check_bool("training.qlora.double_quant", self.double_quant)
        check_choice("training.qlora.compute_dtype", self.compute_dtype, COMPUTE_DTYPES)


@dataclass(frozen=True, slots=True)
class FreezeSpec:
    """For ``method="freeze"``: the parts that stay trainable, and the last N whole layers."""

    trainable: tuple[str, ...] = ("lm_head",)
    last_layers: int = 0

    def __post_init__(self) -> None:
        check_fields(self, "training.freeze.")
        for part in self.trainable:
            check_choice("training.freeze.trainable", part, FREEZE_PARTS)
        check_int("training.freeze.last_layers", self.last_layers, 0, MAX_LAYERS)


@dataclass(frozen=True, slots=True)
class ParallelAxis:
    """One way of splitting a step over GPUs: a size field of :class:`ParallelismSpec`,
    described once for everything that checks, shows, asks for, sweeps or multiplies it --
    the spec's check, the mesh and its communicators, the CLI's flags, the app's rows and
    tooltips, the report's and the chart's mesh, the sweep's axes and columns, the solvers'
    GPU counts. What it does to memory and to time is the sharding's, the layers' and the
    step time's (:mod:`memfit.engine.sharding`, :mod:`memfit.engine.steptime`)."""

    #: the field of :class:`ParallelismSpec` and the mesh's size; the CLI's ``--KEY``, the
    #: sweep's CSV column
    key: str
    #: the app's row
    label: str
    #: what it splits, in sentences after the label: the app's tooltip and the CLI's help
    help: str
    #: the NCCL communicator of its group (:meth:`memfit.engine.plan.mesh.Mesh.communicators`)
    group: str
    #: the world is the product of these sizes and the data-parallel size; an axis that is
    #: not (expert parallel) splits the data-parallel ranks further
    in_world: bool = True
    #: its group talks point to point: a send and a receive communicator (the pipeline)
    point_to_point: bool = False
    #: the sizes a default sweep tries: powers of two up to a node (``node``), up to 8
    #: (``8``), up to 8 for sequences of 8k and more (``long``); ``""``: the scenario's own
    sweep: str = ""
    #: what the size must divide beyond the world: given the scenario and the size, what
    #: is wrong (the message of an :class:`EstimateError` naming the field) or None. The
    #: mesh runs it right after the world's product
    #: (:func:`memfit.engine.plan.mesh.make_mesh`, which keeps the checks of tp, pp, cp and
    #: ep, reported in the order they always were)
    check: Callable[[Scenario, int], str | None] | None = None
    #: the app's section it is asked for in: "model" (model parallel) or "data" (data
    #: parallel: an axis that splits the data-parallel ranks' work or state)
    section: str = "model"


def _replicate_wrong(scenario: Scenario, replicas: int) -> str | None:
    """What is wrong with ``replicas`` groups of ZeRO shards (see :data:`PARALLEL_AXES`)."""
    p = scenario.training.parallelism
    if replicas == 1:
        return None
    if p.zero_stage == 0:
        return f"got {replicas}, which needs zero_stage >= 1 (there is no shard to replicate)"
    if p.hybrid_shard:
        return f"got {replicas} with hybrid_shard: choose one (hybrid_shard replicates per node)"
    ranks = scenario.hardware.world_size // p.model_parallel * p.cp
    if ranks % replicas:
        return f"got {replicas}, expected a divisor of dp x cp = {ranks}"
    return None


#: every parallel axis, in the order the mesh names them (``tp x pp x cp x dp``)
PARALLEL_AXES = (
    ParallelAxis(
        "tp",
        "Tensor parallel",
        "each layer's weight matrices and most of its activations split over tp GPUs. "
        "tp x pp x cp must divide the GPU count.",
        "tensor parallel",
        sweep="node",
    ),
    ParallelAxis(
        "pp",
        "Pipeline parallel",
        "the layers split into pp stages, one per GPU group, each holding its layers' state "
        "and the activations of its micro-batches in flight. pp x virtual stages must "
        "divide the layers.",
        "pipeline",
        point_to_point=True,
        sweep="8",
    ),
    ParallelAxis(
        "cp",
        "Context parallel",
        "the sequence split into 2 x cp chunks (ring attention), so each GPU keeps the "
        "activations of its part only.",
        "context",
        sweep="long",
    ),
    ParallelAxis(
        "ep",
        "Expert parallel",
        "the experts of an MoE model spread over ep GPUs, each keeping its experts' weights "
        "and states. Must divide the experts and the data-parallel size.",
        "expert parallel",
        in_world=False,
    ),
    ParallelAxis(
        "dp_replicate",
        "Shard replicas",
        "the data-parallel GPUs in this many groups, each holding one whole set of "
        "ZeRO/FSDP shards: shards over dp x cp / replicas GPUs, gradients all-reduced "
        "between the groups (HSDP: FSDP2 on a 2-D mesh, torchtitan's "
        "data_parallel_replicate_degree, DeepSpeed's MiCS). Needs a ZeRO stage; must divide "
        "dp x cp.",
        "replicate",
        in_world=False,
        check=_replicate_wrong,
        section="data",
    ),
)


#: the axes whose sizes multiply into the world, by key
WORLD_AXES = tuple(a.key for a in PARALLEL_AXES if a.in_world)


@dataclass(frozen=True, slots=True)
class ParallelismSpec:
    """How the GPUs split the work; the data-parallel size is what is left over.

    ``zero_stage`` names the data-parallel sharding in ZeRO's terms (Rajbhandari et al.
    2020): 0 replicates everything (DDP, FSDP ``NO_SHARD``), 1 shards the optimizer states
    (Megatron's distributed optimizer), 2 also the gradients (FSDP ``SHARD_GRAD_OP``), 3 also
    the parameters (FSDP ``FULL_SHARD``, FSDP2 ``fully_shard``). ``hybrid_shard`` keeps the
    shards inside a node and replicates across nodes (FSDP ``HYBRID_SHARD``). ``vpp`` is the
    number of virtual pipeline stages per rank (interleaved 1F1B, Narayanan et al. 2021).
    ``pp_split`` "balanced" lets the layers split unevenly, counting the embedding and the
    LM head as a layer each (torchtitan's default split). ``expert_capacity_factor`` is the
    share of tokens the busiest expert rank receives, relative to a perfectly balanced
    router (1.0). ``dp_replicate`` splits the data-parallel ranks into groups that each
    hold one whole set of ZeRO shards (HSDP with a replicate degree of one's choosing).
    ``tp_comm_overlap`` hides the tensor-parallel all-gathers and reduce-scatters behind the
    GEMMs next to them (Megatron's ``--tp-comm-overlap`` with Transformer Engine's
    userbuffers, torchtitan's async TP); both split the sequence-parallel collectives into
    chunks, so it takes effect with ``sequence_parallel`` and ``tp`` above 1.
    """

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero_stage: int = 0
    vpp: int = 1
    pp_schedule: str = "1f1b"
    pp_split: str = "even"
    sequence_parallel: bool = False
    framework: str = "pytorch"
    hybrid_shard: bool = False
    expert_capacity_factor: float = 1.0
    dp_replicate: int = 1
    tp_comm_overlap: bool = False
    #: :data:`FSDP_DTYPES`; None: the training stack's
    fsdp_param_dtype: str | None = None
    fsdp_reduce_dtype: str | None = None

    def __post_init__(self) -> None:
        f = "training.parallelism."
        check_fields(self, f)
        for axis in PARALLEL_AXES:
            check_int(f + axis.key, getattr(self, axis.key), 1, 65536)
        check_int(f + "zero_stage", self.zero_stage, 0, 3)
        check_int(f + "vpp", self.vpp, 1, 1024)
        check_choice(f + "pp_schedule", self.pp_schedule, PP_SCHEDULES)
        check_choice(f + "pp_split", self.pp_split, PP_SPLITS)
        check_bool(f + "sequence_parallel", self.sequence_parallel)
        check_choice(f + "framework", self.framework, FRAMEWORKS)
        check_bool(f + "hybrid_shard", self.hybrid_shard)
        check_bool(f + "tp_comm_overlap", self.tp_comm_overlap)
        for name in ("fsdp_param_dtype", "fsdp_reduce_dtype"):
            if getattr(self, name) is not None:
                check_choice(f + name, getattr(self, name), FSDP_DTYPES)
        check_float(f + "expert_capacity_factor", self.expert_capacity_factor, 1.0, 64.0)
        if self.pp_schedule == "interleaved-1f1b" and self.vpp < 2:
            raise EstimateError(
                f + "vpp", f"got {self.vpp}, expected at least 2 for the interleaved schedule"
            )
        if self.vpp > 1 and self.pp_schedule != "interleaved-1f1b":
            raise EstimateError(
                f + "vpp",
                f"got {self.vpp}, expected 1: virtual stages need pp_schedule interleaved-1f1b",
            )

    @property
    def is_trivial(self) -> bool:
        return self == ParallelismSpec()

    def size(self, key: str) -> int:
        """The size of the parallel axis ``key`` (one of :data:`PARALLEL_AXES`)."""
        value: int = getattr(self, key)
        return value

    @property
    def model_parallel(self) -> int:
        """The GPUs one data-parallel replica spans: the product of the world's axes."""
        out = 1
        for key in WORLD_AXES:
            out *= self.size(key)
        return out


@dataclass(frozen=True, slots=True)
class OffloadSpec:
    """What leaves the GPU: optimizer states (and with them the gradients, since the step
    runs on the host), parameters (ZeRO-3 only) and the inputs of checkpointed layers."""

    optimizer: str = "none"
    parameters: str = "none"
    activations: str = "none"

    def __post_init__(self) -> None:
        check_fields(self, "training.offload.")
        check_choice("training.offload.optimizer", self.optimizer, OFFLOAD_TARGETS)
        check_choice("training.offload.parameters", self.parameters, OFFLOAD_TARGETS)
        check_choice("training.offload.activations", self.activations, ACTIVATION_OFFLOAD)

    @property
    def is_trivial(self) -> bool:
        return self == OffloadSpec()


@dataclass(frozen=True, slots=True)
class TrainingSpec:
    method: str = "full"
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"
    micro_batch_size: int = 1
    sequence_length: int = 2048
    gradient_accumulation_steps: int = 1
    activation_checkpointing: str = "none"
    checkpoint_every_k: int = 1
    attention: str = "sdpa"
    #: "chunked": a fused/chunked cross-entropy that never materializes the logits
    loss: str = "standard"
    #: chunks of the sequence ``chunked-output`` computes the LM head and the loss in
    loss_chunks: int = 8
    #: the training stack whose conventions fill the fields below left at None
    #: (:mod:`memfit.engine.stacks`); an explicit value overrides the stack's
    stack: str = "hf-trainer"
    #: the model output (the logits; with ``kv_cache_in_outputs`` the KV cache) stays
    #: referenced through backward and the optimizer step, or is released before backward
    outputs_held_through_backward: bool | None = None
    #: transformers builds a KV cache in training (``use_cache``), never under checkpointing
    kv_cache_in_outputs: bool | None = None
    #: storage dtype of frozen, non-quantized weights (:data:`FROZEN_DTYPES`)
    frozen_weights_dtype: str | None = None
    #: the modeling code that builds the model (:data:`MODEL_IMPLEMENTATIONS`); None: the
    #: training stack's
    model_implementation: str | None = None
    #: the loop's variables (``loss = ...``, ``outputs = model(...)``) keep the previous
    #: step's autograd graph and model output alive until the next step rebinds them;
    #: None: the training stack's convention
    previous_step_held: bool | None = None
    #: DDP's gradients are views of its all-reduce buckets (``gradient_as_bucket_view``)
    #: or separate tensors copied into them; None: the training stack's convention
    gradient_as_bucket_view: bool | None = None
    #: activation checkpointing through torch's reentrant implementation
    #: (``use_reentrant=True``) or the non-reentrant one; None: the training stack's
    reentrant_checkpointing: bool | None = None
    #: :data:`MOE_IMPLEMENTATIONS`
    moe_implementation: str = "grouped"
    #: the optimizer steps each parameter in backward as soon as its gradient is ready and
    #: frees the gradient (torchtune's ``optimizer_in_bwd``: a post-accumulate-grad hook
    #: per parameter): no gradient outlives its own step
    optimizer_in_backward: bool = False
    #: tokens the whole run trains on, for its wall time, GPU-hours and cost (None: not asked)
    token_budget: int | None = None
    #: :data:`FP8_RECIPES`: how the FP8 GEMMs of ``fp8-mixed`` scale their inputs
    fp8_recipe: str = "tensorwise"
    #: the model runs under ``torch.compile`` (inductor), each layer and the head with the
    #: loss compiled: its element-wise ops fuse into kernels between the matmuls and the
    #: attention (step time), and AOTAutograd's partitioner chooses what the forward keeps
    #: for backward (memory: :mod:`memfit.engine.inductor`)
    torch_compile: bool = False
    #: :data:`COMPILE_SCOPES`; None: the training stack's
    torch_compile_scope: str | None = None
    #: :data:`LOGITS_UPCASTS`: where the standard loss's fp32 copy of the logits is made;
    #: None: the training stack's
    logits_upcast: str | None = None
    lora: LoraSpec = field(default_factory=LoraSpec)
    qlora: QuantSpec = field(default_factory=QuantSpec)
    freeze: FreezeSpec = field(default_factory=FreezeSpec)
    parallelism: ParallelismSpec = field(default_factory=ParallelismSpec)
    offload: OffloadSpec = field(default_factory=OffloadSpec)

    def __post_init__(self) -> None:
        t = "training."
        for name, kind in (
            ("lora", LoraSpec),
            ("qlora", QuantSpec),
            ("freeze", FreezeSpec),
            ("parallelism", ParallelismSpec),
            ("offload", OffloadSpec),
        ):
            if not isinstance(getattr(self, name), kind):
                raise EstimateError(t + name, "expected an object (a section of its own)")
        check_fields(self, t)
        check_choice(t + "method", self.method, METHODS)
        check_choice(t + "precision", self.precision, PRECISIONS)
        check_choice(t + "optimizer", self.optimizer, OPTIMIZERS)
        check_choice(t + "optimizer_impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        check_int(t + "micro_batch_size", self.micro_batch_size, 1, 65536)
        check_int(t + "sequence_length", self.sequence_length, 1, MAX_DIM)
        check_int(t + "gradient_accumulation_steps", self.gradient_accumulation_steps, 1, 1 << 20)
        check_choice(t + "activation_checkpointing", self.activation_checkpointing, CHECKPOINTING)
        check_int(t + "checkpoint_every_k", self.checkpoint_every_k, 1, MAX_LAYERS)
        check_choice(t + "attention", self.attention, ATTENTION_KERNELS)
        check_choice(t + "loss", self.loss, LOSSES)
        check_int(t + "loss_chunks", self.loss_chunks, 1, 4096)
        if self.stack not in STACKS:
            check_choice(t + "stack", self.stack, stack_names())
        if self.frozen_weights_dtype is not None:
            check_choice(t + "frozen_weights_dtype", self.frozen_weights_dtype, FROZEN_DTYPES)
            compute = "fp16" if self.precision == "fp16-mixed" else "bf16"
            other = {"bf16": "fp16", "fp16": "bf16"}[compute]
            if self.precision.endswith("-mixed") and self.frozen_weights_dtype == other:
                # the engine tells dtypes apart by their size: an fp16 base cast to bf16
                # at every use (and fp16 + bf16 promoting to fp32) is not modelled
                raise EstimateError(
                    t + "frozen_weights_dtype",
                    f"got {other!r} under {self.precision}, whose compute dtype is "
                    f"{compute}: not modelled; expected auto, fp32 or {compute}",
                )
        check_choice(t + "moe_implementation", self.moe_implementation, MOE_IMPLEMENTATIONS)
        check_choice(t + "fp8_recipe", self.fp8_recipe, FP8_RECIPES)
        check_bool(t + "torch_compile", self.torch_compile)
        if self.torch_compile_scope is not None:
            check_choice(t + "torch_compile_scope", self.torch_compile_scope, COMPILE_SCOPES)
        if self.logits_upcast is not None:
            check_choice(t + "logits_upcast", self.logits_upcast, LOGITS_UPCASTS)
        if self.model_implementation is not None:
            check_choice(
                t + "model_implementation", self.model_implementation, MODEL_IMPLEMENTATIONS
            )
        if self.optimizer_in_backward and self.gradient_accumulation_steps != 1:
            raise EstimateError(
                t + "optimizer_in_backward",
                f"needs gradient_accumulation_steps 1 (got {self.gradient_accumulation_steps}):"
                " a gradient is stepped and freed as soon as it is ready",
            )
        if self.token_budget is not None:
            check_int(t + "token_budget", self.token_budget, 1, 10**16)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A model, the hardware and the training strategy: everything an estimate needs."""

    model: ModelSpec
    hardware: HardwareSpec
    training: TrainingSpec = field(default_factory=TrainingSpec)

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelSpec):
            raise EstimateError("model", "expected a model section")
        if not isinstance(self.hardware, HardwareSpec):
            raise EstimateError("hardware", "expected a hardware section")
        if not isinstance(self.training, TrainingSpec):
            raise EstimateError("training", "expected a training section")
        rank = self.training.lora.rank
        if self.training.method in ("lora", "qlora") and rank > self.model.hidden_size:
            raise EstimateError(
                "training.lora.rank",
                f"got {rank}, expected an integer in [1, {self.model.hidden_size}] "
                f"(the model's hidden_size)",
            )


def full_attention(model: ModelSpec, layer: int) -> bool:
    """Whether layer ``layer`` (from 0) attends over the whole sequence though the model
    has a sliding window (:attr:`ModelSpec.full_attention_every`)."""
    n = model.full_attention_every
    return n > 0 and model.sliding_window > 0 and (layer + 1) % n == 0


def full_attention_layers(model: ModelSpec) -> int:
    """How many of the model's layers :func:`full_attention` names: every
    ``full_attention_every``-th."""
    n = model.full_attention_every
    return model.num_layers // n if n > 0 and model.sliding_window > 0 else 0


def window_masks(model: ModelSpec, seq: int) -> bool:
    """Whether transformers passes SDPA a sliding-window mask at sequence length ``seq``:
    from the window's own length on (at ``seq == window`` nothing is masked yet, but the
    mask is built and the causal shortcut is lost)."""
    return 0 < model.sliding_window <= seq


#: the training fields a sweep varies; each is checked on its own (no check of another
#: field reads them), which is what lets :func:`reshaped` skip the checks
SHAPE_FIELDS = ("micro_batch_size", "sequence_length", "gradient_accumulation_steps")


def reshaped(scenario: Scenario, **shape: int) -> Scenario:
    """``scenario`` with other :data:`SHAPE_FIELDS` values: equal to
    ``dataclasses.replace`` of them, made without running every field's checks again (a
    fifth of a sweep's time). Only for values already checked on their own, as
    :mod:`memfit.engine.batch` does for every shape."""
    t = scenario.training
    if all(getattr(t, k) == v for k, v in shape.items()):
        return scenario
    if not set(shape) <= set(SHAPE_FIELDS):
        raise ValueError(f"not shape fields: {sorted(set(shape) - set(SHAPE_FIELDS))}")
    training = object.__new__(TrainingSpec)
    for name in _TRAINING_FIELDS:
        object.__setattr__(training, name, shape.get(name, getattr(t, name)))
    out = object.__new__(Scenario)
    object.__setattr__(out, "model", scenario.model)
    object.__setattr__(out, "hardware", scenario.hardware)
    object.__setattr__(out, "training", training)
    return out


_TRAINING_FIELDS = tuple(f.name for f in dataclasses.fields(TrainingSpec))


#: each spec object hashed lately and its hash, by the object's identity (the entry holds
#: the object, so that no other takes its identity while the entry lives)
_HASHES: memo.Table[int, tuple[object, int]] = memo.Table(f"{__name__}._HASHES", 8192)


def keeps_its_hash(cls: type) -> None:
    """Give the frozen dataclass ``cls`` a hash computed once per object: the hash its
    dataclass would compute (of the fields it compares), kept by identity. A model or
    training spec (or a model state) is a key of the engine's caches thousands of times
    a sweep, and hashing one walks every field of it and of what it holds."""
    names = [f.name for f in dataclasses.fields(cls) if f.compare and f.hash is not False]
    values = attrgetter(*names)

    def __hash__(self: object) -> int:
        found = _HASHES.get(id(self))
        if found is not None and found[0] is self:
            return found[1]
        h: int = hash(values(self))
        _HASHES.keep(id(self), (self, h))
        return h

    cls.__hash__ = __hash__  # type: ignore[assignment]


for _spec in (ModelSpec, TrainingSpec, Scenario):
    keeps_its_hash(_spec)
