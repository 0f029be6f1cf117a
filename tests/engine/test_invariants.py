"""The invariants of tests/engine/invariants.py over 150 scenarios drawn from a fixed seed
(the benchmark ``benchmarks/properties.py`` draws 10,000 and more from a fresh one)."""

from typing import Any

from hypothesis import given, seed, settings

from tests.engine.invariants import check_all, scenarios

#: the draw CI checks, the same on every run (the benchmark draws a fresh one)
SEED = 20261201


@seed(SEED)
@settings(max_examples=150, deadline=None, database=None)
@given(scenarios)
def test_every_invariant_holds_for_any_scenario(data: dict[str, Any]) -> None:
    check_all(data)
