"""A few hundred fuzzed cases on every run: none may end in a traceback, a hang, an error
line that repeats a long value, or an output that shows a secret a file holds
(``benchmarks/fuzz_cli.py`` runs 30,000)."""

import itertools
import random
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path

from tests.engine.fuzzing import (
    KINDS,
    checkpoint_case,
    fuzz,
    make_case,
    paths_case,
    run_case,
    seeds,
    train_configs,
    value_flags,
)


def test_fuzzed_files_configs_flags_and_pastes_never_crash_hang_or_echo() -> None:
    outcomes = fuzz(400, seed=20261201, limit_s=20.0)
    bad = [o for o in outcomes if o.result in ("long error", "traceback", "hang", "leak")]
    assert not bad, bad[:5]
    counts = Counter(o.result for o in outcomes)
    assert counts["error"] > 0 and counts["ok"] > 0  # both outcomes are exercised
    assert {o.kind for o in outcomes} == set(KINDS)


def test_the_cases_hold_every_hostile_class() -> None:
    """Huge integers, nesting that parses and that does not, 5,000-character values in
    every flag, duplicate keys in training configs, pasted text: each is drawn."""
    rng = random.Random(7)
    scenarios, configs = seeds()
    training = train_configs()
    texts: list[str] = []
    long_flags: set[str] = set()
    kinds: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for _ in range(12000):
            kind, argv = make_case(rng, scenarios, configs, folder, training)
            kinds[kind] += 1
            for made in folder.iterdir():  # model folders and configs naming paths: tested below
                if made.is_dir() and not made.is_symlink():
                    shutil.rmtree(made)
            if kind == "paste":
                texts.append(argv[0])
                continue
            for flag, value in itertools.pairwise(argv):
                if len(value) >= 5000:
                    long_flags.add(flag)
            for arg in argv:
                path = Path(arg)
                if path.parent == folder and path.is_file():
                    texts.append(path.read_bytes().decode("utf-8", "replace"))
                    path.unlink()
    assert set(kinds) == set(KINDS)
    assert long_flags >= set(value_flags()), set(value_flags()) - long_flags
    everything = "\n".join(texts)
    for digits in (309, 400, 4000):
        assert re.search(rf"(?<!\d)-?10{{{digits - 1}}}(?!\d)", everything), digits
    assert "[" * 990 in everything and "[" * 20000 in everything
    assert '{"a": ' * 300 in everything
    assert "x" * 5000 in everything
    # a top-level key twice: YAML's at the start of a line, JSON's one space in (indent=1)
    top_keys = (re.findall(r'^(?:\{| )?"?([A-Za-z_][\w.-]*)"?:\s', t, re.M) for t in texts)
    assert any(max(Counter(keys).values(), default=0) > 1 for keys in top_keys)


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
