"""The measured dataset (``dataset.json``, written by ``python -m validation.measure``): its
schema, its coverage, and that every scenario in it is one MemFit reads. Needs no PyTorch."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from memfit.engine.scenario_io import scenario_from_dict

DATASET = Path(__file__).with_name("dataset.json")

FAMILIES = {"llama", "mistral", "qwen2", "gpt2", "mixtral", "bert"}
PRECISIONS = {"fp32", "bf16-mixed", "bf16"}
OPTIMIZERS = {"adamw-foreach", "adamw-fused", "sgd"}
METHODS = {"full", "lora", "freeze"}
CHECKPOINTING = {"none", "full"}
ATTENTION = {"eager", "sdpa"}
PHASES = {"forward", "backward", "optimizer"}
CATEGORIES = {"parameters", "gradients", "optimizer_states", "other"}
GRANULARITY = 512


@cache
def _load() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(DATASET.read_text(encoding="utf-8"))
    return data


def _cases() -> list[dict[str, Any]]:
    return _load()


def _optimizer(training: dict[str, Any]) -> str:
    if training["optimizer"] == "adamw":
        return f"adamw-{training['optimizer_impl']}"
    return str(training["optimizer"])


def test_dataset_is_a_list_of_cases() -> None:
    assert isinstance(_load(), list)
    assert all(isinstance(c, dict) for c in _load())


def test_has_at_least_sixty_cases_with_unique_ids() -> None:
    ids = [c["id"] for c in _cases()]
    assert len(ids) >= 60
    assert len(set(ids)) == len(ids)


def test_every_listed_value_is_covered() -> None:
    seen: dict[str, set[str]] = {k: set() for k in ("family", "prec", "opt", "meth", "ckpt", "att")}
    for c in _cases():
        t = c["scenario"]["training"]
        seen["family"].add(c["family"])
        seen["prec"].add(t["precision"])
        seen["opt"].add(_optimizer(t))
        seen["meth"].add(t["method"])
        seen["ckpt"].add(t["activation_checkpointing"])
        seen["att"].add(t["attention"])
    assert seen["family"] >= FAMILIES
    assert seen["prec"] >= PRECISIONS
    assert seen["opt"] >= OPTIMIZERS
    assert seen["meth"] >= METHODS
    assert seen["ckpt"] >= CHECKPOINTING
    assert seen["att"] >= ATTENTION


def test_every_family_has_several_precisions_and_methods() -> None:
    by_family: dict[str, list[dict[str, Any]]] = {}
    for c in _cases():
        by_family.setdefault(c["family"], []).append(c["scenario"]["training"])
    for family, trainings in by_family.items():
        assert len({t["precision"] for t in trainings}) >= 2, family
        assert len({t["method"] for t in trainings}) >= 2, family


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["id"])
def test_case_schema(case: dict[str, Any]) -> None:
    assert set(case) >= {"id", "family", "scenario", "measured", "env"}
    assert isinstance(case["id"], str) and case["id"]
    assert case["family"] in FAMILIES
    s = case["scenario"]
    assert s["memfit_scenario"] == 1
    assert s["hardware"] == {"gpu": "h100-sxm-80gb"}
    assert isinstance(s["model"].get("model_type"), str)  # HF config.json keys as they are
    t = s["training"]
    assert t["precision"] in PRECISIONS
    assert t["method"] in METHODS
    assert _optimizer(t) in OPTIMIZERS
    assert t["activation_checkpointing"] in CHECKPOINTING
    assert t["attention"] in ATTENTION
    assert t["micro_batch_size"] >= 1 and 128 <= t["sequence_length"] <= 8192

    m = case["measured"]
    ints = (
        "peak_allocated_bytes",
        "peak_allocated_raw_bytes",
        "first_step_peak_bytes",
        "before_step_bytes",
    )
    for key in ints:
        assert isinstance(m[key], int) and m[key] > 0, key
    assert m["peak_allocated_bytes"] % GRANULARITY == 0
    assert m["peak_allocated_raw_bytes"] <= m["peak_allocated_bytes"]
    assert m["before_step_bytes"] <= m["peak_allocated_bytes"]
    assert m["peak_phase"] in PHASES
    assert isinstance(m["attention_kernel"], str) and m["attention_kernel"]
    if t["attention"] == "eager":
        assert m["attention_kernel"] == "eager"

    phases = m["phase_peaks"]
    assert set(phases) >= PHASES
    assert all(isinstance(v, int) and v >= 0 for v in phases.values())
    assert max(phases.values()) == m["peak_allocated_bytes"]

    breakdown = m["breakdown_at_peak"]
    assert set(breakdown) == CATEGORIES
    assert all(isinstance(v, int) and v >= 0 for v in breakdown.values())
    assert sum(breakdown.values()) == m["peak_allocated_bytes"]
    assert breakdown["parameters"] > 0

    env = case["env"]
    assert {"torch", "transformers", "peft", "mode"} <= set(env)
    assert all(isinstance(env[k], str) and env[k] for k in ("torch", "transformers", "peft"))


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["id"])
def test_scenario_loads_in_the_engine(case: dict[str, Any]) -> None:
    scenario = scenario_from_dict(case["scenario"])
    t = case["scenario"]["training"]
    assert scenario.training.micro_batch_size == t["micro_batch_size"]
    assert scenario.training.sequence_length == t["sequence_length"]
    assert scenario.model.num_layers <= 4


def test_dataset_matches_the_case_list() -> None:
    """The checked-in measurements are those of ``validation/cases.py`` as it is now."""
    cases = pytest.importorskip("validation.cases")
    listed = {c["id"]: c["scenario"] for c in cases.all_cases()}
    measured = {c["id"]: c["scenario"] for c in _cases()}
    assert set(listed) == set(measured)
    for cid, scenario in listed.items():
        assert measured[cid] == json.loads(json.dumps(scenario)), cid
