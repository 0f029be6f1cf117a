"""Memory mechanisms of single families, read from their configs and costed by the blocks.

Falcon's own eager attention (``ModelSpec.eager_attention``), Gemma-2's soft-capped
attention scores (``attn_logit_softcapping``) and sandwich norms, OLMo-2's norms after the
sublayers (``norm_placement``), its fp32 norm weights and its RoPE cast back
(``rmsnorm-fp32``, ``rope_keeps_dtype``); each checked against a trace in
``tests/validation/test_engine_vs_activations.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

from memfit.engine.changes import _flash_rule
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.hf_config import model_from_hf_config
from memfit.engine.layers import Ctx, decoder_layer
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, ModelSpec, Scenario, TrainingSpec
from tests.engine.test_hf_families import config


def scenario(model: ModelSpec | str, **training: object) -> Scenario:
    spec = load_model(model) if isinstance(model, str) else model
    return Scenario(
        spec,
        HardwareSpec(load_gpu("h100-sxm-80gb")),
        TrainingSpec(**training),  # type: ignore[arg-type]
    )


def allocated(model: ModelSpec | str, **training: object) -> int:
    return estimate(scenario(model, **training)).allocated_bytes


def test_each_family_reads_its_mechanisms_from_its_config() -> None:
    gemma2 = model_from_hf_config(config("gemma2"))
    assert (gemma2.attn_logit_softcapping, gemma2.final_logit_softcapping) == (50.0, 30.0)
    assert (gemma2.norm, gemma2.norm_placement) == ("rmsnorm-fp32", "sandwich")
    gemma3 = model_from_hf_config(config("gemma3_text"))  # its config's cap is null
    assert gemma3.attn_logit_softcapping == 0.0 and gemma3.norm_placement == "sandwich"
    assert model_from_hf_config(config("gemma")).norm == "rmsnorm-fp32"
    olmo2 = model_from_hf_config(config("olmo2"))
    assert (olmo2.norm, olmo2.norm_placement, olmo2.qk_norm) == ("rmsnorm-fp32", "post", "full")
    assert olmo2.rope_keeps_dtype
    # OLMoE has OLMo-2's q/k norms but Llama's norms before the sublayers
    olmoe = model_from_hf_config(config("olmoe"))
    assert (olmoe.norm, olmoe.norm_placement, olmoe.qk_norm) == ("rmsnorm", "pre", "full")
    assert not olmoe.rope_keeps_dtype
    assert model_from_hf_config(config("falcon")).eager_attention == "falcon"
    llama = model_from_hf_config(config("llama"))
    assert (llama.eager_attention, llama.norm_placement, llama.norm) == ("hf", "pre", "rmsnorm")


@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("eager_attention", "flash", "hf"),
        ("norm_placement", "middle", "sandwich"),
        ("norm", "rmsnorm-fp16", "rmsnorm-fp32"),
        ("attn_logit_softcapping", -1.0, "0"),
        ("rope_keeps_dtype", "yes", "true or false"),
    ],
)
def test_a_bad_mechanism_is_refused_naming_its_field(
    field: str, value: object, accepted: str
) -> None:
    with pytest.raises(EstimateError) as err:
        dataclasses.replace(load_model("gemma-2-2b"), **{field: value})  # type: ignore[arg-type]
    assert err.value.field == "model." + field
    assert accepted in str(err.value)


def test_a_bad_cap_in_a_config_is_refused_naming_its_key() -> None:
    data = {**config("gemma2"), "attn_logit_softcapping": "fifty"}
    with pytest.raises(EstimateError) as err:
        model_from_hf_config(data)
    assert err.value.field == "model.attn_logit_softcapping"


def test_gemma_2_under_sdpa_runs_the_eager_attention_that_caps_its_scores() -> None:
    """SDPA cannot soft-cap: transformers' Gemma-2 falls back to eager attention, whose
    scores the step keeps; flash attention caps inside its kernel and keeps none. The
    flash attention change is offered for it."""
    common = {"method": "lora", "micro_batch_size": 2, "sequence_length": 4096}
    sdpa = allocated("gemma-2-2b", attention="sdpa", **common)
    assert sdpa == allocated("gemma-2-2b", attention="eager", **common)
    assert allocated("gemma-2-2b", attention="flash", **common) < sdpa
    assert _flash_rule(scenario("gemma-2-2b", attention="sdpa", **common)) is None
    # without the cap, SDPA runs its fused kernel again
    plain = dataclasses.replace(load_model("gemma-2-2b"), attn_logit_softcapping=0.0)
    assert allocated(plain, attention="sdpa", **common) < sdpa


def test_the_cap_keeps_one_score_matrix_a_layer() -> None:
    """``scores / cap``, ``tanh`` (keeping its output) and ``* cap``: in pure bf16 the
    layers keep one more 16-bit score matrix each than without the cap."""
    model = load_model("gemma-2-2b")
    plain = dataclasses.replace(model, attn_logit_softcapping=0.0)
    common = {"method": "lora", "precision": "bf16", "attention": "eager"}
    common.update(micro_batch_size=1, sequence_length=2048)
    more = allocated(model, **common) - allocated(plain, **common)
    scores = model.num_layers * model.num_attention_heads * 2048 * 2048 * 2
    assert scores <= more <= 1.01 * scores


def _ops(model: ModelSpec, mode: str) -> list[str]:
    ctx = Ctx(batch=1, seq=64, mode=mode, attention="sdpa", lora_rank=0,
              lora_roles=frozenset(), trainable=frozenset({"all"}), frozen_bytes=2,
              quantized=False, dropout=0.0)  # fmt: skip
    block, _ = decoder_layer(model, ctx, True, False)
    return [op.name for op in block.ops]


def test_olmo_2s_norms_follow_the_sublayers_and_normalize_q_and_k() -> None:
    """OLMo-2: no norm before attention (q_proj reads the layer input), RMSNorms on the
    whole q and k projections, and one on each sublayer's output before the residual sum;
    a norm is the fp32 product with the weight, cast back."""
    olmo2 = model_from_hf_config(config("olmo2"))
    ops = _ops(olmo2, "amp")
    assert ops.index("mm") < ops.index("mul_weight")  # q_proj comes before any norm
    assert ops.count("mul_weight") == 4  # q_norm, k_norm, post-attention, post-feedforward
    last = len(ops) - 1 - ops[::-1].index("mul_weight")
    assert ops[last + 1 :] == ["to", "residual"]  # post_feedforward_layernorm, then the sum
    llama = dataclasses.replace(olmo2, norm="rmsnorm", norm_placement="pre", qk_norm="none")
    assert _ops(llama, "amp").count("mul_weight") == 2


def test_sandwich_norms_sit_on_both_sides_of_each_sublayer() -> None:
    gemma2 = load_model("gemma-2-2b")
    assert _ops(gemma2, "half").count("mul_weight") == 4
    pre = dataclasses.replace(gemma2, norm_placement="pre")
    assert _ops(pre, "half").count("mul_weight") == 2


def test_litgpts_gemma_2_caps_its_scores_too() -> None:
    """LitGPT's attention soft-caps the scores itself (``do_softcapping``: tanh(x / cap) *
    cap) and so never calls SDPA for Gemma-2: the cap keeps one score matrix a layer."""
    model = load_model("gemma-2-2b")
    plain = dataclasses.replace(model, attn_logit_softcapping=0.0)
    common: dict[str, object] = {"method": "lora", "precision": "bf16", "attention": "eager"}
    common.update(model_implementation="litgpt", micro_batch_size=1, sequence_length=2048)
    more = allocated(model, **common) - allocated(plain, **common)
    scores = model.num_layers * model.num_attention_heads * 2048 * 2048 * 2
    # tanh's output kept, and at the peak (a layer's backward) the capping's gradients
    assert scores <= more <= 2 * scores
