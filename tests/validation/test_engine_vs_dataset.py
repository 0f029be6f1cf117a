"""MemFit's allocated peak against the traced datasets: 1 % median, 4 % p90, 5 % worst.

Each case of ``dataset.json`` and ``dataset_conventions.json`` is one real PyTorch training
step of a Hugging Face model, traced without a GPU (``validation/``); the engine never sees
the measurements except here. Every case is compared twice: with the model output held
through backward and the optimizer step (a plain loop) and released before backward (the
Trainer), each estimated with the conventions the trace ran (``traced.as_traced``).

Every case is within the 5 % target. A frozen fp16 base under bf16 autocast is refused
(fp16 and bf16 are the same size to the engine).
"""

import json
import statistics
from pathlib import Path

import pytest

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.scenario_io import scenario_from_dict
from tests.validation.traced import as_traced, traced_peak

HERE = Path(__file__).parent
#: traced cases the engine refuses, with the field it names: a 16-bit frozen base of the
#: other 16-bit dtype than autocast's (the engine tells dtypes apart by size)
REFUSED = {
    "llama-2-7b_L2_bf16-mixed_lora_r16-q_proj+v_proj_adamw-foreach_sdpa_b4_s2048_custom"
    "_released_kv_frozen-fp16_adapter-fp32": "training.frozen_weights_dtype",
}
ALL = json.loads((HERE / "dataset.json").read_text()) + json.loads(
    (HERE / "dataset_conventions.json").read_text()
)
CASES = [case for case in ALL if case["id"] not in REFUSED]
MEDIAN_TARGET = 0.01
P90_TARGET = 0.04
MAX_TARGET = 0.05


def relative_error(case: dict, held: bool) -> float:
    est = estimate(scenario_from_dict(as_traced(case["scenario"], held)))
    return est.allocated_bytes / traced_peak(case, held) - 1


ERRORS = {
    f"{case['id']}_{'held' if held else 'released'}": relative_error(case, held)
    for case in CASES
    for held in (True, False)
}


def test_median_and_p90_within_target() -> None:
    errors = sorted(abs(e) for e in ERRORS.values())
    assert len(errors) == 2 * len(CASES) >= 290
    median, p90 = statistics.median(errors), errors[int(0.9 * len(errors))]
    assert median <= MEDIAN_TARGET, f"median |error| {median:.2%}"
    assert p90 <= P90_TARGET, f"p90 |error| {p90:.2%}"


@pytest.mark.parametrize("case_id", sorted(ERRORS))
def test_every_case_within_the_worst_case_target(case_id: str) -> None:
    assert abs(ERRORS[case_id]) <= MAX_TARGET, f"{case_id}: {ERRORS[case_id]:+.2%}"


def test_releasing_the_output_saves_what_the_trace_saves() -> None:
    """The estimate's saving from releasing the output before backward is the traced
    saving (the logits, and the KV cache where a loop holds it into the optimizer step),
    to 1 % of the peak, on every case whose traced saving is at least 2 % of it."""
    checked = 0
    for case in CASES:
        held, released = traced_peak(case, True), traced_peak(case, False)
        traced = held - released
        if traced < 0.02 * held:
            continue
        saving = (ERRORS[case["id"] + "_held"] + 1) * held - (
            ERRORS[case["id"] + "_released"] + 1
        ) * released
        assert abs(saving - traced) <= 0.01 * held, case["id"]
        checked += 1
    assert checked >= 60


def test_the_refused_cases_are_refused_naming_their_field() -> None:
    refused = [case for case in ALL if case["id"] in REFUSED]
    assert len(refused) == len(REFUSED)
    for case in refused:
        with pytest.raises(EstimateError) as info:
            estimate(scenario_from_dict(as_traced(case["scenario"])))
        assert info.value.field == REFUSED[case["id"]]
