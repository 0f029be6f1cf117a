"""Activations written as Python ops, traced: transformers' ``FastGELUActivation``
(``gelu_fast``, SantaCoder's ``gpt_bigcode``) against the fused ``gelu_pytorch_tanh`` on
the same model, under autocast and in pure bf16.

    python -m validation.cases_activations     # -> tests/validation/dataset_activations.json

A ``gelu_fast`` MLP keeps its products' factors and tanh's output -- six more tensors of the
MLP's width per layer than the fused kernel, which keeps its input -- so the two differ by
what the activation's own ops keep (``engine.layers.Net.activation``). Records as in
``dataset.json`` (:mod:`validation.measure`).
"""

from __future__ import annotations

import sys
from typing import Any

from validation.measure import ROOT, measure_case, parse_args, run_cases

DEFAULT_OUT = ROOT / "tests" / "validation" / "dataset_activations.json"

#: SantaCoder's widths (bigcode/santacoder config.json: multi-query attention), two layers
SANTACODER = {
    "model_type": "gpt_bigcode",
    "architectures": ["GPTBigCodeForCausalLM"],
    "n_embd": 2048,
    "n_head": 16,
    "n_layer": 2,
    "n_inner": 8192,
    "n_positions": 2048,
    "vocab_size": 49280,
    "multi_query": True,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "layer_norm_epsilon": 1e-5,
    "scale_attn_weights": True,
    "_name_or_path": "santacoder-2-layers",
}


def all_cases() -> list[dict[str, Any]]:
    cases = []
    for act in ("gelu_fast", "gelu_pytorch_tanh"):
        for precision in ("bf16-mixed", "bf16"):
            scenario = {
                "memfit_scenario": 1,
                "model": {**SANTACODER, "activation_function": act},
                "hardware": {"gpu": "h100-sxm-80gb"},
                "training": {
                    "method": "full",
                    "precision": precision,
                    "optimizer": "adamw",
                    "optimizer_impl": "foreach",
                    "micro_batch_size": 4,
                    "sequence_length": 1024,
                    "attention": "sdpa",
                },
            }
            case_id = f"santacoder_L2_{precision}_full_adamw-foreach_sdpa_b4_s1024_{act}"
            cases.append({"id": case_id, "family": "gpt_bigcode", "scenario": scenario})
    return cases


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, DEFAULT_OUT)
    sys.path.insert(0, str(ROOT))
    return run_cases(all_cases(), measure_case, args, 8, lambda rec: rec["id"])


if __name__ == "__main__":
    raise SystemExit(main())
