"""The batched totals (engine.batch) against the estimate, to the byte: memoised totals,
many shapes of one strategy at once, and the shapes that make a scenario invalid."""

import dataclasses
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfit.engine import batch, memo
from memfit.engine.batch import Totals, totals, totals_over
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.model_state import model_state
from memfit.engine.plan import make_mesh
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.scenario_io import scenario_from_dict
from memfit.engine.sharding import shard, tensor_parallel_shard
from memfit.engine.specs import (
    MAX_DIM,
    FreezeSpec,
    HardwareSpec,
    LoraSpec,
    OffloadSpec,
    ParallelismSpec,
    Scenario,
    TrainingSpec,
)
from memfit.engine.timeline import KINDS, played_step, step_plan
from tests.engine.invariants import scenarios
from tests.engine.test_timeline import CASES, CAST, attention_only, case

#: shapes around the usual ones, odd ones, and ones no scenario accepts
SHAPES = (
    [(b, s, a) for b in (1, 2, 3, 8) for s in (1, 7, 512, 1000, 4096) for a in (1, 4)]
    + [(16, 8192, 2), (5, 2048, 13)]
    + [(0, 2048, 1), (1, 0, 1), (1, 2048, 0), (65537, 2048, 1), (1, MAX_DIM + 1, 1)]
)


def expected(scenario: Scenario, shape: tuple[Any, ...]) -> tuple[Any, ...] | str:
    """The estimate of ``scenario`` at ``shape`` as totals, or its error's message."""
    b, s, a = shape
    try:
        training = dataclasses.replace(
            scenario.training, micro_batch_size=b, sequence_length=s, gradient_accumulation_steps=a
        )
        est = estimate(dataclasses.replace(scenario, training=training))
    except EstimateError as error:
        return str(error)
    return (
        est.allocated_bytes,
        est.reserved_bytes,
        est.device_bytes,
        est.capacity_bytes,
        est.budget_bytes,
        est.verdict,
        est.peak_phase,
        est.host_bytes,
    )


def found(result: Totals | EstimateError) -> tuple[Any, ...] | str:
    if isinstance(result, EstimateError):
        return str(result)
    return dataclasses.astuple(result)


def test_totals_are_the_estimates_own_figures() -> None:
    for data in CASES:
        s = case(data)
        t = s.training
        assert found(totals(s)) == expected(
            s, (t.micro_batch_size, t.sequence_length, t.gradient_accumulation_steps)
        )
        assert totals(s) is totals(s)  # memoised


@pytest.mark.parametrize("data", CASES, ids=[str(c["model"]) for c in CASES])
def test_totals_over_equals_the_estimate_of_every_shape(data: dict[str, object]) -> None:
    """Pipelines (1F1B, GPipe, interleaved), ZeRO-2/3 gradient shares, every-k
    checkpointing, MoE, BERT, LoRA and QLoRA, offload: every shape's totals are those of
    the estimate of the scenario with that shape, or its error."""
    s = case(data)
    memo.clear()
    for shape, result in zip(SHAPES, totals_over(s, SHAPES), strict=True):
        assert found(result) == expected(s, shape), shape


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
@given(scenarios, st.randoms(use_true_random=False))
def test_totals_over_equals_the_estimate_for_any_scenario(
    data: dict[str, Any], rng: random.Random
) -> None:
    """Random scenarios over every preset, GPU and setting, at random shapes (some
    invalid): each result equals the estimate of the scenario with that shape."""
    try:
        s = scenario_from_dict(data)
    except EstimateError:
        return
    shapes = [
        (
            rng.choice((1, 2, 3, 4, 8, 0)),
            rng.choice((1, 7, 64, 512, 1000, 2048, 4096, 8192, 0)),
            rng.choice((1, 2, 3, 8, 0)),
        )
        for _ in range(6)
    ]
    for shape, result in zip(shapes, totals_over(s, shapes), strict=True):
        assert found(result) == expected(s, shape), shape


def scenario(**training: Any) -> Scenario:
    return Scenario(
        load_model("llama-3.2-1b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8),
        TrainingSpec(**training),
    )


def test_invalid_shapes_come_back_as_their_errors() -> None:
    """A shape the scenario cannot take is its error, not a raise: out-of-range and
    non-integer values, a sequence that context or sequence parallelism cannot split,
    and a strategy that no shape makes valid."""
    sp = scenario(parallelism=ParallelismSpec(tp=4, sequence_parallel=True))
    cp = scenario(parallelism=ParallelismSpec(tp=2, cp=2))
    bad: list[tuple[Scenario, tuple[Any, ...]]] = [
        (sp, (True, 2048, 1)),
        (sp, (1.0, 2048, 1)),
        (sp, ("2", 2048, 1)),
        (sp, (1, 2050, 1)),  # not split by tp = 4
        (cp, (1, 2050, 1)),  # not 2 x cp chunks
        (scenario(parallelism=ParallelismSpec(tp=3)), (1, 2048, 1)),
        (scenario(method="freeze", freeze=FreezeSpec(trainable=())), (1, 2048, 1)),
    ]
    for s, shape in bad:
        (result,) = totals_over(s, [shape])  # type: ignore[list-item]
        assert isinstance(result, EstimateError), shape
        assert found(result) == expected(s, shape)
    ok, wrong, short = totals_over(sp, [(1, 2048, 1), (1, 2050, 1), (1, 2048)])  # type: ignore[list-item]
    assert isinstance(ok, Totals) and isinstance(wrong, EstimateError)
    assert isinstance(short, EstimateError) and short.field == "shapes"


def test_shapes_beyond_int64_are_exact_too() -> None:
    """Sizes int64 could not hold (b s^2 at the largest batch and sequence) are played in
    Python integers, as the estimate plays them."""
    s = Scenario(load_model("pythia-160m"), HardwareSpec(load_gpu("h100-sxm-80gb")), TrainingSpec())
    shapes = [(65536, MAX_DIM, 1), (4096, 1 << 20, 1), (1, 2048, 1)]
    for shape, result in zip(shapes, totals_over(s, shapes), strict=True):
        assert found(result) == expected(s, shape)


def test_a_sliding_window_splits_the_lengths_it_masks_from_those_it_does_not() -> None:
    s = Scenario(
        load_model("mistral-7b-v0.1"),
        HardwareSpec(load_gpu("h100-sxm-80gb")),
        TrainingSpec(method="lora"),
    )
    shapes = [(2, 2048, 1), (2, 4096, 1), (2, 4097, 1), (2, 8192, 1)]
    for shape, result in zip(shapes, totals_over(s, shapes), strict=True):
        assert found(result) == expected(s, shape)
    strategy = batch._strategy(s)
    assert set(strategy.masked) == {False, True}


def estimated_alone(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """The shapes the batched path estimates one by one from now on (``batch._one``),
    where the arrays could not say."""
    alone: list[tuple[int, int, int]] = []
    real = batch._one

    def counting(scenario: Scenario, shape: tuple[int, int, int]) -> object:
        alone.append(shape)
        return real(scenario, shape)

    monkeypatch.setattr(batch, "_one", counting)
    return alone


def test_a_sweep_is_evaluated_on_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every valid shape of a typical sweep is found by the arrays, none by estimating it
    alone (which would be exact, but slow)."""
    alone = estimated_alone(monkeypatch)
    shapes = [(b, s, 8) for b in (1, 2, 4, 8) for s in (2048, 4096, 8192)]
    for zero in range(4):
        for checkpointing in ("none", "selective", "full", "every-k-layers"):
            for tp, pp in ((1, 1), (2, 1), (8, 1), (2, 2), (1, 4), (1, 8)):
                s = scenario(
                    activation_checkpointing=checkpointing,
                    checkpoint_every_k=4,
                    parallelism=ParallelismSpec(tp=tp, pp=pp, zero_stage=zero),
                )
                assert all(isinstance(t, Totals) for t in totals_over(s, shapes))
    assert alone == []


def share_variants(**training: Any) -> list[Scenario]:
    """Strategies that differ only in their share of the model state (ZeRO stage,
    optimizer offload, optimizer), as a sweep makes them, around ``training``."""
    out = []
    layout = training.pop("parallelism", {})
    for zero in range(4):
        for offload in ("none", "cpu"):
            for optimizer in ("adamw", "adamw-8bit"):
                try:
                    s = scenario(
                        **training,
                        optimizer=optimizer,
                        parallelism=ParallelismSpec(**layout, zero_stage=zero),
                        offload=OffloadSpec(optimizer=offload),
                    )
                except EstimateError:
                    continue
                out.append(s)
    return out


@pytest.mark.parametrize(
    "training",
    [
        {},
        {"activation_checkpointing": "full"},
        {"parallelism": {"tp": 2, "pp": 2}},
        {"parallelism": {"pp": 4, "pp_schedule": "interleaved-1f1b", "vpp": 2}},
        {"method": "lora", "offload": None},
    ],
    ids=["plain", "checkpointed", "tp2-pp2", "interleaved", "lora"],
)
def test_strategies_evaluated_together_get_what_each_gets_alone(
    training: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Strategies at the same shapes that differ in their share of the model state have
    their highest points found in one Joint (with a strategy of another layout and
    shapes mixed in, and invalid shapes): each gets the totals it gets alone, and no
    shape the arrays hold is estimated alone for it."""
    training = {k: v for k, v in training.items() if v is not None}
    variants = share_variants(**training)
    assert len(variants) >= 8
    shapes = [(b, s, a) for b in (1, 2, 4) for s in (512, 2048) for a in (1, 4)] + [(0, 512, 1)]
    other = scenario(parallelism=ParallelismSpec(tp=8))
    items = [(s, shapes) for s in variants] + [(other, shapes[:3])]
    memo.clear()
    each = estimated_alone(monkeypatch)
    alone = [totals_over(s, sh) for s, sh in items]
    by_one = list(each)
    memo.clear()
    each.clear()
    joints: list[int] = []
    real_joint = batch.joint
    monkeypatch.setattr(
        batch, "joint", lambda plans: joints.append(len(plans)) or real_joint(plans)
    )
    together = batch.totals_over_each(items)
    assert [[found(t) for t in r] for r in together] == [[found(t) for t in r] for r in alone]
    assert each == by_one
    # the variants' plans in one Joint for each way their plans read a shape (FSDP's
    # residual stream is 16-bit), the other strategy's in its own
    groups = [g for g in (batch._strategy(s).group(512) for s in variants) if g is not None]
    assert len(joints) == len({g.reads() for g in groups}) + 1 < len(groups)
    assert sum(joints) == sum(len(g.plans) for g in groups) + 1


def test_joined_groups_are_those_that_read_a_shape_alike() -> None:
    """Groups are evaluated together where their plans turn a shape into the same
    quantities; the key says what a Joint reads of its first plan."""
    a, b = (batch._strategy(s).group(2048) for s in share_variants()[:2])
    assert a is not None and b is not None
    assert a.reads() == b.reads() is not None
    split = scenario(parallelism=ParallelismSpec(tp=2))
    c = batch._strategy(split).group(2048)
    assert c is not None and c.reads() == a.reads()  # tp leaves the terms alike here
    plan = a.plans[0]
    assert batch._quantities(plan)[3:6] == (plan.hidden_size, plan.res, plan.sp)


def test_a_length_is_copied_into_a_scenario_as_building_it_would() -> None:
    """The shortcut that sets a sequence length without checking the scenario again
    gives what building it anew gives, and shape fields are checked one by one."""
    s = scenario(method="qlora", parallelism=ParallelismSpec(tp=2, zero_stage=3))
    for seq in (1, 7, 2048, MAX_DIM):
        training = dataclasses.replace(s.training, sequence_length=seq)
        assert batch._with_sequence(s, seq) == dataclasses.replace(s, training=training)
    training = TrainingSpec(method="lora", lora=LoraSpec(rank=64), token_budget=10**9)
    for b, seq, a in [(1, 1, 1), (65536, MAX_DIM, 1 << 20), (0, 1, 1), (1, 1, 0)]:
        try:
            dataclasses.replace(
                training, micro_batch_size=b, sequence_length=seq, gradient_accumulation_steps=a
            )
            accepted = True
        except EstimateError:
            accepted = False
        assert batch._valid_shape((b, seq, a)) == accepted


def test_the_batched_module_reads_no_shape_from_the_strategy_it_caches() -> None:
    """A strategy first met at one shape gives every other shape the totals it would
    give had it been met there first."""
    first, later = (1, 512, 1), (4, 4096, 8)
    s = scenario(parallelism=ParallelismSpec(pp=2, zero_stage=1))
    memo.clear()
    (at_first,) = totals_over(s, [first])
    (at_later,) = totals_over(s, [later])
    memo.clear()
    assert totals_over(s, [later]) == [at_later]
    assert totals_over(s, [first]) == [at_first]


def at(s: Scenario, b: int, seq: int, a: int) -> Scenario:
    training = dataclasses.replace(
        s.training, micro_batch_size=b, sequence_length=seq, gradient_accumulation_steps=a
    )
    return dataclasses.replace(s, training=training)


@pytest.mark.parametrize("data", CASES, ids=[str(c["model"]) for c in CASES])
def test_an_estimate_does_not_depend_on_the_shapes_estimated_before_it(
    data: dict[str, object],
) -> None:
    """Estimates keep what holds for every shape of a strategy (model states, shares,
    step plans); an estimate made after other shapes of its strategy is the one made
    first, item for item and point for point."""
    s = case(data)
    shapes = [(1, 512, 1), (3, 4096, 8)]
    fresh = []
    for shape in shapes:
        memo.clear()
        fresh.append(estimate(at(s, *shape)))
    memo.clear()
    for shape in shapes[::-1]:
        estimate(at(s, *shape))
    after = [estimate(at(s, *shape)) for shape in shapes]
    assert after == fresh


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(scenarios)
def test_model_states_and_shards_read_no_shape(data: dict[str, Any]) -> None:
    """What estimates and the batched totals keep for every shape of a strategy is the
    same at every shape: the model state of every part and its share on a rank."""
    try:
        s = scenario_from_dict(data)
        other = at(s, 7, 1000, 3)
        mesh = make_mesh(s)
    except EstimateError:
        return
    model = tensor_parallel_shard(s.model, mesh.tp, mesh.ep)
    for part in ("all", "first", "middle", "last"):
        try:
            state = model_state(model, s.training, part)
        except EstimateError:
            continue
        assert model_state(model, other.training, part) == state
        assert shard(state, s, mesh, model, part) == shard(state, other, mesh, model, part)


def test_the_batched_path_holds_unsaved_casts_as_the_reference_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """BERT base with only its attention trained, at sequence length 1 (the first layer's
    input needs no gradient, and the layer saves only its output projection's autocast
    copy): the arrays that evaluate many shapes at once find the reference walk's highest
    point of forward and backward at every shape, and a sweep's totals are the
    estimate's, none of them estimated alone."""
    s = attention_only()
    model, training = s.model, s.training
    state = model_state(model, training)
    sizes = np.array([1, 4, 8, 2]), np.array([1, 1, 1, 7])
    moments = step_plan(model, training, state).moments(*sizes)
    assert moments is not None and not moments.single.any()
    for i, (b, seq) in enumerate(zip(*sizes, strict=True)):
        shaped = dataclasses.replace(training, micro_batch_size=int(b), sequence_length=int(seq))
        points = played_step(model, shaped, state).points
        top = max((p for p in points if p.phase in ("forward", "backward")), key=lambda p: p.total)
        assert KINDS[moments.kind[i]] == (top.phase, top.label)
        assert moments.layer[i] == (-1 if top.layer is None else top.layer)
        assert (moments.parameters[i], moments.gradients[i], moments.activations[i]) == (
            top.parameters,
            top.gradients,
            top.activations,
        )
        if seq == 1:
            assert top.parameters == state.category_bytes("parameters") + CAST
    alone = estimated_alone(monkeypatch)
    memo.clear()
    shapes = [(1, 1, 1), (4, 1, 2), (8, 1, 1), (2, 7, 1)]
    results = totals_over(s, shapes)
    assert alone == []
    for shape, result in zip(shapes, results, strict=True):
        assert found(result) == expected(s, shape), shape
