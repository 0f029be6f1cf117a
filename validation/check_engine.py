"""Check the dataset's scenarios against the engine: each loads, and the engine counts the
parameters the measured Hugging Face model really had.

    python -m validation.check_engine [tests/validation/dataset.json]

Runs in MemFit's own environment (no PyTorch). Prints one line per case whose counts
differ, then a summary; exits 1 if a scenario does not load. Count mismatches are reported,
not fatal: they are findings about the engine (or about how a family is built by HF).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "tests" / "validation" / "dataset.json"


def engine_counts(scenario_dict: dict[str, Any]) -> dict[str, int]:
    """Total and trainable parameters as the engine sees ``scenario_dict``."""
    from memfit.engine.model_state import model_state
    from memfit.engine.scenario_io import scenario_from_dict

    scenario = scenario_from_dict(scenario_dict)
    state = model_state(scenario.model, scenario.training)
    return {"total": state.total_params, "trainable": state.trainable_params}


def compare(dataset: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """(cases that failed to load, one record per count mismatch)."""
    from memfit.engine.errors import EstimateError

    failed: list[str] = []
    mismatches: list[dict[str, Any]] = []
    for case in dataset:
        try:
            counts = engine_counts(case["scenario"])
        except EstimateError as exc:
            failed.append(f"{case['id']}: {exc}")
            continue
        measured = case["measured"]
        real = {"total": measured["params_total"], "trainable": measured["params_trainable"]}
        if counts != real:
            mismatches.append(
                {
                    "id": case["id"],
                    "engine": counts,
                    "hf": real,
                    "diff_total": counts["total"] - real["total"],
                    "diff_trainable": counts["trainable"] - real["trainable"],
                }
            )
    return failed, mismatches


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DEFAULT
    sys.path.insert(0, str(ROOT))
    dataset = json.loads(path.read_text())
    failed, mismatches = compare(dataset)
    for line in failed:
        print("DOES NOT LOAD", line)
    for m in mismatches:
        print(
            f"{m['id']}: engine total {m['engine']['total']:,} vs HF {m['hf']['total']:,} "
            f"({m['diff_total']:+,}); trainable {m['engine']['trainable']:,} vs "
            f"{m['hf']['trainable']:,} ({m['diff_trainable']:+,})"
        )
    n = len(dataset)
    print(f"{n} cases: {n - len(failed)} load, {len(mismatches)} with parameter-count mismatches")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
