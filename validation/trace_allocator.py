"""Replay the allocations of traced steps through the caching allocator's rules and compare
the reserved peak with what a GPU reported.

    VENV/bin/python -m validation.trace_allocator [CASE_ID ...]

(writes ``validation/gpu/allocator_replay.json``)

Each case of the traced datasets that ``validation/gpu/h200_steps.jsonl`` also measured is
traced again (:func:`validation.step.measure`, fake CUDA tensors), recording every storage
the step allocates and frees in order: the parameters and inputs as the tracker adopts
them, then three steps. The sequence is replayed through :class:`validation.allocator.
Allocator`, whose peaks restart where the second step starts, as the GPU runner's did, and
the peaks are written beside the GPU's ``max_memory_allocated`` and
``max_memory_reserved``. Without case ids: a spread of the measured cases by their
reserved-over-allocated ratio.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "validation" / "gpu" / "h200_steps.jsonl"
OUT = ROOT / "validation" / "gpu" / "allocator_replay.json"


def _recorded(events: list[tuple[str, int, int]]) -> Any:
    """The tracker, patched to append (``a``/``f``, storage key, bytes) and ``step`` events."""
    from validation import tracker as t

    add, free, reset = (
        t.StorageTracker._add_storage,
        t.StorageTracker._on_free,
        t.StorageTracker.reset_peaks,
    )

    def adding(self: Any, storage: Any) -> bool:
        key = self.storage_key(storage)
        known = key in self._live
        changed = add(self, storage)
        if changed and known:  # resized in place: freed and allocated again
            events.append(("f", key, 0))
        if changed:
            events.append(("a", key, int(storage.nbytes())))
        return changed

    def freeing(self: Any, key: int, ref: Any) -> None:
        entry = self._live.get(key)
        if entry is not None and entry[2] is ref:
            events.append(("f", key, entry[0]))
        free(self, key, ref)

    def resetting(self: Any) -> None:
        events.append(("step", 0, 0))
        reset(self)

    t.StorageTracker._add_storage = adding  # type: ignore[method-assign]
    t.StorageTracker._on_free = freeing  # type: ignore[method-assign]
    t.StorageTracker.reset_peaks = resetting  # type: ignore[method-assign]


def replay(events: list[tuple[str, int, int]]) -> tuple[int, int]:
    """The allocated and reserved peaks of the second step."""
    from validation.allocator import Allocator

    a, steps, peaks = Allocator(), 0, (0, 0)
    for kind, key, nbytes in events:
        if kind == "a" and nbytes:
            a.malloc(key, nbytes)
        elif kind == "f":
            a.free(key)
        elif kind == "step":
            steps += 1
            if steps == 2:
                a.reset_peak()
            elif steps == 3:
                peaks = (a.peak_allocated, a.peak_reserved)
    return peaks


def _spread(gpu: dict[str, Any], n: int = 13) -> list[str]:
    ratios = sorted(
        (g["peak_reserved_bytes"] / g["peak_allocated_bytes"], i) for i, g in gpu.items()
    )
    step = max(1, len(ratios) // n)
    return [i for _, i in ratios[::step]]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(ROOT))
    from validation import fakecuda  # noqa: F401  (before torch: it registers the CUDA hooks)

    events: list[tuple[str, int, int]] = []
    _recorded(events)
    from validation import step

    gpu = {}
    for line in GPU.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("part") == "traced":
            gpu[rec["id"]] = rec["gpu"]
    cases = {}
    for name in ("dataset.json", "dataset_conventions.json"):
        for case in json.loads((ROOT / "tests" / "validation" / name).read_text()):
            cases[case["id"]] = case
    ids = [i for i in (args or _spread(gpu)) if i in cases and i in gpu]
    out = json.loads(OUT.read_text()) if OUT.exists() else {}
    for case_id in ids:
        events.clear()
        step.measure(step.spec_from_scenario(cases[case_id]["scenario"]))
        gc.collect()
        allocated, reserved = replay(events)
        g = gpu[case_id]
        out[case_id] = {
            "replayed_allocated_bytes": allocated,
            "replayed_reserved_bytes": reserved,
            "gpu_allocated_bytes": g["peak_allocated_bytes"],
            "gpu_reserved_bytes": g["peak_reserved_bytes"],
            "events": len(events),
        }
        error = reserved / g["peak_reserved_bytes"] - 1
        gib = g["peak_reserved_bytes"] / 2**30
        print(
            f"{case_id[:80]:80s} reserved: replayed {reserved / 2**30:6.2f} GiB,"
            f" GPU {gib:6.2f} GiB ({error:+.1%})",
            flush=True,
        )
        OUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
