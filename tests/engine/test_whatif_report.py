"""What-if variants and the data exports (CSV, JSON, Markdown)."""

import csv
import io
import itertools
import json

import pytest

from memfit.engine.estimate import Estimate, estimate
from memfit.engine.model_state import CATEGORIES
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.report import (
    rows,
    scenario_line,
    shows_host,
    shows_ranks,
    to_csv,
    to_json,
    to_markdown,
)
from memfit.engine.specs import HardwareSpec, OffloadSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.engine.whatif import (
    WHATIFS,
    WHATIFS_BY_KEY,
    WhatIfResult,
    assess,
    compute_text,
    evaluate,
)


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
        ("flash-attention", "attention", "eager", "flash"),
    ],
)
def test_each_whatif_changes_one_field(key: str, field: str, before: str, after: str) -> None:
    base = scenario(**{field: before})
    variant = WHATIFS_BY_KEY[key].apply(base)
    assert getattr(variant.training, field) == after
    assert variant.model == base.model and variant.hardware == base.hardware
    assert not WHATIFS_BY_KEY[key].applies(variant)  # already on: nothing to apply


def test_saved_bytes_and_costs() -> None:
    base = scenario(method="full")
    current = estimate(base)
    lora = evaluate(base, current, "lora")
    assert lora is not None
    assert lora.saved_bytes == current.device_bytes - lora.estimate.device_bytes > 0
    assert all(w.compute_reason for w in WHATIFS)


def test_step_time_changes_are_modelled() -> None:
    """The factor is the ratio of the two modelled step times: checkpointing re-runs the
    forward (about +1/3 of a compute-bound step), mixed precision is faster than fp32."""
    from memfit.engine.steptime import step_time

    base = scenario(method="full", micro_batch_size=4, sequence_length=4096)
    ckpt = assess(base, estimate(base), "checkpointing")
    assert isinstance(ckpt, WhatIfResult)
    ratio = step_time(ckpt.scenario).step_time_s / step_time(base).step_time_s
    assert ckpt.compute_factor == pytest.approx(ratio)
    assert 1.15 < ckpt.compute_factor < 1.4
    fp32 = scenario(method="full", precision="fp32")
    mixed = assess(fp32, estimate(fp32), "mixed-precision")
    assert isinstance(mixed, WhatIfResult) and mixed.compute_factor < 0.5


def test_whatif_that_the_engine_rejects_is_none() -> None:
    s = Scenario(
        load_model("deepseek-v3"),
        HardwareSpec(load_gpu("h200-sxm-141gb")),
        TrainingSpec(method="full"),
    )
    assert evaluate(s, estimate(s), "lora") is None  # q_proj/v_proj do not exist there


def on_gpus(gpus: int, **training: object) -> Scenario:
    return Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=gpus),
        TrainingSpec(**training),  # type: ignore[arg-type]
    )


def test_zero3_is_offered_only_with_something_to_shard() -> None:
    zero3 = WHATIFS_BY_KEY["zero3"]
    one = on_gpus(1, method="full")
    assert not zero3.applies(one)
    assert "one GPU" in (zero3.why_not(one) or "")
    # 8 GPUs all taken by tensor parallelism: a data-parallel shard group of 1
    all_tp = on_gpus(8, method="full", parallelism=ParallelismSpec(tp=8))
    assert not zero3.applies(all_tp)
    assert "shard group is one GPU" in (zero3.why_not(all_tp) or "")
    eight = on_gpus(8, method="full")
    assert zero3.apply(eight).training.parallelism.zero_stage == 3
    assert zero3.why_not(eight) is None
    result = evaluate(eight, estimate(eight), "zero3")
    assert result is not None and result.saved_bytes > 0


@pytest.mark.parametrize(
    ("attention", "precision", "offered"),
    [
        ("flash", "bf16-mixed", False),
        ("sdpa", "bf16-mixed", False),  # SDPA picks flash for 16-bit inputs
        ("sdpa", "bf16", False),
        ("sdpa", "fp32", False),  # flash kernels are 16-bit only
        ("eager", "bf16-mixed", True),
        ("mem-efficient", "fp16-mixed", True),
    ],
)
def test_flash_attention_is_offered_only_when_the_kernel_is_not_flash(
    attention: str, precision: str, offered: bool
) -> None:
    s = scenario(method="lora", attention=attention, precision=precision)
    flash = WHATIFS_BY_KEY["flash-attention"]
    assert flash.applies(s) == offered
    reason = flash.why_not(s)
    assert (reason is None) == offered
    if not offered:
        assert reason


@pytest.mark.parametrize("method", ["full", "lora", "qlora", "freeze"])
def test_compute_note_agrees_with_the_factor(method: str) -> None:
    s = scenario(method=method, precision="fp32", attention="eager")
    current = estimate(s)
    for whatif in WHATIFS:
        result = assess(s, current, whatif.key)
        if isinstance(result, str):
            continue
        assert result.compute_note.startswith(compute_text(result.compute_factor) + ":")
        assert result.compute_note.count("% step time") <= 1


def test_qlora_costs_less_than_full_but_more_than_lora() -> None:
    from_full = assess(scenario(method="full"), estimate(scenario(method="full")), "qlora")
    from_lora = assess(scenario(method="lora"), estimate(scenario(method="lora")), "qlora")
    assert isinstance(from_full, WhatIfResult) and isinstance(from_lora, WhatIfResult)
    assert from_full.compute_factor < 1 < from_lora.compute_factor
    assert from_full.compute_note.startswith(compute_text(from_full.compute_factor))
    assert "% step time" in from_lora.compute_note
    back = assess(scenario(method="qlora"), estimate(scenario(method="qlora")), "lora")
    assert isinstance(back, WhatIfResult) and back.compute_factor < 1


def test_every_unavailable_whatif_says_why() -> None:
    s = scenario(
        method="lora",
        optimizer="sgd",
        optimizer_impl="fused",
        activation_checkpointing="full",
        attention="flash",
        offload=OffloadSpec(optimizer="cpu"),
        parallelism=ParallelismSpec(zero_stage=1),
    )
    current = estimate(s)
    for whatif in WHATIFS:
        result = assess(s, current, whatif.key)
        if whatif.key == "qlora":
            assert isinstance(result, WhatIfResult)
            continue
        assert isinstance(result, str) and result, whatif.key
        assert whatif.why_not(s) == result or result.startswith("the changed scenario")


def test_csv_rows_match_the_estimate() -> None:
    est = estimate(scenario(method="lora"))
    parsed = list(csv.DictReader(io.StringIO(to_csv(est))))
    assert parsed[0]["category"] == "scenario" and parsed[0]["bytes"] == ""
    assert parsed[0]["item"] == scenario_line(est).replace("**", "")
    assert "Llama" in parsed[0]["item"] and "lora" in parsed[0]["item"]
    items = [r for r in parsed if r["category"] not in ("scenario", "total", "convention")]
    assert [(r["item"], int(r["bytes"])) for r in items] == [(i.name, i.bytes) for i in est.items]
    totals = {r["item"]: int(r["bytes"]) for r in parsed if r["category"] == "total"}
    assert totals["device"] == est.device_bytes and totals["budget"] == est.budget_bytes
    conventions = {r["item"]: r for r in parsed if r["category"] == "convention"}
    assert conventions["training.stack"]["formula"] == "hf-trainer"
    held = conventions["outputs_held_through_backward"]
    assert held["formula"] == "false" and held["source"].startswith("stack: ")
    assert conventions["lora.adapter_dtype"]["formula"] == '"fp32"'


def test_json_is_the_cli_shape() -> None:
    est = estimate(scenario())
    assert json.loads(to_json(est)) == est.to_dict()


def test_markdown_table() -> None:
    est = estimate(scenario(method="qlora"))
    text = to_markdown(est)
    assert "| category | item | GiB | formula |" in text
    table = [r for r in rows(est) if r["category"] != "convention"]
    assert text.count("\n| ") == len(table) + 1  # header + one line per row
    assert "GiB = 2^30 bytes" in text
    assert 'Training stack hf-trainer: model_implementation="transformers"' in text
    assert "outputs_held_through_backward=false" in text


def pipeline_offload() -> Estimate:
    """Llama 3.1 70B, tp=8, pp=2 on 2 nodes x 8 A100 80GB, activations offloaded to CPU."""
    return estimate(
        Scenario(
            load_model("llama-3.1-70b"),
            HardwareSpec(load_gpu("a100-sxm-80gb"), gpus_per_node=8, nodes=2, host_memory_gib=8),
            TrainingSpec(
                method="full",
                sequence_length=4096,
                gradient_accumulation_steps=8,
                activation_checkpointing="full",
                parallelism=ParallelismSpec(tp=8, pp=2, zero_stage=1, sequence_parallel=True),
                offload=OffloadSpec(activations="cpu"),
            ),
        )
    )


def test_csv_has_rank_groups_and_host_ram() -> None:
    est = pipeline_offload()
    parsed = list(csv.DictReader(io.StringIO(to_csv(est))))
    breakdown = [r for r in parsed if r["category"] in CATEGORIES]
    assert sum(int(r["bytes"]) for r in breakdown) == est.device_bytes
    ranks = {r["item"]: r for r in parsed if r["category"] == "rank"}
    assert len(ranks) == 4 * len(est.rank_groups) == 8
    for g in est.rank_groups:
        assert int(ranks[f"{g.group}: allocated"]["bytes"]) == g.allocated_bytes
        assert int(ranks[f"{g.group}: reserved"]["bytes"]) == g.reserved_bytes
        assert int(ranks[f"{g.group}: device"]["bytes"]) == g.device_bytes
        assert int(ranks[f"{g.group}: host per GPU"]["bytes"]) == g.host_bytes
        worst = ranks[f"{g.group}: device"]["formula"].startswith("worst group")
        assert worst == (g.group == est.worst_group)
    host = {r["item"]: r for r in parsed if r["category"] == "host"}
    assert int(host["host RAM per node"]["bytes"]) == est.host_node_bytes > 0
    assert int(host["host RAM capacity per node"]["bytes"]) == 8 * 2**30
    assert est.host_verdict == "oom"
    assert host["host RAM per node"]["formula"].endswith("of 8.00 GiB: does not fit")


def test_single_gpu_reports_have_no_rank_or_host_rows() -> None:
    est = estimate(scenario(method="lora"))
    assert not shows_ranks(est) and not shows_host(est)
    assert {r["category"] for r in rows(est)} <= {*CATEGORIES, "total", "convention"}
    assert "Mesh:" not in to_markdown(est) and "Host RAM" not in to_markdown(est)


def test_markdown_rank_table_and_host_line() -> None:
    est = pipeline_offload()
    text = to_markdown(est)
    assert "Mesh: world 16 = tp 8 x pp 2 x cp 1 x dp 1 | vpp 1 (1f1b)" in text
    assert (
        "| rank group | allocated GiB | reserved GiB | device GiB | peak | host GiB per GPU |"
        in text
    )
    for g in est.rank_groups:
        name = f"**{g.group} (worst)**" if g.group == est.worst_group else g.group
        assert f"| {name} | {g.allocated_bytes / 2**30:.4f} |" in text
    per_gpu = est.host_node_bytes // 8
    assert f"Host RAM: {est.host_node_bytes / 2**30:,.2f} GiB per node" in text
    assert f"(8 GPUs x {per_gpu / 2**30:,.2f} GiB) of 8.00 GiB: does not fit." in text
    # every table is followed by a blank line, so no sentence runs into one
    lines = text.splitlines()
    for above, below in itertools.pairwise(lines):
        if above.startswith("|"):
            assert below.startswith("|") or below == ""
