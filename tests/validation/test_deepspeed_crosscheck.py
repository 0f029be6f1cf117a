"""MemFit's DeepSpeed layout against DeepSpeed's own model-state estimators.

``deepspeed_estimates.json`` holds what ``estimate_zero2_model_states_mem_needs`` and
``estimate_zero3_model_states_mem_needs`` (DeepSpeed 0.19.8, run by
``validation/deepspeed_estimates.py``) return for six models on four GPU layouts. MemFit,
with ``framework="deepspeed"``, bf16 mixed precision and AdamW, must give the same bytes
where the two make the same assumptions:

* **GPU**: the model states of one rank -- 16-bit weights (or their shard), the 16-bit
  gradient partition (ZeRO-2), the fp32 gradient partition, fp32 master weights and Adam's
  moments -- plus, under ZeRO-3, the gathered units. DeepSpeed's ``4 L`` is MemFit's two
  gathered 16-bit layers (the current one and the prefetched one) when ``L`` is the largest
  transformer block, which is what the fixture passes. Not compared: the contiguous
  gradient bucket (``reduce_bucket_size``, 5e8 elements by default), which the estimator
  leaves out and MemFit counts.
* **CPU**: with offload and ``zero_init``, DeepSpeed's figure is one node's host memory
  times ``additional_buffer_factor`` (1.5): MemFit's ``host_node_bytes`` times the same
  factor. Not compared: the rows without ``zero_init`` or without offload, where DeepSpeed's
  CPU figure is the fp32 copy of the model each process builds while loading (``4 P`` per
  GPU of the node), memory of the start-up, not of the training step; and ZeRO-2 offload on
  more than four GPUs per node, where that start-up term (``4 P G``) is the larger one.
"""

import json
from pathlib import Path
from typing import Any

import pytest

from memfit.engine.estimate import estimate
from memfit.engine.model_state import model_state
from memfit.engine.params import count_parameters, largest_layer_params
from memfit.engine.plan import make_mesh
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.sharding import shard
from memfit.engine.specs import HardwareSpec, OffloadSpec, ParallelismSpec, Scenario, TrainingSpec

FIXTURE = json.loads((Path(__file__).parent / "deepspeed_estimates.json").read_text())
RECORDS = FIXTURE["records"]


def scenario(r: dict[str, Any]) -> Scenario:
    offload = OffloadSpec()
    if r["cpu_offload"]:
        params = "cpu" if r["stage"] == 3 and r["cpu_offload_params"] else "none"
        offload = OffloadSpec(optimizer="cpu", parameters=params)
    return Scenario(
        load_model(r["model"]),
        HardwareSpec(
            load_gpu("h100-sxm-80gb"), gpus_per_node=r["num_gpus_per_node"], nodes=r["num_nodes"]
        ),
        TrainingSpec(
            method="full",
            precision="bf16-mixed",
            optimizer="adamw",
            parallelism=ParallelismSpec(zero_stage=r["stage"], framework="deepspeed"),
            offload=offload,
        ),
    )


def gpu_model_states(s: Scenario) -> int:
    sharded = shard(model_state(s.model, s.training), s, make_mesh(s))
    kept = [i for i in sharded.state.items if "bucket" not in i.name]
    return sum(i.bytes for i in kept) + sharded.gather.forward


def record_id(r: dict[str, Any]) -> str:
    opts = "offload" if r["cpu_offload"] else "gpu"
    if r["stage"] == 3 and r["cpu_offload"] and r["cpu_offload_params"]:
        opts += "+params"
    init = "" if r["zero_init"] is None else ("-init" if r["zero_init"] else "-noinit")
    layout = f"{r['num_nodes']}x{r['num_gpus_per_node']}"
    return f"zero{r['stage']}-{r['model']}-{layout}-{opts}{init}"


def test_fixture_inputs_are_memfits_own_counts() -> None:
    for r in RECORDS:
        model = load_model(r["model"])
        assert count_parameters(model).total == r["total_params"], r["model"]
        assert largest_layer_params(model) == r["largest_layer_params"], r["model"]


@pytest.mark.parametrize("r", RECORDS, ids=record_id)
def test_gpu_model_states_match_deepspeed(r: dict[str, Any]) -> None:
    ours = gpu_model_states(scenario(r))
    # DeepSpeed truncates one float product; MemFit rounds each shard up
    assert abs(ours - r["gpu_bytes"]) <= 8, (ours, r["gpu_bytes"])


def comparable_host(r: dict[str, Any]) -> bool:
    if not r["cpu_offload"]:
        return False
    if r["stage"] == 2:
        return 4 * r["num_gpus_per_node"] * r["num_nodes"] <= 16
    return bool(r["zero_init"])


HOST = [r for r in RECORDS if comparable_host(r)]


@pytest.mark.parametrize("r", HOST, ids=record_id)
def test_host_memory_per_node_matches_deepspeed(r: dict[str, Any]) -> None:
    est = estimate(scenario(r))
    ours = est.host_node_bytes * r["additional_buffer_factor"]
    assert ours == pytest.approx(r["cpu_bytes"], abs=16), (ours, r["cpu_bytes"])


def test_the_cross_check_covers_every_layout_and_option() -> None:
    assert len(RECORDS) == 192
    assert {record_id(r).split("-")[0] for r in HOST} == {"zero2", "zero3"}
    assert len(HOST) >= 40
