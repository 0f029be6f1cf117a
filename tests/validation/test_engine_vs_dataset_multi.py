"""MemFit against the traced multi-GPU steps of ``dataset_multi.json``.

FSDP2 (``fully_shard`` per layer and on the root, ZeRO-3 and SHARD_GRAD_OP, with and
without ``MixedPrecisionPolicy``; HSDP on a 2-D mesh of replicas x shards) and DTensor
tensor parallelism (vocabulary-parallel embedding and LM head, with and without sequence
parallelism), traced rank by rank with PyTorch's fake process group. Compared: the
allocated peak of rank 0.

Not compared: the ``tp_plan = "layers"`` cases, which keep the embedding and the LM head
whole on every rank; MemFit's tensor parallelism is Megatron's (vocabulary-parallel), as
in Megatron-LM and torchtitan.

What MemFit leaves out and these cases show: DTensor returns the vocabulary-parallel
embedding's gradient replicated (``V x h`` on every rank), so MemFit is low on the tensor
parallel cases by about that much; the two-layer FSDP2 models never reach the steady
state of prefetching that MemFit assumes for real depths, so it is high on them.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from memfit.engine.estimate import estimate
from memfit.engine.scenario_io import scenario_from_dict
from tests.validation.traced import as_traced

CASES = [
    c
    for c in json.loads(Path(__file__).with_name("dataset_multi.json").read_text())
    if c["setup"].get("tp_plan") != "layers"
]


def error(case: dict[str, Any]) -> float:
    est = estimate(scenario_from_dict(as_traced(case["scenario"])))
    return est.allocated_bytes / case["measured"]["peak_allocated_bytes"] - 1


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_every_case_within_18_percent(case: dict[str, Any]) -> None:
    # the harness holds the model output through the optimizer step, and the estimate
    # now counts it there too: the two-layer FSDP2 cases, high already (above), reach 16 %
    assert abs(error(case)) <= 0.18


def test_median_error_within_8_percent() -> None:
    errors = [abs(error(c)) for c in CASES]
    assert len(errors) >= 20
    assert statistics.median(errors) <= 0.08


def test_hsdp_holds_what_plain_fsdp_over_its_shard_group_holds() -> None:
    """FSDP2 on a 2-D mesh (HSDP: ``dp_replicate`` groups, each holding a whole set of
    shards) traces to the byte what plain FSDP2 over the shard group's ranks does: the
    replicas' all-reduce adds no memory. MemFit's ``dp_replicate`` gives the same answer
    as the plain case, and so the same error."""
    by_id = {c["id"]: c for c in CASES}
    pairs = 0
    for case in CASES:
        p = case["scenario"]["training"]["parallelism"]
        replicas = p.get("dp_replicate", 1)
        if replicas == 1:
            continue
        world = case["scenario"]["hardware"]["gpus_per_node"]
        twin = by_id[case["id"].replace(f"-w{world}-r{replicas}", f"-w{world // replicas}")]
        traced = case["measured"]["peak_allocated_bytes"]
        assert traced == twin["measured"]["peak_allocated_bytes"], case["id"]
        assert error(case) == error(twin), case["id"]
        pairs += 1
    assert pairs >= 12
