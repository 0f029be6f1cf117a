"""Model-state bytes for every precision x optimizer x method, against hand-derived values.

The tiny model below is small enough to list every tensor by hand (shapes as nn.Linear
stores them, out x in). Expected bytes are computed here from that hand-written list with
the formulas written out in each helper -- independently of engine.params' inventory.
"""

import dataclasses
from math import ceil

import pytest

from memfit.engine.errors import EstimateError
from memfit.engine.model_state import lora_adapters, model_state, nf4_bytes
from memfit.engine.presets import load_model
from memfit.engine.specs import (
    METHODS,
    OPTIMIZERS,
    PRECISIONS,
    FreezeSpec,
    LoraSpec,
    ModelSpec,
    QuantSpec,
    TrainingSpec,
)
from tests.engine.helpers import tiny_model

TINY = tiny_model()
LAYERS = 2
# (name, shape, per layer?) of every tensor of TINY
BLOCK = [
    ("q_proj", (64, 64)),
    ("k_proj", (32, 64)),
    ("v_proj", (32, 64)),
    ("o_proj", (64, 64)),
    ("gate_proj", (128, 64)),
    ("up_proj", (128, 64)),
    ("down_proj", (64, 128)),
    ("input_norm", (64,)),
    ("post_norm", (64,)),
]
OUTSIDE = [("embed_tokens", (1000, 64)), ("final_norm", (64,)), ("lm_head", (1000, 64))]
LINEARS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def all_tensors() -> list[tuple[str, tuple[int, ...]]]:
    return [t for _ in range(LAYERS) for t in BLOCK] + OUTSIDE


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def state_bytes(optimizer: str, shape: tuple[int, ...], p: int) -> int:
    n = numel(shape)
    if optimizer == "adamw":
        return 2 * p * n  # exp_avg + exp_avg_sq in the param dtype
    if optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        # uint8 moments + one fp32 absmax per 256 elements each; fp32 under 4096 elements
        return 2 * n + 2 * 4 * ceil(n / 256) if n >= 4096 else 8 * n
    if optimizer == "sgd":
        return 0
    if optimizer in ("sgd-momentum", "lion"):
        return p * n
    if optimizer == "adafactor":  # factored: rows + cols for matrices, full for vectors
        return p * (shape[0] + shape[1]) if len(shape) == 2 else p * n
    raise AssertionError(optimizer)


def trainable_tensors(method: str) -> list[tuple[str, tuple[int, ...]]]:
    if method == "full":
        return all_tensors()
    if method in ("lora", "qlora"):  # r=8 on q_proj and v_proj: A (8 x in), B (out x 8)
        out = []
        for _ in range(LAYERS):
            out += [("q.A", (8, 64)), ("q.B", (64, 8)), ("v.A", (8, 64)), ("v.B", (32, 8))]
        return out
    if method == "freeze":  # lm_head and norms trainable
        return [
            t for t in all_tensors() if t[0] in ("lm_head", "final_norm", "input_norm", "post_norm")
        ]
    raise AssertionError(method)


def expected_bytes(precision: str, optimizer: str, method: str) -> dict[str, int]:
    p = 2 if precision == "bf16" else 4  # trainable weights and grads
    f = 4 if precision == "fp32" else 2  # frozen weights in the compute dtype
    trainable = trainable_tensors(method)
    n_train = sum(numel(s) for _, s in trainable)
    params = n_train * p
    if method == "lora":
        params += sum(numel(s) for _, s in all_tensors()) * f
    if method == "qlora":  # linears in NF4 (double quant, block 64), the rest in bf16
        for name, shape in all_tensors():
            n = numel(shape)
            if name in LINEARS:
                params += n // 2 + ceil(n / 64) + 4 * ceil(ceil(n / 64) / 256) + 4
            else:
                params += 2 * n
    if method == "freeze":
        frozen = [t for t in all_tensors() if t not in trainable]
        params += sum(numel(s) for _, s in frozen) * f
    optimizer_states = sum(state_bytes(optimizer, s, p) for _, s in trainable)
    return {"parameters": params, "gradients": n_train * p, "optimizer_states": optimizer_states}


def training(precision: str, optimizer: str, method: str) -> TrainingSpec:
    # adapters in the trainable weights' dtype (``auto``): bf16 under pure bf16
    return TrainingSpec(
        method=method,
        precision=precision,
        optimizer=optimizer,
        lora=LoraSpec(rank=8, targets=("q_proj", "v_proj"), adapter_dtype="auto"),
        freeze=FreezeSpec(trainable=("lm_head", "norms")),
    )


@pytest.mark.parametrize("precision", ["bf16", "bf16-mixed"])
def test_peft_keeps_adapters_in_fp32_and_lightning_its_frozen_base(precision: str) -> None:
    """The Trainer's stack (PEFT's ``autocast_adapter_dtype=True``) keeps adapters, their
    gradients and their AdamW moments in fp32 even on a pure-bf16 base; Lightning's
    ``bf16-mixed`` keeps the frozen base in fp32, its ``bf16-true`` in bf16."""
    lora = LoraSpec(rank=8, targets=("q_proj", "v_proj"))
    trainer = model_state(TINY, TrainingSpec(method="lora", precision=precision, lora=lora))
    auto = model_state(TINY, training(precision, "adamw", "lora"))
    n = trainer.trainable_params
    assert trainer.category_bytes("gradients") == 4 * n
    assert trainer.category_bytes("optimizer_states") == 8 * n
    extra = 0 if precision == "bf16-mixed" else 2 * n
    assert trainer.category_bytes("parameters") == auto.category_bytes("parameters") + extra
    lightning = model_state(
        TINY, TrainingSpec(method="lora", precision=precision, lora=lora, stack="lightning")
    )
    adapter = 4 if precision == "bf16-mixed" else 2  # Lightning: the module's own dtype
    frozen = lightning.category_bytes("parameters") - adapter * n
    base = auto.category_bytes("parameters") - adapter * n
    assert frozen == (2 * base if precision == "bf16-mixed" else base)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_combination_by_hand(precision: str, optimizer: str, method: str) -> None:
    state = model_state(TINY, training(precision, optimizer, method))
    expected = expected_bytes(precision, optimizer, method)
    for category, value in expected.items():
        assert state.category_bytes(category) == value, category
    if precision == "fp16-mixed":
        assert state.category_bytes("overhead") == 8  # GradScaler scale + growth tracker
    elif precision == "fp8-mixed":  # 14 linears x (3 x 1024 amax history + 6 scales) x 4 B
        assert state.category_bytes("overhead") == 14 * (3 * 1024 + 6) * 4
    else:
        assert state.category_bytes("overhead") == 0


@pytest.mark.parametrize(
    ("precision", "optimizer", "per_param"),
    [
        ("bf16-mixed", "adamw", 16),  # 4 weight + 4 grad + 8 Adam (fp32)
        ("fp16-mixed", "adamw", 16),
        ("fp32", "adamw", 16),
        ("bf16", "adamw", 8),  # 2 + 2 + 2 x 2
        ("bf16-mixed", "sgd", 8),
        ("bf16-mixed", "sgd-momentum", 12),
        ("bf16-mixed", "lion", 12),
    ],
)
def test_bytes_per_parameter_on_llama_3_8b(precision: str, optimizer: str, per_param: int) -> None:
    m = load_model("llama-3-8b")
    state = model_state(m, TrainingSpec(precision=precision, optimizer=optimizer))
    assert state.bytes_per_trainable_param == per_param
    assert state.total_bytes - state.category_bytes("overhead") == per_param * 8_030_261_248
    assert f"= {per_param} B per trainable parameter" in state.bytes_per_param_formula


def test_8bit_adam_is_about_2_bytes_per_parameter() -> None:
    state = model_state(load_model("llama-3-8b"), TrainingSpec(optimizer="adamw-8bit"))
    per = state.category_bytes("optimizer_states") / 8_030_261_248
    assert 2.03 < per < 2.04  # 2 B + 8 B per 256 elements, plus fp32 states for tiny tensors


@pytest.mark.parametrize(
    ("model", "rank", "targets", "expected"),
    [
        # PEFT print_trainable_parameters figures, re-derived: r (in + out) per layer
        ("llama-3-8b", 16, ("q_proj", "v_proj"), 32 * 16 * ((4096 + 4096) + (4096 + 1024))),
        ("llama-2-7b", 8, ("q_proj", "v_proj"), 4_194_304),
        ("llama-2-7b", 16, ("all-linear",), 39_976_960),
        ("mistral-7b-v0.1", 16, ("all-linear",), 41_943_040),
        # GPT-2's fused c_attn: one adapter of r (768 + 2304) per layer
        ("gpt2", 8, ("q_proj",), 12 * 8 * (768 + 3 * 768)),
        # Mixtral all-linear on transformers 5 (PEFT 0.21.2): the experts' 3-D gate_up_proj
        # (rank 2r, A 2r E x h, B 2f x 2r E) and down_proj (A r E x f, B h x r E) and the
        # router (A r x h, B E x r) wrapped as parameters
        (
            "mixtral-8x7b",
            8,
            ("all-linear",),
            32
            * (
                8 * ((4096 + 4096) * 2 + (4096 + 1024) * 2)
                + 2 * 8 * 8 * (4096 + 2 * 14336)
                + 8 * 8 * (14336 + 4096)
                + 8 * (4096 + 8)
            ),
        ),
    ],
)
def test_lora_adapter_counts(
    model: str, rank: int, targets: tuple[str, ...], expected: int
) -> None:
    spec = TrainingSpec(method="lora", lora=LoraSpec(rank=rank, targets=targets))
    assert model_state(load_model(model), spec).trainable_params == expected


def test_lora_target_missing_from_model_is_an_error() -> None:
    spec = TrainingSpec(method="lora", lora=LoraSpec(targets=("q_a_proj",)))
    with pytest.raises(EstimateError, match=r"training\.lora\.targets: q_a_proj match no"):
        model_state(load_model("llama-3-8b"), spec)


def test_lora_target_missing_beside_a_match_is_a_warning() -> None:
    # like PEFT: v_proj does not exist in MLA attention, q_proj does
    state = model_state(load_model("deepseek-v2-lite"), TrainingSpec(method="lora"))
    assert state.warnings == ("LoRA target v_proj matches no layer of deepseek-v2-lite",)
    assert state.trainable_params == 27 * 16 * (2048 + 16 * 192)


def test_nf4_storage_by_hand() -> None:
    n = 4096 * 4096
    # 4 bit per weight + fp32 absmax per 64: 0.5 extra bit per parameter
    assert nf4_bytes(n, 64, double_quant=False) == n // 2 + 4 * (n // 64)
    # double quantization: 8-bit absmax per 64, fp32 per 256 blocks, one fp32 offset
    assert nf4_bytes(n, 64, double_quant=True) == n // 2 + n // 64 + 4 * (n // 64 // 256) + 4
    bits = 8 * nf4_bytes(n, 64, True) / n
    assert abs(bits - 4.127) < 0.001  # the QLoRA paper's 4.127 bits per parameter


def test_qlora_llama_3_8b_storage() -> None:
    m = load_model("llama-3-8b")
    spec = TrainingSpec(method="qlora", lora=LoraSpec(rank=16, targets=("all-linear",)))
    state = model_state(m, spec)
    embed = 2 * 128_256 * 4096  # embeddings and LM head stay in bf16
    norms = 32 * 2 * 4096 + 4096
    quantized = 8_030_261_248 - embed - norms
    frozen = next(i for i in state.items if i.name.startswith("frozen"))
    assert frozen.bytes == 2 * (embed + norms)
    nf4 = next(i for i in state.items if i.name.startswith("NF4"))
    assert abs(nf4.bytes * 8 / quantized - 4.127) < 0.001
    assert state.trainable_params == 41_943_040


def test_qlora_without_double_quant_costs_half_a_bit_more() -> None:
    m = load_model("llama-2-7b")
    dq = model_state(m, TrainingSpec(method="qlora"))
    plain = model_state(m, TrainingSpec(method="qlora", qlora=QuantSpec(double_quant=False)))
    extra_bits = 8 * (plain.frozen_param_bytes - dq.frozen_param_bytes)
    linear = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    assert abs(extra_bits / linear - (0.5 - 0.127)) < 0.001


def test_freeze_last_layers() -> None:
    spec = TrainingSpec(method="freeze", freeze=FreezeSpec(trainable=(), last_layers=1))
    state = model_state(TINY, spec)
    per_layer = sum(numel(s) for _, s in BLOCK)
    assert state.trainable_params == per_layer


def test_freeze_nothing_is_an_error() -> None:
    spec = TrainingSpec(method="freeze", freeze=FreezeSpec(trainable=(), last_layers=0))
    with pytest.raises(EstimateError, match="nothing is trainable"):
        model_state(TINY, spec)


def test_tied_lm_head_trains_the_embedding() -> None:
    m = load_model("gpt2")
    spec = TrainingSpec(method="freeze", freeze=FreezeSpec(trainable=("lm_head",)))
    assert model_state(m, spec).trainable_params == 50257 * 768


def test_fused_optimizer_keeps_step_counters_on_device() -> None:
    fused = model_state(TINY, TrainingSpec(optimizer_impl="fused"))
    foreach = model_state(TINY, TrainingSpec(optimizer_impl="foreach"))
    tensors = len(all_tensors())
    assert fused.total_bytes - foreach.total_bytes == 4 * tensors


def test_trillion_parameter_model_bytes_stay_exact_integers() -> None:
    m = ModelSpec(
        name="huge",
        num_layers=128,
        hidden_size=32768,
        num_attention_heads=256,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=0,
        vocab_size=256000,
        num_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=4096,
    )
    state = model_state(m, TrainingSpec())
    assert state.total_params > 10**12
    assert all(type(i.bytes) is int for i in state.items)
    assert state.total_bytes == 16 * state.total_params


def test_paged_8bit_states_live_in_unified_memory() -> None:
    """bitsandbytes' paged optimizers allocate their states with cudaMallocManaged, outside
    PyTorch's allocator: the driver evicts them to the host under pressure, and each step
    prefetches one parameter's states before updating it. So they are no part of the
    allocated peak but of the host memory they may be evicted to, and the optimizer step
    holds the largest parameter's states on the GPU."""
    from memfit.engine.estimate import Estimate, estimate
    from memfit.engine.params import model_tensors
    from memfit.engine.presets import load_gpu
    from memfit.engine.specs import HardwareSpec, Scenario, TrainingSpec

    def run(optimizer: str) -> Estimate:
        training = TrainingSpec(optimizer=optimizer, precision="bf16", micro_batch_size=1)
        return estimate(Scenario(load_model("llama-3.2-1b"),
                                 HardwareSpec(load_gpu("h100-sxm-80gb")), training))  # fmt: skip

    plain, paged = run("adamw-8bit"), run("paged-adamw-8bit")
    states = plain.breakdown["optimizer_states"]
    assert states > 0 and paged.host_bytes == plain.host_bytes + states
    assert any("paged" in i.name for i in paged.host_items)
    step, after = (p for p in paged.timeline if p.phase == "optimizer")
    model = load_model("llama-3.2-1b")
    largest = max(g.numel for g in model_tensors(model))
    prefetched = 2 * largest + 8 * -(-largest // 256)
    assert step.optimizer_states - after.optimizer_states == prefetched
    assert paged.allocated_bytes < plain.allocated_bytes


@pytest.mark.parametrize("model", ["llama-3.2-1b", "llama-2-7b"])  # tied, untied head
def test_lora_on_the_lm_head_adds_its_adapter_when_named(model: str) -> None:
    """``lm_head`` as a target adapts the output layer, tied or not (PEFT wraps the
    module): A is r x hidden, B vocab x r. ``all-linear`` leaves it out, as PEFT does."""
    m = load_model(model)
    plain = model_state(m, TrainingSpec(method="lora", lora=LoraSpec(targets=("q_proj",))))
    named = TrainingSpec(method="lora", lora=LoraSpec(targets=("q_proj", "lm_head")))
    head = 16 * (m.hidden_size + m.vocab_size)
    assert model_state(m, named).trainable_params == plain.trainable_params + head
    every = TrainingSpec(method="lora", lora=LoraSpec(targets=("all-linear",)))
    both = TrainingSpec(method="lora", lora=LoraSpec(targets=("all-linear", "lm_head")))
    assert model_state(m, both).trainable_params == model_state(m, every).trainable_params + head


def test_lora_on_the_lm_head_with_a_fused_loss_is_refused() -> None:
    """A fused linear cross-entropy reads the head's weight, never its adapter."""
    lora = LoraSpec(targets=("q_proj", "lm_head"))
    with pytest.raises(EstimateError) as err:
        model_state(
            load_model("llama-3.2-1b"), TrainingSpec(method="lora", lora=lora, loss="chunked")
        )
    assert err.value.field == "training.lora.targets"
    assert "lm_head" in str(err.value)


@pytest.mark.parametrize("model", ["llama-3.2-1b", "llama-2-7b"])  # tied, untied head
@pytest.mark.parametrize("saved", ["lm_head", "embed_tokens"])
def test_modules_to_save_train_a_copy_in_the_base_dtype(model: str, saved: str) -> None:
    """PEFT's ``modules_to_save`` deep-copies the module (a tied head's copy is its own
    vocab x hidden matrix) and trains the copy in the base's dtype, beside fp32 adapters:
    its weight, gradient and AdamW's two moments, 2 bytes each under bf16-mixed."""
    m = load_model(model)
    plain = TrainingSpec(method="lora", precision="bf16-mixed")
    named = TrainingSpec(
        method="lora", precision="bf16-mixed", lora=LoraSpec(modules_to_save=(saved,))
    )
    base, with_copy = model_state(m, plain), model_state(m, named)
    n = m.vocab_size * m.hidden_size
    assert with_copy.trainable_params == base.trainable_params + n
    assert with_copy.total_params == base.total_params + n
    for category in ("parameters", "gradients"):
        assert with_copy.category_bytes(category) == base.category_bytes(category) + 2 * n
    assert with_copy.category_bytes("optimizer_states") == (
        base.category_bytes("optimizer_states") + 4 * n
    )


def test_modules_to_save_accepts_the_head_and_the_embedding_only() -> None:
    with pytest.raises(EstimateError) as err:
        LoraSpec(modules_to_save=("score",))
    assert err.value.field == "training.lora.modules_to_save"
    assert "lm_head, embed_tokens" in str(err.value)
    with pytest.raises(EstimateError) as err:
        LoraSpec(modules_to_save=("lm_head", "lm_head"))
    assert err.value.field == "training.lora.modules_to_save"
    both = LoraSpec(targets=("q_proj", "lm_head"), modules_to_save=("lm_head",))
    with pytest.raises(EstimateError) as err:
        model_state(load_model("llama-2-7b"), TrainingSpec(method="lora", lora=both))
    assert err.value.field == "training.lora.modules_to_save"


def test_lora_on_transformers_fused_experts_wraps_their_parameters() -> None:
    """PEFT adapts transformers' 3-D experts as parameters: one A (r E x in) and B
    (out x r E) per parameter, ``gate_up_proj`` at rank 2r, and under all-linear the
    router (A r x hidden, B E x r); per layer of Qwen3-30B-A3B at r 16, 20,482,048 beside
    the attention's 278,528 (q, k, v, o; traced: 41,521,152 at two layers)."""
    m = dataclasses.replace(load_model("qwen3-30b-a3b"), num_layers=2)
    every = TrainingSpec(method="lora", lora=LoraSpec(targets=("all-linear",)))
    r, h, f, e = 16, m.hidden_size, m.moe_intermediate_size, m.num_experts
    per_layer = 2 * r * e * (h + 2 * f) + r * e * (f + h) + r * (h + e)
    assert per_layer == 20_482_048
    assert model_state(m, every).trainable_params == 2 * (per_layer + 278_528) == 41_521_152
    named = LoraSpec(targets=("q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"))
    state = model_state(m, TrainingSpec(method="lora", lora=named))
    assert state.trainable_params == 2 * (per_layer - r * (h + e) + 139_264)  # q, v
    alone = LoraSpec(targets=("q_proj", "gate_proj"))
    with pytest.raises(EstimateError) as err:
        model_state(m, TrainingSpec(method="lora", lora=alone))
    assert err.value.field == "training.lora.targets"
    assert "gate_up_proj" in str(err.value)


def test_fused_experts_take_the_mlp_targets_from_the_linear_mlps() -> None:
    """PEFT moves the MLP names (gate_proj, up_proj, down_proj) from the modules targeted
    to the experts' parameters: DeepSeek's dense first layer and shared experts, plain
    ``nn.Linear`` MLPs, get no adapter; the attention keeps its own."""
    m = load_model("deepseek-v2-lite")
    every = TrainingSpec(method="lora", lora=LoraSpec(targets=("all-linear",)))
    adapters = lora_adapters(m, every)
    assert {g.component for g in adapters} == {"attention", "experts", "router"}
    mixed = {g.module for g in adapters if g.component == "experts"}
    assert mixed == {f"experts.{p}.lora_{x}" for p in ("gate_up_proj", "down_proj") for x in "AB"}
