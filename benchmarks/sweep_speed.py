"""How fast are sweeps? One estimate, the memoised totals, and 5,000 configurations through
``engine.batch.totals_over``, with llm-analysis measured side by side on the
configurations both model.

Run: ``python benchmarks/sweep_speed.py``. It prints:

a. one warm ``estimate()`` (Llama 3 8B, LoRA, micro-batch 4 on one H100, as
   ``benchmarks/estimate_speed.py``; the same scenario again, every cache warm);
b. ``totals()``: a scenario not seen before (its block profiles built), other micro-batches
   of it (warm: not memoised, the profiles built), and the same one again (memoised);
c. 5,000 configurations of a sweep around Llama 3 8B on 8 H100s -- precision x
   optimizer x checkpointing x ZeRO stage x tp x pp x micro-batch x sequence length,
   about 18 shapes per strategy -- through ``totals_over``, one call per strategy: the
   first time in this process (every block profile built), again with the batched
   module's own caches cleared (each strategy rebuilt; block profiles, model states
   and step plans cached), and again with its caches kept;
d. llm-analysis 0.2.2 (``LLMAnalysis.training``, its logging off) over the same model,
   GPU, tp, pp, dp, micro-batch, sequence length, ZeRO stage and activation
   recomputation, on the configurations it models too (bf16 mixed precision, AdamW;
   no recomputation, selective or full), with MemFit on those same configurations;
e. the ratio of configurations per second.

llm-analysis is not a dependency of MemFit: this script installs it into ``.bench-venv``
(git-ignored) the first time, and runs it there in a subprocess
(``benchmarks/llm_analysis_bench.py``, shared with ``benchmarks/user_speed.py``). Figures
only; nothing is asserted.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from memfit.engine import batch, memo, steptime
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llm_analysis_bench

PRECISIONS = ("bf16-mixed", "bf16")
OPTIMIZERS = ("adamw", "adamw-8bit", "sgd-momentum")
CHECKPOINTING = ("none", "selective", "full", "every-k-layers")
ZERO_STAGES = (0, 1, 2, 3)
#: (tp, pp) on 8 GPUs; dp is what is left
MESHES = ((1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2), (4, 2), (1, 4), (2, 4), (1, 8))
MICRO_BATCHES = (1, 2, 3, 4, 6, 8)
SEQUENCES = (2048, 4096, 8192)
ACCUMULATION = 8
CONFIGURATIONS = 5000

#: what "strategies rebuilt" clears (engine.memo): the batched module's totals and
#: strategies, and the step-time plans and stage blocks; block profiles, model states,
#: step plans and per-layer work stay
STRATEGY_CACHES = (
    "memfit.engine.batch.totals",
    "memfit.engine.batch._STRATEGIES",
    "memfit.engine.steptime._MEMOS",
    "memfit.engine.steptime._BY_ID",
)

#: a strategy: precision, optimizer, checkpointing, ZeRO stage, tp, pp
Strategy = tuple[str, str, str, int, int, int]
#: a strategy and its shapes (micro_batch_size, sequence_length, gradient_accumulation)
Sweep = list[tuple[Strategy, list[tuple[int, int, int]]]]


def scenario(strategy: Strategy) -> Scenario:
    precision, optimizer, checkpointing, zero, tp, pp = strategy
    return Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8),
        TrainingSpec(
            precision=precision,
            optimizer=optimizer,
            activation_checkpointing=checkpointing,
            checkpoint_every_k=4,
            gradient_accumulation_steps=ACCUMULATION,
            parallelism=ParallelismSpec(tp=tp, pp=pp, zero_stage=zero),
        ),
    )


def sweep() -> Sweep:
    """5,000 configurations: the strategies in a seeded random order, each with all of
    its shapes (the last one with what is left)."""
    strategies: list[Strategy] = [
        (*rest, tp, pp)
        for *rest, (tp, pp) in itertools.product(
            PRECISIONS, OPTIMIZERS, CHECKPOINTING, ZERO_STAGES, MESHES
        )
    ]
    random.Random(7).shuffle(strategies)
    shapes = [(b, s, ACCUMULATION) for b in MICRO_BATCHES for s in SEQUENCES]
    out: Sweep = []
    left = CONFIGURATIONS
    for strategy in strategies:
        if left <= 0:
            break
        out.append((strategy, shapes[:left]))
        left -= len(shapes)
    return out


def run_memfit(configs: Sweep, with_time: bool = False) -> tuple[float, int]:
    """Seconds for ``totals_over`` on every strategy (and ``step_times``, the step time
    of every shape, when ``with_time``), and how many points were errors."""
    scenarios = [(scenario(strategy), shapes) for strategy, shapes in configs]
    start = time.perf_counter()
    errors = 0
    for s, shapes in scenarios:
        errors += sum(isinstance(t, EstimateError) for t in batch.totals_over(s, shapes))
        if with_time:
            steptime.step_times(s, shapes)
    return time.perf_counter() - start, errors


def rebuilt(configs: Sweep, with_time: bool, repeats: int) -> float:
    """Best of ``repeats`` runs, each with the strategies' caches cleared first."""
    rounds = []
    for _ in range(repeats):
        memo.clear(*STRATEGY_CACHES)
        rounds.append(run_memfit(configs, with_time)[0])
    return min(rounds)


def best_of(repeats: int, f: Callable[[], object], number: int) -> float:
    """The fastest of ``repeats`` rounds of ``number`` calls, per call."""
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            f()
        rounds.append((time.perf_counter() - start) / number)
    return min(rounds)


def common(configs: Sweep) -> tuple[Sweep, list[dict[str, object]]]:
    """The configurations llm-analysis models too, as a sweep and as its inputs."""
    shared: Sweep = []
    inputs: list[dict[str, object]] = []
    for strategy, shapes in configs:
        precision, optimizer, checkpointing, zero, tp, pp = strategy
        if precision != "bf16-mixed" or optimizer != "adamw" or checkpointing == "every-k-layers":
            continue
        shared.append((strategy, shapes))
        for micro, seq, accumulation in shapes:
            inputs.append(
                {
                    "tp": tp,
                    "pp": pp,
                    "dp": 8 // (tp * pp),
                    "zero": zero,
                    "checkpointing": checkpointing,
                    "micro": micro,
                    "seq": seq,
                    "accumulation": accumulation,
                }
            )
    return shared, inputs


def count(configs: Sweep) -> int:
    return sum(len(shapes) for _, shapes in configs)


def report(label: str, seconds: float, n: int, errors: int | None = None) -> None:
    extra = f"   ({errors:,} rejected with an EstimateError)" if errors is not None else ""
    print(f"  {label:50s} {seconds:8.3f} s  {n / seconds:12,.0f} configurations/s{extra}")


def main(argv: Sequence[str] = ()) -> None:
    configs = sweep()
    n = count(configs)
    print("sweep speed (pure Python + numpy, one core)")

    one = Scenario(  # as benchmarks/estimate_speed.py
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb")),
        TrainingSpec(method="lora", micro_batch_size=4),
    )
    estimate(one)
    warm = best_of(7, lambda: estimate(one), 300)
    print(f"(a) one warm estimate()                        {warm * 1e3:8.4f} ms")

    new = scenario(("bf16", "lion", "full", 2, 2, 1))
    start = time.perf_counter()
    batch.totals(new)
    first = time.perf_counter() - start
    shapes = [
        dataclasses.replace(new, training=dataclasses.replace(new.training, micro_batch_size=b))
        for b in range(2, 302)
    ]
    start = time.perf_counter()
    for s in shapes:  # not seen by totals(), its block profiles warm
        batch.totals(s)
    warm_totals = (time.perf_counter() - start) / len(shapes)
    memo = best_of(7, lambda: batch.totals(new), 2000)
    print(f"(b) totals(): a new scenario, its profiles built  {first * 1e3:8.3f} ms")
    print(f"    another micro-batch of it (warm)               {warm_totals * 1e3:8.4f} ms")
    print(f"    the same again (memoised)                      {memo * 1e3:8.4f} ms")

    print(f"(c) {n:,} configurations, {len(configs)} strategies, through totals_over")
    cold, errors = run_memfit(configs)
    report("first in this process (profiles built)", cold, n, errors)
    report("again, strategies rebuilt (best of 3)", rebuilt(configs, False, 3), n)
    kept = min(run_memfit(configs)[0] for _ in range(3))
    report("again, strategies kept (best of 3)", kept, n)
    run_memfit(configs, with_time=True)
    report("memory and step time, strategies rebuilt (best of 3)", rebuilt(configs, True, 3), n)

    shared, inputs = common(configs)
    m = count(shared)
    print(f"(d) the {m:,} configurations llm-analysis models too")
    python = llm_analysis_bench.bench_python()
    if python is None:
        print("  llm-analysis not available: (d) and (e) skipped")
        return
    run = llm_analysis_bench.run(python, llm_analysis_bench.LLAMA_3_8B, inputs, rounds=5)
    theirs = {"seconds": min(run.rounds), "failed": run.failed}
    ours = rebuilt(shared, False, 10)
    report("MemFit totals_over (strategies rebuilt, best of 10)", ours, m)
    both = rebuilt(shared, True, 10)
    report("MemFit memory and step time (the same, best of 10)", both, m)
    print(
        f"  {'llm-analysis LLMAnalysis.training (best of 5)':50s} {theirs['seconds']:8.3f} s  "
        f"{m / theirs['seconds']:12,.0f} configurations/s   "
        f"({theirs['failed']:,} raised: does not fit)"
    )
    print(
        "(e) MemFit / llm-analysis, configurations per second: "
        f"{theirs['seconds'] / ours:.1f}x on memory, {theirs['seconds'] / both:.1f}x on memory "
        "and step time (llm-analysis computes both)"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
