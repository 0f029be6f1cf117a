"""The registry of changes (engine.changes): each change's one rule, and the what-ifs,
make-it-fit, explain's remedies and the sweep reading it, where their own copies of the
rules used to disagree."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from memfit.engine import changes, solve, sweep, whatif
from memfit.engine.changes import BY_ID, CHANGES, NotApplicable
from memfit.engine.estimate import estimate
from memfit.engine.explain import REMEDIES, REMEDY_IDS, explained
from memfit.engine.specs import Scenario
from tests.engine.helpers import preset_scenario


def small(gpus: int = 1, model: str = "llama-3.2-1b", **training: Any) -> Scenario:
    """A small model on H100s: the rules need no estimate, the end-to-end tests a fast one."""
    base = {"micro_batch_size": 2, "sequence_length": 1024}
    return preset_scenario(model, "h100-sxm-80gb", {**base, **training}, gpus_per_node=gpus)


def test_the_ids_are_stable_and_in_the_order_changes_are_made() -> None:
    assert [c.id for c in CHANGES] == [
        "qlora",
        "lora",
        "mixed-precision",
        "pure-bf16",
        "flash-attention",
        "torch-compile",
        "chunked-loss",
        "release-outputs",
        "no-kv-cache",
        "release-previous-step",
        "gradient-bucket-view",
        "fused-optimizer",
        "8bit-optimizer",
        "selective-checkpointing",
        "checkpointing",
        "offload-activations",
        "half-micro-batch",
        "micro-batch-1",
        "zero1",
        "zero2",
        "zero3",
        "cpu-offload",
        "offload-parameters",
        "tp-x2",
        "pp-x2",
        "cp-x2",
        "ep-x2",
        "more-gpus",
        "half-sequence",
    ]
    assert len({c.label for c in CHANGES}) == len(CHANGES)
    assert all(c.compute_reason and c.key == c.id for c in CHANGES)


def test_which_changes_alter_the_numerics() -> None:
    altering = {c.id for c in CHANGES if c.alters_numerics}
    assert altering == {
        "qlora", "lora", "pure-bf16", "chunked-loss", "8bit-optimizer", "half-sequence"
    }  # fmt: skip
    # mixed precision keeps fp32 master weights and states; sharding, offload,
    # recomputation and kernels compute the same numbers elsewhere or again
    assert not BY_ID["mixed-precision"].alters_numerics
    assert all(not BY_ID[i].alters_numerics for i in ("zero3", "cpu-offload", "checkpointing"))


#: (change, scenario's training, GPUs, the field it sets and to what -- or None where it
#: does not apply -- a word of the reason it gives then, and the model where it is not
#: Llama 3.2 1B)
RULES: list[tuple[Any, ...]] = [
    ("qlora", {}, 1, ("method", "qlora"), ""),
    ("qlora", {"method": "qlora"}, 1, None, "already trains QLoRA"),
    ("lora", {"method": "qlora"}, 1, ("method", "lora"), ""),
    ("lora", {"method": "lora"}, 1, None, "already trains LoRA"),
    ("mixed-precision", {"precision": "fp32"}, 1, ("precision", "bf16-mixed"), ""),
    ("mixed-precision", {"precision": "fp16-mixed"}, 1, None, "16 bits or fewer"),
    ("pure-bf16", {}, 1, ("precision", "bf16"), ""),
    ("pure-bf16", {"precision": "bf16"}, 1, None, "already bf16"),
    ("flash-attention", {"attention": "eager"}, 1, ("attention", "flash"), ""),
    ("flash-attention", {"attention": "mem-efficient"}, 1, ("attention", "flash"), ""),
    ("flash-attention", {}, 1, None, "SDPA already runs the flash kernel"),
    ("flash-attention", {"attention": "flash"}, 1, None, "already uses flash"),
    ("flash-attention", {"precision": "fp32", "attention": "eager"}, 1, None, "16-bit"),
    ("chunked-loss", {}, 1, ("loss", "chunked"), ""),
    ("chunked-loss", {"loss": "chunked"}, 1, None, "already chunked"),
    (
        "release-outputs",
        {"stack": "accelerate-loop"},
        1,
        ("outputs_held_through_backward", False),
        "",
    ),
    ("release-outputs", {}, 1, None, "already releases"),
    ("no-kv-cache", {"stack": "accelerate-loop"}, 1, ("kv_cache_in_outputs", False), ""),
    (
        "no-kv-cache",
        {"stack": "accelerate-loop", "activation_checkpointing": "full"},
        1,
        None,
        "no KV cache",
    ),
    ("release-previous-step", {"stack": "accelerate-loop"}, 1, ("previous_step_held", False), ""),
    ("release-previous-step", {}, 1, None, "already frees"),
    ("gradient-bucket-view", {}, 4, ("gradient_as_bucket_view", True), ""),
    ("gradient-bucket-view", {}, 1, None, "one replica"),
    ("gradient-bucket-view", {"parallelism": {"zero_stage": 2}}, 4, None, "reduce-scatters"),
    ("gradient-bucket-view", {"parallelism": {"framework": "deepspeed"}}, 4, None, "own buffers"),
    ("gradient-bucket-view", {"gradient_as_bucket_view": True}, 4, None, "already views"),
    ("fused-optimizer", {}, 1, ("optimizer_impl", "fused"), ""),
    ("fused-optimizer", {"optimizer_impl": "fused"}, 1, None, "already fused"),
    ("8bit-optimizer", {}, 1, ("optimizer", "adamw-8bit"), ""),
    ("8bit-optimizer", {"optimizer": "sgd"}, 1, None, "needs AdamW"),
    ("selective-checkpointing", {"stack": "custom"}, 1,
     ("activation_checkpointing", "selective"), ""),
    ("selective-checkpointing", {}, 1, None, "Hugging Face Trainer cannot run selective"),
    ("selective-checkpointing", {"activation_checkpointing": "selective"}, 1, None, "already"),
    (
        "checkpointing",
        {"activation_checkpointing": "selective"},
        1,
        ("activation_checkpointing", "full"),
        "",
    ),
    ("checkpointing", {"activation_checkpointing": "full"}, 1, None, "every layer"),
    ("offload-activations", {"activation_checkpointing": "full", "stack": "custom"}, 1,
     ("offload", "cpu"), ""),
    ("offload-activations", {"activation_checkpointing": "full"}, 1, None, "activation offload"),
    ("offload-activations", {}, 1, None, "checkpoints no layer"),
    ("offload-activations", {"activation_checkpointing": "selective"}, 1, None, "selectively"),
    ("half-micro-batch", {"micro_batch_size": 4}, 1, ("micro_batch_size", 2), ""),
    ("half-micro-batch", {"micro_batch_size": 3}, 1, None, "does not halve"),
    ("micro-batch-1", {"micro_batch_size": 4}, 1, ("micro_batch_size", 1), ""),
    ("micro-batch-1", {"micro_batch_size": 2}, 1, None, "under 4"),
    ("zero1", {}, 8, ("parallelism", 1), ""),
    ("zero1", {}, 1, None, "one GPU"),
    ("zero2", {"parallelism": {"zero_stage": 1}}, 8, ("parallelism", 2), ""),
    ("zero2", {"parallelism": {"zero_stage": 2}}, 8, None, "already uses ZeRO-2"),
    ("zero3", {}, 8, ("parallelism", 3), ""),
    ("zero3", {"parallelism": {"tp": 8}}, 8, None, "shard group is one GPU"),
    ("zero3", {"parallelism": {"zero_stage": 3}}, 8, None, "already uses ZeRO-3"),
    ("cpu-offload", {}, 1, ("offload", "cpu"), ""),
    (
        "cpu-offload",
        {"offload": {"optimizer": "cpu"}, "parallelism": {"zero_stage": 1}},
        1,
        None,
        "already offloaded",
    ),
    ("offload-parameters", {}, 8, ("offload_parameters", "cpu"), ""),
    ("offload-parameters", {"offload": {"parameters": "cpu"}, "parallelism": {"zero_stage": 3}},
     8, None, "already offloaded"),
    ("tp-x2", {}, 8, ("tp", 2), ""),
    ("tp-x2", {}, 1, None, "one GPU"),
    ("tp-x2", {"parallelism": {"tp": 8}}, 8, None, "invalid"),  # 16 of 8 GPUs
    ("torch-compile", {}, 1, ("torch_compile", True), ""),
    ("torch-compile", {"torch_compile": True}, 1, None, "compiled already"),
    ("torch-compile", {"stack": "megatron", "parallelism": {"framework": "megatron"}}, 1, None,
     "Megatron-LM / NeMo cannot run torch.compile"),
    ("pp-x2", {"stack": "custom"}, 8, ("pp", 2), ""),
    ("pp-x2", {}, 8, None, "Hugging Face Trainer cannot run pipeline parallelism"),
    ("pp-x2", {"parallelism": {"pp": 8}}, 8, None, "invalid"),
    ("cp-x2", {}, 8, ("cp", 2), ""),
    ("cp-x2", {}, 1, None, "one GPU"),
    ("ep-x2", {"stack": "custom"}, 8, ("ep", 2), "", "qwen3-30b-a3b"),
    ("ep-x2", {}, 8, None, "invalid"),  # a dense model has no experts to spread
    ("more-gpus", {"gradient_accumulation_steps": 4}, 8, ("gpus", 16), ""),
    ("more-gpus", {}, 1, ("gpus", 2), ""),
    ("half-sequence", {}, 1, ("sequence_length", 512), ""),
    ("half-sequence", {"sequence_length": 1001}, 1, None, "does not halve"),
]  # fmt: skip


def _field(s: Scenario, field: str) -> object:
    t = s.training
    if field == "parallelism":
        return t.parallelism.zero_stage
    if field in ("tp", "pp", "cp", "ep"):
        return getattr(t.parallelism, field)
    if field == "offload_parameters":
        return t.offload.parameters
    if field == "gpus":
        return s.hardware.world_size
    if field == "offload":
        return "cpu" if "cpu" in (t.offload.optimizer, t.offload.activations) else "none"
    return getattr(t, field)


@pytest.mark.parametrize(("id", "training", "gpus", "sets", "why", "model"),
                         [(*r, "llama-3.2-1b")[:6] for r in RULES])  # fmt: skip
def test_each_change_has_one_rule(
    id: str,
    training: dict[str, Any],
    gpus: int,
    sets: tuple[str, object] | None,
    why: str,
    model: str,
) -> None:
    change = BY_ID[id]
    s = small(gpus, model, **training)
    if sets is None:
        reason = change.why_not(s)
        assert reason is not None and why in reason
        assert not change.applies(s) and change.attempt(s) == reason
        with pytest.raises(NotApplicable, match=why):
            change.apply(s)
        return
    assert change.why_not(s) is None and change.applies(s)
    field, value = sets
    changed = change.apply(s)
    assert _field(changed, field) == value and _field(s, field) != value
    assert changed.model == s.model
    assert (changed.hardware == s.hardware) == (id != "more-gpus")
    if change.sets:
        assert all(getattr(changed.training, k) == v for k, v in change.sets)


def test_every_change_is_covered_by_the_rules_above() -> None:
    applied = {r[0] for r in RULES if r[3] is not None}
    refused = {r[0] for r in RULES if r[3] is None} | {"more-gpus"}  # the test below
    assert applied == refused == set(BY_ID)


def test_more_gpus_keeps_the_node_and_the_global_batch_or_says_why_not() -> None:
    """Twice the GPUs fills a node up to 8 first, then doubles the nodes; the accumulation
    halves where it can, so the global batch stays; past the hardware's bounds the change
    does not apply, and says which field."""
    s = small(4, gradient_accumulation_steps=4)
    more = BY_ID["more-gpus"].apply(s)
    assert (more.hardware.gpus_per_node, more.hardware.nodes) == (8, 1)
    assert more.training.gradient_accumulation_steps == 2
    again = BY_ID["more-gpus"].apply(more)
    assert (again.hardware.gpus_per_node, again.hardware.nodes) == (8, 2)
    odd = BY_ID["more-gpus"].apply(small(8, gradient_accumulation_steps=3))
    assert odd.training.gradient_accumulation_steps == 3  # the global batch doubles
    full = dataclasses.replace(s, hardware=dataclasses.replace(s.hardware, gpus_per_node=8,
                                                               nodes=100_000))  # fmt: skip
    reason = BY_ID["more-gpus"].why_not(full)
    assert reason is not None and "hardware.nodes" in reason


def test_the_micro_batch_changes_keep_the_global_batch() -> None:
    s = small(micro_batch_size=8, gradient_accumulation_steps=3)
    for id in ("half-micro-batch", "micro-batch-1"):
        t = BY_ID[id].apply(s).training
        assert t.micro_batch_size * t.gradient_accumulation_steps == 24


def test_cpu_offload_runs_on_zero_partitions() -> None:
    changed = BY_ID["cpu-offload"].apply(small(1))
    assert changed.training.parallelism.zero_stage == 1
    assert changed.training.offload.optimizer == "cpu"
    assert changes.zero_refusal(changed) is None  # ZeRO-1 shards nothing, but carries it
    one_gpu = changes.zero_refusal(BY_ID["zero1"].make(small(1)))
    assert one_gpu == "one GPU: there is nothing to shard"


def test_changes_that_set_the_same_thing_replace_each_other() -> None:
    assert not changes.compatible(["lora", "qlora"])
    assert not changes.compatible(["zero1", "zero3", "checkpointing"])
    assert changes.compatible(["zero3", "cpu-offload", "checkpointing", "mixed-precision"])
    assert changes.clash(["qlora", "checkpointing"], "lora") == "qlora"
    assert changes.clash(["qlora"], "checkpointing") is None


def test_changes_made_in_turn_replay_as_one_change() -> None:
    s = small(precision="fp32", attention="eager")
    both = changes.in_turn("x", "X", ["mixed-precision", "flash-attention"])
    made = both.apply(s)
    assert (made.training.precision, made.training.attention) == ("bf16-mixed", "flash")
    assert both == changes.in_turn("x", "X", ["mixed-precision", "flash-attention"])
    # flash alone does not apply to fp32 compute: in the other order, the first refuses
    other = changes.in_turn("y", "Y", ["flash-attention", "mixed-precision"])
    reason = other.why_not(s)
    assert reason is not None and reason.startswith("Flash attention: ")


# --- the old disagreements, one test each -------------------------------------------------


def test_zero_where_the_shard_group_is_one_gpu_is_refused_by_every_consumer() -> None:
    """The sweep kept a ZeRO stage wherever the data-parallel size was over 1, and skipped
    it where it was 1; what-if and make-it-fit asked nothing_to_shard, whose shard group is
    dp x cp. Now all three ask it: context parallelism that takes every GPU still shards
    over its ranks, tensor parallelism that takes them all shards nothing."""
    all_cp = small(2, sequence_length=8192, parallelism={"cp": 2}, attention="flash")
    all_tp = small(8, parallelism={"tp": 8})
    for s, shards in ((all_cp, True), (all_tp, False)):
        assert whatif.WHATIFS_BY_KEY["zero3"].applies(s) == shards
        assert all(solve.CHANGES_BY_KEY[f"zero{k}"].applies(s) == shards for k in (1, 2, 3))
        space = sweep.Space(zero_stages=(0, 1, 2, 3), offload=("none",))
        stages = {b.training.parallelism.zero_stage for b, _ in sweep.strategies(s, space)}
        assert stages == ({0, 1, 2, 3} if shards else {0})


def test_cpu_offload_on_one_gpu_is_offered_by_every_consumer() -> None:
    """What-if and make-it-fit offered the CPU offload on one GPU (ZeRO-Offload's own
    case); the sweep never did (no ZeRO stage on one GPU, and no offload without one). Its
    configuration is now on the sweep's axes, the one the change makes."""
    s = small(1)
    offload = whatif.WHATIFS_BY_KEY["cpu-offload"]
    assert offload.applies(s) and solve.CHANGES_BY_KEY["cpu-offload"].applies(s)
    swept = [b for b, _ in sweep.strategies(s, sweep.default_space(s))]
    offloaded = [b for b in swept if b.training.offload.optimizer == "cpu"]
    assert offloaded and {b.training.parallelism.zero_stage for b in offloaded} == {1}
    assert offload.apply(s) in list(sweep.configs(s))
    # no other stage on one GPU: ZeRO-2 and -3 shard nothing more
    assert {b.training.parallelism.zero_stage for b in swept} == {0, 1}


def test_flash_attention_sets_the_flash_kernel_in_every_consumer() -> None:
    """Make-it-fit set SDPA (refusing a scenario already on SDPA), the what-if set flash.
    On a model whose SDPA call falls back to the math kernel, SDPA is not flash: both
    refused it there, and the change saves the scores' memory."""
    eager = small(attention="eager")
    fixes = solve.make_it_fit(eager, top=50, max_changes=1)
    fix = next(f for f in fixes if f.changes == ("flash-attention",))
    assert fix.scenario.training.attention == "flash"
    assert fix.scenario == whatif.WHATIFS_BY_KEY["flash-attention"].apply(eager)
    math = dataclasses.replace(small(), model=dataclasses.replace(small().model, sdpa_math=True))
    result = whatif.assess(math, estimate(math), "flash-attention")
    assert isinstance(result, whatif.WhatIfResult) and result.saved_bytes > 0
    assert solve.combine(math, ["flash-attention"]) == result.scenario


def test_a_change_the_specs_reject_is_refused_with_why_not_raised() -> None:
    """Mixed precision on an fp32 scenario with an fp16 frozen base makes training the
    specs reject: the what-if said so, but make-it-fit and combined raised."""
    s = small(method="lora", precision="fp32", frozen_weights_dtype="fp16", micro_batch_size=64)
    reason = BY_ID["mixed-precision"].why_not(s)
    assert reason is not None and reason.startswith("the changed scenario is invalid")
    assert solve.combine(s, ["mixed-precision"]) is None
    assert all("mixed-precision" not in f.changes for f in solve.make_it_fit(s, max_changes=2))
    result = whatif.combined(s, estimate(s), ["mixed-precision", "checkpointing"])
    assert isinstance(result, whatif.WhatIfResult)
    assert result.applied == ("checkpointing",) and result.skipped[0][0] == "mixed-precision"


def test_one_label_per_change_in_every_consumer() -> None:
    """Make-it-fit and explain labelled their changes their own way ('full
    checkpointing', 'a chunked loss (...)'); all now show the registry's label."""
    s = small(micro_batch_size=16, sequence_length=4096)
    for w in whatif.WHATIFS:
        assert w is BY_ID[w.id]
    for c in solve.CHANGES:
        assert c is BY_ID[c.id]
    for fix in solve.make_it_fit(s, top=50):
        assert fix.labels == tuple(BY_ID[k].label for k in fix.changes)
    groups = explained(estimate(s))
    for g in groups:
        if g.remedy is not None:
            assert g.remedy.label == BY_ID[REMEDY_IDS[g.kind]].label
    assert all(REMEDIES[k] is BY_ID[i] for k, i in REMEDY_IDS.items())


def test_what_if_and_make_it_fit_make_changes_in_one_order() -> None:
    """The what-ifs combined in their own order, make-it-fit in another (release-outputs
    after checkpointing in one, before it in the other); both now use the registry's."""
    s = small(2, stack="accelerate-loop")
    keys = ["zero3", "checkpointing", "release-outputs", "8bit-optimizer", "fused-optimizer"]
    result = whatif.combined(s, estimate(s), keys)
    assert isinstance(result, whatif.WhatIfResult)
    assert result.applied == changes.in_order(keys)
    assert changes.in_order(w.id for w in whatif.WHATIFS) == whatif.COMBINE_ORDER
    assert tuple(c.id for c in solve.CHANGES) == changes.in_order(c.id for c in solve.CHANGES)
    assert solve.combine(s, changes.in_order(keys)) == result.scenario


# --- what-if and make-it-fit offer the same changes where both offer one ------------------

SHARED = sorted(set(whatif.WHATIFS_BY_KEY) & set(solve.CHANGES_BY_KEY))

#: scenarios that fit with room to spare, so every change that applies fits too
ROOMY = {
    "one GPU": small(1, model="gpt2"),
    "fp32 eager": small(1, model="gpt2", precision="fp32", attention="eager"),
    "a loop that holds": small(1, model="gpt2", stack="accelerate-loop", micro_batch_size=4),
    "lightning": small(1, model="gpt2", stack="lightning", method="lora"),
    "eight GPUs": small(8, model="gpt2"),
    "tp takes all": small(4, model="gpt2", parallelism={"tp": 4}),
    "cp takes all": small(2, model="gpt2", sequence_length=1024, parallelism={"cp": 2}),
    "done already": small(
        2,
        model="gpt2",
        activation_checkpointing="full",
        optimizer_impl="fused",
        optimizer="adamw-8bit",
        attention="flash",
        offload={"optimizer": "cpu"},
        parallelism={"zero_stage": 3},
    ),
}


@pytest.mark.parametrize("name", list(ROOMY))
def test_what_if_and_make_it_fit_offer_the_same_changes(name: str) -> None:
    s = ROOMY[name]
    current = estimate(s)
    assert current.device_bytes < current.budget_bytes / 2
    offered = {k for k in SHARED if isinstance(whatif.assess(s, current, k), whatif.WhatIfResult)}
    fixes = solve.make_it_fit(s, top=100, max_changes=1)
    fitting = {f.changes[0] for f in fixes} & set(SHARED)
    assert fitting == offered
    for k in SHARED:
        assert whatif.WHATIFS_BY_KEY[k].applies(s) == (solve.combine(s, [k]) is not None)


def test_the_sweep_axes_take_the_values_the_changes_set() -> None:
    space = sweep.default_space(small(precision="fp32"))
    assert space.precisions == ("fp32", "bf16-mixed", "bf16")
    assert space.checkpointing == ("none", "selective", "full")
    assert space.optimizers == ("adamw", "adamw-8bit")
    assert sweep.default_space(small(optimizer="sgd")).optimizers == ("sgd",)


def test_flash_attention_is_offered_where_the_stack_runs_sdpas_math_fallback() -> None:
    """Falcon 7B as transformers builds it runs SDPA's math fallback (the preset says so,
    as its config does): flash attention applies; as LitGPT builds it (keys and values
    repeated, a fused kernel) SDPA already runs flash."""
    from tests.engine.helpers import preset_scenario

    flash = BY_ID["flash-attention"]
    hf = preset_scenario("falcon-7b", "h100-sxm-80gb", {})
    assert hf.model.sdpa_math and flash.applies(hf)
    litgpt = preset_scenario("falcon-7b", "h100-sxm-80gb", {"model_implementation": "litgpt"})
    assert not flash.applies(litgpt)
