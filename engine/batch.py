"""The totals of many scenarios at once, for sweeps: :func:`totals`, :func:`totals_over` and
:func:`totals_over_each`.

An :class:`~memfit.engine.estimate.Estimate` carries what a chart needs: every item, every rank
group, the timeline. A sweep needs eight figures per configuration, :class:`Totals`:

* :func:`totals` -- one scenario's, memoised: ``estimate(scenario)``'s own figures;
* :func:`totals_over` -- one strategy at many shapes (micro-batch size, sequence length,
  gradient accumulation steps), everything else as the scenario has it. What does not
  depend on the shape is built once per strategy -- the mesh, every pipeline stage's
  share of the model state and its step plan (:class:`memfit.engine.timeline.StepPlan`), the
  overheads -- and all its shapes are then a few operations on int64 arrays, one entry
  per shape, every stage at once (:class:`memfit.engine.timeline.Joint`). The figures are
  those of ``estimate()`` to the byte: a shape the arrays might not hold exactly
  (int64 could overflow, a block is simulated directly there, a run of floored gradient
  shares is not monotone there: see :mod:`memfit.engine.timeline`) goes through
  :func:`totals` instead, and so does a shape whose scenario is invalid, which comes back
  as its :class:`~memfit.engine.errors.EstimateError` rather than raised;
* :func:`totals_over_each` -- many strategies, each at its shapes, as :func:`totals_over`
  of each: a sweep's strategies that differ only in their share of the model state (ZeRO
  stage, offload, optimizer) at the same shapes have every stage of all of them evaluated
  in one :class:`~memfit.engine.timeline.Joint`.

The strategy's parts serve every shape because they are the same at every shape:
:func:`memfit.engine.sharding.shard`, :func:`memfit.engine.model_state.model_state` and the mesh
read
no shape field but the sequence length, which the mesh only checks (each length is
checked); a step plan depends on the length only where a sliding window masks it (then
one per mask); and the specs check each shape field on its own
(``tests/engine/test_batch.py`` holds all of it against ``estimate()``).

>>> from memfit.engine.presets import load_gpu, load_model
>>> from memfit.engine.specs import HardwareSpec, Scenario
>>> s = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("rtx-4090")))
>>> small, large, bad = totals_over(s, [(1, 1024, 1), (8, 1024, 1), (0, 1024, 1)])
>>> small.device_bytes < large.device_bytes, large.verdict
(True, 'fits')
>>> print(bad)
training.micro_batch_size: got 0, expected an integer in [1, 65536]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from memfit.engine import memo
from memfit.engine.errors import EstimateError, shown
from memfit.engine.estimate import estimate, peak_phase, verdict
from memfit.engine.overhead import fragmentation, overhead
from memfit.engine.plan import resolve
from memfit.engine.rank import fixed_overheads, inflight, rank_share, state_parts, whole_state
from memfit.engine.sharding import resident_blocks
from memfit.engine.specs import Scenario, TrainingSpec, reshaped, window_masks
from memfit.engine.timeline import KINDS, StepPlan, joint, strategy_key

#: (micro_batch_size, sequence_length, gradient_accumulation_steps)
Shape = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Totals:
    """The figures of one scenario's estimate that a sweep compares (see
    :class:`~memfit.engine.estimate.Estimate` for each)."""

    allocated_bytes: int
    reserved_bytes: int
    device_bytes: int
    capacity_bytes: int
    budget_bytes: int
    #: ``fits`` / ``tight`` / ``oom``, as :attr:`Estimate.verdict`
    verdict: str
    #: as :attr:`Estimate.peak_phase`
    peak_phase: str
    #: host memory of one GPU of the worst rank group, as :attr:`Estimate.host_bytes`
    host_bytes: int


@memo.cached(maxsize=16384)
def totals(scenario: Scenario) -> Totals:
    """The totals of ``estimate(scenario)``, memoised; raises its
    :class:`~memfit.engine.errors.EstimateError` for an invalid scenario."""
    est = estimate(scenario)
    return Totals(
        est.allocated_bytes,
        est.reserved_bytes,
        est.device_bytes,
        est.capacity_bytes,
        est.budget_bytes,
        est.verdict,
        est.peak_phase,
        est.host_bytes,
    )


def totals_over(scenario: Scenario, shapes: Sequence[Shape]) -> list[Totals | EstimateError]:
    """(micro_batch_size, sequence_length, gradient_accumulation_steps) for each point, all
    else from ``scenario``: the totals of each, or the error that makes it invalid."""
    return totals_over_each([(scenario, shapes)])[0]


def totals_over_each(
    items: Sequence[tuple[Scenario, Sequence[Shape]]],
) -> list[list[Totals | EstimateError]]:
    """:func:`totals_over` of each (scenario, shapes) of ``items``, equal to calling it on
    each; strategies at the same shapes whose plans read the same shape quantities (a
    sweep's strategies that differ only in their share of the model state: ZeRO stage,
    offload, optimizer) have their highest points found together, one
    :class:`~memfit.engine.timeline.Joint` for all their plans."""
    outs: list[list[Totals | EstimateError | None]] = []
    # (item, group, its points) of every group that its points are evaluated in
    jobs: list[tuple[int, _Group, list[int]]] = []
    for k, (scenario, shapes) in enumerate(items):
        out: list[Totals | EstimateError | None] = [None] * len(shapes)
        outs.append(out)
        by_seq: dict[int, list[int]] = {}
        for i, shape in enumerate(shapes):
            if _valid_shape(shape):
                by_seq.setdefault(shape[1], []).append(i)
            else:
                out[i] = _one(scenario, shape)
        strategy = _strategy(scenario)
        groups: dict[int, tuple[_Group, list[int]]] = {}  # lengths with the same plans
        for seq, points in by_seq.items():
            group = strategy.group(seq)
            if group is None:  # the strategy is invalid at this length: each its own error
                for i in points:
                    out[i] = _one(scenario, shapes[i])
            else:
                groups.setdefault(id(group), (group, []))[1].extend(points)
        jobs.extend((k, group, points) for group, points in groups.values())
    # the jobs that can be evaluated together: the same shapes, plans alike in what
    # they read of a shape (Joint.moments reads it from the first plan)
    together: dict[tuple[object, ...], list[tuple[int, _Group, list[int]]]] = {}
    for k, group, points in jobs:
        shapes = items[k][1]
        key = (tuple(shapes[i] for i in points), group.reads())
        together.setdefault(key if key[1] is not None else (id(group),), []).append(
            (k, group, points)
        )
    for alike in together.values():
        _, _, points = alike[0]
        shapes = items[alike[0][0]][1]
        batch = np.array([shapes[i][0] for i in points], dtype=np.int64)
        lengths = np.array([shapes[i][1] for i in points], dtype=np.int64)
        accumulation = [shapes[i][2] for i in points]
        found = _Group.totals_of([g for _, g, _ in alike], batch, lengths, accumulation)
        for (k, _, points), totals_k in zip(alike, found, strict=True):
            scenario, shapes = items[k]
            for i, t in zip(points, totals_k, strict=True):
                outs[k][i] = t if t is not None else _one(scenario, shapes[i])
    return cast(list[list[Totals | EstimateError]], outs)  # every shape has its result


def _one(scenario: Scenario, shape: Shape) -> Totals | EstimateError:
    """One shape the slow way: the scenario with that shape, estimated (or its error)."""
    if len(shape) != 3:
        return EstimateError(
            "shapes",
            f"got {shown(shape)}, expected "
            "(micro_batch_size, sequence_length, gradient_accumulation_steps)",
        )
    b, s, a = shape
    try:
        training = dataclasses.replace(
            scenario.training,
            micro_batch_size=b,
            sequence_length=s,
            gradient_accumulation_steps=a,
        )
        return totals(dataclasses.replace(scenario, training=training))
    except EstimateError as error:
        return error


def _valid_shape(shape: Sequence[object]) -> bool:
    """Whether every field of ``shape`` is an integer :class:`TrainingSpec` accepts (each
    is checked alone, as the spec checks it)."""
    if len(shape) != 3 or any(type(v) is not int for v in shape):
        return False  # bool is no int here, whatever it hashes to
    return _valid(*cast(Shape, tuple(shape)))


@memo.cached(maxsize=4096)
def _valid(micro_batch_size: int, sequence_length: int, accumulation: int) -> bool:
    for name, value in (
        ("micro_batch_size", micro_batch_size),
        ("sequence_length", sequence_length),
        ("gradient_accumulation_steps", accumulation),
    ):
        try:
            TrainingSpec(**{name: value})  # type: ignore[arg-type]
        except EstimateError:
            return False
    return True


#: per kind of point (:data:`~memfit.engine.timeline.KINDS`): whether it is the backward's,
#: and its phase (an index into :data:`_PHASES`)
_BACKWARD = tuple(phase == "backward" for phase, _ in KINDS)
_PHASES = ("before", "forward", "backward", "optimizer")
_PHASE = tuple(_PHASES.index(phase) for phase, _ in KINDS)
_OPTIMIZER = _PHASES.index("optimizer")
#: float64 holds every integer below this exactly (the fragmentation share is a float)
_EXACT_FLOAT = 1 << 53
#: the moments of a step other than its forward and backward, each the peak where the
#: highest of them is (the first of equal ones, in this order)
_MOMENTS = ("before", "step", "after")


def _quantities(plan: StepPlan) -> tuple[object, ...]:
    """What turns a shape into ``plan``'s shape quantities
    (:meth:`~memfit.engine.timeline.StepPlan.terms` and ``_values_many``: the routing of
    the tokens, the hidden size, the residual stream's bytes, the sequence parallel split
    and the blocks evaluated at each shape)."""
    ctx = plan.ctx
    return (ctx.topk, ctx.ep, ctx.capacity, plan.hidden_size, plan.res, plan.sp, plan.unfolded)


@dataclass(frozen=True, slots=True)
class _Group:
    """A strategy at the sequence lengths that share its plans (all of them, but where a
    sliding window masks some): its pipeline stages, in order."""

    scenario: Scenario
    cp: int
    schedule: str
    pp: int
    vpp: int
    #: the plan of each distinct stage shape, and each stage's index into them
    plans: tuple[StepPlan, ...]
    index: tuple[int, ...]
    #: per plan: what turns a peak into totals (see :func:`_group`)
    rows: tuple[dict[str, int], ...]

    def reads(self) -> tuple[object, ...] | None:
        """What :meth:`totals_of` reads of this group beyond its plans to evaluate it
        with others at once: the micro-batches in flight (the pipeline), the context
        parallel split of the sequence, and what turns a shape into the shape quantities
        (:meth:`~memfit.engine.timeline.StepPlan.terms`, ``_values_many``), which every
        plan of one :class:`~memfit.engine.timeline.Joint` must share; ``None`` where its
        own plans differ in it (it is then evaluated alone)."""
        keys = {_quantities(plan) for plan in self.plans}
        if len(keys) != 1:
            return None
        return (self.cp, self.schedule, self.pp, self.vpp, *keys)

    def totals(
        self, batch: np.ndarray, seq: np.ndarray, accumulation: Sequence[int]
    ) -> list[Totals | None]:
        """The totals at ``batch[i]`` x ``seq[i]`` x ``accumulation[i]``; ``None`` where
        the arrays do not hold a shape exactly (:meth:`totals_of` of this group alone)."""
        return _Group.totals_of([self], batch, seq, accumulation)[0]

    @staticmethod
    def totals_of(
        groups: Sequence[_Group], batch: np.ndarray, seq: np.ndarray, accumulation: Sequence[int]
    ) -> list[list[Totals | None]]:
        """Each group's totals at ``batch[i]`` x ``seq[i]`` x ``accumulation[i]``;
        ``None`` where the arrays do not hold a shape exactly. The highest points of
        forward and backward come from the plans' forms at every shape at once, the
        plans of every group together where more than one group shares what
        :meth:`reads` names (one :meth:`~memfit.engine.timeline.Joint.moments`); the rest
        is a few integer operations per stage and shape, done in Python integers
        (exact). Where the plans together might not fit int64, each group is
        evaluated alone."""
        first = groups[0]
        local = seq // first.cp
        held = {  # micro-batches in flight at each stage; without a pipeline, one
            a: [inflight(first.schedule, first.pp, s, a, first.vpp) for s in range(first.pp)]
            if first.pp > 1
            else [1]
            for a in set(accumulation)
        }
        holds = [held[a] for a in accumulation]  # shape x stage
        most = max(max(h) for h in holds)
        accumulating = np.array([a > 1 for a in accumulation], dtype=bool)
        plans = tuple(p for g in groups for p in g.plans)
        found = joint(plans).moments(batch, local, most, accumulating)
        if found is None:
            if len(groups) > 1:
                return [g.totals(batch, seq, accumulation) for g in groups]
            return [[None] * len(batch)]
        # per plan x shape
        listed = tuple(
            x.tolist()
            for x in (
                found.kind,
                found.parameters,
                found.gradients,
                found.optimizer_states,
                found.activations,
                found.per_microbatch,
                found.logits,
                found.single,
            )
        )
        out = []
        start = 0
        for g in groups:
            stop = start + len(g.plans)
            mine = tuple(x[start:stop] for x in listed)
            out.append(g._totals(mine, batch, local, holds, most))
            start = stop
        return out

    def _totals(
        self,
        found: tuple[list[list[Any]], ...],
        batch: np.ndarray,
        local: np.ndarray,
        holds: list[list[int]],
        most: int,
    ) -> list[Totals | None]:
        """The totals at each shape from the highest points of forward and backward of
        this group's plans: per plan x shape, the fields of
        :class:`~memfit.engine.timeline.Moments` but ``layer``, in their order."""
        kinds, parameters, gradients, states, activations, per_mb, logits, singles = found
        n = len(batch)
        offloading = any(plan.offload_inputs for plan in self.plans)
        offloaded: list[list[int]] = []  # per plan x shape: one micro-batch's, on the host
        if offloading:  # checkpointed inputs on the host
            b_list, l_list = batch.tolist(), local.tolist()
            largest = max(plan.offloaded_inputs(max(b_list), max(l_list)) for plan in self.plans)
            if max(r["host"] for r in self.rows) + largest * most >= _EXACT_FLOAT:
                return [None] * n
            offloaded = [
                [plan.offloaded_inputs(b, s) for b, s in zip(b_list, l_list, strict=True)]
                for plan in self.plans
            ]
        # the peak of each stage at each shape: the first highest of the point before
        # the step, the highest of forward and backward with the other micro-batches in
        # flight, the optimizer step and the point after zero_grad (Timeline.in_flight)
        peaks: list[list[tuple[int, int, int, int, bool, int]]] = []
        for i in range(n):
            at = []
            for stage, j in enumerate(self.index):
                r = self.rows[j]
                kind = kinds[j][i]
                act = activations[j][i] + (holds[i][stage] - 1) * per_mb[j][i]
                params, grads = parameters[j][i], gradients[j][i]
                top = params + grads + states[j][i] + act
                # a model output held by the loop lives through the optimizer step and
                # zero_grad
                output = logits[j][i]
                before, step, after = r["before"], r["step"] + output, r["after"] + output
                if top > before and top >= step and top >= after:
                    at.append((params, grads, act, _PHASE[kind], _BACKWARD[kind], j))
                    continue
                first = 0 if before >= step and before >= after else 1 if step >= after else 2
                moment = _MOMENTS[first]
                a = r[moment + "_a"] + (output if first else 0)
                at.append((r[moment + "_p"], r[moment + "_g"], a, r[moment + "_phase"], False, j))
            peaks.append(at)
        if max(a for at in peaks for _, _, a, _, _, _ in at) >= _EXACT_FLOAT:
            return [None] * n
        single = [any(column) for column in zip(*singles, strict=True)]
        hw = self.scenario.hardware
        capacity, budget = hw.capacity_bytes, hw.budget_bytes
        out: list[Totals | None] = []
        for i, at in enumerate(peaks):
            if single[i]:
                out.append(None)
                continue
            worst: tuple[int, int, int, int, int] | None = None
            for stage, (p, g, a, phase, backward, j) in enumerate(at):
                # the items at the peak, added up (engine.estimate._items_at_peak)
                r = self.rows[j]
                in_flight = g - r["grad_buffers"]
                buffers = r["backward_buffers"] if backward else 0
                produced = in_flight if r["grad_items"] else min(buffers, in_flight)
                temp = r["temp"] if phase == _OPTIMIZER else 0
                allocated = r["held"] + (p - r["params"]) + produced + temp + a
                reserved = allocated + r["rounding"] + fragmentation(a)
                device = reserved + r["device_extra"]
                host = r["host"] + (offloaded[j][i] * holds[i][stage] if offloading else 0)
                if worst is None or device > worst[2]:  # the first of equally large
                    worst = (allocated, reserved, device, host, phase)
            assert worst is not None  # every strategy has a stage
            allocated, reserved, device, host, phase = worst
            out.append(
                Totals(
                    allocated,
                    reserved,
                    device,
                    capacity,
                    budget,
                    verdict(device, budget, capacity),
                    peak_phase(_PHASES[phase]),
                    host,
                )
            )
        return out


def _with_sequence(scenario: Scenario, seq: int) -> Scenario:
    """``scenario`` at sequence length ``seq``, a length :func:`_valid` accepts
    (:func:`memfit.engine.specs.reshaped`)."""
    return reshaped(scenario, sequence_length=seq)


def _group(scenario: Scenario) -> _Group:
    """The parts of ``scenario`` that hold for every batch size and gradient accumulation
    and every sequence length as masked as its own (raises the scenario's error where it
    is invalid)."""
    resolved = resolve(scenario)
    scenario, mesh = resolved.scenario, resolved.mesh
    training = scenario.training
    whole_state(scenario.model, training)  # estimate() raises its errors here
    slots = resolved.ranks()
    par = training.parallelism
    arch = scenario.hardware.gpu.architecture
    keys: list[tuple[int, int, int, str]] = []
    plans: list[StepPlan] = []
    rows: list[dict[str, int]] = []
    for slot in slots:
        if slot.key in keys:
            continue
        sharded, plan = rank_share(scenario, slot.model, mesh, slot.key[3], slot.stage, slot.chunk)
        parts = state_parts(sharded.state)
        large = resident_blocks(slot.model, training, mesh, slot.key[3])
        extra = overhead(arch, large, 0, scenario.hardware.cuda_runtime)
        _, _, nccl = fixed_overheads(
            arch, large, extra.rounding, extra.context, extra.workspace, mesh
        )
        keys.append(slot.key)
        plans.append(plan)
        moments = dict(zip(_MOMENTS, (plan.before, plan.step, plan.after), strict=True))
        rows.append(
            {
                **{name: point.total for name, point in moments.items()},
                # each of those three, for where it is the peak (the step and the point
                # after zero_grad with the model output held, if it is)
                **{
                    f"{name}_{key}": value
                    for name, point in moments.items()
                    for key, value in (
                        ("p", point.parameters),
                        ("g", point.gradients),
                        ("a", point.activations),
                        ("phase", _PHASES.index(point.phase)),
                    )
                },
                "params": plan.params,
                "temp": plan.temp,
                # the model state items at the peak (parameters, overhead, gradient
                # buffers, optimizer states), the buffers alone, whether there are other
                # gradient items, and FSDP's gradient buffers in backward
                "held": parts.fixed_bytes + parts.buffer_bytes + parts.optimizer_bytes,
                "grad_buffers": parts.buffer_bytes,
                "grad_items": int(bool(parts.grads)),
                "backward_buffers": sharded.gather.grads + sharded.gather.reduce,
                # what lifts allocated to reserved and device bytes, and the host share
                "rounding": extra.rounding,
                "device_extra": extra.device_extra + nccl,
                "host": sum(i.bytes for i in sharded.host),
            }
        )
    index = tuple(keys.index(slot.key) for slot in slots)
    return _Group(
        scenario, par.cp, par.pp_schedule, mesh.pp, mesh.vpp, tuple(plans), index, tuple(rows)
    )


@dataclass(slots=True)
class _Strategy:
    """A scenario without its shape: its groups by sequence length (``None`` where the
    strategy is invalid at that length)."""

    scenario: Scenario
    groups: dict[int, _Group | None] = field(default_factory=dict)
    #: the groups built, by whether a sliding window masks the sequence
    masked: dict[bool, _Group] = field(default_factory=dict)

    def group(self, seq: int) -> _Group | None:
        """The group of length ``seq``. Threads that meet a length at once may each build
        its group; the first one stored stays, and every thread gets it."""
        if seq in self.groups:
            return self.groups[seq]
        group: _Group | None
        try:
            scenario = _with_sequence(self.scenario, seq)
            resolve(scenario)  # the mesh checks the sequence length
            masked = window_masks(scenario.model, seq)
            group = self.masked.get(masked)
            if group is None:
                group = self.masked.setdefault(masked, _group(scenario))
        except EstimateError:
            group = None
        return self.groups.setdefault(seq, group)


#: the strategies met, by the whole scenario but its shape
_STRATEGIES: memo.Table[tuple[object, ...], _Strategy] = memo.Table(f"{__name__}._STRATEGIES", 4096)


def _strategy(scenario: Scenario) -> _Strategy:
    key = (scenario.model, scenario.hardware, strategy_key(scenario.training))
    strategy = _STRATEGIES.get(key)
    if strategy is None:
        strategy = _STRATEGIES.keep(key, _Strategy(scenario))
    return strategy
