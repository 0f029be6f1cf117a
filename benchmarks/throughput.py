"""How close is the step-time model to published throughput? Prints the error table.

Each case of ``tests/validation/throughput.json`` is a published training run (Megatron-LM
papers, NeMo and Megatron-Bridge performance summaries, torchtitan, llm-foundry) with
its source; the engine recomputes its tokens/s per GPU from the scenario alone. Targets:
median |error| 15 % or less; pairs that differ in one setting ordered as measured in at
least 9 of 10. Run: ``python benchmarks/throughput.py [--markdown]``.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.validation.throughput import (
    FAMILIES,
    ORDER_NOISE,
    Case,
    cases,
    median_error,
    pairs,
)

SOURCES = {
    "narayanan2021": "Narayanan et al. 2021 (Megatron-LM, A100)",
    "korthikanti2022": "Korthikanti et al. 2022, table 5 (A100)",
    "llmfoundry": "llm-foundry benchmarks (A100, H100)",
    "torchtitan": "torchtitan performance (A100)",
    "nemo2407": "NeMo 24.07 performance summary (H100, FP8)",
    "megatronbridge2511": "Megatron-Bridge 25.11 (H100, FP8)",
}


def group(c: Case) -> str:
    return SOURCES.get(c.id.split("-")[0], c.id.split("-")[0])


def _family(results: list[Case], name: str) -> list[Case]:
    """The runs of the family ``name`` (:data:`FAMILIES`)."""
    return [c for c in results if name in c.families]


def _row(name: str, group_cases: list[Case]) -> str:
    e = [abs(c.error) for c in group_cases]
    signed = statistics.median(c.error for c in group_cases)
    return (f"| {name} | {len(e)} | {100 * statistics.median(e):.1f} % | "
            f"{100 * signed:+.1f} % | {100 * max(e):.1f} % |")  # fmt: skip


def main() -> None:
    markdown = "--markdown" in sys.argv
    results = cases()
    by: dict[str, list[Case]] = defaultdict(list)
    for c in results:
        by[group(c)].append(c)
    found = pairs(results)
    ordered = sum(ok for *_, ok in found)
    errs = sorted(abs(c.error) for c in results)
    p90 = errs[int(0.9 * (len(errs) - 1))]
    if markdown:
        head = (
            "| {} | cases | median abs. error | signed median | worst |\n|---|---:|---:|---:|---:|"
        )
        print(head.format("source"))
        for name, group_cases in by.items():
            print(_row(name, group_cases))
        signed = statistics.median(c.error for c in results)
        print(f"| **all** | **{len(results)}** | **{100 * median_error(results):.1f} %** "
              f"| {100 * signed:+.1f} % | {100 * errs[-1]:.1f} % |")  # fmt: skip
        print()
        print("By family of runs (a run can be in several; signed: + is faster than measured):")
        print()
        print(head.format("family"))
        for name, _ in FAMILIES:
            members = _family(results, name)
            print(_row(name, members) if members else f"| {name} | 0 | -- | -- | -- |")
        print()
        print(f"p90 {100 * p90:.1f} %. Pairs that differ in one setting, ordered as measured: "
              f"**{ordered} of {len(found)}** (pairs within {ORDER_NOISE:.0%} of each other "
              "left out).")  # fmt: skip
        return
    print(f"{'case':<48}{'GPUs':>6}{'measured':>10}{'MemFit':>10}{'error':>9}  bound")
    for c in results:
        print(f"{c.id:<48}{c.gpus:>6}{c.measured:>10,.0f}{c.estimated:>10,.0f}"
              f"{100 * c.error:>+8.1f}%  {c.bound}")  # fmt: skip
    print(f"\nmedian |error| {100 * median_error(results):.1f} %   p90 {100 * p90:.1f} %   "
          f"worst {100 * errs[-1]:.1f} %   (target: median 15 %)")  # fmt: skip
    print(f"pairs ordered as measured: {ordered} of {len(found)} (target 9 of 10)")
    for name, _ in FAMILIES:
        members = _family(results, name)
        if members:
            signed = statistics.median(c.error for c in members)
            print(f"  {name:<24} {len(members):>3} runs, signed median {100 * signed:+.1f} %")
    for a, b, what, ok in found:
        if not ok:
            print(f"  misordered: {a.id} vs {b.id} ({what})")


if __name__ == "__main__":
    main()
