"""A block's sizes that no linear form of the shape holds are evaluated at each shape.

What a block's custom autograd functions keep, what torchtitan's per-op policy saves and
what a layer returns beside its output are read as linear forms of the shape from a block
built with symbolic sizes. Transformers' eager experts loop routes whole tokens to each
expert and is built at concrete shapes only: an MoE model run with it, wherever one of
those sizes counts (QLoRA under checkpointing, a stack that holds the previous step's
graph), raised ``TypeError`` out of ``estimate()`` and crashed the app's what-if bar. Those
sizes are now evaluated at each shape, as the block's own values are; the step equals the
one played point by point, and a step whose every such size is evaluated at each shape
equals the one that reads them as forms, to the byte.
"""

from __future__ import annotations

import dataclasses

import pytest

from memfit.engine import memo
from memfit.engine.estimate import estimate
from memfit.engine.model_state import model_state
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import (
    HardwareSpec,
    ParallelismSpec,
    QuantSpec,
    Scenario,
    TrainingSpec,
)
from memfit.engine.steptime import step_time
from memfit.engine.timeline import played_step, step_timeline, stepplan


def scenario(model: str, gpus: int = 1, **training: object) -> Scenario:
    hardware = HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=gpus)
    return Scenario(load_model(model), hardware, TrainingSpec(**training))  # type: ignore[arg-type]


#: where the eager experts loop raised: (model, the training's fields); in the last two
#: its layers' 4-bit matmuls keep their inputs, under checkpointing (bitsandbytes before
#: 0.43.2) and through the next step (Lightning holds the previous step's graph)
EAGER_MOE: list[tuple[str, dict[str, object]]] = [
    ("mixtral-8x7b", {"method": "qlora", "activation_checkpointing": "full", "stack": "axolotl"}),
    ("qwen3-30b-a3b", {"method": "full", "activation_checkpointing": "full", "stack": "lightning"}),
    ("gpt-oss-20b", {"method": "lora", "stack": "lightning"}),
    (
        "gpt-oss-20b",
        {"method": "qlora", "activation_checkpointing": "selective", "stack": "torchtitan"},
    ),
    (
        "mixtral-8x7b",
        {
            "method": "qlora",
            "activation_checkpointing": "full",
            "qlora": QuantSpec(matmul_keeps_input=True),
        },
    ),
    ("qwen3-30b-a3b", {"method": "qlora", "stack": "lightning"}),
]


@pytest.mark.parametrize(("model", "fields"), EAGER_MOE)
def test_an_eager_moe_step_is_estimated_and_equals_the_step_played(
    model: str, fields: dict[str, object]
) -> None:
    s = scenario(
        model, moe_implementation="eager", micro_batch_size=2, sequence_length=512, **fields
    )
    est = estimate(s)  # raised TypeError
    assert est.device_bytes > 0
    assert step_time(s).step_time_s > 0
    state = model_state(s.model, s.training)
    played = played_step(s.model, s.training, state)
    for _ in range(3):  # the third play compiles the plan
        compiled = step_timeline(s.model, s.training, state)
    assert compiled.peak == played.peak
    assert [p.total for p in compiled.points] == [p.total for p in played.points]


def test_what_the_eager_experts_layers_keep_counts() -> None:
    """The sizes evaluated at each shape are the layers' own: 4-bit matmuls that keep
    their inputs through checkpointing keep more than those that do not."""
    keeps, drops = (
        estimate(
            scenario(
                "mixtral-8x7b",
                method="qlora",
                activation_checkpointing="full",
                moe_implementation="eager",
                micro_batch_size=2,
                sequence_length=512,
                qlora=QuantSpec(matmul_keeps_input=keeps),
            )
        )
        for keeps in (True, False)
    )
    assert keeps.steps is not None and drops.steps is not None
    layers = load_model("mixtral-8x7b").num_layers
    # at least one 2 x 512-token bf16 input of 4,096 per layer
    assert (
        keeps.steps.peak.activations - drops.steps.peak.activations >= layers * 2 * 512 * 4096 * 2
    )


#: dense and MoE steps where each of those sizes counts: per-op checkpointing
#: (torchtitan), the previous step's graph (Lightning), QLoRA's kept inputs under
#: checkpointing, Falcon's returned attention weights, and a pipeline stage
EVERY_SIZE = [
    scenario("llama-3.2-1b", activation_checkpointing="selective", stack="torchtitan"),
    scenario("llama-3.2-1b", method="lora", stack="lightning"),
    scenario(
        "llama-3.2-1b",
        method="qlora",
        activation_checkpointing="full",
        qlora=QuantSpec(matmul_keeps_input=True),
    ),
    scenario("falcon-7b", method="lora", attention="eager", activation_checkpointing="full"),
    scenario("qwen3-30b-a3b", method="qlora", stack="lightning"),
    scenario(
        "llama-3.2-1b",
        gpus=4,
        method="qlora",
        activation_checkpointing="full",
        gradient_accumulation_steps=4,
        parallelism=ParallelismSpec(pp=4),
    ),
]


def test_sizes_evaluated_at_each_shape_equal_their_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block of these steps with its sizes evaluated at each shape (as if no linear
    form held them) gives the estimate that reading them as forms gives."""
    shapes = [(1, 512), (3, 1000), (2, 4096)]

    def shaped(s: Scenario, b: int, seq: int) -> Scenario:
        training = dataclasses.replace(s.training, micro_batch_size=b, sequence_length=seq)
        return dataclasses.replace(s, training=training)

    cases = [shaped(s, b, seq) for s in EVERY_SIZE for b, seq in shapes]
    memo.clear()
    forms = [estimate(s) for s in cases]
    memo.clear()
    monkeypatch.setattr(stepplan, "_linear", lambda size, *args: None)
    per_shape = [estimate(s) for s in cases]
    for s, a, b in zip(cases, forms, per_shape, strict=True):
        assert (a.allocated_bytes, a.device_bytes, a.host_bytes) == (
            b.allocated_bytes,
            b.device_bytes,
            b.host_bytes,
        ), s.training
        assert a.steps is not None and b.steps is not None
        assert [p.total for p in a.steps.points] == [p.total for p in b.steps.points]
    memo.clear()
