"""The parallel axes are described once (:data:`memfit.engine.specs.PARALLEL_AXES`): the
spec's check, the mesh, the CLI, the report, the sweep and the app read the registry, and
no module lists the axes by name again."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from memfit.engine import sweep
from memfit.engine.cli import _FLAGS as FIELDS
from memfit.engine.cli import make_parser
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.plan import resolve
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.report import mesh_text
from memfit.engine.specs import (
    PARALLEL_AXES,
    WORLD_AXES,
    HardwareSpec,
    ParallelismSpec,
    Scenario,
    TrainingSpec,
)
from memfit.engine.steptime import step_time

ROOT = Path(__file__).resolve().parents[2]


def moe(**parallelism: int) -> Scenario:
    return Scenario(
        load_model("mixtral-8x7b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8, nodes=2),
        TrainingSpec(
            method="lora",
            sequence_length=4096,
            parallelism=ParallelismSpec(zero_stage=1, **parallelism),
            stack="custom",  # a loop of one's own: every axis (the Trainer has no ep)
        ),
    )


def test_the_registry_names_each_field_once() -> None:
    keys = [a.key for a in PARALLEL_AXES]
    assert keys == ["tp", "pp", "cp", "ep", "dp_replicate"]
    assert WORLD_AXES == ("tp", "pp", "cp")
    spec = ParallelismSpec(tp=2, pp=4, cp=2, ep=8, dp_replicate=2)
    assert [spec.size(k) for k in keys] == [2, 4, 2, 8, 2]
    assert spec.model_parallel == 16
    for axis in PARALLEL_AXES:
        with pytest.raises(EstimateError, match=rf"training\.parallelism\.{axis.key}: got 0"):
            ParallelismSpec(**{axis.key: 0})


def test_the_mesh_and_its_json_read_the_registry() -> None:
    s = moe(tp=2, pp=2, ep=4)
    mesh = resolve(s).mesh
    assert mesh.sizes == (2, 2, 1, 4, 1) and mesh.dp == 4
    assert [mesh.size(k) for k in ("tp", "pp", "cp", "ep")] == [mesh.tp, mesh.pp, mesh.cp, mesh.ep]
    # the JSON shape of the mesh is the one it always had
    assert list(estimate(s).to_dict()["mesh"]) == [
        "world", "tp", "pp", "cp", "ep", "dp_replicate", "dp", "shard", "vpp"
    ]  # fmt: skip
    names = [c.name for c in mesh.communicators()]
    assert names == [
        "data parallel",
        "tensor parallel",
        "expert parallel",
        "pipeline send",
        "pipeline receive",
    ]
    assert mesh_text(estimate(s)).startswith("world 16 = tp 2 x pp 2 x cp 1 x dp 4 | vpp 1")
    assert "| vpp 1 (1f1b) | ep 4 | ZeRO shard group 4" in mesh_text(estimate(s))
    assert "dp_replicate" not in mesh_text(estimate(s))  # one replica: not shown
    with pytest.raises(EstimateError, match=r"tp x pp x cp = 32 must divide the 16 GPUs"):
        resolve(moe(tp=8, pp=4))


def test_the_cli_has_a_flag_for_each_axis() -> None:
    parser = make_parser()
    flags = [f"--{a.key.replace('_', '-')}" for a in PARALLEL_AXES]
    assert "--dp-replicate" in flags
    args = parser.parse_args(["estimate", *(x for flag in flags for x in (flag, "2"))])
    for axis in PARALLEL_AXES:
        assert getattr(args, axis.key) == 2
        assert FIELDS[axis.key] == (("training", "parallelism", axis.key), int)
    help_text = parser._subparsers._group_actions[0].choices["estimate"].format_help()  # type: ignore[union-attr]
    for axis in PARALLEL_AXES:
        assert f"--{axis.key.replace('_', '-')} N" in help_text


def test_the_sweep_varies_and_reports_the_swept_axes() -> None:
    s = moe()
    space = sweep.default_space(s)
    assert [key for key, _ in space.parallel] == ["tp", "pp", "cp"]
    assert space.sizes("tp") == (1, 2, 4, 8) and space.sizes("ep") == ()
    assert sweep.SWEPT_AXES == ("tp", "pp", "cp")
    assert {"tp", "pp", "cp"} <= set(sweep.ROW_FIELDS) and "ep" not in sweep.ROW_FIELDS
    small = sweep.Space(
        precisions=("bf16-mixed",),
        optimizers=("adamw",),
        checkpointing=("full",),
        zero_stages=(1,),
        parallel=(("tp", (1, 2)), ("ep", (1, 2))),
        micro_batches=(1,),
    )
    found = {(p.scenario.training.parallelism.tp, p.scenario.training.parallelism.ep)
             for p in sweep.sweep(s, small)}  # fmt: skip
    assert found == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert sweep.describe(moe(tp=2, ep=4)).split(" ZeRO-1 ")[1].startswith("tp 2 ep 4")


#: a list of the axes' names in code: a listing the registry should give instead
LISTING = re.compile(r"""\(\s*["']tp["']\s*,\s*["']pp["']|["']tp["'],\s*["']pp["'],\s*["']cp["']""")


def test_no_module_lists_the_axes_again() -> None:
    found = [
        p.relative_to(ROOT).as_posix()
        for folder in ("engine", "gui")
        for p in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in p.parts and LISTING.search(p.read_text(encoding="utf-8"))
    ]
    assert found == []


def llama(nodes: int = 2, **parallelism: object) -> Scenario:
    return Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8, nodes=nodes),
        TrainingSpec(micro_batch_size=2, parallelism=ParallelismSpec(**parallelism)),  # type: ignore[arg-type]
    )


def by_category(s: Scenario) -> dict[str, int]:
    est = estimate(s)
    return {
        c: sum(i.bytes for i in est.items if i.category == c)
        for c in ("parameters", "gradients", "optimizer_states")
    }


def test_shard_replicas_shard_over_the_rest_of_the_data_parallel_ranks() -> None:
    """HSDP with a replicate degree (FSDP2 on a 2-D mesh, torchtitan's
    data_parallel_replicate_degree): the data-parallel ranks in ``dp_replicate`` groups,
    each holding one whole set of shards. On 2 nodes of 8 GPUs, 2 replicas shard as
    FSDP's HYBRID_SHARD does (over the 8 GPUs of a node): the same model state and the
    same step time; fewer replicas shard over more GPUs and hold less."""
    replicas = llama(zero_stage=3, dp_replicate=2)
    hybrid = llama(zero_stage=3, hybrid_shard=True)
    assert resolve(replicas).mesh.shard == resolve(hybrid).mesh.shard == 8
    assert by_category(replicas) == by_category(hybrid)
    assert step_time(replicas).step_time_s == step_time(hybrid).step_time_s
    assert "| vpp 1 | dp_replicate 2 | ZeRO shard group 8" in mesh_text(estimate(replicas))
    # its own communicator: the replicate group
    assert ("replicate", 2) in [(c.name, c.ranks) for c in resolve(replicas).mesh.communicators()]
    held = [estimate(llama(zero_stage=3, dp_replicate=r)).allocated_bytes for r in (1, 2, 4, 8, 16)]
    assert held == sorted(held) and len(set(held)) == 5
    # one replica is plain ZeRO over every data-parallel rank
    assert estimate(llama(zero_stage=3, dp_replicate=1)) == estimate(llama(zero_stage=3))


@pytest.mark.parametrize(
    ("parallelism", "message"),
    [
        ({"zero_stage": 0, "dp_replicate": 2}, "got 2, which needs zero_stage >= 1"),
        ({"zero_stage": 3, "dp_replicate": 2, "hybrid_shard": True}, "got 2 with hybrid_shard"),
        ({"zero_stage": 3, "dp_replicate": 3}, r"got 3, expected a divisor of dp x cp = 16"),
        ({"zero_stage": 3, "dp_replicate": 0}, r"got 0, expected an integer in \[1, 65536\]"),
    ],
)
def test_shard_replicas_refused_with_the_field_named(
    parallelism: dict[str, object], message: str
) -> None:
    with pytest.raises(EstimateError, match=r"training\.parallelism\.dp_replicate: " + message):
        resolve(llama(**parallelism))


def test_the_eager_experts_loop_under_expert_parallelism_is_refused_by_its_field() -> None:
    """Transformers' eager experts loop runs every expert on each rank: with expert
    parallelism it is an error naming the field, not a crash of the engine (a TypeError
    out of ``estimate()``, found by a wider draw of the property tests); either step alone
    is estimated, and a sweep leaves out the layouts that split the experts."""
    mixtral = load_model("mixtral-8x7b")
    hardware = HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8)
    both = TrainingSpec(moe_implementation="eager", parallelism=ParallelismSpec(ep=2))
    with pytest.raises(EstimateError) as refused:
        estimate(Scenario(mixtral, hardware, both))
    assert refused.value.field == "training.moe_implementation"
    assert "ep 2" in str(refused.value) and '"grouped"' in str(refused.value)
    for training in (
        TrainingSpec(moe_implementation="eager"),
        TrainingSpec(parallelism=ParallelismSpec(ep=2)),
    ):
        assert estimate(Scenario(mixtral, hardware, training)).device_bytes > 0
    found = {}
    for implementation in ("eager", "grouped"):
        s = Scenario(
            mixtral,
            hardware,
            TrainingSpec(moe_implementation=implementation, stack="custom", method="lora"),
        )
        space = sweep.default_space(s)
        parallel = (*((k, v) for k, v in space.parallel if k != "ep"), ("ep", (1, 2, 4)))
        space = dataclasses.replace(space, micro_batches=(1,), parallel=parallel)
        found[implementation] = {p.scenario.training.parallelism.ep for p in sweep.sweep(s, space)}
    assert found["eager"] == {1} and max(found["grouped"]) > 1
