"""MemFit and the traced datasets against real training steps on an H200.

``validation/gpu/h200_steps.jsonl`` holds what ``validation/measure_gpu.py`` recorded on one
NVIDIA H200 (torch 2.11 with CUDA 13.0, transformers 5.17, peft 0.21): the traced cases run
as real steps, gradient accumulation variants, and whole models alone on the GPU with their
step times. ``validation/compare_gpu.py`` prints every figure; these tests hold the ones the
engine meets, with headroom, and state as strict ``xfail`` the ones it does not yet.

Measured when the records were taken (|estimate / measured - 1|):

* traced peak vs the GPU's ``max_memory_allocated``: median 0.67 %, p90 2.65 %, max 22.5 %
  (Falcon's attention, -10 to -23 %; Mixtral's eager experts with SGD, +10 %; eager attention
  of 7B models, -7 to -12 %);
* MemFit's allocated peak vs the GPU: traced cases median 0.94 %, p90 4.41 %; whole models
  median 0.25 %, max 4.41 %;
* reserved vs ``max_memory_reserved``: median 9.3 %, p90 21 %, nearly always low: the caching
  allocator's free gaps are 1-32 % of the allocated peak where MemFit counts 5 % of the peak
  activations plus 1 MiB per large block;
* gradient accumulation: 2 micro-batches peak 1.9-7.7 % above one, MemFit's peak is unchanged.
"""

from __future__ import annotations

import statistics

import pytest

from validation import compare_gpu

RESULT = compare_gpu.compare()
ROWS = RESULT["rows"]
TRACED = [r for r in ROWS if r["part"] == "traced"]
WHOLE = [r for r in ROWS if r["part"] == "whole"]


def _median_p90(values: list[float]) -> tuple[float, float]:
    errors = sorted(abs(v) for v in values)
    return statistics.median(errors), errors[int(0.9 * len(errors))]


def test_the_records_cover_the_traced_cases_and_whole_models() -> None:
    assert len(TRACED) >= 140
    assert len(WHOLE) == 16
    assert sum("tracer" in r for r in TRACED) >= 140
    assert all(r["measured_allocated_bytes"] > 0 for r in ROWS if "refused" not in r)


def test_the_traced_peaks_are_what_the_gpu_allocates() -> None:
    median, p90 = _median_p90([r["tracer"] for r in TRACED if "tracer" in r])
    assert median <= 0.015, f"median {median:.2%}"
    assert p90 <= 0.05, f"p90 {p90:.2%}"


def test_the_allocated_estimate_is_what_the_gpu_allocates() -> None:
    median, p90 = _median_p90([r["allocated"] for r in TRACED if "allocated" in r])
    assert median <= 0.02, f"median {median:.2%}"
    assert p90 <= 0.07, f"p90 {p90:.2%}"


@pytest.mark.parametrize("row", WHOLE, ids=[r["id"] for r in WHOLE])
def test_every_whole_model_is_within_five_percent(row: dict) -> None:
    assert abs(row["allocated"]) <= 0.05, f"{row['allocated']:+.2%}"
    assert abs(row["device"]) <= 0.20, f"{row['device']:+.2%}"


def test_the_whole_models_step_times_are_within_the_published_runs_error() -> None:
    """The step time of a whole model alone on the GPU, median of five steps: within 25 %
    at the median (measured: 11.4 % over 16). GPT-2 small (124 M parameters, -30 % and
    -33 %) and BERT-large in fp32 (+62 %) are the outliers: a small model's step is
    launch-bound, and fp32 runs on TF32 tensor cores only where the program allows it."""
    median, _ = _median_p90([r["step_time"] for r in WHOLE])
    assert median <= 0.25, f"median {median:.2%}"


@pytest.mark.xfail(
    strict=True,
    reason="reserved is modelled as 5 % of peak activations plus 1 MiB per large block; the "
    "real allocator's free gaps depend on the order of allocations (median 9.3 % low)",
)
def test_reserved_is_what_the_gpu_reserves() -> None:
    median, _ = _median_p90([r["reserved"] for r in TRACED if "reserved" in r])
    assert median <= 0.05, f"median {median:.2%}"


def test_accumulated_gradients_raise_the_peak_as_measured() -> None:
    """Gradients accumulated over micro-batches are live through every later forward and
    backward: two micro-batches a step peaked 7.67 % and 1.86 % above one on the GPU;
    MemFit gives 7.71 % and 1.86 %."""
    pairs = RESULT["accumulation"]
    assert pairs
    for pair in pairs:
        assert abs(pair["estimated"] - pair["measured"]) <= 0.02, pair["id"]
