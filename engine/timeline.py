"""One training step as a timeline of allocations; the peak is its highest point.

The step is what a PyTorch training loop does (``out = model(ids, labels=ids)``,
``out.loss.backward()``, ``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``):

1. **before** -- weights (and NF4 base weights), optimizer states from earlier steps;
   gradients are ``None``;
2. **forward** -- the embedding, then every layer in order: each keeps what autograd saved
   (and under autocast the 16-bit weight copies) and passes on its output; inside a layer
   the transient tensors push the level higher for a moment (:mod:`engine.graph` plays each
   layer op by op, :mod:`engine.layers` writes the ops); then the LM head and the loss;
3. **backward** -- in reverse: each layer (recomputed first under checkpointing) frees
   what it saved and leaves its parameter gradients (``.grad``) behind;
4. **optimizer** -- all gradients and states live, plus the optimizer's temporaries
   (``foreach`` AdamW allocates ``sqrt(exp_avg_sq)`` for every parameter at once; ``fused``
   allocates nothing); then the gradients are freed.

Each point of the timeline is a breakdown by category, so the bar at the peak shows what
is live at that moment, not a sum of separate maxima.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from engine.graph import Block, BlockResult, Profile, profile, simulate
from engine.layers import Ctx, bert_layer, decoder_layer, head_and_loss
from engine.model_state import ModelState, lora_targets
from engine.params import model_tensors
from engine.specs import ModelSpec, TrainingSpec

CATS = ("parameters", "gradients", "optimizer_states", "activations", "overhead")


@dataclass(frozen=True, slots=True)
class Point:
    """The live bytes by category at one moment of the step."""

    phase: str  # before | forward | backward | optimizer
    layer: int | None
    label: str
    parameters: int
    gradients: int
    optimizer_states: int
    activations: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states + self.activations


@dataclass(frozen=True, slots=True)
class Timeline:
    points: tuple[Point, ...]
    #: the highest point of the step
    peak: Point
    #: named parts of the breakdown at the peak beyond the model state
    autocast_copies: int
    logits: int
    optimizer_temp: int
    #: the model-state parameters, the optimizer's temporaries, and what each further
    #: micro-batch in flight (a pipeline stage's earlier ones) adds to every forward and
    #: backward point: what one micro-batch keeps at the end of its forward
    params: int = 0
    temp: int = 0
    per_microbatch: int = 0

    def in_flight(self, extra: int) -> Timeline:
        """The same step with ``extra`` more micro-batches in flight: a pipeline stage's
        timeline for every schedule position from one play of it."""
        if extra == 0:
            return self
        add = extra * self.per_microbatch
        points = tuple(
            dataclasses.replace(p, activations=p.activations + add)
            if p.phase in ("forward", "backward")
            else p
            for p in self.points
        )
        peak = max(points, key=lambda p: p.total)
        return Timeline(
            points,
            peak,
            peak.parameters - self.params,
            self.logits,
            self.temp if peak.phase == "optimizer" else 0,
            self.params,
            self.temp,
            self.per_microbatch,
        )


def _mode(training: TrainingSpec) -> str:
    """fp32, pure 16-bit ("half") or autocast over fp32 weights ("amp"). DeepSpeed and
    Megatron-LM run mixed precision on 16-bit module weights (the fp32 master copy lives in
    the optimizer), and FSDP FULL_SHARD / FSDP2 on 16-bit gathered units (the fp32 shards
    are the master copy), so their steps compute like pure 16-bit ones."""
    precision = training.precision
    par = training.parallelism
    full_shard = par.zero_stage == 3 and training.method in ("full", "freeze")
    if precision.endswith("-mixed") and (par.framework != "pytorch" or full_shard):
        # FSDP's MixedPrecision(param_dtype=bf16) gathers each unit in 16 bits and runs
        # the forward on it: no autocast cache, a 16-bit residual stream (adapters of a
        # 16-bit base keep PEFT's fp32 copies and autocast)
        return "half"
    return {"fp32": "fp32", "bf16": "half"}.get(precision, "amp")


def make_ctx(model: ModelSpec, training: TrainingSpec) -> Ctx:
    method = training.method
    if method == "full":
        trainable = frozenset({"all"})
    elif method == "freeze":
        parts = {"mlp": ("mlp", "experts"), "lm_head": ("lm_head", "pooler")}
        trainable = frozenset(c for p in training.freeze.trainable for c in parts.get(p, (p,)))
    else:
        trainable = frozenset()
    roles: frozenset[str] = frozenset()
    if method in ("lora", "qlora"):
        roles = lora_targets(model, training.lora.targets)[0]
    precision = training.precision
    frozen = 4 if precision == "fp32" else 2
    par = training.parallelism
    sp = par.tp if par.sequence_parallel and model.architecture == "decoder" else 1
    return Ctx(
        batch=training.micro_batch_size,
        seq=training.sequence_length // par.cp,
        mode=_mode(training),
        attention=training.attention,
        lora_rank=training.lora.rank,
        lora_roles=roles,
        trainable=trainable,
        frozen_bytes=frozen,
        quantized=method == "qlora",
        dropout=training.lora.dropout,
        attention_dropout=model.attention_dropout,
        selective=training.activation_checkpointing == "selective",
        masked=0 < model.sliding_window < training.sequence_length,
        sp=sp,
        cp=par.cp,
        ep=model.expert_shards,
        capacity=par.expert_capacity_factor if model.expert_shards > 1 else 1.0,
        topk=model.num_experts_per_tok,
    )


def _build(model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool, chunked: bool) -> tuple[Block, str]:
    if kind == "head":
        return head_and_loss(model, ctx, True, chunked)
    if model.architecture == "encoder":
        return bert_layer(model, ctx, x_grad)
    return decoder_layer(model, ctx, x_grad, kind == "moe")


#: (batch, sequence length / sp) at which every new profile is checked against the block
#: simulated directly: odd sizes, so that a size that is not the linear form the profile
#: holds cannot agree by accident
HELD_OUT = (3, 37)


@lru_cache(maxsize=16384)
def _profile(
    model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool, chunked: bool
) -> tuple[Profile | None, int]:
    """A block for every batch and sequence length: built once with symbolic sizes
    (:func:`engine.graph.profile`), checked against a direct simulation at
    :data:`HELD_OUT`, and the bytes of the autocast weight copies it makes. ``None`` when
    the block's sizes are not linear forms of the shape terms: every shape of it is then
    simulated directly (:func:`_direct`)."""
    b, s = HELD_OUT
    held_out = dataclasses.replace(ctx, batch=b, seq=s * ctx.sp)
    try:
        block, out = _build(model, dataclasses.replace(ctx, symbolic=True), kind, x_grad, chunked)
        prof = profile(block, out, x_grad or kind == "head")
        if prof.at(held_out.terms()) == _direct(model, held_out, kind, x_grad, chunked):
            return prof, block.weight_copies
    except (TypeError, ValueError):  # a size that no linear form of the terms holds
        pass
    return None, _build(model, held_out, kind, x_grad, chunked)[0].weight_copies


@lru_cache(maxsize=4096)
def _direct(model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool, chunked: bool) -> BlockResult:
    """The block built at ``ctx``'s own batch and sequence length, and simulated."""
    return simulate(*_build(model, ctx, kind, x_grad, chunked), x_grad or kind == "head")


def block_result(
    model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool, chunked: bool, key: Ctx | None = None
) -> tuple[BlockResult, int]:
    """One block of the step at ``ctx``'s shape, from its profile where the profile holds,
    else simulated directly; and the bytes of its autocast weight copies. ``key`` is
    ``ctx`` without its shape (the profile's cache key), when the caller has it."""
    key = key or dataclasses.replace(ctx, batch=1, seq=1)
    prof, copies = _profile(model, key, kind, x_grad, chunked)
    if prof is not None:
        try:
            return prof.at(ctx.terms()), copies
        except ValueError:  # not a whole number of bytes here: outside the exact domain
            pass
    return _direct(model, ctx, kind, x_grad, chunked), copies


def _blocks(
    model: ModelSpec, ctx: Ctx, chunked: bool, embed_grad: bool
) -> tuple[
    tuple[BlockResult, int],
    tuple[BlockResult, int] | None,
    tuple[BlockResult, int],
    tuple[BlockResult, int],
]:
    key = dataclasses.replace(ctx, batch=1, seq=1)

    def at(kind: str, x_grad: bool) -> tuple[BlockResult, int]:
        return block_result(model, ctx, kind, x_grad, chunked, key)

    first_kind = "moe" if model.is_moe and model.first_dense_layers == 0 else "dense"
    return (
        at("dense", True),
        at("moe", True) if model.is_moe else None,
        at(first_kind, embed_grad),
        at("head", True),
    )


def checkpointed(training: TrainingSpec, layers: int) -> list[bool]:
    """Which layers keep only their input: full, every layer; every-k-layers, layers 0, k,
    2k, ... (Chen et al. 2016's sqrt(n) schedule with k ~ sqrt(n)); selective, none (the
    attention core is recomputed inside the layer instead)."""
    mode, k = training.activation_checkpointing, training.checkpoint_every_k
    return [mode == "full" or (mode == "every-k-layers" and i % k == 0) for i in range(layers)]


@dataclass(frozen=True, slots=True)
class Gather:
    """Bytes that ZeRO-3 / FSDP keep gathered beyond the shards (see
    :func:`engine.sharding.gather_buffers`): parameters live throughout the forward and
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
    micro-batches' activations does it keep at once (see :func:`engine.estimate.inflight`).
    Under the interleaved schedule the model a stage is played with is one virtual stage
    (a chunk of layers) and ``inflight`` counts chunks."""

    first: bool = True
    last: bool = True
    inflight: int = 1


def step_timeline(
    model: ModelSpec,
    training: TrainingSpec,
    state: ModelState,
    grad_share: Fraction = Fraction(1),
    optimizer_share: Fraction = Fraction(1),
    gather: Gather = Gather(),
    stage: Stage = Stage(),
    grad_buffer: int = 0,
) -> Timeline:
    """Play one step; see the module docstring for what happens when.

    With data-parallel sharding (:mod:`engine.sharding`) ``state`` is this rank's share,
    ``grad_share`` the share of each gradient kept as backward produces it (ZeRO-2/3
    reduce-scatter the rest away), ``optimizer_share`` the share of the optimizer's
    temporaries, and ``gather`` the all-gathered parameter units and communication
    buffers of ZeRO-3 / FSDP. ``grad_buffer`` is gradient memory that lives through the whole
    step (Megatron's fp32 ``main_grad``, DeepSpeed's fp32 partition and reduce bucket).
    With ``offload.activations = "cpu"`` the inputs of checkpointed layers wait in host
    memory, not on the GPU.
    """
    ctx = make_ctx(model, training)
    tokens, h = ctx.tokens, model.hidden_size
    # the hidden-size tensors between blocks: split over tp under sequence parallelism
    hidden = ctx.hidden_bytes(h)
    ckpt_input = 0 if training.offload.activations == "cpu" else hidden
    trains_embeddings = stage.first and (
        training.method == "full"
        or (training.method == "freeze" and "embeddings" in training.freeze.trainable)
    )
    ckpt = checkpointed(training, model.num_layers)
    checkpointing = any(ckpt)
    # with checkpointing, HF makes the embedding output require grad (LoRA included)
    # a later pipeline stage receives activations that require grad
    embed_grad = trains_embeddings or checkpointing or not stage.first
    (dense, dense_copies), moe_res, (first, first_copies), (head, head_copies) = _blocks(
        model, ctx, training.loss == "chunked", embed_grad
    )

    params = state.category_bytes("parameters")
    opt_states = state.category_bytes("optimizer_states")
    points: list[Point] = []

    g_num, g_den = grad_share.numerator, grad_share.denominator
    waiting = 0  # activations of the other in-flight micro-batches (set after forward)

    units_held = 0  # SHARD_GRAD_OP: layers gathered in forward, not yet through backward
    reducing = 0  # the reduce-scatter input, once the first layer's gradients are reduced

    def add(phase: str, layer: int | None, label: str, p: int, g: int, o: int, a: int) -> None:
        if phase in ("forward", "backward"):
            if g_den != 1 or g_num != 1:
                g = g * g_num // g_den
            if gather.active:
                # ZeRO-3/FSDP gathers each unit in the compute dtype and frees it after use:
                # the gathered units replace autocast's copies
                forward = phase == "forward"
                p = params + units_held + (gather.forward if forward else gather.backward)
                g += 0 if forward else gather.grads + reducing
            a += waiting
        if phase != "optimizer":
            g += grad_buffer
        points.append(Point(phase, layer, label, p, g, o, a))

    add("before", None, "weights and optimizer states", params, 0, opt_states, 0)

    # inputs: ids and labels (int64), the embedding output and RoPE's cos/sin
    batch_tensors = 2 * 8 * tokens
    embed_out = hidden
    rope = 2 * tokens * model.head_dim * ctx.res if model.position_embedding == "rotary" else 0
    mask = ctx.batch * ctx.seq * ctx.seq * ctx.res if ctx.attention == "eager" else 0
    # a sliding window shorter than the sequence needs a boolean (b, 1, s, s) mask, made
    # once per forward and kept by every layer's attention until backward
    bool_mask = ctx.batch * ctx.seq * ctx.seq if ctx.masked and not mask else 0
    base_act = batch_tensors + rope + bool_mask
    layers = []
    for i in range(model.num_layers):
        is_moe = model.is_moe and i >= model.first_dense_layers
        if i == 0:
            layers.append((first, first_copies))
        else:
            layers.append(moe_res if is_moe and moe_res else (dense, dense_copies))

    # forward: the level of a layer's peak is the fixed tensors, what earlier layers kept,
    # and the layer's own peak (its input, the previous output, included)
    fixed = base_act + mask
    kept_act = 0
    if stage.first:
        # the embedding's own saved tensors: BERT's LayerNorm input and statistics, and the
        # dropout mask (1 byte per element) of GPT-2 and BERT
        kept_act = (hidden + 8 * tokens) * model.embedding_norm
        kept_act += tokens * h // ctx.sp if model.hidden_dropout > 0 else 0
    copies = 0
    if stage.first:
        add("forward", None, "embedding", params, 0, opt_states, fixed + embed_out)
    for i, (res, c) in enumerate(layers):
        add(
            "forward",
            i,
            "layer",
            params + copies + c,
            0,
            opt_states,
            fixed + kept_act + res.forward_peak - c,
        )
        # checkpointing keeps only the layer's input; autocast's cache keeps the copies
        kept_act += ckpt_input if ckpt[i] else res.kept - c
        copies += c
        units_held += gather.unit
    if not stage.last:  # the output goes to the next stage; its gradient comes back
        head = BlockResult(0, embed_out, 0, 2 * embed_out, embed_out, 0, 0)
        head_copies = 0
    add(
        "forward",
        None,
        "LM head and loss" if stage.last else "send to the next stage",
        params + copies + head_copies,
        0,
        opt_states,
        fixed + kept_act + head.forward_peak - head_copies,
    )
    copies += head_copies
    held = head.held
    # 1F1B: while this micro-batch runs, the stage still keeps what the earlier in-flight
    # micro-batches saved, plus a receive buffer for the next input from the previous stage
    recv = 0 if stage.first else embed_out
    per_microbatch = kept_act + held
    waiting = (stage.inflight - 1) * per_microbatch + recv
    if waiting:
        points[:] = [
            dataclasses.replace(p, activations=p.activations + waiting)
            if p.phase == "forward"
            else p
            for p in points
        ]
    # the cache is cleared when autocast exits, at the end of forward: the copies of
    # checkpointed layers go (they are made again in the recomputation)
    copies -= sum(c for (_, c), on in zip(layers, ckpt, strict=True) if on)

    # backward
    grads = 0
    fixed = base_act + held  # the eager mask died with the forward; the logits did not
    add(
        "backward",
        None,
        "loss and LM head" if stage.last else "gradient from the next stage",
        params + copies,
        grads,
        opt_states,
        fixed + kept_act + head.backward_peak - head_copies,
    )
    grads += head.param_grads
    copies -= head_copies
    grad_in = head.input_grad
    for i in range(model.num_layers - 1, -1, -1):
        res, c = layers[i]
        if ckpt[i]:
            kept_act -= ckpt_input
            add(
                "backward",
                i,
                "recompute",
                params + copies + c,
                grads,
                opt_states,
                fixed + kept_act + grad_in + res.forward_peak - c,
            )
            add(
                "backward",
                i,
                "layer",
                params + copies + c,
                grads,
                opt_states,
                fixed + kept_act + res.backward_peak - c,
            )
        else:
            kept_act -= res.kept - c
            add(
                "backward",
                i,
                "layer",
                params + copies,
                grads,
                opt_states,
                fixed + kept_act + res.backward_peak - c,
            )
            copies -= c
        grads += res.param_grads
        grad_in = res.input_grad
        units_held -= gather.unit
        reducing = gather.reduce
    if trains_embeddings:
        dense_grad = model.vocab_size * h * (2 if training.precision == "bf16" else 4)
        tied = dense_grad if model.tie_word_embeddings else 0  # summed into the head's grad
        add(
            "backward",
            None,
            "embedding",
            params,
            grads + dense_grad - tied,
            opt_states,
            fixed + grad_in + tied,
        )
    # the step's gradients are what model_state counts; backward may differ by rounding
    grads = state.category_bytes("gradients")

    # optimizer
    temp = int(optimizer_temporaries(model, training, state) * optimizer_share)
    add("optimizer", None, "optimizer step", params, grads, opt_states + temp, 0)
    add("optimizer", None, "after zero_grad", params, grad_buffer, opt_states, 0)
    peak = max(points, key=lambda p: p.total)
    return Timeline(
        tuple(points),
        peak,
        peak.parameters - params,
        held,
        temp if peak.phase == "optimizer" else 0,
        params,
        temp,
        per_microbatch,
    )


def optimizer_temporaries(model: ModelSpec, training: TrainingSpec, state: ModelState) -> int:
    """Transient bytes of ``optimizer.step()``.

    ``torch.optim.AdamW(foreach=True)`` computes ``torch._foreach_sqrt(exp_avg_sqs)`` for
    all parameters of a dtype group at once: one full-size temporary in the state dtype
    (``torch/optim/adamw.py``, ``_multi_tensor_adamw``). ``fused=True`` runs one kernel per
    group with no temporaries. The single-tensor (for-loop) path needs the largest one
    parameter's worth. SGD without momentum updates in place; Adafactor and Lion make
    per-parameter temporaries; bitsandbytes' 8-bit kernels update in place.
    """
    if training.optimizer in ("sgd", "adamw-8bit", "paged-adamw-8bit"):
        return 0
    if training.optimizer_impl == "fused":
        return 0
    p_bytes = 2 if training.precision == "bf16" else 4
    if training.optimizer == "adamw" and training.optimizer_impl == "foreach":
        return state.trainable_params * p_bytes
    largest = max((g.numel for g in model_tensors(model)), default=0)
    if training.method in ("lora", "qlora"):
        largest = min(largest, state.trainable_params)
    return largest * p_bytes
