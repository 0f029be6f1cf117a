"""Several what-ifs made together (engine.whatif.combined): one key is that key alone;
independent keys give, to the byte, the scenario changed by hand; conflicts and changes
that no longer apply are skipped and named."""

from __future__ import annotations

import dataclasses

import pytest

from memfit.engine.estimate import estimate
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.engine.steptime import step_time
from memfit.engine.whatif import (
    COMBINE_ORDER,
    COMBINED_KEY,
    WHATIFS,
    WHATIFS_BY_KEY,
    WhatIfResult,
    assess,
    combined,
)


def scenario(gpus: int = 1, **training: object) -> Scenario:
    return Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=gpus),
        TrainingSpec(**training),  # type: ignore[arg-type]
    )


FULL_FP32 = scenario(gpus=8, method="full", precision="fp32", attention="eager", micro_batch_size=2)


def test_every_whatif_has_a_place_in_the_order() -> None:
    assert sorted(COMBINE_ORDER) == sorted(w.key for w in WHATIFS)


@pytest.mark.parametrize("key", [w.key for w in WHATIFS])
def test_one_key_is_that_key_alone(key: str) -> None:
    current = estimate(FULL_FP32)
    alone = assess(FULL_FP32, current, key)
    together = combined(FULL_FP32, current, [key])
    if isinstance(alone, str):
        assert isinstance(together, str) and alone in together
        return
    assert together == alone
    assert isinstance(together, WhatIfResult) and together.applied == (key,)
    assert together.skipped == ()


def test_two_independent_keys_equal_the_hand_made_scenario_to_the_byte() -> None:
    base = scenario(method="full", micro_batch_size=4, sequence_length=4096)
    current = estimate(base)
    result = combined(base, current, ["8bit-optimizer", "checkpointing"])
    assert isinstance(result, WhatIfResult)
    by_hand = dataclasses.replace(
        base,
        training=dataclasses.replace(
            base.training, optimizer="adamw-8bit", activation_checkpointing="full"
        ),
    )
    expected = estimate(by_hand)
    assert result.scenario == by_hand
    assert result.estimate == expected
    assert result.estimate.device_bytes == expected.device_bytes
    assert result.estimate.breakdown == expected.breakdown
    assert result.saved_bytes == current.device_bytes - expected.device_bytes
    assert isinstance(result.saved_bytes, int)
    factor = step_time(by_hand).step_time_s / step_time(base).step_time_s
    assert result.compute_factor == pytest.approx(factor)
    assert result.applied == ("8bit-optimizer", "checkpointing")  # the combine order
    assert result.skipped == ()
    assert result.whatif.key == COMBINED_KEY
    assert result.whatif.label == "Combined: 8-bit AdamW + Gradient checkpointing"
    # together they save more than either alone
    for key in ("8bit-optimizer", "checkpointing"):
        alone = assess(base, current, key)
        assert isinstance(alone, WhatIfResult)
        assert result.saved_bytes > alone.saved_bytes
    # the combined change replays on the scenario it came from
    assert result.whatif.apply(base) == by_hand


def test_the_order_of_the_keys_asked_for_does_not_matter() -> None:
    current = estimate(FULL_FP32)
    keys = ["checkpointing", "zero3", "mixed-precision", "8bit-optimizer"]
    first = combined(FULL_FP32, current, keys)
    second = combined(FULL_FP32, current, list(reversed(keys)))
    assert isinstance(first, WhatIfResult) and isinstance(second, WhatIfResult)
    assert first.scenario == second.scenario
    assert first.estimate.device_bytes == second.estimate.device_bytes
    t = first.scenario.training
    assert (t.precision, t.optimizer, t.activation_checkpointing) == (
        "bf16-mixed",
        "adamw-8bit",
        "full",
    )
    assert t.parallelism.zero_stage == 3


def test_lora_and_qlora_conflict_and_the_first_in_order_wins() -> None:
    base = scenario(method="full")
    result = combined(base, estimate(base), ["lora", "qlora", "checkpointing"])
    assert isinstance(result, WhatIfResult)
    assert result.scenario.training.method == "qlora"
    assert result.applied == ("qlora", "checkpointing")
    assert result.skipped == (
        ("lora", "conflicts with QLoRA (4-bit base): both set the training method"),
    )


def test_a_change_another_makes_possible_is_made_after_it() -> None:
    """Flash attention does not apply to fp32 compute alone; after mixed precision (first
    in the order) it does, on an eager scenario."""
    current = estimate(FULL_FP32)
    assert isinstance(assess(FULL_FP32, current, "flash-attention"), str)  # fp32: not alone
    result = combined(FULL_FP32, current, ["flash-attention", "mixed-precision"])
    assert isinstance(result, WhatIfResult)
    assert result.applied == ("mixed-precision", "flash-attention")
    assert result.scenario.training.attention == "flash"
    assert result.skipped == ()


def test_a_change_that_does_not_apply_with_the_others_is_skipped_with_why() -> None:
    """Under SDPA, 16-bit compute already runs the flash kernel: after mixed precision,
    flash attention has nothing to change."""
    sdpa = dataclasses.replace(
        FULL_FP32, training=dataclasses.replace(FULL_FP32.training, attention="sdpa")
    )
    result = combined(sdpa, estimate(sdpa), ["flash-attention", "mixed-precision"])
    assert isinstance(result, WhatIfResult)
    assert result.applied == ("mixed-precision",)
    assert result.skipped == (
        ("flash-attention", "SDPA already runs the flash kernel for 16-bit compute"),
    )


def test_a_change_that_never_applied_keeps_its_own_reason() -> None:
    one_gpu = scenario(method="full")
    result = combined(one_gpu, estimate(one_gpu), ["zero3", "checkpointing"])
    assert isinstance(result, WhatIfResult)
    assert result.applied == ("checkpointing",)
    assert result.skipped == (("zero3", "one GPU: there is nothing to shard"),)


def test_nothing_applicable_gives_the_reasons() -> None:
    one_gpu = scenario(
        method="full", parallelism=ParallelismSpec(zero_stage=0), activation_checkpointing="full"
    )
    text = combined(one_gpu, estimate(one_gpu), ["zero3", "checkpointing"])
    assert isinstance(text, str)
    assert "ZeRO-3 / FSDP: one GPU" in text
    assert "Gradient checkpointing: the scenario already checkpoints" in text
    assert combined(one_gpu, estimate(one_gpu), []) == "no change asked for"


def test_an_unknown_key_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown what-if: 'bogus'"):
        combined(FULL_FP32, estimate(FULL_FP32), ["checkpointing", "bogus"])


def test_all_offered_changes_together_are_one_valid_scenario() -> None:
    """Every change offered alone, made together: each is made or skipped with a reason,
    and the estimate is that of the scenario reached."""
    current = estimate(FULL_FP32)
    offered = [
        w.key for w in WHATIFS if isinstance(assess(FULL_FP32, current, w.key), WhatIfResult)
    ]
    result = combined(FULL_FP32, current, offered)
    assert isinstance(result, WhatIfResult)
    assert set(result.applied) | {k for k, _ in result.skipped} == set(offered)
    assert all(why for _key, why in result.skipped)
    assert result.estimate == estimate(result.scenario)
    assert WHATIFS_BY_KEY[result.applied[0]].label in result.whatif.label


def test_a_change_the_engine_rejects_with_the_others_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import memfit.engine.whatif as whatif
    from memfit.engine.errors import EstimateError

    base = scenario(method="full")
    current = estimate(base)

    def picky(s: Scenario) -> object:
        t = s.training
        if t.optimizer == "adamw-8bit" and t.activation_checkpointing == "full":
            raise EstimateError("training.optimizer", "not with checkpointing (a test's rule)")
        return estimate(s)

    monkeypatch.setattr(whatif, "estimate", picky)
    result = combined(base, current, ["8bit-optimizer", "checkpointing"])
    assert isinstance(result, WhatIfResult)
    assert result.applied == ("8bit-optimizer",)
    ((key, why),) = result.skipped
    assert key == "checkpointing"
    assert why.startswith("the engine rejects it with the others: ")
    assert "a test's rule" in why
