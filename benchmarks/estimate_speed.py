"""How fast is one estimate? Prints estimates per second, single and over 10,000 scenarios.

Target: one estimate well under 1 ms in pure Python. Run: ``python benchmarks/estimate_speed.py``.
"""

from __future__ import annotations

import itertools
import random
import statistics
import time

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.presets import gpu_names, load_gpu, load_model, model_names
from memfit.engine.specs import (
    METHODS,
    OPTIMIZERS,
    PRECISIONS,
    HardwareSpec,
    LoraSpec,
    Scenario,
    TrainingSpec,
)

TARGET_S = 1e-3


def single() -> list[float]:
    scenario = Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb")),
        TrainingSpec(method="lora", micro_batch_size=4),
    )
    estimate(scenario)  # warm the per-model caches, as the app does on the first edit
    rounds = []
    for _ in range(7):
        n = 2000
        start = time.perf_counter()
        for _ in range(n):
            estimate(scenario)
        rounds.append((time.perf_counter() - start) / n)
    return rounds


def varied(count: int = 10_000) -> tuple[float, float, int]:
    rng = random.Random(7)
    models = [load_model(n) for n in model_names()]
    gpus = [load_gpu(n) for n in gpu_names()]
    combos = list(itertools.product(METHODS, PRECISIONS, OPTIMIZERS))
    scenarios = []
    for _ in range(count):
        method, precision, optimizer = rng.choice(combos)
        scenarios.append(
            Scenario(
                rng.choice(models),
                HardwareSpec(rng.choice(gpus)),
                TrainingSpec(
                    method=method,
                    precision=precision,
                    optimizer=optimizer,
                    micro_batch_size=rng.choice((1, 2, 4, 8)),
                    sequence_length=rng.choice((512, 2048, 8192)),
                    lora=LoraSpec(
                        rank=rng.choice((8, 16, 64)),
                        targets=rng.choice((("q_proj", "v_proj"), ("all-linear",))),
                    ),
                ),
            )
        )

    def run_all() -> tuple[float, int]:
        errors = 0
        start = time.perf_counter()
        for s in scenarios:
            try:
                estimate(s)
            except EstimateError:  # e.g. q_proj on DeepSeek-V3, which has q_a/q_b instead
                errors += 1
        return time.perf_counter() - start, errors

    cold, errors = run_all()  # includes each model's first tensor inventory
    warm, _ = run_all()
    return cold / count, warm / count, errors


def main() -> None:
    rounds = single()
    best, median = min(rounds), statistics.median(rounds)
    cold, warm, errors = varied()
    print("estimate speed (pure Python, one core)")
    print(
        f"  single scenario   median {median * 1e6:8.1f} us   best {best * 1e6:8.1f} us"
        f"   {1 / median:10,.0f} estimates/s   {TARGET_S / median:6.1f}x under 1 ms"
    )
    print(
        f"  10,000 varied     first  {cold * 1e6:8.1f} us   again {warm * 1e6:7.1f} us"
        f"   {1 / warm:10,.0f} estimates/s   {TARGET_S / warm:6.1f}x under 1 ms"
    )
    print(f"  ({errors} of the 10,000 were rejected with an EstimateError, timed all the same)")


if __name__ == "__main__":
    main()
