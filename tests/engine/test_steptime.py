"""The step-time model: FLOP counts against the standard formulas, and what each
setting does to the time."""

from __future__ import annotations

import dataclasses

import pytest

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.layers import Ctx
from memfit.engine.params import count_parameters, model_tensors
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.scenario_io import scenario_from_dict, scenario_to_dict
from memfit.engine.specs import (
    HardwareSpec,
    LoraSpec,
    OffloadSpec,
    ParallelismSpec,
    Scenario,
    TrainingSpec,
)
from memfit.engine.steptime import BOUNDS, step_time


def scenario(model: str = "llama-3-8b", gpu: str = "h100-sxm-80gb", gpus: int = 1,
             nodes: int = 1, **training: object) -> Scenario:  # fmt: skip
    par = training.pop("parallelism", ParallelismSpec())
    return Scenario(
        load_model(model),
        HardwareSpec(load_gpu(gpu), gpus_per_node=gpus, nodes=nodes),
        TrainingSpec(parallelism=par, **training),  # type: ignore[arg-type]
    )


def with_training(s: Scenario, **fields: object) -> Scenario:
    return dataclasses.replace(s, training=dataclasses.replace(s.training, **fields))  # type: ignore[arg-type]


def matmul_params(name: str) -> int:
    """Every weight a token multiplies: the linear layers and the LM head (the tied
    embedding counted as the head it is), not the embedding lookup, norms or biases."""
    m = load_model(name)
    n = sum(g.total for g in model_tensors(m) if g.matrix)
    return n + (m.vocab_size * m.hidden_size if m.tie_word_embeddings else 0)


@pytest.mark.parametrize("name", ["llama-3-8b", "gpt2", "qwen2.5-7b"])
def test_model_flops_are_6n_per_token_plus_causal_attention(name: str) -> None:
    """Kaplan et al. 2020 / PaLM appendix B: 6 N per token for the matmuls, plus
    attention: per layer, QK^T and AV each 2 s h per token forward (h = heads x
    head_dim), over the causal half of the keys, (s + 1)/2 on average: 6 (s + 1) h l
    for forward and backward."""
    b, s = 2, 2048
    sc = scenario(name, micro_batch_size=b, sequence_length=s, attention="flash")
    m = sc.model
    h_attn = m.num_attention_heads * m.head_dim
    expected = b * s * (6 * matmul_params(name) + 6 * (s + 1) * h_attn * m.num_layers)
    assert step_time(sc).model_flops == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("attention", ["sdpa", "flash", "eager"])
def test_the_attention_kernel_memory_walks_is_the_one_time_prices(attention: str) -> None:
    """Falcon 7B's module calls SDPA with one unrepeated key/value head and a mask, so CUDA
    runs SDPA's math fallback: fp32 scores held for backward (memory) and computed at the
    fp32 rate (time). Each attention setting costs time in the order it costs memory, and
    the fallback is slower than both flash and eager (it is eager in fp32)."""
    times, activations = {}, {}
    for kind in ("sdpa", "flash", "eager"):
        s = scenario("falcon-7b", micro_batch_size=8, sequence_length=2048, attention=kind)
        times[kind] = step_time(s).step_time_s
        items = estimate(s).items
        activations[kind] = sum(i.bytes for i in items if i.category == "activations")
    assert load_model("falcon-7b").sdpa_math
    assert times["sdpa"] > times["eager"] > times["flash"]
    assert activations["eager"] > activations["sdpa"] > activations["flash"]
    # a model whose SDPA runs a fused kernel: on an A100 SDPA runs FlashAttention-2, the
    # same time as flash; on Hopper it runs cuDNN's kernel, faster than FlashAttention-2
    for gpu, faster in (("a100-sxm-80gb", False), ("h100-sxm-80gb", True)):
        llama = scenario(gpu=gpu, micro_batch_size=8, sequence_length=2048)
        flash = with_training(llama, attention="flash")
        sdpa_s, flash_s = step_time(llama).step_time_s, step_time(flash).step_time_s
        assert sdpa_s < flash_s if faster else sdpa_s == flash_s
    assert (
        times[attention]
        == step_time(
            scenario("falcon-7b", micro_batch_size=8, sequence_length=2048, attention=attention)
        ).step_time_s
    )


def test_full_recomputation_adds_one_forward() -> None:
    """Korthikanti et al. 2022, section 5: full recomputation runs every layer's forward
    twice: hardware FLOPs = model FLOPs + one forward of the layers (not the LM head)."""
    base = scenario(micro_batch_size=1, sequence_length=2048)
    ckpt = with_training(base, activation_checkpointing="full")
    t0, t1 = step_time(base), step_time(ckpt)
    assert t1.model_flops == t0.model_flops
    m, s = base.model, 2048
    head = 2 * s * m.vocab_size * m.hidden_size
    forward = (t0.model_flops - 3 * head) / 3  # forward of the layers alone
    assert t1.hardware_flops - t0.hardware_flops == pytest.approx(forward, rel=1e-9)
    assert 1.2 < t1.step_time_s / t0.step_time_s < 1.4


def test_lora_skips_the_frozen_weight_gradients() -> None:
    """Forward 2N, backward only the input gradients (2N) of the frozen base: 4N per
    token, plus the adapters' own 6 x 2 r (in + out) per target."""
    full = step_time(scenario(method="full"))
    lora = step_time(scenario(method="lora"))
    ratio = lora.model_flops / full.model_flops
    assert 0.66 < ratio < 0.68
    assert lora.step_time_s < full.step_time_s


def test_qlora_pays_for_dequantization() -> None:
    lora, qlora = step_time(scenario(method="lora")), step_time(scenario(method="qlora"))
    assert qlora.model_flops == lora.model_flops
    assert qlora.step_time_s > lora.step_time_s


def test_mixed_precision_is_faster_than_fp32() -> None:
    assert (
        step_time(scenario(precision="bf16-mixed")).step_time_s
        < 0.5 * step_time(scenario(precision="fp32")).step_time_s
    )


def test_tensor_parallel_pays_all_reduces_inside_a_node_and_more_across() -> None:
    tp8 = scenario("llama-3.1-70b", gpus=8, parallelism=ParallelismSpec(tp=8), sequence_length=4096)
    kinds = step_time(tp8).by_kind()
    assert kinds["communication"] > 0
    # the same layout spread over 8 nodes of one GPU: the all-reduces leave NVLink
    spread = dataclasses.replace(
        tp8, hardware=HardwareSpec(load_gpu("h100-sxm-80gb"), 1, 8, network="ethernet-100g")
    )
    assert step_time(spread).by_kind()["communication"] > 5 * kinds["communication"]


def test_pipeline_bubble_shrinks_with_more_micro_batches_and_virtual_stages() -> None:
    def bubble(micro: int, vpp: int = 1) -> float:
        schedule = "interleaved-1f1b" if vpp > 1 else "1f1b"
        par = ParallelismSpec(pp=4, vpp=vpp, pp_schedule=schedule)
        s = scenario(gpus=4, parallelism=par, gradient_accumulation_steps=micro)
        t = step_time(s)
        return t.by_kind()["pipeline_bubble"] / t.step_time_s

    assert bubble(4) > bubble(16) > 0
    assert bubble(8, vpp=2) < bubble(8)


def test_offload_is_a_host_transfer_and_costs_time() -> None:
    zero = ParallelismSpec(zero_stage=2, framework="deepspeed")
    base = scenario(gpus=8, parallelism=zero)
    off = with_training(base, offload=OffloadSpec(optimizer="cpu"))
    assert step_time(off).by_kind()["host_transfer"] > 0
    assert step_time(off).step_time_s > step_time(base).step_time_s


def test_zero3_gathers_cost_more_across_slow_networks() -> None:
    par = ParallelismSpec(zero_stage=3)
    fast = scenario(gpus=8, nodes=4, parallelism=par)
    slow = dataclasses.replace(
        fast, hardware=dataclasses.replace(fast.hardware, network="ethernet-25g")
    )
    assert step_time(slow).step_time_s > step_time(fast).step_time_s
    assert any("network" in a for a in step_time(fast).assumptions)
    given = dataclasses.replace(
        fast, hardware=dataclasses.replace(fast.hardware, network_gb_s=3.125)
    )
    assert step_time(given).step_time_s == pytest.approx(step_time(slow).step_time_s)
    assert not step_time(given).assumptions


def test_outputs_are_consistent() -> None:
    s = scenario(gpus=8, micro_batch_size=2, gradient_accumulation_steps=4,
                 parallelism=ParallelismSpec(zero_stage=3))  # fmt: skip
    t = step_time(s)
    assert t.tokens_per_step == 2 * 2048 * 4 * 8
    assert t.tokens_per_s == pytest.approx(t.tokens_per_step / t.step_time_s)
    assert t.tokens_per_s_per_gpu == pytest.approx(t.tokens_per_s / 8)
    assert 0 < t.mfu < 1
    assert t.bound in BOUNDS
    assert sum(x.seconds for x in t.terms) == pytest.approx(t.step_time_s)
    assert t.bound == max(t.by_kind(), key=t.by_kind().get)


def test_token_budget_gives_wall_time_and_cost_only_with_a_price() -> None:
    s = scenario(gpus=8, token_budget=10**9, parallelism=ParallelismSpec(zero_stage=3))
    t = step_time(s)
    assert t.run_time_s == pytest.approx(1e9 / t.tokens_per_s)
    assert t.gpu_hours == pytest.approx(t.run_time_s * 8 / 3600)
    assert t.cost is None and t.price_per_gpu_hour is None  # no price invented
    priced = dataclasses.replace(
        s, hardware=dataclasses.replace(s.hardware, price_per_gpu_hour=2.5)
    )
    assert step_time(priced).cost == pytest.approx(t.gpu_hours * 2.5)
    assert step_time(scenario()).run_time_s is None


def test_efficiency_override_scales_compute() -> None:
    s = scenario(sequence_length=4096)
    slow = dataclasses.replace(
        s, hardware=dataclasses.replace(s.hardware, matmul_efficiency=0.2, attention_efficiency=0.1)
    )
    assert step_time(slow).step_time_s > 2 * step_time(s).step_time_s


def test_estimate_json_has_the_time_object() -> None:
    d = estimate(scenario()).to_dict()
    t = d["time"]
    for key in ("step_time_s", "tokens_per_s_per_gpu", "tokens_per_s", "mfu", "bound"):
        assert key in t
    assert t["bound"] in BOUNDS


def test_new_fields_round_trip_and_are_checked() -> None:
    s = scenario(token_budget=5 * 10**9)
    s = dataclasses.replace(
        s,
        hardware=dataclasses.replace(
            s.hardware, network="infiniband-ndr-8x400", price_per_gpu_hour=3.0
        ),
    )
    assert scenario_from_dict(scenario_to_dict(s)) == s
    data = scenario_to_dict(s)
    data["hardware"]["network"] = "carrier-pigeon"
    with pytest.raises(EstimateError, match=r"hardware\.network"):
        scenario_from_dict(data)
    data["hardware"]["network"] = None
    data["hardware"]["network_gb_s"] = -1
    with pytest.raises(EstimateError, match=r"hardware\.network_gb_s"):
        scenario_from_dict(data)
    data = scenario_to_dict(s)
    data["training"]["token_budget"] = 0
    with pytest.raises(EstimateError, match=r"training\.token_budget"):
        scenario_from_dict(data)


def test_every_preset_pair_has_a_finite_time() -> None:
    from memfit.engine.presets import gpu_names, model_names

    for name in model_names():
        for gpu in ("h100-sxm-80gb", "rtx-4090", "mi300x"):
            t = step_time(scenario(name, gpu, method="full"))
            assert 0 < t.step_time_s < 1e6 and t.tokens_per_s > 0, (name, gpu)
    assert len(gpu_names()) > 10
    assert count_parameters(load_model("gpt2")).total > 0


@pytest.mark.parametrize("nodes", [1, 2])
def test_offloaded_parameters_never_make_a_larger_micro_batch_faster(nodes: int) -> None:
    # each layer's shard crosses the host link, is gathered, then computed: the copies
    # hide behind the compute and the waits for the gathers once, so the step time grows
    # with the micro-batch (it fell from 0.846 s to 0.803 s between 1 and 8 when the
    # compute hid both the gathers and the copies)
    from tests.engine.helpers import preset_scenario

    def seconds(micro: int) -> float:
        training = {
            "micro_batch_size": micro,
            "sequence_length": 1000,
            "parallelism": {"zero_stage": 3},
            "offload": {"parameters": "cpu"},
        }
        hardware = {"gpus_per_node": 1, "nodes": nodes}
        s = preset_scenario("deepseek-v2-lite", "h100-sxm-80gb", training, **hardware)
        return step_time(s).step_time_s

    times = [seconds(m) for m in (1, 2, 4, 8, 16)]
    assert times == sorted(times), times


def test_every_training_field_but_the_shape_keys_the_plan() -> None:
    """The plan is cached per model and hardware under a key of the training fields; a
    field missing from the key would serve the plan of another scenario. Each field but
    the shape (which every evaluation passes) changes the key, including fields added
    later."""
    from dataclasses import fields

    from memfit.engine.steptime import SHAPE_FIELDS, plan_key

    base = TrainingSpec()
    names = {f.name for f in fields(TrainingSpec)}
    assert names > SHAPE_FIELDS
    for name in names:
        changed = dataclasses.replace(base)
        object.__setattr__(changed, name, object())  # a value no real field holds
        assert (plan_key(changed) != plan_key(base)) == (name not in SHAPE_FIELDS), name


def _activations(s: Scenario) -> int:
    return sum(i.bytes for i in estimate(s).items if i.category == "activations")


@pytest.mark.parametrize(
    ("what", "base", "changed", "direction"),
    [
        ("eager attention", {}, {"attention": "eager"}, 1),
        # recomputation trades time for memory
        ("selective recomputation", {"attention": "eager"},
         {"attention": "eager", "activation_checkpointing": "selective"}, -1),
        ("PEFT's adapter dropout", {"method": "lora"},
         {"method": "lora", "lora": LoraSpec(dropout=0.1)}, 1),
        ("frozen weights kept in fp32 under autocast", {"method": "lora"},
         {"method": "lora", "frozen_weights_dtype": "fp32"}, 1),
        ("a loss without the fp32 copy of the logits", {"method": "lora"},
         {"method": "lora", "loss": "no-upcast"}, 1),
        ("a fused loss", {"method": "lora"}, {"method": "lora", "loss": "chunked"}, 1),
    ],
)  # fmt: skip
def test_an_op_that_changes_memory_changes_time(
    what: str, base: dict[str, object], changed: dict[str, object], direction: int
) -> None:
    """The copies of the step drift when an op reaches the memory walk but not the step
    time (Falcon's math fallback cost 7x the activations at the same time): each op a
    setting adds or removes changes both; the traffic an op moves raises both, recomputing
    lowers memory and raises time."""
    a = scenario(micro_batch_size=8, **base)
    b = scenario(micro_batch_size=8, **changed)
    mem_a, mem_b = _activations(a), _activations(b)
    time_a, time_b = step_time(a).step_time_s, step_time(b).step_time_s
    assert mem_a != mem_b, what
    assert time_a != time_b, what
    slower = time_b > time_a if direction > 0 else time_b < time_a
    assert (mem_b > mem_a) == slower, what


def test_a_stage_block_is_not_shared_by_plans_that_differ_in_what_it_reads() -> None:
    """Plans of one model and hardware share their stage blocks where everything a block
    reads is alike. Per-op checkpointing and every-k-layers can recompute the same share
    of the layers (3 of 7 here, the per-op share of a 7-layer model whose attention and
    MLP matrices are all h x h), yet per-op does not run the attention kernel again: a
    block cached under the share alone gave the per-op step the every-k time."""
    from memfit.engine import memo
    from memfit.engine.specs import ModelSpec
    from memfit.engine.steptime import per_op_recompute_share

    model = ModelSpec(
        "seven", num_layers=7, hidden_size=512, num_attention_heads=8,
        num_key_value_heads=8, head_dim=64, intermediate_size=512, vocab_size=32000,
    )  # fmt: skip
    hw = HardwareSpec(load_gpu("h100-sxm-80gb"))
    every = Scenario(model, hw, TrainingSpec(activation_checkpointing="every-k-layers",
                                             checkpoint_every_k=3))  # fmt: skip
    per_op = Scenario(model, hw, TrainingSpec(activation_checkpointing="per-op"))
    assert per_op_recompute_share(model) == 3 / 7
    memo.clear()
    alone = step_time(per_op)
    memo.clear()
    step_time(every)
    assert step_time(per_op) == alone


def _element_ops(s: Scenario, moe: bool = False) -> int:
    """The ops of one layer's block that the step time prices by the bytes they move."""
    from memfit.engine.timeline import layer_block, make_ctx

    block = layer_block(s.model, make_ctx(s.model, s.training), moe)
    return sum(op.gemm is None and not op.name.startswith("sdpa_") for op in block.ops)


def test_an_activation_written_in_python_ops_costs_its_ops_in_time() -> None:
    """GPT-2's ``gelu_new`` is eight Python ops in fp32 under autocast, where the fused
    GELU is one: with the cast to fp32 and autocast's cast back to 16 bits for the next
    matmul, nine more kernels that each read and write the MLP's width. The memory walk
    keeps their tensors, and the step time prices the same ops of the same block: a model
    that runs the fused GELU instead is cheaper in both."""
    new = scenario("gpt2", micro_batch_size=16, sequence_length=1024)
    fused = dataclasses.replace(new, model=dataclasses.replace(new.model, activation="gelu"))
    assert new.model.activation == "gelu_new"
    assert _element_ops(new) == _element_ops(fused) + 9
    assert _activations(new) > _activations(fused)
    assert step_time(new).step_time_s > 1.3 * step_time(fused).step_time_s


def test_qlora_dequantization_costs_in_time_what_its_ops_move() -> None:
    """QLoRA dequantizes each 4-bit weight for its matmul (and again in backward): where the
    quant state's dtype is fp32 the memory walk has a second, fp32 copy alive for the cast
    (Lightning's plugin), and a quantized LM head is dequantized too. The step time prices
    the same ops (engine.layers.dequant_traffic): both cost time."""
    from memfit.engine.layers import dequant_traffic
    from memfit.engine.specs import QuantSpec

    assert dequant_traffic(0) == 2.5  # the 4-bit code read, 16 bits written
    assert dequant_traffic(4) == 10.5  # fp32 written, read and cast to 16 bits
    # short rows: the dequantized weights, not the activations, set a layer's peak
    base = scenario(method="qlora", micro_batch_size=1, sequence_length=16)
    fp32 = with_training(base, qlora=QuantSpec(dequant_dtype="fp32"))
    head = with_training(base, qlora=QuantSpec(quantize_lm_head=True))

    def layer_peak(s: Scenario) -> int:
        return max(p.total for p in estimate(s).timeline if p.label == "layer")

    assert layer_peak(fp32) > layer_peak(base)
    assert step_time(fp32).step_time_s > 1.02 * step_time(base).step_time_s
    assert estimate(head).allocated_bytes != estimate(base).allocated_bytes
    assert step_time(head).step_time_s > step_time(base).step_time_s


@pytest.mark.parametrize(
    ("what", "model", "base", "changed", "fields"),
    [
        ("dropout on the residual branches", "llama-3-8b", {}, {}, {"hidden_dropout": 0.1}),
        ("dropout on the attention probabilities", "llama-3-8b", {"attention": "eager"},
         {"attention": "eager"}, {"attention_dropout": 0.1}),
        ("gelu_new's Python ops", "gpt2", {}, {}, {"activation": "gelu"}),
        ("gelu_fast's Python ops", "llama-3-8b", {}, {}, {"activation": "gelu_fast"}),
        ("quick_gelu's Python ops", "llama-3-8b", {}, {}, {"activation": "quick_gelu"}),
        ("LitGPT's modeling code", "llama-3-8b", {"method": "lora"},
         {"method": "lora", "model_implementation": "litgpt"}, {}),
        ("QLoRA's dequantization", "llama-3-8b", {"method": "lora"}, {"method": "qlora"}, {}),
    ],
)  # fmt: skip
def test_a_model_op_that_changes_memory_changes_time(
    what: str,
    model: str,
    base: dict[str, object],
    changed: dict[str, object],
    fields: dict[str, object],
) -> None:
    """As above, for ops a model's own fields or its modeling code add: each changes the
    memory walk and the step time together."""
    a = scenario(model, micro_batch_size=8, **base)
    b = scenario(model, micro_batch_size=8, **changed)
    b = dataclasses.replace(b, model=dataclasses.replace(b.model, **fields))  # type: ignore[arg-type]
    assert estimate(a).allocated_bytes != estimate(b).allocated_bytes, what
    assert step_time(a).step_time_s != step_time(b).step_time_s, what


def test_the_eager_experts_loop_costs_its_kernels_in_time() -> None:
    """transformers' eager experts loop (``moe_implementation="eager"``) runs each expert
    that receives tokens as its own gather, activation, product, routing weights and
    index_add -- the ops the memory walk builds for it -- where the grouped experts run a
    handful of kernels for all of them. The step time counts those kernels from the same
    ops of the same block: six per expert here, so a model of 128 experts
    pays for them where one of 8 barely does."""
    from memfit.engine.specs import ParallelismSpec

    def loop_ops(name: str) -> int:
        # a shape where every expert receives tokens
        m = load_model(name)
        shape = {"micro_batch_size": 1, "sequence_length": m.local_experts}
        grouped = scenario(name, method="lora", **shape)
        eager = with_training(grouped, moe_implementation="eager")
        return _element_ops(eager, moe=True) - _element_ops(grouped, moe=True)

    mixtral, qwen = load_model("mixtral-8x7b"), load_model("qwen3-30b-a3b")
    few, many = loop_ops("mixtral-8x7b"), loop_ops("qwen3-30b-a3b")
    assert (many - few) / (qwen.local_experts - mixtral.local_experts) == 6

    def timed(impl: str) -> float:
        s = Scenario(
            qwen,
            HardwareSpec(load_gpu("h200-sxm-141gb"), gpus_per_node=8),
            TrainingSpec(
                method="lora",
                micro_batch_size=1,
                sequence_length=1024,
                moe_implementation=impl,
                parallelism=ParallelismSpec(zero_stage=3),
            ),
        )
        return step_time(s).step_time_s

    assert timed("eager") > 1.5 * timed("grouped")


def test_a_layer_priced_for_one_model_is_not_served_to_another() -> None:
    """The step time's plans are kept per model and hardware, and what a layer costs is
    cached by everything it is priced from, the device too: one plan on two GPUs, whichever
    is timed first, gets each GPU's own layers' time (a cache keyed by the plan's stages
    alone, which leave the device out, served the H100's layers to the A100)."""
    from memfit.engine import memo

    h100, a100 = scenario(gpu="h100-sxm-80gb"), scenario(gpu="a100-sxm-80gb")
    memo.clear()
    alone = step_time(a100).step_time_s
    memo.clear()
    step_time(h100)
    assert step_time(a100).step_time_s == alone


@pytest.mark.parametrize(
    ("model", "fields"),
    [
        ("llama-3-8b", {"method": "lora"}),
        ("mistral-7b-v0.1", {"attention": "eager"}),  # a sliding window, eager scores
        ("qwen3-30b-a3b", {"method": "lora", "moe_implementation": "eager"}),
        ("gpt2", {"method": "qlora"}),
        ("llama-3-8b", {"parallelism": ParallelismSpec(tp=2, sequence_parallel=True)}),
        ("llama-3-8b", {"loss": "chunked"}),  # a fused loss: one chunk of rows held
        ("llama-3-8b", {"loss": "chunked-output", "stack": "torchtune"}),
        ("bert-base-uncased", {}),  # the masked-LM head's transform
        # Megatron-core's fused layer, with its views of the fused q/k/v
        ("llama-3-8b", {"parallelism": ParallelismSpec(framework="megatron")}),
        ("gpt2", {"attention": "eager", "parallelism": ParallelismSpec(framework="megatron")}),
        ("qwen3-30b-a3b", {"parallelism": ParallelismSpec(framework="megatron")}),
        # torch.compile: the element-wise ops priced in fused groups
        ("llama-3-8b", {"torch_compile": True, "method": "lora"}),
        ("qwen3-30b-a3b", {"torch_compile": True}),
        ("gpt2", {"torch_compile": True, "attention": "eager"}),
    ],
)  # fmt: skip
def test_a_block_priced_once_for_every_shape_equals_the_block_built_at_each(
    model: str, fields: dict[str, object]
) -> None:
    """The step time prices a block's ops (each layer's, the head's and the loss's) once
    with symbolic sizes and evaluates them at each shape; where that does not hold (the
    eager experts loop, a chunked output) it builds the block at the shape. Either way the
    answer is, to the byte, the block built at that shape."""
    import dataclasses as dc

    from memfit.engine.plan.resolve import resolve
    from memfit.engine.steptime import _block_of, _kernel_of, _price, _priced_block
    from memfit.engine.timeline import make_ctx

    s = scenario(model, gpus=2, **fields)
    plan = resolve(s)
    rank = plan.rank_model()
    whole = make_ctx(rank, plan.scenario.training)
    kinds = ["layer", "head"] + (["moe"] if rank.is_moe else [])
    for kind in kinds:
        ctx = whole.for_head() if kind == "head" else whole.for_layers()
        kernel = _kernel_of(ctx.attention, rank.sdpa_math)
        for b, seq in ((1, 64), (3, 1000), (8, 4096)):
            fused = s.training.torch_compile
            shaped = _block_of(rank, dc.replace(ctx, batch=b, seq=seq), kind)
            built = _price(shaped, kernel, fused)
            assert _priced_block(rank, ctx, kind, b, seq, fused) == built, (kind, b, seq)


def test_gemma_2s_logit_soft_capping_costs_memory_and_time() -> None:
    """Gemma-2 soft-caps its final logits, ``cap * tanh(logits / cap)``: three more
    logits-sized tensors after the LM head, tanh's output kept for backward and the last
    the model's output. Memory and the step time both follow from those ops."""
    from memfit.engine.hf_config import model_from_hf_config
    from tests.engine.test_hf_families import config

    assert model_from_hf_config(config("gemma2")).final_logit_softcapping == 30.0
    assert model_from_hf_config(config("gemma3_text")).final_logit_softcapping == 0.0
    capped = scenario("gemma-2-2b", method="lora", micro_batch_size=4)
    assert capped.model.final_logit_softcapping == 30.0
    plain = dataclasses.replace(
        capped, model=dataclasses.replace(capped.model, final_logit_softcapping=0.0)
    )
    logits = 4 * 2048 * capped.model.vocab_size * 2  # bf16, sequence 2048 by default
    assert capped.training.sequence_length == 2048
    more = estimate(capped).allocated_bytes - estimate(plain).allocated_bytes
    assert logits <= more <= 2 * logits
    assert step_time(capped).step_time_s > step_time(plain).step_time_s


def _term(t: object, prefix: str) -> tuple[float, float]:
    """(seconds, busy) of the term whose name starts with ``prefix``; zeros when absent."""
    for term in t.terms:  # type: ignore[attr-defined]
        if term.name.startswith(prefix):
            return term.seconds, term.busy_s
    return 0.0, 0.0


def test_tp_comm_overlap_hides_the_tensor_parallel_collectives_behind_the_gemms() -> None:
    """Megatron's --tp-comm-overlap (userbuffers) and torchtitan's async TP chunk the
    sequence-parallel all-gathers and reduce-scatters against their GEMMs: the busy time
    of the collectives stays, what the step waits on falls to what the GEMMs cannot hide
    plus the slowdown of what they do; without sequence parallelism, or at tp 1, the
    field changes nothing."""
    par = ParallelismSpec(tp=8, sequence_parallel=True, framework="megatron")
    base = scenario("llama-3-70b", gpus=8, parallelism=par, micro_batch_size=1)
    hidden = with_training(base, parallelism=dataclasses.replace(par, tp_comm_overlap=True))
    t0, t1 = step_time(base), step_time(hidden)
    exposed0, busy0 = _term(t0, "tensor-parallel")
    exposed1, busy1 = _term(t1, "tensor-parallel")
    assert busy1 == pytest.approx(busy0, rel=1e-12) and busy0 > 0
    assert exposed0 == pytest.approx(busy0, rel=1e-12)
    # the layers' GEMMs outlast the collectives here: 15 % of the layers' share is left
    assert 0.15 * busy0 * 0.9 < exposed1 < 0.3 * busy0
    assert t1.step_time_s == pytest.approx(t0.step_time_s - (exposed0 - exposed1), rel=1e-9)
    # needs sequence parallelism (both implementations split its collectives)
    no_sp = dataclasses.replace(par, sequence_parallel=False)
    plain = with_training(base, parallelism=no_sp)
    asked = with_training(base, parallelism=dataclasses.replace(no_sp, tp_comm_overlap=True))
    assert step_time(asked).step_time_s == step_time(plain).step_time_s
    one = scenario(parallelism=ParallelismSpec(tp_comm_overlap=True, sequence_parallel=True))
    assert step_time(one).step_time_s == step_time(scenario()).step_time_s


def test_tp_comm_overlap_is_saved_checked_and_older_files_load() -> None:
    par = ParallelismSpec(tp=4, sequence_parallel=True, tp_comm_overlap=True)
    s = scenario(gpus=4, parallelism=par)
    data = scenario_to_dict(s)
    assert data["training"]["parallelism"]["tp_comm_overlap"] is True
    assert scenario_from_dict(data) == s
    del data["training"]["parallelism"]["tp_comm_overlap"]
    assert scenario_from_dict(data).training.parallelism.tp_comm_overlap is False
    with pytest.raises(EstimateError, match=r"training\.parallelism\.tp_comm_overlap"):
        ParallelismSpec(tp_comm_overlap="yes")  # type: ignore[arg-type]


def test_an_all_to_all_across_nodes_is_bound_by_each_ranks_own_nic() -> None:
    """An all-to-all sends every peer its own piece: the pieces for the other node leave
    through the rank's NIC, one of the node's eight, where an all-gather's rings spread a
    group's traffic over all of them. The same expert-parallel all-to-all over 16 GPUs
    on 2 nodes takes at least (8/16 of the bytes over one NIC) / (15/16 over NVLink) of
    the time it takes inside one 16-GPU node."""
    from memfit.engine.steptime import _Ring, _ring, device

    def ep16(per_node: int, nodes: int) -> Scenario:
        par = ParallelismSpec(ep=16, framework="megatron")
        return scenario("qwen3-30b-a3b", gpus=per_node, nodes=nodes, parallelism=par)

    two, one = ep16(8, 2), ep16(16, 1)
    dev = device(two)
    across, inside = _ring(16, 1, two, dev), _ring(16, 1, one, dev)
    nbytes = 1 << 30
    nic = min(dev.intra, dev.inter)
    expected = max(7 / 16 * nbytes / dev.intra, 8 / 16 * nbytes / nic)
    assert across.all_to_all(nbytes) == pytest.approx(expected + 10e-6 + 15 * 5e-6, rel=1e-12)
    # inside a node it is the all-gather's cost; across nodes the rings' rails do not help
    assert inside.all_to_all(nbytes) == inside.gather(nbytes)
    assert across.all_to_all(nbytes) > 4 * across.gather(nbytes)
    assert isinstance(across, _Ring)
    t_two, t_one = step_time(two), step_time(one)
    assert _term(t_two, "expert-parallel")[0] > 4 * _term(t_one, "expert-parallel")[0]


def test_rows_short_of_a_whole_tile_cost_a_whole_tile() -> None:
    """Tile quantization: a GEMM runs ceil(m / 128) row tiles. 129 rows cost what 256 do
    when the GEMM is compute-bound; whole tiles (the tokens of a dense layer) are
    unchanged."""
    from memfit.engine.steptime import _gemm, device

    dev = device(scenario())
    k = n = 8192
    assert _gemm(129, k, n, 2, dev) == pytest.approx(_gemm(256, k, n, 2, dev), rel=0.02)
    assert _gemm(4096, k, n, 2, dev) == pytest.approx(2 * _gemm(2048, k, n, 2, dev), rel=1e-9)


def _fp8(recipe: str, precision: str = "fp8-mixed", gpu: str = "h100-sxm-80gb") -> Scenario:
    return scenario(gpu=gpu, precision=precision, fp8_recipe=recipe, micro_batch_size=2,
                    sequence_length=4096)  # fmt: skip


def test_fp8_recipes_order_by_their_gemm_rate_and_cast_kernels() -> None:
    """Per-tensor scaling casts where the inputs are produced (Transformer Engine); per-row
    and per-block scaling quantize each operand twice by kernels of their own, and their
    GEMMs run below per-tensor ones: both are slower than tensorwise, rowwise (two passes
    per quantization) the slowest; all faster than 16 bits at these sizes; the recipe
    changes nothing without FP8."""
    rate = {r: step_time(_fp8(r)).tokens_per_s_per_gpu for r in ("tensorwise", "rowwise",
                                                                  "blockwise")}  # fmt: skip
    bf16 = step_time(_fp8("tensorwise", "bf16-mixed")).tokens_per_s_per_gpu
    assert rate["tensorwise"] > rate["blockwise"] > rate["rowwise"] > bf16
    assert step_time(_fp8("rowwise", "bf16-mixed")).tokens_per_s_per_gpu == bf16


def test_the_lm_head_stays_in_16_bits_under_fp8() -> None:
    """No FP8 stack converts the output layer (Megatron's is not a Transformer Engine
    module; torchtitan's converter leaves ``output`` out): the head's GEMMs run at the
    16-bit rate, the same with and without FP8."""
    from memfit.engine.steptime import _head_at, device

    fp8, bf16 = _fp8("tensorwise"), _fp8("tensorwise", "bf16-mixed")
    dev8, dev16 = device(fp8), device(bf16)
    assert dev8.fp8 and dev8.matmul_flops > 1.5 * dev16.matmul_flops
    assert dev8.sixteen_bit().matmul_flops == dev16.matmul_flops
    assert dev8.sixteen_bit().fp8 is False
    model = fp8.model
    from memfit.engine.timeline import make_ctx

    ctx = make_ctx(model, bf16.training).for_head()
    assert _head_at(model, ctx, dev8.sixteen_bit(), 2, 2.5, 2, 4096) == _head_at(
        model, ctx, dev16, 2, 2.5, 2, 4096
    )


def test_mxfp8_is_refused_off_blackwell_and_the_recipe_is_saved() -> None:
    with pytest.raises(EstimateError, match=r"training\.fp8_recipe.*Blackwell"):
        step_time(_fp8("mxfp8"))
    assert step_time(_fp8("mxfp8", gpu="b200-sxm-180gb")).tokens_per_s_per_gpu > 0
    with pytest.raises(EstimateError, match=r"training\.fp8_recipe"):
        TrainingSpec(fp8_recipe="nvfp4")
    s = _fp8("rowwise")
    data = scenario_to_dict(s)
    assert data["training"]["fp8_recipe"] == "rowwise"
    assert scenario_from_dict(data) == s
    del data["training"]["fp8_recipe"]
    assert scenario_from_dict(data).training.fp8_recipe == "tensorwise"


def test_the_hopper_attention_curve_reproduces_the_h200_kernel_records() -> None:
    """Each fused kernel's rate ``R * keys / (keys + k0)`` against every causal attention
    record of the H200 (forward, and backward at 2.5x the forward's FLOPs): within 12 %
    each, 5 % rms."""
    import json
    import math
    from pathlib import Path

    from memfit.engine.steptime import attention_curve

    path = Path(__file__).resolve().parents[2] / "validation" / "gpu" / "h200_kernels.jsonl"
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    names = {"default": "sdpa", "flash": "flash", "efficient": "mem-efficient"}
    peak = load_gpu("h200-sxm-141gb").bf16_tflops * 1e12
    errors = []
    for r in records:
        if r.get("kind") != "attention" or not r["causal"] or r["backend"] not in names:
            continue
        r_f, k0_f, r_b, k0_b = attention_curve(names[r["backend"]], r["head_dim"])
        keys = r["seq"] / 2
        fwd = r["forward_flops"] / (peak * r_f * keys / (keys + k0_f))
        bwd = 2.5 * r["forward_flops"] / (peak * r_b * keys / (keys + k0_b))
        errors += [
            math.log(fwd / r["seconds"]["forward"]),
            math.log(bwd / r["seconds"]["backward"]),
        ]
    assert len(errors) >= 80
    assert max(abs(e) for e in errors) < 0.12
    assert math.sqrt(sum(e * e for e in errors) / len(errors)) < 0.05


def test_on_hopper_attention_gets_cheaper_per_flop_with_the_sequence_and_not_elsewhere() -> None:
    """The attention core of one layer, per FLOP, costs less at 32k tokens than at 1k on an
    H100 (the kernel's work per query row spreads over more keys), forward and backward;
    on an A100 the share is flat and the cost per FLOP the same."""
    from memfit.engine.steptime import _layer, _plan, _strategy, _work

    def per_flop(gpu: str, seq: int) -> tuple[float, float]:
        s = scenario("llama-3.2-1b", gpu=gpu, micro_batch_size=32768 // seq, sequence_length=seq,
                     attention="flash")  # fmt: skip
        stages = _plan(*_strategy(s)).stages
        layer = _layer(s.model, _work(stages, 32768 // seq, seq), stages.dev, False)
        return layer.attn_fwd / layer.attn_flops_fwd, layer.attn_bwd / layer.attn_flops_fwd

    long_h, short_h = per_flop("h100-sxm-80gb", 32768), per_flop("h100-sxm-80gb", 1024)
    assert long_h[0] < 0.8 * short_h[0] and long_h[1] < 0.6 * short_h[1]
    long_a, short_a = per_flop("a100-sxm-80gb", 32768), per_flop("a100-sxm-80gb", 1024)
    assert long_a == pytest.approx(short_a, rel=1e-9)


def test_selective_recomputation_follows_the_attention_that_runs() -> None:
    """Gemma-2 caps its scores, which SDPA cannot: under ``sdpa`` it runs eager, so
    selective checkpointing recomputes the eager core there as it does under ``eager``."""
    base = scenario("gemma-2-9b", micro_batch_size=2, sequence_length=2048,
                    activation_checkpointing="selective")  # fmt: skip
    eager = with_training(base, attention="eager")
    assert step_time(base).step_time_s == step_time(eager).step_time_s
    recompute = [t.seconds for t in step_time(base).terms if t.name == "recomputation"]
    assert recompute and recompute[0] > 0


def test_torch_compile_fuses_the_element_wise_ops_and_nothing_else() -> None:
    """Under torch.compile the element-wise ops between the matmuls and the attention fuse:
    fewer kernels and fewer bytes (what a fused group reads from outside it once, what
    leaves it once); the GEMMs, the attention and the collectives are priced as before;
    memory keeps what the partitioner keeps (less than eager)."""
    from memfit.engine.steptime import _block_of, _kernel_of, _price
    from memfit.engine.timeline import make_ctx

    s = scenario("llama-3-8b", micro_batch_size=2, sequence_length=2048)
    ctx = dataclasses.replace(make_ctx(s.model, s.training).for_layers(), batch=2, seq=2048)
    block = _block_of(s.model, ctx, "layer")
    kernel = _kernel_of(ctx.attention)
    eager, fused = _price(block, kernel), _price(block, kernel, True)
    assert fused.gemms == eager.gemms
    assert 0 < fused.k_f < eager.k_f / 2 and 0 < fused.k_b < eager.k_b
    assert 0 < fused.e_f < 0.75 * eager.e_f and 0 < fused.e_b < eager.e_b
    # a group reads at least the layer's input once and writes at least its output
    h = s.model.hidden_size * 2 * 2048 * 2
    assert fused.e_f >= 2 * h
    compiled = with_training(s, torch_compile=True)
    t0, t1 = step_time(s), step_time(compiled)
    ew0, ew1 = (_term(t, "elementwise")[0] for t in (t0, t1))
    assert ew1 < ew0
    for name in ("forward", "backward"):
        assert _term(t1, name)[0] == pytest.approx(_term(t0, name)[0], rel=1e-12)
    # the peak of this full fine-tune is the optimizer step's, which compiling leaves
    assert estimate(compiled).allocated_bytes <= estimate(s).allocated_bytes
    forward = [with_training(x, optimizer="sgd") for x in (s, compiled)]
    assert estimate(forward[1]).allocated_bytes < estimate(forward[0]).allocated_bytes
    data = scenario_to_dict(compiled)
    assert data["training"]["torch_compile"] is True
    assert scenario_from_dict(data) == compiled


def test_the_optimizer_step_of_many_small_tensors_is_bound_by_its_launches() -> None:
    """The per-tensor loop launches each kernel of the update for every parameter tensor:
    GPT-2's 148 tensors x 8 AdamW kernels at the launch floor outlast the bytes; the
    foreach and fused implementations launch per op over up to 36 tensors at once."""
    from memfit.engine.model_state import split_tensors
    from memfit.engine.steptime import KERNEL_S

    def opt(impl: str, method: str = "full") -> float:
        s = scenario("gpt2", optimizer_impl=impl, method=method)
        return _term(step_time(s), "optimizer step")[0]

    tensors = sum(g.count for g in split_tensors(load_model("gpt2"), TrainingSpec()).trainable)
    assert tensors == 148
    assert opt("for-loop") == pytest.approx(tensors * 8 * KERNEL_S, rel=1e-12)
    assert opt("fused") < opt("foreach") < opt("for-loop")
    # LoRA's adapters: many tiny tensors, a launch-bound step even so
    lora = opt("for-loop", "lora")
    adapters = sum(
        g.count for g in split_tensors(load_model("gpt2"), TrainingSpec(method="lora")).trainable
    )
    assert lora == pytest.approx(adapters * 8 * KERNEL_S, rel=1e-12)


def test_a_context_replaced_is_kept_and_equal_to_replacing_it() -> None:
    """Ctx.replaced, for_layers and for_head give what replacing the fields gives, and
    equal contexts (strategies that differ in their share of the model state make them)
    the one object."""
    from memfit.engine.timeline import make_ctx

    s = Scenario(load_model("llama-3-8b"), HardwareSpec(load_gpu("h100-sxm-80gb"), 8))
    zero1 = dataclasses.replace(
        s.training,
        parallelism=dataclasses.replace(s.training.parallelism, zero_stage=1),
        optimizer="adamw-8bit",
    )
    a, b = make_ctx(s.model, s.training), make_ctx(s.model, zero1)
    assert a == b and a is not b
    assert a.replaced(batch=1, seq=1) == dataclasses.replace(a, batch=1, seq=1)
    assert a.replaced(batch=1, seq=1) is b.replaced(batch=1, seq=1)
    assert a.replaced(compiled="layers").compiled == "layers"
    layers = dataclasses.replace(
        a, batch=1, seq=1, outputs_held=True, kv_cache=False, loss="standard", loss_chunks=8,
        quantized_head=False, selective=False,
    )  # fmt: skip
    assert a.for_layers() == layers and a.for_layers() is b.for_layers()
    head = dataclasses.replace(
        a, batch=1, seq=1, selective=False, outputs_held=True, kv_cache=False
    )
    assert a.for_head() == head and a.for_head() is b.for_head()
    assert isinstance(a.for_head(), Ctx)
