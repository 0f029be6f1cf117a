"""The strategy space around a scenario: every configuration, its memory and its speed.

A sweep varies what a user can change without changing the model or what it learns --
precision, optimizer, checkpointing, ZeRO/FSDP stage, tensor, pipeline and context
parallel sizes, optimizer offload and the micro-batch -- over one or several GPU types
and counts. Gradient accumulation keeps the global batch (in sequences) of the scenario:
a configuration whose micro-batch times data-parallel size does not divide it is left
out, as is any the engine rejects and any the scenario's training stack cannot run (its
abilities, :mod:`memfit.engine.abilities`: no pipeline stages under the Hugging Face
Trainer). Each point carries the device total, the verdict and
the step time (:mod:`memfit.engine.steptime`); :func:`pareto` picks the configurations no other
beats on both memory and speed.

>>> from memfit.engine.presets import load_gpu, load_model
>>> from memfit.engine.specs import HardwareSpec, Scenario, TrainingSpec
>>> s = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("l4")),
...              TrainingSpec(gradient_accumulation_steps=2))
>>> points = sweep(s, Space(micro_batches=(1, 2)))
>>> len(points) > 1 and all(p.device_bytes > 0 for p in points)
True
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import io
import itertools
import math
import os
import pickle
import re
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from memfit.engine import changes, specs
from memfit.engine.batch import Totals, totals, totals_over_each
from memfit.engine.errors import EstimateError, shown
from memfit.engine.scenario_io import scenario_to_dict
from memfit.engine.solve import hardware_with
from memfit.engine.specs import PARALLEL_AXES, WORLD_AXES, OffloadSpec, ParallelismSpec, Scenario
from memfit.engine.stacks import load_stack, new_refusal, refusals, stacks_that_can
from memfit.engine.steptime import StepTime, step_time, step_times

#: the parallel axes a sweep varies (:attr:`memfit.engine.specs.ParallelAxis.sweep`): its
#: CSV has a column for each
SWEPT_AXES = tuple(a.key for a in PARALLEL_AXES if a.sweep)
T = TypeVar("T")
#: the columns of a sweep's CSV read off a point's step time
TIME_FIELDS = ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "bound")
#: the columns of a sweep's CSV
ROW_FIELDS = (
    "gpu",
    "gpus",
    "precision",
    "optimizer",
    "checkpointing",
    "zero_stage",
    *SWEPT_AXES,
    "offload",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "device_bytes",
    "budget_bytes",
    "verdict",
    *TIME_FIELDS,
)
#: one GPU type and count: (GPU preset, GPUs per node, nodes)
Hardware = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class Space:
    """The values each axis takes; an empty axis keeps the scenario's value."""

    precisions: tuple[str, ...] = ()
    optimizers: tuple[str, ...] = ()
    checkpointing: tuple[str, ...] = ()
    zero_stages: tuple[int, ...] = ()
    #: the sizes of each parallel axis swept, by its key (``(("tp", (1, 2)),)``)
    parallel: tuple[tuple[str, tuple[int, ...]], ...] = ()
    offload: tuple[str, ...] = ()
    micro_batches: tuple[int, ...] = ()
    hardware: tuple[Hardware, ...] = ()

    def sizes(self, key: str) -> tuple[int, ...]:
        """The sizes the parallel axis ``key`` takes (empty: the scenario's)."""
        return dict(self.parallel).get(key, ())


def _powers(limit: int) -> tuple[int, ...]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return tuple(out)


def global_batch(scenario: Scenario) -> int:
    """Sequences per optimizer step: micro-batch x accumulation x data-parallel size."""
    t, p = scenario.training, scenario.training.parallelism
    dp = scenario.hardware.world_size // p.model_parallel
    return t.micro_batch_size * t.gradient_accumulation_steps * max(1, dp)


#: the changes whose values the sweep's precision and checkpointing axes take, beside the
#: scenario's own (and no checkpointing)
PRECISION_CHANGES = ("mixed-precision", "pure-bf16")
CHECKPOINTING_CHANGES = ("selective-checkpointing", "checkpointing")


def default_space(scenario: Scenario) -> Space:
    """The space a user usually weighs: the precisions of the registry's precision changes
    (mixed and pure bf16; the scenario's own too, fp32 say), its optimizer and 8-bit AdamW
    where that change applies, no/selective/full checkpointing, every ZeRO stage (a
    strategy keeps one only where it shards something: :func:`memfit.engine.changes.zero_refusal`),
    tp up to a node, pp and cp up to 8 (cp only for sequences of 8k and more), optimizer
    offload, and power-of-two micro-batches up to the global batch (at most 64)."""
    t, hw = scenario.training, scenario.hardware
    precisions = tuple(str(c.value("precision")) for c in changes.pick(PRECISION_CHANGES))
    if t.precision not in precisions:
        precisions = (t.precision, *precisions)
    eight_bit = changes.BY_ID["8bit-optimizer"]
    optimizers: tuple[str, ...] = (t.optimizer,)
    if eight_bit.applies(scenario):
        optimizers += (str(eight_bit.value("optimizer")),)
    ckpt = changes.pick(CHECKPOINTING_CHANGES)
    checkpointing = ("none", *(str(c.value("activation_checkpointing")) for c in ckpt))
    world = hw.world_size
    dividing = tuple(n for n in _powers(8) if world % n == 0)
    rules = {
        "node": tuple(n for n in dividing if n <= hw.gpus_per_node),
        "8": dividing,
        "long": dividing if t.sequence_length >= 8192 else (1,),
    }
    return Space(
        precisions=precisions,
        optimizers=optimizers,
        checkpointing=checkpointing,
        zero_stages=(0, 1, 2, 3),
        parallel=tuple((a.key, rules[a.sweep]) for a in PARALLEL_AXES if a.sweep),
        offload=("none", "cpu"),
        micro_batches=_powers(min(64, global_batch(scenario))),
    )


#: what a user can lock, so that no plan changes it, and the changes of the registry
#: (:mod:`memfit.engine.changes`) that would: the sweep keeps the scenario's value of a
#: locked axis and make-it-fit leaves out those changes
LOCKS: dict[str, tuple[str, ...]] = {
    "precision": ("mixed-precision", "pure-bf16"),
    "optimizer": ("8bit-optimizer",),
    "method": ("qlora", "lora"),
    "loss": ("chunked-loss",),
    "framework": (),
    "gpus": ("more-gpus",),
}


#: each lock in the app's words
LOCK_WORDS = {
    "precision": "Precision",
    "optimizer": "Optimizer",
    "method": "Training method",
    "loss": "Loss",
    "framework": "Framework",
    "gpus": "GPU count",
}


def check_locks(locks: Sequence[str]) -> tuple[str, ...]:
    """``locks`` checked against :data:`LOCKS` (an unknown one is an error naming it)."""
    for lock in locks:
        if lock not in LOCKS:
            raise EstimateError("--lock", f"got {lock!r}, expected any of {', '.join(LOCKS)}")
    return tuple(locks)


def locked(space: Space, scenario: Scenario, locks: Sequence[str]) -> Space:
    """``space`` with the locked axes held at the scenario's values."""
    t = scenario.training
    held: dict[str, tuple[Any, ...]] = {}
    if "precision" in locks:
        held["precisions"] = (t.precision,)
    if "optimizer" in locks:
        held["optimizers"] = (t.optimizer,)
    return dataclasses.replace(space, **held)


#: one strategy of a sweep: its scenario and the (micro-batch, sequence length,
#: accumulation) shapes it is evaluated at
Strategy = tuple[Scenario, list[tuple[int, int, int]]]


def strategies(
    scenario: Scenario, space: Space | None = None, beyond: list[Scenario] | None = None
) -> Iterator[Strategy]:
    """Every strategy of ``space`` around ``scenario`` whose fields are valid and that the
    scenario's training stack can run, with the micro-batches that keep the global batch;
    the engine may still reject a layout or a shape (:func:`sweep` leaves those out).
    The strategies the stack cannot run are appended to ``beyond`` where it is given."""
    space = space or default_space(scenario)
    t, hw = scenario.training, scenario.hardware
    par = t.parallelism
    batch = global_batch(scenario)
    seq = t.sequence_length
    hardware = space.hardware or ((hw.gpu.name, hw.gpus_per_node, hw.nodes),)
    micros = space.micro_batches or (t.micro_batch_size,)
    for gpu, per_node, nodes in hardware:
        base_hw = hardware_with(scenario, gpu).hardware
        base_hw = dataclasses.replace(base_hw, gpus_per_node=per_node, nodes=nodes)
        world = per_node * nodes
        axes = [space.sizes(a.key) or (par.size(a.key),) for a in PARALLEL_AXES]
        choices: list[Sequence[Any]] = [
            space.precisions or (t.precision,),
            space.optimizers or (t.optimizer,),
            space.checkpointing or (t.activation_checkpointing,),
            space.zero_stages or (par.zero_stage,),
            *axes,
            space.offload or (t.offload.optimizer,),
        ]
        # the layouts and offloads, each made once (many strategies share each)
        layouts: dict[tuple[int, ...], ParallelismSpec | None] = {}
        offloads: dict[str, OffloadSpec | None] = {}
        for combo in itertools.product(*choices):
            precision, optimizer, ckpt, zero, *sizes, offload = combo
            chosen = {a.key: n for a, n in zip(PARALLEL_AXES, sizes, strict=True)}
            model_parallel = math.prod(chosen[key] for key in WORLD_AXES)
            if world % model_parallel:
                continue
            dp = world // model_parallel
            shapes = [(m, seq, batch // (m * dp)) for m in micros if batch % (m * dp) == 0]
            if not shapes:
                continue
            key = (zero, *sizes)
            if key not in layouts:
                layouts[key] = _made(
                    dataclasses.replace,
                    par,
                    **chosen,
                    zero_stage=zero,
                    sequence_parallel=par.sequence_parallel and chosen["tp"] > 1,
                )
            if offload not in offloads:
                offloads[offload] = _made(dataclasses.replace, t.offload, optimizer=offload)
            new_par, new_offload = layouts[key], offloads[offload]
            if new_par is None or new_offload is None:
                continue
            try:
                training = dataclasses.replace(
                    t,
                    precision=precision,
                    optimizer=optimizer,
                    activation_checkpointing=ckpt,
                    micro_batch_size=shapes[0][0],
                    gradient_accumulation_steps=shapes[0][2],
                    parallelism=new_par,
                    offload=new_offload,
                )
            except EstimateError:
                continue
            strategy = dataclasses.replace(scenario, hardware=base_hw, training=training)
            # the ZeRO stages and offloads the registry's changes make, and no others; and
            # only what the scenario's training stack can run
            if changes.zero_refusal(strategy) is not None:
                continue
            if new_refusal(scenario, strategy) is None:
                yield strategy, shapes
            elif beyond is not None:
                beyond.append(strategy)


def _made(make: Callable[..., T], *args: Any, **fields: Any) -> T | None:
    """``make(*args, **fields)``, or ``None`` where it raises :class:`EstimateError`."""
    try:
        return make(*args, **fields)
    except EstimateError:
        return None


@dataclass(frozen=True, slots=True)
class Beyond:
    """What a sweep left out because the scenario's training stack cannot run it: the
    stack, how many strategies, what they needed (as the stack file names the abilities:
    ``pipeline parallelism``) and the stacks that can run them -- switching to one of
    those is a change of its own, which the sweep does not make."""

    stack: str
    strategies: int
    needs: tuple[str, ...]
    stacks: tuple[str, ...]

    def sentence(self) -> str:
        """``40 strategies left out: Hugging Face Trainer cannot run pipeline parallelism;
        torchtitan or custom can`` (``""`` where none was)."""
        if not self.strategies:
            return ""
        can = " or ".join(self.stacks) if self.stacks else "no stack here"
        return (
            f"{self.strategies:,} strategies left out: {self.stack} cannot run "
            f"{' or '.join(self.needs)}; {can} can"
        )


def beyond_stack(
    scenario: Scenario, space: Space | None = None, left: list[Scenario] | None = None
) -> Beyond:
    """The strategies of ``space`` the scenario's training stack cannot run (see
    :class:`Beyond`): ``left``, where a sweep gathered them already, else found here."""
    if left is None:
        left = []
        for _ in strategies(scenario, space, left):
            pass
    needs: dict[str, None] = {}
    can: dict[str, None] = {}
    for strategy in left:
        for refusal in refusals(strategy):
            needs[re.sub(r" \(.*\)$", "", refusal.words)] = None
        can.update(dict.fromkeys(stacks_that_can(strategy)))
    try:
        label = load_stack(scenario.training.stack).label
    except EstimateError:
        label = scenario.training.stack
    return Beyond(label, len(left), tuple(needs), tuple(can))


def reshaped(scenario: Scenario, micro_batch_size: int, accumulation: int) -> Scenario:
    """``scenario`` with another micro-batch size and accumulation, both checked already
    (:func:`memfit.engine.specs.reshaped`)."""
    return specs.reshaped(
        scenario, micro_batch_size=micro_batch_size, gradient_accumulation_steps=accumulation
    )


def configs(scenario: Scenario, space: Space | None = None) -> Iterator[Scenario]:
    """Every configuration of :func:`strategies`, one scenario each."""
    for base, shapes in strategies(scenario, space):
        for b, _, a in shapes:
            yield reshaped(base, b, a)


@dataclass(frozen=True, slots=True)
class _Shaped:
    """A scenario not built yet: a strategy's scenario and the shape to give it."""

    base: Scenario
    micro_batch_size: int
    accumulation: int


@dataclass(frozen=True)
class Point:
    """One configuration of a sweep: its memory per GPU and its step time.

    A sweep gives each point its strategy and shape; its :attr:`scenario` is built the
    first time it is asked for (most of a sweep's points are only ever drawn). A sweep
    that times only the points that fit (``memfit fit``) leaves ``timed`` ``None`` for the
    others: their :attr:`time` is worked out the first time it is asked for
    (:func:`~memfit.engine.steptime.step_time`, equal to the sweep's)."""

    spec: Scenario | _Shaped
    device_bytes: int
    budget_bytes: int
    capacity_bytes: int
    verdict: str
    timed: StepTime | None

    @functools.cached_property
    def time(self) -> StepTime:
        return self.timed if self.timed is not None else step_time(self.scenario)

    @functools.cached_property
    def scenario(self) -> Scenario:
        spec = self.spec
        if isinstance(spec, Scenario):
            return spec
        return reshaped(spec.base, spec.micro_batch_size, spec.accumulation)

    @property
    def fits(self) -> bool:
        return self.device_bytes <= self.budget_bytes

    @property
    def cost_per_token(self) -> float | None:
        """Price per million tokens, when the GPU-hour price is known."""
        price = self.time.price_per_gpu_hour
        if price is None or not self.time.tokens_per_s:
            return None
        return price * self.time.gpus / 3600 / self.time.tokens_per_s * 1e6

    def as_dict(self) -> dict[str, object]:
        """The JSON form: the scenario, its memory, verdict and time (``memfit fit``)."""
        return {
            "scenario": scenario_to_dict(self.scenario),
            "device_bytes": self.device_bytes,
            "budget_bytes": self.budget_bytes,
            "capacity_bytes": self.capacity_bytes,
            "verdict": self.verdict,
            "time": self.time.as_dict(),
        }

    def row(self) -> dict[str, object]:
        """A flat CSV row (read off the strategy and the shape: no scenario is built)."""
        return dict(zip(ROW_FIELDS, self.values(), strict=True))

    def values(self) -> list[object]:
        """The row's values in the order of :data:`ROW_FIELDS` (the sweep's JSON points)."""
        spec = self.spec
        if isinstance(spec, Scenario):
            s, batch, accumulation = (
                spec,
                spec.training.micro_batch_size,
                spec.training.gradient_accumulation_steps,
            )
        else:
            s, batch, accumulation = spec.base, spec.micro_batch_size, spec.accumulation
        t = s.training
        p = t.parallelism
        time = self.time
        return [
            s.hardware.gpu.name,
            s.hardware.world_size,
            t.precision,
            t.optimizer,
            t.activation_checkpointing,
            p.zero_stage,
            *[p.size(key) for key in SWEPT_AXES],
            t.offload.optimizer,
            batch,
            accumulation,
            self.device_bytes,
            self.budget_bytes,
            self.verdict,
            time.step_time_s,
            time.tokens_per_s,
            time.tokens_per_s_per_gpu,
            time.mfu,
            time.bound,
        ]


#: the mark of a configuration that trains differently from the scenario it was swept
#: around (:func:`numerics_changed`)
NUMERICS_MARK = "†"


def numerics_changed(base: Scenario, scenario: Scenario) -> tuple[str, ...]:
    """How ``scenario`` trains differently from ``base``, in words: the numerics of each
    change of the registry (:attr:`memfit.engine.changes.Change.numerics`) whose settings
    ``scenario`` has and ``base`` has not -- pure bf16 weights, 8-bit optimizer states, a
    quantized base, another loss. Sharding, offload, recomputation and the micro-batch
    train the same thing and are not named.

    >>> from memfit.engine.presets import load_gpu, load_model
    >>> from memfit.engine.specs import HardwareSpec
    >>> s = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("l4")))
    >>> numerics_changed(s, changes.BY_ID["8bit-optimizer"].apply(s))
    ("AdamW's moments quantized to 8 bits, block by block",)
    """
    out = []
    for change in changes.CHANGES:
        if not change.numerics or not change.sets:
            continue
        has = [getattr(scenario.training, k) == v for k, v in change.sets]
        had = [getattr(base.training, k) == v for k, v in change.sets]
        if all(has) and not all(had):
            out.append(change.numerics)
    return tuple(out)


def describe(scenario: Scenario) -> str:
    """A configuration in one line: ``bf16-mixed adamw ckpt full ZeRO-3 tp 2 mb 4 x 8``."""
    t, p = scenario.training, scenario.training.parallelism
    parts = [t.precision, t.optimizer]
    if t.activation_checkpointing != "none":
        parts.append(f"ckpt {t.activation_checkpointing}")
    if p.zero_stage:
        parts.append(f"ZeRO-{p.zero_stage}")
    for axis in PARALLEL_AXES:
        if p.size(axis.key) > 1:
            parts.append(f"{axis.key} {p.size(axis.key)}")
    if t.offload.optimizer != "none":
        parts.append(f"offload {t.offload.optimizer}")
    parts.append(f"mb {t.micro_batch_size} x {t.gradient_accumulation_steps}")
    return " ".join(parts)


def only(points: Sequence[Point], values: dict[str, str]) -> list[Point]:
    """The points whose row (:meth:`Point.row`) has each of ``values`` (compared as text,
    as the CSV writes them): the fastest configurations filtered by any setting."""
    if not values:
        return list(points)
    wanted = values.items()
    return [p for p in points if _has(p.row(), wanted)]


def _has(row: dict[str, object], wanted: Any) -> bool:
    return all(str(row[k]) == v for k, v in wanted)


def points_csv(points: Sequence[Point]) -> str:
    """The points as CSV, one row each (:meth:`Point.row`)."""
    buffer = io.StringIO()
    rows = [p.row() for p in points]
    fields = list(rows[0]) if rows else list(ROW_FIELDS)
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def point(scenario: Scenario) -> Point:
    """The memory and time of one configuration (raises :class:`EstimateError`)."""
    t = totals(scenario)
    return Point(
        scenario, t.device_bytes, t.budget_bytes, t.capacity_bytes, t.verdict, step_time(scenario)
    )


#: configurations between two calls of a sweep's progress callback (a cancel takes effect
#: within this many)
PROGRESS_EVERY = 16
#: a progress callback: (done, total) -> keep going
Progress = Callable[[int, int], bool]
#: one strategy's results: for each of its shapes evaluated, the shape's index, its totals
#: and its step time (a shape the engine rejects has none; a strategy whose step time it
#: rejects, no results; ``None`` for a shape that does not fit, where only those that
#: fit are timed)
_Results = list[tuple[int, Totals, StepTime | None]]
#: which points a sweep times as it goes: all of them, or those that fit the budget (the
#: others are timed when asked: :attr:`Point.time`)
TIMES = ("all", "fitting")
#: the fewest strategies a sweep spreads over processes (below, starting them costs more
#: than they save)
PARALLEL_FROM = 96
#: the fewest strategies a process of a sweep takes (fewer workers where there are fewer)
MIN_SHARE = 24


def _evaluate_each(todo: Sequence[Strategy], times: str = "all") -> list[_Results]:
    """Each strategy of ``todo`` at each of its shapes, at once
    (:func:`memfit.engine.batch.totals_over_each`, :func:`memfit.engine.steptime.step_times`):
    every shape timed, or (``times`` is ``"fitting"``) only those that fit the budget. A
    step time rejects a strategy, not a shape (its plan is made without the shape), so
    the strategy is planned either way. Strategies at the same shapes that differ only in
    their share of the model state have their memory found together."""
    out: list[_Results] = []
    for (base, shapes), found in zip(todo, totals_over_each(todo), strict=True):
        kept = [
            i
            for i, t in enumerate(found)
            if not isinstance(t, EstimateError)
            and (times == "all" or t.device_bytes <= t.budget_bytes)
        ]
        try:
            timed = step_times(base, [shapes[i] for i in kept])
        except EstimateError:
            out.append([])
            continue
        at = dict(zip(kept, timed, strict=True))
        out.append(
            [(i, t, at.get(i)) for i, t in enumerate(found) if not isinstance(t, EstimateError)]
        )
    return out


def _batch_key(strategy: Strategy) -> tuple[object, ...]:
    """What the strategies evaluated together share: their layout of activations
    (:func:`_alike`) and their shapes -- they differ in their share of the model state."""
    return (*_alike(strategy), *strategy[1])


def _in_order(todo: list[Strategy], times: str) -> Iterator[_Results]:
    """:func:`_evaluate_each` of every strategy of ``todo``, in its order, each one
    evaluated with every other of ``todo`` of its :func:`_batch_key` when the first of
    them is reached."""
    alike: dict[tuple[object, ...], list[int]] = {}
    for i, strategy in enumerate(todo):
        alike.setdefault(_batch_key(strategy), []).append(i)
    done: dict[int, _Results] = {}
    for i, strategy in enumerate(todo):
        if i not in done:
            run = alike[_batch_key(strategy)]
            done.update(zip(run, _evaluate_each([todo[j] for j in run], times), strict=True))
        yield done.pop(i)


def sweep(
    scenario: Scenario,
    space: Space | None = None,
    progress: Progress | None = None,
    beyond: list[Scenario] | None = None,
    workers: int = 1,
    meanwhile: Callable[[], None] | None = None,
    times: str = "all",
) -> list[Point]:
    """Every valid configuration of ``space`` (default: :func:`default_space`) with its
    memory and time, in enumeration order: each strategy's shapes at once
    (:func:`memfit.engine.batch.totals_over`, :func:`memfit.engine.steptime.step_times`), equal to
    :func:`point` of each configuration. ``progress`` is called every
    :data:`PROGRESS_EVERY` configurations or so; returning ``False`` stops the sweep with
    the points so far. The strategies the training stack cannot run are left out, and
    appended to ``beyond`` where it is given (:func:`beyond_stack` says them in words).
    ``workers`` above 1 spreads the strategies over that many processes where the
    platform forks them (:func:`in_processes`; without a ``progress`` callback): the
    points are the same, in the same order. ``meanwhile`` is called once, in this
    process, while those processes work (else before the sweep): other work of the
    caller's that reads no point. ``times`` (:data:`TIMES`) is ``"fitting"`` where the
    caller reads the time of the points that fit alone, or of few others: the rest are
    timed when asked (:attr:`Point.time`)."""
    if times not in TIMES:
        raise EstimateError("times", f"got {shown(times)}, expected one of {', '.join(TIMES)}")
    todo = list(strategies(scenario, space, beyond))
    total = sum(len(shapes) for _, shapes in todo)
    results: Iterator[_Results]
    if workers > 1 and progress is None and len(todo) >= PARALLEL_FROM and can_fork():
        results = iter(in_processes(todo, workers, meanwhile, times))
    else:
        if meanwhile is not None:
            meanwhile()
        results = _in_order(todo, times)
    out: list[Point] = []
    done = reported = 0
    for base, shapes in todo:
        if progress is not None and done >= reported:
            if not progress(done, total):
                return out
            reported = done + PROGRESS_EVERY
        done += len(shapes)
        for i, t, time in next(results):
            b, _, a = shapes[i]
            out.append(
                Point(
                    _Shaped(base, b, a),
                    t.device_bytes,
                    t.budget_bytes,
                    t.capacity_bytes,
                    t.verdict,
                    time,
                )
            )
    if progress is not None:
        progress(total, total)
    return out


def can_fork() -> bool:
    """Whether sweeps may spread over processes here: Linux, where a forked process
    inherits the engine as it is, and no other thread runs in this one (a thread could
    hold a cache's lock as the fork copies it: the app's sweeps stay in their thread).
    Elsewhere the sweep runs in the calling process."""
    return sys.platform == "linux" and hasattr(os, "fork") and threading.active_count() == 1


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


#: the strategies of the sweep that is spreading over processes: a forked worker reads
#: them from here, where its parent left them
_TODO: list[Strategy] = []


def _alike(strategy: Strategy) -> tuple[object, ...]:
    """What strategies that share block profiles and compiled steps have in common (their
    layout of activations, not their share of the model state): sorted by it, a worker's
    strategies build few of them twice."""
    t = strategy[0].training
    p = t.parallelism
    return (t.precision, t.activation_checkpointing, p.tp, p.pp, p.cp, p.ep, p.sequence_parallel)


def _split(strategy: Strategy) -> tuple[int, ...]:
    """What a rank's blocks are built from beyond the training's kind: the model's share
    of a rank (tensor and expert parallel) and the sequence's (context and sequence
    parallel). Strategies that differ in it share no block profile, layout or compiled
    step; those that share it share most of them, across every precision, checkpointing,
    pipeline and ZeRO stage."""
    p = strategy[0].training.parallelism
    return (p.tp, p.ep, p.cp, int(p.sequence_parallel))


def _parts(todo: list[Strategy], workers: int) -> list[list[int]]:
    """The strategies of ``todo`` (their indices) in parts for ``workers`` processes: one
    part per :func:`_split` (a worker builds what its strategies share once, and no other
    worker builds it), each in :func:`_alike`'s order; a part of more than its share of
    ``2 x workers`` parts cut into runs of that share; largest first, so that the last
    parts the workers take are the smallest."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in sorted(range(len(todo)), key=lambda i: _alike(todo[i])):
        groups.setdefault(_split(todo[i]), []).append(i)
    share = -(-len(todo) // (2 * workers))
    parts = [g[k : k + share] for g in groups.values() for k in range(0, len(g), share)]
    return sorted(parts, key=len, reverse=True)


def _run_part(indices: list[int], times: str) -> list[tuple[int, _Results]]:
    return list(zip(indices, _evaluate_each([_TODO[i] for i in indices], times), strict=True))


#: how a part's number is written to the queue of parts
_PART_BYTES = 4
#: the most parts the queue holds: the numbers of all are written before any is read,
#: and a pipe holds at least a page (4,096 bytes) however short of memory the system is.
#: A sweep makes a few parts per split of the model and the sequence (:func:`_parts`),
#: far fewer
_MOST_PARTS = 4096 // _PART_BYTES


def _next_part(queue: int) -> int | None:
    """The number of the next part no process has taken (``None``: none is left). The
    queue is a pipe holding every part's number, written before the fork: a read of a
    few bytes from a pipe is whole, so no two processes take one part."""
    taken = os.read(queue, _PART_BYTES)
    return int.from_bytes(taken, "little") if len(taken) == _PART_BYTES else None


#: a part's answer as a forked process writes it: the length of what follows, then the
#: part's number and its strategies' results, pickled
_LENGTH_BYTES = 8
#: one part's results: (strategy, results) for each of its strategies
_PartResults = list[tuple[int, _Results]]


def _take_parts(
    queue: int, parts: list[list[int]], times: str, done: Callable[[int, _PartResults], None]
) -> None:
    """Each part this process takes from ``queue``, evaluated and handed to ``done``."""
    while (k := _next_part(queue)) is not None:
        done(k, _run_part(parts[k], times))


class _Answers:
    """What one forked process answers: each part it finishes, written as it finishes it
    to a file of its own (in memory where Linux has such files), which this process reads
    as it grows -- between its own parts, so that little is left to read once the last
    part is done. A part the file does not hold whole, however the process ended, is not
    answered."""

    def __init__(self) -> None:
        self.fd = _answer_file()
        self.pid = 0
        self.read = 0  # the bytes of the file read so far
        self.broken = False

    def write(self, k: int, results: _PartResults) -> None:
        """Part ``k``'s answer, written (by the forked process)."""
        data = pickle.dumps((k, results), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(len(data).to_bytes(_LENGTH_BYTES, "little") + data)
        while view:
            view = view[os.write(self.fd, view) :]

    def collect(self) -> dict[int, _PartResults]:
        """The answers written whole since the last call, by part."""
        size = os.fstat(self.fd).st_size
        if self.broken or size <= self.read:
            return {}
        data = os.pread(self.fd, size - self.read, self.read)
        out: dict[int, _PartResults] = {}
        at = 0
        while at + _LENGTH_BYTES <= len(data):
            end = at + _LENGTH_BYTES + int.from_bytes(data[at : at + _LENGTH_BYTES], "little")
            if end > len(data):
                break  # being written
            try:
                k, results = pickle.loads(data[at + _LENGTH_BYTES : end])
            except Exception:  # not an answer: nothing after it is read
                self.broken = True
                break
            out[k] = results
            at = end
        self.read += at
        return out


def _answer_file() -> int:
    """A file for a forked process's answers, which no other process sees: in memory
    where Linux has such files, else an unlinked temporary file."""
    if hasattr(os, "memfd_create"):
        with contextlib.suppress(OSError):
            return os.memfd_create("memfit-sweep-answers")
    fd, path = tempfile.mkstemp(prefix="memfit-sweep-")
    os.unlink(path)
    return fd


def _work_in_child(queue: int, answers: _Answers, parts: list[list[int]], times: str) -> None:
    """A forked process's work: the parts it takes, each written to ``answers`` as it is
    done. Then it ends at once, however this ends (:func:`in_processes`): what its
    parent would do at exit -- flush its output, run its exit handlers -- is not its to
    do. A part it did not finish its parent evaluates again, and meets the same error
    there."""
    _take_parts(queue, parts, times, answers.write)


def in_processes(
    todo: list[Strategy],
    workers: int,
    meanwhile: Callable[[], None] | None = None,
    times: str = "all",
) -> list[_Results]:
    """:func:`_evaluate_each` of every strategy of ``todo``, in ``workers`` processes: this
    one and ``workers - 1`` forked from it. The strategies are in parts by what they
    share (:func:`_parts`); each process takes the next part as it finishes one (this
    one after ``meanwhile``, which runs here once the others are forked: no thread of
    this process runs while they fork), and the others' answers are read here as they
    come (:class:`_Answers`). Each process computes what this one would (the engine's
    functions are pure), so the results are the same, in the order of ``todo``. Where no
    process can be forked, or one ends without its answer, this process evaluates what
    is missing (and all, where the parts are more than the queue holds)."""
    global _TODO
    workers = max(1, min(workers, len(todo) // MIN_SHARE))
    parts = _parts(todo, workers)
    if len(parts) > _MOST_PARTS:
        if meanwhile is not None:
            meanwhile()
        return list(_in_order(todo, times))
    _TODO = todo
    queue, filler = os.pipe()
    children: list[_Answers] = []
    found: dict[int, _PartResults] = {}  # by part

    def done(k: int, results: _PartResults) -> None:
        found[k] = results
        for child in children:
            found.update(child.collect())

    try:
        os.write(filler, b"".join(k.to_bytes(_PART_BYTES, "little") for k in range(len(parts))))
        os.close(filler)
        for _ in range(workers - 1):
            answers = _Answers()
            try:
                answers.pid = os.fork()
            except OSError:  # no process to be had: the parts go to those there are
                os.close(answers.fd)
                break
            if answers.pid == 0:  # the forked process
                try:
                    _work_in_child(queue, answers, parts, times)
                finally:
                    os._exit(0)
            children.append(answers)
        if meanwhile is not None:
            meanwhile()
        _take_parts(queue, parts, times, done)
        while children:
            answers = children.pop()
            os.waitpid(answers.pid, 0)
            found.update(answers.collect())
            os.close(answers.fd)
        for k in range(len(parts)):
            if k not in found:
                found[k] = _run_part(parts[k], times)
    finally:
        _TODO = []
        os.close(queue)
        for answers in children:  # this process stops with an error
            os.kill(answers.pid, signal.SIGTERM)
            os.waitpid(answers.pid, 0)
            os.close(answers.fd)
    out: list[_Results] = [[] for _ in todo]
    for part in found.values():
        for i, results in part:
            out[i] = results
    return out


def pareto(points: Sequence[Point], cost: Callable[[Point], float] | None = None) -> list[Point]:
    """The points no other point beats on both memory (fewer device bytes) and speed
    (more tokens/s, or a lower ``cost`` when given), by increasing memory."""
    key = cost or (lambda p: -p.time.tokens_per_s)
    front: list[Point] = []
    best = float("inf")
    for p in sorted(points, key=lambda p: (p.device_bytes, key(p))):
        if key(p) < best:
            front.append(p)
            best = key(p)
    return front


def _settings(p: Point) -> int:
    """How many of a configuration's settings are switched on: fewer is simpler."""
    t, par = p.scenario.training, p.scenario.training.parallelism
    return (
        (t.activation_checkpointing != "none")
        + (par.zero_stage > 0)
        + sum(par.size(key) > 1 for key in SWEPT_AXES)
        + (t.offload.optimizer != "none")
    )


def best(points: Sequence[Point], top: int = 10) -> list[Point]:
    """The fitting points, fastest first (ties: less memory, then fewer settings on). Of
    configurations that give the same memory and the same time (selective checkpointing
    where the attention kernel already recomputes its core), the simplest is kept."""
    fitting = sorted(
        (p for p in points if p.fits),
        key=lambda p: (-p.time.tokens_per_s, p.device_bytes, _settings(p)),
    )
    out: list[Point] = []
    seen: set[tuple[int, float]] = set()
    for p in fitting:
        key = (p.device_bytes, p.time.step_time_s)
        if key not in seen:
            seen.add(key)
            out.append(p)
        if len(out) == top:
            break
    return out


def curve(scenario: Scenario, field: str, values: Sequence[int]) -> list[Point | None]:
    """The scenario at each value of ``field`` ("micro_batch_size" or
    "sequence_length"); ``None`` where the engine rejects it."""
    if field not in ("micro_batch_size", "sequence_length"):
        raise EstimateError("field", f"got {field!r}, expected micro_batch_size or sequence_length")
    out: list[Point | None] = []
    for v in values:
        try:
            s = dataclasses.replace(
                scenario,
                training=dataclasses.replace(scenario.training, **{field: v}),  # type: ignore[arg-type]
            )
            out.append(point(s))
        except EstimateError:
            out.append(None)
    return out
