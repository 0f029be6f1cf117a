"""One training step as a timeline of allocations; the peak is its highest point.

The step is what a PyTorch training loop does (``out = model(ids, labels=ids)``,
``out.loss.backward()``, ``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``):

1. **before** -- weights (and NF4 base weights), optimizer states from earlier steps;
   gradients are ``None``;
2. **forward** -- the embedding, then every layer in order: each keeps what autograd saved
   (and under autocast the 16-bit weight copies, which autocast's cache holds until the
   forward ends, and those backward saved until the layer's backward) and passes on its
   output; inside a layer the transient tensors push the level higher for a moment
   (:mod:`memfit.engine.graph` plays each layer op by op, :mod:`memfit.engine.layers` writes the
   ops);
   then the LM head and the loss;
3. **backward** -- in reverse: each layer (recomputed first under checkpointing) frees
   what it saved and leaves its parameter gradients (``.grad``) behind;
4. **optimizer** -- all gradients and states live, plus the optimizer's temporaries
   (``foreach`` AdamW allocates ``sqrt(exp_avg_sq)`` for every parameter at once; ``fused``
   allocates nothing); then the gradients are freed.

**Gradient accumulation.** With more than one micro-batch a step, the timeline is the last
micro-batch's: backward sums each gradient into ``.grad`` and frees nothing until the
optimizer step, so every forward and backward point after the first micro-batch has all
of the rank's gradients live (:attr:`StepPlan.accumulated`), where the first has only
those produced so far. Every later point is at least the first's, so the last
micro-batch's peak is the step's (traced on an H200: two and four micro-batches peak alike,
1.8-7.7 % above one).

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

**One description.** The step is written once, in
:class:`~memfit.engine.timeline.compiled._Compiler`: played with every layer a run of its
own, it gives every point as linear forms with the sources of its activations
(:meth:`StepPlan.every`); with runs, the candidates for the highest point
(:meth:`StepPlan.forms`). Every point at one shape (:func:`_layer_by_layer`, what
``explain`` reads) and the highest point at one or many shapes (:meth:`StepPlan.play`,
:class:`Joint`) are evaluations of the same forms.

**One plan for every shape.** Each kept point is a linear form in a few shape quantities:
the shape terms of the block profiles (b s, b s^2, ... -- :data:`~memfit.engine.graph.TERMS`)
and the hidden-size tensors between blocks; a block's peak is the largest of its
profile's forms, so a point that holds it is kept once per form. A :class:`StepPlan`
holds these forms, built once per model, strategy (everything but the micro-batch size,
sequence length and gradient accumulation) and rank share; :meth:`StepPlan.play`
evaluates them at one shape (one matrix product) and :class:`Joint` at many shapes and
for every pipeline stage at once (:mod:`memfit.engine.batch`).

>>> from memfit.engine.model_state import model_state
>>> from memfit.engine.presets import load_model
>>> from memfit.engine.specs import TrainingSpec
>>> model, training = load_model("gpt2"), TrainingSpec(micro_batch_size=2)
>>> timeline = step_timeline(model, training, model_state(model, training))
>>> timeline.peak == max(timeline.points, key=lambda p: p.total)
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from fractions import Fraction
from functools import partial
from operator import attrgetter
from typing import Any

from memfit.engine import memo
from memfit.engine.model_state import ModelState
from memfit.engine.specs import ModelSpec, TrainingSpec, window_masks
from memfit.engine.timeline.blocks import (
    _direct,
    _profile,
    block_result,
    head_block,
    layer_block,
)
from memfit.engine.timeline.compiled import KINDS
from memfit.engine.timeline.context import (
    Gather,
    Stage,
    checkpointed,
    embedding_output_grad,
    make_ctx,
    recomputed_layers,
    step_layers,
)
from memfit.engine.timeline.points import Point, Timeline, _total
from memfit.engine.timeline.sources import SOURCE_KINDS, Source
from memfit.engine.timeline.stepplan import StepPlan, joint

__all__ = [
    "KINDS",
    "SHAPE_FIELDS",
    "SOURCE_KINDS",
    "Gather",
    "Point",
    "Source",
    "Stage",
    "StepPlan",
    "Timeline",
    "_direct",
    "_points",
    "_profile",
    "block_result",
    "checkpointed",
    "embedding_output_grad",
    "head_block",
    "joint",
    "layer_block",
    "make_ctx",
    "played_step",
    "recomputed_layers",
    "step_layers",
    "step_plan",
    "step_sources",
    "step_timeline",
    "strategy_key",
]


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

    With data-parallel sharding (:mod:`memfit.engine.sharding`) ``state`` is this rank's share,
    ``grad_share`` the share of each gradient kept as backward produces it (ZeRO-2/3
    reduce-scatter the rest away), ``optimizer_share`` the share of the optimizer's
    temporaries, and ``gather`` the all-gathered parameter units and communication
    buffers of ZeRO-3 / FSDP. ``grad_buffer`` is gradient memory that lives through the whole
    step (Megatron's fp32 ``main_grad``, DeepSpeed's fp32 partition and reduce bucket).
    With ``offload.activations = "cpu"`` the inputs of checkpointed layers wait in host
    memory, not on the GPU. ``plan`` is :func:`step_plan` of the same arguments, when the
    caller has it. The plan is built once per model, strategy and rank share, and plays the
    step at every shape.
    """
    args = (model, training, state, grad_share, optimizer_share, gather, stage, grad_buffer)
    replay = partial(_points, *args)
    plan = plan or step_plan(*args)
    seq = training.sequence_length // training.parallelism.cp
    accumulating = training.gradient_accumulation_steps > 1
    return plan.play(
        training.micro_batch_size, seq, replay, partial(step_sources, *args), accumulating
    )


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
    through whether a sliding window masks it (:func:`memfit.engine.specs.window_masks`)."""
    args = (model, training, state, grad_share, optimizer_share, gather, stage, grad_buffer)
    key = _plan_key(*args)
    return _PLANS.get(key) or _PLANS.keep(key, StepPlan.build(*args))


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
    """Every point of one step (see :func:`step_timeline` for the arguments): what
    :attr:`Timeline.points` holds -- its plan's every point evaluated at the shape
    (:meth:`StepPlan.points_at`) -- what one micro-batch keeps, the logits held, the model
    state's parameters and the optimizer's temporaries. With a ``ledger``, each point's
    activations told apart by where they come from (:class:`Source`), one tuple per
    point, are appended to it: what :func:`step_sources` returns."""
    args = (model, training, state, grad_share, optimizer_share, gather, stage, grad_buffer)
    plan = step_plan(*args)
    seq = training.sequence_length // training.parallelism.cp
    points, per_microbatch, held, sources = plan.points_at(
        training.micro_batch_size,
        seq,
        explain=ledger is not None,
        accumulating=training.gradient_accumulation_steps > 1,
    )
    if ledger is not None:
        ledger.extend(sources)
    return points, per_microbatch, held, plan.params, plan.temp


def step_sources(*args: Any) -> tuple[tuple[Source, ...], ...]:
    """Each point's activations (:func:`_layer_by_layer`, same arguments) told apart by
    where they come from: the sources of a point add up to its activations, to the byte."""
    ledger: list[tuple[Source, ...]] = []
    _layer_by_layer(*args, ledger=ledger)
    return tuple(ledger)


def _points(*args: Any) -> tuple[Point, ...]:
    """Every point of the step (:func:`_layer_by_layer`)."""
    points: tuple[Point, ...] = _layer_by_layer(*args)[0]
    return points


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
    """:func:`step_timeline` from its every point (:func:`_layer_by_layer`), not from the
    candidates for its highest point."""
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
