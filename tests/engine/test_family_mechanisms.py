"""Memory mechanisms of single families, read from their configs and costed by the blocks.

Falcon's own eager attention (``ModelSpec.eager_attention``), Gemma-2's soft-capped
attention scores (``attn_logit_softcapping``) and sandwich norms, OLMo-2's norms after the
sublayers (``norm_placement``), its fp32 norm weights and its RoPE cast back
(``rmsnorm-fp32``, ``rope_keeps_dtype``); each checked against a trace in
``tests/validation/test_engine_vs_activations.py``.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from memfit.engine.changes import _flash_rule
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import Estimate, estimate
from memfit.engine.hf_config import model_from_hf_config
from memfit.engine.layers import Ctx, bert_layer, decoder_layer
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import FreezeSpec, HardwareSpec, ModelSpec, Scenario, TrainingSpec
from memfit.engine.timeline import Point, _direct, make_ctx
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


@pytest.mark.parametrize("name", ["llama-2-7b", "gemma-2-2b", "falcon-7b", "gpt-oss-20b"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("precision", ["bf16-mixed", "fp32"])
def test_a_frozen_layer_whose_input_needs_no_gradient_keeps_nothing_whatever_its_attention(
    name: str, attention: str, precision: str
) -> None:
    """Autograd records an op only where an input or its weight needs a gradient. In a
    frozen layer whose input needs none, eager attention's scores, probabilities and
    output (transformers' own, Gemma-2's capped, Falcon's, gpt-oss's with sinks, SDPA's
    math fallback) need none either: the layer keeps nothing for backward, and hands the
    model output its key/value cache alone, as under a fused kernel. MemFit kept the
    attention's tensors there (Llama 2 7B, only the head trained, eager, 512 tokens: 3.0
    GB by the last layer's forward, 0 with SDPA)."""
    model = load_model(name)
    training = TrainingSpec(
        method="freeze", freeze=FreezeSpec(trainable=("lm_head",)), attention=attention,
        precision=precision, sequence_length=256,
    )  # fmt: skip
    ctx = dataclasses.replace(make_ctx(model, training), batch=2)
    kind = "moe" if model.is_moe else "dense"
    block = _direct(model, ctx, kind, False, False)
    assert block.kept == 0 and block.param_grads == 0 and block.input_grad == 0
    # what it hands the model output is its key/value cache: as under flash attention
    flash = dataclasses.replace(ctx, attention="flash")
    assert block.held == _direct(model, flash, kind, False, False).held > 0


def test_the_frozen_layers_of_an_eager_model_grow_the_forward_by_their_cache_alone() -> None:
    """The step as a whole: Llama 2 7B with only its head trained, eager attention, 512
    tokens: each frozen layer's forward adds its key/value cache (2 x 512 x 4,096 x 2
    bytes) and nothing more, as with SDPA."""
    growth = {}
    for attention in ("eager", "sdpa"):
        est = estimate(
            scenario(
                "llama-2-7b", method="freeze", freeze=FreezeSpec(trainable=("lm_head",)),
                attention=attention, sequence_length=512,
            )
        )  # fmt: skip
        layers = [p for p in est.timeline if p.phase == "forward" and p.layer is not None]
        growth[attention] = {b.activations - a.activations for a, b in itertools.pairwise(layers)}
    assert growth["eager"] == growth["sdpa"] == {2 * 512 * 4096 * 2}


def test_a_held_tensor_lives_until_the_op_that_holds_it_has_run() -> None:
    """``x = softmax(x, dtype=...)``: the old ``x`` is a Python variable until the
    statement is done. An op that holds a tensor keeps it live through itself, without
    reading it or giving it a gradient."""
    from memfit.engine.graph import Block, simulate

    def played(holds: tuple[str, ...]) -> tuple[int, int, int]:
        b = Block("toy", input_bytes=100)
        b.op("up", ["x"], [("u", 200)], grads=["x"])
        b.op("softmax", ["u"], [("p", 200)], saves=["p"], grads=["u"], holds=holds)
        r = simulate(b, "p")
        return r.forward_peak, r.backward_peak, r.input_grad

    freed, held = played(()), played(("x",))
    assert held[0] == freed[0] + 100  # x, u and p at once
    assert held[1:] == freed[1:]  # backward as before


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16"])
def test_eager_softmax_holds_its_masked_scores_until_the_statement_is_done(precision: str) -> None:
    """transformers' ``attn_weights = softmax(attn_weights, dtype=float32).to(dtype)``:
    the 16-bit masked scores, their fp32 copy and the fp32 probabilities are alive at
    once -- five 16-bit score matrices. Traced (Llama-2-7B's widths, frozen layers, 2 x
    2048 tokens): the forward peak at the softmax; it was 11-13 % low with the masked
    scores freed as soon as they were copied."""
    model = load_model("llama-2-7b")
    training = TrainingSpec(
        method="freeze", freeze=FreezeSpec(trainable=("lm_head",)), attention="eager",
        precision=precision, sequence_length=2048,
    )  # fmt: skip
    ctx = dataclasses.replace(make_ctx(model, training), batch=2)
    block = _direct(model, ctx, "dense", False, False)
    score = 2 * model.num_attention_heads * 2048 * 2048 * 2  # one 16-bit score matrix
    assert block.forward_peak >= 5 * score
    compiled = dataclasses.replace(ctx, compiled="layers")
    assert _direct(model, compiled, "dense", False, False).forward_peak < 5 * score


def test_falcons_softmax_takes_the_dtype_of_the_norms_output_not_the_residuals() -> None:
    """``softmax(scores + mask, dtype=hidden_states.dtype)``, where ``hidden_states`` is
    the attention's input, the LayerNorm's output: fp32 under autocast even where a
    16-bit frozen base makes the residual stream 16-bit (LoRA under bf16-mixed). Traced at
    Falcon-7B's widths, LoRA on q/v, eager, 2,048 tokens: MemFit was 34 % low with the
    probabilities in 16 bits."""
    model = load_model("falcon-7b")
    training = TrainingSpec(method="lora", attention="eager", precision="bf16-mixed",
                            sequence_length=2048)  # fmt: skip
    ctx = make_ctx(model, training)
    assert ctx.res == 2 and ctx.mode == "amp"
    block, _ = decoder_layer(model, dataclasses.replace(ctx, batch=1), True, False)
    probs = [t for op in block.ops if op.name == "softmax" for t, _ in op.outputs]
    assert [block.sizes[t] for t in probs] == [71 * 2048 * 2048 * 4]


def test_a_trained_head_tied_to_the_embedding_makes_an_fp32_residual_stream() -> None:
    """Under autocast a trained embedding is an fp32 weight, and so is a head tied to it:
    with only the head trained, the embedding's output, and the residual stream, are
    fp32 (traced: Falcon-7B's widths, eager, 2,048 tokens, was 26 % low as 16-bit)."""
    for name, tied in (("falcon-7b", True), ("llama-2-7b", False)):
        model = load_model(name)
        assert model.tie_word_embeddings is tied
        training = TrainingSpec(method="freeze", freeze=FreezeSpec(trainable=("lm_head",)))
        assert make_ctx(model, training).res == (4 if tied else 2)


def test_a_trained_head_tied_to_the_embedding_runs_the_embeddings_backward() -> None:
    """Training the head of a tied model trains the embedding, one tensor: the embedding's
    backward computes its dense gradient, summed into the head's (one buffer beside the
    other while it is added, in place: two, not three), and the layers record. Training
    "embeddings" or "lm_head" of a tied model is the same step."""

    def frozen(name: str, part: str) -> Estimate:
        trainable = FreezeSpec(trainable=(part,))
        return estimate(scenario(name, method="freeze", freeze=trainable, sequence_length=512))

    def embedding_backward(est: Estimate) -> list[Point]:
        return [p for p in est.timeline if p.phase == "backward" and p.label == "embedding"]

    assert not embedding_backward(frozen("llama-2-7b", "lm_head"))  # untied: no backward
    model = load_model("falcon-7b")
    (point,) = embedding_backward(frozen("falcon-7b", "lm_head"))
    assert point.gradients == model.vocab_size * model.hidden_size * 4  # fp32, autocast
    head, embeddings = frozen("falcon-7b", "lm_head"), frozen("falcon-7b", "embeddings")
    assert head.allocated_bytes == embeddings.allocated_bytes
    assert head.timeline == embeddings.timeline


@pytest.mark.parametrize(("name", "plain"), [("gpt2", True), ("bert-base-uncased", True),
                                             ("llama-3.2-1b", False)])  # fmt: skip
def test_gpt2_and_bert_run_their_softmax_in_the_scores_dtype(name: str, plain: bool) -> None:
    """``softmax(attn_weights, dim=-1)`` (GPT-2, BERT): 16-bit probabilities in pure bf16,
    and no fp32 copy of the scores; transformers' shared eager attention asks for fp32
    (``dtype=torch.float32``). Under autocast both run in fp32."""
    model = load_model(name)
    assert (model.eager_attention == "plain") is plain
    for precision, expected in (("bf16", 2 if plain else 4), ("bf16-mixed", 4)):
        training = TrainingSpec(attention="eager", precision=precision, sequence_length=256)
        ctx = make_ctx(model, training)
        layer = bert_layer if model.architecture == "encoder" else decoder_layer
        block, _ = (
            layer(model, ctx, True) if layer is bert_layer else layer(model, ctx, True, False)
        )
        (softmax,) = [t for op in block.ops if op.name == "softmax" for t, _ in op.outputs]
        heads = model.num_attention_heads
        assert block.sizes[softmax] == heads * 256 * 256 * expected, precision


def test_falcons_layers_hand_their_attention_weights_to_the_next_layers_forward() -> None:
    """``FalconModel`` keeps each layer's outputs, its attention weights among them, until
    the next layer returns. Checkpointed, a layer keeps nothing of its forward, so the
    second layer's forward holds the first's probabilities (fp32 under autocast) on top
    of its own working set; SDPA returns none, and a recorded layer has saved them."""

    def forwards(**training: object) -> list[int]:
        est = estimate(scenario("falcon-7b", method="lora", precision="bf16-mixed",
                                sequence_length=1024, **training))  # fmt: skip
        layers = [p for p in est.timeline if p.phase == "forward" and p.layer is not None]
        return [p.activations for p in layers]

    probs = 71 * 1024 * 1024 * 4
    kept = 1024 * 4544 * 2  # what the first layer keeps checkpointed: its 16-bit input
    eager = forwards(attention="eager", activation_checkpointing="full")
    assert eager[1] - eager[0] == probs + kept
    sdpa = forwards(attention="sdpa", activation_checkpointing="full")
    assert sdpa[1] - sdpa[0] < probs


def test_the_kv_cache_copies_the_values_out_of_a_fused_projection() -> None:
    """Pythia-1B (one fused q/k/v projection), fp32, eager attention, one token: with the
    KV cache transformers builds without checkpointing, the cache's copy of the values is
    what attention saves, and the projection is freed once RoPE has made q and k; without
    the cache, attention saves a view of the values, which keeps the whole projection --
    two more hidden-size tensors a layer. Selective recomputation runs without the cache
    (transformers turns it off under checkpointing), so at one token it keeps more than
    no checkpointing: the attention core it drops is 8 heads x 1 x 1 fp32 probabilities."""

    def per_layer(**training: object) -> set[int]:
        est = estimate(
            scenario(
                "pythia-1b", precision="fp32", sequence_length=1, attention="eager", **training
            )
        )
        layers = [p for p in est.timeline if p.phase == "forward" and p.layer is not None]
        return {b.activations - a.activations for a, b in itertools.pairwise(layers)}

    (cached,) = per_layer()
    (uncached,) = per_layer(kv_cache_in_outputs=False)
    (selective,) = per_layer(activation_checkpointing="selective")
    hidden = 2048 * 4
    assert uncached - cached == 2 * hidden
    assert selective == uncached - 8 * 1 * 1 * 4
    assert selective > cached
