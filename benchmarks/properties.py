"""Property checks over random scenarios: how many held, how many failed.

Two populations, drawn with hypothesis:

* **junk** -- scenario dicts with values of every type in every field
  (``tests/engine/test_properties.py``): each must estimate or raise the engine's one
  error, ``EstimateError``, naming a field; any other exception is counted;
* **valid** -- scenarios over every preset, GPU and training setting
  (``tests/engine/invariants.py``), each checked for every invariant there: totals that
  add up and are never negative, allocated <= reserved <= device, a larger micro-batch or
  sequence never lowering the allocated peak, more checkpointing never raising the
  activations, more sharding never raising the model state, every block's profile equal
  to its direct simulation.

Run: ``python benchmarks/properties.py [--examples 10000] [--junk 10000]``.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.engine.invariants import check_all, scenarios
from tests.engine.test_properties import check as check_junk
from tests.engine.test_properties import scenarios as junk_scenarios

QUIET = settings(
    deadline=None,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def run(strategy: Any, examples: int, check: Any) -> tuple[Counter[str], Counter[str], list[str]]:
    held: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    firsts: list[str] = []

    @settings(QUIET, max_examples=examples)
    @given(strategy)
    def one(data: dict[str, Any]) -> None:
        try:
            for name in check(data) or ["drawn"]:
                held[name] += 1
        except Exception as exc:  # every failure is counted, the first few shown
            frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
            where = next((f for f in reversed(frames) if f.startswith("check")), frames[-1])
            failed[f"{where}: {type(exc).__name__}"] += 1
            if len(firsts) < 5:
                firsts.append(f"{where}: {exc!s:.300} <- {data!r:.300}")

    one()
    return held, failed, firsts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--junk", type=int, default=10_000)
    args = parser.parse_args()
    bad = 0
    start = time.perf_counter()

    def junk(data: dict[str, Any]) -> list[str]:
        check_junk(data)
        return ["estimate or EstimateError"]

    held, failed, firsts = run(junk_scenarios, args.junk, junk)
    took = time.perf_counter() - start
    print(f"junk scenarios: {args.junk:,} drawn in {took:.0f} s")
    print(f"  {held['estimate or EstimateError']:,} estimated or refused with EstimateError")
    print(f"  {sum(failed.values()):,} other exceptions or broken totals (target 0)")
    bad += sum(failed.values())
    for line in firsts:
        print("   ", line)
    start = time.perf_counter()
    held, failed, firsts = run(scenarios, args.examples, check_all)
    took = time.perf_counter() - start
    print(f"valid scenarios: {args.examples:,} drawn in {took:.0f} s")
    print(f"  {'invariant':<16}{'held':>10}{'failed':>10}")
    for name in ("totals", "shapes", "checkpointing", "sharding", "profiles"):
        fails = sum(n for k, n in failed.items() if k.startswith(f"check_{name}"))
        print(f"  {name:<16}{held[name]:>10,}{fails:>10,}")
    other = {k: n for k, n in failed.items() if not k.startswith("check_")}
    if other:
        print(f"  other failures: {other}")
    bad += sum(failed.values())
    for line in firsts:
        print("   ", line)
    print(f"failures: {bad} (target 0)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
