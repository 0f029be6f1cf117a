"""The parallel axes are described once (:data:`memfit.engine.specs.PARALLEL_AXES`): the
spec's check, the mesh, the CLI, the report, the sweep and the app read the registry, and
no module lists the axes by name again."""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[2]


def moe(**parallelism: int) -> Scenario:
    return Scenario(
        load_model("mixtral-8x7b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8, nodes=2),
        TrainingSpec(
            method="lora",
            sequence_length=4096,
            parallelism=ParallelismSpec(zero_stage=1, **parallelism),
        ),
    )


def test_the_registry_names_each_field_once() -> None:
    keys = [a.key for a in PARALLEL_AXES]
    assert keys == ["tp", "pp", "cp", "ep"]
    assert WORLD_AXES == ("tp", "pp", "cp")
    spec = ParallelismSpec(tp=2, pp=4, cp=2, ep=8)
    assert [spec.size(k) for k in keys] == [2, 4, 2, 8]
    assert spec.model_parallel == 16
    for axis in PARALLEL_AXES:
        with pytest.raises(EstimateError, match=rf"training\.parallelism\.{axis.key}: got 0"):
            ParallelismSpec(**{axis.key: 0})


def test_the_mesh_and_its_json_read_the_registry() -> None:
    s = moe(tp=2, pp=2, ep=4)
    mesh = resolve(s).mesh
    assert mesh.sizes == (2, 2, 1, 4) and mesh.dp == 4
    assert [mesh.size(a.key) for a in PARALLEL_AXES] == [mesh.tp, mesh.pp, mesh.cp, mesh.ep]
    # the JSON shape of the mesh is the one it always had
    assert list(estimate(s).to_dict()["mesh"]) == [
        "world", "tp", "pp", "cp", "ep", "dp", "shard", "vpp"
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
    with pytest.raises(EstimateError, match=r"tp x pp x cp = 32 must divide the 16 GPUs"):
        resolve(moe(tp=8, pp=4))


def test_the_cli_has_a_flag_for_each_axis() -> None:
    parser = make_parser()
    args = parser.parse_args(["estimate", *(x for a in PARALLEL_AXES for x in (f"--{a.key}", "2"))])
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
