"""The step-time model against published training throughput (tokens/s per GPU)."""

from __future__ import annotations

import pytest

from tests.validation.throughput import cases, load, median_error, pairs

#: the targets: median error on tokens/s per GPU, and the share of one-setting pairs
#: ordered as measured
MEDIAN_TARGET = 0.15
ORDER_TARGET = 0.9


@pytest.fixture(scope="module")
def results():
    return cases()


def test_every_case_has_a_source_and_a_figure() -> None:
    for c in load():
        assert c["source"] and c["url"].startswith("https://"), c["id"]
        assert c["tokens_per_s_per_gpu"] > 0, c["id"]


def test_median_error_within_target(results) -> None:
    assert len(results) >= 30
    assert median_error(results) <= MEDIAN_TARGET


def test_pairs_ordered_as_measured(results) -> None:
    found = pairs(results)
    assert len(found) >= 10
    ordered = sum(ok for *_, ok in found)
    assert ordered >= ORDER_TARGET * len(found), [(a.id, b.id) for a, b, _, ok in found if not ok]
