"""Real GPU steps against the traced steps and against MemFit's estimates.

    python -m validation.compare_gpu [validation/gpu/h200_steps.jsonl] [--cases]

Runs in MemFit's own environment (no PyTorch). ``validation/measure_gpu.py`` ran the traced
cases as real training steps on a GPU; this reads its records and prints, as ratios
(``estimate / measured - 1``):

* **tracer**: the traced peak (fake tensors, CPU) against ``max_memory_allocated`` on the GPU,
  for the same case and the same output convention -- how far the traced datasets, which the
  tests hold the engine to, are from the real allocator;
* **allocated**: MemFit's allocated peak against ``max_memory_allocated``;
* **reserved**: MemFit's reserved peak against ``max_memory_reserved``;
* **device**: MemFit's device total against what ``nvidia-smi`` shows for the process;
* **accumulation**: the measured peak with 2 and 4 micro-batches per step over the peak with 1,
  beside MemFit's;
* **whole models**: the same three figures for whole models alone on the GPU, and MemFit's step
  time against the measured median step.

Each case is estimated as the run ran: the harness's conventions (``tests/validation/traced``),
the output convention the step used, and the GPU it ran on.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "validation" / "gpu" / "h200_steps.jsonl"
#: the GPU preset of each device name the runner reports
GPUS = {"NVIDIA H200": "h200-sxm-141gb", "NVIDIA H100 80GB HBM3": "h100-sxm-80gb"}


def records(path: Path = DEFAULT) -> list[dict[str, Any]]:
    """The runner's case records (its ``meta`` lines left out)."""
    out = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in out if "id" in r and "gpu" in r]


def scenarios() -> dict[str, dict[str, Any]]:
    """Every case id the runner can measure, with its scenario (as the runner built it)."""
    from validation.cases import all_cases
    from validation.cases_conventions import all_cases as conventions_cases
    from validation.measure_gpu import _accumulated, _whole

    cases = all_cases() + conventions_cases()
    return {c["id"]: c["scenario"] for c in cases + _accumulated(all_cases()) + _whole()}


def traced_peaks() -> dict[tuple[str, bool], int]:
    """(case id, output released) -> the traced allocated peak."""
    from tests.validation.traced import as_traced

    out: dict[tuple[str, bool], int] = {}
    for name in ("dataset.json", "dataset_conventions.json"):
        for case in json.loads((ROOT / "tests" / "validation" / name).read_text()):
            m = case["measured"]
            held = as_traced(case["scenario"])["training"]["outputs_held_through_backward"]
            other = m[
                "outputs_released_before_backward" if held else "outputs_held_through_backward"
            ]
            out[case["id"], not held] = int(m["peak_allocated_bytes"])
            out[case["id"], held] = int(other["peak_allocated_bytes"])
    return out


def as_run(scenario: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """``scenario`` with the harness's conventions, the output convention the step ran and
    the GPU it ran on."""
    from tests.validation.traced import as_traced

    out = as_traced(scenario, held=not record["gpu"]["released_outputs"])
    gpu = GPUS.get(record.get("env", {}).get("gpu", ""))
    if gpu:
        out["hardware"] = {**out.get("hardware", {}), "gpu": gpu}
    return out


def compare(path: Path = DEFAULT) -> dict[str, Any]:
    """One row per measured case, and the summary of each figure."""
    from memfit.engine.errors import EstimateError
    from memfit.engine.estimate import estimate
    from memfit.engine.scenario_io import scenario_from_dict

    known, traced = scenarios(), traced_peaks()
    rows: list[dict[str, Any]] = []
    for rec in records(path):
        if rec["id"] not in known:
            continue
        gpu = rec["gpu"]
        row: dict[str, Any] = {"id": rec["id"], "part": rec.get("part", "traced")}
        key = (rec["id"], bool(gpu["released_outputs"]))
        if key in traced:
            row["tracer"] = traced[key] / gpu["peak_allocated_bytes"] - 1
        try:
            est = estimate(scenario_from_dict(as_run(known[rec["id"]], rec)))
        except EstimateError as exc:
            row["refused"] = str(exc)
            rows.append(row)
            continue
        row["allocated"] = est.allocated_bytes / gpu["peak_allocated_bytes"] - 1
        row["reserved"] = est.reserved_bytes / gpu["peak_reserved_bytes"] - 1
        if gpu.get("nvidia_smi_process_mib"):
            row["device"] = est.device_bytes / (gpu["nvidia_smi_process_mib"] << 20) - 1
        if gpu.get("step_seconds_median"):
            row["step_time"] = est.time.step_time_s / gpu["step_seconds_median"] - 1
        row["measured_allocated_bytes"] = gpu["peak_allocated_bytes"]
        row["estimated_allocated_bytes"] = est.allocated_bytes
        rows.append(row)
    return {"rows": rows, "summary": summary(rows), "accumulation": accumulation(rows)}


def _stats(values: list[float]) -> dict[str, float]:
    errors = sorted(abs(v) for v in values)
    if not errors:
        return {}
    return {
        "n": len(errors),
        "median": statistics.median(errors),
        "p90": errors[int(0.9 * len(errors))] if len(errors) >= 10 else errors[-1],
        "max": errors[-1],
        "mean_signed": statistics.fmean(values),
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per part of the run, each figure's |error| median, p90, max and signed mean."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for part in sorted({r["part"] for r in rows}):
        these = [r for r in rows if r["part"] == part]
        out[part] = {
            figure: _stats([r[figure] for r in these if figure in r])
            for figure in ("tracer", "allocated", "reserved", "device", "step_time")
            if any(figure in r for r in these)
        }
    return out


def accumulation(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each accumulated case's measured and estimated peak over its one-micro-batch case's."""
    by_id = {r["id"]: r for r in rows}
    out = []
    for r in rows:
        if "_accum" not in r["id"] or "measured_allocated_bytes" not in r:
            continue
        base = by_id.get(r["id"].split("_accum")[0])
        if not base or "measured_allocated_bytes" not in base:
            continue
        out.append(
            {
                "id": r["id"],
                "measured": r["measured_allocated_bytes"] / base["measured_allocated_bytes"] - 1,
                "estimated": r["estimated_allocated_bytes"] / base["estimated_allocated_bytes"] - 1,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    paths = [a for a in args if not a.startswith("--")]
    result = compare(Path(paths[0]) if paths else DEFAULT)
    if "--cases" in args:
        for r in result["rows"]:
            figures = "  ".join(
                f"{k} {r[k]:+7.2%}"
                for k in ("tracer", "allocated", "reserved", "device", "step_time")
                if k in r
            )
            print(f"{r['id'][:100]:100s} {figures or r.get('refused', '')}")
    for part, figures in result["summary"].items():
        print(f"{part}:")
        for figure, s in figures.items():
            print(
                f"  {figure:10s} n={s['n']:3.0f}  median {s['median']:6.2%}  p90 {s['p90']:6.2%}"
                f"  max {s['max']:6.2%}  signed mean {s['mean_signed']:+6.2%}"
            )
    for a in result["accumulation"]:
        print(
            f"accumulation {a['id']}: measured {a['measured']:+.2%}, MemFit {a['estimated']:+.2%}"
        )
    refused = [r for r in result["rows"] if "refused" in r]
    print(f"{len(result['rows'])} cases compared, {len(refused)} refused by the engine")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
