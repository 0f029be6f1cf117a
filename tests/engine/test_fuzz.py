"""A few hundred fuzzed command lines on every run: none may end in a traceback or hang,
nor show a secret a file holds (``benchmarks/fuzz_cli.py`` runs 30,000)."""

import random
import shutil
from collections import Counter
from pathlib import Path

from tests.engine.fuzzing import checkpoint_case, fuzz, paths_case, run_case


def test_fuzzed_files_configs_and_flags_never_crash_or_hang() -> None:
    outcomes = fuzz(400, seed=20261201, limit_s=20.0)
    bad = [o for o in outcomes if o.result in ("traceback", "hang")]
    assert not bad, bad[:5]
    counts = Counter(o.result for o in outcomes)
    assert counts["error"] > 0 and counts["ok"] > 0  # both outcomes are exercised
    assert {o.kind for o in outcomes} >= {"file", "config", "flags"}


def test_fuzzed_checkpoints_and_config_paths_never_crash_hang_or_leak(tmp_path: Path) -> None:
    """Mutated safetensors headers through ``memfit checkpoint``, and training configs
    naming hostile paths beside a hub token: no traceback, no hang, and the token never
    in the output."""
    rng = random.Random(20261202)
    outcomes = []
    for i in range(160):
        kind = ("checkpoint", "paths")[i % 2]
        case = tmp_path / f"case{i}"
        argv = (checkpoint_case if kind == "checkpoint" else paths_case)(rng, case)
        outcomes.append(run_case(kind, argv, limit_s=20.0))
        shutil.rmtree(case)
    bad = [o for o in outcomes if o.result in ("traceback", "hang", "leak")]
    assert not bad, bad[:5]
    counts = Counter((o.kind, o.result) for o in outcomes)
    assert all(counts[k, r] for k in ("checkpoint", "paths") for r in ("ok", "error")), counts
