"""Property checks over random scenarios: how many held, how many failed.

Two populations, drawn with hypothesis from one seed -- a fresh one each run, printed, or
``--seed N`` to draw the same again (CI's tests draw from fixed seeds):

* **junk** -- scenario dicts with values of every type in every field, integers of
  hundreds and thousands of digits and lists nested hundreds of levels deep included
  (``tests/engine/test_properties.py``): each must estimate or raise the engine's one
  error, ``EstimateError``, naming a field; any other exception is counted;
* **valid** -- scenarios over every preset, GPU and training setting
  (``tests/engine/invariants.py``), each checked for every invariant there: totals that
  add up and are never negative, allocated <= reserved <= device, a larger micro-batch or
  sequence never lowering the allocated peak (nor a larger micro-batch the step time),
  more checkpointing never raising the activations, more sharding never raising the
  model state, every block's profile equal to its direct simulation.

Every figure printed says how many were drawn and from which seed: "0 failures" holds for
that draw, not for every scenario.

Run: ``python benchmarks/properties.py [--examples 20000] [--junk 10000] [--seed N]``
(``--junk 0`` leaves the junk draw out).
"""

from __future__ import annotations

import argparse
import reprlib
import secrets
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

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


#: a drawn scenario as a failure shows it: short, and safe for nesting 990 levels deep
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 4, 80, 80, 80


def run(
    strategy: Any, examples: int, check: Any, draw_seed: int
) -> tuple[int, Counter[str], Counter[str], list[str]]:
    """Draw up to ``examples`` from ``strategy`` with ``draw_seed``; how many were drawn,
    the checks that held and those that failed (by name), and the first few failures."""
    held: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    firsts: list[str] = []
    drawn = 0

    @seed(draw_seed)
    @settings(QUIET, max_examples=examples)
    @given(strategy)
    def one(data: dict[str, Any]) -> None:
        nonlocal drawn
        drawn += 1
        try:
            for name in check(data) or ["drawn"]:
                held[name] += 1
        except Exception as exc:  # every failure is counted, the first few shown
            frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
            where = next((f for f in reversed(frames) if f.startswith("check")), frames[-1])
            failed[f"{where}: {type(exc).__name__}"] += 1
            if len(firsts) < 5:
                firsts.append(f"{where}: {exc!s:.300} <- {_SHORT.repr(data)[:300]}")

    one()
    return drawn, held, failed, firsts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--junk", type=int, default=10_000)
    parser.add_argument("--seed", type=int, help="draw again what a run drew (default: fresh)")
    args = parser.parse_args()
    draw_seed = args.seed if args.seed is not None else secrets.randbelow(2**32)
    print(f"seed {draw_seed} (python benchmarks/properties.py --seed {draw_seed} draws it again)")
    bad = 0
    start = time.perf_counter()

    def junk(data: dict[str, Any]) -> list[str]:
        check_junk(data)
        return ["estimate or EstimateError"]

    total = 0
    if args.junk > 0:  # --junk 0 leaves the junk out
        drawn, held, failed, firsts = run(junk_scenarios, args.junk, junk, draw_seed)
        took = time.perf_counter() - start
        of = f"of {drawn:,} drawn, seed {draw_seed}"
        print(f"junk scenarios: {drawn:,} drawn from seed {draw_seed} in {took:.0f} s")
        estimated = held["estimate or EstimateError"]
        print(f"  {estimated:,} estimated or refused with EstimateError ({of})")
        print(f"  {sum(failed.values()):,} other exceptions or broken totals ({of}; target 0)")
        bad += sum(failed.values())
        total = drawn
        for line in firsts:
            print("   ", line)
    start = time.perf_counter()
    drawn, held, failed, firsts = run(scenarios, args.examples, check_all, draw_seed)
    took = time.perf_counter() - start
    total += drawn
    print(f"valid scenarios: {drawn:,} drawn from seed {draw_seed} in {took:.0f} s")
    print(f"  {'invariant':<16}{'held':>10}{'failed':>10}   (of {drawn:,} drawn, seed {draw_seed})")
    for name in ("totals", "shapes", "checkpointing", "sharding", "profiles"):
        fails = sum(n for k, n in failed.items() if k.startswith(f"check_{name}"))
        print(f"  {name:<16}{held[name]:>10,}{fails:>10,}")
    other = {k: n for k, n in failed.items() if not k.startswith("check_")}
    if other:
        print(f"  other failures: {other}")
    bad += sum(failed.values())
    for line in firsts:
        print("   ", line)
    print(f"failures: {bad} of {total:,} drawn from seed {draw_seed} (target 0)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
