"""MemFit against traced steps of model mechanisms written in the families' own code.

``dataset_activations.json`` (``validation/cases_activations.py``), traced as the other
datasets are, under autocast and in pure bf16:

* SantaCoder's widths with transformers' ``FastGELUActivation`` (``gelu_fast``) and with
  the fused ``gelu_pytorch_tanh``. ``gelu_fast`` keeps six more tensors of the MLP's width
  per layer; read as the fused GELU it came out 12-17 % low.
* Falcon-7B's own eager attention (scores scaled in place, softmax in the hidden states'
  dtype): costed as transformers' shared eager attention it came out 37-39 % high in pure
  bf16, which keeps one 16-bit score matrix a layer where that path keeps three.
* Gemma-2-9B's soft-capped attention scores and sandwich norms, with and without the
  capping; OLMo-2-7B's q/k norms over the whole projections and norms after the sublayers
  (SDPA and eager). Before these were modelled: Gemma-2 4-6 % low, OLMo-2 2-6 % low.
* PEFT's LoRA on the output layer (``lm_head`` as a target; refused before), on a tied
  and an untied head, with and without it.
* Qwen3-8B's and Gemma-3-1B's RMSNorms over each head of q and k: left out before, Qwen3
  came out 1.2 % low in pure bf16 (two layers), the Qwen3-30B-A3B cases 0.2-0.6 % lower
  than now.
* gpt-oss-20b's widths: eager attention with its sinks, biased router and experts, the
  clamped SwiGLU; full fine-tuning and LoRA. Costed as another MoE (the shared eager
  attention, a plain SwiGLU) the LoRA steps came out 38-42 % high.
* Frozen layers whose input needs no gradient (only the head trained) under each eager
  attention -- Llama-2-7B's (transformers' own), Falcon-7B's, Gemma-2-9B's capped, gpt-oss's
  with sinks: nothing recorded in them, the forward's peak at the softmax holding its
  16-bit input, the head's weight copy not kept where its input needs no gradient, and a
  head tied to the embedding making the stream fp32 (Falcon was 26 % low, Llama-2 58-62 %
  and gpt-oss 34-38 % high).
* Falcon-7B's eager attention under LoRA, its softmax in the norm output's dtype (fp32
  under autocast): 34 % low when read as the 16-bit residual stream's.

Each case is compared with the output held and released.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.engine.estimate import estimate
from memfit.engine.scenario_io import scenario_from_dict
from tests.validation.traced import as_traced, traced_peak

CASES = json.loads((Path(__file__).parent / "dataset_activations.json").read_text())


def test_the_cases_cover_both_activations_under_both_precisions() -> None:
    santacoder = [c for c in CASES if c["family"] == "gpt_bigcode"]
    acts = {c["scenario"]["model"]["activation_function"] for c in santacoder}
    precisions = {c["scenario"]["training"]["precision"] for c in CASES}
    assert acts == {"gelu_fast", "gelu_pytorch_tanh"}
    assert precisions == {"bf16-mixed", "bf16"}
    assert scenario_from_dict(CASES[0]["scenario"]).model.activation == "gelu_fast"


def test_the_cases_cover_each_familys_mechanism() -> None:
    """Each family's traced cases read as the mechanism they exercise."""
    models = {
        c["family"]: scenario_from_dict(c["scenario"]).model
        for c in CASES
        if "no-attn-softcap" not in c["id"]
    }
    assert models["falcon"].eager_attention == "falcon"
    assert models["gemma2"].attn_logit_softcapping == 50.0
    assert models["gemma2"].norm_placement == "sandwich"
    assert models["olmo2"].norm_placement == "post"
    assert models["olmo2"].qk_norm == "full"
    assert models["qwen3"].qk_norm == models["gemma3_text"].qk_norm == "head"
    assert models["gemma3_text"].norm == "rmsnorm-fp32"
    assert models["gpt_oss"].attention_sinks and models["gpt_oss"].swiglu_limit == 7.0
    assert models["gpt_oss"].mlp_bias and models["gpt_oss"].full_attention_every == 2
    attentions = {(c["family"], c["scenario"]["training"]["attention"]) for c in CASES}
    assert {("falcon", "eager"), ("gemma2", "eager"), ("olmo2", "sdpa"), ("olmo2", "eager")} <= (
        attentions
    )


def _error(case: dict, held: bool) -> float:
    est = estimate(scenario_from_dict(as_traced(case["scenario"], held)))
    return est.allocated_bytes / traced_peak(case, held) - 1


def _plain(case_id: str) -> str:
    """A LoRA case's id without the head's adapter, without ``modules_to_save`` and, on the
    MoE model, with q/v in place of all-linear (no adapted experts)."""
    if case_id.startswith("qwen3-30b-a3b"):
        case_id = case_id.replace("-all-linear_", "-q_proj+v_proj_")
    return (
        case_id.replace("+lm_head", "")
        .replace("_save-lm_head", "")
        .replace("_save-embed_tokens", "")
    )


def _without_head_adapter(case: dict) -> dict | None:
    """The traced twin of a LoRA case that names ``lm_head`` or saves a module: the same
    step without it."""
    twin = _plain(case["id"])
    return next((c for c in CASES if c["id"] == twin), None) if twin != case["id"] else None


#: the LoRA steps without the head's adapter, whose error is the base step's: held to
#: ``test_engine_vs_dataset.py``'s 5 % target (Llama-2-7B's fp32 adapters on a bf16 base
#: under autocast come out 1.8 % low, as the same step in ``dataset_conventions.json`` does)
TWINS = {_plain(c["id"]) for c in CASES if _plain(c["id"]) != c["id"]}


#: Falcon's layers returning their attention weights, under checkpointing (its own test)
FALCON_CHECKPOINTED = (
    "falcon-7b_L2_bf16-mixed_lora_r16-q_proj+v_proj_adamw-foreach_eager_b2_s2048_ckpt"
)
#: cases held to a looser bound, with why: the frozen Llama-2 layers under eager attention
#: (1.8-2.1 % low: a frozen layer's Python variables -- the norm's output, q -- live while
#: its attention runs, a few hidden-size tensors the op-by-op walk has freed by then), and
#: Falcon's pure-bf16 LoRA step (1.6 % high, as its full and frozen steps are 0.7-0.9 %)
LOOSER = {
    "llama-2-7b_L2_bf16-mixed_freeze_lm_head_adamw-foreach_eager_b2_s2048": 0.03,
    "llama-2-7b_L2_bf16_freeze_lm_head_adamw-foreach_eager_b2_s2048": 0.03,
    "falcon-7b_L2_bf16_lora_r16-q_proj+v_proj_adamw-foreach_eager_b1_s2048": 0.025,
    # GPT-2 XL in pure bf16: 0.9-1.0 % high (its fp32 steps in dataset.json are 1.5 %)
    "gpt2-xl_L2_bf16_full_adamw-foreach_eager_b4_s512": 0.02,
    # Falcon's checkpointed LoRA step: 1.0 % high, as its other LoRA steps are 0.3-1.7 %
    FALCON_CHECKPOINTED: 0.02,
}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
@pytest.mark.parametrize("held", [True, False])
def test_every_case_within_one_percent(case: dict, held: bool) -> None:
    """Within 1 % (:data:`LOOSER` says the few held to more, and why); a LoRA case on the
    LM head (saving a module, adapting the experts) whose twin without it is off by more
    is off by the twin's bytes, to 0.1 % of its peak or 2 % of what it adds: what it adds
    is the trace's."""
    error = _error(case, held)
    if case["id"] in LOOSER:
        assert abs(error) <= LOOSER[case["id"]], f"{error:+.2%}"
        return
    if case["id"] in TWINS:
        assert abs(error) <= 0.05, f"{error:+.2%}"
        return
    twin = _without_head_adapter(case)
    if twin is not None and abs(_error(twin, held)) > 0.01:
        # the twin's shortfall in bytes, no more (to 0.1 % of the peak, or 2 % of what the
        # case adds): what the case adds is the trace's
        def off(c: dict) -> float:
            return _error(c, held) * traced_peak(c, held)

        added = traced_peak(case, held) - traced_peak(twin, held)
        tolerance = max(0.001 * traced_peak(case, held), 0.02 * added)
        assert abs(off(case) - off(twin)) <= tolerance, f"{error:+.2%}"
        return
    assert abs(error) <= 0.01, f"{error:+.2%}"


def test_the_python_ops_cost_what_the_trace_shows() -> None:
    """What gelu_fast keeps beyond the fused kernel, traced and estimated, to 1 % of it."""
    by_id = {c["id"]: c for c in CASES}
    for precision in ("bf16-mixed", "bf16"):
        stem = f"santacoder_L2_{precision}_full_adamw-foreach_sdpa_b4_s1024_"
        fast, fused = by_id[stem + "gelu_fast"], by_id[stem + "gelu_pytorch_tanh"]
        traced = traced_peak(fast, True) - traced_peak(fused, True)
        ours = [estimate(scenario_from_dict(as_traced(c["scenario"], True))) for c in (fast, fused)]
        assert abs(ours[0].allocated_bytes - ours[1].allocated_bytes - traced) <= 0.01 * traced


def test_soft_capping_the_scores_costs_what_the_trace_shows() -> None:
    """Gemma-2's ``cap * tanh(scores / cap)`` keeps tanh's output, one score matrix a layer
    (16-bit here): the traced cost of the capping, estimated to 1 % of it."""
    by_id = {c["id"]: c for c in CASES}
    stem = "gemma-2-9b_L2_bf16_full_adamw-foreach_eager_b1_s4096"
    capped, plain = by_id[stem], by_id[stem + "_no-attn-softcap"]
    traced = traced_peak(capped, True) - traced_peak(plain, True)
    scores = 2 * 16 * 4096 * 4096 * 2  # two layers of 16 heads' bf16 scores
    assert traced == scores
    ours = [estimate(scenario_from_dict(as_traced(c["scenario"], True))) for c in (capped, plain)]
    assert abs(ours[0].allocated_bytes - ours[1].allocated_bytes - traced) <= 0.01 * traced


def test_falcons_eager_attention_keeps_one_score_matrix_in_pure_bf16() -> None:
    """Costed as transformers' shared eager attention (an fp32 softmax and its 16-bit
    copy), the pure-bf16 Falcon case comes out over a third high; Falcon's own keeps
    one 16-bit score matrix a layer, within 1 % of the trace."""
    import dataclasses

    falcon = "falcon-7b_L2_bf16_full_adamw-foreach_eager_b1_s2048"
    case = next(c for c in CASES if c["id"] == falcon)
    scenario = scenario_from_dict(as_traced(case["scenario"], True))
    shared = dataclasses.replace(
        scenario, model=dataclasses.replace(scenario.model, eager_attention="hf")
    )
    traced = traced_peak(case, True)
    assert estimate(shared).allocated_bytes > 1.3 * traced
    assert abs(estimate(scenario).allocated_bytes / traced - 1) <= 0.01


def test_gpt_oss_sinks_and_clamped_experts_cost_what_the_trace_shows() -> None:
    """gpt-oss's eager attention with its sinks keeps one softmax of s + 1 columns a layer
    (16-bit in pure bf16 and under LoRA's bf16 stream, where the shared eager attention
    keeps an fp32 softmax and its 16-bit copy), and its clamped SwiGLU seven tensors of
    the experts' width per routed token: costed without them, as another MoE, the LoRA
    steps come out over a third high; with them every case is within 1 % of the trace."""
    import dataclasses

    cases = [
        c
        for c in CASES
        if c["family"] == "gpt_oss" and c["scenario"]["training"]["method"] != "freeze"
    ]
    assert len(cases) == 4
    for case in cases:
        scenario = scenario_from_dict(as_traced(case["scenario"], True))
        traced = traced_peak(case, True)
        assert abs(estimate(scenario).allocated_bytes / traced - 1) <= 0.01
        if case["scenario"]["training"]["method"] == "lora":
            model = dataclasses.replace(scenario.model, attention_sinks=False, swiglu_limit=0.0)
            plain = dataclasses.replace(scenario, model=model)
            assert estimate(plain).allocated_bytes > 1.3 * traced


def _added_cost_matches(case: dict, twin: dict, more_than: int = 0) -> int:
    """What a mechanism adds to the traced peak -- ``case`` less ``twin``, the same step
    without it -- estimated to 2 % of it, with the model output held and released; the
    number of comparisons made. The traced cost is more than ``more_than`` bytes."""
    for held in (True, False):
        traced = traced_peak(case, held) - traced_peak(twin, held)
        ours = [
            estimate(scenario_from_dict(as_traced(c["scenario"], held))).allocated_bytes
            for c in (case, twin)
        ]
        assert traced > more_than
        assert abs(ours[0] - ours[1] - traced) <= 0.02 * traced, case["id"]
    return 2


def test_lora_on_the_lm_head_costs_what_the_trace_shows() -> None:
    """PEFT's adapter on the output layer (``lm_head`` named as a target, on Llama-3.2-1B's
    tied head and Llama-2-7B's own): A and B with their gradients and AdamW states, and a
    logits-sized product of B, scaled and summed with the head's output. The traced cost,
    the step with it less the step without, estimated to 2 % of it."""
    checked = 0
    for case in CASES:
        twin = _without_head_adapter(case)
        if twin is None or "+lm_head" not in case["id"]:
            continue
        checked += _added_cost_matches(case, twin)
    assert checked == 4


def test_modules_to_save_costs_what_the_trace_shows() -> None:
    """PEFT's ``modules_to_save`` (``lm_head`` or ``embed_tokens``, on Llama-3.2-1B's tied
    head and Llama-2-7B's own): a trained copy in the base's bf16 beside the frozen
    original, with its bf16 gradient and AdamW states (fp32 adapters beside it under
    autocast). The traced cost, the step with it less the step without, estimated to 2 % of
    it; the trainable parameters are the trace's."""
    checked = 0
    for case in CASES:
        twin = _without_head_adapter(case)
        if "_save-" not in case["id"]:
            continue
        scenario = scenario_from_dict(case["scenario"])
        est = estimate(scenario)
        assert est.trainable_params == case["measured"]["params_trainable"], case["id"]
        if twin is None:
            continue
        checked += _added_cost_matches(case, twin)
    assert checked == 8


def test_lora_on_fused_experts_costs_what_the_trace_shows() -> None:
    """PEFT's LoRA on transformers' fused MoE experts (Qwen3-30B-A3B's widths, all-linear):
    the 3-D ``gate_up_proj`` (rank 2r) and ``down_proj`` and the router wrapped as
    parameters, each made whole as ``W + scaling B A`` in the forward and kept by the
    experts' matmuls with their inputs. The trainable parameters are the trace's; what the
    experts' and router's adapters add over q/v alone is estimated to 2 % of the trace's,
    grouped and eager, bf16 and bf16-mixed."""
    checked = 0
    for case in CASES:
        if not case["id"].startswith("qwen3-30b-a3b") or "all-linear" not in case["id"]:
            continue
        est = estimate(scenario_from_dict(case["scenario"]))
        assert est.trainable_params == case["measured"]["params_trainable"], case["id"]
        twin = _without_head_adapter(case)
        assert twin is not None
        checked += _added_cost_matches(case, twin, more_than=2 * 2**30)  # two expert stacks
    assert checked == 8


def _frozen(name: str) -> list[dict]:
    return [c for c in CASES if c["id"].startswith(name) and "_freeze_lm_head_" in c["id"]]


def test_frozen_layers_under_eager_attention_keep_nothing_and_peak_at_the_softmax() -> None:
    """Only the head trained, the layers' input needing no gradient: autograd records
    nothing in them, whatever their eager attention. The Llama-2 and gpt-oss steps
    (untied heads) came out 58-62 % and 34-38 % high with the attention's tensors kept,
    and gpt-oss's under autocast 6 % high with the head's weight copy kept for an input
    gradient nothing needs; the Llama-2 step peaks in the forward, at the softmax, where
    ``softmax(x, dtype=float32)`` holds its 16-bit input (11-13 % low without)."""
    for name in ("llama-2-7b", "gpt-oss-20b", "gemma-2-9b", "falcon-7b"):
        cases = _frozen(name)
        assert len(cases) == 2, name
        for case in cases:
            for held in (True, False):
                assert abs(_error(case, held)) <= LOOSER.get(case["id"], 0.01), case["id"]
    for case in _frozen("llama-2-7b"):
        assert case["measured"]["peak_phase"] == "forward"
        est = estimate(scenario_from_dict(as_traced(case["scenario"], True)))
        assert est.peak_phase == "forward"


def test_a_trained_head_tied_to_the_embedding_makes_the_stream_fp32_as_traced() -> None:
    """Falcon-7B and Gemma-2-9B tie their heads to the embedding: training the head trains
    the embedding, an fp32 weight under autocast, whose fp32 output starts an fp32 residual
    stream and makes every layer record. Read as a 16-bit stream, the Falcon step came out
    26 % low; within 1 % now, as Gemma-2's."""
    for name in ("falcon-7b", "gemma-2-9b"):
        (case,) = [c for c in _frozen(name) if "bf16-mixed" in c["id"]]
        assert scenario_from_dict(case["scenario"]).model.tie_word_embeddings
        assert abs(_error(case, True)) <= 0.01


def test_falcons_lora_softmax_is_fp32_under_autocast_as_traced() -> None:
    """LoRA on Falcon-7B under bf16-mixed: the frozen bf16 base makes a 16-bit residual
    stream, but Falcon's softmax takes the norm's output's dtype, fp32 under autocast: read
    as 16-bit, the step came out 34 % low; within 1 % now."""
    case = next(c for c in CASES if c["id"].startswith("falcon-7b_L2_bf16-mixed_lora"))
    for held in (True, False):
        assert abs(_error(case, held)) <= 0.01


def test_falcons_checkpointed_forward_holds_the_previous_layers_attention_weights() -> None:
    """Falcon's layers return their attention weights, and its model loop keeps a layer's
    outputs until the next layer returns: under checkpointing, which saves nothing of a
    layer's forward, the previous layer's fp32 probabilities (2.1 GiB here) are alive at
    the next layer's softmax, its peak. Played each layer alone, the step came out 15 %
    low with the output held and 20 % released; within 1 % now."""
    case = next(c for c in CASES if c["id"] == FALCON_CHECKPOINTED)
    assert case["measured"]["peak_phase"] == "forward"
    for held in (True, False):
        assert abs(_error(case, held)) <= LOOSER[FALCON_CHECKPOINTED]


def test_gpt2_and_berts_own_softmax_runs_in_the_scores_dtype_as_traced() -> None:
    """GPT-2's and BERT's eager attention call ``softmax(attn_weights, dim=-1)``: in pure
    bf16 the probabilities are 16-bit, where transformers' shared eager attention keeps an
    fp32 softmax and its 16-bit copy. Read as the shared one, GPT-2 XL's pure-bf16 step came
    out 8.5 % high and BERT-large's 15 %; under autocast (an fp32 softmax either way) both
    were, and are, within 1 %."""
    for name in ("gpt2-xl", "bert-large-uncased"):
        cases = [c for c in CASES if c["id"].startswith(f"{name}_L2_")]
        assert {c["scenario"]["training"]["precision"] for c in cases} == {"bf16", "bf16-mixed"}
        for case in cases:
            assert scenario_from_dict(case["scenario"]).model.eager_attention == "plain"
            for held in (True, False):
                assert abs(_error(case, held)) <= LOOSER.get(case["id"], 0.01), case["id"]
