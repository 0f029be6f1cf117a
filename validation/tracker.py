"""Count live tensor storages the way the CUDA caching allocator counts allocations.

:class:`StorageTracker` is a ``TorchDispatchMode``: every operator's outputs pass through
it, and each *storage* (not tensor: views share one) is counted once, from the moment an
operator first returns it until a weak-reference callback reports that PyTorch freed it.
That is the quantity ``torch.cuda.memory_allocated()`` follows, and its running maximum is
``torch.cuda.max_memory_allocated()``.

Two totals are kept side by side:

* ``raw`` -- the storages' ``nbytes``;
* ``rounded`` -- each storage rounded up to the caching allocator's granularity, 512 bytes
  (``kMinBlockSize``; a request of 1..512 bytes takes 512, an empty storage takes none).
  This is what ``max_memory_allocated`` adds up for allocations it does not split.

The tracker labels time with *phases* (``forward``, ``loss``, ``backward``, ``optimizer``,
or anything the caller names) and keeps the peak of each phase. At the overall peak it
records a breakdown into ``parameters``, ``gradients``, ``optimizer_states`` and ``other``
(activations, temporaries, buffers, inputs) by matching live storages against the
parameters, their ``.grad`` and the optimizer's state tensors *at that moment* (a temporary
of the backward pass becomes a gradient when ``AccumulateGrad`` adopts it).

Only storages on ``device_type`` are counted (``"cuda"`` for fake-CUDA runs, ``"cpu"``
for the exactness tests); storages that exist before the tracker is entered are invisible
until :meth:`StorageTracker.adopt` is given tensors that hold them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

#: The CUDA caching allocator rounds every request up to a multiple of this
#: (``kMinBlockSize`` in c10/cuda/CUDACachingAllocator.cpp).
CUDA_GRANULARITY = 512

CATEGORIES = ("parameters", "gradients", "optimizer_states", "other")


def round_up(nbytes: int, granularity: int = CUDA_GRANULARITY) -> int:
    """Bytes the caching allocator books for a request of ``nbytes`` (0 stays 0)."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // granularity) * granularity


@dataclass
class PhasePeak:
    raw: int = 0
    rounded: int = 0


@dataclass
class Snapshot:
    """Totals at one moment, with the breakdown by category (rounded bytes)."""

    raw: int = 0
    rounded: int = 0
    phase: str = ""
    breakdown: dict[str, int] = field(default_factory=dict)
    breakdown_raw: dict[str, int] = field(default_factory=dict)


class StorageTracker(TorchDispatchMode):
    """Live-storage accounting with phases, peaks and a breakdown at the peak."""

    def __init__(self, device_type: str = "cuda", granularity: int = CUDA_GRANULARITY) -> None:
        super().__init__()
        self.device_type = device_type
        self.granularity = granularity
        self._lock = threading.RLock()
        # storage key -> (raw bytes, rounded bytes, weakref keeping the callback alive)
        self._live: dict[int, tuple[int, int, weakref.ref[Any]]] = {}
        self.raw = 0
        self.rounded = 0
        self.phase = "idle"
        self.phase_peaks: dict[str, PhasePeak] = {}
        self.peak = Snapshot()
        self.ops = 0
        self.ops_by_phase: dict[str, int] = {}
        self._params: list[torch.Tensor] = []
        self._param_keys: set[int] = set()
        self._optimizers: list[torch.optim.Optimizer] = []

    # ------------------------------------------------------------------ bookkeeping
    @staticmethod
    def storage_key(storage: torch.UntypedStorage) -> int:
        return int(storage._cdata)

    def _on_free(self, key: int, ref: weakref.ref[Any]) -> None:
        with self._lock:
            entry = self._live.get(key)
            if entry is None or entry[2] is not ref:
                return
            del self._live[key]
            self.raw -= entry[0]
            self.rounded -= entry[1]

    def _add_storage(self, storage: torch.UntypedStorage) -> bool:
        key = self.storage_key(storage)
        nbytes = int(storage.nbytes())
        entry = self._live.get(key)
        if entry is not None:
            if entry[0] != nbytes:  # resized in place
                rounded = round_up(nbytes, self.granularity)
                self.raw += nbytes - entry[0]
                self.rounded += rounded - entry[1]
                self._live[key] = (nbytes, rounded, entry[2])
                return True
            return False
        ref = weakref.ref(storage, lambda r, k=key: self._on_free(k, r))
        rounded = round_up(nbytes, self.granularity)
        self._live[key] = (nbytes, rounded, ref)
        self.raw += nbytes
        self.rounded += rounded
        return True

    def _tensors_storages(self, tensors: Iterable[Any]) -> Iterator[torch.UntypedStorage]:
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
                continue
            if t.is_sparse or t.is_nested:
                continue
            try:
                yield t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue

    def adopt(self, tensors: Iterable[Any]) -> None:
        """Count storages that were created before the tracker was entered."""
        with self._lock:
            changed = False
            for st in self._tensors_storages(tensors):
                changed |= self._add_storage(st)
            if changed:
                self._update_peak()

    def watch(
        self,
        params: Iterable[torch.Tensor] = (),
        optimizers: Iterable[torch.optim.Optimizer] = (),
    ) -> None:
        """Name the tensors the breakdown sorts into parameters / gradients / optimizer."""
        self._params = [p for p in params]
        self._param_keys = {self.storage_key(st) for st in self._tensors_storages(self._params)}
        self._optimizers = list(optimizers)

    # ------------------------------------------------------------------ phases and peaks
    @contextmanager
    def phase_scope(self, name: str) -> Iterator[None]:
        previous = self.phase
        self.set_phase(name)
        try:
            yield
        finally:
            self.set_phase(previous)

    def set_phase(self, name: str) -> None:
        with self._lock:
            self.phase = name
            peak = self.phase_peaks.setdefault(name, PhasePeak())
            # memory already live when a phase begins belongs to its peak too
            peak.raw = max(peak.raw, self.raw)
            peak.rounded = max(peak.rounded, self.rounded)

    def reset_peaks(self) -> None:
        """Forget peaks (``torch.cuda.reset_peak_memory_stats``); live storages stay."""
        with self._lock:
            self.phase_peaks = {}
            self.peak = Snapshot(raw=self.raw, rounded=self.rounded, phase=self.phase)
            self.peak.breakdown, self.peak.breakdown_raw = self.breakdown()
            self.set_phase(self.phase)

    def _update_peak(self) -> None:
        peak = self.phase_peaks.setdefault(self.phase, PhasePeak())
        if self.raw > peak.raw:
            peak.raw = self.raw
        if self.rounded > peak.rounded:
            peak.rounded = self.rounded
        if self.rounded > self.peak.rounded or (
            self.rounded == self.peak.rounded and self.raw > self.peak.raw
        ):
            rounded, raw = self.breakdown()
            self.peak = Snapshot(self.raw, self.rounded, self.phase, rounded, raw)

    def breakdown(self) -> tuple[dict[str, int], dict[str, int]]:
        """Live bytes by category now: (rounded, raw)."""
        grads: set[int] = set()
        for st in self._tensors_storages(p.grad for p in self._params if p.grad is not None):
            grads.add(self.storage_key(st))
        states: set[int] = set()
        for opt in self._optimizers:
            for state in opt.state.values():
                for st in self._tensors_storages(state.values()):
                    states.add(self.storage_key(st))
        rounded = dict.fromkeys(CATEGORIES, 0)
        raw = dict.fromkeys(CATEGORIES, 0)
        for key, (nbytes, rbytes, _) in self._live.items():
            if key in self._param_keys:
                cat = "parameters"
            elif key in grads:
                cat = "gradients"
            elif key in states:
                cat = "optimizer_states"
            else:
                cat = "other"
            rounded[cat] += rbytes
            raw[cat] += nbytes
        return rounded, raw

    def live_storages(self) -> int:
        return len(self._live)

    # ------------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten(out)
        with self._lock:
            self.ops += 1
            self.ops_by_phase[self.phase] = self.ops_by_phase.get(self.phase, 0) + 1
            changed = False
            for st in self._tensors_storages(flat):
                changed |= self._add_storage(st)
            if changed:
                self._update_peak()
        return out
