"""``estimate(scenario) -> Estimate``: the one entry point of the memory model.

A pure function of a frozen :class:`~engine.specs.Scenario`; no I/O. The result carries the
named memory items, the three totals (allocated, reserved, device), the verdict against
the device's capacity and the budget line, and -- stated, never silently zero -- the parts
of a training step that this version does not model yet.

>>> from engine.presets import load_gpu, load_model
>>> from engine.specs import HardwareSpec, Scenario
>>> est = estimate(Scenario(load_model("gpt2"), HardwareSpec(load_gpu("rtx-4090"))))
>>> est.breakdown["parameters"] == 124_439_808 * 4
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.model_state import CATEGORIES, MemoryItem, model_state
from engine.specs import Scenario

SCHEMA_VERSION = 1
GIB = 1 << 30

#: What the step model does not include yet, in the words a user sees.
NOT_MODELLED = (
    "activations saved for backward (per layer, per attention kernel)",
    "logits and loss buffers",
    "autocast weight copies and optimizer temporaries",
    "caching-allocator rounding and fragmentation (reserved = allocated here)",
    "CUDA context and library workspaces (device = reserved here)",
)


@dataclass(frozen=True, slots=True)
class Estimate:
    """The memory of one training step of a scenario, per GPU, in bytes (integers)."""

    scenario: Scenario
    items: tuple[MemoryItem, ...]
    allocated_bytes: int
    reserved_bytes: int
    device_bytes: int
    capacity_bytes: int
    budget_bytes: int
    peak_phase: str
    peak_layer: int | None
    total_params: int
    trainable_params: int
    host_bytes: int
    bytes_per_trainable_param: float
    bytes_per_frozen_param: float
    bytes_per_param_formula: str
    not_modelled: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    @property
    def verdict(self) -> str:
        """``fits`` under the budget line, ``tight`` under capacity, else ``oom``."""
        if self.device_bytes <= self.budget_bytes:
            return "fits"
        if self.device_bytes <= self.capacity_bytes:
            return "tight"
        return "oom"

    @property
    def breakdown(self) -> dict[str, int]:
        """Bytes per category at the peak; the categories sum to ``device_bytes``."""
        sums = dict.fromkeys(CATEGORIES, 0)
        for item in self.items:
            sums[item.category] += item.bytes
        return sums

    @property
    def headroom_bytes(self) -> int:
        """Capacity minus the device total (negative when it does not fit)."""
        return self.capacity_bytes - self.device_bytes

    def to_dict(self) -> dict[str, Any]:
        """The stable ``--json`` shape (``memfit_estimate`` version 1)."""
        breakdown: dict[str, Any] = dict(self.breakdown)
        breakdown["items"] = [
            {
                "name": i.name,
                "category": i.category,
                "bytes": i.bytes,
                "formula": i.formula,
                "source": i.source,
            }
            for i in self.items
        ]
        totals = {
            "allocated_bytes": self.allocated_bytes,
            "reserved_bytes": self.reserved_bytes,
            "device_bytes": self.device_bytes,
        }
        return {
            "memfit_estimate": SCHEMA_VERSION,
            **totals,
            "capacity_bytes": self.capacity_bytes,
            "budget_bytes": self.budget_bytes,
            "verdict": self.verdict,
            "peak_phase": self.peak_phase,
            "peak_layer": self.peak_layer,
            "breakdown": breakdown,
            "parameters": {"total": self.total_params, "trainable": self.trainable_params},
            "bytes_per_parameter": {
                "trainable": self.bytes_per_trainable_param,
                "frozen": self.bytes_per_frozen_param,
                "formula": self.bytes_per_param_formula,
            },
            "host_bytes": self.host_bytes,
            "ranks": [{"group": "all", "ranks": self.scenario.hardware.world_size, **totals}],
            "not_modelled": list(self.not_modelled),
            "warnings": list(self.warnings),
        }


def not_modelled(scenario: Scenario) -> tuple[str, ...]:
    """The parts of this scenario's step that the estimate leaves out, in words."""
    notes = list(NOT_MODELLED)
    training = scenario.training
    if not training.parallelism.is_trivial:
        p = training.parallelism
        notes.append(
            f"parallelism (tp={p.tp}, pp={p.pp}, cp={p.cp}, ep={p.ep}, "
            f"zero_stage={p.zero_stage}): figures are for one unsharded replica"
        )
    if not training.offload.is_trivial:
        notes.append("offload to host or NVMe: figures keep everything on the device")
    return tuple(notes)


def estimate(scenario: Scenario) -> Estimate:
    """Estimate the per-GPU memory of one training step of ``scenario``."""
    state = model_state(scenario.model, scenario.training)
    allocated = state.total_bytes
    capacity = scenario.hardware.capacity_bytes
    budget = scenario.hardware.budget_bytes
    return Estimate(
        scenario=scenario,
        items=state.items,
        allocated_bytes=allocated,
        reserved_bytes=allocated,
        device_bytes=allocated,
        capacity_bytes=capacity,
        budget_bytes=budget,
        # with only model state, everything is live at once during the optimizer step
        peak_phase="optimizer",
        peak_layer=None,
        total_params=state.total_params,
        trainable_params=state.trainable_params,
        host_bytes=0,
        bytes_per_trainable_param=state.bytes_per_trainable_param,
        bytes_per_frozen_param=state.bytes_per_frozen_param,
        bytes_per_param_formula=state.bytes_per_param_formula,
        not_modelled=not_modelled(scenario),
        warnings=state.warnings,
    )
