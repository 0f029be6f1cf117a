"""The engine still gives the recorded answers of the golden set (``tests/golden/``,
:mod:`tests.engine.golden`): every preset scenario and every tenth of the rest, byte for
byte (``benchmarks/golden.py compare`` checks all of them); recording is deterministic,
and the comparer finds a changed answer."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from memfit.engine.presets import model_names
from tests.engine.golden import (
    ABSENT,
    GOLDEN,
    Difference,
    compare,
    dump,
    load,
    record,
    report,
)

#: every how many-th scenario after the preset ones the test checks
EVERY = 10


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return load(GOLDEN)


def subset(golden: dict[str, Any]) -> list[int]:
    """The preset scenarios and every :data:`EVERY`-th other, refused ones included."""
    entries = golden["scenarios"]
    presets = [i for i, e in enumerate(entries) if e["kind"] != "random"]
    return presets + list(range(len(presets), len(entries), EVERY))


def test_the_golden_set_holds_every_preset_and_the_random_draws(golden: dict[str, Any]) -> None:
    entries = golden["scenarios"]
    presets = {e["scenario"]["model"]["preset"] for e in entries if e["kind"] == "preset"}
    assert presets == set(model_names()), "a preset is new or gone: record the set again"
    estimated = [e for e in entries if e["kind"] == "random" and "refused" not in e["answer"]]
    assert len(estimated) == golden["random"] >= 1000
    assert any("batch" in e["answer"] for e in estimated)
    assert any("refused" in e["answer"] for e in entries)


def test_the_engine_gives_the_recorded_answers(golden: dict[str, Any]) -> None:
    chosen = subset(golden)
    assert len(chosen) > len(golden["scenarios"]) // EVERY
    found = compare(golden, chosen)
    assert not found, "\n".join(["the engine's answers changed:", *report(golden, found)])


def test_recording_twice_writes_the_same_bytes(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    first.write_bytes(dump(record(12, seed=7).golden))
    second.write_bytes(dump(record(12, seed=7).golden))
    assert first.read_bytes() == second.read_bytes()
    assert load(first) == load(second)
    assert dump(record(12, seed=8).golden) != first.read_bytes()


def _one(golden: dict[str, Any], index: int) -> dict[str, Any]:
    """A set of the one scenario at ``index`` (a copy, to change)."""
    return {**golden, "scenarios": [copy.deepcopy(golden["scenarios"][index])]}


def _first(golden: dict[str, Any], batched: bool) -> int:
    return next(
        i
        for i, e in enumerate(golden["scenarios"])
        if "refused" not in e["answer"] and ("batch" in e["answer"]) == batched
    )


def test_the_comparer_finds_a_changed_byte_count(golden: dict[str, Any]) -> None:
    one = _one(golden, _first(golden, batched=False))
    item = one["scenarios"][0]["answer"]["estimate"]["items"][0]
    item["bytes"] += 1
    found = compare(one)
    assert found == [Difference(0, "estimate.items[0].bytes", item["bytes"], item["bytes"] - 1)]
    assert found[0].kind == "estimate.items[].bytes"
    lines = report(one, found)
    assert lines[0] == "estimate.items[].bytes: 1 differences in 1 scenarios"
    assert lines[2].endswith(f"{item['bytes']} -> {item['bytes'] - 1}")


def test_the_comparer_finds_a_changed_float_a_lost_field_and_a_batched_answer(
    golden: dict[str, Any],
) -> None:
    one = _one(golden, _first(golden, batched=True))
    answer = one["scenarios"][0]["answer"]
    term = answer["time"]["terms"][-1]
    term["seconds"] = repr(float(term["seconds"]) * (1 + 2**-52))  # the last bit of a float
    del answer["timeline_peak"]["label"]
    answer["batch"]["totals"][3]["reserved_bytes"] -= 1
    fields = {d.field: d for d in compare(one)}
    last = len(answer["time"]["terms"]) - 1
    assert set(fields) == {
        f"time.terms[{last}].seconds",
        "timeline_peak.label",
        "batch.totals[3].reserved_bytes",
    }
    assert fields["timeline_peak.label"].old is ABSENT
    assert fields["batch.totals[3].reserved_bytes"].new == (
        answer["batch"]["totals"][3]["reserved_bytes"] + 1
    )


def test_the_comparer_finds_a_refusal_that_changed(golden: dict[str, Any]) -> None:
    index = next(i for i, e in enumerate(golden["scenarios"]) if "refused" in e["answer"])
    one = _one(golden, index)
    one["scenarios"][0]["answer"]["refused"]["field"] = "training.other"
    assert [d.field for d in compare(one)] == ["refused.field"]
