"""Tensor, sequence, context, expert and pipeline parallelism, framework layouts, hybrid
sharding and offload, against hand-derived values and the papers' formulas."""

import dataclasses
import importlib

import pytest

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.graph import simulate
from memfit.engine.layers import decoder_layer
from memfit.engine.model_state import model_state
from memfit.engine.overhead import MIB, NCCL_COMMUNICATOR_MIB, NCCL_P2P_MIB
from memfit.engine.plan import make_mesh
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.rank import inflight
from memfit.engine.sharding import DS_REDUCE_BUCKET, shard, tensor_parallel_shard
from memfit.engine.specs import (
    HardwareSpec,
    ModelSpec,
    OffloadSpec,
    ParallelismSpec,
    Scenario,
    TrainingSpec,
)
from memfit.engine.timeline import Stage, step_timeline
from tests.engine.helpers import full_ctx

N = 8_030_261_248  # Llama 3 8B
H100 = load_gpu("h100-sxm-80gb")


def run(
    model: str = "llama-3-8b",
    gpus: int = 8,
    nodes: int = 1,
    offload: OffloadSpec | None = None,
    host_gib: float | None = None,
    training: dict | None = None,
    **parallel: object,
) -> Scenario:
    return Scenario(
        load_model(model),
        HardwareSpec(H100, gpus_per_node=gpus, nodes=nodes, host_memory_gib=host_gib),
        TrainingSpec(
            **{
                "method": "full",
                "micro_batch_size": 1,
                "sequence_length": 4096,
                **(training or {}),
            },  # type: ignore[arg-type]
            parallelism=ParallelismSpec(**parallel),  # type: ignore[arg-type]
            offload=offload or OffloadSpec(),
        ),
    )


def state_of(s: Scenario) -> dict[str, int]:
    mesh = make_mesh(s)
    model = tensor_parallel_shard(s.model, mesh.tp, mesh.ep)
    sharded = shard(model_state(model, s.training), s, mesh, model)
    return {
        c: sharded.state.category_bytes(c) for c in ("parameters", "gradients", "optimizer_states")
    }


# -- Korthikanti et al. 2022, table 2 ---------------------------------------------------

GPT = ModelSpec(
    name="gpt",
    num_layers=4,
    hidden_size=4096,
    num_attention_heads=32,
    num_key_value_heads=32,
    head_dim=128,
    intermediate_size=4 * 4096,
    vocab_size=51200,
    family="gpt_neox",
    mlp="plain",
    activation="gelu",
    norm="layernorm",
    position_embedding="learned",
    attention_bias=True,
    attention_out_bias=True,
    mlp_bias=True,
    hidden_dropout=0.1,
)


@pytest.mark.parametrize(
    ("t", "sp", "per_sbh"),
    [
        (1, False, 34),  # no parallelism: 34 s b h
        (2, False, 10 + 24 / 2),  # tensor parallel: s b h (10 + 24 / t)
        (8, False, 10 + 24 / 8),
        (2, True, 34 / 2),  # tensor + sequence parallel: 34 s b h / t
        (8, True, 34 / 8),
    ],
)
def test_layer_activations_follow_korthikanti_table_2(t: int, sp: bool, per_sbh: float) -> None:
    """A GPT layer in 16-bit with dropout, played op by op, keeps what the paper counts
    (with flash attention, so without the paper's 5 a s / h score terms)."""
    s, h = 2048, 4096
    ctx = full_ctx(seq=s, mode="half", frozen_bytes=2, sp=t if sp else 1)
    kept = simulate(*decoder_layer(tensor_parallel_shard(GPT, t), ctx, True, False)).kept
    # beyond the paper: LayerNorm statistics and flash attention's log-sum-exp (fp32 rows)
    small = (2 * 2 * 4 * s // (t if sp else 1) + 4 * s * 32 // t) / (s * h)
    assert kept / (s * h) == pytest.approx(per_sbh + small, abs=1e-9)


def test_eager_attention_keeps_the_scores_in_fp32() -> None:
    """With eager attention and attention dropout the paper adds 5 a s / h per s b h: the
    16-bit softmax output (2), its dropout mask (1) and the dropped probabilities (2).
    transformers' eager softmax runs in fp32, so its output takes 4: 7 a s / h."""
    s, h, a = 2048, 4096, 32
    model = dataclasses.replace(GPT, attention_dropout=0.1)
    for t in (1, 4):
        ctx = full_ctx(seq=s, mode="half", frozen_bytes=2, attention="eager", attention_dropout=0.1)
        kept = simulate(*decoder_layer(tensor_parallel_shard(model, t), ctx, True, False)).kept
        hidden = 34 if t == 1 else 10 + 24 / t
        stats = 2 * 2 * 4 * s / (s * h)
        assert kept / (s * h) == pytest.approx(hidden + 7 * a * s / (h * t) + stats, abs=1e-9)


def test_sequence_parallelism_splits_a_llama_layer_by_tp() -> None:
    model = load_model("llama-3-8b")
    one = simulate(
        *decoder_layer(model, full_ctx(seq=4096, mode="half", frozen_bytes=2), True, False)
    )
    ctx = full_ctx(seq=4096, mode="half", frozen_bytes=2, sp=4)
    four = simulate(*decoder_layer(tensor_parallel_shard(model, 4), ctx, True, False))
    assert four.kept == pytest.approx(one.kept / 4, rel=1e-3)
    assert four.output == one.output // 4  # the layer hands on a sequence shard


# -- pipeline schedules ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "pp", "vpp", "micro", "expected"),
    [
        ("gpipe", 4, 1, 8, [8, 8, 8, 8]),
        ("1f1b", 4, 1, 8, [4, 3, 2, 1]),
        ("1f1b", 4, 1, 2, [2, 2, 2, 1]),
        ("zero-bubble", 4, 1, 8, [4, 3, 2, 1]),
        # interleaved: 2 (pp - s - 1) + (v - 1) pp + 1 chunks, at most m v
        ("interleaved-1f1b", 4, 2, 8, [11, 9, 7, 5]),
        ("interleaved-1f1b", 4, 2, 2, [4, 4, 4, 4]),
    ],
)
def test_inflight_micro_batches_by_schedule(
    schedule: str, pp: int, vpp: int, micro: int, expected: list[int]
) -> None:
    assert [inflight(schedule, pp, s, micro, vpp) for s in range(pp)] == expected


def stage_activations(**parallel: object) -> list[int]:
    s = run(
        "llama-2-13b",
        gpus=4,
        training={"gradient_accumulation_steps": 8, "optimizer_impl": "fused"},
        **parallel,
    )
    return [r.category_bytes("activations") for r in estimate(s).rank_groups]


def test_interleaving_adds_korthikanti_factor_on_the_first_stage() -> None:
    """Stage 0 holds L/p (1 + (p - 1) / (p v)) layers' activations instead of L/p."""
    plain = stage_activations(pp=4)
    inter = stage_activations(pp=4, vpp=2, pp_schedule="interleaved-1f1b")
    ratio = inter[0] / plain[0]
    assert ratio == pytest.approx(1 + 3 / 8, rel=0.03)
    assert plain == sorted(plain, reverse=True)  # the first 1F1B stage holds the most


def test_gpipe_holds_every_micro_batch_on_every_stage() -> None:
    gpipe = stage_activations(pp=4, pp_schedule="gpipe")
    onef1b = stage_activations(pp=4)
    assert min(gpipe) > max(onef1b)
    assert stage_activations(pp=4, pp_schedule="zero-bubble") == onef1b


# -- context and expert parallelism ---------------------------------------------------


def test_context_parallel_layer_runs_on_its_chunk_plus_the_ring() -> None:
    model = load_model("llama-3-8b")
    whole = simulate(
        *decoder_layer(model, full_ctx(seq=2048, mode="half", frozen_bytes=2), True, False)
    )
    half = full_ctx(seq=2048, mode="half", frozen_bytes=2, cp=2)
    ring = simulate(*decoder_layer(model, half, True, False))
    assert ring.kept == whole.kept  # what a 2048-token chunk keeps, nothing more
    kv = 2 * (2048 * 8 * 128 * 2)  # local k and v, bf16
    block, _ = decoder_layer(model, half, True, False)
    ring_buffers = [n for t, n in block.sizes.items() if t.startswith("kv_ring")]
    assert ring_buffers == [2 * kv]  # two blocks of the other ranks' k and v in flight
    plain, _ = decoder_layer(model, full_ctx(seq=2048, mode="half", frozen_bytes=2), True, False)

    def sdpa(b: object) -> int:
        return next(o.transient_backward for o in b.ops if o.name.startswith("sdpa"))  # type: ignore[attr-defined]

    extra = [sdpa(block) - sdpa(plain)]
    assert extra == [2 * kv + 2 * 4 * kv // 2]  # and dk, dv (fp32) travel with them


def test_cp_halves_the_activations_of_a_step() -> None:
    one = estimate(run(gpus=8, zero_stage=3)).breakdown["activations"]
    two = estimate(run(gpus=8, zero_stage=3, cp=2)).breakdown["activations"]
    assert 0.45 < two / one < 0.6


def test_expert_parallel_rank_holds_its_experts_and_shards_their_states() -> None:
    s = run("mixtral-8x7b", gpus=8, ep=8, zero_stage=1)
    mesh = make_mesh(s)
    assert (mesh.dp, mesh.expert_dp) == (8, 1)
    model = tensor_parallel_shard(s.model, 1, 8)
    assert model.local_experts == 1
    experts = 32 * 3 * 4096 * 14336  # one expert per layer on this rank
    total = sum(
        g.total for g in __import__("memfit.engine.params").engine.params.model_tensors(model)
    )
    dense = total - experts
    # ZeRO-1: dense states over dp = 8; the rank's expert is replicated dp / ep = 1 times
    states = state_of(s)["optimizer_states"]
    assert states == pytest.approx(8 * dense / 8 + 8 * experts, rel=1e-6)


def test_capacity_factor_raises_the_busiest_expert_rank() -> None:
    base = estimate(run("mixtral-8x7b", gpus=8, ep=8, zero_stage=1))
    busy = estimate(run("mixtral-8x7b", gpus=8, ep=8, zero_stage=1, expert_capacity_factor=1.5))
    assert busy.breakdown["activations"] > base.breakdown["activations"]
    assert busy.breakdown["parameters"] == base.breakdown["parameters"]


# -- framework layouts ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("zero", "dp", "per_param"),
    [
        # Megatron-LM docs (dist_optimizer.md): bf16 params, fp32 grads: 18 B without the
        # distributed optimizer, 6 + 12/d with it
        (0, 8, 18),
        (1, 8, 6 + 12 / 8),
        (1, 64, 6 + 12 / 64),
    ],
)
def test_megatron_distributed_optimizer_bytes(zero: int, dp: int, per_param: float) -> None:
    s = run(gpus=8, nodes=dp // 8, zero_stage=zero, framework="megatron")
    assert sum(state_of(s).values()) / N == pytest.approx(per_param, rel=1e-8)


@pytest.mark.parametrize(
    ("zero", "grads", "rest_per_param"),
    [
        # 16-bit weights (2) and gradients (2) in the module; fp32 master, momentum,
        # variance and gradient partition (16) in the optimizer
        (0, 2 * N, 2 + 16),
        (1, 2 * N, 2 + 16 / 8),
        (2, 2 * DS_REDUCE_BUCKET, 2 + 18 / 8),  # + the 16-bit gradient partition
        (3, 2 * DS_REDUCE_BUCKET, 18 / 8),
    ],
)
def test_deepspeed_zero_layout(zero: int, grads: int, rest_per_param: float) -> None:
    state = state_of(run(gpus=8, zero_stage=zero, framework="deepspeed"))
    total = sum(state.values())
    assert (total - grads) / N == pytest.approx(rest_per_param, rel=1e-8)


def test_more_sharding_never_increases_model_states() -> None:
    for framework in ("pytorch", "deepspeed", "megatron"):
        totals = [
            sum(state_of(run(zero_stage=z, framework=framework)).values()) for z in (0, 1, 2, 3)
        ]
        assert totals == sorted(totals, reverse=True), framework
    wider = [sum(state_of(run(gpus=g, zero_stage=3)).values()) for g in (2, 4, 8)]
    assert wider == sorted(wider, reverse=True)


def test_hybrid_shard_keeps_the_shards_inside_a_node() -> None:
    full = make_mesh(run(gpus=8, nodes=4, zero_stage=3))
    hybrid = make_mesh(run(gpus=8, nodes=4, zero_stage=3, hybrid_shard=True))
    assert (full.shard, hybrid.shard) == (32, 8)
    states = state_of(run(gpus=8, nodes=4, zero_stage=3, hybrid_shard=True))
    assert states["optimizer_states"] == pytest.approx(8 * N / 8, rel=1e-8)
    assert "shard (within a node)" in {c.name for c in hybrid.communicators()}


# -- offload, host RAM, NCCL ----------------------------------------------------------


def test_activation_offload_moves_checkpointed_inputs_to_the_host() -> None:
    t = {"activation_checkpointing": "full", "micro_batch_size": 2}
    kept = estimate(run(gpus=8, zero_stage=3, training=t))
    off = estimate(run(gpus=8, zero_stage=3, training=t, offload=OffloadSpec(activations="cpu")))
    inputs = 32 * 2 * 4096 * 4096 * 2  # 32 layers x b s h, 16-bit (FSDP mixed precision)
    assert off.host_bytes == inputs
    assert kept.breakdown["activations"] - off.breakdown["activations"] == pytest.approx(
        inputs, rel=0.02
    )
    assert off.host_node_bytes == 8 * inputs


def test_host_ram_verdict_against_the_users_figure() -> None:
    offload = OffloadSpec(optimizer="cpu", parameters="cpu")
    est = estimate(run(gpus=8, zero_stage=3, offload=offload, host_gib=64))
    # fp32 weights, gradients and AdamW moments of 8 shards on one node: 16 B x N
    assert est.host_node_bytes == pytest.approx(16 * N, rel=1e-8)
    assert est.host_verdict == "oom"
    assert estimate(run(gpus=8, zero_stage=3, offload=offload, host_gib=256)).host_verdict == "fits"
    assert estimate(run(gpus=8, zero_stage=3, offload=offload)).host_verdict == "unknown"
    assert estimate(run(gpus=8, zero_stage=3)).to_dict()["host"]["verdict"] == "fits"


def test_nccl_buffers_count_per_communicator() -> None:
    single = estimate(run(gpus=1))
    assert all("NCCL" not in i.name for i in single.items)
    dp_tp = estimate(run(gpus=8, tp=2, zero_stage=1))
    nccl = next(i for i in dp_tp.items if i.name.startswith("NCCL"))
    # data parallel + tensor parallel, on Hopper
    assert nccl.bytes == 2 * NCCL_COMMUNICATOR_MIB["hopper"] * MIB
    pipeline = estimate(run(gpus=8, pp=2, zero_stage=1))
    nccl = next(i for i in pipeline.items if i.name.startswith("NCCL"))
    # data parallel (4 ranks) + a send and a receive pair
    assert nccl.bytes == (NCCL_COMMUNICATOR_MIB["hopper"] + 2 * NCCL_P2P_MIB) * MIB
    # nvidia-smi sees them; PyTorch's pool does not
    assert dp_tp.device_bytes - dp_tp.reserved_bytes >= nccl.bytes


# -- the mesh's errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"vpp": 2, "pp_schedule": "interleaved-1f1b"}, "training.parallelism.vpp"),  # pp = 1
        ({"pp": 2, "vpp": 3, "pp_schedule": "interleaved-1f1b"}, "training.parallelism.vpp"),
        ({"cp": 2, "training": {"attention": "eager"}}, "training.parallelism.cp"),
        (
            {"tp": 8, "sequence_parallel": True, "training": {"sequence_length": 4100}},
            "training.parallelism.sequence_parallel",
        ),
        ({"pp": 2, "zero_stage": 2, "framework": "deepspeed"}, "training.parallelism.zero_stage"),
        ({"hybrid_shard": True}, "training.parallelism.hybrid_shard"),
        ({"offload": OffloadSpec(activations="cpu")}, "training.offload.activations"),
    ],
)
def test_mesh_errors_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(EstimateError) as info:
        make_mesh(run(gpus=8, **kwargs))
    assert info.value.field == field


def test_hybrid_shard_needs_tp_inside_a_node() -> None:
    with pytest.raises(EstimateError, match="hybrid_shard"):
        make_mesh(run(gpus=4, nodes=4, tp=8, zero_stage=3, hybrid_shard=True))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pp_schedule": "interleaved-1f1b"}, "at least 2"),
        ({"vpp": 2}, "interleaved-1f1b"),
        ({"framework": "jax"}, "pytorch, deepspeed, megatron"),
        ({"expert_capacity_factor": 0.5}, r"\[1, 64\]"),
    ],
)
def test_parallelism_spec_rejects_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(EstimateError, match=message):
        ParallelismSpec(**kwargs)


def test_context_parallel_ranks_share_the_zero_shards() -> None:
    """cp ranks hold the same weights, so ZeRO/FSDP shard over dp x cp (Megatron's
    data-parallel-with-context group, torchtitan's dp_shard x cp mesh)."""
    s = run(gpus=8, cp=2, zero_stage=3)
    mesh = make_mesh(s)
    assert (mesh.dp, mesh.shard) == (4, 8)
    assert state_of(s)["optimizer_states"] == pytest.approx(8 * N / 8, rel=1e-8)


def test_megatron_optimizer_offload_keeps_the_main_grad_buffer_on_the_gpu() -> None:
    s = run(gpus=8, tp=8, zero_stage=1, framework="megatron", offload=OffloadSpec(optimizer="cpu"))
    est = estimate(s)
    rank = N // 8  # roughly: the norms stay whole on every tensor-parallel rank
    assert est.breakdown["gradients"] == pytest.approx(4 * rank, rel=0.01)
    assert est.breakdown["optimizer_states"] == 0
    assert est.host_bytes == pytest.approx(12 * rank, rel=0.01)  # master, m, v


@pytest.mark.parametrize(
    ("layers", "stages", "expected"),
    [
        (32, 4, [8, 8, 8, 8]),  # even
        # balanced: embedding and head count as a layer each, remainder to the first stages
        (27, 4, [7, 7, 7, 6]),  # 29 units: 8, 7, 7, 7
        (32, 8, [4, 5, 4, 4, 4, 4, 4, 3]),  # 34 units: 5, 5, 4, ...
        (126, 8, [15] + [16] * 6 + [15]),  # Llama 3.1 405B on 8 stages
        (126, 16, [7] + [8] * 14 + [7]),
    ],
)
def test_stage_layers(layers: int, stages: int, expected: list[int]) -> None:
    from memfit.engine.plan import stage_layers

    split = "even" if layers % stages == 0 and stages == 4 else "balanced"
    assert stage_layers(layers, stages, split) == expected
    assert sum(expected) == layers


def test_balanced_split_estimates_uneven_pipelines() -> None:
    s = run("llama-3.1-405b", gpus=8, nodes=8, tp=8, pp=8, zero_stage=1)
    with pytest.raises(EstimateError, match="pp_split balanced"):
        estimate(s)
    balanced = dataclasses.replace(
        s,
        training=dataclasses.replace(
            s.training,
            parallelism=dataclasses.replace(s.training.parallelism, pp_split="balanced"),
        ),
    )
    est = estimate(balanced)
    assert len(est.rank_groups) == 8 and est.rank_groups[0].group.startswith("pp stage 0")
    params = [r.category_bytes("parameters") for r in est.rank_groups]
    # 15 layers + the embedding, 16 layers, ..., 15 layers + the head
    assert params[1] == params[2] and params[0] != params[1]


def test_fsdp_under_pipelining_keeps_the_stage_gathered_and_its_gradients_unsharded() -> None:
    """torch.distributed.pipelining with FSDP (torchtitan): reshard_after_forward=False and
    no gradient sync before the last micro-batch."""
    s = run(gpus=8, pp=2, zero_stage=3, training={"gradient_accumulation_steps": 4})
    mesh = make_mesh(s)
    model = dataclasses.replace(s.model, num_layers=16)  # one stage
    sharded = shard(model_state(model, s.training, "first"), s, mesh, model, "first")
    stage_params = sharded.state.total_params
    grads = sum(i.bytes for i in sharded.state.items if i.category == "gradients")
    assert grads == 4 * stage_params == sharded.grad_buffer  # fp32, whole, all step long
    assert sharded.gather.forward == sharded.gather.backward == 2 * stage_params
    assert sharded.state.category_bytes("optimizer_states") == -(-8 * stage_params // 4)


def test_a_stage_played_once_serves_every_position_in_the_schedule() -> None:
    """A stage's timeline with k micro-batches in flight is its timeline with one, each
    forward and backward point raised by (k - 1) times what a micro-batch keeps."""
    model = dataclasses.replace(load_model("llama-3.2-1b"), num_layers=4)
    training = TrainingSpec(micro_batch_size=2, sequence_length=1024)
    state = model_state(model, training, "middle")
    one = step_timeline(model, training, state, stage=Stage(False, False, 1))
    for k in (2, 3, 8):
        assert step_timeline(model, training, state, stage=Stage(False, False, k)) == (
            one.in_flight(k - 1)
        )


def test_deep_pipelines_play_each_stage_shape_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """pp 1,024 took 3.6 s per edit in the app: every stage was played in full. Stages of
    one shape are played once; 1,024 stages of one layer each are three shapes (first,
    middle, last) and 1,024 rank groups."""
    est_module = importlib.import_module(
        "memfit.engine.estimate"
    )  # the package's name is the function
    calls = []
    real = est_module.rank_play

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(args[3])
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(est_module, "rank_play", counting)
    model = dataclasses.replace(load_model("llama-3.2-1b"), num_layers=1024)
    for micro in (1, 2048):
        calls.clear()
        s = Scenario(
            model,
            HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8, nodes=128),
            TrainingSpec(gradient_accumulation_steps=micro, parallelism=ParallelismSpec(pp=1024)),
        )
        result = estimate(s)
        assert sorted(calls) == ["first", "last", "middle"]
        assert len(result.rank_groups) == 1024
        middle = [g.device_bytes for g in result.rank_groups[1:-1]]
        # 1F1B: the earlier a middle stage, the more micro-batches it holds
        assert middle == sorted(middle, reverse=True)
        assert (len(set(middle)) == 1) == (micro == 1)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_megatron_cores_layer_keeps_korthikanti_equation_1(t: int) -> None:
    """Megatron-core's layer with its fused kernels and the unfused core attention (16-bit
    scale-mask-softmax output, dropout mask and dropped probabilities kept) keeps what
    Korthikanti et al. 2022 count exactly: ``s b h (34 + 5 a s / h)`` at t = 1,
    ``s b h (10 + 24 / t + 5 a s / (h t))`` under tensor parallelism; beyond the paper only
    the norms' fp32 statistics."""
    s, h, a = 2048, 4096, 32
    model = dataclasses.replace(GPT, attention_dropout=0.1)
    ctx = full_ctx(seq=s, mode="half", frozen_bytes=2, attention="eager", attention_dropout=0.1,
                   megatron=True)  # fmt: skip
    kept = simulate(*decoder_layer(tensor_parallel_shard(model, t), ctx, True, False)).kept
    hidden = 34 if t == 1 else 10 + 24 / t
    stats = 2 * 2 * 4 * s / (s * h)
    assert kept / (s * h) == pytest.approx(hidden + 5 * a * s / (h * t) + stats, abs=1e-9)


def test_megatron_cores_llama_layer_runs_fewer_kernels_than_transformers() -> None:
    """The same Llama layer as Megatron-core builds it (fused norms, RoPE, SwiGLU; views of
    the fused q/k/v) runs a fraction of transformers' element-wise ops and keeps less."""
    model = load_model("llama-3-8b")
    hf = decoder_layer(model, full_ctx(seq=4096, mode="half", frozen_bytes=2), True, False)
    mc = decoder_layer(
        model, full_ctx(seq=4096, mode="half", frozen_bytes=2, megatron=True), True, False
    )
    assert len(mc[0].ops) <= len(hf[0].ops) // 2
    assert sum(op.gemm is not None for op in mc[0].ops) == 4  # qkv, proj, fc1, fc2
    assert simulate(*mc).kept < simulate(*hf).kept
