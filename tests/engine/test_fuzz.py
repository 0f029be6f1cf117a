"""A few hundred fuzzed command lines on every run: none may end in a traceback or hang
(``benchmarks/fuzz_cli.py`` runs 30,000)."""

from collections import Counter

from tests.engine.fuzzing import fuzz


def test_fuzzed_files_configs_and_flags_never_crash_or_hang() -> None:
    outcomes = fuzz(400, seed=20261201, limit_s=20.0)
    bad = [o for o in outcomes if o.result in ("traceback", "hang")]
    assert not bad, bad[:5]
    counts = Counter(o.result for o in outcomes)
    assert counts["error"] > 0 and counts["ok"] > 0  # both outcomes are exercised
    assert {o.kind for o in outcomes} >= {"file", "config", "flags"}
