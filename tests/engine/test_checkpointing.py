"""Activation checkpointing of layers that autograd does not record: non-reentrant
``torch.utils.checkpoint`` keeps a layer's input only through what the layer saves for
backward, so a layer whose input needs no gradient and none of whose weights train keeps
nothing, checkpointed or not, and is not run again in backward."""

from typing import Any

from memfit.engine.estimate import estimate
from memfit.engine.specs import Scenario
from memfit.engine.stacks import built
from memfit.engine.timeline import embedding_output_grad
from tests.engine.helpers import preset_scenario
from tests.engine.invariants import (
    _peak_activations,
    check_checkpointing,
    checkpointing_requires_input_grad,
)

#: LitGPT's model (the lightning stack) with only its LM head trained: LitGPT never ties
#: the head to the embedding, so nothing before the head needs a gradient
FROZEN_BODY = {
    "method": "freeze",
    "freeze": {"trainable": ["lm_head"]},
    "stack": "lightning",
}


def frozen_body(model: str, **training: Any) -> Scenario:
    return preset_scenario(model, "h100-sxm-80gb", {**FROZEN_BODY, **training})


def recomputed(scenario: Scenario) -> int:
    """How many layers the step runs again in backward."""
    return sum(p.label == "recompute" for p in estimate(scenario).timeline)


def test_more_checkpointing_never_raises_activations_on_a_frozen_body() -> None:
    training = {
        "method": "freeze",
        "freeze": {"trainable": ["lm_head"]},
        "precision": "fp8-mixed",
        "stack": "lightning",
        "loss": "no-upcast",
        "attention": "flash",
        "sequence_length": 512,
    }
    s = preset_scenario("falcon-7b", "h100-sxm-80gb", training)
    assert not checkpointing_requires_input_grad(s)  # the invariant applies
    check_checkpointing(s, estimate(s))


def test_a_checkpointed_layer_that_records_nothing_keeps_nothing() -> None:
    """Falcon 7B and Gemma 2B on LitGPT's model, only the head trained: every way of
    checkpointing the body plays the step that no checkpointing plays -- the layers keep
    neither their inputs (32 of them, 149 MB, on Falcon at sequence 512) nor, under
    every-k-layers, what the layers between the checkpointed ones would save if their
    input needed a gradient (9.7 GB on Gemma 2B) -- and none is recomputed."""
    falcon = {"precision": "fp8-mixed", "loss": "no-upcast", "attention": "flash"}
    gemma = {
        "precision": "fp16-mixed",
        "loss": "chunked-output",
        "micro_batch_size": 8,
        "sequence_length": 2048,
    }
    for model, training in (("falcon-7b", falcon), ("gemma-2b", gemma)):
        none = estimate(frozen_body(model, activation_checkpointing="none", **training))
        for mode in ("full", "every-k-layers", "first-k-layers", "per-op"):
            s = frozen_body(model, activation_checkpointing=mode, checkpoint_every_k=2, **training)
            assert recomputed(s) == 0, (model, mode)
            assert _peak_activations(estimate(s)) == _peak_activations(none), (model, mode)


def test_only_transformers_checkpointing_makes_a_frozen_embeddings_output_require_grad() -> None:
    """transformers' ``activation_checkpointing_enable`` calls
    ``enable_input_require_grads``: the frozen embedding's output requires grad, and every
    layer is recorded and recomputed. LitGPT's model has no such hook: with LoRA every
    layer trains and is recomputed all the same, but the embedding's output needs no
    gradient."""
    for stack, hooked in (("hf-trainer", True), ("lightning", False)):
        for method in ("lora", "freeze"):
            training = {
                "method": method,
                "freeze": {"trainable": ["lm_head"]},
                "stack": stack,
                "activation_checkpointing": "full",
            }
            s = built(preset_scenario("llama-2-7b", "h100-sxm-80gb", training))
            assert embedding_output_grad(s.model, s.training, True, True) is hooked
            layers = s.model.num_layers if hooked or method == "lora" else 0
            assert recomputed(s) == layers, (stack, method)


def test_only_layers_that_keep_their_input_offload_it() -> None:
    """Activation offload moves the inputs checkpointed layers keep to host memory: a
    frozen body on LitGPT's model keeps none; with LoRA every layer keeps its input."""
    offload = {"activation_checkpointing": "full", "offload": {"activations": "cpu"}}
    assert estimate(frozen_body("llama-2-7b", **offload)).host_bytes == 0
    lora = frozen_body("llama-2-7b", **offload, method="lora")
    tokens, hidden, fp32 = 2048, 4096, 4
    assert lora.training.micro_batch_size == 1 and lora.training.sequence_length == tokens
    host = {i.name: i.bytes for i in estimate(lora).host_items}
    assert host == {
        "checkpointed layer inputs (offloaded to CPU, pinned)": 32 * tokens * hidden * fp32
    }


def test_a_layer_autograd_does_not_record_is_not_recomputed_in_time_either() -> None:
    """The step time recomputes the layers the memory walk plays as checkpointed: a frozen
    body on LitGPT's model runs no forward again under full checkpointing (the same time as
    without it), while the same body built by transformers, whose checkpointing makes the
    embedding's output require grad, recomputes every layer."""
    from memfit.engine.steptime import step_time

    def times(**training: Any) -> tuple[float, float]:
        none = step_time(frozen_body("llama-3-8b", **training)).step_time_s
        full = step_time(
            frozen_body("llama-3-8b", activation_checkpointing="full", **training)
        ).step_time_s
        return none, full

    none, full = times()
    assert recomputed(frozen_body("llama-3-8b", activation_checkpointing="full")) == 0
    assert full == none
    none, full = times(stack="hf-trainer")
    assert full > none


def test_a_checkpointed_qlora_layer_keeps_what_its_4_bit_matmuls_keep_on_their_ctx() -> None:
    """bitsandbytes' 4-bit matmul before 0.43.2 (LitGPT's 0.42) keeps its 16-bit input on its
    ``ctx``, not through ``save_for_backward``: non-reentrant checkpointing cannot drop it,
    so each checkpointed layer keeps those inputs beside its own from the forward to its
    backward. Later versions keep only the 4-bit weight: a checkpointed layer keeps its
    input alone, as LoRA's does (traced on transformers: dataset_conventions.json)."""
    from memfit.engine.layers import decoder_layer
    from memfit.engine.timeline.blocks import function_kept
    from memfit.engine.timeline.context import make_ctx

    base = {"lora": {"targets": ["all-linear"]}, "activation_checkpointing": "full",
            "micro_batch_size": 2, "sequence_length": 1024}  # fmt: skip
    steps, kept = {}, {}
    for stack in ("hf-trainer", "lightning"):
        for method in ("lora", "qlora"):
            training = {"method": method, "stack": stack, **base}
            s = built(preset_scenario("llama-3.2-1b", "h100-sxm-80gb", training))
            forward = [p for p in estimate(s).timeline if p.phase == "forward"]
            layers = [p for p in forward if p.label == "layer"]
            steps[stack, method] = layers[2].activations - layers[1].activations
            ctx = make_ctx(s.model, s.training)
            hidden = ctx.tokens * s.model.hidden_size * ctx.res
            kept[stack, method] = function_kept(decoder_layer(s.model, ctx, True, False)[0])
            assert steps[stack, method] == hidden + kept[stack, method], (stack, method)
    assert kept["lightning", "qlora"] > 0  # LitGPT's bitsandbytes keeps the inputs
    assert kept["hf-trainer", "qlora"] == kept["hf-trainer", "lora"] == 0
    assert steps["hf-trainer", "qlora"] == steps["hf-trainer", "lora"]


def test_reentrant_checkpointing_keeps_nothing_a_4_bit_matmul_keeps_on_its_ctx() -> None:
    """Reentrant checkpointing (``use_reentrant=True``) runs a layer's forward without
    autograd: no custom function keeps anything there, so a checkpointed layer keeps its
    input alone even where the 4-bit matmul keeps its own (bitsandbytes before 0.43.2);
    the recomputation's kept inputs go with the recomputed graph, as under the
    non-reentrant one (traced: dataset_conventions.json's ``ckpt-reentrant`` cases)."""
    base = {"method": "qlora", "lora": {"targets": ["all-linear"]},
            "activation_checkpointing": "full", "micro_batch_size": 2,
            "sequence_length": 1024}  # fmt: skip
    steps, peaks = {}, {}
    for keeps in (False, True):
        for reentrant in (False, True):
            training = {**base, "qlora": {"matmul_keeps_input": keeps},
                        "reentrant_checkpointing": reentrant}  # fmt: skip
            s = built(preset_scenario("llama-3.2-1b", "h100-sxm-80gb", training))
            est = estimate(s)
            layers = [p for p in est.timeline if p.phase == "forward" and p.label == "layer"]
            steps[keeps, reentrant] = layers[2].activations - layers[1].activations
            peaks[keeps, reentrant] = est.allocated_bytes
    hidden = 2 * 1024 * 2048 * 2
    assert steps[True, False] > hidden  # the kept inputs outlive non-reentrant checkpoints
    assert steps[True, True] == steps[False, True] == steps[False, False] == hidden
    assert peaks[True, True] == peaks[False, True] == peaks[False, False] < peaks[True, False]
