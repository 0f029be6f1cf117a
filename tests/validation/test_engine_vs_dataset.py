"""MemFit's allocated peak against the traced dataset: 3 % median, 8 % worst case.

Each case of ``dataset.json`` is one real PyTorch training step of a Hugging Face model,
traced without a GPU (``validation/``); the engine never sees the measurements except here.
"""

import json
import statistics
from pathlib import Path

import pytest

from engine.estimate import estimate
from engine.scenario_io import scenario_from_dict

CASES = json.loads((Path(__file__).parent / "dataset.json").read_text())
MEDIAN_TARGET = 0.03
MAX_TARGET = 0.08


def relative_error(case: dict) -> float:
    est = estimate(scenario_from_dict(case["scenario"]))
    measured = case["measured"]["peak_allocated_bytes"]
    return (est.allocated_bytes - measured) / measured


ERRORS = {case["id"]: relative_error(case) for case in CASES}


def test_median_error_within_target() -> None:
    median = statistics.median(abs(e) for e in ERRORS.values())
    assert median <= MEDIAN_TARGET, f"median |error| {median:.2%}"


@pytest.mark.parametrize("case_id", sorted(ERRORS))
def test_every_case_within_the_worst_case_target(case_id: str) -> None:
    assert abs(ERRORS[case_id]) <= MAX_TARGET, f"{case_id}: {ERRORS[case_id]:+.2%}"
