"""A scenario is resolved once (engine.plan.resolve); memory, time and the app read the plan."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.plan import resolve
from memfit.engine.plan.precision import precision_of
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec
from tests.engine.helpers import preset_scenario

ENGINE = Path(__file__).resolve().parents[2] / "engine"


def test_equal_scenarios_resolve_to_one_plan() -> None:
    a = preset_scenario("llama-3-8b", "h100-sxm-80gb", {"method": "lora"}, gpus_per_node=8)
    b = preset_scenario("llama-3-8b", "h100-sxm-80gb", {"method": "lora"}, gpus_per_node=8)
    assert a == b and a is not b
    plan = resolve(a)
    assert resolve(b) is plan
    assert plan.given is a and plan.mesh.dp == 8
    assert estimate(a).mesh == plan.mesh


def test_the_plan_holds_the_model_as_the_stack_builds_it() -> None:
    """LitGPT builds its own modules (fused q/k/v, no tied head); the plan carries that
    model, and the conventions resolved for the stack."""
    s = preset_scenario("llama-3.2-1b", "h100-sxm-80gb", {"model_implementation": "litgpt"})
    plan = resolve(s)
    assert plan.scenario.model.fused_qkv and not s.model.fused_qkv
    assert plan.conventions.implementation == "litgpt"


def test_a_mesh_that_does_not_divide_is_refused_when_resolving() -> None:
    s = preset_scenario("llama-3-8b", "h100-sxm-80gb", {"parallelism": {"tp": 3}}, gpus_per_node=3)
    with pytest.raises(EstimateError) as err:
        resolve(s)
    assert err.value.field == "training.parallelism.tp"


@pytest.mark.parametrize(
    ("training", "expected"),
    [
        # (mode, compute, master, gather, reduce)
        (TrainingSpec(precision="fp32"), ("fp32", 4, 4, 4, 4)),
        (TrainingSpec(precision="bf16"), ("half", 2, 2, 2, 2)),
        (TrainingSpec(precision="bf16-mixed"), ("amp", 2, 4, 2, 4)),
        (TrainingSpec(precision="fp16-mixed"), ("amp", 2, 4, 2, 4)),
        (TrainingSpec(precision="fp8-mixed"), ("amp", 2, 4, 2, 4)),
        # FSDP full sharding of mixed precision computes on 16-bit gathered units; the
        # Trainer's (accelerate's) policy reduces in 16 bits, torchtitan's in fp32,
        # Lightning's gathers fp32 and autocasts
        (
            TrainingSpec(precision="bf16-mixed", parallelism=ParallelismSpec(zero_stage=3)),
            ("half", 2, 4, 2, 2),
        ),
        (
            TrainingSpec(
                precision="bf16-mixed",
                stack="torchtitan",
                parallelism=ParallelismSpec(zero_stage=3),
            ),
            ("half", 2, 4, 2, 4),
        ),
        (
            TrainingSpec(
                precision="bf16-mixed", stack="lightning", parallelism=ParallelismSpec(zero_stage=3)
            ),
            ("amp", 2, 4, 4, 2),
        ),
        # QLoRA's 4-bit base is gathered as stored
        (TrainingSpec(method="qlora"), ("amp", 2, 4, 1, 4)),
    ],
)
def test_one_precision_value_per_recipe(
    training: TrainingSpec, expected: tuple[object, ...]
) -> None:
    p = precision_of(training)
    assert (p.mode, p.compute, p.master, p.gather, p.reduce) == expected


def _sources() -> dict[str, str]:
    return {p.relative_to(ENGINE).as_posix(): p.read_text() for p in ENGINE.rglob("*.py")}


def test_only_the_plan_builds_the_mesh() -> None:
    """``make_mesh`` is called where the plan is resolved, and in the sharding module that
    defines it; every other module reads ``resolve(scenario).mesh``."""
    callers = {
        name
        for name, text in _sources().items()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "make_mesh"
    }
    assert callers <= {"plan/resolve.py", "plan/mesh.py"}


def test_no_module_decides_bytes_from_the_recipes_name() -> None:
    """The bytes of a tensor class follow from :func:`memfit.engine.plan.precision.precision_of`; an
    inline ``2 if precision == "bf16" else 4`` beside it would drift."""
    rule = re.compile(r"\b[1248] if [\w.]*precision [=!]= \"[\w-]+\" else [1248]\b")
    found = {name for name, text in _sources().items() if rule.search(text)}
    assert found == set()


def test_only_the_plan_lays_out_the_stages_and_the_rank_shards() -> None:
    """The stages' layers and what a tensor/expert-parallel rank holds come from
    ``plan.ranks()`` and ``plan.rank_model()``: memory, the batched path and the step time
    read the same slots, and nothing else splits the layers or shards the model."""
    calls = {"stage_layers": set(), "tensor_parallel_shard": set()}
    for name, text in _sources().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in calls:
                calls[node.func.id].add(name)  # type: ignore[attr-defined]
    assert calls["stage_layers"] <= {"plan/ranks.py", "plan/mesh.py"}
    assert calls["tensor_parallel_shard"] <= {"plan/ranks.py", "sharding.py"}


def test_the_step_time_plays_the_stages_memory_plays() -> None:
    """An uneven pipeline split (torchtitan's balanced split counts the embedding and the
    head as a layer each): the step time's layers per rank are the plan's slots."""
    from memfit.engine.steptime import _plan, plan_key

    pp = ParallelismSpec(pp=3, pp_split="balanced")
    s = Scenario(load_model("llama-3-8b"), HardwareSpec(load_gpu("h100-sxm-80gb"), 3),
                 TrainingSpec(parallelism=pp))  # fmt: skip
    layers = [slot.model.num_layers for slot in resolve(s).ranks()]
    assert sum(layers) == 32 and len(set(layers)) > 1
    assert list(_plan(s, plan_key(s.training)).stages.per_rank) == layers


def test_the_batched_path_builds_on_the_rank_module_not_on_the_estimates_insides() -> None:
    """The batched path (engine/batch.py) and the estimate share what a rank holds and
    plays through engine.rank; the batched path imports no private name of the estimate."""
    tree = ast.parse(_sources()["batch.py"])
    private = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "memfit.engine.estimate"
        for alias in node.names
        if alias.name.startswith("_")
    }
    assert private == set()
