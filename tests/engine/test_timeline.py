"""The step timeline and the per-layer activations, against hand-derived sums."""

import dataclasses

from engine.estimate import estimate
from engine.graph import simulate
from engine.layers import Ctx, decoder_layer
from engine.presets import load_gpu, load_model, model_names
from engine.specs import HardwareSpec, Scenario, TrainingSpec
from tests.engine.helpers import full_ctx, tiny_model

TINY = tiny_model(num_key_value_heads=4)
B, S = 2, 96


def ctx(**changes: object) -> Ctx:
    return full_ctx(batch=B, seq=S, **changes)


def test_fp32_llama_layer_keeps_what_autograd_saves() -> None:
    t, h, i, q = B * S, 64, 128, 64
    block, out = decoder_layer(TINY, ctx(), True, False)
    result = simulate(block, out)
    lse = 4 * B * 4 * (-(-S // 32) * 32)  # memory-efficient kernel, fp32, padded to 32
    expected = (
        4 * t * h * 3  # layer input (kept by pow), normalized x (by the weight mul), norm out
        + 4 * t * 2  # two rsqrt outputs
        + 4 * t * q * 2  # rotated q, attention output
        + 4 * t * q * 2  # rotated k, v (MHA: as wide as q)
        + lse
        + 4 * t * h * 3  # residual, its normalized x, second norm out
        + 4 * t * i * 4  # gate, silu(gate), up, silu(gate) * up
    )
    assert result.kept == expected
    assert result.output == 4 * t * h


def test_autocast_keeps_a_16_bit_copy_of_every_layer_weight() -> None:
    block, _ = decoder_layer(TINY, ctx(mode="amp"), True, False)
    copies = sum(n for name, n in block.sizes.items() if name.startswith("wcast"))
    layer_linears = 4 * 64 * 64 + 3 * 64 * 128
    assert copies == 2 * layer_linears


def test_eager_attention_keeps_the_s_by_s_terms() -> None:
    sdpa = simulate(*decoder_layer(TINY, ctx(), True, False))
    eager = simulate(*decoder_layer(TINY, ctx(attention="eager"), True, False))
    scores = B * 4 * S * S
    lse = 4 * B * 4 * (-(-S // 32) * 32)
    # fp32: the softmax output kept by softmax and by the matmul with v (same tensor),
    # minus what the fused kernel kept instead (its output and log-sum-exp)
    assert eager.kept - sdpa.kept == 4 * scores - lse


def scenario(**training: object) -> Scenario:
    return Scenario(
        load_model("llama-3-8b"), HardwareSpec(load_gpu("h100-sxm-80gb")), TrainingSpec(**training)
    )  # type: ignore[arg-type]


def test_peak_breakdown_adds_up_and_names_its_moment() -> None:
    est = estimate(scenario(method="lora", micro_batch_size=2, sequence_length=4096))
    peak = max(est.timeline, key=lambda p: p.total)
    assert est.peak_phase == peak.phase and est.peak_layer == peak.layer
    modelled = sum(
        i.bytes for i in est.items if i.category != "overhead" or i.name.startswith(("loss", "fp8"))
    )
    assert modelled == peak.total == est.allocated_bytes


def test_checkpointing_and_chunked_loss_lower_the_peak() -> None:
    plain = estimate(scenario(micro_batch_size=4, sequence_length=4096))
    full = estimate(
        scenario(micro_batch_size=4, sequence_length=4096, activation_checkpointing="full")
    )
    every = estimate(
        scenario(
            micro_batch_size=4,
            sequence_length=4096,
            activation_checkpointing="every-k-layers",
            checkpoint_every_k=4,
        )
    )
    chunked = estimate(scenario(micro_batch_size=4, sequence_length=4096, loss="chunked"))
    assert full.allocated_bytes < every.allocated_bytes < plain.allocated_bytes
    assert chunked.allocated_bytes < plain.allocated_bytes


def test_fused_adamw_has_no_foreach_temporary() -> None:
    foreach = estimate(scenario(micro_batch_size=1, sequence_length=128))
    fused = estimate(scenario(micro_batch_size=1, sequence_length=128, optimizer_impl="fused"))
    assert foreach.peak_phase == "optimizer"
    temp = next(i for i in foreach.items if i.name.startswith("optimizer temporaries"))
    assert temp.bytes == 4 * 8_030_261_248
    assert fused.allocated_bytes < foreach.allocated_bytes


def test_totals_grow_from_allocated_to_device() -> None:
    est = estimate(scenario(method="lora"))
    overhead = {i.name: i.bytes for i in est.items if i.category == "overhead"}
    assert est.reserved_bytes - est.allocated_bytes == (
        overhead["allocator rounding (2 MiB blocks)"] + overhead["allocator fragmentation"]
    )
    assert est.device_bytes - est.reserved_bytes == (
        overhead["CUDA context"] + overhead["cuBLAS workspace"]
    )


def test_mla_layer_estimates() -> None:
    s = Scenario(
        load_model("deepseek-v2-lite"),
        HardwareSpec(load_gpu("h100-sxm-80gb")),
        TrainingSpec(
            method="lora", lora=dataclasses.replace(TrainingSpec().lora, targets=("all-linear",))
        ),
    )
    est = estimate(s)
    assert est.breakdown["activations"] > 0


def test_the_family_label_changes_nothing() -> None:
    """The layers are built from the spec's explicit fields, never from its family label:
    relabelling a preset (GPT-2 as "custom" lost its Python-written GELU, -27 %) leaves
    every byte of the estimate as it was."""
    gpu = HardwareSpec(load_gpu("h100-sxm-80gb"))
    for name in model_names():
        model = load_model(name)
        for training in (TrainingSpec(micro_batch_size=2), TrainingSpec(attention="eager")):
            as_is = estimate(Scenario(model, gpu, training))
            relabelled = estimate(Scenario(dataclasses.replace(model, family="x"), gpu, training))
            assert relabelled.items == as_is.items, name


def test_backward_never_produces_more_gradient_than_the_model_state_holds() -> None:
    """The gradients backward leaves are the trainable tensors' own, in their dtype: LoRA's
    adapters are 16-bit on a pure bf16 model, so their gradients are too (they were
    counted in fp32, twice the model state's)."""
    from engine.model_state import model_state
    from engine.timeline import step_timeline

    model = load_model("llama-3.2-1b")
    for precision in ("bf16", "bf16-mixed", "fp32"):
        for method in ("lora", "qlora", "full"):
            training = TrainingSpec(method=method, precision=precision, micro_batch_size=2)
            state = model_state(model, training)
            timeline = step_timeline(model, training, state)
            produced = max(p.gradients for p in timeline.points if p.phase == "backward")
            assert produced <= state.category_bytes("gradients"), (precision, method)
