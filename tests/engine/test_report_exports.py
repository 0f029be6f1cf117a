"""The data exports with the what-ifs the app shows: CSV rows, a JSON list and a Markdown
table after the current scenario's, their bytes equal to the what-ifs' estimates."""

import csv
import io
import json

import pytest

from memfit.engine.estimate import GIB, Estimate, estimate
from memfit.engine.model_state import CATEGORIES
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.report import rows, to_csv, to_json, to_markdown
from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.engine.whatif import WhatIfResult, assess

KEYS = ("checkpointing", "8bit-optimizer", "qlora")


def scenario() -> Scenario:
    return Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("a100-sxm-80gb")),
        TrainingSpec(method="lora", micro_batch_size=4, sequence_length=2048),
    )


@pytest.fixture(scope="module")
def current() -> Estimate:
    return estimate(scenario())


@pytest.fixture(scope="module")
def whatifs(current: Estimate) -> list[WhatIfResult]:
    out = []
    for key in KEYS:
        result = assess(scenario(), current, key)
        assert isinstance(result, WhatIfResult), result
        out.append(result)
    return out


def test_csv_lists_each_whatif_after_the_current_rows(
    current: Estimate, whatifs: list[WhatIfResult]
) -> None:
    parsed = list(csv.DictReader(io.StringIO(to_csv(current, whatifs=whatifs))))
    plain = list(csv.DictReader(io.StringIO(to_csv(current))))
    # the current scenario's rows come first and are those of the plain export
    assert parsed[: len(plain)] == plain
    extra = parsed[len(plain) :]
    assert {r["category"] for r in extra} == {"whatif"}
    assert "whatif" not in {r["category"] for r in plain}
    by_item = {r["item"]: r for r in extra}
    assert len(by_item) == len(extra) == len(KEYS) * (3 + len(CATEGORIES) + 1)
    for w in whatifs:
        label, ghost = w.whatif.label, w.estimate
        for total in ("allocated", "reserved", "device"):
            cell = by_item[f"{label}: {total}"]["bytes"]
            assert cell.lstrip("-").isdigit()  # bytes as an exact integer
            assert int(cell) == getattr(ghost, f"{total}_bytes")
        assert by_item[f"{label}: device"]["formula"] in ("fits", "tight", "does not fit")
        per_category = [int(by_item[f"{label}: {c}"]["bytes"]) for c in CATEGORIES]
        assert per_category == [ghost.breakdown[c] for c in CATEGORIES]
        assert sum(per_category) == ghost.device_bytes
        saving = by_item[f"{label}: saving vs current"]
        assert int(saving["bytes"]) == current.device_bytes - ghost.device_bytes == w.saved_bytes
        assert saving["source"] == f"compute cost: {w.compute_note}"
        assert float(saving["gib"]) == pytest.approx(w.saved_bytes / GIB, abs=1e-4)
    # checkpointing saves memory and costs step time; the note says how much
    checkpointing = by_item[f"{whatifs[0].whatif.label}: saving vs current"]
    assert int(checkpointing["bytes"]) > 0 and "% step time" in checkpointing["source"]


def test_rows_without_whatifs_are_unchanged(current: Estimate) -> None:
    assert rows(current, ()) == rows(current)
    assert to_csv(current, whatifs=()) == to_csv(current)
    assert json.loads(to_json(current, whatifs=())) == current.to_dict()


def test_json_has_a_whatifs_list_beside_the_estimate(
    current: Estimate, whatifs: list[WhatIfResult]
) -> None:
    data = json.loads(to_json(current, whatifs=whatifs))
    listed = data.pop("whatifs")
    assert data == current.to_dict()  # the stable shape is untouched
    assert [w["key"] for w in listed] == list(KEYS)
    for entry, w in zip(listed, whatifs, strict=True):
        ghost = w.estimate
        assert entry["label"] == w.whatif.label
        for key in ("allocated_bytes", "reserved_bytes", "device_bytes", "saved_bytes"):
            assert isinstance(entry[key], int)
        assert entry["allocated_bytes"] == ghost.allocated_bytes
        assert entry["reserved_bytes"] == ghost.reserved_bytes
        assert entry["device_bytes"] == ghost.device_bytes
        assert entry["verdict"] == ghost.verdict
        assert entry["breakdown"] == {c: ghost.breakdown[c] for c in CATEGORIES}
        assert all(isinstance(v, int) for v in entry["breakdown"].values())
        assert entry["saved_bytes"] == current.device_bytes - ghost.device_bytes
        assert entry["step_time_factor"] == pytest.approx(w.compute_factor)
        assert entry["compute_note"] == w.compute_note


def test_markdown_summary_names_the_scenario_totals_and_whatifs(
    current: Estimate, whatifs: list[WhatIfResult]
) -> None:
    text = to_markdown(current, whatifs=whatifs)
    head = text.splitlines()[0]
    for part in (
        "Llama 3 8B",
        "1 x NVIDIA A100 SXM4 80GB",
        "lora",
        "bf16-mixed",
        "micro-batch 4 x 2,048 tokens",
        "framework pytorch",
    ):
        assert part in head, part
    assert f"device {current.device_bytes / GIB:,.2f} GiB of 80.00 GiB per GPU" in text
    assert f"allocated {current.allocated_bytes / GIB:,.2f} GiB" in text
    assert f"reserved {current.reserved_bytes / GIB:,.2f} GiB" in text
    assert f"Verdict: **{current.verdict}**" in text and "GiB = 2^30 bytes" in text
    assert "| what-if | device GiB | saving GiB | verdict | compute cost |" in text
    for w in whatifs:
        line = next(row for row in text.splitlines() if row.startswith(f"| {w.whatif.label} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert float(cells[1]) == pytest.approx(w.estimate.device_bytes / GIB, abs=0.005)
        assert float(cells[2]) == pytest.approx(w.saved_bytes / GIB, abs=0.005)
        assert cells[4] == w.compute_note
    # the what-ifs come after the current scenario's breakdown
    assert text.index("| **device** |") < text.index("| what-if |")
    assert "| what-if |" not in to_markdown(current)


def test_markdown_names_the_gpus_and_nodes() -> None:
    s = Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8, nodes=2),
        TrainingSpec(parallelism=ParallelismSpec(zero_stage=3)),
    )
    head = to_markdown(estimate(s)).splitlines()[0]
    assert "**16 x NVIDIA H100 SXM 80GB** (2 nodes x 8)" in head


def test_a_pinned_baseline_goes_into_every_export(current: Estimate) -> None:
    baseline = estimate(
        Scenario(
            load_model("llama-3-8b"),
            HardwareSpec(load_gpu("h100-sxm-80gb")),
            TrainingSpec(method="full", micro_batch_size=1, sequence_length=1024),
        )
    )
    diff = current.device_bytes - baseline.device_bytes
    table = list(csv.DictReader(io.StringIO(to_csv(current, baseline=baseline))))
    pinned = {r["item"]: r for r in table if r["category"] == "baseline"}
    assert int(pinned["baseline: device"]["bytes"]) == baseline.device_bytes
    assert int(pinned["baseline: current minus baseline"]["bytes"]) == diff
    for cat in CATEGORIES:
        assert int(pinned[f"baseline: {cat}"]["bytes"]) == baseline.breakdown[cat]
    assert "H100" in pinned["baseline: allocated"]["formula"]
    # the baseline comes after everything of the current scenario
    assert [r["category"] for r in table][-len(pinned) :] == ["baseline"] * len(pinned)
    data = json.loads(to_json(current, baseline=baseline))
    assert data["baseline"]["device_bytes"] == baseline.device_bytes
    assert data["baseline"]["current_minus_baseline_bytes"] == diff
    assert "baseline" not in json.loads(to_json(current))
    text = to_markdown(current, baseline=baseline)
    assert "Pinned baseline: **Llama 3 8B** on **1 x" in text
    assert f"{diff / GIB:+,.2f} GiB" in text
    assert "Pinned baseline" not in to_markdown(current)
