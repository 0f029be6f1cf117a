"""Measure the multi-GPU cases of :mod:`validation.cases_multi` and write their dataset.

    python -m validation.measure_multi                 # -> tests/validation/dataset_multi.json
    python -m validation.measure_multi --only fsdp2-z3 --out FILE
    python -m validation.measure_multi --list

Each case runs in a worker process of its own (the fake CUDA hooks must load before torch,
and the fake process group is global state) as rank 0 of a fake process group of the
case's world size. The second training step is reported, as in ``dataset.json``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from validation.measure import PHASES, ROOT, _peak_phase, parse_args, run_cases

DEFAULT_OUT = ROOT / "tests" / "validation" / "dataset_multi.json"


def _notes(case: dict[str, Any]) -> list[str]:
    setup, s = case["setup"], case["scenario"]
    t, world = s["training"], s["hardware"]["gpus_per_node"]
    notes = [f"rank 0 of {world}, fake process group (collectives allocate, never communicate)"]
    if setup["strategy"] == "fsdp2":
        dtypes = {"compute": "bf16", "fp32": "fp32"}
        param = dtypes[setup.get("fsdp_param_dtype", "compute")]
        reduce = dtypes[setup.get("fsdp_reduce_dtype", "fp32")]
        policy = (
            f"MixedPrecisionPolicy(param_dtype={param}, reduce_dtype={reduce}) on fp32 "
            "parameters, " + ("torch.autocast(bf16)" if param == "fp32" else "no autocast")
            if setup["fsdp_mixed_precision"]
            else f"no mixed-precision policy, {t['precision']} parameters, no autocast"
        )
        notes += [
            "FSDP2 fully_shard on every decoder layer, then on the root model "
            f"(embedding, final norm, LM head), reshard_after_forward="
            f"{setup['reshard_after_forward']}",
            policy,
        ]
    else:
        plan = (
            "embedding row-wise (vocabulary-parallel), LM head column-wise with logits "
            "sharded over the vocabulary, loss_parallel"
            if setup["tp_vocab_parallel"]
            else "embedding and LM head whole on every rank (full logits)"
        )
        notes += [
            "DTensor tensor parallelism: ColwiseParallel q/k/v/gate/up, RowwiseParallel "
            "o/down, " + plan,
            "sequence parallelism on the norms (residual stream sharded over the sequence)"
            if t["parallelism"]["sequence_parallel"]
            else "no sequence parallelism",
            "torch.autocast(bf16) on fp32 parameters"
            if t["precision"] == "bf16-mixed"
            else f"{t['precision']} parameters, no autocast",
            "optimizer step under implicit_replication (parameters left whole are plain tensors)",
        ]
    return notes


def measure_case(case: dict[str, Any], sdpa_order: str = "") -> dict[str, Any]:
    """Measure one case (in this process); return its dataset record."""
    # isort: off
    from validation import fakecuda  # noqa: F401  (before torch: it registers the CUDA hooks)
    import torch
    import transformers
    # isort: on

    from validation.distributed import measure_multi, multi_spec_from_case
    from validation.sdpa import GpuProfile, parse_order

    profile = GpuProfile(order=parse_order(sdpa_order) if sdpa_order else ())
    started = time.perf_counter()
    m = measure_multi(multi_spec_from_case(case), profile)
    s1, s2 = m.first, m.second
    world = case["scenario"]["hardware"]["gpus_per_node"]
    return {
        "id": case["id"],
        "family": case["family"],
        "scenario": case["scenario"],
        "setup": case["setup"],
        "measured": {
            "peak_allocated_bytes": s2.peak_rounded,
            "peak_allocated_raw_bytes": s2.peak_raw,
            "first_step_peak_bytes": s1.peak_rounded,
            "peak_phase": _peak_phase(s2.peak_phase),
            "phase_peaks": {k: s2.phase_peaks.get(k, 0) for k in PHASES},
            "breakdown_at_peak": dict(s2.breakdown),
            "before_step_bytes": s2.before_step,
            "breakdown_before_step": dict(m.breakdown_before_step),
            "attention_kernel": ",".join(m.attention_kernels),
            "params_total": m.params_total,
            "params_local": m.params_local,
            "param_bytes_full": m.param_bytes_full,
            "param_bytes_local": m.param_bytes_local,
            "logits_bytes": m.logits_bytes,
            "optimizer_impl_used": m.optimizer_impl_used,
            "peak_phase_detail": s2.peak_phase,
            "after_step_bytes": s2.after_step,
            "breakdown_at_peak_raw": dict(s2.breakdown_raw),
            "outputs_released_before_backward": {
                "peak_allocated_bytes": m.released.peak_rounded,
                "peak_phase": _peak_phase(m.released.peak_phase),
                "phase_peaks": {k: m.released.phase_peaks.get(k, 0) for k in PHASES},
            },
        },
        "notes": _notes(case),
        "env": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "mode": "fake-cuda+fake-process-group",
            "rank": 0,
            "world_size": world,
            "gpu_profile": f"{profile.name} sm{profile.major}{profile.minor} "
            f"cudnn {profile.cudnn_version}",
            "sdpa_priority": list(profile.priority()),
            "seconds": round(time.perf_counter() - started, 2),
        },
    }


def main(argv: list[str] | None = None) -> int:
    # one case per worker: the fake process group is global state
    args = parse_args(argv, __doc__, DEFAULT_OUT)
    sys.path.insert(0, str(ROOT))
    from validation.cases_multi import all_cases

    return run_cases(all_cases(), measure_case, args, 1, lambda rec: rec["id"])


if __name__ == "__main__":
    raise SystemExit(main())
