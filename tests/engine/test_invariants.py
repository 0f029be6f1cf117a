"""The invariants of tests/engine/invariants.py over 150 scenarios drawn from a fixed seed
(the benchmark ``benchmarks/properties.py`` draws 10,000 and more from a fresh one)."""

from typing import Any

from hypothesis import given, seed, settings

from memfit.engine.estimate import estimate
from memfit.engine.scenario_io import scenario_from_dict
from tests.engine.invariants import (
    _peak_activations,
    check_all,
    check_checkpointing,
    check_sharding_at_peak,
    gathered_bound,
    scenarios,
)

#: the draw CI checks, the same on every run (the benchmark draws a fresh one)
SEED = 20261201


@seed(SEED)
@settings(max_examples=150, deadline=None, database=None)
@given(scenarios)
def test_every_invariant_holds_for_any_scenario(data: dict[str, Any]) -> None:
    check_all(data)


#: a fresh draw of benchmarks/properties.py (seed 3588917348): a two-stage pipeline whose
#: highest total moves from the first stage (the embedding's gradient, no checkpointing) to
#: the last (the loss's backward over Gemma-2's 256k vocabulary, full checkpointing)
MOVING_PEAK = {
    "model": {"preset": "gemma-2-9b"},
    "hardware": {"gpus_per_node": 2, "gpu": "rtx-5090", "nodes": 1},
    "training": {
        "loss": "chunked-output",
        "optimizer": "adafactor",
        "freeze": {"trainable": ["norms", "mlp"]},
        "method": "full",
        "attention": "mem-efficient",
        "sequence_length": 64,
        "checkpoint_every_k": 2,
        "micro_batch_size": 4,
        "optimizer_impl": "fused",
        "precision": "bf16",
        "frozen_weights_dtype": "fp32",
        "activation_checkpointing": "first-k-layers",
        "stack": "accelerate-loop",
        "lora": {"targets": ["q_proj", "v_proj"], "dropout": 0.05, "rank": 64},
        "parallelism": {
            "zero_stage": 0,
            "expert_capacity_factor": 1.0,
            "framework": "pytorch",
            "cp": 1,
            "ep": 1,
            "pp_split": "even",
            "sequence_parallel": True,
            "pp": 2,
            "tp": 1,
            "pp_schedule": "1f1b",
            "vpp": 1,
        },
        "gradient_accumulation_steps": 3,
    },
    "memfit_scenario": 1,
}


def test_more_checkpointing_keeps_fewer_activations_in_every_stage() -> None:
    """Activations compare stage by stage: the stage with the highest total changes with
    the checkpointing, and the last stage's loss keeps the same activations either way."""
    s = scenario_from_dict(MOVING_PEAK)
    check_checkpointing(s, estimate(s))
    est = estimate(s)
    assert [g.group for g in est.rank_groups] == ["pp stage 0", "pp stage 1"]
    assert _peak_activations(est) >= max(p.activations for p in est.timeline)


#: fresh draws of benchmarks/properties.py (seeds 2587475427 and 476021064): a 32B model
#: training its LM head alone on one GPU, compiled, with a loss over chunks of the output
HEAD_ALONE = {
    "model": {"preset": "qwen3-32b"},
    "hardware": {"gpu": "rtx-3090", "gpus_per_node": 1, "nodes": 1},
    "training": {
        "method": "freeze",
        "freeze": {"trainable": ["lm_head"]},
        "stack": "trl-sft",
        "loss": "chunked-output",
        "sequence_length": 512,
        "micro_batch_size": 8,
        "gradient_accumulation_steps": 3,
        "attention": "mem-efficient",
        "torch_compile": True,
        "precision": "bf16-mixed",
        "optimizer": "sgd",
        "activation_checkpointing": "selective",
    },
    "memfit_scenario": 1,
}


def test_zero3_adds_the_root_units_gradients_at_most() -> None:
    """At the head's backward, ZeRO-3 (FSDP, bf16 parameters) sums the head's gradient
    over the loss's chunks out of place in bf16, where ZeRO-1 under autocast sums it into
    the cast copy's gradient and then into the fp32 ``.grad``: ZeRO-3's activations there
    are higher by more than what it keeps gathered, and by less than the root unit's
    gradients, which the sharding invariant's bound counts."""
    peaks = {}
    for zero in (1, 3):
        s = scenario_from_dict({**HEAD_ALONE, "training": {**HEAD_ALONE["training"],
                                "parallelism": {"zero_stage": zero}}})  # fmt: skip
        peaks[zero] = estimate(s)
    over = peaks[3].allocated_bytes - peaks[1].allocated_bytes
    head = 151936 * 5120  # the LM head's elements, the root unit's only trained tensor
    assert over > gathered_bound(s) - 4 * head  # beyond the gathered units alone
    assert over <= gathered_bound(s)
    check_sharding_at_peak(s)
