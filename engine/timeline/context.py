"""What the step is made of before it is played: the context of its layers
(:func:`make_ctx`), each layer's kind and whether autograd records it (:func:`step_layers`),
which layers checkpointing keeps only the input of, the pipeline stage and what ZeRO-3/FSDP
keeps gathered (:class:`Stage`, :class:`Gather`), and the optimizer's temporaries."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from memfit.engine import memo
from memfit.engine.graph import Block, Lin, Size
from memfit.engine.inductor import partition
from memfit.engine.layers import Ctx, attention_run, bert_layer, decoder_layer, head_and_loss
from memfit.engine.model_state import (
    DTYPE_BYTES,
    FREEZE_COMPONENTS,
    ModelState,
    expert_lora_roles,
    linear_lora_roles,
    optimizer_state,
    qkv_adapted,
    saved_components,
    saved_copies,
    split_tensors,
)
from memfit.engine.params import model_tensors
from memfit.engine.plan.precision import precision_of
from memfit.engine.specs import ModelSpec, TrainingSpec, full_attention, window_masks
from memfit.engine.stacks import conventions


def trains_embedding(trainable: frozenset[str]) -> bool:
    """Whether the embedding's weight trains, from a context's trainable components
    (:func:`make_ctx`, which counts a head tied to the embedding as both)."""
    return bool({"all", "embeddings"} & trainable)


def make_ctx(model: ModelSpec, training: TrainingSpec) -> Ctx:
    method = training.method
    if method == "full":
        trainable = frozenset({"all"})
    elif method == "freeze":
        parts = set(training.freeze.trainable)
        if model.tie_word_embeddings and parts & {"embeddings", "lm_head"}:
            parts |= {"embeddings", "lm_head"}  # one tensor: training either trains both
        trainable = frozenset(c for p in sorted(parts) for c in FREEZE_COMPONENTS[p])
    else:
        trainable = frozenset()
    roles: frozenset[str] = frozenset()
    if method in ("lora", "qlora"):
        roles = linear_lora_roles(model, training)
    conv = conventions(training)
    prec = precision_of(training)
    mode, frozen = prec.mode, prec.frozen
    # DeepSpeed's and Megatron's 16-bit modules compute their adapters in 16 bits too
    framework_half = mode == "half" and training.precision.endswith("-mixed")
    adapter = 2 if framework_half else DTYPE_BYTES[conv.adapter_dtype]
    par = training.parallelism
    sp = par.tp if par.sequence_parallel and model.architecture == "decoder" else 1
    return Ctx(
        batch=training.micro_batch_size,
        seq=training.sequence_length // par.cp,
        mode=mode,
        attention=attention_run(model, training.attention),
        lora_rank=training.lora.rank,
        lora_roles=roles,
        trainable=trainable,
        frozen_bytes=frozen,
        quantized=method == "qlora",
        litgpt=conv.implementation == "litgpt",
        matmul_keeps_input=conv.matmul_keeps_input,
        megatron=par.framework == "megatron",
        qkv_enabled=qkv_adapted(training.lora.targets),
        dropout=training.lora.dropout,
        attention_dropout=model.attention_dropout,
        selective=training.activation_checkpointing == "selective",
        masked=window_masks(model, training.sequence_length)
        or (model.sdpa_math and training.attention == "sdpa"),
        sdpa_math=model.sdpa_math,
        moe_eager=training.moe_implementation == "eager",
        fp16=training.precision == "fp16-mixed",
        sp=sp,
        cp=par.cp,
        ep=model.expert_shards,
        capacity=par.expert_capacity_factor if model.expert_shards > 1 else 1.0,
        topk=model.num_experts_per_tok,
        # a trained embedding is stored in fp32 (a head tied to it trains it too: the
        # freeze parts above hold both)
        embedding_bytes=4 if trains_embedding(trainable) else frozen,
        outputs_held=conv.outputs_held,
        kv_cache=conv.kv_cache,
        adapter_bytes=adapter,
        copies=saved_components(training),
        expert_lora=expert_lora_roles(model, training),
        loss=training.loss,
        loss_chunks=training.loss_chunks,
        compiled=conv.compile_scope if training.torch_compile else "",
        upcast_in_model=conv.logits_upcast == "model",
        # a tied head is the embedding, which stays unquantized
        quantized_head=conv.quantize_head and not model.tie_word_embeddings,
        dequant_other=0
        if conv.dequant_dtype == training.qlora.compute_dtype
        else DTYPE_BYTES[conv.dequant_dtype],
    )


def _build(model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool, chunked: bool) -> tuple[Block, str]:
    """The ops of one block of the step (``kind``: a layer kind of :func:`layer_kinds`,
    ``head`` or :data:`HEAD_LOGITS`), and the tensor it hands on; under ``torch.compile``
    as inductor and AOTAutograd's partitioner run it (:func:`memfit.engine.inductor.partition`)."""
    block, out = _eager(model, ctx, kind, x_grad, chunked)
    start = 0  # the first op compiled
    if kind in ("head", HEAD_LOGITS) and ctx.compiled != "model":
        # compiled layer by layer: the final norm and the LM head run eager, the loss
        # compiled on its own or eager too
        start = block.loss_from if ctx.compiled == "layers+loss" else len(block.ops)
    if not ctx.compiled or start == len(block.ops):
        return block, out
    weigh = None
    if ctx.symbolic:  # the partitioner's choice weighed at the profiles' held-out shape
        terms = ctx.terms_at(3, 37 * ctx.sp)

        def weigh(size: Size) -> int:
            if not isinstance(size, Lin):
                return size
            return round(sum(float(a) * v for a, v in zip(size.c, terms, strict=True)))

    return partition(block, out, weigh, start), out


def _eager(model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool, chunked: bool) -> tuple[Block, str]:
    if kind == "head":
        return head_and_loss(model, ctx, x_grad, chunked)
    if kind == HEAD_LOGITS:
        return head_and_loss(model, ctx, x_grad, chunked, logits_only=True)
    if kind.endswith(TRAINED):  # one of the last layers ``freeze`` trains whole
        ctx = dataclasses.replace(ctx, trainable=ctx.trainable | {"all"})
        kind = kind.removesuffix(TRAINED)
    if kind.endswith(FULL):  # a global layer among sliding ones: no window to mask
        ctx = dataclasses.replace(ctx, masked=False)
        kind = kind.removesuffix(FULL)
    if model.architecture == "encoder":
        return bert_layer(model, ctx, x_grad)
    return decoder_layer(model, ctx, x_grad, kind == "moe")


#: the suffix of a layer kind that trains every weight of the layer (``freeze``'s last
#: layers)
TRAINED = "+trained"
#: the suffix of a layer kind that attends over the whole sequence where the others slide
#: a window (:func:`memfit.engine.specs.full_attention`): its SDPA runs unmasked
FULL = "+full"
#: the LM head up to the model's output (the logits), without the loss: the moment the
#: previous step's output is still alive (:func:`carries_previous`)
HEAD_LOGITS = "head-logits"
#: components every layer has a part of
_LAYER_PARTS = frozenset({"all", "attention", "mlp", "experts", "norms", "router"})


def layer_kinds(
    model: ModelSpec, training: TrainingSpec, ctx: Ctx, embed_grad: bool
) -> list[tuple[str, bool]]:
    """Each layer's block kind and whether its input needs a gradient: the first layer's
    does when the embedding's output does (``embed_grad``); a later layer's when an
    earlier layer trains anything. Autograd saves nothing for a layer that neither trains
    nor has an input that needs a gradient -- the frozen lower layers of ``freeze``."""
    return _layers(model, training, ctx, embed_grad)[0]


def _layers(
    model: ModelSpec, training: TrainingSpec, ctx: Ctx, embed_grad: bool
) -> tuple[list[tuple[str, bool]], list[bool]]:
    """:func:`layer_kinds`, and whether autograd records each layer: its input needs a
    gradient or it trains anything (its output then needs one)."""
    n = model.num_layers
    trained_from = n
    if training.method == "freeze" and training.freeze.last_layers:
        trained_from = n - training.freeze.last_layers
    every_layer = bool(ctx.lora_roles) or bool(ctx.trainable & _LAYER_PARTS)
    kinds, recorded = _laid(model, trained_from, every_layer, ctx.masked, embed_grad)
    return list(kinds), list(recorded)


@memo.cached(maxsize=4096)
def _laid(
    model: ModelSpec, trained_from: int, every_layer: bool, masked: bool, embed_grad: bool
) -> tuple[tuple[tuple[str, bool], ...], tuple[bool, ...]]:
    """:func:`_layers` of the layers from ``trained_from`` on training (every layer, where
    ``every_layer``), a window ``masked`` and the embedding's output needing a gradient
    where ``embed_grad`` says."""
    out: list[tuple[str, bool]] = []
    recorded: list[bool] = []
    grad = embed_grad
    for i in range(model.num_layers):
        kind = "moe" if model.is_moe and i >= model.first_dense_layers else "dense"
        if masked and full_attention(model, i):
            kind += FULL
        trained = i >= trained_from
        out.append((kind + TRAINED if trained else kind, grad))
        grad = grad or every_layer or trained
        recorded.append(grad)
    return tuple(out), tuple(recorded)


def step_layers(
    model: ModelSpec, training: TrainingSpec, ctx: Ctx, first_stage: bool
) -> tuple[list[tuple[str, bool]], list[bool]]:
    """Each layer's block kind and whether its input needs a gradient
    (:func:`layer_kinds`), and whether checkpointing makes it keep only its input
    (:func:`checkpointed`) -- where autograd records it. Non-reentrant checkpointing
    (``torch.utils.checkpoint`` with ``use_reentrant=False``) keeps a layer's inputs for
    the recomputation only through the ops the layer records for backward: a layer whose
    input needs no gradient and none of whose weights train records none, so nothing of
    it is kept, not even its input, and nothing of it runs again in backward. Such a
    layer is played as it is without checkpointing."""
    kinds, ckpt, _ = layers_and_head_grad(model, training, ctx, first_stage)
    return kinds, ckpt


def layers_and_head_grad(
    model: ModelSpec, training: TrainingSpec, ctx: Ctx, first_stage: bool
) -> tuple[list[tuple[str, bool]], list[bool], bool]:
    """:func:`step_layers`, and whether the LM head's input, the stage's last layer's
    output, needs a gradient: the last layer is recorded, or, on a stage without layers,
    the stage's input needs one. Where it needs none (only the head trained, its input
    from frozen layers) the head's matmul saves its input alone, not its weight
    (autocast's copy of it goes with the cache at the end of the forward), and its
    backward computes no input gradient."""
    ckpt = checkpointed(training, model.num_layers)
    embed_grad = embedding_output_grad(model, training, first_stage, any(ckpt))
    kinds, recorded = _layers(model, training, ctx, embed_grad)
    head_grad = recorded[-1] if recorded else embed_grad
    return kinds, [on and r for on, r in zip(ckpt, recorded, strict=True)], head_grad


def recomputed_layers(model: ModelSpec, training: TrainingSpec) -> list[bool]:
    """Which layers run their forward again in backward: those :func:`step_layers` plays
    as checkpointed. Where every layer trains, autograd records every one, and that is
    :func:`checkpointed` itself."""
    if training.method == "full":
        return checkpointed(training, model.num_layers)
    return step_layers(model, training, make_ctx(model, training), True)[1]


def embedding_output_grad(
    model: ModelSpec, training: TrainingSpec, first_stage: bool, checkpointing: bool
) -> bool:
    """Whether the embedding's output needs a gradient: its weight trains (full training,
    ``freeze`` of the embeddings, or of a head tied to them, or of the norms of an
    embedding with a LayerNorm); with checkpointing, transformers' models make it require
    grad (``activation_checkpointing_enable`` calls ``enable_input_require_grads``, LoRA
    included) -- LitGPT's own model has no such hook, and its checkpointing leaves the
    output of a frozen embedding as it is; a later pipeline stage receives activations
    that require grad."""
    if not first_stage or training.method == "full":
        return True
    if checkpointing and conventions(training).implementation == "transformers":
        return True
    if "embeddings" in saved_components(training):
        return True  # PEFT's trained copy of the embedding (modules_to_save)
    if training.method != "freeze":
        return False
    parts = training.freeze.trainable
    return (
        "embeddings" in parts
        or (model.tie_word_embeddings and "lm_head" in parts)
        or (model.embedding_norm and "norms" in parts)
    )


def checkpointed(training: TrainingSpec, layers: int) -> list[bool]:
    """Which layers keep only their input (and, per-op, what the policy saves): full and
    per-op, every layer; every-k-layers, layers 0, k, 2k, ... (Chen et al. 2016's sqrt(n)
    schedule with k ~ sqrt(n)); first-k-layers, the first k of the stage (Megatron's
    block method); selective, none (the attention core is recomputed inside the layer
    instead)."""
    return list(
        _checkpointed(conventions(training).checkpointing, training.checkpoint_every_k, layers)
    )


@memo.cached(maxsize=1024)
def _checkpointed(mode: str, k: int, layers: int) -> tuple[bool, ...]:
    whole = mode in ("full", "per-op")
    return tuple(
        whole or (mode == "every-k-layers" and i % k == 0) or (mode == "first-k-layers" and i < k)
        for i in range(layers)
    )


def carries_previous(training: TrainingSpec, stage: Stage) -> bool:
    """Whether the previous step lives on into this one's forward (the loop's variables
    are rebound only as the next step makes them; a pipelined stage is not modelled)."""
    return conventions(training).previous_held and stage.first and stage.last


def plays_logits_point(training: TrainingSpec, stage: Stage, chunked: bool) -> bool:
    """Whether the step has a point at the end of the LM head, before the loss: where the
    previous step's model output is alive until this step's forward returns."""
    return carries_previous(training, stage) and conventions(training).outputs_held and not chunked


@dataclass(frozen=True, slots=True)
class Gather:
    """Bytes that ZeRO-3 / FSDP keep gathered beyond the shards (see
    :func:`memfit.engine.sharding.gather_buffers`): parameters live throughout the forward and
    the backward; in the backward a layer's unsharded gradients (``grads``) and, from the
    first reduce-scatter on, its flat input (``reduce``); and ``unit`` -- under FSDP's
    SHARD_GRAD_OP -- per layer, from the layer's forward to its backward."""

    forward: int = 0
    backward: int = 0
    grads: int = 0
    reduce: int = 0
    unit: int = 0

    @property
    def active(self) -> bool:
        return bool(self.forward or self.backward or self.unit)


@dataclass(frozen=True, slots=True)
class Stage:
    """A pipeline stage: does it hold the embedding, the LM head and loss, and how many
    micro-batches' activations does it keep at once (see :func:`memfit.engine.estimate.inflight`).
    Under the interleaved schedule the model a stage is played with is one virtual stage
    (a chunk of layers) and ``inflight`` counts chunks."""

    first: bool = True
    last: bool = True
    inflight: int = 1


def optimizer_temporaries(model: ModelSpec, training: TrainingSpec, state: ModelState) -> int:
    """Transient bytes of ``optimizer.step()``.

    ``torch.optim.AdamW(foreach=True)`` computes ``torch._foreach_sqrt(exp_avg_sqs)`` for
    all parameters of a dtype group at once: one full-size temporary in the state dtype
    (``torch/optim/adamw.py``, ``_multi_tensor_adamw``). ``fused=True`` runs one kernel per
    group with no temporaries. The single-tensor (for-loop) path needs the largest one
    parameter's worth. SGD without momentum updates in place; Adafactor and Lion make
    per-parameter temporaries; bitsandbytes' 8-bit kernels update in place. Its paged
    variant keeps the states in unified memory, evicted to the host under pressure, and
    prefetches each parameter's states to the GPU before updating it: the largest
    parameter's states are on the GPU at the step (``Optimizer8bit.prefetch_state``).
    """
    if training.optimizer == "paged-adamw-8bit" and training.offload.optimizer == "none":
        # the paged states of the parameter being updated, prefetched to the GPU
        largest = max((g.numel for g in model_tensors(model) if g.numel), default=0)
        if training.method in ("lora", "qlora"):
            largest = min(largest, state.trainable_params)
        return optimizer_state(training.optimizer, (largest,), 4)[0] if largest else 0
    if training.optimizer in ("sgd", "adamw-8bit", "paged-adamw-8bit"):
        return 0
    if training.optimizer_impl == "fused":
        return 0
    p_bytes = precision_of(training).master
    if training.optimizer == "adamw" and training.optimizer_impl == "foreach":
        copies = sum(g.total for g in saved_copies(model, training))
        whole = copies and sum(g.total for g in split_tensors(model, training).trainable)
        if copies and whole:
            # PEFT's modules_to_save copies are a dtype group of their own (the frozen
            # weights'), whose temporaries follow that dtype; the groups' temporaries are
            # alive together (each group's list lives until the next one replaces it)
            f_bytes = DTYPE_BYTES[conventions(training).frozen_dtype]
            mix = (whole - copies) * p_bytes + copies * f_bytes
            return state.trainable_params * mix // whole
        return state.trainable_params * p_bytes
    largest = max((g.numel for g in model_tensors(model)), default=0)
    if training.method in ("lora", "qlora"):
        largest = min(largest, state.trainable_params)
    return largest * p_bytes
