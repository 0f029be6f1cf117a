"""What-if variants and the data exports (CSV, JSON, Markdown)."""

import csv
import io
import json

import pytest

from engine.estimate import estimate
from engine.presets import load_gpu, load_model
from engine.report import rows, to_csv, to_json, to_markdown
from engine.specs import HardwareSpec, Scenario, TrainingSpec
from engine.whatif import WHATIFS, WHATIFS_BY_KEY, evaluate


def scenario(**training: object) -> Scenario:
    return Scenario(
        load_model("llama-3-8b"), HardwareSpec(load_gpu("a100-sxm-80gb")), TrainingSpec(**training)
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("key", "field", "before", "after"),
    [
        ("mixed-precision", "precision", "fp32", "bf16-mixed"),
        ("checkpointing", "activation_checkpointing", "none", "full"),
        ("lora", "method", "full", "lora"),
        ("qlora", "method", "full", "qlora"),
        ("8bit-optimizer", "optimizer", "adamw", "adamw-8bit"),
        ("fused-optimizer", "optimizer_impl", "foreach", "fused"),
        ("flash-attention", "attention", "sdpa", "flash"),
    ],
)
def test_each_whatif_changes_one_field(key: str, field: str, before: str, after: str) -> None:
    base = scenario(**{field: before})
    variant = WHATIFS_BY_KEY[key].apply(base)
    assert variant is not None
    assert getattr(variant.training, field) == after
    assert variant.model == base.model and variant.hardware == base.hardware
    assert WHATIFS_BY_KEY[key].apply(variant) is None  # already on: nothing to apply


def test_saved_bytes_and_costs() -> None:
    base = scenario(method="full")
    current = estimate(base)
    lora = evaluate(base, current, "lora")
    assert lora is not None
    assert lora.saved_bytes == current.device_bytes - lora.estimate.device_bytes > 0
    assert WHATIFS_BY_KEY["checkpointing"].compute_factor == pytest.approx(1.33)
    assert all(w.compute_note for w in WHATIFS)


def test_whatif_that_the_engine_rejects_is_none() -> None:
    s = Scenario(
        load_model("deepseek-v3"),
        HardwareSpec(load_gpu("h200-sxm-141gb")),
        TrainingSpec(method="full"),
    )
    assert evaluate(s, estimate(s), "lora") is None  # q_proj/v_proj do not exist there


def test_csv_rows_match_the_estimate() -> None:
    est = estimate(scenario(method="lora"))
    parsed = list(csv.DictReader(io.StringIO(to_csv(est))))
    items = [r for r in parsed if r["category"] != "total"]
    assert [(r["item"], int(r["bytes"])) for r in items] == [(i.name, i.bytes) for i in est.items]
    totals = {r["item"]: int(r["bytes"]) for r in parsed if r["category"] == "total"}
    assert totals["device"] == est.device_bytes and totals["budget"] == est.budget_bytes


def test_json_is_the_cli_shape() -> None:
    est = estimate(scenario())
    assert json.loads(to_json(est)) == est.to_dict()


def test_markdown_table() -> None:
    est = estimate(scenario(method="qlora"))
    text = to_markdown(est)
    assert "| category | item | GiB | formula |" in text
    assert text.count("\n| ") == len(rows(est)) + 1  # header + one line per row
    assert "GiB = 2^30 bytes" in text
