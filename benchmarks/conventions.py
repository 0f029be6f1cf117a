"""The traced dataset by training-stack convention: allocated peak, |relative error|.

Every case of ``tests/validation/dataset.json`` and ``dataset_conventions.json`` is
compared twice -- with the model output held through backward and the optimizer step, and
released before backward -- each with the conventions its trace ran; every case of
``dataset_litgpt.json`` (LitGPT's own model code and loop) once, as it ran. Run:
``python benchmarks/conventions.py [--markdown]``.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.scenario_io import scenario_from_dict
from memfit.engine.stacks import conventions

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.validation.traced import as_traced, traced_peak

DATA = Path(__file__).resolve().parent.parent / "tests" / "validation"


def _groups(scenario: dict, error: float, out: dict[str, list[float]]) -> None:
    s = scenario_from_dict(scenario)
    conv = conventions(s.training)
    out["all"].append(error)
    out[f"outputs {'held' if conv.outputs_held else 'released'}"].append(error)
    if s.training.method != "full":
        out[f"frozen weights {conv.frozen_dtype}"].append(error)
    if s.training.method in ("lora", "qlora"):
        out[f"adapters {conv.adapter_dtype}"].append(error)
    out[f"loss {s.training.loss}"].append(error)
    out[f"checkpointing {s.training.activation_checkpointing}"].append(error)
    out[f"stack {conv.stack}"].append(error)
    out[f"model code {conv.implementation}"].append(error)
    out[f"method {s.training.method}"].append(error)
    if conv.implementation == "litgpt":
        out[f"previous step {'held' if conv.previous_held else 'released'}"].append(error)


def main(markdown: bool) -> None:
    groups: dict[str, list[float]] = defaultdict(list)
    refused: list[str] = []
    for name in ("dataset.json", "dataset_conventions.json"):
        for case in json.loads((DATA / name).read_text()):
            for held in (True, False):
                scenario = as_traced(case["scenario"], held)
                try:
                    est = estimate(scenario_from_dict(scenario)).allocated_bytes
                except EstimateError as exc:
                    refused.append(f"{case['id']}: {exc}")
                    continue
                _groups(scenario, est / traced_peak(case, held) - 1, groups)
    for case in json.loads((DATA / "dataset_litgpt.json").read_text()):
        est = estimate(scenario_from_dict(case["scenario"])).allocated_bytes
        _groups(case["scenario"], est / case["measured"]["peak_allocated_bytes"] - 1, groups)
    rows = sorted(groups.items(), key=lambda kv: (kv[0] != "all", kv[0]))
    if markdown:
        print("| convention | cases | median | p90 | max |")
        print("|---|---:|---:|---:|---:|")
    for name, errs in rows:
        a = sorted(abs(e) for e in errs)
        p90 = a[min(len(a) - 1, int(0.9 * len(a)))]
        if markdown:
            print(f"| {name} | {len(a)} | {statistics.median(a):.2%} | {p90:.2%} | {a[-1]:.2%} |")
        else:
            print(f"{name:<32}{len(a):>5}{statistics.median(a):>9.2%}{p90:>9.2%}{a[-1]:>9.2%}")
    for line in dict.fromkeys(refused):
        print(f"not estimated: {line}")


if __name__ == "__main__":
    main("--markdown" in sys.argv)
