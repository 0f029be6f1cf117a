"""gpt-oss: its ``config.json`` read field by field, the two presets' parameter totals
against the published ones, and what the family brings to the step -- attention sinks
(eager attention whatever the kernel asked, one more score column), biased experts and
router, the experts' clamped SwiGLU -- costed op by op on a tiny model of its kind
(transformers 5 ``modeling_gpt_oss.py``, ``integrations/moe.py``)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from memfit.engine.changes import _flash_rule
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.graph import simulate
from memfit.engine.hf_config import model_from_hf_config
from memfit.engine.layers import Net, attention_run, decoder_layer, megatron_builds
from memfit.engine.model_state import lora_targets
from memfit.engine.params import count_parameters, model_tensors
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import (
    HardwareSpec,
    ModelSpec,
    ParallelismSpec,
    Scenario,
    TrainingSpec,
    full_attention,
)
from tests.engine.helpers import full_ctx, preset_scenario, tiny_model
from tests.engine.test_hf_families import config

#: OpenAI's gpt-oss model card (arXiv 2508.10925), Table 1: total parameters and the
#: parameters active per token (the unembedding counted, the embedding not), in billions
CARD = {"gpt-oss-20b": (20.91, 3.61), "gpt-oss-120b": (116.83, 5.13)}
#: ``general.parameter_count`` of the GGUF conversions, as ``ollama show`` prints it: every
#: tensor's elements, the MXFP4 experts counted by their logical elements
EXACT = {"gpt-oss-20b": 20_914_757_184, "gpt-oss-120b": 116_829_156_672}


# -- the reader ----------------------------------------------------------------------------


def gpt_oss() -> dict[str, Any]:
    """openai/gpt-oss-20b's config.json (``tests/fixtures/hf_configs/gpt_oss.json``)."""
    return copy.deepcopy(config("gpt_oss"))


def test_the_reader_maps_every_field_of_the_config() -> None:
    spec = model_from_hf_config(gpt_oss())
    assert (spec.family, spec.name) == ("gpt_oss", "openai/gpt-oss-20b")
    assert (spec.num_layers, spec.hidden_size, spec.vocab_size) == (24, 2880, 201088)
    assert (spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim) == (64, 8, 64)
    assert (spec.num_experts, spec.num_experts_per_tok) == (32, 4)
    assert spec.intermediate_size == spec.moe_intermediate_size == 2880
    assert spec.first_dense_layers == spec.num_shared_experts == 0
    assert (spec.sliding_window, spec.full_attention_every) == (128, 2)
    assert spec.attention_sinks and spec.swiglu_limit == 7.0
    assert spec.attention_bias and spec.attention_out_bias
    assert spec.mlp_bias and spec.fused_gate_up and not spec.router_bias
    assert (spec.norm, spec.norm_placement, spec.qk_norm) == ("rmsnorm-fp32", "pre", "none")
    assert (spec.mlp, spec.activation, spec.position_embedding) == ("gated", "silu", "rotary")
    assert (spec.max_position_embeddings, spec.tie_word_embeddings) == (131072, False)


def test_sliding_and_full_attention_layers_alternate() -> None:
    """``layer_types``: sliding at layers 0, 2, 4, ..., full at 1, 3, 5, ... (the config
    class's default without the key)."""
    cfg = gpt_oss()
    spec = model_from_hf_config(cfg)
    full = [full_attention(spec, i) for i in range(spec.num_layers)]
    assert full == [t == "full_attention" for t in cfg["layer_types"]]
    assert full == [i % 2 == 1 for i in range(24)]
    del cfg["layer_types"]
    assert model_from_hf_config(cfg).full_attention_every == 2
    every = model_from_hf_config({**cfg, "layer_types": ["sliding_attention"] * 24})
    assert every.full_attention_every == 0 and not any(full_attention(every, i) for i in range(24))


def test_a_missing_window_is_the_config_class_default_and_a_null_one_is_off() -> None:
    cfg = gpt_oss()
    del cfg["sliding_window"]
    assert model_from_hf_config(cfg).sliding_window == 128
    assert model_from_hf_config({**cfg, "sliding_window": None}).sliding_window == 0
    del cfg["attention_bias"]  # GptOssConfig's default: true
    assert model_from_hf_config(cfg).attention_bias


@pytest.mark.parametrize(
    ("key", "value", "field", "accepted"),
    [
        ("num_local_experts", 0, "model.num_local_experts", "[1, 4096]"),
        ("num_experts_per_tok", 33, "model.num_experts_per_tok", "[1, 32]"),
        ("head_dim", 0, "model.head_dim", "[1, 65536]"),
        ("sliding_window", -128, "model.sliding_window", "[0, 16777216]"),
        ("attention_bias", "true", "model.attention_bias", "true or false"),
        ("swiglu_limit", "7", "model.swiglu_limit", "[0.001, 1e+06]"),
        ("swiglu_limit", 0, "model.swiglu_limit", "[0.001, 1e+06]"),
        ("swiglu_alpha", -1.702, "model.swiglu_alpha", "[0.001, 1e+06]"),
        (
            "layer_types",
            ["sliding_attention", "chunked_attention"] * 12,
            "model.layer_types",
            "'sliding_attention' or 'full_attention'",
        ),
        ("layer_types", ["sliding_attention", "full_attention"] * 6, "model.layer_types", "24"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field_and_the_accepted_range(
    key: str, value: object, field: str, accepted: str
) -> None:
    with pytest.raises(EstimateError) as info:
        model_from_hf_config({**gpt_oss(), key: value})
    assert info.value.field == field
    assert accepted in info.value.detail


def test_a_config_without_its_experts_is_refused_naming_the_key() -> None:
    cfg = gpt_oss()
    del cfg["num_local_experts"]
    with pytest.raises(EstimateError) as info:
        model_from_hf_config(cfg)
    assert info.value.field == "model.num_local_experts"
    assert "missing" in info.value.detail
    # transformers' attribute_map name is read too
    assert model_from_hf_config({**cfg, "num_experts": 32}).num_experts == 32


# -- mechanisms ----------------------------------------------------------------------------


def _tiny_gpt_oss(**changes: object) -> ModelSpec:
    base = tiny_model(
        family="gpt_oss", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        mlp_bias=True, swiglu_limit=7.0, fused_gate_up=True, attention_sinks=True,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _moe_layer(model: ModelSpec, mode: str = "half", **ctx: object) -> Any:
    c = full_ctx(batch=2, seq=8, mode=mode, topk=model.num_experts_per_tok, **ctx)
    block, out = decoder_layer(model, c, True, True)
    return simulate(block, out)


def _sink_attention(mode: str, trainable: frozenset[str], b: int, s: int) -> tuple[Net, str]:
    """The attention core alone: q, k, v made from the block's input, 4 query heads of
    16 over 2 key/value heads."""
    ctx = full_ctx(batch=b, seq=s, mode=mode, attention="eager", trainable=trainable)
    act = 4 if mode == "fp32" else 2
    net = Net("attn", ctx, b * s * 64, act, True)
    q = net.new("q", b * s * 64, act, True)
    k = net.new("k", b * s * 32, act, True)
    v = net.new("v", b * s * 32, act, True)
    for t in (q, k, v):
        net._op("proj", ["x"], [t])
    return net, net.attention(q, k, v, 4, 2, 16, sinks=True)


def test_a_bad_mechanism_field_of_a_spec_is_refused() -> None:
    model = _tiny_gpt_oss()
    with pytest.raises(EstimateError) as info:
        dataclasses.replace(model, attention_sinks="yes")  # type: ignore[arg-type]
    assert info.value.field == "model.attention_sinks"
    with pytest.raises(EstimateError) as info:
        dataclasses.replace(model, swiglu_limit=-7.0)
    assert info.value.field == "model.swiglu_limit" and "[0, 1e+06]" in info.value.detail
    with pytest.raises(EstimateError) as info:
        dataclasses.replace(model, mlp="plain")
    assert info.value.field == "model.swiglu_limit"
    with pytest.raises(EstimateError) as info:
        tiny_model(swiglu_limit=7.0)
    assert info.value.field == "model.swiglu_limit" and "num_experts is 0" in info.value.detail


@pytest.mark.parametrize("kernel", ["sdpa", "flash", "mem-efficient", "eager"])
def test_sinks_run_eager_attention_whatever_kernel_is_asked(kernel: str) -> None:
    model = _tiny_gpt_oss()
    assert attention_run(model, kernel) == "eager"
    plain = dataclasses.replace(model, attention_sinks=False)
    assert attention_run(plain, kernel) == kernel


def test_the_sink_is_one_more_column_of_the_scores_and_the_softmax_keeps_it() -> None:
    """Pure bf16: the matmul keeps q and the repeated k, ``max`` its int64 indices, the
    softmax its output of b x h x s x (s + 1) (the product with the values reads a view
    of it, the sink's column dropped), and the product the repeated v."""
    b, s, heads = 2, 16, 4
    net, out = _sink_attention("half", frozenset({"all"}), b, s)
    cat = next(op for op in net.block.ops if op.name == "cat")
    assert cat.outputs[0][1] == 2 * heads * b * s * (s + 1)
    assert cat.weight_grad == 2 * heads  # the sinks' gradient
    q = b * s * heads * 16 * 2
    probs = 2 * heads * b * s * (s + 1)
    argmax = 8 * heads * b * s
    kept = simulate(net.block, out).kept
    assert kept == q + q + probs + argmax + q  # q, repeated k, probs, indices, repeated v


def test_under_autocast_the_softmax_runs_in_fp32_and_the_product_reads_a_bf16_copy() -> None:
    """Full fine-tuning under bf16 autocast: the fp32 mask and the fp32 sinks make the
    joined logits fp32 (``cat`` promotes), so the softmax keeps fp32 probabilities of
    s + 1 columns, and ``.to(value_states.dtype)`` a bf16 copy of s columns for the
    product with the values; with a frozen bf16 stream (LoRA) all of it stays bf16."""
    b, s, heads = 1, 32, 4
    q = b * s * heads * 16 * 2
    net, out = _sink_attention("amp", frozenset({"all"}), b, s)
    kept = simulate(net.block, out).kept
    fp32_probs = 4 * heads * b * s * (s + 1)
    bf16_copy = 2 * heads * b * s * s
    assert kept == 3 * q + fp32_probs + bf16_copy + 8 * heads * b * s
    ctx = full_ctx(batch=b, seq=s, mode="amp", attention="eager", trainable=frozenset(),
                   frozen_bytes=2, embedding_bytes=2)  # fmt: skip
    net = Net("attn", ctx, b * s * 64, 2, True)
    names = [net.new(n, b * s * w, 2, True) for n, w in (("q", 64), ("k", 32), ("v", 32))]
    for t in names:
        net._op("proj", ["x"], [t])
    lora_out = net.attention(*names, 4, 2, 16, sinks=True)
    assert simulate(net.block, lora_out).kept == 3 * q + 2 * heads * b * s * (s + 1) + (
        8 * heads * b * s
    )


def test_megatron_builds_no_sink_layer_and_context_parallelism_is_refused() -> None:
    model = _tiny_gpt_oss()
    assert not megatron_builds(model)
    training = TrainingSpec(method="lora", sequence_length=8192, parallelism=ParallelismSpec(cp=2))
    hardware = HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=2)
    with pytest.raises(EstimateError) as info:
        estimate(Scenario(model, hardware, training))
    assert info.value.field == "training.parallelism.cp" and "sinks" in info.value.detail


def test_the_clamped_swiglu_keeps_three_more_tensors_of_the_experts_width() -> None:
    """``_apply_gate`` keeps the whole projection (the clamps keep their inputs, views of
    it), the clamped gate, the sigmoid, ``up + 1`` and the gated product: with the down
    projection's input, seven tensors of the experts' width per routed row where a
    plain SwiGLU keeps four."""
    rows, inter = 2 * 8 * 2, 32
    clamped = _moe_layer(_tiny_gpt_oss())
    plain = _moe_layer(_tiny_gpt_oss(swiglu_limit=0.0))
    assert clamped.kept - plain.kept == 3 * rows * inter * 2


def test_the_expert_biases_are_added_after_the_grouped_gemm() -> None:
    """The grouped GEMM takes no bias: ``bias[expert_ids]`` gathers one row per routed
    token, and the sum is a tensor of its own. Nothing more is kept for backward; the
    biases get their gradients (the router's, every expert's gate_up and down)."""
    model = _tiny_gpt_oss()
    biased, unbiased = _moe_layer(model), _moe_layer(_tiny_gpt_oss(mlp_bias=False))
    assert biased.kept == unbiased.kept
    assert biased.param_grads - unbiased.param_grads == 2 * (4 + 4 * (2 * 32 + 64))
    ctx = full_ctx(batch=2, seq=8, mode="half", topk=2)
    block, _ = decoder_layer(model, ctx, True, True)
    rows = [op.outputs[0][1] for op in block.ops if op.name == "index_bias"]
    assert rows == [2 * 32 * 2 * 32, 2 * 32 * 64]  # 32 routed rows of 2f, then of h


def test_lora_reaches_the_attention_only() -> None:
    """The experts and the router are parameters, no ``nn.Linear``: PEFT's target names
    (``all-linear`` too) reach q, k, v and o only; an expert name alone matches nothing."""
    model = _tiny_gpt_oss()
    roles, missed = lora_targets(model, ("all-linear",))
    assert roles == {"q_proj", "k_proj", "v_proj", "o_proj"} and not missed
    with pytest.raises(EstimateError) as info:
        lora_targets(model, ("gate_proj", "up_proj", "down_proj"))
    assert info.value.field == "training.lora.targets"


# -- the presets ---------------------------------------------------------------------------


def test_the_20b_preset_is_its_config() -> None:
    preset = load_model("gpt-oss-20b")
    read = model_from_hf_config(gpt_oss())
    labels = {"name": preset.name, "display_name": preset.display_name, "source": preset.source}
    assert dataclasses.replace(read, **labels) == preset


def test_the_120b_preset_is_the_20b_config_deeper_and_wider_in_experts() -> None:
    """openai/gpt-oss-120b's config.json differs from the 20b's in these keys only."""
    cfg = gpt_oss()
    cfg.update(
        num_hidden_layers=36,
        num_local_experts=128,
        layer_types=["sliding_attention", "full_attention"] * 18,
    )
    preset = load_model("gpt-oss-120b")
    labels = {"name": preset.name, "display_name": preset.display_name, "source": preset.source}
    assert dataclasses.replace(model_from_hf_config(cfg), **labels) == preset


def test_sinks_and_biases_are_counted_by_hand() -> None:
    """Per layer: q/k/v/o with biases, 64 sinks, the router's weight and bias, every
    expert's fused gate_up (2880 x 5760 + 5760) and down (2880 x 2880 + 2880), two norms."""
    model = load_model("gpt-oss-20b")
    h, heads, kv, d, f, e = 2880, 64, 8, 64, 2880, 32
    attention = (h + 1) * heads * d + 2 * (h + 1) * kv * d + (heads * d + 1) * h + heads
    experts = e * ((h + 1) * 2 * f + (f + 1) * h)
    counts = count_parameters(model).as_dict()
    assert counts["attention"] == 24 * attention
    assert counts["experts"] == 24 * experts
    assert counts["router"] == 24 * (e * h + e)
    assert counts["norms"] == 24 * 2 * h + h
    assert counts["embeddings"] == counts["lm_head"] == 201088 * h
    assert counts["mlp"] == 0
    sinks = [g for g in model_tensors(model) if g.module == "sinks"]
    assert [(g.component, g.shape, g.count) for g in sinks] == [("attention", (64,), 24)]
    assert not any(g.matrix for g in sinks)  # a parameter, never a quantized linear


@pytest.mark.parametrize("name", sorted(CARD))
def test_the_presets_have_the_published_totals(name: str) -> None:
    """Exactly the GGUF's element count, and within 0.5 % of the model card's total and
    active figures (active: attention, router and norms of every layer, 4 experts of each,
    and the unembedding; the embedding table is a lookup)."""
    model = load_model(name)
    counts = count_parameters(model)
    assert counts.total == EXACT[name]
    total, active = CARD[name]
    assert abs(counts.total / (total * 1e9) - 1) < 0.005
    per_expert = counts["experts"] // model.num_experts
    active_count = counts.total - counts["embeddings"] - (model.num_experts - 4) * per_expert
    assert abs(active_count / (active * 1e9) - 1) < 0.005


def test_the_flash_change_is_refused_and_every_kernel_costs_the_same() -> None:
    training = {"method": "lora", "micro_batch_size": 1, "sequence_length": 1024}
    found = {
        kernel: estimate(
            preset_scenario("gpt-oss-20b", "h100-sxm-80gb", {**training, "attention": kernel})
        ).allocated_bytes
        for kernel in ("sdpa", "flash", "eager")
    }
    assert len(set(found.values())) == 1
    s = preset_scenario("gpt-oss-20b", "h100-sxm-80gb", training)
    refused = _flash_rule(s)
    assert refused is not None and "sinks" in refused


def test_lora_on_the_20b_fits_one_h100_with_a_step_time() -> None:
    training = {
        "method": "lora",
        "lora": {"rank": 16, "alpha": 32, "targets": ["all-linear"]},
        "micro_batch_size": 1,
        "sequence_length": 2048,
    }
    est = estimate(preset_scenario("gpt-oss-20b", "h100-sxm-80gb", training))
    assert est.verdict != "oom"
    # the frozen base in bf16, the MXFP4 experts dequantized
    frozen = next(i for i in est.items if i.name.startswith("frozen weights"))
    assert frozen.bytes == 2 * EXACT["gpt-oss-20b"]
    assert est.trainable_params == 24 * 16 * (2 * (2880 + 4096) + 2 * (2880 + 512))
    # eager attention keeps a score matrix per layer: most of the activations
    scores = 24 * 64 * 2048 * 2049 * 2
    assert est.breakdown["activations"] > scores
    time = est.time
    assert time.step_time_s > 0 and time.tokens_per_s > 0


def test_the_120b_on_eight_h100s_under_zero_3_with_a_step_time() -> None:
    training = {
        "method": "lora",
        "micro_batch_size": 1,
        "sequence_length": 2048,
        "activation_checkpointing": "full",
        "parallelism": {"zero_stage": 3},
    }
    est = estimate(preset_scenario("gpt-oss-120b", "h100-sxm-80gb", training, gpus_per_node=8))
    assert est.total_params == EXACT["gpt-oss-120b"] + est.trainable_params
    assert est.verdict != "oom"
    time = est.time
    assert time.step_time_s > 0 and time.tokens_per_s > 0
    full = {**training, "method": "full"}
    est = estimate(preset_scenario("gpt-oss-120b", "h100-sxm-80gb", full, gpus_per_node=8))
    # 16 bytes a parameter over 8 GPUs: no fit, but an answer and a step time
    assert est.verdict == "oom" and est.time.step_time_s > 0
