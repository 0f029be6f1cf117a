"""MemFit against traced steps of an activation written in Python ops.

``dataset_activations.json`` (``validation/cases_activations.py``): SantaCoder's widths with
transformers' ``FastGELUActivation`` (``gelu_fast``) and with the fused
``gelu_pytorch_tanh``, under autocast and in pure bf16, traced as the other datasets are.
``gelu_fast`` keeps six more tensors of the MLP's width per layer; read as the fused GELU
it came out 12-17 % low. Each case is compared with the output held and released.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.engine.estimate import estimate
from memfit.engine.scenario_io import scenario_from_dict
from tests.validation.traced import as_traced, traced_peak

CASES = json.loads((Path(__file__).parent / "dataset_activations.json").read_text())


def test_the_cases_cover_both_activations_under_both_precisions() -> None:
    acts = {c["scenario"]["model"]["activation_function"] for c in CASES}
    precisions = {c["scenario"]["training"]["precision"] for c in CASES}
    assert acts == {"gelu_fast", "gelu_pytorch_tanh"}
    assert precisions == {"bf16-mixed", "bf16"}
    assert scenario_from_dict(CASES[0]["scenario"]).model.activation == "gelu_fast"


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
@pytest.mark.parametrize("held", [True, False])
def test_every_case_within_one_percent(case: dict, held: bool) -> None:
    est = estimate(scenario_from_dict(as_traced(case["scenario"], held)))
    error = est.allocated_bytes / traced_peak(case, held) - 1
    assert abs(error) <= 0.01, f"{error:+.2%}"


def test_the_python_ops_cost_what_the_trace_shows() -> None:
    """What gelu_fast keeps beyond the fused kernel, traced and estimated, to 1 % of it."""
    by_id = {c["id"]: c for c in CASES}
    for precision in ("bf16-mixed", "bf16"):
        stem = f"santacoder_L2_{precision}_full_adamw-foreach_sdpa_b4_s1024_"
        fast, fused = by_id[stem + "gelu_fast"], by_id[stem + "gelu_pytorch_tanh"]
        traced = traced_peak(fast, True) - traced_peak(fused, True)
        ours = [estimate(scenario_from_dict(as_traced(c["scenario"], True))) for c in (fast, fused)]
        assert abs(ours[0].allocated_bytes - ours[1].allocated_bytes - traced) <= 0.01 * traced
