"""``estimate(scenario) -> Estimate``: the one entry point of the memory model.

A pure function of a frozen :class:`~memfit.engine.specs.Scenario`; no I/O. The result carries the
named memory items, the three totals (allocated, reserved, device), the verdict against
the device's capacity and the budget line, and -- stated, never silently zero -- the parts
of a training step that this version does not model yet.

>>> from memfit.engine.presets import load_gpu, load_model
>>> from memfit.engine.specs import HardwareSpec, Scenario
>>> est = estimate(Scenario(load_model("gpt2"), HardwareSpec(load_gpu("rtx-4090"))))
>>> est.breakdown["parameters"] >= 124_439_808 * 4  # fp32 weights + autocast copies
True
>>> est.allocated_bytes <= est.reserved_bytes <= est.device_bytes
True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from memfit.engine import memo
from memfit.engine.model_state import CATEGORIES, MemoryItem, ModelState
from memfit.engine.overhead import FRAGMENTATION, overhead
from memfit.engine.plan import Plan, resolve
from memfit.engine.plan.mesh import Mesh
from memfit.engine.plan.ranks import RankSlot
from memfit.engine.rank import (
    Played,
    fixed_overheads,
    inflight,
    rank_play,
    state_parts,
    whole_state,
)
from memfit.engine.sharding import Sharded, resident_blocks
from memfit.engine.specs import ModelSpec, Scenario, TrainingSpec
from memfit.engine.stacks import Conventions, load_stack, refusals
from memfit.engine.steptime import StepTime, step_time
from memfit.engine.timeline import (
    Gather,
    Point,
    Stage,
    Timeline,
    make_ctx,
    step_layers,
)

SCHEMA_VERSION = 1
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class RankGroup:
    """The totals of one distinct group of ranks (a pipeline stage)."""

    group: str
    allocated_bytes: int
    reserved_bytes: int
    device_bytes: int
    peak_phase: str
    peak_layer: int | None
    items: tuple[MemoryItem, ...]
    #: host memory (offload) and NVMe bytes of one GPU of this group
    host_bytes: int = 0
    nvme_bytes: int = 0

    def category_bytes(self, category: str) -> int:
        return sum(i.bytes for i in self.items if i.category == category)


@dataclass(frozen=True, slots=True)
class Estimate:
    """The memory of one training step of a scenario, per GPU, in bytes (integers)."""

    scenario: Scenario
    items: tuple[MemoryItem, ...]
    allocated_bytes: int
    reserved_bytes: int
    device_bytes: int
    capacity_bytes: int
    budget_bytes: int
    peak_phase: str
    peak_layer: int | None
    total_params: int
    trainable_params: int
    host_bytes: int
    bytes_per_trainable_param: float
    bytes_per_frozen_param: float
    bytes_per_param_formula: str
    not_modelled: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    nvme_bytes: int = 0
    #: every distinct rank group (pipeline stages); the headline figures are the worst's
    rank_groups: tuple[RankGroup, ...] = ()
    worst_group: str = "all ranks"
    #: what offload keeps in host memory or on NVMe, per GPU
    host_items: tuple[MemoryItem, ...] = ()
    mesh: Mesh | None = None
    #: host RAM one node needs for offload (every GPU of the node, worst group's share)
    host_node_bytes: int = 0
    #: the user's host RAM per node, when given
    host_capacity_bytes: int | None = None
    #: the worst group's played step (:attr:`timeline` plays its every point)
    steps: Timeline | None = field(default=None, repr=False)

    @property
    def timeline(self) -> tuple[Point, ...]:
        """The step as a sequence of moments, for charts (see :mod:`memfit.engine.timeline`):
        played point by point when first asked for."""
        return self.steps.points if self.steps is not None else ()

    @property
    def host_verdict(self) -> str:
        """``fits`` / ``oom`` for host RAM per node, ``unknown`` without a host figure."""
        if self.host_capacity_bytes is None:
            return "unknown" if self.host_node_bytes else "fits"
        return "fits" if self.host_node_bytes <= self.host_capacity_bytes else "oom"

    @property
    def verdict(self) -> str:
        """``fits`` under the budget line, ``tight`` under capacity, else ``oom``."""
        return verdict(self.device_bytes, self.budget_bytes, self.capacity_bytes)

    @property
    def breakdown(self) -> dict[str, int]:
        """Bytes per category at the peak; the categories sum to ``device_bytes``."""
        sums = dict.fromkeys(CATEGORIES, 0)
        for item in self.items:
            sums[item.category] += item.bytes
        return sums

    @property
    def headroom_bytes(self) -> int:
        """Capacity minus the device total (negative when it does not fit)."""
        return self.capacity_bytes - self.device_bytes

    @property
    def conventions(self) -> Conventions:
        """The training stack's conventions the step ran with (the plan's,
        :func:`memfit.engine.plan.resolve`)."""
        return resolve(self.scenario).conventions

    @property
    def time(self) -> StepTime:
        """The step time of the scenario (:mod:`memfit.engine.steptime`), with what it
        assumed of the GPU (:func:`memfit.engine.steptime.device_notes`) among its notes."""
        return step_time(self.scenario)

    def to_dict(self) -> dict[str, Any]:
        """The stable ``--json`` shape (``memfit_estimate`` version 1)."""
        breakdown: dict[str, Any] = dict(self.breakdown)
        breakdown["items"] = [
            {
                "name": i.name,
                "category": i.category,
                "bytes": i.bytes,
                "formula": i.formula,
                "source": i.source,
            }
            for i in self.items
        ]
        totals = {
            "allocated_bytes": self.allocated_bytes,
            "reserved_bytes": self.reserved_bytes,
            "device_bytes": self.device_bytes,
        }
        return {
            "memfit_estimate": SCHEMA_VERSION,
            **totals,
            "capacity_bytes": self.capacity_bytes,
            "budget_bytes": self.budget_bytes,
            "verdict": self.verdict,
            "peak_phase": self.peak_phase,
            "peak_layer": self.peak_layer,
            "breakdown": breakdown,
            "model": {
                "name": self.scenario.model.name,
                "label": self.scenario.model.label,
                "family": self.scenario.model.family,
                "read_as": self.scenario.model.read_as,
                "text_model_of": self.scenario.model.text_model_of,
            },
            "parameters": {"total": self.total_params, "trainable": self.trainable_params},
            "bytes_per_parameter": {
                "trainable": self.bytes_per_trainable_param,
                "frozen": self.bytes_per_frozen_param,
                "formula": self.bytes_per_param_formula,
            },
            "host_bytes": self.host_bytes,
            "nvme_bytes": self.nvme_bytes,
            "host": {
                "per_node_bytes": self.host_node_bytes,
                "capacity_bytes": self.host_capacity_bytes,
                "verdict": self.host_verdict,
            },
            "host_items": [
                {"name": i.name, "category": i.category, "bytes": i.bytes} for i in self.host_items
            ],
            "mesh": self.mesh.as_dict() if self.mesh else None,
            "time": self.time.as_dict(),
            "stack": self.conventions.stack,
            "conventions": [
                {"field": c.field, "value": c.value, "origin": c.origin, "why": c.why}
                for c in self.conventions.used
            ],
            "worst_group": self.worst_group,
            "ranks": [
                {
                    "group": r.group,
                    "allocated_bytes": r.allocated_bytes,
                    "reserved_bytes": r.reserved_bytes,
                    "device_bytes": r.device_bytes,
                    "peak_phase": r.peak_phase,
                    "peak_layer": r.peak_layer,
                    "host_bytes": r.host_bytes,
                    "nvme_bytes": r.nvme_bytes,
                    "breakdown": {c: r.category_bytes(c) for c in CATEGORIES},
                }
                for r in self.rank_groups
            ]
            or [{"group": "all ranks", **totals}],
            "not_modelled": list(self.not_modelled),
            "warnings": list(self.warnings),
            "timeline": [
                {
                    "phase": p.phase,
                    "layer": p.layer,
                    "label": p.label,
                    "bytes": p.total,
                    "parameters": p.parameters,
                    "gradients": p.gradients,
                    "optimizer_states": p.optimizer_states,
                    "activations": p.activations,
                }
                for p in self.timeline
            ],
        }


def verdict(device_bytes: int, budget_bytes: int, capacity_bytes: int) -> str:
    """``fits`` under the budget line, ``tight`` under capacity, else ``oom``."""
    if device_bytes <= budget_bytes:
        return "fits"
    if device_bytes <= capacity_bytes:
        return "tight"
    return "oom"


def peak_phase(phase: str) -> str:
    """The phase named for a peak at ``phase``: the point before the step holds the model
    state alone, and is the highest only when the optimizer step holds as much."""
    return phase if phase != "before" else "optimizer"


def not_modelled(scenario: Scenario) -> tuple[str, ...]:
    """The parts of this scenario's step that the estimate leaves out, in words."""
    notes: list[str] = []
    p = scenario.training.parallelism
    if p.sequence_parallel and scenario.model.architecture == "encoder" and p.tp > 1:
        notes.append("sequence parallelism of encoder layers (their activations stay whole)")
    if p.ep > 1:
        notes.append(
            "expert-parallel load imbalance beyond expert_capacity_factor; the router's "
            "auxiliary-loss tensors"
        )
    off = scenario.training.offload
    if "nvme" in (off.optimizer, off.parameters):
        notes.append(
            "ZeRO-Infinity's pinned swap buffers in host memory (aio buffer_count x buffer_size)"
        )
    if p.tp > 1 and p.framework == "pytorch":
        notes.append(
            "DTensor returns a vocabulary-parallel embedding's gradient whole (V x h) on "
            "every rank; counted here as Megatron's V/tp x h"
        )
    if p.pp > 1 and p.pp_schedule == "zero-bubble":
        notes.append("zero-bubble schedules other than ZB-H1 (ZB-H2/ZB-V hold about twice)")
    if scenario.model.text_model_of:
        notes.append(
            f"the vision tower and projector of {scenario.model.text_model_of} (only its "
            "text model is counted)"
        )
    return tuple(notes)


@dataclass(frozen=True, slots=True)
class _Rank:
    """One distinct rank group's result (stages of one shape and position share it)."""

    items: tuple[MemoryItem, ...]
    allocated: int
    reserved: int
    device: int
    timeline: Timeline
    sharded: Sharded
    #: what one GPU keeps in host memory: its share of the offloaded model state and,
    #: under activation offload, the checkpointed layers' inputs
    host: tuple[MemoryItem, ...]

    @property
    def host_bytes(self) -> int:
        return sum(i.bytes for i in self.host)

    @property
    def nvme_bytes(self) -> int:
        return sum(i.bytes for i in self.sharded.nvme)

    def group(self, name: str) -> RankGroup:
        peak = self.timeline.peak
        return RankGroup(
            name,
            self.allocated,
            self.reserved,
            self.device,
            peak.phase,
            peak.layer,
            self.items,
            self.host_bytes,
            self.nvme_bytes,
        )


_FRAGMENTATION = f"{FRAGMENTATION:.0%} of peak activations"


def _rank(
    scenario: Scenario,
    model: ModelSpec,
    mesh: Mesh,
    played: Played,
    part: str,
    stage: Stage,
    chunk: ModelSpec | None = None,
) -> _Rank:
    """One rank group from its :func:`rank_play`: the items at the peak, the overheads that
    lift allocated to reserved and device bytes, and what offload keeps on the host.
    ``part`` is the stage's share of the model, as :func:`rank_play` had it."""
    sharded, timeline = played
    peak = timeline.peak
    items = _items_at_peak(sharded.state, timeline, sharded.gather, scenario.training)
    allocated = sum(i.bytes for i in items)
    large_blocks = resident_blocks(model, scenario.training, mesh, part)
    arch = scenario.hardware.gpu.architecture
    extra = overhead(arch, large_blocks, peak.activations, scenario.hardware.cuda_runtime)
    rounded, after, nccl = fixed_overheads(
        arch, large_blocks, extra.rounding, extra.context, extra.workspace, mesh
    )
    fragmentation = MemoryItem(
        "allocator fragmentation",
        "overhead",
        extra.fragmentation,
        _FRAGMENTATION,
        "engine.overhead",
    )
    items += (rounded, fragmentation, *after)
    reserved = allocated + extra.reserved_extra
    device = reserved + extra.device_extra + nccl
    host = sharded.host
    offloaded = _offloaded_activations(chunk or model, scenario.training, stage)
    if offloaded:
        host += (
            MemoryItem(
                "checkpointed layer inputs (offloaded to CPU, pinned)",
                "activations",
                offloaded,
                f"checkpointed layers x b s h x {stage.inflight} in flight",
                "activation checkpoint offload (torch.autograd.graph.save_on_cpu)",
            ),
        )
    return _Rank(tuple(items), allocated, reserved, device, timeline, sharded, host)


def _offloaded_activations(model: ModelSpec, training: TrainingSpec, stage: Stage) -> int:
    """Host bytes of the checkpointed layers' inputs under activation offload."""
    if training.offload.activations != "cpu":
        return 0
    ctx = make_ctx(model, training)
    layers = sum(step_layers(model, training, ctx, stage.first)[1])
    return layers * ctx.hidden_bytes(model.hidden_size) * stage.inflight


def _stages(
    scenario: Scenario, model: ModelSpec, mesh: Mesh, slots: tuple[RankSlot, ...]
) -> list[tuple[str, _Rank]]:
    """Every pipeline stage by name (one group when pp = 1); stages alike share a result.
    ``slots`` are the plan's rank slots (:meth:`memfit.engine.plan.Plan.ranks`)."""
    par = scenario.training.parallelism
    if mesh.pp == 1:
        whole = slots[0].stage
        played = rank_play(scenario, model, mesh, "all", whole)
        return [(slots[0].name, _rank(scenario, model, mesh, played, "all", whole))]
    micro = scenario.training.gradient_accumulation_steps
    # stages of the same shape are played once; their schedule positions differ only in
    # the micro-batches in flight (Timeline.in_flight), and equal ranks are built once
    plays: dict[tuple[int, int, int, str], Played] = {}
    ranks: dict[tuple[int, int, int, str, int], _Rank] = {}
    out = []
    for s, slot in enumerate(slots):
        key = slot.key
        if key not in plays:
            part = key[3]
            plays[key] = rank_play(scenario, slot.model, mesh, part, slot.stage, slot.chunk)
        sharded, timeline = plays[key]
        held = inflight(par.pp_schedule, mesh.pp, s, micro, mesh.vpp)
        if (*key, held) not in ranks:
            stage = dataclasses.replace(slot.stage, inflight=held)
            played = (sharded, timeline.in_flight(held - 1))
            ranks[(*key, held)] = _rank(
                scenario, slot.model, mesh, played, key[3], stage, slot.chunk
            )
        out.append((slot.name, ranks[(*key, held)]))
    return out


@dataclass(frozen=True, slots=True)
class _Ready:
    """What an estimate of a scenario finds before it plays its stages: the mesh, the
    whole model's state, what one rank holds, the stages' layout, the hardware's
    figures and what is not modelled."""

    mesh: Mesh
    whole: ModelState
    model: ModelSpec
    slots: tuple[RankSlot, ...]
    capacity: int
    budget: int
    host_capacity: int | None
    not_modelled: tuple[str, ...]


@memo.cached(maxsize=4096)
def _prepared(plan: Plan) -> _Ready:
    scenario, mesh = plan.scenario, plan.mesh
    whole = whole_state(scenario.model, scenario.training)
    model, slots = plan.rank_model(), plan.ranks()
    hw = scenario.hardware
    notes = not_modelled(scenario)
    return _Ready(
        mesh, whole, model, slots, hw.capacity_bytes, hw.budget_bytes, hw.host_capacity_bytes, notes
    )


def estimate(scenario: Scenario) -> Estimate:
    """Estimate the per-GPU memory of one training step of ``scenario``.

    With pipeline parallelism every stage is estimated (its schedule decides how many
    micro-batches each keeps in flight, :func:`inflight`); the worst stage is the headline
    and decides the verdict, and ``ranks`` lists them all.
    """
    plan = resolve(scenario)
    given, scenario = scenario, plan.scenario
    ready = _prepared(plan)
    mesh, whole = ready.mesh, ready.whole
    stages = _stages(scenario, ready.model, mesh, ready.slots)
    worst_name, worst = max(stages, key=lambda nr: nr[1].device)
    distinct = {id(r): r for _, r in stages}.values()
    peak = worst.timeline.peak
    state, sharded = worst.sharded.state, worst.sharded
    return Estimate(
        scenario=given,
        items=worst.items,
        allocated_bytes=worst.allocated,
        reserved_bytes=worst.reserved,
        device_bytes=worst.device,
        capacity_bytes=ready.capacity,
        budget_bytes=ready.budget,
        peak_phase=peak_phase(peak.phase),
        peak_layer=peak.layer,
        total_params=whole.total_params,
        trainable_params=whole.trainable_params,
        host_bytes=worst.host_bytes,
        nvme_bytes=worst.nvme_bytes,
        host_items=worst.host + sharded.nvme,
        mesh=mesh,
        host_node_bytes=scenario.hardware.gpus_per_node * max(r.host_bytes for r in distinct),
        host_capacity_bytes=ready.host_capacity,
        bytes_per_trainable_param=state.bytes_per_trainable_param,
        bytes_per_frozen_param=state.bytes_per_frozen_param,
        bytes_per_param_formula=state.bytes_per_param_formula,
        not_modelled=ready.not_modelled,
        warnings=state.warnings + stack_warnings(scenario),
        rank_groups=tuple(rank.group(name) for name, rank in stages),
        worst_group=worst_name,
        steps=worst.timeline,
    )


def stack_warnings(scenario: Scenario) -> tuple[str, ...]:
    """What of the scenario its training stack cannot run, a sentence each (the stack's
    abilities, :mod:`memfit.engine.abilities`): estimated all the same, and said."""
    found = refusals(scenario)
    if not found:
        return ()
    label = load_stack(scenario.training.stack).label
    return tuple(r.sentence(label) for r in found)


def _temporaries(training: TrainingSpec, nbytes: int) -> MemoryItem:
    """The optimizer step's transient bytes, as :func:`memfit.engine.timeline.context.
    optimizer_temporaries` counts them for ``training``'s optimizer."""
    if training.optimizer == "paged-adamw-8bit":
        return MemoryItem(
            "paged optimizer states of the parameter being updated", "optimizer_states",
            nbytes, "the largest parameter's 8-bit states, prefetched to the GPU",
            "bitsandbytes Optimizer8bit.prefetch_state",
        )  # fmt: skip
    if training.optimizer == "adamw" and training.optimizer_impl == "foreach":
        return MemoryItem(
            "optimizer temporaries (foreach sqrt)", "optimizer_states", nbytes,
            "one state-sized tensor per parameter", "torch.optim.adamw._multi_tensor_adamw",
        )  # fmt: skip
    return MemoryItem(
        "optimizer temporaries (one parameter at a time)", "optimizer_states", nbytes,
        "the largest parameter's worth", "torch.optim single-tensor step",
    )  # fmt: skip


def _items_at_peak(
    state: ModelState, timeline: Timeline, gather: Gather, training: TrainingSpec
) -> list[MemoryItem]:
    """The named items live at the peak; they add up to the allocated bytes."""
    peak = timeline.peak
    parts = state_parts(state)
    items = list(parts.fixed)
    if timeline.autocast_copies and gather.active:
        items.append(
            MemoryItem(
                "gathered parameter units (root, current and prefetched layers)",
                "parameters",
                timeline.autocast_copies,
                "units in the gathering dtype, with their all-gather buffers",
                "engine.sharding.gather_buffers",
            )
        )
    elif timeline.autocast_copies:
        items.append(
            MemoryItem(
                "autocast weight copies (16-bit)",
                "parameters",
                timeline.autocast_copies,
                "weights cast for the forward, kept until their backward",
                "torch.amp autocast weight cache",
            )
        )
    # buffers that live through the step are always there, whole
    items += parts.buffers
    grad_items, total_grads = parts.grads, parts.grad_bytes
    # FSDP's gradient buffers (a layer's unsharded gradients, the reduce-scatter input)
    buffers = gather.grads + gather.reduce if peak.phase == "backward" else 0
    in_flight = peak.gradients - parts.buffer_bytes
    reduce = min(buffers, in_flight)
    produced = in_flight - reduce
    if produced >= total_grads:
        if training.gradient_accumulation_steps > 1 and peak.phase in ("forward", "backward"):
            # a later micro-batch: the earlier ones' gradients, summed into until the step
            grad_items = tuple(
                dataclasses.replace(i, name=f"{i.name}, accumulated over the micro-batches")
                for i in grad_items
            )
        items += grad_items
        produced -= total_grads
    if produced and grad_items:
        first = grad_items[0]
        share = f"{produced / total_grads:.0%}" if total_grads else "part"
        items.append(
            MemoryItem(
                f"{first.name}, {share} produced at the peak",
                "gradients",
                produced,
                first.formula,
                first.source,
            )
        )
    if reduce:
        items.append(
            MemoryItem(
                "a layer's unsharded gradients and reduce-scatter input",
                "gradients",
                reduce,
                "largest layer x (gradient dtype + reduce dtype)",
                "engine.sharding.gather_buffers (FSDP2 foreach_reduce)",
            )
        )
    items += parts.optimizer
    if timeline.optimizer_temp:
        items.append(_temporaries(training, timeline.optimizer_temp))
    if peak.activations:
        # the model output exists from the LM head on: through backward where the loop
        # holds it, and through the optimizer step
        after_head = peak.phase != "forward" or peak.layer is None
        logits = min(timeline.logits, peak.activations) if after_head else 0
        if logits:
            items.append(
                MemoryItem(
                    "model output held by the loop (logits, KV cache)",
                    "activations",
                    logits,
                    "b x s x vocab in the compute dtype (+ keys and values per layer)",
                    "engine.stacks: outputs_held_through_backward, kv_cache_in_outputs",
                )
            )
        items.append(
            MemoryItem(
                f"activations and temporaries at the peak ({peak.phase}"
                + (f", layer {peak.layer})" if peak.layer is not None else ")"),
                "activations",
                peak.activations - logits,
                "what the layers saved for backward (or their inputs, checkpointed), the LM "
                "head and loss's buffers, the block in flight; told apart by source: "
                "engine.explain (memfit estimate --activations)",
                "engine.layers (term by term from the modules), engine.timeline",
            )
        )
    return items
