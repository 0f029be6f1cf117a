"""The allocator's rounding counts the blocks a rank keeps on its GPU, as it keeps them
(:func:`memfit.engine.sharding.resident_blocks`): each parameter tensor over 1 MiB, in its
storage, sharded or packed as the rank holds it; nothing for what is offloaded."""

from __future__ import annotations

import dataclasses

from memfit.engine.estimate import Estimate, estimate
from memfit.engine.model_state import nf4_bytes
from memfit.engine.overhead import MIB
from memfit.engine.params import model_tensors
from memfit.engine.plan import make_mesh
from memfit.engine.presets import load_model
from memfit.engine.sharding import resident_blocks
from tests.engine.helpers import preset_scenario

GIB = 1 << 30


def rounding(est: Estimate) -> int:
    (item,) = (i for i in est.items if i.name.startswith("allocator rounding"))
    return item.bytes


def test_packed_4bit_experts_are_small_blocks() -> None:
    # Qwen3-30B-A3B's 18,432 expert matrices are 768 x 2048: 0.75 MiB packed in 4 bits,
    # under the allocator's 1 MiB large-block size, so they round in shared 2 MiB
    # segments; what is left over 1 MiB (attention, embeddings) is a few hundred blocks
    est = estimate(preset_scenario("qwen3-30b-a3b", "h100-sxm-80gb", {"method": "qlora"}))
    assert rounding(est) < 2 * GIB, rounding(est) / GIB


def test_offloaded_parameters_are_not_rounded_on_the_device() -> None:
    # FSDP with parameters and optimizer offloaded keeps no parameter shard on the GPU
    est = estimate(
        preset_scenario(
            "qwen3-30b-a3b",
            "rtx-4090",
            {
                "parallelism": {"zero_stage": 3},
                "offload": {"parameters": "cpu", "optimizer": "cpu"},
            },
            gpus_per_node=2,
        )
    )
    assert rounding(est) < 2 * GIB, rounding(est) / GIB


def test_zero_3_shards_of_many_gpus_are_small_blocks() -> None:
    # DeepSeek-V3's 7168 x 2048 expert matrices are 28 MiB in bf16, under 0.5 MiB as a
    # shard of 64 GPUs: small blocks, no 2 MiB rounding each
    training = {"parallelism": {"zero_stage": 3}}
    s = preset_scenario("deepseek-v3", "h100-sxm-80gb", training, gpus_per_node=8, nodes=8)
    est = estimate(s)
    assert rounding(est) < 4 * GIB, rounding(est) / GIB


def test_a_dense_model_on_one_gpu_counts_every_tensor_over_1_mib() -> None:
    s = preset_scenario("llama-3-8b", "h100-sxm-80gb", {})
    model = load_model("llama-3-8b")
    over = sum(g.count for g in model_tensors(model) if 4 * g.numel > MIB)  # fp32 masters
    assert resident_blocks(model, s.training, make_mesh(s), "all") == over
    assert rounding(estimate(s)) == over * MIB


def test_4bit_codes_count_at_their_packed_size() -> None:
    s = preset_scenario("qwen3-30b-a3b", "h100-sxm-80gb", {"method": "qlora"})
    model = load_model("qwen3-30b-a3b")
    q = s.training.qlora
    (expert, *_) = (g for g in model_tensors(model) if g.component == "experts" and g.matrix)
    assert 2 * expert.numel > MIB >= nf4_bytes(expert.numel, q.block_size, q.double_quant)
    blocks = resident_blocks(model, s.training, make_mesh(s), "all")
    assert blocks < sum(g.count for g in model_tensors(model) if 2 * g.numel > MIB) // 10


def test_offload_and_sharding_lower_the_blocks_and_never_raise_them() -> None:
    # pure bf16: a k_proj shard of 8 is 1 MiB, no longer a large block
    base = preset_scenario("llama-3-8b", "h100-sxm-80gb", {"precision": "bf16"}, gpus_per_node=8)
    model = load_model("llama-3-8b")

    def blocks(zero: int, offload: str = "none") -> int:
        t = base.training
        training = dataclasses.replace(
            t,
            parallelism=dataclasses.replace(t.parallelism, zero_stage=zero),
            offload=dataclasses.replace(t.offload, parameters=offload),
        )
        s = dataclasses.replace(base, training=training)
        return resident_blocks(model, training, make_mesh(s), "all")

    assert blocks(3) < blocks(1) == blocks(0)
    assert blocks(3, "cpu") == 0
