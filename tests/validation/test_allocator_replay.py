"""The caching allocator's rules, and what replaying traced steps through them shows.

``validation/allocator.py`` models PyTorch's CUDA caching allocator; replaying the storages
a traced step allocates and frees, in order, through it (``validation/trace_allocator.py``)
gives the reserved peak the GPU reported at a 0.4 % median over the 147 cases recorded in
``validation/gpu/allocator_replay.json`` (p90 11 %) -- where MemFit's reserved model (5 % of
the peak activations) is 9 % low at the median. The reserved peak follows from the order of
allocations: the path for MemFit's reserved total is to replay its own step this way.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from validation.allocator import MIB, Allocator

REPLAY = json.loads(
    (Path(__file__).parents[2] / "validation" / "gpu" / "allocator_replay.json").read_text()
)


def test_small_requests_share_two_mib_segments_and_round_to_512_bytes() -> None:
    a = Allocator()
    for i in range(4):
        a.malloc(i, 1000)  # 1,024 B each, from one 2 MiB segment
    assert a.reserved == 2 * MIB and a.allocated == 4 * 1024
    a.malloc("mib", MIB)  # 1 MiB is still small: the rest of the segment fits it
    assert a.reserved == 2 * MIB


def test_large_requests_take_20_mib_segments_below_10_mib_and_their_size_above() -> None:
    a = Allocator()
    a.malloc("a", 2 * MIB)
    assert a.reserved == 20 * MIB
    a.malloc("b", 17 * MIB)  # the rest of the first segment is 18 MiB: best fit, split
    assert a.reserved == 20 * MIB
    a.malloc("c", 11 * MIB + 1)  # rounded up to 12 MiB, a segment of its own
    assert a.reserved == 32 * MIB


def test_a_freed_block_merges_with_its_free_neighbours_and_is_reused() -> None:
    a = Allocator()
    a.malloc("a", 30 * MIB)
    a.malloc("b", 30 * MIB)
    a.free("a")
    a.malloc("c", 31 * MIB)  # does not fit the 30 MiB hole: a new segment
    assert a.reserved == 92 * MIB
    a.free("b")
    a.free("c")
    a.malloc("d", 30 * MIB)  # best fit: one of the 30 MiB segments, no new one
    assert a.reserved == 92 * MIB and a.peak_reserved == 92 * MIB


def test_replaying_traced_steps_gives_the_reserved_peak_the_gpu_reported() -> None:
    """All 147 traced cases the GPU ran: a 0.4 % median, 127 within 6 %. Where the trace's
    allocated peak is the GPU's to 3 % (133 cases), the replayed reserved peak is within
    4.8 % on nine in ten; the rest are allocations the trace does not see (Falcon's attention
    on the GPU, -10 to -23 % allocated) or sees more of (Mixtral's eager experts)."""

    def error(r: dict) -> float:
        return abs(r["replayed_reserved_bytes"] / r["gpu_reserved_bytes"] - 1)

    cases = list(REPLAY.values())
    assert len(cases) >= 140
    errors = sorted(error(r) for r in cases)
    assert statistics.median(errors) <= 0.02, statistics.median(errors)
    assert sum(e <= 0.06 for e in errors) >= 0.8 * len(errors)
    alike = sorted(
        error(r)
        for r in cases
        if abs(r["replayed_allocated_bytes"] / r["gpu_allocated_bytes"] - 1) <= 0.03
    )
    assert len(alike) >= 120
    assert alike[int(0.9 * len(alike))] <= 0.08
    for r in cases:  # the replay adds only the allocator to what the trace allocates
        assert r["replayed_reserved_bytes"] >= r["replayed_allocated_bytes"]
