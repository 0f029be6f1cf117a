"""The multi-GPU dataset (``dataset_multi.json``, written by ``python -m
validation.measure_multi``): its schema and coverage, that every scenario is one MemFit reads,
and -- where PyTorch is installed -- that re-measuring a case reproduces its stored figures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from memfit.engine.scenario_io import scenario_from_dict

DATASET = Path(__file__).with_name("dataset_multi.json")
ROOT = Path(__file__).resolve().parents[2]

PHASES = {"forward", "backward", "optimizer"}
DETAIL_PHASES = {"forward", "loss", "backward", "optimizer"}
CATEGORIES = {"parameters", "gradients", "optimizer_states", "other"}
FSDP_CATEGORIES = {
    "unsharded_parameters",
    "unsharded_gradients",
    "all_gather_buffers",
    "reduce_scatter_buffers",
}
PARALLELISM_KEYS = {
    "tp", "pp", "cp", "ep", "zero_stage", "framework", "hybrid_shard", "sequence_parallel",
    "vpp", "pp_schedule",
}  # fmt: skip
GRANULARITY = 512

#: re-measured by the torch test: one FSDP2 and one tensor-parallel case, both quick
REMEASURED = (
    "llama-2-7b_L2_fsdp2-z3-w2_bf16-mixed_adamw-fused_sdpa_b1_s2048",
    "llama-3.2-1b_L4_tp4-vocab-sp_bf16_adamw-fused_sdpa_b2_s1024",
)


@cache
def _load() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(DATASET.read_text(encoding="utf-8"))
    return data


def _by_id() -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in _load()}


def test_dataset_is_a_list_with_unique_ids() -> None:
    data = _load()
    assert isinstance(data, list) and len(data) >= 25
    ids = [c["id"] for c in data]
    assert len(set(ids)) == len(ids)


def test_coverage() -> None:
    fsdp: set[tuple[int, int, str]] = set()
    tp: set[tuple[int, bool, str]] = set()
    for c in _load():
        s, setup = c["scenario"], c["setup"]
        p, world = s["training"]["parallelism"], s["hardware"]["gpus_per_node"]
        if setup["strategy"] == "fsdp2":
            fsdp.add((world, p["zero_stage"], s["training"]["precision"]))
        else:
            tp.add((p["tp"], p["sequence_parallel"], setup["tp_plan"]))
    for world in (2, 4, 8):
        for stage in (2, 3):
            for precision in ("bf16-mixed", "fp32"):
                assert (world, stage, precision) in fsdp
    hsdp = {
        (
            c["scenario"]["hardware"]["gpus_per_node"],
            c["scenario"]["training"]["parallelism"]["dp_replicate"],
        )
        for c in _load()
        if c["scenario"]["training"]["parallelism"].get("dp_replicate", 1) > 1
    }
    assert {(4, 2), (8, 2), (8, 4)} <= hsdp
    for size in (2, 4):
        assert (size, False, "layers") in tp
        assert (size, False, "vocab") in tp
        assert (size, True, "vocab") in tp


@pytest.mark.parametrize("case", _load(), ids=lambda c: c["id"])
def test_case_schema(case: dict[str, Any]) -> None:
    assert set(case) >= {"id", "family", "scenario", "setup", "measured", "notes", "env"}
    s, setup, m = case["scenario"], case["setup"], case["measured"]
    assert s["memfit_scenario"] == 1
    world = s["hardware"]["gpus_per_node"]
    assert world in (2, 4, 8)
    t = s["training"]
    p = t["parallelism"]
    # HSDP cases name their replicas (FSDP2 on a 2-D mesh), the cases of another
    # mixed-precision policy its dtypes; the others have neither
    replicas = p.get("dp_replicate", 1)
    policy = {"fsdp_param_dtype", "fsdp_reduce_dtype"}
    optional = ({"dp_replicate"} if "dp_replicate" in p else set()) | (policy & set(p))
    assert set(p) == PARALLELISM_KEYS | optional
    if policy & set(p):
        assert (p["fsdp_param_dtype"], p["fsdp_reduce_dtype"]) == (
            setup["fsdp_param_dtype"],
            setup["fsdp_reduce_dtype"],
        )
    assert replicas == 1 or (replicas > 1 and world % replicas == 0 and "mesh" in case["setup"])
    assert (p["pp"], p["cp"], p["ep"], p["vpp"], p["hybrid_shard"]) == (1, 1, 1, 1, False)
    assert p["framework"] == "pytorch"
    assert t["method"] == "full" and t["activation_checkpointing"] == "none"
    assert case["env"]["world_size"] == world and case["env"]["rank"] == 0
    assert all(isinstance(n, str) and n for n in case["notes"])

    if setup["strategy"] == "fsdp2":
        assert p["tp"] == 1 and p["sequence_parallel"] is False
        assert p["zero_stage"] == (3 if setup["reshard_after_forward"] else 2)
        assert setup["fsdp_mixed_precision"] == (t["precision"] == "bf16-mixed")
        # every rank holds 1/S of the model, S the ranks of its shard group (W, or W over
        # the replicas of HSDP), each shard padded to the same size
        shards = world // replicas
        assert m["param_bytes_local"] * shards >= m["param_bytes_full"]
        assert m["param_bytes_local"] * shards < m["param_bytes_full"] * 1.01
        assert set(m["breakdown_at_peak"]) == CATEGORIES | FSDP_CATEGORIES
    else:
        assert setup["strategy"] == "tp"
        assert p["tp"] == world and p["zero_stage"] == 0
        assert setup["tp_vocab_parallel"] == (setup["tp_plan"] == "vocab")
        if p["sequence_parallel"]:
            assert setup["tp_vocab_parallel"]
        assert m["param_bytes_full"] / world <= m["param_bytes_local"] < m["param_bytes_full"]
        assert set(m["breakdown_at_peak"]) == CATEGORIES

    positive = (
        "peak_allocated_bytes",
        "peak_allocated_raw_bytes",
        "first_step_peak_bytes",
        "before_step_bytes",
        "param_bytes_full",
        "param_bytes_local",
        "logits_bytes",
    )
    for key in positive:
        assert isinstance(m[key], int) and m[key] > 0, key
    assert m["peak_allocated_bytes"] % GRANULARITY == 0
    assert m["peak_allocated_raw_bytes"] <= m["peak_allocated_bytes"]
    assert m["before_step_bytes"] <= m["peak_allocated_bytes"]
    assert m["after_step_bytes"] == m["before_step_bytes"]  # the step ends where it began
    assert m["peak_phase"] in PHASES
    assert set(m["phase_peaks"]) == DETAIL_PHASES
    assert max(m["phase_peaks"].values()) == m["peak_allocated_bytes"]
    assert sum(m["breakdown_at_peak"].values()) == m["peak_allocated_bytes"]
    assert all(v >= 0 for v in m["breakdown_at_peak"].values())
    assert m["breakdown_at_peak"]["parameters"] == m["param_bytes_local"]
    # before the step: the parameters (shards) and the optimizer states, nothing gathered
    before = m["breakdown_before_step"]
    assert before["parameters"] == m["param_bytes_local"]
    assert before.get("unsharded_parameters", 0) == 0
    assert before["gradients"] == 0
    released = m["outputs_released_before_backward"]
    assert released["peak_allocated_bytes"] <= m["peak_allocated_bytes"]


@pytest.mark.parametrize("case", _load(), ids=lambda c: c["id"])
def test_scenario_loads_in_the_engine(case: dict[str, Any]) -> None:
    scenario = scenario_from_dict(case["scenario"])
    p = case["scenario"]["training"]["parallelism"]
    assert scenario.hardware.gpus_per_node == case["scenario"]["hardware"]["gpus_per_node"]
    assert scenario.training.parallelism.tp == p["tp"]
    assert scenario.training.parallelism.zero_stage == p["zero_stage"]
    assert scenario.training.parallelism.sequence_parallel == p["sequence_parallel"]
    assert scenario.model.num_layers <= 4


def test_dataset_matches_the_case_list() -> None:
    """The checked-in measurements are those of ``validation/cases_multi.py`` as it is now."""
    cases = pytest.importorskip("validation.cases_multi")
    listed = {c["id"]: c for c in cases.all_cases()}
    measured = _by_id()
    assert set(listed) == set(measured)
    for cid, case in listed.items():
        assert measured[cid]["scenario"] == json.loads(json.dumps(case["scenario"])), cid
        assert measured[cid]["setup"] == json.loads(json.dumps(case["setup"])), cid


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler")
def test_remeasuring_reproduces_the_stored_figures() -> None:
    """One FSDP2 and one tensor-parallel case, measured again (in a subprocess: the fake CUDA
    hooks load before torch), give the stored peak, phase peaks and breakdown to the byte."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    code = textwrap.dedent(
        f"""
        import json
        from validation.cases_multi import all_cases
        from validation.measure_multi import measure_case
        want = {list(REMEASURED)!r}
        out = [measure_case(c)["measured"] for c in all_cases() if c["id"] in want]
        print(json.dumps(out))
        """
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fresh = json.loads(done.stdout.strip().splitlines()[-1])
    stored = [_by_id()[cid]["measured"] for cid in REMEASURED]
    assert len(fresh) == len(stored)
    for new, old in zip(fresh, stored, strict=True):
        for key in ("peak_allocated_bytes", "peak_allocated_raw_bytes", "phase_peaks",
                    "breakdown_at_peak", "before_step_bytes", "param_bytes_local"):  # fmt: skip
            assert new[key] == old[key], key
