"""Measure the cases of :mod:`validation.cases_litgpt` and write their dataset.

    python -m validation.measure_litgpt          # -> tests/validation/dataset_litgpt.json
    python -m validation.measure_litgpt --only qlora --jobs 2 --out FILE

Needs ``litgpt`` (and ``lightning``) in the harness environment beside torch (see
``validation/README.md``). A record: the case (its MemFit scenario and LitGPT config), and
``measured``: the third step's allocated peak, its phase and the peak of each phase, with
the parameter counts of LitGPT's model.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from validation.measure import ROOT, parse_args, run_cases

DEFAULT_OUT = ROOT / "tests" / "validation" / "dataset_litgpt.json"


def measure_case(case: dict[str, Any], sdpa_order: str = "") -> dict[str, Any]:
    """Measure one case (in this process); return its dataset record."""
    import litgpt
    import torch

    from validation import fakecuda  # noqa: F401  (before torch: it registers the CUDA hooks)
    from validation.litgpt_step import CONFIGS, measure, spec_from_case
    from validation.sdpa import GpuProfile, parse_order

    profile = GpuProfile(order=parse_order(sdpa_order) if sdpa_order else ())
    started = time.perf_counter()
    m = measure(spec_from_case(case), profile)
    return {
        "id": case["id"],
        "family": case["family"],
        "litgpt_config": CONFIGS[case["model_name"]],
        "layers": case["layers"],
        "scenario": case["scenario"],
        "measured": {
            "peak_allocated_bytes": m.peak_allocated_bytes,
            "peak_phase": m.peak_phase,
            "phase_peaks": m.phase_peaks,
            "attention_kernel": ",".join(m.attention_kernels),
        },
        "params_total": m.params_total,
        "params_trainable": m.params_trainable,
        "env": {
            "torch": torch.__version__,
            "litgpt": getattr(litgpt, "__version__", "unknown"),
            "gpu_profile": f"sm{profile.major}{profile.minor}",
            "seconds": round(time.perf_counter() - started, 2),
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, DEFAULT_OUT)
    sys.path.insert(0, str(ROOT))
    from validation.cases_litgpt import all_cases

    return run_cases(all_cases(), measure_case, args, 8, lambda rec: rec["id"])


if __name__ == "__main__":
    raise SystemExit(main())
