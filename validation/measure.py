"""Measure every case of :mod:`validation.cases` and write the dataset.

    python -m validation.measure                      # all cases -> tests/validation/dataset.json
    python -m validation.measure --only llama-2-7b    # cases whose id contains a text
    python -m validation.measure --jobs 2 --out FILE

Each case runs in a fresh worker process (the fake CUDA hooks must load before torch). The
dataset is a JSON list with one record per case: the MemFit scenario, what was measured and
the software used; the second training step is the one reported (AdamW creates its state in
the first).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tests" / "validation" / "dataset.json"
PHASES = ("forward", "loss", "backward", "optimizer")


def _peak_phase(phase: str) -> str:
    """MemFit's phases: the loss belongs to the forward pass."""
    return "forward" if phase == "loss" else phase


def measure_case(case: dict[str, Any], sdpa_order: str = "") -> dict[str, Any]:
    """Measure one case (in this process); return its dataset record."""
    from validation import fakecuda  # noqa: F401  (before torch: it registers the CUDA hooks)
    from validation.sdpa import GpuProfile, parse_order
    from validation.step import measure, spec_from_scenario

    profile = GpuProfile(order=parse_order(sdpa_order) if sdpa_order else ())
    started = time.perf_counter()
    m = measure(spec_from_scenario(case["scenario"]), profile)
    return record(case, m, profile, started)


def _variant(step: Any) -> dict[str, Any]:
    return {
        "peak_allocated_bytes": step.peak_rounded,
        "peak_phase": _peak_phase(step.peak_phase),
        "phase_peaks": {k: step.phase_peaks.get(k, 0) for k in PHASES},
    }


def record(case: dict[str, Any], m: Any, profile: Any, started: float) -> dict[str, Any]:
    """The dataset record of ``case`` from its measurement ``m`` (a ``step.Measurement``)."""
    import peft
    import torch
    import transformers

    s1, s2 = m.first, m.second
    phases = {k: s2.phase_peaks.get(k, 0) for k in PHASES}
    return {
        "id": case["id"],
        "family": case["family"],
        "scenario": case["scenario"],
        "measured": {
            "peak_allocated_bytes": s2.peak_rounded,
            "peak_allocated_raw_bytes": s2.peak_raw,
            "first_step_peak_bytes": s1.peak_rounded,
            "peak_phase": _peak_phase(s2.peak_phase),
            "phase_peaks": phases,
            "breakdown_at_peak": {
                k: s2.breakdown.get(k, 0)
                for k in ("parameters", "gradients", "optimizer_states", "other")
            },
            "before_step_bytes": s2.before_step,
            "attention_kernel": ",".join(m.attention_kernels),
            # further detail, beyond what the comparison needs
            "peak_phase_detail": s2.peak_phase,
            "after_step_bytes": s2.after_step,
            "first_step_peak_phase": _peak_phase(s1.peak_phase),
            "first_step_before_bytes": s1.before_step,
            "breakdown_at_peak_raw": s2.breakdown_raw,
            "params_total": m.params_total,
            "params_trainable": m.params_trainable,
            "param_bytes": m.param_bytes,
            "logits_bytes": m.logits_bytes,
            "optimizer_impl_used": m.optimizer_impl_used,
            "outputs_released_before_backward": _variant(m.released),
        },
        "env": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "mode": "fake-cuda",
            "gpu_profile": f"{profile.name} sm{profile.major}{profile.minor} "
            f"cudnn {profile.cudnn_version}",
            "sdpa_priority": list(profile.priority()),
            "seconds": round(time.perf_counter() - started, 2),
        },
    }


Measure = Callable[[dict[str, Any], str], dict[str, Any]]


def _worker(args: tuple[Measure, dict[str, Any], str]) -> dict[str, Any]:
    measure, case, order = args
    try:
        return measure(case, order)
    except Exception:  # report and go on with the other cases
        return {"id": case["id"], "error": traceback.format_exc()}


def parse_args(argv: list[str] | None, doc: str, out: Path) -> argparse.Namespace:
    """The command line both runners share."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="id substring (repeatable)")
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument(
        "--sdpa-order",
        default="",
        help="SDPA backend priority, e.g. flash,efficient,math,cudnn (default: what PyTorch "
        "picks on an H100 with the cuDNN its CUDA 13 wheels ship)",
    )
    parser.add_argument("--list", action="store_true", help="print the case ids and stop")
    return parser.parse_args(argv)


def run_cases(
    cases: list[dict[str, Any]],
    measure: Measure,
    args: argparse.Namespace,
    tasks_per_worker: int,
    label: Callable[[dict[str, Any]], str],
) -> int:
    """Measure ``cases`` in spawned worker processes (the fake CUDA hooks must load before
    torch), print a line per case and write the records to ``args.out`` in case order."""
    cases = [c for c in cases if not args.only or any(o in c["id"] for o in args.only)]
    if args.list:
        for c in cases:
            print(c["id"])
        return 0
    order = {c["id"]: i for i, c in enumerate(cases)}
    started = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    records: list[dict[str, Any]] = []
    failed = 0
    with ctx.Pool(processes=max(1, args.jobs), maxtasksperchild=tasks_per_worker) as pool:
        work = [(measure, c, args.sdpa_order) for c in cases]
        for rec in pool.imap(_worker, work):
            if "error" in rec:
                failed += 1
                print(f"FAILED {rec['id']}\n{rec['error']}", file=sys.stderr, flush=True)
                continue
            records.append(rec)
            m = rec["measured"]
            print(
                f"{rec['env']['seconds']:6.1f}s  {m['peak_allocated_bytes'] / 2**30:8.3f} GiB  "
                f"{m['peak_phase']:<9} {label(rec)}",
                flush=True,
            )
    elapsed = time.perf_counter() - started
    records.sort(key=lambda r: order[r["id"]])
    args.out.write_text(json.dumps(records, indent=1) + "\n")
    print(f"{len(records)} cases written to {args.out} in {elapsed:.0f} s; {failed} failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, DEFAULT_OUT)
    sys.path.insert(0, str(ROOT))
    from validation.cases import all_cases

    def label(rec: dict[str, Any]) -> str:
        return f"{rec['measured']['attention_kernel']:<18} {rec['id']}"

    return run_cases(all_cases(), measure_case, args, 8, label)


if __name__ == "__main__":
    raise SystemExit(main())
