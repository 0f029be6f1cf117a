"""The activations at the peak told apart by source (engine.explain, engine.timeline's
ledger): the sources add up to the activations to the byte on every path the step is
played by, each kind appears where its mechanism does, and a remedy's saving is the
estimate of the changed scenario."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from memfit.engine import memo
from memfit.engine.changes import BY_ID
from memfit.engine.cli import main
from memfit.engine.estimate import estimate
from memfit.engine.explain import REMEDIES, TITLES, activation_sources, explained, remedy
from memfit.engine.model_state import model_state
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.engine.timeline import SOURCE_KINDS, played_step, step_timeline

GIB = 2**30


def _scenario(model: str = "llama-3-8b", gpus: int = 1, **training: object) -> Scenario:
    fields: dict[str, object] = {"precision": "bf16-mixed", "micro_batch_size": 1}
    fields.update(training)
    return Scenario(
        load_model(model),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=gpus),
        TrainingSpec(**fields),  # type: ignore[arg-type]
    )


def _kinds(scenario: Scenario) -> set[str]:
    return {s.kind for s in activation_sources(estimate(scenario))}


CASES = {
    "full": _scenario("gpt2", micro_batch_size=4, sequence_length=1024),
    "checkpointed": _scenario(method="lora", sequence_length=4096, activation_checkpointing="full"),
    "qlora-lightning": _scenario(method="qlora", sequence_length=2048, stack="lightning"),
    "pipeline": _scenario(
        gpus=4,
        method="lora",
        sequence_length=2048,
        gradient_accumulation_steps=8,
        parallelism=ParallelismSpec(pp=4),
    ),
    "eager-bert": _scenario("bert-base-uncased", attention="eager", sequence_length=512),
}


@pytest.mark.parametrize("name", CASES)
def test_sources_add_up_to_every_point(name: str) -> None:
    est = estimate(CASES[name])
    assert est.steps is not None
    for point, parts in zip(est.steps.points, est.steps.sources(), strict=True):
        assert sum(s.bytes for s in parts) == point.activations, point
        assert all(s.bytes > 0 and s.kind in SOURCE_KINDS and s.formula for s in parts)
    told = sum(s.bytes for s in activation_sources(est))
    assert told == est.steps.peak.activations == est.breakdown["activations"]


def test_a_compiled_plan_tells_the_same_sources_as_the_played_step() -> None:
    scenario = CASES["checkpointed"]
    model, training = scenario.model, scenario.training
    state = model_state(model, training)
    memo.clear()
    played = played_step(model, training, state)
    for _ in range(3):  # the third play compiles the plan
        compiled = step_timeline(model, training, state)
    assert compiled.peak == played.peak
    assert compiled.peak_sources() == played.peak_sources()


def test_each_mechanism_shows_as_its_kind() -> None:
    assert "checkpointed" in _kinds(CASES["checkpointed"])
    assert "checkpointed" not in _kinds(CASES["full"])
    assert "saved" in _kinds(CASES["full"])
    assert "in-flight" in _kinds(CASES["pipeline"])
    assert "in-flight" not in _kinds(CASES["full"])
    # the eager kernel's 4-D mask lives through the forward and dies with it
    steps = estimate(CASES["eager-bert"]).steps
    assert steps is not None
    masked = [
        p.phase
        for p, parts in zip(steps.points, steps.sources(), strict=True)
        if any("attention mask" in s.name for s in parts)
    ]
    assert masked and set(masked) == {"forward"}


def test_the_previous_step_is_named_where_the_loop_keeps_it() -> None:
    est = estimate(CASES["qlora-lightning"])
    assert est.steps is not None
    kinds = {s.kind for parts in est.steps.sources() for s in parts}
    assert "previous" in kinds
    released = dataclasses.replace(
        CASES["qlora-lightning"],
        training=dataclasses.replace(CASES["qlora-lightning"].training, previous_step_held=False),
    )
    steps = estimate(released).steps
    assert steps is not None
    assert "previous" not in {s.kind for parts in steps.sources() for s in parts}


def test_a_long_sequence_shows_the_logits_and_the_chunked_loss_that_removes_them() -> None:
    # Llama 3's 128k vocabulary at 8k tokens: the logits and their fp32 copies dominate
    est = estimate(_scenario(method="lora", sequence_length=8192, activation_checkpointing="full"))
    groups = explained(est)
    top = groups[0]
    assert top.kind == "logits" and top.title == TITLES["logits"]
    assert top.bytes > 0.6 * est.breakdown["activations"]
    assert top.remedy is not None and top.remedy.label == BY_ID["chunked-loss"].label
    # the saving is the changed scenario's estimate, not the group's size
    chunked = dataclasses.replace(
        est.scenario, training=dataclasses.replace(est.scenario.training, loss="chunked")
    )
    assert top.remedy.saved_bytes == est.device_bytes - estimate(chunked).device_bytes
    assert top.remedy.saved_bytes > 0.5 * top.bytes
    assert [g.bytes for g in groups] == sorted((g.bytes for g in groups), reverse=True)
    assert sum(g.bytes for g in groups) == est.breakdown["activations"]


def test_a_remedy_that_does_not_apply_is_none() -> None:
    est = estimate(_scenario(method="lora", sequence_length=1024, loss="chunked"))
    assert remedy(est, "logits") is None
    assert remedy(est, "inputs") is None  # nothing a user changes removes the batch
    assert set(REMEDIES) <= set(SOURCE_KINDS)


def test_a_timeline_without_its_sources_says_so() -> None:
    est = estimate(CASES["full"])
    assert est.steps is not None
    bare = dataclasses.replace(est.steps, explain=None)
    with pytest.raises(ValueError, match="without its sources"):
        bare.sources()


def test_the_command_line_tells_the_activations_apart() -> None:
    args = ["estimate", "--model", "gpt2", "--gpu", "l4", "--batch", "4", "--seq", "1024"]
    out = io.StringIO()
    assert main([*args, "--activations", "--json"], out) == 0
    data = json.loads(out.getvalue())
    groups = data["activation_sources"]
    assert sum(g["bytes"] for g in groups) == data["breakdown"]["activations"]
    assert all(isinstance(s["bytes"], int) for g in groups for s in g["sources"])
    assert {g["kind"] for g in groups} <= set(SOURCE_KINDS)
    assert groups[0]["bytes"] >= groups[-1]["bytes"]
    text = io.StringIO()
    assert main([*args, "--activations"], text) == 0
    shown = text.getvalue()
    assert "Activations at the peak by source" in shown and "-> " in shown
    plain = io.StringIO()
    assert main(args, plain) == 0 and "Activations at the peak by source" not in plain.getvalue()
