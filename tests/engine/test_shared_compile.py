"""One compiled step serves every share of the model state: strategies that differ only in
how the model state is held (optimizer, ZeRO stage, offload) share the step's compile
(:class:`memfit.engine.timeline.compiled._Skeleton`), and the forms each gets from it are
those of compiling its own plan alone, field by field."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from memfit.engine import memo
from memfit.engine.errors import EstimateError
from memfit.engine.plan import resolve
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.rank import rank_share
from memfit.engine.specs import (
    HardwareSpec,
    OffloadSpec,
    ParallelismSpec,
    Scenario,
    TrainingSpec,
)
from memfit.engine.timeline import StepPlan
from memfit.engine.timeline.compiled import _SKELETONS, _Forms, _Skeleton, compile_key, state_of


def plans(scenario: Scenario) -> list[StepPlan]:
    """The step plan of every distinct rank group of ``scenario`` (none where its mesh
    does not hold)."""
    try:
        resolved = resolve(scenario)
    except EstimateError:
        return []
    s, mesh = resolved.scenario, resolved.mesh
    return [
        rank_share(s, slot.model, mesh, slot.key[3], slot.stage, slot.chunk)[1]
        for slot in resolved.ranks()
    ]


def scenarios() -> list[Scenario]:
    """Llama 3.2 1B on 8 H100s: every optimizer, ZeRO stage and optimizer offload, at two
    precisions, two checkpointing modes, without a pipeline and with two and four stages
    (middle stages alike but for the micro-batches they hold); one LoRA."""
    out = []
    model, gpu = load_model("llama-3.2-1b"), load_gpu("h100-sxm-80gb")
    for precision, ckpt, pp, optimizer, zero, offload in itertools.product(
        ("bf16-mixed", "bf16"),
        ("none", "full"),
        (1, 2, 4),
        ("adamw", "adamw-8bit", "sgd"),
        (0, 1, 2, 3),
        ("none", "cpu"),
    ):
        try:
            training = TrainingSpec(
                precision=precision,
                activation_checkpointing=ckpt,
                optimizer=optimizer,
                micro_batch_size=2,
                gradient_accumulation_steps=4,
                sequence_length=1024,
                parallelism=ParallelismSpec(pp=pp, zero_stage=zero),
                offload=OffloadSpec(optimizer=offload),
            )
            out.append(Scenario(model, HardwareSpec(gpu, gpus_per_node=8), training))
        except EstimateError:
            continue
    lora = dataclasses.replace(out[0].training, method="lora")
    return [*out, dataclasses.replace(out[0], training=lora)]


def same(a: _Forms, b: _Forms) -> None:
    for f in dataclasses.fields(_Forms):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "arrays":
            assert len(x) == len(y)
            for u, v in zip(x, y, strict=True):
                assert u.dtype == v.dtype and np.array_equal(u, v)
        elif isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert x == y, f.name


@pytest.fixture(scope="module")
def every_plan() -> list[StepPlan]:
    memo.clear()
    return [plan for s in scenarios() for plan in plans(s)]


def test_the_shared_compile_gives_each_plan_the_forms_of_its_own_compile(
    every_plan: list[StepPlan],
) -> None:
    for plan in every_plan:
        shared = plan.forms()
        alone = _Skeleton.compile(plan).at(state_of(plan))
        same(shared, alone)


def test_strategies_that_hold_the_state_differently_share_a_compile(
    every_plan: list[StepPlan],
) -> None:
    keys = {compile_key(plan) for plan in every_plan}
    assert len(keys) * 4 < len(every_plan)  # optimizers, stages and offloads share
    # and plans of one key differ in their state: the sharing is not of equal plans
    by_key: dict[tuple[object, ...], set[tuple[int, ...]]] = {}
    for plan in every_plan:
        by_key.setdefault(compile_key(plan), set()).add(state_of(plan))
    assert max(len(states) for states in by_key.values()) >= 6
    assert len(_SKELETONS) >= len(keys)


def test_a_gathered_plan_with_floored_shares_moves_its_checked_runs_with_the_state() -> None:
    """ZeRO-3 on 3 GPUs (a share of 1/3 that does not divide a layer's gradients): the rows
    of the runs to check hold the gathered units, which the state gives."""
    model, gpu = load_model("llama-3.2-1b"), load_gpu("h100-sxm-80gb")
    found = []
    for optimizer in ("adamw", "sgd"):
        training = TrainingSpec(
            optimizer=optimizer,
            micro_batch_size=1,
            sequence_length=512,
            parallelism=ParallelismSpec(zero_stage=3),
        )
        [plan] = plans(Scenario(model, HardwareSpec(gpu, gpus_per_node=3), training))
        found.append(plan)
        same(plan.forms(), _Skeleton.compile(plan).at(state_of(plan)))
    assert compile_key(found[0]) == compile_key(found[1])
    assert _SKELETONS[compile_key(found[0])].moves  # the state moves the checked rows
    assert found[0].forms().checks > 0


def test_plans_that_gather_and_plans_that_do_not_share_a_compile() -> None:
    """A pipeline stage under ZeRO-3 stays gathered where under ZeRO-1 it is not: one
    compile serves both (the state says which), and each plan's highest point is the one
    its every point, played whole, reaches."""
    model, gpu = load_model("llama-3.2-1b"), load_gpu("h100-sxm-80gb")
    found = []
    for zero in (1, 3):
        training = TrainingSpec(
            precision="bf16",
            micro_batch_size=2,
            sequence_length=1024,
            parallelism=ParallelismSpec(pp=2, zero_stage=zero),
        )
        for plan in plans(Scenario(model, HardwareSpec(gpu, gpus_per_node=8), training)):
            same(plan.forms(), _Skeleton.compile(plan).at(state_of(plan)))
            assert plan.recipe.gather.active == (zero == 3)
            every = plan.points_at(2, 1024)[0]
            played = [p for p in every if p.phase in ("forward", "backward")]
            top = max(played, key=lambda p: p.total)
            assert plan.play(2, 1024, lambda every=every: every).moments[1] == top
            found.append(plan)
    assert [compile_key(p) for p in found[:2]] == [compile_key(p) for p in found[2:]]
    assert [state_of(p) for p in found[:2]] != [state_of(p) for p in found[2:]]


def test_the_plans_of_a_compile_evaluated_together_get_the_forms_each_gets_alone(
    every_plan: list[StepPlan],
) -> None:
    """:meth:`_Forms.of_each` (a sweep's strategies that differ in their share of the
    model state, at their states at once) gives every plan the forms :meth:`_Forms.of`
    gives it, field by field and dtype by dtype; most of them made together."""
    together = _Forms.of_each(every_plan)
    for plan, forms in zip(every_plan, together, strict=True):
        same(forms, _Forms.of(plan))
    made = []
    for plan in every_plan:
        skeleton = _SKELETONS[compile_key(plan)]
        made += skeleton.at_each([state_of(plan), state_of(plan)])
    assert sum(f is not None for f in made) > len(made) / 2
    # a state beyond int64 is left to at(), which evaluates it in Python integers
    skeleton = _SKELETONS[compile_key(every_plan[0])]
    huge = (1 << 62, *state_of(every_plan[0])[1:])
    assert skeleton.at_each([huge, state_of(every_plan[0])]) == [None, None]
