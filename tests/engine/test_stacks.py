"""Training stacks: the data files, how conventions resolve, and what they change."""

from __future__ import annotations

import dataclasses
import json

import pytest

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.locate import resources as resources_dir
from memfit.engine.model_state import model_state
from memfit.engine.scenario_io import scenario_from_dict, scenario_to_dict
from memfit.engine.specs import STACKS, LoraSpec, Scenario
from memfit.engine.stacks import (
    CONVENTION_FIELDS,
    CONVENTIONS,
    REQUIRED,
    Conventions,
    _parse,
    conventions,
    load_stack,
    stacks,
    with_stack,
)


def scenario(**training: object) -> dict[str, object]:
    return {
        "memfit_scenario": 1,
        "model": {"preset": "llama-3.2-1b"},
        "hardware": {"gpu": "h100-sxm-80gb"},
        "training": {"micro_batch_size": 2, "sequence_length": 1024, **training},
    }


def test_every_stack_has_a_file_with_every_convention_and_its_source() -> None:
    folder = resources_dir() / "stacks"
    files = sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )
    assert files == sorted(STACKS)
    required = {f.key for f in CONVENTION_FIELDS if f.default is REQUIRED}
    for stack in stacks():
        assert required <= set(stack.conventions) <= set(CONVENTIONS)
        assert stack.source and stack.label and stack.description
        assert "loss" in stack.defaults
        assert set(stack.why) == set(stack.conventions), stack.name


def test_every_convention_is_a_scenario_field_a_resolved_value_and_a_stack_value() -> None:
    """What a new convention needs is its entry in CONVENTION_FIELDS, its attribute of
    Conventions and its scenario field: the resolution, the stack files and the app's row
    come from the entry."""
    training = scenario_from_dict(scenario()).training
    attributes = {f.name for f in dataclasses.fields(Conventions)}
    for f in CONVENTION_FIELDS:
        for stack in stacks():
            assert stack.convention(f.key, "bf16-mixed") in f.values, (stack.name, f.key)
        if not f.attr:
            continue
        assert f.attr in attributes
        value: object = training
        for part in f.key.split("."):
            value = getattr(value, part)
        assert value is None, f.key  # a scenario field, None: the stack's
        assert f.label and f.tip, f.key
    with pytest.raises(EstimateError, match="conventions"):
        _parse("custom", {**json.loads((resources_dir() / "stacks" / "custom.json").read_text()),
                          "conventions": {"outputs_held_through_backward": True}})  # fmt: skip


def test_an_old_file_is_the_trainer_and_an_explicit_field_overrides_the_stack() -> None:
    old = scenario_from_dict(scenario())
    assert old.training.stack == "hf-trainer"
    conv = conventions(old.training)
    assert not conv.outputs_held and all(c.origin == "stack" for c in conv.used)
    held = scenario_from_dict(scenario(outputs_held_through_backward=True))
    conv = conventions(held.training)
    assert conv.outputs_held
    assert [c.origin for c in conv.used if c.field == "outputs_held_through_backward"] == [
        "scenario"
    ]


def test_a_stack_named_in_a_file_brings_its_defaults_unless_the_file_gives_them() -> None:
    tune = scenario_from_dict(scenario(stack="torchtune"))
    assert (tune.training.loss, tune.training.optimizer_impl) == ("chunked-output", "fused")
    mine = scenario_from_dict(scenario(stack="torchtune", loss="standard"))
    assert mine.training.loss == "standard"
    moved = with_stack(mine.training, "lightning")
    assert (moved.stack, moved.loss) == ("lightning", "no-upcast")


def test_conventions_round_trip_through_a_scenario_file() -> None:
    data = scenario(
        stack="lightning", frozen_weights_dtype="bf16", method="lora",
        lora={"adapter_dtype": "fp32"},
    )  # fmt: skip
    first = scenario_from_dict(data)
    again = scenario_from_dict(json.loads(json.dumps(scenario_to_dict(first))))
    assert again == first
    qlora = scenario(
        stack="lightning", method="qlora", precision="bf16", model_implementation="transformers",
        previous_step_held=False, qlora={"quantize_lm_head": False, "dequant_dtype": "bf16"},
    )  # fmt: skip
    first = scenario_from_dict(qlora)
    saved = scenario_to_dict(first)
    assert saved["training"]["qlora"]["dequant_dtype"] == "bf16"
    assert scenario_from_dict(json.loads(json.dumps(saved))) == first
    conv = conventions(first.training)
    assert (conv.implementation, conv.previous_held) == ("transformers", False)
    assert (conv.quantize_head, conv.dequant_dtype) == (False, "bf16")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stack", "keras"),
        ("frozen_weights_dtype", "fp8"),
        ("outputs_held_through_backward", "yes"),
        ("loss", "focal"),
        ("loss_chunks", 0),
        ("model_implementation", "keras"),
        ("previous_step_held", 1),
        ("qlora", {"dequant_dtype": "int8"}),
        ("qlora", {"quantize_lm_head": "yes"}),
        ("gradient_as_bucket_view", "no"),
    ],
)
def test_bad_convention_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(EstimateError) as info:
        scenario_from_dict(scenario(**{field: value}))
    named = f"training.{field}" + (f".{next(iter(value))}" if isinstance(value, dict) else "")
    assert info.value.field == named


def test_a_held_output_costs_its_logits_and_the_kv_cache() -> None:
    released = estimate(scenario_from_dict(scenario(stack="hf-trainer")))
    held = estimate(scenario_from_dict(scenario(stack="accelerate-loop")))
    model = held.scenario.model
    logits = 2 * 1024 * model.vocab_size * 2
    assert held.allocated_bytes - released.allocated_bytes >= logits
    item = [i for i in held.items if i.name.startswith("model output held")]
    assert item and item[0].bytes >= logits


def test_lightning_bf16_mixed_keeps_the_frozen_base_in_fp32() -> None:
    lora = {"method": "lora", "lora": {"rank": 8}}
    trainer = estimate(scenario_from_dict(scenario(**lora)))
    # transformers' model: LitGPT's own would add an untied head (below)
    on_hf = {"model_implementation": "transformers", **lora}
    lightning = estimate(scenario_from_dict(scenario(stack="lightning", **on_hf)))
    frozen = trainer.total_params - trainer.trainable_params
    assert lightning.breakdown["parameters"] - trainer.breakdown["parameters"] == 2 * frozen
    assert lightning.allocated_bytes > trainer.allocated_bytes


def test_peft_adapters_stay_fp32_on_a_pure_bf16_base() -> None:
    lora = {"method": "lora", "precision": "bf16", "lora": {"rank": 8}}
    peft = estimate(scenario_from_dict(scenario(**lora)))
    auto = estimate(
        scenario_from_dict(scenario(**{**lora, "lora": {"rank": 8, "adapter_dtype": "auto"}}))
    )
    # weight, gradient and AdamW's two moments: fp32 (PEFT) or bf16 (the base's dtype)
    assert (peft.bytes_per_trainable_param, auto.bytes_per_trainable_param) == (16.0, 8.0)


def test_the_cuda_runtime_moves_the_device_total_only() -> None:
    lazy = estimate(scenario_from_dict(scenario()))
    data = scenario()
    data["hardware"] = {"gpu": "h100-sxm-80gb", "cuda_runtime": "cuda11-eager"}
    eager = estimate(scenario_from_dict(data))
    assert eager.allocated_bytes == lazy.allocated_bytes
    assert eager.device_bytes - lazy.device_bytes == 800 * 2**20


def test_the_losses_order_as_their_memory_does() -> None:
    peaks = {
        loss: estimate(
            scenario_from_dict(scenario(loss=loss, micro_batch_size=4, sequence_length=4096))
        ).allocated_bytes
        for loss in ("standard", "no-upcast", "chunked-output", "chunked")
    }
    assert peaks["chunked"] < peaks["chunked-output"] < peaks["standard"]
    assert peaks["no-upcast"] < peaks["standard"]


def test_per_op_checkpointing_keeps_more_than_full_and_less_than_none() -> None:
    """torchtitan's 'selective' is its per-op policy: between full checkpointing (only the
    layer inputs) and none; every other matmul output and the attention's are kept."""
    peaks = {
        mode: estimate(
            scenario_from_dict(
                scenario(stack="torchtitan", activation_checkpointing=mode, sequence_length=4096)
            )
        ).allocated_bytes
        for mode in ("none", "full", "selective", "per-op")
    }
    assert peaks["selective"] == peaks["per-op"]
    assert peaks["full"] < peaks["per-op"] < peaks["none"]


def test_the_eager_expert_loop_is_its_own_step() -> None:
    data = scenario(precision="bf16", optimizer="sgd", moe_implementation="eager")
    data["model"] = {"preset": "mixtral-8x7b"}
    eager = estimate(scenario_from_dict(data))
    data["training"]["moe_implementation"] = "grouped"
    grouped = estimate(scenario_from_dict(data))
    assert eager.allocated_bytes != grouped.allocated_bytes
    assert eager.trainable_params == grouped.trainable_params


def test_lora_targets_by_module_name_equal_their_roles() -> None:
    gpt2 = {"preset": "gpt2"}
    by_name, by_role = (
        estimate(
            scenario_from_dict({**scenario(method="lora", lora={"targets": t}), "model": gpt2})
        )
        for t in (["c_attn", "c_fc"], ["q_proj", "up_proj"])
    )
    assert by_name.trainable_params == by_role.trainable_params > 0
    assert dataclasses.replace(LoraSpec(), targets=("query_key_value",)).targets == (
        "query_key_value",
    )
    with pytest.raises(EstimateError):
        LoraSpec(targets=("c_atn",))


def test_every_stack_loads_and_estimates() -> None:
    for name in STACKS:
        assert load_stack(name).name == name
        assert estimate(scenario_from_dict(scenario(stack=name))).allocated_bytes > 0


def test_the_release_outputs_whatif_follows_the_held_convention() -> None:
    from memfit.engine.whatif import WHATIFS_BY_KEY, assess

    release = WHATIFS_BY_KEY["release-outputs"]
    trainer = scenario_from_dict(scenario())
    assert "already releases" in (release.why_not(trainer) or "")
    loop = scenario_from_dict(scenario(stack="accelerate-loop"))
    assert release.why_not(loop) is None
    current = estimate(loop)
    result = assess(loop, current, "release-outputs")
    assert not isinstance(result, str)
    assert result.saved_bytes > 0 and result.compute_factor == 1.0
    changed = release.apply(loop)
    assert not conventions(changed.training).outputs_held
    assert estimate(changed).allocated_bytes < current.allocated_bytes


def test_an_optimizer_in_backward_keeps_no_gradient_buffer() -> None:
    """torchtune's optimizer_in_bwd: each gradient is stepped and freed in backward, so
    the peak loses the full gradient buffer (here the backward's end, with all of them)."""
    base = {"precision": "bf16", "optimizer": "sgd", "sequence_length": 1024, "micro_batch_size": 1}
    data = scenario(**base)
    data["model"] = {"preset": "llama-2-7b"}
    plain = estimate(scenario_from_dict(data))
    data["training"]["optimizer_in_backward"] = True
    inside = estimate(scenario_from_dict(data))
    assert plain.breakdown["gradients"] > 0 and inside.breakdown["gradients"] == 0
    assert inside.allocated_bytes < plain.allocated_bytes
    with pytest.raises(EstimateError) as info:
        scenario_from_dict(scenario(optimizer_in_backward=True, gradient_accumulation_steps=2))
    assert info.value.field == "training.optimizer_in_backward"


def test_first_k_layers_checkpoints_the_first_k_of_a_stage() -> None:
    from memfit.engine.timeline import checkpointed

    t = scenario_from_dict(
        scenario(activation_checkpointing="first-k-layers", checkpoint_every_k=3)
    ).training
    assert checkpointed(t, 8) == [True] * 3 + [False] * 5
    peaks = [
        estimate(
            scenario_from_dict(
                scenario(activation_checkpointing="first-k-layers", checkpoint_every_k=k)
            )
        ).allocated_bytes
        for k in (1, 8, 16)
    ]
    none = estimate(scenario_from_dict(scenario())).allocated_bytes
    assert none >= peaks[0] >= peaks[1] >= peaks[2]


def test_make_it_fit_can_release_held_outputs() -> None:
    from memfit.engine.solve import CHANGES_BY_KEY

    release = CHANGES_BY_KEY["release-outputs"]
    assert not release.applies(scenario_from_dict(scenario()))  # the Trainer releases them
    loop = scenario_from_dict(scenario(stack="accelerate-loop"))
    changed = release.apply(loop)
    assert not conventions(changed.training).outputs_held


def test_no_stack_prepares_a_4_bit_base_for_k_bit_training() -> None:
    # TRL 0.26 and later no longer call prepare_model_for_kbit_training; Axolotl calls it
    # and converts the norms and embeddings back; the Trainer prepares nothing
    for name in ("hf-trainer", "trl-sft", "axolotl"):
        qlora = conventions(scenario_from_dict(scenario(stack=name, method="qlora")).training)
        assert (qlora.prepare_kbit, qlora.frozen_dtype) == (False, "bf16")
    trl = conventions(scenario_from_dict(scenario(stack="trl-sft", method="qlora")).training)
    assert trl.adapter_dtype == "bf16"  # SFTTrainer casts a 4-bit model's adapters to bf16
    trl_lora = conventions(scenario_from_dict(scenario(stack="trl-sft", method="lora")).training)
    assert trl_lora.adapter_dtype == "fp32"


def test_k_bit_preparation_upcasts_the_unquantized_weights_to_fp32() -> None:
    prepared = scenario(method="qlora", qlora={"prepare_kbit": True})
    conv = conventions(scenario_from_dict(prepared).training)
    assert (conv.prepare_kbit, conv.frozen_dtype) == (True, "fp32")
    used = {c.field: c for c in conv.used}
    assert used["qlora.prepare_kbit"].origin == "scenario"
    # the embedding, the norms and the (tied) head: 16-bit before, fp32 after
    plain_s, prepared_s = scenario_from_dict(scenario(method="qlora")), scenario_from_dict(prepared)
    m = plain_s.model
    unquantized = m.vocab_size * m.hidden_size + (2 * m.num_layers + 1) * m.hidden_size

    def params(s: Scenario) -> int:
        return model_state(s.model, s.training).category_bytes("parameters")

    assert params(prepared_s) - params(plain_s) == 2 * unquantized
    # an fp32 residual stream and norms, and the 4-bit linears they feed return fp32
    act = [estimate(s).breakdown["activations"] for s in (plain_s, prepared_s)]
    assert act[1] > act[0]
    # not a QLoRA setting elsewhere: LoRA's frozen base keeps its dtype
    lora = scenario(method="lora", qlora={"prepare_kbit": True})
    assert conventions(scenario_from_dict(lora).training).frozen_dtype == "bf16"


def test_k_bit_preparation_refuses_a_16_bit_frozen_dtype_and_a_non_bool() -> None:
    both = scenario(method="qlora", qlora={"prepare_kbit": True}, frozen_weights_dtype="bf16")
    with pytest.raises(EstimateError) as err:
        estimate(scenario_from_dict(both))
    assert err.value.field == "training.frozen_weights_dtype"
    with pytest.raises(EstimateError) as err:
        scenario_from_dict(scenario(method="qlora", qlora={"prepare_kbit": "yes"}))
    assert err.value.field == "training.qlora.prepare_kbit"


def test_an_older_scenario_file_leaves_k_bit_preparation_to_its_stack() -> None:
    s = scenario_from_dict(scenario(method="qlora", qlora={"double_quant": False}))
    assert s.training.qlora.prepare_kbit is None
    assert scenario_to_dict(s)["training"]["qlora"]["prepare_kbit"] is None


def test_litgpt_builds_a_tied_model_with_a_head_of_its_own() -> None:
    tied = estimate(scenario_from_dict(scenario(method="lora")))
    assert tied.scenario.model.tie_word_embeddings
    litgpt = estimate(scenario_from_dict(scenario(method="lora", stack="lightning")))
    head = tied.scenario.model.vocab_size * tied.scenario.model.hidden_size
    assert litgpt.total_params - tied.total_params == head
    # the scenario the estimate reports is the user's, not the one LitGPT builds
    assert litgpt.scenario.model == tied.scenario.model
    on_hf = scenario(method="lora", stack="lightning", model_implementation="transformers")
    assert estimate(scenario_from_dict(on_hf)).total_params == tied.total_params


def test_lightning_quantizes_the_head_and_dequantizes_through_fp16() -> None:
    qlora = {"method": "qlora", "precision": "bf16", "previous_step_held": False}
    hf = estimate(scenario_from_dict(scenario(model_implementation="litgpt", **qlora)))
    lit = estimate(scenario_from_dict(scenario(stack="lightning", **qlora)))
    model = hf.scenario.model
    head = model.vocab_size * model.hidden_size

    def part(est: object, name: str) -> int:
        return sum(i.bytes for i in est.items if i.name.startswith(name))  # type: ignore[attr-defined]

    # the head leaves the 16-bit frozen weights for the 4-bit ones
    assert part(hf, "frozen weights") - part(lit, "frozen weights") == 2 * head
    assert part(lit, "NF4 base weights") > part(hf, "NF4 base weights")
    conv = conventions(lit.scenario.training)
    assert (conv.quantize_head, conv.dequant_dtype) == (True, "fp16")
    # dequantizing through fp16 costs a second copy of a weight at the moment of the cast:
    # only the copy, never more than the largest weight (the head) twice
    bf16 = scenario(stack="lightning", qlora={"dequant_dtype": "bf16"}, **qlora)
    direct = estimate(scenario_from_dict(bf16))
    assert 0 <= lit.allocated_bytes - direct.allocated_bytes <= 2 * 2 * head


def test_the_previous_step_lives_on_where_the_loop_rebinds_its_variables() -> None:
    qlora = {"method": "qlora", "precision": "bf16", "stack": "lightning"}
    freed = estimate(scenario_from_dict(scenario(previous_step_held=False, **qlora)))
    held = estimate(scenario_from_dict(scenario(**qlora)))
    assert conventions(held.scenario.training).previous_held

    def head_forward(est: object) -> int:
        points = est.steps.points  # type: ignore[attr-defined]
        return next(p.activations for p in points if p.label == "LM head and loss")

    # bitsandbytes' 4-bit matmul keeps its input on its ctx: the inputs of every layer's
    # linears (but the first layer's q/k/v, whose input needs no gradient) and of the
    # head, of the previous step, stay until this step's loss is computed
    model = held.scenario.model
    tokens, h = 2 * 1024, model.hidden_size
    per_layer = 2 * tokens * (3 * h + model.intermediate_size)
    gained = head_forward(held) - head_forward(freed)
    assert gained == model.num_layers * per_layer - 2 * tokens * h + 2 * tokens * h
    assert held.allocated_bytes >= freed.allocated_bytes
    # a 16-bit LoRA keeps nothing on a ctx: the old logits live only through the next
    # forward, under the loss buffers of this step
    lora = {"method": "lora", "precision": "bf16", "stack": "lightning"}
    a = estimate(scenario_from_dict(scenario(previous_step_held=False, **lora)))
    b = estimate(scenario_from_dict(scenario(**lora)))
    assert head_forward(a) == head_forward(b)
    assert a.allocated_bytes == b.allocated_bytes


def test_freeing_the_previous_step_is_offered_where_the_loop_carries_it() -> None:
    from memfit.engine.solve import CHANGES_BY_KEY
    from memfit.engine.whatif import WHATIFS_BY_KEY, assess

    free = WHATIFS_BY_KEY["release-previous-step"]
    trainer = scenario_from_dict(scenario(method="qlora", precision="bf16"))
    assert "already frees" in (free.why_not(trainer) or "")
    assert not CHANGES_BY_KEY["release-previous-step"].applies(trainer)
    lit = scenario_from_dict(scenario(method="qlora", precision="bf16", stack="lightning"))
    assert free.why_not(lit) is None
    result = assess(lit, estimate(lit), "release-previous-step")
    assert not isinstance(result, str)
    assert result.saved_bytes > 0 and result.compute_factor == 1.0
    changed = CHANGES_BY_KEY["release-previous-step"].apply(lit)
    assert not conventions(changed.training).previous_held


def _ddp(**training: object) -> dict[str, object]:
    data = scenario(**{"method": "full", "precision": "bf16-mixed", **training})
    data["hardware"] = {"gpu": "h100-sxm-80gb", "gpus_per_node": 8}
    return data


def test_ddp_keeps_a_second_copy_of_the_gradients_unless_they_are_bucket_views() -> None:
    """PyTorch's DDP copies every gradient into its all-reduce buckets, allocated when the
    module is wrapped and kept for its life; ``gradient_as_bucket_view=True`` makes the
    gradients the buckets' views. One GPU, ZeRO-1 and up, DeepSpeed and Megatron (their
    own buffers) have no DDP buckets."""
    sc = scenario_from_dict(_ddp())
    copied = estimate(sc)
    views = estimate(scenario_from_dict(_ddp(gradient_as_bucket_view=True)))
    grads = model_state(sc.model, sc.training).category_bytes("gradients")
    buckets = [i for i in copied.items if i.name == "DDP gradient buckets"]
    assert len(buckets) == 1 and buckets[0].bytes == grads > 0
    assert not [i for i in views.items if i.name == "DDP gradient buckets"]
    # the buckets exist before the first forward: the whole step carries them
    assert copied.allocated_bytes - views.allocated_bytes == grads
    assert conventions(scenario_from_dict(_ddp()).training).gradient_as_bucket_view is False
    for other in (
        scenario(method="full", precision="bf16-mixed"),  # one GPU
        _ddp(parallelism={"zero_stage": 1}),
        _ddp(parallelism={"framework": "deepspeed"}),
        _ddp(parallelism={"framework": "megatron", "tp": 8}),
    ):
        est = estimate(scenario_from_dict(other))
        assert not [i for i in est.items if i.name == "DDP gradient buckets"], other


def test_ddp_buckets_hold_only_what_trains() -> None:
    """LoRA: the buckets hold the adapters' gradients, not the frozen base's."""
    sc = scenario_from_dict(_ddp(method="lora"))
    (bucket,) = [i for i in estimate(sc).items if i.name == "DDP gradient buckets"]
    grads = model_state(sc.model, sc.training).category_bytes("gradients")
    # rank 16 on q_proj (2,048 -> 2,048) and v_proj (2,048 -> 512) of 16 layers, fp32
    adapters = 16 * 16 * ((2048 + 2048) + (2048 + 512))
    assert bucket.bytes == grads == 4 * adapters


def test_bucket_views_are_a_change_the_what_ifs_and_make_it_fit_offer() -> None:
    from memfit.engine.solve import CHANGES_BY_KEY
    from memfit.engine.whatif import WhatIfResult, assess

    sc = scenario_from_dict(_ddp())
    result = assess(sc, estimate(sc), "gradient-bucket-view")
    assert isinstance(result, WhatIfResult)
    assert result.saved_bytes == model_state(sc.model, sc.training).category_bytes("gradients")
    assert result.scenario.training.gradient_as_bucket_view is True
    assert "gradient-bucket-view" in CHANGES_BY_KEY
    one_gpu = scenario_from_dict(scenario())
    assert isinstance(assess(one_gpu, estimate(one_gpu), "gradient-bucket-view"), str)


def test_ddp_bucket_copies_cost_memory_traffic_and_views_save_it() -> None:
    """The copies into the buckets and back are a read and a write of the gradients each
    way, on the compute stream: the step time counts them where the buckets are copies."""
    from memfit.engine.steptime import step_time

    copied = step_time(scenario_from_dict(_ddp()))
    views = step_time(scenario_from_dict(_ddp(gradient_as_bucket_view=True)))
    names = {t.name for t in copied.terms}
    assert "DDP gradient bucket copies" in names
    assert "DDP gradient bucket copies" not in {t.name for t in views.terms}
    (term,) = [t for t in copied.terms if t.name == "DDP gradient bucket copies"]
    assert term.kind == "memory_bandwidth" and term.seconds > 0
    assert copied.step_time_s > views.step_time_s


def test_litgpt_runs_a_python_op_gelu_as_one_fused_op() -> None:
    """transformers writes Phi-1.5's and Phi-2's ``gelu_new`` in Python ops, each keeping a
    full-size fp32 tensor under autocast; LitGPT's model calls ``F.gelu(x,
    approximate="tanh")``, one op that keeps its input. A Phi config read from the Hub and
    run on LitGPT costs the fused op in memory and time; on transformers, the Python ops."""
    from memfit.engine.hf_config import model_from_hf_config
    from memfit.engine.presets import load_gpu
    from memfit.engine.specs import HardwareSpec, Scenario, TrainingSpec
    from memfit.engine.stacks import as_built
    from memfit.engine.steptime import step_time
    from tests.engine.test_hf_families import config

    phi = model_from_hf_config(config("phi"))
    assert phi.activation == "gelu_new"
    hw = HardwareSpec(load_gpu("a100-sxm-40gb"))

    def run(implementation: str) -> Scenario:
        training = TrainingSpec(method="lora", stack="lightning", micro_batch_size=4,
                                model_implementation=implementation)  # fmt: skip
        return Scenario(phi, hw, training)

    lit, hf = run("litgpt"), run("transformers")
    assert as_built(phi, lit.training).activation == "gelu_tanh"
    assert as_built(phi, hf.training).activation == "gelu_new"
    assert estimate(lit).breakdown["activations"] < estimate(hf).breakdown["activations"]
    assert step_time(lit).step_time_s < step_time(hf).step_time_s


def test_a_released_output_holds_its_kv_cache_until_the_loss_is_computed() -> None:
    """The Trainer drops the model output after the loss: the DynamicCache the layers
    filled is alive through the forward and the loss, and gone in backward. Keys and
    values the attention saves as they are cost nothing more; fp32 ones (a k-bit prepared
    base: fp32 projections, cast for the kernel) are the cache's own."""
    training = {"method": "qlora", "qlora": {"prepare_kbit": True}}

    def points(**more: object) -> dict[tuple[str, object, str], int]:
        s = scenario_from_dict(scenario(**training, **more))
        return {(p.phase, p.layer, p.label): p.activations for p in estimate(s).timeline}

    with_cache, without = points(), points(kv_cache_in_outputs=False)
    m, tokens = scenario_from_dict(scenario()).model, 2 * 1024
    per_layer = 2 * tokens * m.num_key_value_heads * m.head_dim * 4  # fp32 keys and values
    head = ("forward", None, "LM head and loss")
    assert with_cache[head] - without[head] == m.num_layers * per_layer
    backward = [k for k in with_cache if k[0] == "backward"]
    assert backward and all(with_cache[k] == without[k] for k in backward)
    # bf16 keys and values are the tensors the attention saves: no cost of their own
    training = {"method": "lora"}
    assert points() == points(kv_cache_in_outputs=False)


def test_the_4bit_matmul_keeps_its_input_where_the_stack_or_the_field_says() -> None:
    """bitsandbytes before 0.43.2 (LitGPT's 0.42) keeps the 4-bit matmul's input for
    backward; later versions keep the weight alone. The lightning stack says kept, the
    others not; the field overrides the stack, and a kept input costs activations."""
    import dataclasses

    from memfit.engine.estimate import estimate
    from memfit.engine.presets import load_gpu, load_model
    from memfit.engine.specs import HardwareSpec, QuantSpec, Scenario, TrainingSpec
    from memfit.engine.stacks import conventions

    def training(stack: str, keeps: bool | None = None) -> TrainingSpec:
        quant = QuantSpec(matmul_keeps_input=keeps)
        return TrainingSpec(
            method="qlora", stack=stack, micro_batch_size=2, sequence_length=1024, qlora=quant
        )

    assert conventions(training("lightning")).matmul_keeps_input is True
    assert conventions(training("hf-trainer")).matmul_keeps_input is False
    assert conventions(training("hf-trainer", True)).matmul_keeps_input is True
    hw = HardwareSpec(load_gpu("a100-sxm-80gb"))
    model = load_model("llama-2-7b")

    def activations(t: TrainingSpec) -> int:
        est = estimate(Scenario(model, hw, t))
        return sum(i.bytes for i in est.items if i.category == "activations")

    plain = training("hf-trainer")
    kept = dataclasses.replace(plain, qlora=QuantSpec(matmul_keeps_input=True))
    assert activations(kept) > activations(plain)
