"""The step timeline and the per-layer activations, against hand-derived sums."""

import dataclasses
import importlib
from fractions import Fraction
from functools import partial
from itertools import pairwise

import numpy as np
import pytest

from memfit.engine import memo
from memfit.engine.estimate import estimate
from memfit.engine.graph import simulate
from memfit.engine.layers import Ctx, decoder_layer
from memfit.engine.model_state import model_state
from memfit.engine.plan import resolve
from memfit.engine.presets import load_gpu, load_model, model_names
from memfit.engine.scenario_io import scenario_from_dict
from memfit.engine.sharding import tensor_parallel_shard
from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.engine.timeline import (
    Gather,
    Point,
    Stage,
    Timeline,
    _points,
    played_step,
    step_plan,
    step_timeline,
)
from tests.engine.helpers import full_ctx, preset_scenario, tiny_model

TINY = tiny_model(num_key_value_heads=4)
B, S = 2, 96


def ctx(**changes: object) -> Ctx:
    return full_ctx(batch=B, seq=S, **changes)


def test_fp32_llama_layer_keeps_what_autograd_saves() -> None:
    t, h, i, q = B * S, 64, 128, 64
    block, out = decoder_layer(TINY, ctx(), True, False)
    result = simulate(block, out)
    lse = 4 * B * 4 * (-(-S // 32) * 32)  # memory-efficient kernel, fp32, padded to 32
    expected = (
        4 * t * h * 3  # layer input (kept by pow), normalized x (by the weight mul), norm out
        + 4 * t * 2  # two rsqrt outputs
        + 4 * t * q * 2  # rotated q, attention output
        + 4 * t * q * 2  # rotated k, v (MHA: as wide as q)
        + lse
        + 4 * t * h * 3  # residual, its normalized x, second norm out
        + 4 * t * i * 4  # gate, silu(gate), up, silu(gate) * up
    )
    assert result.kept == expected
    assert result.output == 4 * t * h


def test_autocast_keeps_a_16_bit_copy_of_every_layer_weight() -> None:
    block, _ = decoder_layer(TINY, ctx(mode="amp"), True, False)
    copies = sum(n for name, n in block.sizes.items() if name.startswith("wcast"))
    layer_linears = 4 * 64 * 64 + 3 * 64 * 128
    assert copies == 2 * layer_linears


def test_eager_attention_keeps_the_s_by_s_terms() -> None:
    sdpa = simulate(*decoder_layer(TINY, ctx(), True, False))
    eager = simulate(*decoder_layer(TINY, ctx(attention="eager"), True, False))
    scores = B * 4 * S * S
    lse = 4 * B * 4 * (-(-S // 32) * 32)
    # fp32: the softmax output kept by softmax and by the matmul with v (same tensor),
    # minus what the fused kernel kept instead (its output and log-sum-exp)
    assert eager.kept - sdpa.kept == 4 * scores - lse


def scenario(**training: object) -> Scenario:
    return Scenario(
        load_model("llama-3-8b"), HardwareSpec(load_gpu("h100-sxm-80gb")), TrainingSpec(**training)
    )  # type: ignore[arg-type]


def test_peak_breakdown_adds_up_and_names_its_moment() -> None:
    est = estimate(scenario(method="lora", micro_batch_size=2, sequence_length=4096))
    peak = max(est.timeline, key=lambda p: p.total)
    assert est.peak_phase == peak.phase and est.peak_layer == peak.layer
    modelled = sum(
        i.bytes for i in est.items if i.category != "overhead" or i.name.startswith(("loss", "fp8"))
    )
    assert modelled == peak.total == est.allocated_bytes


def test_checkpointing_and_chunked_loss_lower_the_peak() -> None:
    plain = estimate(scenario(micro_batch_size=4, sequence_length=4096))
    full = estimate(
        scenario(micro_batch_size=4, sequence_length=4096, activation_checkpointing="full")
    )
    every = estimate(
        scenario(
            micro_batch_size=4,
            sequence_length=4096,
            activation_checkpointing="every-k-layers",
            checkpoint_every_k=4,
        )
    )
    chunked = estimate(scenario(micro_batch_size=4, sequence_length=4096, loss="chunked"))
    assert full.allocated_bytes < every.allocated_bytes < plain.allocated_bytes
    assert chunked.allocated_bytes < plain.allocated_bytes


def test_fused_adamw_has_no_foreach_temporary() -> None:
    foreach = estimate(scenario(micro_batch_size=1, sequence_length=128))
    fused = estimate(scenario(micro_batch_size=1, sequence_length=128, optimizer_impl="fused"))
    assert foreach.peak_phase == "optimizer"
    temp = next(i for i in foreach.items if i.name.startswith("optimizer temporaries"))
    assert temp.bytes == 4 * 8_030_261_248
    assert fused.allocated_bytes < foreach.allocated_bytes


def test_totals_grow_from_allocated_to_device() -> None:
    est = estimate(scenario(method="lora"))
    overhead = {i.name: i.bytes for i in est.items if i.category == "overhead"}
    assert est.reserved_bytes - est.allocated_bytes == (
        overhead["allocator rounding (2 MiB blocks)"] + overhead["allocator fragmentation"]
    )
    assert est.device_bytes - est.reserved_bytes == (
        overhead["CUDA context"] + overhead["cuBLAS workspace"]
    )


def test_mla_layer_estimates() -> None:
    s = Scenario(
        load_model("deepseek-v2-lite"),
        HardwareSpec(load_gpu("h100-sxm-80gb")),
        TrainingSpec(
            method="lora", lora=dataclasses.replace(TrainingSpec().lora, targets=("all-linear",))
        ),
    )
    est = estimate(s)
    assert est.breakdown["activations"] > 0


def test_the_family_label_changes_nothing() -> None:
    """The layers are built from the spec's explicit fields, never from its family label:
    relabelling a preset (GPT-2 as "custom" lost its Python-written GELU, -27 %) leaves
    every byte of the estimate as it was."""
    gpu = HardwareSpec(load_gpu("h100-sxm-80gb"))
    for name in model_names():
        model = load_model(name)
        for training in (TrainingSpec(micro_batch_size=2), TrainingSpec(attention="eager")):
            as_is = estimate(Scenario(model, gpu, training))
            relabelled = estimate(Scenario(dataclasses.replace(model, family="x"), gpu, training))
            assert relabelled.items == as_is.items, name


def test_backward_never_produces_more_gradient_than_the_model_state_holds() -> None:
    """The gradients backward leaves are the trainable tensors' own, in their dtype: LoRA's
    adapters are 16-bit on a pure bf16 model, so their gradients are too (they were
    counted in fp32, twice the model state's)."""
    model = load_model("llama-3.2-1b")
    for precision in ("bf16", "bf16-mixed", "fp32"):
        for method in ("lora", "qlora", "full"):
            training = TrainingSpec(method=method, precision=precision, micro_batch_size=2)
            state = model_state(model, training)
            timeline = step_timeline(model, training, state)
            produced = max(p.gradients for p in timeline.points if p.phase == "backward")
            assert produced <= state.category_bytes("gradients"), (precision, method)


# -- the step played by runs of layers, against the step played point by point ----------

#: scenarios that exercise every part of the play: runs of one layer and of a repeated
#: group (every-k checkpointing), floored ZeRO-2/3 gradient shares, gathered units,
#: pipeline stages (1F1B, GPipe, interleaved), MoE with dense first layers, an encoder,
#: LoRA and QLoRA, frozen layers, activation offload, framework gradient buffers,
#: sliding windows, context and sequence parallelism, eager attention, a chunked loss
CASES: tuple[dict[str, object], ...] = (
    {"model": "llama-3-8b", "training": {"method": "lora", "micro_batch_size": 4}},
    {
        "model": "llama-3.2-1b",
        "gpus": 8,
        "training": {
            "activation_checkpointing": "every-k-layers",
            "checkpoint_every_k": 3,
            "parallelism": {"zero_stage": 2},
        },
    },
    {
        "model": "llama-3.2-1b",
        "gpus": 8,
        "training": {"activation_checkpointing": "full", "parallelism": {"zero_stage": 3}},
    },
    {
        "model": "llama-3.2-1b",
        "gpus": 8,
        "training": {
            "method": "lora",
            "lora": {"rank": 8, "targets": ["all-linear"]},
            "activation_checkpointing": "every-k-layers",
            "checkpoint_every_k": 2,
            "parallelism": {"zero_stage": 3},
        },
    },
    {"model": "llama-3-8b", "training": {"method": "qlora", "micro_batch_size": 2}},
    {
        "model": "deepseek-v2-lite",
        "gpus": 8,
        "training": {
            "method": "lora",
            "lora": {"targets": ["all-linear"]},
            "gradient_accumulation_steps": 4,
            "parallelism": {"pp": 2, "pp_split": "balanced", "ep": 2, "zero_stage": 1},
        },
    },
    {
        "model": "mixtral-8x7b",
        "gpus": 8,
        "training": {
            "activation_checkpointing": "selective",
            "parallelism": {"tp": 2, "ep": 4, "zero_stage": 1, "expert_capacity_factor": 1.25},
        },
    },
    {
        "model": "bert-large-uncased",
        "training": {
            "attention": "eager",
            "activation_checkpointing": "full",
            "sequence_length": 512,
            "micro_batch_size": 8,
        },
    },
    {
        "model": "gpt2",
        "training": {
            "method": "freeze",
            "freeze": {"trainable": ["lm_head"]},
            "activation_checkpointing": "full",
            "offload": {"activations": "cpu"},
            "sequence_length": 1024,
        },
    },
    {
        "model": "llama-3.1-70b",
        "gpus": 8,
        "nodes": 4,
        "training": {
            "sequence_length": 4096,
            "gradient_accumulation_steps": 8,
            "activation_checkpointing": "full",
            "parallelism": {
                "tp": 8,
                "pp": 4,
                "vpp": 2,
                "pp_schedule": "interleaved-1f1b",
                "pp_split": "balanced",
                "sequence_parallel": True,
                "zero_stage": 1,
            },
        },
    },
    {
        "model": "llama-3.2-1b",
        "gpus": 8,
        "training": {
            "gradient_accumulation_steps": 6,
            "activation_checkpointing": "every-k-layers",
            "checkpoint_every_k": 3,
            "parallelism": {"pp": 4, "pp_schedule": "gpipe", "zero_stage": 1},
        },
    },
    {
        "model": "llama-3.2-3b",
        "gpus": 8,
        "training": {
            "precision": "bf16-mixed",
            "parallelism": {"framework": "deepspeed", "zero_stage": 2},
            "offload": {"optimizer": "cpu"},
        },
    },
    {
        "model": "llama-3.2-3b",
        "gpus": 8,
        "training": {"parallelism": {"framework": "megatron", "tp": 2, "zero_stage": 1}},
    },
    {
        "model": "mistral-7b-v0.1",
        "gpus": 8,
        "training": {
            "method": "lora",
            "sequence_length": 8192,
            "parallelism": {"cp": 2, "tp": 2, "sequence_parallel": True, "zero_stage": 2},
        },
    },
    {"model": "gemma-2-2b", "training": {"sequence_length": 8192, "loss": "chunked"}},
    {
        "model": "qwen2.5-0.5b",
        "gpus": 8,
        "training": {
            "precision": "fp32",
            "optimizer": "sgd-momentum",
            "micro_batch_size": 3,
            "sequence_length": 777,
            "activation_checkpointing": "every-k-layers",
            "checkpoint_every_k": 5,
            "parallelism": {"zero_stage": 2},
        },
    },
)


def case(data: dict[str, object]) -> Scenario:
    """A scenario from a compact case: model, GPUs per node, nodes and training fields."""
    return scenario_from_dict(
        {
            "memfit_scenario": 1,
            "model": {"preset": data["model"]},
            "hardware": {
                "gpu": "h100-sxm-80gb",
                "gpus_per_node": data.get("gpus", 1),
                "nodes": data.get("nodes", 1),
            },
            "training": data["training"],
        }
    )


def rank_timelines(scenario: Scenario) -> list[Timeline]:
    """The played step of every pipeline stage of ``scenario``, by its compiled plan (a
    plan is compiled on its third play)."""
    est_module = importlib.import_module(
        "memfit.engine.estimate"
    )  # the package's name is the function
    plan = resolve(scenario)
    for _ in range(3):
        stages = est_module._stages(plan.scenario, plan.rank_model(), plan.mesh, plan.ranks())
    return [rank.timeline for _, rank in stages]


def reference(timeline: Timeline) -> tuple[Point, Point]:
    """The highest point of a step played point by point, and its highest point of forward
    and backward."""
    every = timeline.points
    fb = [p for p in every if p.phase in ("forward", "backward")]
    return max(every, key=lambda p: p.total), max(fb, key=lambda p: p.total)


@pytest.mark.parametrize("data", CASES, ids=[str(c["model"]) for c in CASES])
def test_the_peak_played_by_runs_is_the_highest_point_played_point_by_point(
    data: dict[str, object],
) -> None:
    """Every rank group's peak, found by runs of layers, is the step's highest point played
    layer by layer: the same bytes, and the same moment (the first of equal ones); and the
    estimate from compiled plans is the one from steps played point by point."""
    scenario = case(data)
    memo.clear()
    by_points = estimate(scenario)
    timelines = rank_timelines(scenario)
    assert not any(t._played for t in timelines)  # by the compiled forms, not point by point
    for timeline in timelines:
        peak, top = reference(timeline)
        assert timeline.peak == peak
        assert timeline.moments[1] == top
    est = estimate(scenario)
    assert est == by_points
    peak = max(est.timeline, key=lambda p: p.total)
    assert (est.peak_phase, est.peak_layer) == (
        peak.phase if peak.phase != "before" else "optimizer",
        peak.layer,
    )


@pytest.mark.parametrize("data", CASES[:6], ids=[str(c["model"]) for c in CASES[:6]])
def test_what_a_micro_batch_keeps_raises_each_schedule_position_as_a_play_would(
    data: dict[str, object],
) -> None:
    """A stage's timeline with k micro-batches in flight (played) is its timeline with
    one, raised by (k - 1) times what one micro-batch keeps (derived)."""
    scenario = case(data)
    training = scenario.training
    model = scenario.model
    state = model_state(model, training, "middle")
    for _ in range(3):  # played point by point, then compiled
        one = step_timeline(model, training, state, stage=Stage(False, False, 1))
        for k in (2, 5):
            assert step_timeline(model, training, state, stage=Stage(False, False, k)) == (
                one.in_flight(k - 1)
            )


def test_a_run_of_floored_gradient_shares_is_played_where_it_is_not_monotone() -> None:
    """Under ZeRO-2/3 each point holds ``floor(gradients x share)``: along a run that is
    affine only where the share divides what a repetition adds. With LoRA rank 1 on a
    small model, inputs offloaded and every layer checkpointed, nothing but the 896-byte
    adapter gradients changes per layer; at a share of 1/5,000 they move the floor by
    less than a byte per layer, so the run is played point by point."""
    model = tiny_model(num_layers=8)
    training = TrainingSpec(
        method="lora",
        lora=dataclasses.replace(TrainingSpec().lora, rank=1),
        activation_checkpointing="full",
        offload=dataclasses.replace(TrainingSpec().offload, activations="cpu"),
        precision="fp32",
        micro_batch_size=2,
        sequence_length=64,
    )
    state = model_state(model, training)
    for share in (Fraction(1, 5000), Fraction(1, 7), Fraction(1, 896), Fraction(3, 4)):
        plan = step_plan(model, training, state, grad_share=share)
        assert plan.forms().checks > 0
        replay = partial(_points, model, training, state, share, Fraction(1), Gather(), Stage(), 0)
        timeline = plan.play(2, 64, replay)
        assert bool(timeline._played) == (share == Fraction(1, 5000))  # not monotone
        played = step_timeline(model, training, state, grad_share=share)
        peak, top = reference(played)
        assert timeline.peak == played.peak == peak
        assert timeline.moments[1] == top


def test_the_shape_terms_are_those_of_the_blocks() -> None:
    """The plan computes the shape terms itself (for arrays of shapes too); they are the
    ones the blocks are built from."""
    for model, training in (
        (load_model("mixtral-8x7b"), TrainingSpec(micro_batch_size=3)),
        (
            tensor_parallel_shard(load_model("mixtral-8x7b"), 2, 4),
            TrainingSpec(
                parallelism=ParallelismSpec(tp=2, ep=4, expert_capacity_factor=1.37),
                sequence_length=4096,
            ),
        ),
    ):
        state = model_state(model, training)
        plan = step_plan(model, training, state)
        for b, s in ((1, 1), (3, 37), (7, 1000), (64, 8191), (2, 131072)):
            ctx = dataclasses.replace(plan.ctx, batch=b, seq=s)
            assert plan.terms(b, s) == ctx.terms()
            arrays = plan.terms(np.array([b, 1]), np.array([s, 1]))
            assert tuple(int(np.broadcast_to(t, (2,))[0]) for t in arrays) == ctx.terms()


#: BERT base with only its attention trained, at sequence length 1: the first layer's
#: input, the frozen embedding's output, needs no gradient
ATTENTION_ONLY = {"method": "freeze", "freeze": {"trainable": ["attention"]}, "sequence_length": 1}
#: the bf16 copy autocast makes of one of BERT base's 768 x 768 attention weights
CAST = 768 * 768 * 2


def attention_only(**changes: object) -> Scenario:
    return preset_scenario("bert-base-uncased", "h100-sxm-80gb", {**ATTENTION_ONLY, **changes})


def test_no_point_of_the_timeline_is_negative() -> None:
    """A layer whose input needs no gradient saves none of the autocast copies its first
    projections read: what it keeps after its forward holds no copy to take out of it."""
    est = estimate(attention_only())
    negative = [
        (p.phase, p.layer, p.label)
        for p in est.timeline
        if min(p.parameters, p.gradients, p.optimizer_states, p.activations) < 0
    ]
    assert negative == []


def test_the_reference_walk_holds_unsaved_casts_through_the_forward_only() -> None:
    """Played point by point at sequence length 1: every layer casts its four attention
    weights (q, k, v and the output projection); autocast's cache holds the copies until
    the forward ends, then keeps only those backward saved, each until its layer's
    backward -- all four of layers 1-11, and of layer 0, whose q, k and v read an input
    that needs no gradient, only the output projection's. What each layer keeps beside its
    copies is the same for every layer."""
    s = attention_only()
    state = model_state(s.model, s.training)
    params = state.category_bytes("parameters")
    points = played_step(s.model, s.training, state).points
    at = {(p.phase, p.layer, p.label): p for p in points}

    def copies(phase: str, layer: int | None, label: str) -> int:
        extra = at[phase, layer, label].parameters - params
        assert extra % CAST == 0
        return extra // CAST

    assert [copies("forward", i, "layer") for i in range(12)] == [4 * i + 4 for i in range(12)]
    assert copies("forward", None, "LM head and loss") == 48
    assert copies("backward", None, "loss and LM head") == 45
    assert [copies("backward", i, "layer") for i in range(12)] == [4 * i + 1 for i in range(12)]
    forward = [at["forward", i, "layer"].activations for i in range(12)]
    rises = {b - a for a, b in pairwise(forward)}
    assert len(rises) == 1 and rises.pop() > 0


@pytest.mark.parametrize("shape", [(1, 1), (4, 1), (2, 7)])
def test_the_compiled_plan_holds_unsaved_casts_as_the_reference_walk(
    shape: tuple[int, int],
) -> None:
    """The step's plan, compiled into linear forms, finds the peak and the highest point of
    forward and backward that the reference walk plays point by point; at sequence length
    1 that point is layer 0's backward, with the one copy the layer saved."""
    b, seq = shape
    s = attention_only(micro_batch_size=b, sequence_length=seq)
    state = model_state(s.model, s.training)
    played = played_step(s.model, s.training, state)
    timeline = step_plan(s.model, s.training, state).play(b, seq, lambda: played.points)
    assert not timeline._played  # by the compiled forms, not point by point
    peak, top = reference(played)
    assert timeline.peak == peak
    assert timeline.moments[1] == top
    if seq == 1:
        assert (top.phase, top.layer, top.label) == ("backward", 0, "layer")
        assert top.parameters == state.category_bytes("parameters") + CAST


def test_the_step_is_written_once_and_played_two_ways() -> None:
    """One description of the step (engine.timeline.compiled._Compiler) gives both the
    reference -- every point, with the sources of its activations -- and the candidates
    for the highest point that the plans evaluate at one or many shapes: there is no
    second walk of the step to drift from the first. Here, for a run checkpointed every
    3 layers and a LoRA run, the highest of every point is the candidates' highest, and
    every point's sources add up to its activations (the golden set and the plans' tests
    hold the rest)."""
    import pkgutil

    import memfit.engine.timeline as timeline

    assert "walk" not in {m.name for m in pkgutil.iter_modules(timeline.__path__)}
    for s in (
        preset_scenario("llama-3-8b", "h100-sxm-80gb", {"micro_batch_size": 2,
                        "activation_checkpointing": "every-k-layers", "checkpoint_every_k": 3}),
        preset_scenario("qwen2.5-0.5b", "l4", {"micro_batch_size": 4, "method": "lora"}),
    ):  # fmt: skip
        training = s.training
        state = model_state(s.model, training)
        plan = timeline.step_plan(s.model, training, state)
        points, _, _, sources = plan.points_at(training.micro_batch_size,
                                               training.sequence_length, explain=True)  # fmt: skip
        played = plan.play(training.micro_batch_size, training.sequence_length, tuple)
        middle = [p for p in points if p.phase in ("forward", "backward")]
        assert played.moments[1] == max(middle, key=lambda p: p.total)
        assert len(sources) == len(points)
        for point, parts in zip(points, sources, strict=True):
            assert sum(part.bytes for part in parts) == point.activations
