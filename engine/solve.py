"""Solvers: the largest micro-batch, sequence length and LoRA rank that fit the budget, the
fewest GPUs that fit, and the changes that make a scenario fit, fastest first.

"Fits" means what the verdict means by it: the device total (what ``nvidia-smi`` shows)
at or under the budget line (``hardware.utilization_target`` of the capacity).

Memory grows with the micro-batch, the sequence length and the LoRA rank, and shrinks as
more GPUs share the ZeRO shards, so each solver searches its axis by doubling and then
bisection: a few dozen estimates instead of thousands. The answer is the largest (or
smallest) value for which it and every value before it fit -- exactly what a scan from
the start of the axis finds, which the tests check against such a scan.

>>> from memfit.engine.presets import load_gpu, load_model
>>> from memfit.engine.specs import HardwareSpec, Scenario, TrainingSpec
>>> s = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("l4")), TrainingSpec())
>>> 1 <= max_micro_batch(s) <= 64
True
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from memfit.engine import changes
from memfit.engine.batch import totals
from memfit.engine.changes import Change, with_training
from memfit.engine.errors import EstimateError
from memfit.engine.presets import load_gpu
from memfit.engine.specs import MAX_DIM, PARALLEL_AXES, HardwareSpec, Scenario
from memfit.engine.steptime import StepTime, step_time

#: the largest world size :func:`min_gpus` tries
MAX_GPUS = 65_536


def fits(scenario: Scenario) -> bool:
    """The device total is at or under the budget; an invalid scenario does not fit."""
    try:
        t = totals(scenario)
    except EstimateError:
        return False
    return t.device_bytes <= t.budget_bytes


def largest(ok: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The largest ``n`` in ``[lo, hi]`` with ``ok`` true for ``lo..n``, assuming ``ok``
    turns false for good once it does (doubling from ``lo``, then bisection);
    ``None`` when ``ok(lo)`` is false."""
    if not ok(lo):
        return None
    good, step = lo, 1
    while True:
        probe = min(hi, lo + step)
        if probe == good:
            return good
        if not ok(probe):
            bad = probe
            break
        good, step = probe, step * 2
    while bad - good > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def max_micro_batch(scenario: Scenario, limit: int = 65_536) -> int | None:
    """The largest micro-batch size that fits (gradient accumulation unchanged)."""
    return largest(lambda b: fits(with_training(scenario, micro_batch_size=b)), 1, limit)


def sequence_step(scenario: Scenario) -> int:
    """Sequence lengths must be a multiple of this: the context-parallel size, times the
    tensor-parallel size under sequence parallelism."""
    par = scenario.training.parallelism
    return par.cp * (par.tp if par.sequence_parallel else 1)


def max_sequence_length(scenario: Scenario, limit: int = MAX_DIM) -> int | None:
    """The largest sequence length (a multiple of :func:`sequence_step`) that fits."""
    step = sequence_step(scenario)
    n = largest(
        lambda k: fits(with_training(scenario, sequence_length=k * step)), 1, max(1, limit // step)
    )
    return None if n is None else n * step


def max_lora_rank(scenario: Scenario) -> int | None:
    """The largest LoRA rank that fits, for a LoRA or QLoRA scenario (``None`` otherwise,
    or when rank 1 does not fit)."""
    t = scenario.training
    if t.method not in ("lora", "qlora"):
        return None
    return largest(
        lambda r: fits(with_training(scenario, lora=dataclasses.replace(t.lora, rank=r))),
        1,
        scenario.model.hidden_size,
    )


#: GPUs per node that :func:`gpu_counts` assumes for a scenario on one node
SERVER_GPUS = 8


def gpu_counts(scenario: Scenario, limit: int = MAX_GPUS) -> list[tuple[int, int]]:
    """The (gpus_per_node, nodes) layouts the parallel layout can use, by world size:
    fewer GPUs than a node holds on one node, then whole nodes. A scenario on several
    nodes keeps its node size; one on a single node grows to servers of
    :data:`SERVER_GPUS` (or its own size, if larger)."""
    hw, par = scenario.hardware, scenario.training.parallelism
    node = hw.gpus_per_node if hw.nodes > 1 else max(hw.gpus_per_node, SERVER_GPUS)
    unit = par.model_parallel
    out = [(n, 1) for n in range(unit, node, unit)]
    out += [(node, k) for k in range(1, limit // node + 1) if (node * k) % unit == 0]
    return out


def with_gpus(scenario: Scenario, gpus_per_node: int, nodes: int) -> Scenario:
    hw = dataclasses.replace(scenario.hardware, gpus_per_node=gpus_per_node, nodes=nodes)
    return dataclasses.replace(scenario, hardware=hw)


def min_gpus(scenario: Scenario, gpu: str | None = None, limit: int = MAX_GPUS) -> Scenario | None:
    """The scenario on the fewest GPUs (of preset ``gpu``, else the scenario's) that fits,
    with the same parallel layout, micro-batch and accumulation; more GPUs only help
    through ZeRO sharding, so without it the answer is the scenario's layout or none."""
    if gpu is not None:
        scenario = hardware_with(scenario, gpu)
    layouts = gpu_counts(scenario, limit)
    if not layouts:
        return None

    def at(i: int) -> Scenario:  # made for the layouts probed only (a few of thousands)
        return with_gpus(scenario, *layouts[i])

    # the smallest index from which on everything fits: bisection on "fits from here on"
    last = len(layouts) - 1
    if not fits(at(last)):
        return None
    lo, hi = -1, last  # fits(at(hi)); not known for lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(at(mid)):
            hi = mid
        else:
            lo = mid
    return at(hi)


#: what make_it_fit tries: every change of the registry (:mod:`memfit.engine.changes`)
#: that saves memory and keeps the model and what it trains on -- the number formats,
#: kernels and loop habits, the optimizer, checkpointing and activation offload, the
#: micro-batch, ZeRO and the offloads of optimizer and parameters, a model-parallel axis
#: twice as wide, twice the GPUs -- in the registry's order
CHANGES: tuple[Change, ...] = changes.pick(
    changes.in_order(
        (
            "mixed-precision",
            "pure-bf16",
            "flash-attention",
            "torch-compile",
            "chunked-loss",
            "release-outputs",
            "release-previous-step",
            "gradient-bucket-view",
            "fused-optimizer",
            "8bit-optimizer",
            "selective-checkpointing",
            "checkpointing",
            "offload-activations",
            "half-micro-batch",
            "micro-batch-1",
            "zero1",
            "zero2",
            "zero3",
            "cpu-offload",
            "offload-parameters",
            *(f"{a.key}-x2" for a in PARALLEL_AXES if a.section == "model"),
            "more-gpus",
        )
    )
)
CHANGES_BY_KEY = {c.id: c for c in CHANGES}
#: the changes of the layout: they take more GPUs, or split the model over those there are
LAYOUT = frozenset(c.id for c in CHANGES if c.id == "more-gpus" or c.id.endswith("-x2"))
#: every combination of up to this many changes is tried (the fastest fits are near the
#: budget, where a search by memory comes last; the layout changes in pairs at most);
#: deeper ones best first, lowest memory first
EXHAUSTIVE = 3
#: the most changes one fix makes
MAX_CHANGES = 8
#: the most scenarios one search estimates (each a few milliseconds)
MAX_TRIES = 1500
#: a search's progress: (scenarios tried, the most it tries) -> False to stop
Progress = Callable[[int, int], bool]


@dataclass(frozen=True, slots=True)
class Fix:
    """A set of changes that makes the scenario fit, with what the result costs."""

    changes: tuple[str, ...]
    labels: tuple[str, ...]
    scenario: Scenario
    device_bytes: int
    budget_bytes: int
    time: StepTime


@dataclass(frozen=True, slots=True)
class Floor:
    """The least memory per GPU a search reached, and the changes that reach it: where
    nothing fits, what the scenario cannot go under (its breakdown says what it is made
    of: :func:`memfit.engine.estimate.estimate` of :attr:`scenario`)."""

    changes: tuple[str, ...]
    labels: tuple[str, ...]
    scenario: Scenario
    device_bytes: int
    budget_bytes: int


@dataclass(frozen=True, slots=True)
class Search:
    """What make-it-fit found: the fixes, fastest first; the floor; how many scenarios it
    estimated and whether it went through the space it set out to (not stopped by its
    limit or a cancel)."""

    fixes: tuple[Fix, ...]
    floor: Floor | None
    tries: int
    complete: bool


def combine(scenario: Scenario, keys: Iterable[str]) -> Scenario | None:
    """``scenario`` with the changes ``keys`` made in order; ``None`` when one of them
    does not apply where the ones before it left the scenario (an earlier one made it
    already, or its rule refuses it there)."""
    made = changes.made_in_turn(scenario, keys)
    return made if isinstance(made, Scenario) else None


def make_it_fit(
    scenario: Scenario,
    top: int = 10,
    max_changes: int = MAX_CHANGES,
    leave_out: Iterable[str] = (),
) -> list[Fix]:
    """The changes that bring the device total under the budget, fastest (tokens/s)
    first (see :func:`search`); ``leave_out``: changes not to make (what the user locked)."""
    return list(search(scenario, top, max_changes, leave_out).fixes)


def search(
    scenario: Scenario,
    top: int = 10,
    max_changes: int = MAX_CHANGES,
    leave_out: Iterable[str] = (),
    progress: Progress | None = None,
    max_tries: int = MAX_TRIES,
) -> Search:
    """Every combination of up to :data:`EXHAUSTIVE` changes of :data:`CHANGES` (those
    of the :data:`LAYOUT` in pairs at most), then deeper ones best first -- the
    combination of least memory per GPU grown by one more change at a time -- up to
    ``max_changes`` at once and ``max_tries`` scenarios, until ``top`` fixes are found.
    A fix is a combination whose every change is needed (no smaller one among the fixes
    fits) and no two give the same scenario; changes are made in the registry's order,
    and those the scenario's stack cannot run are not made
    (:meth:`memfit.engine.changes.Change.attempt`). The floor is the least memory
    reached. ``progress`` is told (tried, max_tries) now and then; ``False`` stops it."""
    skipped = set(leave_out)
    ids = [c.id for c in CHANGES if c.id not in skipped]
    fitting: dict[Scenario, tuple[tuple[str, ...], Any]] = {}
    seen: set[Scenario] = {scenario}
    floor: tuple[int, tuple[str, ...], Scenario, int] | None = None
    queue: list[tuple[int, int, tuple[str, ...]]] = []
    tries = 0
    stopped = False

    def fits_a_subset(keys: tuple[str, ...]) -> bool:
        have = set(keys)
        return any(set(k) < have or set(k) == have for k, _ in fitting.values())

    made: dict[tuple[str, ...], Scenario | None] = {(): scenario}

    def made_by(keys: tuple[str, ...]) -> Scenario | None:
        """``scenario`` with ``keys`` made in turn (:func:`combine`), each combination's
        prefix made once: the changes before the last are made already."""
        if keys not in made:
            before = made_by(keys[:-1])
            after = CHANGES_BY_KEY[keys[-1]].attempt(before) if before is not None else None
            made[keys] = after if isinstance(after, Scenario) else None
        return made[keys]

    def visit(keys: tuple[str, ...]) -> None:
        nonlocal tries, floor, stopped
        if fits_a_subset(keys) or not changes.compatible(keys):
            return
        s = made_by(keys)
        if s is None or s in seen:
            return
        seen.add(s)
        tries += 1
        if progress is not None and tries % 50 == 0 and not progress(tries, max_tries):
            stopped = True
        try:
            t = totals(s)
        except EstimateError:
            return
        if floor is None or t.device_bytes < floor[0]:
            floor = (t.device_bytes, keys, s, t.budget_bytes)
        if t.device_bytes <= t.budget_bytes:
            fitting[s] = (keys, t)
        elif len(keys) < max_changes:
            heapq.heappush(queue, (t.device_bytes, tries, keys))

    # every combination of up to EXHAUSTIVE changes made on the GPUs as they are; the
    # layout changes (a wider axis, more GPUs) in pairs at most, then deeper by memory
    local = [i for i in ids if i not in LAYOUT]
    for size in range(1, min(EXHAUSTIVE, max_changes) + 1):
        pool = ids if size <= 2 else local
        for keys in itertools.combinations(pool, size):
            if tries >= max_tries or stopped:
                break
            visit(keys)
    heapq.heapify(queue)
    while queue and len(fitting) < top and tries < max_tries and not stopped:
        _bytes, _order, keys = heapq.heappop(queue)
        for i in ids:
            if i not in keys:
                visit(changes.in_order((*keys, i)))
    # a fix whose changes include another fix's is not needed whole
    sets = {s: set(k) for s, (k, _) in fitting.items()}
    minimal = [s for s in fitting if not any(o < sets[s] for o in sets.values())]
    fixes = [
        Fix(
            fitting[s][0],
            tuple(CHANGES_BY_KEY[k].label for k in fitting[s][0]),
            s,
            fitting[s][1].device_bytes,
            fitting[s][1].budget_bytes,
            step_time(s),
        )
        for s in minimal
    ]
    # fastest per GPU first: a fix that adds GPUs is weighed by what each one does
    ranked = sorted(fixes, key=lambda f: (-f.time.tokens_per_s_per_gpu, len(f.changes)))
    lowest = None
    if floor is not None:
        keys = floor[1]
        labels = tuple(CHANGES_BY_KEY[k].label for k in keys)
        lowest = Floor(keys, labels, floor[2], floor[0], floor[3])
    complete = not stopped and tries < max_tries
    return Search(tuple(ranked[:top]), lowest, tries, complete)


def hardware_with(scenario: Scenario, gpu: str) -> Scenario:
    """``scenario`` on the GPU preset ``gpu``. The overrides that describe the scenario's
    own device -- memory, price per GPU-hour, efficiencies, its power limit and clock --
    are dropped for another GPU: an H100's price must not cost an L40S run, nor a cap of
    500 W (beyond an L40S's TDP) be put on one."""
    if gpu == scenario.hardware.gpu.name:
        return scenario
    hw: HardwareSpec = dataclasses.replace(
        scenario.hardware,
        gpu=load_gpu(gpu),
        memory_gib=None,
        price_per_gpu_hour=None,
        matmul_efficiency=None,
        attention_efficiency=None,
        power_limit_w=None,
        clock_share=None,
    )
    return dataclasses.replace(scenario, hardware=hw)


@dataclass(frozen=True, slots=True)
class ModelFit:
    """One model preset under a scenario's hardware and training: its parameters, its
    device total (``None`` where the scenario's training does not apply to it, ``problem``
    says why) against the budget, and its tokens/s."""

    name: str
    label: str
    params: int
    device_bytes: int | None
    budget_bytes: int
    tokens_per_s: float | None
    problem: str = ""

    @property
    def fits(self) -> bool:
        return self.device_bytes is not None and self.device_bytes <= self.budget_bytes


def models_that_fit(
    scenario: Scenario, names: Iterable[str] | None = None, family: str | None = None
) -> list[ModelFit]:
    """Each model preset (``names``, else every one; of ``family`` where given) with the
    scenario's hardware and training, largest first: the answer to "the largest model I
    can train this way on these GPUs" is the first that fits (:func:`largest_model`)."""
    from memfit.engine.params import count_parameters
    from memfit.engine.presets import load_model, model_names

    out = []
    for name in names if names is not None else model_names():
        model = load_model(name)
        if family is not None and model.family != family:
            continue
        params = count_parameters(model).total
        try:
            s = dataclasses.replace(scenario, model=model)
            t = totals(s)
            speed: float | None = step_time(s).tokens_per_s
            row = ModelFit(name, model.label, params, t.device_bytes, t.budget_bytes, speed)
        except EstimateError as exc:
            budget = scenario.hardware.budget_bytes
            row = ModelFit(name, model.label, params, None, budget, None, str(exc))
        out.append(row)
    return sorted(out, key=lambda r: (-r.params, r.name))


def largest_model(
    scenario: Scenario, names: Iterable[str] | None = None, family: str | None = None
) -> ModelFit | None:
    """The preset with the most parameters that fits (see :func:`models_that_fit`)."""
    return next((r for r in models_that_fit(scenario, names, family) if r.fits), None)


@dataclass(frozen=True, slots=True)
class GridCell:
    """One micro-batch and sequence length of :func:`shape_grid`: the device total
    (``None`` where the engine rejects the shape), the budget and tokens/s."""

    micro_batch_size: int
    sequence_length: int
    device_bytes: int | None
    budget_bytes: int
    tokens_per_s: float | None

    @property
    def fits(self) -> bool:
        return self.device_bytes is not None and self.device_bytes <= self.budget_bytes


def shape_grid(
    scenario: Scenario, micro_batches: Iterable[int], sequence_lengths: Iterable[int]
) -> list[list[GridCell]]:
    """Memory and tokens/s at every micro-batch (rows) and sequence length (columns), the
    scenario's accumulation kept: the heat map of the shapes a run can take."""
    seqs = list(sequence_lengths)
    grid = []
    for b in micro_batches:
        row = []
        for n in seqs:
            try:
                s = with_training(scenario, micro_batch_size=b, sequence_length=n)
                t = totals(s)
                cell = GridCell(b, n, t.device_bytes, t.budget_bytes, step_time(s).tokens_per_s)
            except EstimateError:
                cell = GridCell(b, n, None, scenario.hardware.budget_bytes, None)
            row.append(cell)
        grid.append(row)
    return grid
