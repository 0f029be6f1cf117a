"""The invariants of tests/engine/invariants.py over random scenarios (the benchmark
``benchmarks/properties.py`` runs 10,000 and more)."""

from typing import Any

from hypothesis import given, settings

from tests.engine.invariants import check_all, scenarios


@settings(max_examples=150, deadline=None)
@given(scenarios)
def test_every_invariant_holds_for_any_scenario(data: dict[str, Any]) -> None:
    check_all(data)
