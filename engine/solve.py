"""Solvers: the largest micro-batch, sequence length and LoRA rank that fit the budget, the
fewest GPUs that fit, and the changes that make a scenario fit, fastest first.

"Fits" means what the verdict means by it: the device total (what ``nvidia-smi`` shows)
at or under the budget line (``hardware.utilization_target`` of the capacity).

Memory grows with the micro-batch, the sequence length and the LoRA rank, and shrinks as
more GPUs share the ZeRO shards, so each solver searches its axis by doubling and then
bisection: a few dozen estimates instead of thousands. The answer is the largest (or
smallest) value for which it and every value before it fit -- exactly what a scan from
the start of the axis finds, which the tests check against such a scan.

>>> from engine.presets import load_gpu, load_model
>>> from engine.specs import HardwareSpec, Scenario, TrainingSpec
>>> s = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("l4")), TrainingSpec())
>>> 1 <= max_micro_batch(s) <= 64
True
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from engine.batch import totals
from engine.errors import EstimateError
from engine.presets import load_gpu
from engine.sharding import nothing_to_shard
from engine.specs import MAX_DIM, HardwareSpec, Scenario
from engine.stacks import conventions
from engine.steptime import StepTime, step_time

#: the largest world size :func:`min_gpus` tries
MAX_GPUS = 65_536


def fits(scenario: Scenario) -> bool:
    """The device total is at or under the budget; an invalid scenario does not fit."""
    try:
        t = totals(scenario)
    except EstimateError:
        return False
    return t.device_bytes <= t.budget_bytes


def _with(scenario: Scenario, **fields: object) -> Scenario:
    return dataclasses.replace(
        scenario,
        training=dataclasses.replace(scenario.training, **fields),  # type: ignore[arg-type]
    )


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
    return largest(lambda b: fits(_with(scenario, micro_batch_size=b)), 1, limit)


def sequence_step(scenario: Scenario) -> int:
    """Sequence lengths must be a multiple of this: the context-parallel size, times the
    tensor-parallel size under sequence parallelism."""
    par = scenario.training.parallelism
    return par.cp * (par.tp if par.sequence_parallel else 1)


def max_sequence_length(scenario: Scenario, limit: int = MAX_DIM) -> int | None:
    """The largest sequence length (a multiple of :func:`sequence_step`) that fits."""
    step = sequence_step(scenario)
    n = largest(lambda k: fits(_with(scenario, sequence_length=k * step)), 1, max(1, limit // step))
    return None if n is None else n * step


def max_lora_rank(scenario: Scenario) -> int | None:
    """The largest LoRA rank that fits, for a LoRA or QLoRA scenario (``None`` otherwise,
    or when rank 1 does not fit)."""
    t = scenario.training
    if t.method not in ("lora", "qlora"):
        return None
    return largest(
        lambda r: fits(_with(scenario, lora=dataclasses.replace(t.lora, rank=r))),
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
    unit = par.tp * par.pp * par.cp
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
    at = [with_gpus(scenario, n, k) for n, k in layouts]
    # the smallest index from which on everything fits: bisection on "fits from here on"
    last = len(at) - 1
    if not fits(at[last]):
        return None
    lo, hi = -1, last  # fits(at[hi]); not known for lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(at[mid]):
            hi = mid
        else:
            lo = mid
    return at[hi]


@dataclass(frozen=True, slots=True)
class Change:
    """One change :func:`make_it_fit` may make."""

    key: str
    label: str
    apply: Callable[[Scenario], Scenario | None]


def _training(**fields: object) -> Callable[[Scenario], Scenario | None]:
    def apply(s: Scenario) -> Scenario | None:
        t = s.training
        if all(getattr(t, k) == v for k, v in fields.items()):
            return None
        return _with(s, **fields)

    return apply


def _parallel(**fields: object) -> Callable[[Scenario], Scenario | None]:
    def apply(s: Scenario) -> Scenario | None:
        p = s.training.parallelism
        if all(getattr(p, k) == v for k, v in fields.items()):
            return None
        return _with(s, parallelism=dataclasses.replace(p, **fields))  # type: ignore[arg-type]

    return apply


def _eight_bit(s: Scenario) -> Scenario | None:
    return _with(s, optimizer="adamw-8bit") if s.training.optimizer == "adamw" else None


def _offload(s: Scenario) -> Scenario | None:
    t = s.training
    if t.offload.optimizer != "none":
        return None
    par = dataclasses.replace(t.parallelism, zero_stage=max(1, t.parallelism.zero_stage))
    return _with(s, parallelism=par, offload=dataclasses.replace(t.offload, optimizer="cpu"))


def _zero(stage: int) -> Callable[[Scenario], Scenario | None]:
    def apply(s: Scenario) -> Scenario | None:
        p = s.training.parallelism
        if p.zero_stage >= stage or nothing_to_shard(s, stage):
            return None
        return _with(s, parallelism=dataclasses.replace(p, zero_stage=stage))

    return apply


def _half_micro(s: Scenario) -> Scenario | None:
    """Half the micro-batch, twice the accumulation: the same global batch."""
    t = s.training
    if t.micro_batch_size < 2 or t.micro_batch_size % 2:
        return None
    return _with(
        s,
        micro_batch_size=t.micro_batch_size // 2,
        gradient_accumulation_steps=t.gradient_accumulation_steps * 2,
    )


def _micro_one(s: Scenario) -> Scenario | None:
    """Micro-batch 1, the global batch kept by accumulation."""
    t = s.training
    if t.micro_batch_size < 4:
        return None
    return _with(
        s,
        micro_batch_size=1,
        gradient_accumulation_steps=t.gradient_accumulation_steps * t.micro_batch_size,
    )


def _release_outputs(s: Scenario) -> Scenario | None:
    """The loop keeps only the loss (``loss = out.loss; del out``), where it held the
    output (logits, KV cache) through backward."""
    if not conventions(s.training).outputs_held:
        return None
    return _with(s, outputs_held_through_backward=False)


def _release_previous(s: Scenario) -> Scenario | None:
    """The loop deletes its loss and outputs after each step (``del loss, logits``), where
    they lived on into the next step's forward."""
    if not conventions(s.training).previous_held:
        return None
    return _with(s, previous_step_held=False)


def _mixed(s: Scenario) -> Scenario | None:
    return _with(s, precision="bf16-mixed") if s.training.precision == "fp32" else None


def _flash(s: Scenario) -> Scenario | None:
    t = s.training
    if t.attention in ("flash", "sdpa") or t.precision == "fp32":
        return None
    return _with(s, attention="sdpa")


#: what make_it_fit tries: memory savings that keep the model and what it trains
CHANGES: tuple[Change, ...] = (
    Change("mixed-precision", "mixed precision (bf16)", _mixed),
    Change("pure-bf16", "pure bf16 weights and states", _training(precision="bf16")),
    Change("flash-attention", "flash attention (SDPA)", _flash),
    Change("chunked-loss", "chunked cross-entropy", _training(loss="chunked")),
    Change("release-outputs", "release the model output before backward", _release_outputs),
    Change(
        "release-previous-step",
        "free the previous step's loss and output (del loss, logits)",
        _release_previous,
    ),
    Change("fused-optimizer", "fused optimizer", _training(optimizer_impl="fused")),
    Change("8bit-optimizer", "8-bit AdamW", _eight_bit),
    Change(
        "selective-checkpointing",
        "selective checkpointing",
        _training(activation_checkpointing="selective"),
    ),
    Change("checkpointing", "full checkpointing", _training(activation_checkpointing="full")),
    Change("half-micro-batch", "half the micro-batch, twice the accumulation", _half_micro),
    Change("micro-batch-1", "micro-batch 1, the rest by accumulation", _micro_one),
    Change("zero1", "ZeRO-1 (shard optimizer states)", _zero(1)),
    Change("zero2", "ZeRO-2 (also gradients)", _zero(2)),
    Change("zero3", "ZeRO-3 / FSDP (also parameters)", _zero(3)),
    Change("cpu-offload", "optimizer offload to the CPU", _offload),
)
CHANGES_BY_KEY = {c.key: c for c in CHANGES}
#: changes that replace one another: a combination holds at most one of each set
EXCLUSIVE = (
    {"mixed-precision", "pure-bf16"},
    {"selective-checkpointing", "checkpointing"},
    {"half-micro-batch", "micro-batch-1"},
    {"zero1", "zero2", "zero3"},
)


@dataclass(frozen=True, slots=True)
class Fix:
    """A set of changes that makes the scenario fit, with what the result costs."""

    changes: tuple[str, ...]
    labels: tuple[str, ...]
    scenario: Scenario
    device_bytes: int
    budget_bytes: int
    time: StepTime


def _compatible(keys: Sequence[str]) -> bool:
    return all(len(ex.intersection(keys)) <= 1 for ex in EXCLUSIVE)


def combine(scenario: Scenario, keys: Iterable[str]) -> Scenario | None:
    """``scenario`` with the changes ``keys`` applied in order; ``None`` when one of them
    changes nothing (it does not apply, or an earlier one made it already)."""
    s: Scenario | None = scenario
    for key in keys:
        if s is None:
            return None
        s = CHANGES_BY_KEY[key].apply(s)
    return s


def make_it_fit(scenario: Scenario, top: int = 10, max_changes: int = 3) -> list[Fix]:
    """The changes, alone and up to ``max_changes`` combined, that bring the device total
    under the budget, fastest (tokens/s) first; a combination whose every change is
    needed -- no smaller subset of it fits -- and no two that give the same scenario."""
    fitting: dict[Scenario, Fix] = {}
    fit_sets: list[frozenset[str]] = []
    for size in range(1, max_changes + 1):
        for keys in itertools.combinations([c.key for c in CHANGES], size):
            if not _compatible(keys) or any(f <= set(keys) for f in fit_sets):
                continue
            s = combine(scenario, keys)
            if s is None or s in fitting:
                continue
            try:
                t = totals(s)
            except EstimateError:
                continue
            if t.device_bytes > t.budget_bytes:
                continue
            fit_sets.append(frozenset(keys))
            fitting[s] = Fix(
                keys,
                tuple(CHANGES_BY_KEY[k].label for k in keys),
                s,
                t.device_bytes,
                t.budget_bytes,
                step_time(s),
            )
    ranked = sorted(fitting.values(), key=lambda f: (-f.time.tokens_per_s, len(f.changes)))
    return ranked[:top]


def hardware_with(scenario: Scenario, gpu: str) -> Scenario:
    """``scenario`` on the GPU preset ``gpu``. The overrides that describe the scenario's
    own device -- memory, price per GPU-hour, efficiencies -- are dropped for another
    GPU: an H100's price must not cost an L40S run."""
    if gpu == scenario.hardware.gpu.name:
        return scenario
    hw: HardwareSpec = dataclasses.replace(
        scenario.hardware,
        gpu=load_gpu(gpu),
        memory_gib=None,
        price_per_gpu_hour=None,
        matmul_efficiency=None,
        attention_efficiency=None,
    )
    return dataclasses.replace(scenario, hardware=hw)
