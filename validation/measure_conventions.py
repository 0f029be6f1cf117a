"""Measure the cases of :mod:`validation.cases_conventions` and write their dataset.

    python -m validation.measure_conventions          # -> tests/validation/dataset_conventions.json
    python -m validation.measure_conventions --only torchtitan --jobs 2 --out FILE
    python -m validation.measure_conventions --list

Records as in ``dataset.json``; ``peak_allocated_bytes`` (and the phase peaks, the
breakdown, the first step) is the step in the case's own convention. Both ways of holding
the model output are kept in ``measured``: ``outputs_released_before_backward`` and
``outputs_held_through_backward``, one of them the reported step. Per-op checkpointing cases
add ``per_op_policy``: what the policy decided for one layer call.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any

from validation.measure import ROOT, _variant, parse_args, record, run_cases

DEFAULT_OUT = ROOT / "tests" / "validation" / "dataset_conventions.json"


def _policy(log: Counter[tuple[str, str, str]], layer_calls: int) -> dict[str, Any]:
    """The per-op policy's decisions per layer call: ``{op: {"save": n, "recompute": n}}``
    (torch asks the policy in the forward pass only; the recomputation replays those)."""
    per_op: dict[str, dict[str, int]] = {}
    for (op, _mode, decision), n in sorted(log.items()):
        entry = per_op.setdefault(op, {"save": 0, "recompute": 0})
        entry[decision] += n // layer_calls
    return {"layer_calls": layer_calls, "ops_per_layer_call": per_op}


def measure_case(case: dict[str, Any], sdpa_order: str = "") -> dict[str, Any]:
    """Measure one case (in this process); return its dataset record."""
    from validation import fakecuda  # noqa: F401  (before torch: it registers the CUDA hooks)
    from validation.sdpa import GpuProfile, parse_order
    from validation.step import POLICY_LOG, measure, spec_from_scenario

    profile = GpuProfile(order=parse_order(sdpa_order) if sdpa_order else ())
    started = time.perf_counter()
    spec = spec_from_scenario(case["scenario"])
    if spec.outputs_held_through_backward is None:
        raise ValueError(f"{case['id']}: outputs_held_through_backward is not set")
    m = measure(spec, profile)
    rec = record(case, m, profile, started)
    measured = rec["measured"]
    measured["outputs_held_through_backward"] = _variant(m.held)
    if spec.checkpointing == "per-op":
        layers = int(case["scenario"]["model"]["num_hidden_layers"])
        measured["per_op_policy"] = _policy(POLICY_LOG, 3 * layers)
    rec["env"]["seconds"] = round(time.perf_counter() - started, 2)
    return rec


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, DEFAULT_OUT)
    sys.path.insert(0, str(ROOT))
    from validation.cases_conventions import all_cases

    def label(rec: dict[str, Any]) -> str:
        t = rec["scenario"]["training"]
        return f"{t['stack']:<15} {rec['id']}"

    return run_cases(all_cases(), measure_case, args, 8, label)


if __name__ == "__main__":
    raise SystemExit(main())
