"""What one group of ranks holds and plays, whatever the shape: its share of the model
state (:func:`rank_share`), the plan of its step and the step played (:func:`rank_play`),
the overheads that do not depend on the activations (:func:`fixed_overheads`), the model
state as the breakdown takes it (:func:`state_parts`), and how many micro-batches a pipeline
stage holds (:func:`inflight`). The estimate (:mod:`memfit.engine.estimate`) and the batched path
(:mod:`memfit.engine.batch`) both build on these; neither keeps a copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from memfit.engine import memo
from memfit.engine.model_state import BUFFERS, MemoryItem, ModelState, model_state
from memfit.engine.overhead import nccl_bytes
from memfit.engine.plan.mesh import Mesh
from memfit.engine.sharding import Sharded, shard
from memfit.engine.specs import ModelSpec, Scenario, TrainingSpec, window_masks
from memfit.engine.timeline import (
    Gather,
    Stage,
    StepPlan,
    Timeline,
    step_plan,
    step_timeline,
    strategy_key,
)


def inflight(schedule: str, pp: int, stage: int, micro: int, vpp: int = 1) -> int:
    """Micro-batches (chunks, under the interleaved schedule) whose activations pipeline
    stage ``stage`` of ``pp`` holds at once, with ``micro`` micro-batches per step.

    * GPipe (Huang et al. 2019): all forwards before any backward: ``m``;
    * 1F1B (PipeDream-Flush, Narayanan et al. 2021): ``min(pp - s, m)``;
    * zero-bubble ZB-H1 (Qi et al. 2023): the 1F1B memory, by construction;
    * interleaved 1F1B with ``v`` chunks per rank (Narayanan et al. 2021; Megatron's
      ``forward_backward_pipelining_with_interleaving``): the warm-up runs
      ``2 (pp - s - 1) + (v - 1) pp`` chunk forwards, plus the one in flight, at most
      ``m v``. Stage 0 holds ``(v pp + pp - 1)`` chunks of ``L / (v pp)`` layers: the
      ``L/pp (1 + (pp - 1)/(v pp))`` layers of Korthikanti et al. 2022, section 4.2.3.
    """
    if schedule == "gpipe":
        return micro
    if schedule == "interleaved-1f1b":
        return min(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, micro * vpp)
    return min(pp - stage, micro)


#: a rank's share of the model state and its step (:func:`rank_play`)
Played = tuple[Sharded, Timeline]


#: what holds for every shape of a strategy (see :func:`rank_share`), kept between estimates
_KEPT = 4096
_SHARES: memo.Table[tuple[object, ...], tuple[Sharded, StepPlan]] = memo.Table(
    f"{__name__}._SHARES", _KEPT
)
_WHOLE: memo.Table[tuple[object, ...], ModelState] = memo.Table(f"{__name__}._WHOLE", _KEPT)


def rank_share(
    scenario: Scenario,
    model: ModelSpec,
    mesh: Mesh,
    part: str,
    stage: Stage,
    chunk: ModelSpec | None,
) -> tuple[Sharded, StepPlan]:
    """This rank's share of the model state (``model`` is what the rank holds, ``part``
    its pipeline stage's part: :func:`memfit.engine.sharding.shard`) and the plan of its
    step (:func:`memfit.engine.timeline.step_plan`), kept for every shape of the strategy:
    neither reads the micro-batch size, sequence length or gradient accumulation, but the
    plan whether a sliding window masks the sequence."""
    training = scenario.training
    masked = window_masks(model, training.sequence_length)
    key = (model, mesh, part, stage, chunk, masked, strategy_key(training))
    found = _SHARES.get(key)
    if found is None:
        sharded = shard(model_state(model, training, part), scenario, mesh, model, part)
        plan = step_plan(*_step_args(scenario, sharded, stage, chunk or model))
        found = _SHARES.keep(key, (sharded, plan))
    return found


#: the arguments of engine.timeline's step functions for one rank
_StepArgs = tuple[ModelSpec, TrainingSpec, ModelState, Fraction, Fraction, Gather, Stage, int]


def _step_args(scenario: Scenario, sharded: Sharded, stage: Stage, played: ModelSpec) -> _StepArgs:
    """What a rank's step is played and planned from (:func:`memfit.engine.timeline.step_plan`):
    the model its activations are played with, the training, and its share."""
    return (
        played,
        scenario.training,
        sharded.state,
        sharded.grad_share,
        sharded.optimizer_share,
        sharded.gather,
        stage,
        sharded.grad_buffer,
    )


def whole_state(model: ModelSpec, training: TrainingSpec) -> ModelState:
    """The whole model's state (:func:`memfit.engine.model_state.model_state`), kept for every
    shape of the strategy (it reads none)."""
    key = (model, strategy_key(training))
    state = _WHOLE.get(key)
    if state is None:
        state = _WHOLE.keep(key, model_state(model, training))
    return state


def rank_play(
    scenario: Scenario,
    model: ModelSpec,
    mesh: Mesh,
    part: str,
    stage: Stage,
    chunk: ModelSpec | None = None,
) -> Played:
    """This rank's share of the model state and its step: ``model`` is what the rank
    holds, ``chunk`` (interleaved pipeline) the virtual stage its activations are played
    with."""
    sharded, plan = rank_share(scenario, model, mesh, part, stage, chunk)
    return sharded, step_timeline(*_step_args(scenario, sharded, stage, chunk or model), plan)


@memo.cached(maxsize=1024)
def fixed_overheads(
    architecture: str, large_blocks: int, rounding: int, context: int, workspace: int, mesh: Mesh
) -> tuple[MemoryItem, tuple[MemoryItem, ...], int]:
    """The overhead items that do not depend on the activations -- the allocator's
    rounding, and the CUDA context, cuBLAS workspace and NCCL buffers that follow the
    fragmentation item -- and the NCCL bytes."""
    comms = mesh.communicators()
    nccl = nccl_bytes(comms, architecture)
    after = [
        MemoryItem(
            "CUDA context",
            "overhead",
            context,
            f"{context >> 20} MiB for {architecture}",
            "engine.overhead.CONTEXT_MIB",
        ),
        MemoryItem(
            "cuBLAS workspace",
            "overhead",
            workspace,
            f"{workspace >> 20} MiB",
            "CUBLAS_WORKSPACE_CONFIG default",
        ),
    ]
    if nccl:
        after.append(
            MemoryItem(
                "NCCL communicator buffers",
                "overhead",
                nccl,
                ", ".join(f"{c.name} ({c.ranks} ranks)" for c in comms),
                "engine.overhead.nccl_bytes",
            )
        )
    rounded = MemoryItem(
        "allocator rounding (2 MiB blocks)",
        "overhead",
        rounding,
        f"{large_blocks:,} blocks x 1 MiB on average",
        "CUDACachingAllocator kRoundLarge",
    )
    return rounded, tuple(after), nccl


@dataclass(frozen=True, slots=True)
class StateParts:
    """A rank's model-state items as the breakdown at the peak takes them, and their
    bytes: parameters and overhead; gradient buffers that live through the step; the
    other gradients; optimizer states."""

    fixed: tuple[MemoryItem, ...]
    buffers: tuple[MemoryItem, ...]
    grads: tuple[MemoryItem, ...]
    optimizer: tuple[MemoryItem, ...]
    fixed_bytes: int
    buffer_bytes: int
    grad_bytes: int
    optimizer_bytes: int


@memo.cached(maxsize=4096)
def state_parts(state: ModelState) -> StateParts:
    fixed = tuple(i for i in state.items if i.category in ("parameters", "overhead"))
    buffers = tuple(i for i in state.items if i.role in BUFFERS)
    grads = tuple(i for i in state.items if i.category == "gradients" and i.role not in BUFFERS)
    optimizer = tuple(i for i in state.items if i.category == "optimizer_states")
    return StateParts(
        fixed,
        buffers,
        grads,
        optimizer,
        *(sum(i.bytes for i in part) for part in (fixed, buffers, grads, optimizer)),
    )
