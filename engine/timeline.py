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

**Runs of layers.** A step of ``L`` layers has about ``2 L`` points, but its layers come
in runs of identical ones: every layer alike, or a group of ``k`` repeated under
every-k-layers checkpointing. Along a run each point's bytes are affine in the
repetition -- what the earlier layers kept, the autocast copies, the gathered units and
the gradients grow by the same amount each time -- so a run's highest point is at its
first or its last repetition. :class:`StepPlan` keeps the first repetition of every run
point by point (where it meets the run before it) and, of the later ones, both ends. The
one quantity that is not affine is a rank's share of the gradients under ZeRO-2/3,
``floor(g x share)``: where the share does not divide what a repetition adds, a run is
still monotone as long as the rest of the point moves by a byte or more per repetition
against it; where it does not, the step is played point by point. The peak is the same --
to the byte, and the same moment: the first of equal highest points -- as playing every
point (:func:`_layer_by_layer`), which :attr:`Timeline.points` does, once, when the whole
timeline is asked for (charts, ``--json``).

**One plan for every shape.** Each kept point is a linear form in a few shape quantities:
the shape terms of the block profiles (b s, b s^2, ... -- :data:`~engine.graph.TERMS`)
and the hidden-size tensors between blocks; a block's peak is the largest of its
profile's forms, so a point that holds it is kept once per form. A :class:`StepPlan`
holds these forms, built once per model, strategy (everything but the micro-batch size,
sequence length and gradient accumulation) and rank share; :meth:`StepPlan.play`
evaluates them at one shape (one matrix product) and :class:`Joint` at many shapes and
for every pipeline stage at once (:mod:`engine.batch`). Building a plan costs more than
playing a step point by point, so a step met once or twice is played point by point;
from the third time on, its plan plays it.

>>> from engine.model_state import model_state
>>> from engine.presets import load_model
>>> from engine.specs import TrainingSpec
>>> model, training = load_model("gpt2"), TrainingSpec(micro_batch_size=2)
>>> timeline = step_timeline(model, training, model_state(model, training))
>>> timeline.peak == max(timeline.points, key=lambda p: p.total)
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from operator import attrgetter, mul
from typing import Any

import numpy as np

from engine import memo
from engine.graph import TERMS, Block, BlockResult, Profile, Size, _coefs, _int, profile, simulate
from engine.layers import CHUNK_ROWS, Ctx, bert_layer, decoder_layer, head_and_loss
from engine.model_state import (
    DTYPE_BYTES,
    FREEZE_COMPONENTS,
    ModelState,
    lora_targets,
    qkv_adapted,
)
from engine.params import model_tensors
from engine.specs import ModelSpec, TrainingSpec, window_masks
from engine.stacks import conventions

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


def _total(point: Point) -> int:
    return point.total


def _raised(point: Point, extra: int) -> Point:
    """``point`` with ``extra`` more activations."""
    return Point(
        point.phase,
        point.layer,
        point.label,
        point.parameters,
        point.gradients,
        point.optimizer_states,
        point.activations + extra,
    )


def _shifted(timeline: Timeline, extra: int) -> tuple[Point, ...]:
    """The points of ``timeline``, every forward and backward one ``extra`` higher."""
    return tuple(
        _raised(p, extra) if p.phase in ("forward", "backward") else p for p in timeline.points
    )


@dataclass(frozen=True, slots=True, eq=False)
class Timeline:
    """A played step: its peak, the parts of the breakdown named at the peak, and every
    point of the step, played when first asked for (:attr:`points`)."""

    #: the highest point of the step
    peak: Point
    #: named parts of the breakdown at the peak beyond the model state
    autocast_copies: int
    logits: int
    optimizer_temp: int
    #: the model-state parameters, the optimizer's temporaries, and what each further
    #: micro-batch in flight (a pipeline stage's earlier ones) adds to every forward and
    #: backward point: what one micro-batch keeps at the end of its forward
    params: int
    temp: int
    per_microbatch: int
    #: the candidates for the peak however many micro-batches are in flight: the point
    #: before the step, the highest of forward and backward, the optimizer step and the
    #: point after ``zero_grad``
    moments: tuple[Point, Point, Point, Point]
    #: plays every point of the step (:func:`_layer_by_layer`)
    replay: Callable[[], tuple[Point, ...]] = field(repr=False)
    _played: list[tuple[Point, ...]] = field(default_factory=list, repr=False)
    #: tells every point's activations apart by source (:func:`step_sources`)
    explain: Callable[[], tuple[tuple[Source, ...], ...]] | None = field(default=None, repr=False)
    _explained: list[tuple[tuple[Source, ...], ...]] = field(default_factory=list, repr=False)

    def sources(self) -> tuple[tuple[Source, ...], ...]:
        """Each point's activations by source, in the order of :attr:`points`: played on
        the first call, then kept."""
        if self.explain is None:
            raise ValueError("this timeline was played without its sources")
        if not self._explained:
            self._explained.append(self.explain())
        return self._explained[0]

    @property
    def peak_index(self) -> int:
        """Where the peak is among :attr:`points`: the first of equal highest points."""
        return self.points.index(self.peak)

    def peak_sources(self) -> tuple[Source, ...]:
        """The activations at the peak by source: they add up to ``peak.activations``."""
        return self.sources()[self.peak_index]

    @property
    def points(self) -> tuple[Point, ...]:
        """Every moment of the step, in order: played on the first call, then kept."""
        if not self._played:
            self._played.append(self.replay())
        return self._played[0]

    def _key(self) -> tuple[object, ...]:
        return (
            self.peak,
            self.autocast_copies,
            self.logits,
            self.optimizer_temp,
            self.params,
            self.temp,
            self.per_microbatch,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Timeline):
            return NotImplemented
        return self._key() == other._key() and self.points == other.points

    def __hash__(self) -> int:
        return hash(self._key())

    def in_flight(self, extra: int) -> Timeline:
        """The same step with ``extra`` more micro-batches in flight: a pipeline stage's
        timeline for every schedule position from one play of it."""
        if extra == 0:
            return self
        add = extra * self.per_microbatch
        before, top, step, after = self.moments
        moments = (before, _raised(top, add), step, after)
        peak = max(moments, key=_total)
        return Timeline(
            peak,
            peak.parameters - self.params,
            self.logits,
            self.temp if peak.phase == "optimizer" else 0,
            self.params,
            self.temp,
            self.per_microbatch,
            moments,
            partial(_shifted, self, add),
            explain=partial(_shifted_sources, self, add),
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
        trainable = frozenset(c for p in training.freeze.trainable for c in FREEZE_COMPONENTS[p])
    else:
        trainable = frozenset()
    roles: frozenset[str] = frozenset()
    if method in ("lora", "qlora"):
        roles = lora_targets(model, training.lora.targets)[0]
    conv = conventions(training)
    mode = _mode(training)
    frozen = DTYPE_BYTES[conv.frozen_dtype]
    # DeepSpeed's and Megatron's 16-bit modules compute their adapters in 16 bits too
    framework_half = mode == "half" and training.precision.endswith("-mixed")
    adapter = 2 if framework_half else DTYPE_BYTES[conv.adapter_dtype]
    par = training.parallelism
    sp = par.tp if par.sequence_parallel and model.architecture == "decoder" else 1
    return Ctx(
        batch=training.micro_batch_size,
        seq=training.sequence_length // par.cp,
        mode=mode,
        attention=training.attention,
        lora_rank=training.lora.rank,
        lora_roles=roles,
        trainable=trainable,
        frozen_bytes=frozen,
        quantized=method == "qlora",
        litgpt=conv.implementation == "litgpt",
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
        embedding_bytes=4 if "all" in trainable or "embeddings" in trainable else frozen,
        outputs_held=conv.outputs_held,
        kv_cache=conv.kv_cache,
        adapter_bytes=adapter,
        loss=training.loss,
        loss_chunks=training.loss_chunks,
        # a tied head is the embedding, which stays unquantized
        quantized_head=conv.quantize_head and not model.tie_word_embeddings,
        dequant_other=0
        if conv.dequant_dtype == training.qlora.compute_dtype
        else DTYPE_BYTES[conv.dequant_dtype],
    )


def _build(model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool, chunked: bool) -> tuple[Block, str]:
    if kind == "head":
        return head_and_loss(model, ctx, True, chunked)
    if kind == HEAD_LOGITS:
        return head_and_loss(model, ctx, True, chunked, logits_only=True)
    if kind.endswith(TRAINED):  # one of the last layers ``freeze`` trains whole
        ctx = dataclasses.replace(ctx, trainable=ctx.trainable | {"all"})
        kind = kind.removesuffix(TRAINED)
    if model.architecture == "encoder":
        return bert_layer(model, ctx, x_grad)
    return decoder_layer(model, ctx, x_grad, kind == "moe")


#: the suffix of a layer kind that trains every weight of the layer (``freeze``'s last
#: layers)
TRAINED = "+trained"
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
    n = model.num_layers
    trained_from = n
    if training.method == "freeze" and training.freeze.last_layers:
        trained_from = n - training.freeze.last_layers
    every_layer = bool(ctx.lora_roles) or bool(ctx.trainable & _LAYER_PARTS)
    out: list[tuple[str, bool]] = []
    grad = embed_grad
    for i in range(n):
        kind = "moe" if model.is_moe and i >= model.first_dense_layers else "dense"
        trained = i >= trained_from
        out.append((kind + TRAINED if trained else kind, grad))
        grad = grad or every_layer or trained
    return out


#: (batch, sequence length / sp) at which every new profile is checked against the block
#: simulated directly: odd sizes, so that a size that is not the linear form the profile
#: holds cannot agree by accident
HELD_OUT = (3, 37)


@memo.cached(maxsize=16384)
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


@memo.cached(maxsize=4096)
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


def embedding_output_grad(
    model: ModelSpec, training: TrainingSpec, first_stage: bool, checkpointing: bool
) -> bool:
    """Whether the embedding's output needs a gradient: its weight trains (full training,
    ``freeze`` of the embeddings, or of a head tied to them, or of the norms of an
    embedding with a LayerNorm); with checkpointing, HF makes it require grad (LoRA
    included); a later pipeline stage receives activations that require grad."""
    if not first_stage or checkpointing or training.method == "full":
        return True
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
    mode, k = conventions(training).checkpointing, training.checkpoint_every_k
    whole = mode in ("full", "per-op")
    return [
        whole or (mode == "every-k-layers" and i % k == 0) or (mode == "first-k-layers" and i < k)
        for i in range(layers)
    ]


#: the op names of :mod:`engine.layers` that are ``aten.mm`` in PyTorch, and those of the
#: attention kernels, for torchtitan's per-op policy
_MM_OPS = ("mm", "lora_A", "lora_B")


def per_op_saved(block: Block) -> Size:
    """Bytes torchtitan's per-op selective checkpointing keeps of a layer beyond its input
    (``selective_ac_option = "op"``): the outputs of the attention kernel and of every
    odd-numbered ``mm`` of the layer (the 1st, 3rd, ...); everything else is recomputed
    in backward, where the kept outputs are used as they are."""
    total: Size = 0
    count = 0
    for op in block.ops:
        if op.name in _MM_OPS:
            count += 1
            if count % 2:
                total = total + sum((size for _, size in op.outputs), start=0)
        elif op.name.startswith("sdpa_"):
            total = total + sum((size for _, size in op.outputs), start=0)
    return total


@memo.cached(maxsize=4096)
def _per_op(model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool) -> Size:
    """:func:`per_op_saved` of a layer kind, at ``ctx``'s shape or symbolic."""
    return per_op_saved(_build(model, ctx, kind, x_grad, False)[0])


def function_kept(block: Block) -> Size:
    """Bytes of the tensors custom autograd functions of ``block`` keep on their ``ctx``
    (:attr:`~engine.graph.Block.kept_by_functions`): they live as long as the graph."""
    return sum((block.sizes[t] for t in sorted(block.kept_by_functions)), start=0)


@memo.cached(maxsize=4096)
def _function_kept(model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool, chunked: bool) -> Size:
    """:func:`function_kept` of a block kind, at ``ctx``'s shape or symbolic. Of the LM
    head only a 4-bit head keeps anything: its input, the final norm's output, whatever
    the loss (a head run in pieces views it; that head is built at concrete shapes only,
    so it is read from the unchunked one)."""
    if kind == HEAD_LOGITS:  # the head's own block counts it
        return 0
    if kind == "head":
        if not (ctx.quantized and ctx.quantized_head):
            return 0
        ctx = dataclasses.replace(ctx, loss="standard")
    return function_kept(_build(model, ctx, kind, x_grad, chunked)[0])


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
    plan: StepPlan | None = None,
) -> Timeline:
    """Play one step; see the module docstring for what happens when.

    With data-parallel sharding (:mod:`engine.sharding`) ``state`` is this rank's share,
    ``grad_share`` the share of each gradient kept as backward produces it (ZeRO-2/3
    reduce-scatter the rest away), ``optimizer_share`` the share of the optimizer's
    temporaries, and ``gather`` the all-gathered parameter units and communication
    buffers of ZeRO-3 / FSDP. ``grad_buffer`` is gradient memory that lives through the whole
    step (Megatron's fp32 ``main_grad``, DeepSpeed's fp32 partition and reduce bucket).
    With ``offload.activations = "cpu"`` the inputs of checkpointed layers wait in host
    memory, not on the GPU. ``plan`` is :func:`step_plan` of the same arguments, when the
    caller has it. A step is played point by point the first two times its plan's key is
    met (that costs less than compiling a plan); the third time, its plan is built and
    compiled, and plays it from then on.
    """
    args = (model, training, state, grad_share, optimizer_share, gather, stage, grad_buffer)
    replay = partial(_points, *args)
    if plan is None:
        key = _plan_key(*args)
        plan = _PLANS.get(key)
        if plan is None:
            if _PLAYS.tally(key) <= _PLAYED_FIRST:  # cheaper than compiling a plan
                return played_step(*args)
            plan = _PLANS.keep(key, StepPlan.build(*args))
    seq = training.sequence_length // training.parallelism.cp
    return plan.play(training.micro_batch_size, seq, replay, partial(step_sources, *args))


#: the fields of a training spec that make its shape; everything else is its strategy
SHAPE_FIELDS = ("micro_batch_size", "sequence_length", "gradient_accumulation_steps")
_strategy_of = attrgetter(
    *(f.name for f in dataclasses.fields(TrainingSpec) if f.name not in SHAPE_FIELDS)
)


def strategy_key(training: TrainingSpec) -> tuple[object, ...]:
    """``training`` without its shape (:data:`SHAPE_FIELDS`), as a hashable key."""
    key: tuple[object, ...] = _strategy_of(training)
    return key


_PLANS_KEPT = 2048
_PLANS: memo.Table[tuple[object, ...], StepPlan] = memo.Table(f"{__name__}._PLANS", _PLANS_KEPT)
#: how often each plan key was played point by point
_PLAYS: memo.Table[tuple[object, ...], int] = memo.Table(f"{__name__}._PLAYS", 4 * _PLANS_KEPT)


def _plan_key(
    model: ModelSpec,
    training: TrainingSpec,
    state: ModelState,
    grad_share: Fraction,
    optimizer_share: Fraction,
    gather: Gather,
    stage: Stage,
    grad_buffer: int,
) -> tuple[object, ...]:
    """What a step plan is built from: the model, the strategy, whether a sliding window
    masks the sequence (the one thing of the shape a plan reads), the rank's share."""
    masked = window_masks(model, training.sequence_length)
    key: tuple[object, ...] = (model, strategy_key(training), masked, state, grad_share)
    return (*key, optimizer_share, gather, stage, grad_buffer)


def step_plan(
    model: ModelSpec,
    training: TrainingSpec,
    state: ModelState,
    grad_share: Fraction = Fraction(1),
    optimizer_share: Fraction = Fraction(1),
    gather: Gather = Gather(),
    stage: Stage = Stage(),
    grad_buffer: int = 0,
) -> StepPlan:
    """The part of :func:`step_timeline` that holds for every shape, built once per model,
    strategy (:func:`strategy_key`) and rank share. The sequence length enters only
    through whether a sliding window masks it (:func:`engine.specs.window_masks`)."""
    args = (model, training, state, grad_share, optimizer_share, gather, stage, grad_buffer)
    key = _plan_key(*args)
    return _PLANS.get(key) or _PLANS.keep(key, StepPlan.build(*args))


#: how many times a step is played point by point before its plan is compiled
_PLAYED_FIRST = 2


def played_step(
    model: ModelSpec,
    training: TrainingSpec,
    state: ModelState,
    grad_share: Fraction = Fraction(1),
    optimizer_share: Fraction = Fraction(1),
    gather: Gather = Gather(),
    stage: Stage = Stage(),
    grad_buffer: int = 0,
) -> Timeline:
    """:func:`step_timeline` played point by point, without a plan."""
    args = (model, training, state, grad_share, optimizer_share, gather, stage, grad_buffer)
    return _from_points(
        *_layer_by_layer(*args), partial(_points, *args), partial(step_sources, *args)
    )


def _from_points(
    points: tuple[Point, ...],
    per_microbatch: int,
    held: int,
    params: int,
    temp: int,
    replay: Callable[[], tuple[Point, ...]],
    explain: Callable[[], tuple[tuple[Source, ...], ...]] | None = None,
) -> Timeline:
    """The step from its every point, played (:func:`_layer_by_layer`): before the step,
    forward and backward, the optimizer step and after zero_grad."""
    top = max(points[1:-2], key=_total)
    moments = (points[0], top, points[-2], points[-1])
    peak = max(moments, key=_total)
    return Timeline(
        peak,
        peak.parameters - params,
        held,
        temp if peak.phase == "optimizer" else 0,
        params,
        temp,
        per_microbatch,
        moments,
        replay,
        [points],
        explain,
    )


#: the moments of a step by (phase, label); results over many shapes name them by index
KINDS = (
    ("before", "weights and optimizer states"),
    ("forward", "embedding"),
    ("forward", "layer"),
    ("forward", "LM head and loss"),
    ("forward", "send to the next stage"),
    ("backward", "loss and LM head"),
    ("backward", "gradient from the next stage"),
    ("backward", "recompute"),
    ("backward", "layer"),
    ("backward", "embedding"),
    ("optimizer", "optimizer step"),
    ("optimizer", "after zero_grad"),
    ("forward", "LM head"),
)
_EMBED_F, _LAYER_F, _HEAD_F, _SEND_F = 1, 2, 3, 4
_HEAD_B, _RECV_B, _RECOMPUTE, _LAYER_B, _EMBED_B = 5, 6, 7, 8, 9
_LOGITS_F = 12

#: the longest group of layers looked for as the repeated unit of a run
_GROUP = 8
#: int64 holds every value of a play over many shapes when a bound on them is below this
_INT64_SAFE = 1 << 62

#: one layer of a run: the block it is, whether it is checkpointed, its autocast copies
_Layer = tuple[int, bool, int]
#: a run: its first layer's index, the layers of its repeated group, the repetitions
_Run = tuple[int, tuple[_Layer, ...], int]


def _runs(layers: Sequence[_Layer], start: int, step: int) -> tuple[_Run, ...]:
    """``layers`` (from layer ``start``, one ``step`` apart) as runs of a repeated group:
    at each position, the group of at most :data:`_GROUP` layers whose repetitions cover
    the most layers. Any split into runs gives the same peak; fewer runs, less work."""
    out: list[_Run] = []
    i, n = 0, len(layers)
    while i < n:
        size, reps = 1, 1
        for p in range(1, min(_GROUP, (n - i) // 2) + 1):
            unit = layers[i : i + p]
            r = 1
            while layers[i + r * p : i + (r + 1) * p] == unit:
                r += 1
            if r > 1 and r * p > size * reps:
                size, reps = p, r
        out.append((start + step * i, tuple(layers[i : i + size]), reps))
        i += size * reps
    return tuple(out)


#: the shape quantities every point of a step is a linear form in: the six
#: :data:`~engine.graph.TERMS` (``one`` last), a hidden-size tensor between blocks
#: (``b s h x res / sp``), the embedding's 1-byte dropout mask (``b s h / sp``), then the
#: seven values (:class:`~engine.graph.BlockResult`: kept, forward peak, output, backward
#: peak, input gradient, parameter gradients, held) of each block that is not folded in
#: (a block without an integer profile: see :func:`_compile`)
_ONE, _HIDDEN, _DROPOUT, _FIRST_BLOCK = len(TERMS) - 1, len(TERMS), len(TERMS) + 1, len(TERMS) + 2
_BLOCK = 7


@dataclass(frozen=True, slots=True)
class Moments:
    """The highest point of the forward and backward at many shapes, one array entry per
    shape (:meth:`StepPlan.moments`), and what the step's other moments need."""

    #: index into :data:`KINDS`
    kind: np.ndarray
    #: the layer, -1 for a point that is not a layer's
    layer: np.ndarray
    parameters: np.ndarray
    gradients: np.ndarray
    optimizer_states: np.ndarray
    activations: np.ndarray
    per_microbatch: np.ndarray
    logits: np.ndarray
    #: shapes these arrays do not hold exactly (a block simulated directly there, or a
    #: run of floored gradient shares not monotone there): play each with
    #: :meth:`StepPlan.play`
    single: np.ndarray


class _Max:
    """The largest of a few linear forms -- a block's forward or backward peak, from its
    profile's candidates: a point that holds it is a candidate for the step's highest
    point once per form (the highest of them is the point's own value)."""

    __slots__ = ("forms",)
    __array_ufunc__ = None  # an array plus a _Max is a _Max

    def __init__(self, forms: list[np.ndarray]) -> None:
        self.forms = forms

    def __add__(self, other: np.ndarray) -> _Max:
        return _Max([f + other for f in self.forms])

    __radd__ = __add__

    def __sub__(self, other: np.ndarray) -> _Max:
        return _Max([f - other for f in self.forms])


def _forms(prof: Profile) -> tuple[tuple[int, ...], ...]:
    """Every linear form of a block profile."""
    singles = (prof.kept, prof.output, prof.input_grad, prof.param_grads, prof.held)
    return (*singles, *prof.forward, *prof.backward)


#: a point of the step that can be its highest (see :func:`_compile`): kind, layer,
#: parameters, optimizer states and gradient buffers (constants), and the linear forms of
#: its gradients before the rank's share is taken and of its activations
_Candidate = tuple[int, int, int, int, int, np.ndarray, np.ndarray]


def _compile(
    model: ModelSpec,
    layers: Sequence[_Layer],
    head: int,
    head_copies: int,
    profiles: Sequence[Profile | None],
    unfolded: Sequence[int],
    training: TrainingSpec,
    ctx: Ctx,
    stage: Stage,
    gather: Gather,
    grad_buffer: int,
    params: int,
    opt: int,
    trains_embeddings: bool,
    dense_grad: int,
    tied: int,
    denominator: int,
    dtype: type,
    per_op: Sequence[Size] = (),
    function_kept_of: Sequence[Size] = (),
    logits_block: int = -1,
    copies_of: Sequence[int] = (),
) -> tuple[list[_Candidate], np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    """Play the step once with symbolic sizes, as :func:`_layer_by_layer` plays it point
    for point; return the points that can be its highest -- every point outside runs,
    and both ends of every run's later repetitions (see the module docstring) -- with
    their bytes as linear forms over the shape quantities; what one micro-batch keeps,
    the other micro-batches in flight and the logits held; and for each run whose floored
    gradient share is not affine, the growth of its gradients and the fall of the rest
    per repetition (it is monotone only where they differ by a byte or more).

    A block with an integer profile is folded in: its values are the profile's forms
    (its peaks a :class:`_Max` of them); the values of the ``unfolded`` ones are shape
    quantities of their own. The forms are int64 vectors where ``dtype`` says they fit,
    else Python integers."""
    size = _FIRST_BLOCK + _BLOCK * len(unfolded)
    basis: np.ndarray = np.eye(size, dtype=dtype)  # rows shared: no form changes in place

    def var(i: int) -> np.ndarray:
        row: np.ndarray = basis[i]
        return row

    def form(prof: Profile, coefs: tuple[int, ...]) -> np.ndarray:
        v: np.ndarray = np.zeros(size, dtype=dtype)
        v[list(prof.terms)] = coefs
        return v

    values: dict[tuple[int, int], Any] = {}

    def value(b: int, f: int) -> Any:
        """Field ``f`` of block ``b``: a form, or for a peak a :class:`_Max` of forms."""
        if (b, f) not in values:
            prof = profiles[b]
            if b in unfolded or prof is None:
                values[b, f] = var(_FIRST_BLOCK + _BLOCK * unfolded.index(b) + f)
            elif f in (1, 3):
                forms = prof.forward if f == 1 else prof.backward
                values[b, f] = _Max([form(prof, v) for v in forms])
            else:
                fields = (prof.kept, (), prof.output, (), prof.input_grad, prof.param_grads)
                values[b, f] = form(prof, (*fields, prof.held)[f])
        return values[b, f]

    linear = peak = value

    one, tokens, pairs, hidden = var(_ONE), var(0), var(1), var(_HIDDEN)
    nothing = 0 * one
    gathered = gather.active
    unit_b, g_fwd, g_bwd = gather.unit, gather.forward, gather.backward
    ckpt_input = nothing if training.offload.activations == "cpu" else hidden

    def saved_form(size_of: Size) -> np.ndarray:
        v: np.ndarray = np.zeros(size, dtype=dtype)
        for j, a in enumerate(_coefs(size_of)):
            if a != int(a):
                raise ValueError("a per-op saved size that is not whole bytes")
            v[j] = int(a)
        return v

    # what a checkpointed layer of each block keeps: its input, and what per-op saves
    kept_on = [ckpt_input + saved_form(per_op[b] if per_op else 0) for b in range(len(profiles))]
    rope = 2 * model.head_dim * ctx.res if model.position_embedding == "rotary" else 0
    eager = ctx.attention == "eager"
    base = (16 + rope) * tokens + (pairs if ctx.masked and not eager else nothing)
    # the previous step's graph (what custom functions keep) and model output, as
    # _layer_by_layer counts them
    graph_kept = old_output = nothing
    if carries_previous(training, stage):
        for b, on, _ in layers:
            if not on:
                graph_kept = graph_kept + saved_form(function_kept_of[b])
                old_output = old_output + linear(b, 6)
        graph_kept = graph_kept + saved_form(function_kept_of[head])
        old_output = old_output + linear(head, 6)
    fixed = base + (ctx.res * pairs if eager else nothing) + graph_kept + old_output
    cands: list[_Candidate] = []

    def add(kind: int, layer: int, p: int, g: int, grads: np.ndarray, a: Any) -> None:
        for f in a.forms if isinstance(a, _Max) else [a]:
            cands.append((kind, layer, p, opt, g, grads, f))

    kept = nothing
    if stage.first:
        kept = int(model.embedding_norm) * (hidden + 8 * tokens)
        kept = kept + (var(_DROPOUT) if model.hidden_dropout > 0 else nothing)
        add(
            _EMBED_F,
            -1,
            params + g_fwd if gathered else params,
            grad_buffer,
            nothing,
            fixed + hidden,
        )

    def forward(unit: tuple[_Layer, ...], i: int, kept: np.ndarray, copies: int) -> np.ndarray:
        for b, on, c in unit:
            p = params + i * unit_b + g_fwd if gathered else params + copies + c
            add(_LAYER_F, i, p, grad_buffer, nothing, fixed + kept + peak(b, 1) - c * one)
            kept = kept + (kept_on[b] if on else linear(b, 0) - c * one + linear(b, 6))
            copies += c
            i += 1
        return kept

    def growth(unit: tuple[_Layer, ...]) -> np.ndarray:
        """What a repetition of ``unit`` adds to the activations kept."""
        out = nothing
        for b, on, c in unit:
            out = out + (kept_on[b] if on else linear(b, 0) - c * one + linear(b, 6))
        return out

    def shrink(unit: tuple[_Layer, ...]) -> np.ndarray:
        """What a repetition of ``unit`` releases in backward: all it kept but what it
        handed to the model output (the KV cache), which lives on with it."""
        out = nothing
        for b, on, c in unit:
            out = out + (kept_on[b] if on else linear(b, 0) - c * one)
        return out

    cache = nothing
    for b, on, _ in layers:
        if not on:
            cache = cache + linear(b, 6)

    copies = 0
    for start, unit, reps in _runs(layers, 0, 1):
        kept = forward(unit, start, kept, copies)
        copies += sum(c for _, _, c in unit)
        if reps > 1:
            n, rest = len(unit), reps - 1
            d_kept, d_copies = growth(unit), sum(c for _, _, c in unit)
            for t in sorted({0, rest - 1}):  # a run's highest point is at one of its ends
                forward(unit, start + n + t * n, kept + t * d_kept, copies + t * d_copies)
            kept = kept + rest * d_kept
            copies += rest * d_copies

    if stage.last:
        hv = [peak(head, f) if f in (1, 3) else linear(head, f) for f in range(_BLOCK)]
    else:  # the output goes to the next stage; its gradient comes back
        hv = [nothing, hidden, nothing, 2 * hidden, hidden, nothing, nothing]
    n_layers = len(layers)
    p = params + n_layers * unit_b + g_fwd if gathered else params + copies + head_copies
    if logits_block >= 0:
        c = copies_of[logits_block]
        q = params + n_layers * unit_b + g_fwd if gathered else params + copies + c
        add(_LOGITS_F, -1, q, grad_buffer, nothing, fixed + kept + peak(logits_block, 1) - c * one)
    kind = _HEAD_F if stage.last else _SEND_F
    add(kind, -1, p, grad_buffer, nothing, fixed - old_output + kept + hv[1] - head_copies * one)
    copies += head_copies
    held = hv[6]
    per_microbatch = kept + held
    waiting = (stage.inflight - 1) * per_microbatch + (nothing if stage.first else hidden)
    copies -= sum(c for _, on, c in layers if on)

    def buffers(reducing: int) -> int:
        return grad_buffer + (gather.grads + reducing if gathered else 0)

    fixed = base + held
    units = n_layers * unit_b
    p = params + units + g_bwd if gathered else params + copies
    kind = _HEAD_B if stage.last else _RECV_B
    add(kind, -1, p, buffers(0), nothing, fixed + kept + hv[3] - head_copies * one)
    copies -= head_copies
    State = tuple[np.ndarray, int, np.ndarray, int, np.ndarray, int]

    def backward(unit: tuple[_Layer, ...], i: int, state: State) -> State:
        kept, copies, grads, units, grad_in, reducing = state
        for b, on, c in unit:
            g = buffers(reducing)
            if on:
                kept = kept - kept_on[b]
                p = params + units + g_bwd if gathered else params + copies + c
                add(_RECOMPUTE, i, p, g, grads, fixed + kept + grad_in + peak(b, 1) - c * one)
                add(_LAYER_B, i, p, g, grads, fixed + kept + peak(b, 3) - c * one)
            else:
                kept = kept - (linear(b, 0) - c * one)
                p = params + units + g_bwd if gathered else params + copies
                add(_LAYER_B, i, p, g, grads, fixed + kept + peak(b, 3) - c * one)
                copies -= c
            grads = grads + linear(b, 5)
            grad_in = linear(b, 4)
            units -= unit_b
            reducing = gather.reduce
            i -= 1
        return kept, copies, grads, units, grad_in, reducing

    state: State = (kept, copies, hv[5], units, hv[4], 0)
    checks: list[np.ndarray] = []
    for start, unit, reps in _runs(layers[::-1], n_layers - 1, -1):
        state = backward(unit, start, state)
        if reps <= 1:
            continue
        kept, copies, grads, units, grad_in, reducing = state
        n, rest = len(unit), reps - 1
        d_kept = shrink(unit)
        d_grads = sum((linear(b, 5) for b, _, _ in unit), nothing)
        d_copies = sum(c for _, on, c in unit if not on)
        d_units = n * unit_b
        if denominator != 1 and rest > 2:  # floored shares: monotone only if they move enough
            checks += [d_grads, d_kept + (d_units if gathered else d_copies) * one]
        for t in sorted({0, rest - 1}):
            at = (kept - t * d_kept, copies - t * d_copies, grads + t * d_grads)
            backward(unit, start - n - t * n, (*at, units - t * d_units, grad_in, reducing))
        state = (
            kept - rest * d_kept,
            copies - rest * d_copies,
            grads + rest * d_grads,
            units - rest * d_units,
            grad_in,
            reducing,
        )
    kept, copies, grads, units, grad_in, reducing = state
    if trains_embeddings:
        p = params + units + g_bwd if gathered else params
        own = grads + (dense_grad - tied) * one
        add(_EMBED_B, -1, p, buffers(reducing), own, fixed + cache + grad_in + tied * one)
    # the model output, with what the layers handed to it, lives through the optimizer step
    return cands, per_microbatch, waiting, held + cache, checks


@dataclass(frozen=True, slots=True)
class _Forms:
    """A step plan compiled (:func:`_compile`): the candidates for the highest point of
    forward and backward -- kind, layer and their constant parameters, optimizer states
    and gradient buffers -- and the matrix of their linear forms over the shape
    quantities: activations, gradients before the share, then what a micro-batch keeps,
    the other micro-batches in flight, the logits held, then the pairs of rows of the
    runs to check."""

    kinds: tuple[int, ...]
    layer_of: tuple[int, ...]
    fixed_parameters: tuple[int, ...]
    fixed_optimizer: tuple[int, ...]
    #: the four above as arrays (for many shapes at once)
    arrays: tuple[np.ndarray, ...]
    constant: np.ndarray
    buffers: np.ndarray
    matrix: np.ndarray
    #: whether ``constant``, ``buffers`` and ``matrix`` are int64 (else Python integers)
    fits: bool
    #: the largest absolute coefficient of each column of the matrix, and the largest
    #: absolute constant and buffer together: what bounds the values of a play
    columns: tuple[int, ...]
    largest_constant: int
    checks: int

    @staticmethod
    def of(plan: StepPlan) -> _Forms:
        (
            layers,
            head,
            training,
            gather,
            grad_buffer,
            opt,
            trains_embeddings,
            per_op,
            kept_of,
            logits_block,
        ) = plan.recipe
        model, stage, profiles = plan.model, plan.stage, plan.profiles
        # every coefficient of a form is a sum over the layers of profile coefficients and
        # constants, raised by the micro-batches in flight: int64 where that fits
        largest = max(
            [abs(c) for p in profiles if p is not None for v in _forms(p) for c in v]
            + [plan.params, opt, grad_buffer, plan.dense_grad, sum(plan.copies)]
            + [gather.forward, gather.backward, gather.grads, gather.reduce, gather.unit]
            + [64 + 4 * model.head_dim]
        )
        bound = 4 * (stage.inflight + 2) * (len(layers) + 8) * largest
        dtype: type = np.int64 if bound < _INT64_SAFE else object
        cands, per_microbatch, waiting, held, checks = _compile(
            model,
            layers,
            head,
            plan.copies[head] if stage.last else 0,
            profiles,
            plan.unfolded,
            training,
            plan.ctx,
            stage,
            gather,
            grad_buffer,
            plan.params,
            opt,
            trains_embeddings,
            plan.dense_grad,
            plan.tied,
            plan.grad_share.denominator,
            dtype,
            per_op,
            kept_of,
            logits_block,
            plan.copies,
        )
        matrix = np.stack(
            [c[6] for c in cands] + [c[5] for c in cands] + [per_microbatch, waiting, held, *checks]
        )
        constant = np.array([c[2] + c[3] for c in cands], dtype=object)
        buffers = np.array([c[4] for c in cands], dtype=object)
        columns = tuple(int(c) for c in np.abs(matrix).max(axis=0))
        largest_constant = int(np.abs(constant).max() + np.abs(buffers).max())
        fits = dtype is np.int64 and largest_constant < _INT64_SAFE
        return _Forms(
            kinds=tuple(c[0] for c in cands),
            layer_of=tuple(c[1] for c in cands),
            fixed_parameters=tuple(c[2] for c in cands),
            fixed_optimizer=tuple(c[3] for c in cands),
            arrays=tuple(
                np.array([c[f] for c in cands], dtype=np.int64 if fits else object)
                for f in range(4)
            ),
            constant=constant.astype(np.int64) if fits else constant,
            buffers=buffers.astype(np.int64) if fits else buffers,
            matrix=matrix if fits else matrix.astype(object),
            fits=fits,
            columns=columns,
            largest_constant=largest_constant,
            checks=len(checks) // 2,
        )


@dataclass(frozen=True, slots=True, eq=False)
class StepPlan:
    """Everything of one step (a rank's, see :func:`step_timeline`) that does not depend
    on the micro-batch size and the sequence length; :meth:`play` adds the shape."""

    model: ModelSpec
    #: the step's context at batch 1 x sequence 1: the key of the block profiles
    ctx: Ctx
    chunked: bool
    #: the distinct blocks of the step (kind, input needs a gradient), their profiles
    #: (``None``: simulated directly at each shape) and their autocast copies
    blocks: tuple[tuple[str, bool], ...]
    profiles: tuple[Profile | None, ...]
    copies: tuple[int, ...]
    #: the blocks whose values are evaluated at each shape (no integer profile)
    unfolded: tuple[int, ...]
    layers: int
    checkpointed_layers: int
    offload_inputs: bool
    hidden_size: int
    res: int
    sp: int
    stage: Stage
    grad_share: Fraction
    params: int
    temp: int
    #: the moments that do not depend on the shape
    before: Point
    step: Point
    after: Point
    #: the embedding's gradient, and the part of it summed into a tied LM head's
    dense_grad: int
    tied: int
    #: what compiling the step reads (see :func:`_compile`), and the compiled forms
    recipe: tuple[Any, ...] = field(repr=False)
    _compiled: list[_Forms] = field(default_factory=list, repr=False)

    @staticmethod
    def build(
        model: ModelSpec,
        training: TrainingSpec,
        state: ModelState,
        grad_share: Fraction,
        optimizer_share: Fraction,
        gather: Gather,
        stage: Stage,
        grad_buffer: int,
    ) -> StepPlan:
        """The plan of :func:`step_timeline`'s step (only ``training``'s strategy and
        whether a sliding window masks its sequence are read)."""
        ctx = dataclasses.replace(make_ctx(model, training), batch=1, seq=1)
        trains_embeddings = stage.first and (
            training.method == "full"
            or (training.method == "freeze" and "embeddings" in training.freeze.trainable)
        )
        ckpt = checkpointed(training, model.num_layers)
        embed_grad = embedding_output_grad(model, training, stage.first, any(ckpt))
        chunked = training.loss == "chunked"
        blocks: list[tuple[str, bool]] = []

        def block(kind: str, x_grad: bool) -> int:
            if (kind, x_grad) not in blocks:
                blocks.append((kind, x_grad))
            return blocks.index((kind, x_grad))

        of_layer = [
            block(kind, x_grad) for kind, x_grad in layer_kinds(model, training, ctx, embed_grad)
        ]
        head = block("head", True) if stage.last else -1
        logits_block = -1
        if plays_logits_point(training, stage, chunked):
            logits_block = block(HEAD_LOGITS, True)
        found = [_profile(model, ctx, kind, x_grad, chunked) for kind, x_grad in blocks]
        profiles = tuple(p for p, _ in found)
        copies = tuple(c for _, c in found)
        layers = [(b, on, copies[b]) for b, on in zip(of_layer, ckpt, strict=True)]
        unfolded = tuple(b for b, p in enumerate(profiles) if p is None or p.den != 1)

        params = state.category_bytes("parameters")
        opt = state.category_bytes("optimizer_states")
        temp = int(optimizer_temporaries(model, training, state) * optimizer_share)
        dense_grad = model.vocab_size * model.hidden_size * (4 - 2 * (training.precision == "bf16"))
        tied = dense_grad if model.tie_word_embeddings else 0
        # the per-op policy's saved outputs of each block, as linear forms of the shape
        per_op: tuple[Size, ...] = (0,) * len(blocks)
        if conventions(training).checkpointing == "per-op":
            symbolic = dataclasses.replace(ctx, symbolic=True)
            per_op = tuple(
                _per_op(model, symbolic, kind, x_grad) if kind not in ("head", HEAD_LOGITS) else 0
                for kind, x_grad in blocks
            )
        # what custom functions of each block keep on their ctx, where the previous step's
        # graph lives on into this one
        kept_of: tuple[Size, ...] = (0,) * len(blocks)
        if carries_previous(training, stage):
            symbolic = dataclasses.replace(ctx, symbolic=True)
            kept_of = tuple(
                _function_kept(model, symbolic, kind, x_grad, chunked) for kind, x_grad in blocks
            )
        recipe = (
            layers,
            head,
            training,
            gather,
            grad_buffer,
            opt,
            trains_embeddings,
            per_op,
            kept_of,
            logits_block,
        )
        return StepPlan(
            model=model,
            ctx=ctx,
            chunked=chunked,
            blocks=tuple(blocks),
            profiles=profiles,
            copies=copies,
            unfolded=unfolded,
            layers=len(layers),
            checkpointed_layers=sum(ckpt),
            offload_inputs=training.offload.activations == "cpu",
            hidden_size=model.hidden_size,
            res=ctx.res,
            sp=ctx.sp,
            stage=stage,
            grad_share=grad_share,
            params=params,
            temp=temp,
            before=Point("before", None, KINDS[0][1], params, grad_buffer, opt, 0),
            step=Point(
                "optimizer",
                None,
                KINDS[10][1],
                params,
                state.category_bytes("gradients"),
                opt + temp,
                0,
            ),
            after=Point("optimizer", None, KINDS[11][1], params, grad_buffer, opt, 0),
            dense_grad=dense_grad,
            tied=tied,
            recipe=recipe,
        )

    def forms(self) -> _Forms:
        """The step compiled into linear forms (:func:`_compile`), once."""
        if not self._compiled:
            self._compiled.append(_Forms.of(self))
        return self._compiled[0]

    # -- the shape ----------------------------------------------------------------------

    def terms(self, batch: Any, seq: Any) -> tuple[Any, ...]:
        """The values of :data:`~engine.graph.TERMS` at ``batch`` x ``seq`` (the sequence
        per context rank), as :meth:`engine.layers.Ctx.terms` gives them; integers, or
        arrays of one value per shape."""
        ctx = self.ctx
        tokens = batch * seq
        routed = tokens * ctx.topk
        if ctx.ep > 1:
            routed = -(-routed * round(ctx.capacity * 1000) // 1000)
        chunk = (
            np.minimum(tokens, CHUNK_ROWS)
            if isinstance(tokens, np.ndarray)
            else min(tokens, CHUNK_ROWS)
        )
        return (tokens, tokens * seq, batch * (-(-seq // 32) * 32), routed, chunk, 1)

    def offloaded_inputs(self, batch: Any, seq: Any) -> Any:
        """Host bytes of one micro-batch's checkpointed layer inputs under activation
        offload (0 without it), at ``batch`` x ``seq`` (the sequence per context rank):
        integers, or arrays of one value per shape."""
        if not self.offload_inputs:
            return 0
        return self.checkpointed_layers * (batch * seq * self.hidden_size * self.res // self.sp)

    def _block(self, b: int, batch: int, seq: int, terms: tuple[int, ...]) -> tuple[int, ...]:
        """Block ``b`` at ``batch`` x ``seq`` (its :data:`TERMS` ``terms``) as
        :func:`block_result` gives it: from its profile where the profile holds whole
        bytes there, else simulated directly."""
        prof = self.profiles[b]
        if prof is not None:
            try:
                r = prof.at(terms)
            except ValueError:  # not a whole number of bytes here: outside the forms
                pass
            else:
                return (
                    r.kept,
                    r.forward_peak,
                    r.output,
                    r.backward_peak,
                    r.input_grad,
                    r.param_grads,
                    r.held,
                )
        kind, x_grad = self.blocks[b]
        ctx = dataclasses.replace(self.ctx, batch=batch, seq=seq)
        r = _direct(self.model, ctx, kind, x_grad, self.chunked)
        return (
            r.kept,
            r.forward_peak,
            r.output,
            r.backward_peak,
            r.input_grad,
            r.param_grads,
            r.held,
        )

    def _values(self, batch: int, seq: int) -> list[int]:
        """The shape quantities at one shape."""
        terms = self.terms(batch, seq)
        tokens, h, sp = terms[0], self.hidden_size, self.sp
        out = [*terms, tokens * h * self.res // sp, tokens * h // sp]
        for b in self.unfolded:
            out += self._block(b, batch, seq, terms)
        return out

    def _values_many(self, batch: np.ndarray, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The shape quantities at many shapes (one column each, int64), and the shapes
        that need a block of their own evaluated (left as zeros here)."""
        x = np.zeros((_FIRST_BLOCK + _BLOCK * len(self.unfolded), len(batch)), dtype=np.int64)
        for i, term in enumerate(self.terms(batch, seq)):
            x[i] = term
        tokens, h, sp = x[0], self.hidden_size, self.sp
        x[_HIDDEN] = tokens * h * self.res // sp
        x[_DROPOUT] = tokens * h // sp
        return x, np.full(len(batch), bool(self.unfolded))

    # -- the play -----------------------------------------------------------------------

    def _fits(self, x: Sequence[int], extra: int) -> bool:
        """Whether int64 holds every value of a play whose shape quantities are at most
        ``x`` in absolute value, with up to ``extra`` more micro-batches in flight."""
        forms = self.forms()
        rows = sum(map(mul, forms.columns, map(abs, x)))
        share = max(self.grad_share.numerator, self.grad_share.denominator, 1)
        largest = (4 * rows * share + forms.largest_constant) * (extra + 2)
        return forms.fits and largest < _INT64_SAFE

    def _evaluate(self, x: np.ndarray, exact: bool) -> tuple[Any, ...]:
        """The candidates' activations, gradients and totals, what a micro-batch keeps,
        the other micro-batches in flight, the logits held, and whether every checked run
        is monotone there, from the shape quantities ``x`` (a column per shape)."""
        forms = self.forms()
        matrix, buffers, constant = forms.matrix, forms.buffers, forms.constant
        if exact:  # in Python integers
            matrix, buffers, constant = (a.astype(object) for a in (matrix, buffers, constant))
        v = matrix @ x
        n = len(forms.kinds)
        num, den = self.grad_share.numerator, self.grad_share.denominator
        g = v[n : 2 * n]
        if num != 1 or den != 1:
            g = g * num // den
        if x.ndim > 1:
            buffers, constant = buffers[:, None], constant[:, None]
        g = g + buffers
        total = constant + g + v[:n]
        ok: Any = True
        for k in range(forms.checks):
            rise = v[2 * n + 3 + 2 * k] * num
            slope = rise - den * v[2 * n + 4 + 2 * k]
            ok = ok & ((rise % den == 0) | (slope >= den) | (slope <= -den))
        return v[:n], g, total, v[2 * n], v[2 * n + 1], v[2 * n + 2], ok

    def play(
        self,
        batch: int,
        seq: int,
        replay: Callable[[], tuple[Point, ...]],
        explain: Callable[[], tuple[tuple[Source, ...], ...]] | None = None,
    ) -> Timeline:
        """The step at ``batch`` x ``seq`` (the sequence per context rank); ``replay``
        plays its every point when they are asked for, ``explain`` their sources."""
        x = self._values(batch, seq)
        exact = not self._fits(x, 0)  # in Python integers where int64 might overflow
        a, g, total, per_microbatch, waiting, held, ok = self._evaluate(
            np.array(x, dtype=object if exact else np.int64), exact
        )
        played: list[tuple[Point, ...]] = []
        if ok:
            forms = self.forms()
            best = int(total.argmax())  # the first of equal highest points
            phase, label = KINDS[forms.kinds[best]]
            layer = forms.layer_of[best]
            top = Point(
                phase,
                None if layer < 0 else layer,
                label,
                forms.fixed_parameters[best],
                int(g[best]),
                forms.fixed_optimizer[best],
                int(a[best]) + int(waiting),
            )
        else:  # a run whose floored gradient share is not monotone: every point
            played.append(replay())
            top = max((p for p in played[0] if p.phase in _PLAYED), key=_total)
        step, after = self.step, self.after
        if held:  # a model output held by the loop lives through the step and zero_grad
            step = dataclasses.replace(step, activations=int(held))
            after = dataclasses.replace(after, activations=int(held))
        moments = (self.before, top, step, after)
        peak = max(moments, key=_total)
        return Timeline(
            peak,
            peak.parameters - self.params,
            int(held),
            self.temp if peak.phase == "optimizer" else 0,
            self.params,
            self.temp,
            int(per_microbatch),
            moments,
            replay,
            played,
            explain,
        )

    def moments(self, batch: np.ndarray, seq: np.ndarray, extra: int = 0) -> Moments | None:
        """The highest point of forward and backward at every shape ``batch[i]`` x
        ``seq[i]`` (integer arrays of one length) at once, as :meth:`play` finds it, with
        room for up to ``extra`` more micro-batches in flight; ``None`` where the values
        might not fit in int64 (play each shape then)."""
        found = joint((self,)).moments(batch, seq, extra)
        if found is None:
            return None
        return Moments(*(getattr(found, f.name)[0] for f in dataclasses.fields(Moments)))


#: the total of a candidate that pads a plan's candidates in a :class:`Joint`: never
#: the highest (every real total is at least 0)
_NEVER = -(1 << 61)


@dataclass(frozen=True, slots=True, eq=False)
class Joint:
    """Several step plans (a strategy's pipeline stages) over the same shape quantities,
    evaluated together: their matrices stacked, each plan's candidates padded to the
    same number with candidates that are never the highest."""

    plans: tuple[StepPlan, ...]
    #: per plan: its candidates' activations, gradients before the share, then what a
    #: micro-batch keeps, the other micro-batches in flight, the logits held, and the
    #: pairs of rows of the runs to check; all plans' rows stacked
    matrix: np.ndarray
    candidates: int
    checks: int
    #: per plan and candidate (plan x candidate x 1)
    constant: np.ndarray
    buffers: np.ndarray
    #: per plan and candidate: kind, layer, parameters, optimizer states
    arrays: tuple[np.ndarray, ...]
    #: per plan (plan x 1 x 1): the gradient share
    num: np.ndarray
    den: np.ndarray

    def moments(self, batch: np.ndarray, seq: np.ndarray, extra: int = 0) -> Moments | None:
        """:meth:`StepPlan.moments` of every plan: arrays of plan x shape."""
        first = self.plans[0]
        if not len(batch) or not len(self.matrix):
            return None
        terms = first.terms(int(batch.max()), int(seq.max()))  # each term grows with both
        h, sp = first.hidden_size, first.sp
        largest = [*terms, terms[0] * h * first.res // sp, terms[0] * h // sp]
        if not all(p._fits(largest, extra) for p in self.plans):
            return None
        x, _ = first._values_many(batch.astype(np.int64), seq.astype(np.int64))
        n, c = len(batch), self.candidates
        v = (self.matrix @ x).reshape(len(self.plans), -1, n)
        a = v[:, :c]
        g = v[:, c : 2 * c] * self.num // self.den + self.buffers
        total = self.constant + g + a
        ok = np.ones((len(self.plans), n), dtype=bool)
        for k in range(self.checks):
            rise = v[:, 2 * c + 3 + 2 * k] * self.num[:, 0]
            slope = rise - self.den[:, 0] * v[:, 2 * c + 4 + 2 * k]
            den = self.den[:, 0]
            ok &= (rise % den == 0) | (slope >= den) | (slope <= -den)
        best = total.argmax(axis=1)  # plan x shape: the first of equal highest points
        plan = np.arange(len(self.plans))[:, None]
        col = np.arange(n)[None, :]
        kinds, layers, parameters, optimizer = (x[plan, best] for x in self.arrays)
        return Moments(
            kind=kinds,
            layer=layers,
            parameters=parameters,
            gradients=g[plan, best, col],
            optimizer_states=optimizer,
            activations=a[plan, best, col] + v[:, 2 * c + 1],
            per_microbatch=v[:, 2 * c],
            logits=v[:, 2 * c + 2],
            single=~ok,
        )


@memo.cached(maxsize=4096)
def joint(plans: tuple[StepPlan, ...]) -> Joint:
    """The plans of a strategy's stages evaluated together (:class:`Joint`); empty where
    one of them has a block of its own to evaluate at each shape or does not fit int64
    (its moments are then ``None``)."""
    compiled = [p.forms() for p in plans]
    c = max(len(f.kinds) for f in compiled)
    checks = max(f.checks for f in compiled)
    usable = all(f.fits and not p.unfolded for p, f in zip(plans, compiled, strict=True))
    rows, constant, buffers = [], [], []
    arrays: list[list[list[int]]] = [[], [], [], []]
    for p in compiled:
        k = len(p.kinds)
        m = p.matrix if usable else np.zeros((0, _FIRST_BLOCK), dtype=np.int64)
        width = m.shape[1] if len(m) else _FIRST_BLOCK
        pad = np.zeros((c - k, width), dtype=np.int64)
        act, grads, rest = m[:k], m[k : 2 * k], m[2 * k :]
        more = np.zeros((2 * (checks - p.checks), width), dtype=np.int64)
        rows.append(np.concatenate([act, pad, grads, pad, rest, more]) if usable else m)
        padding = [_NEVER] * (c - k)
        constant.append([int(x) for x in p.constant] + padding)
        buffers.append([int(x) for x in p.buffers] + [0] * (c - k))
        for out, values in zip(
            arrays, (p.kinds, p.layer_of, p.fixed_parameters, p.fixed_optimizer), strict=True
        ):
            out.append([*values, *([0] * (c - k))])
    num = np.array([p.grad_share.numerator for p in plans], dtype=np.int64)[:, None, None]
    den = np.array([p.grad_share.denominator for p in plans], dtype=np.int64)[:, None, None]
    return Joint(
        plans=plans,
        matrix=np.concatenate(rows) if usable else np.zeros((0, _FIRST_BLOCK), dtype=np.int64),
        candidates=c,
        checks=checks,
        constant=np.array(constant, dtype=np.int64)[:, :, None] if usable else np.zeros(0),
        buffers=np.array(buffers, dtype=np.int64)[:, :, None] if usable else np.zeros(0),
        arrays=tuple(np.array(x, dtype=np.int64) if usable else np.zeros(0) for x in arrays),
        num=num,
        den=den,
    )


_PLAYED = ("forward", "backward")


def _layer_by_layer(
    model: ModelSpec,
    training: TrainingSpec,
    state: ModelState,
    grad_share: Fraction = Fraction(1),
    optimizer_share: Fraction = Fraction(1),
    gather: Gather = Gather(),
    stage: Stage = Stage(),
    grad_buffer: int = 0,
    *,
    ledger: list[tuple[Source, ...]] | None = None,
) -> tuple[tuple[Point, ...], int, int, int, int]:
    """Play one step layer by layer: every point of the timeline -- what
    :attr:`Timeline.points` holds, and the reference :class:`StepPlan` is held to -- what
    one micro-batch keeps at the end of its forward, the logits held, the model state's
    parameters and the optimizer's temporaries (see :func:`step_timeline` for the
    arguments). With a ``ledger``, each point's activations are also told apart by where
    they come from (:class:`Source`), one tuple per point, appended to it: what
    :func:`step_sources` returns."""
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
    embed_grad = embedding_output_grad(model, training, stage.first, checkpointing)
    chunked = training.loss == "chunked"
    key = dataclasses.replace(ctx, batch=1, seq=1)
    head, head_copies = block_result(model, ctx, "head", True, chunked, key)

    params = state.category_bytes("parameters")
    opt_states = state.category_bytes("optimizer_states")
    points: list[Point] = []

    g_num, g_den = grad_share.numerator, grad_share.denominator
    waiting = 0  # activations of the other in-flight micro-batches (set after forward)

    units_held = 0  # SHARD_GRAD_OP: layers gathered in forward, not yet through backward
    reducing = 0  # the reduce-scatter input, once the first layer's gradients are reduced

    explain, last = ledger is not None, stage.last
    fixed_why: list[Source] = []  # the fixed part of the activations, told apart
    kept_why = _Kept()  # what the layers so far keep, by layer kind

    def add(
        phase: str,
        layer: int | None,
        label: str,
        p: int,
        g: int,
        o: int,
        a: int,
        own: tuple[Source, ...] | bool = (),
    ) -> None:
        if ledger is not None:
            own = own if isinstance(own, tuple) else ()
            parts = [*fixed_why, *kept_why.sources(), *own]
            if phase in ("forward", "backward") and waiting:
                parts.append(_in_flight_source(waiting))
            ledger.append(tuple(s for s in parts if s.bytes))
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
    if explain:
        fixed_why[:] = _input_sources(batch_tensors, rope, bool_mask, mask)
    kinds = layer_kinds(model, training, ctx, embed_grad)
    layers = [block_result(model, ctx, kind, x_grad, chunked, key) for kind, x_grad in kinds]
    # what a checkpointed layer keeps: its input, and under the per-op policy the outputs
    # it saves
    per_op = conventions(training).checkpointing == "per-op"
    kept_of = [
        ckpt_input + (_int(_per_op(model, ctx, kind, x_grad)) if per_op else 0)
        for kind, x_grad in kinds
    ]

    # the previous step, where the loop's variables keep it: its graph until this step's
    # loss is computed -- only what custom functions keep on their ctx costs memory (the
    # inputs of bitsandbytes' 4-bit matmuls) -- and its model output until this forward
    # returns (the LM head's point counts only the graph: the loss comes after)
    graph_kept = old_output = 0
    if carries_previous(training, stage):
        graph_kept = sum(
            _int(_function_kept(model, ctx, kind, x_grad, chunked))
            for (kind, x_grad), on in zip(kinds, ckpt, strict=True)
            if not on
        ) + _int(_function_kept(model, ctx, "head", True, chunked))
        old_output = head.held + sum(
            res.held for (res, _), on in zip(layers, ckpt, strict=True) if not on
        )
    if explain:
        fixed_why += _previous_sources(graph_kept, old_output)

    # forward: the level of a layer's peak is the fixed tensors, what earlier layers kept,
    # and the layer's own peak (its input, the previous output, included)
    fixed = base_act + mask + graph_kept + old_output
    kept_act = 0
    if stage.first:
        # the embedding's own saved tensors: BERT's LayerNorm input and statistics, and the
        # dropout mask (1 byte per element) of GPT-2 and BERT
        kept_act = (hidden + 8 * tokens) * model.embedding_norm
        kept_act += tokens * h // ctx.sp if model.hidden_dropout > 0 else 0
    copies = 0
    if stage.first:
        add(
            "forward",
            None,
            "embedding",
            params,
            0,
            opt_states,
            fixed + embed_out,
            explain and (_work_source("embedding", embed_out, None),),
        )
    if explain:
        kept_why.add("embedding", kept_act, 0)
    for i, (res, c) in enumerate(layers):
        add(
            "forward",
            i,
            "layer",
            params + copies + c,
            0,
            opt_states,
            fixed + kept_act + res.forward_peak - c,
            explain and (_work_source("forward", res.forward_peak - c, i),),
        )
        # checkpointing keeps only the layer's input; autocast's cache keeps the copies;
        # what the layer hands to the model output (the KV cache) stays with it
        kept_act += kept_of[i] if ckpt[i] else res.kept - c + res.held
        if explain and ckpt[i]:
            kept_why.add("checkpointed", kept_of[i], 1)
        elif explain:
            kept_why.add(kinds[i][0], res.kept - c, 1)
            kept_why.add("kv-cache", res.held, 1 if res.held else 0)
        copies += c
        units_held += gather.unit
    if not stage.last:  # the output goes to the next stage; its gradient comes back
        head = BlockResult(0, embed_out, 0, 2 * embed_out, embed_out, 0, 0)
        head_copies = 0
    if plays_logits_point(training, stage, chunked):
        logits, logit_copies = block_result(model, ctx, HEAD_LOGITS, True, chunked, key)
        add(
            "forward",
            None,
            "LM head",
            params + copies + logit_copies,
            0,
            opt_states,
            fixed + kept_act + logits.forward_peak - logit_copies,
            explain and (_head_source("logits", logits.forward_peak - logit_copies, chunked),),
        )
    if explain:  # the previous step's model output is gone once this forward returns
        fixed_why[:] = [s for s in fixed_why if s.name != _PREVIOUS_OUTPUT]
    add(
        "forward",
        None,
        "LM head and loss" if stage.last else "send to the next stage",
        params + copies + head_copies,
        0,
        opt_states,
        fixed - old_output + kept_act + head.forward_peak - head_copies,
        explain and (_head_source("forward", head.forward_peak - head_copies, chunked, last),),
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
        if ledger is not None:
            ledger[:] = [
                (*parts, _in_flight_source(waiting)) if p.phase == "forward" else parts
                for p, parts in zip(points, ledger, strict=True)
            ]
    # the cache is cleared when autocast exits, at the end of forward: the copies of
    # checkpointed layers go (they are made again in the recomputation)
    copies -= sum(c for (_, c), on in zip(layers, ckpt, strict=True) if on)

    # backward
    grads = 0
    fixed = base_act + held  # the eager mask died with the forward; the logits did not
    if explain:
        fixed_why[:] = [*_input_sources(batch_tensors, rope, bool_mask, 0), _output_source(held)]
    add(
        "backward",
        None,
        "loss and LM head" if stage.last else "gradient from the next stage",
        params + copies,
        grads,
        opt_states,
        fixed + kept_act + head.backward_peak - head_copies,
        explain and (_head_source("backward", head.backward_peak - head_copies, chunked, last),),
    )
    grads += head.param_grads
    copies -= head_copies
    grad_in = head.input_grad
    for i in range(model.num_layers - 1, -1, -1):
        res, c = layers[i]
        if ckpt[i]:
            kept_act -= kept_of[i]
            if explain:
                kept_why.add("checkpointed", -kept_of[i], -1)
            add(
                "backward",
                i,
                "recompute",
                params + copies + c,
                grads,
                opt_states,
                fixed + kept_act + grad_in + res.forward_peak - c,
                explain
                and (_grad_source(grad_in, i), _work_source("recompute", res.forward_peak - c, i)),
            )
            add(
                "backward",
                i,
                "layer",
                params + copies + c,
                grads,
                opt_states,
                fixed + kept_act + res.backward_peak - c,
                explain and (_work_source("backward", res.backward_peak - c, i),),
            )
        else:
            kept_act -= res.kept - c
            if explain:
                kept_why.add(kinds[i][0], -(res.kept - c), -1)
            add(
                "backward",
                i,
                "layer",
                params + copies,
                grads,
                opt_states,
                fixed + kept_act + res.backward_peak - c,
                explain and (_work_source("backward", res.backward_peak - c, i),),
            )
            copies -= c
        grads += res.param_grads
        grad_in = res.input_grad
        units_held -= gather.unit
        reducing = gather.reduce
    # what is left of the layers' activations is what they handed to the model output
    cache = sum(res.held for (res, _), on in zip(layers, ckpt, strict=True) if not on)
    if explain:  # the embedding's saved tensors went with its backward; the cache stays
        kept_why.only("kv-cache")
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
            fixed + cache + grad_in + tied,
            explain and (_grad_source(grad_in, None), _work_source("tied gradient", tied, None)),
        )
    # the step's gradients are what model_state counts; backward may differ by rounding
    grads = state.category_bytes("gradients")

    # optimizer
    temp = int(optimizer_temporaries(model, training, state) * optimizer_share)
    # a model output held by the loop lives through the optimizer step and zero_grad
    if explain:
        fixed_why[:] = [_output_source(held)]
    held += cache
    add("optimizer", None, "optimizer step", params, grads, opt_states + temp, held)
    add("optimizer", None, "after zero_grad", params, grad_buffer, opt_states, held)
    return tuple(points), per_microbatch, held, params, temp


#: the kind of a :class:`Source`: what a user can change to remove it
SOURCE_KINDS = (
    "saved",  # what autograd saves for backward, per layer kind
    "checkpointed",  # the inputs of checkpointed layers
    "kv-cache",  # keys and values handed to the model output
    "logits",  # the LM head and the loss, the model output the loop holds
    "working",  # the layer in flight: its input, output and transients
    "recompute",  # a checkpointed layer's forward, played again before its backward
    "gradient",  # the activation gradient flowing back between layers
    "inputs",  # the batch, RoPE's tables, attention masks
    "previous",  # the previous step, kept by the loop's variables
    "in-flight",  # other micro-batches of a pipeline stage
)
_PREVIOUS_OUTPUT = "previous step's model output, until this forward returns"


@dataclass(frozen=True, slots=True)
class Source:
    """One part of the activations at a moment of the step: what it is, its bytes, its
    formula and where the formula comes from (:func:`step_sources`)."""

    name: str
    kind: str  # one of SOURCE_KINDS
    bytes: int
    formula: str
    source: str


_LIVENESS = "engine.graph.simulate (op by op liveness walk of engine.layers)"
_KEPT = {
    "embedding": (
        "saved tensors: the embedding (its LayerNorm input, dropout mask)",
        "b x s x hidden x dtype + 8 b s (norm statistics) + b s hidden (mask)",
        "engine.timeline (embedding_norm, hidden_dropout)",
    ),
    "dense": (
        "saved tensors: {n} layers",
        "per layer: what autograd saves for backward (projections' inputs, attention "
        "output and statistics, MLP inputs, norms' inputs), term by term",
        "engine.layers.decoder_layer / bert_layer",
    ),
    "moe": (
        "saved tensors: {n} MoE layers",
        "per layer: attention's saved tensors, the router, every expert's share of the tokens",
        "engine.layers.decoder_layer (moe)",
    ),
    "checkpointed": (
        "inputs of {n} checkpointed layers",
        "per layer: its input, b x s x hidden x dtype (+ the outputs a per-op policy keeps)",
        "torch.utils.checkpoint; engine.timeline.checkpointed",
    ),
    "kv-cache": (
        "KV cache in the model output ({n} layers)",
        "per layer: 2 x b x s x kv heads x head dim x dtype",
        "engine.stacks: kv_cache_in_outputs (use_cache)",
    ),
}


class _Kept:
    """What the layers so far keep, by the embedding, layer kind, checkpointed input and
    KV cache: the ledger's running count of :func:`_layer_by_layer`'s ``kept_act``."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self.layers: dict[str, int] = {}

    def add(self, key: str, n_bytes: int, layers: int) -> None:
        """``n_bytes`` more under ``key`` from ``layers`` more layers (negative: fewer)."""
        if n_bytes:
            self.bytes[key] = self.bytes.get(key, 0) + n_bytes
            self.layers[key] = self.layers.get(key, 0) + layers

    def only(self, key: str) -> None:
        """Forget every part but ``key``'s."""
        for other in [k for k in self.bytes if k != key]:
            del self.bytes[other], self.layers[other]

    def sources(self) -> list[Source]:
        out = []
        for key, n_bytes in self.bytes.items():
            base = key.removesuffix(TRAINED)
            name, formula, source = _KEPT.get(base, _KEPT["dense"])
            if key != base:
                name = name.replace("layers", "fully trained layers")
            kind = base if base in ("checkpointed", "kv-cache") else "saved"
            out.append(Source(name.format(n=self.layers[key]), kind, n_bytes, formula, source))
        return out


def _work_source(moment: str, n_bytes: int, layer: int | None) -> Source:
    """The block in flight at ``moment``: its working set beyond what earlier layers keep."""
    where = "the embedding" if layer is None else f"layer {layer}"
    if moment == "embedding":
        return Source("embedding output", "working", n_bytes, "b x s x hidden x dtype", _LIVENESS)
    if moment == "forward":
        return Source(
            f"{where} in flight: its input, what it has saved so far, the op's transients",
            "working",
            n_bytes,
            "the highest live bytes of the layer's forward",
            _LIVENESS,
        )
    if moment == "recompute":
        return Source(
            f"recomputing {where}'s forward (checkpointing)",
            "recompute",
            n_bytes,
            "the layer's forward working set, played again before its backward",
            "torch.utils.checkpoint; " + _LIVENESS,
        )
    if moment == "tied gradient":
        return Source(
            "the tied embedding's gradient, summed into the head's",
            "working",
            n_bytes,
            "vocab x hidden x gradient dtype",
            "engine.timeline (tie_word_embeddings)",
        )
    return Source(
        f"{where} in backward: its saved tensors, the output gradient, gradients in flight",
        "working",
        n_bytes,
        "the highest live bytes of the layer's backward",
        _LIVENESS,
    )


def _grad_source(n_bytes: int, layer: int | None) -> Source:
    where = "the embedding output" if layer is None else f"layer {layer}'s output"
    return Source(
        f"gradient flowing back into {where}",
        "gradient",
        n_bytes,
        "b x s x hidden x compute dtype",
        _LIVENESS,
    )


def _head_source(moment: str, n_bytes: int, chunked: bool, last: bool = True) -> Source:
    """The LM head and the loss at ``moment``: ``logits`` (the model has just returned),
    ``forward`` (the loss computed), ``backward``."""
    source = "engine.layers.head_and_loss"
    if not last:
        what = "output sent to the next stage" if moment == "forward" else "gradient received"
        return Source(what, "working", n_bytes, "b x s x hidden x dtype", source)
    formula = (
        "a chunk of rows of b x s x vocab at a time (fused linear cross-entropy)"
        if chunked
        else "b x s x vocab logits in the compute dtype, their fp32 upcast and log-softmax"
    )
    name = {
        "logits": "LM head output: the logits, before the loss",
        "forward": "LM head and loss: the logits and the loss's buffers",
        "backward": "loss and LM head backward: the logits' gradient",
    }[moment]
    return Source(name, "logits", n_bytes, formula, source)


def _output_source(n_bytes: int) -> Source:
    return Source(
        "model output held by the loop (the logits)",
        "logits",
        n_bytes,
        "b x s x vocab in the compute dtype (more with an fp32 upcast)",
        "engine.stacks: outputs_held_through_backward",
    )


def _input_sources(batch: int, rope: int, bool_mask: int, mask: int) -> list[Source]:
    return [
        Source("input ids and labels (int64)", "inputs", batch, "2 x 8 bytes x b x s", "the batch"),
        Source("RoPE's cos and sin", "inputs", rope, "2 x b x s x head dim x dtype", "rotary"),
        Source(
            "sliding-window mask (bool)",
            "inputs",
            bool_mask,
            "b x s x s bytes",
            "engine.specs.window_masks",
        ),
        Source(
            "attention mask (eager attention)",
            "inputs",
            mask,
            "b x s x s x dtype",
            "eager attention's 4-D mask",
        ),
    ]


def _previous_sources(graph: int, output: int) -> list[Source]:
    return [
        Source(
            "previous step's graph: inputs kept by custom autograd functions",
            "previous",
            graph,
            "the inputs 4-bit matmuls keep on their ctx, until this step's loss",
            "engine.timeline.function_kept (previous_step_held)",
        ),
        Source(
            _PREVIOUS_OUTPUT,
            "previous",
            output,
            "the logits (and KV cache) of the previous step",
            "engine.stacks: previous_step_held",
        ),
    ]


def _in_flight_source(n_bytes: int) -> Source:
    return Source(
        "other micro-batches in flight (pipeline schedule) and the receive buffer",
        "in-flight",
        n_bytes,
        "(in flight - 1) x what one micro-batch keeps + b x s x hidden x dtype",
        "engine.estimate.inflight",
    )


def step_sources(*args: Any) -> tuple[tuple[Source, ...], ...]:
    """Each point's activations (:func:`_layer_by_layer`, same arguments) told apart by
    where they come from: the sources of a point add up to its activations, to the byte."""
    ledger: list[tuple[Source, ...]] = []
    _layer_by_layer(*args, ledger=ledger)
    return tuple(ledger)


def _shifted_sources(timeline: Timeline, extra: int) -> tuple[tuple[Source, ...], ...]:
    """The sources of :meth:`Timeline.in_flight`'s points."""
    return tuple(
        (*parts, _in_flight_source(extra)) if p.phase in ("forward", "backward") else parts
        for p, parts in zip(timeline.points, timeline.sources(), strict=True)
    )


def _points(*args: Any) -> tuple[Point, ...]:
    """Every point of the step (:func:`_layer_by_layer`)."""
    points: tuple[Point, ...] = _layer_by_layer(*args)[0]
    return points


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
