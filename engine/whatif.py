"""What-if changes: one switch each, applied to a scenario alone, with its compute cost.

The app shows each as a toggle with a ghost bar beside the current one; the CLI can list
them too. A change that does not apply (LoRA when LoRA is already on) gives ``None``.

>>> from engine.presets import load_gpu, load_model
>>> from engine.specs import HardwareSpec, Scenario
>>> s = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("l4")))
>>> WHATIFS_BY_KEY["8bit-optimizer"].apply(s).training.optimizer
'adamw-8bit'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import EstimateError
from engine.estimate import Estimate, estimate
from engine.specs import Scenario, TrainingSpec

Change = Callable[[TrainingSpec], TrainingSpec | None]


def _set(**fields: object) -> Change:
    def change(t: TrainingSpec) -> TrainingSpec | None:
        if all(getattr(t, k) == v for k, v in fields.items()):
            return None
        return dataclasses.replace(t, **fields)  # type: ignore[arg-type]

    return change


def _mixed(t: TrainingSpec) -> TrainingSpec | None:
    return dataclasses.replace(t, precision="bf16-mixed") if t.precision == "fp32" else None


def _eight_bit(t: TrainingSpec) -> TrainingSpec | None:
    if t.optimizer == "adamw":
        return dataclasses.replace(t, optimizer="adamw-8bit")
    return None


def _zero3(t: TrainingSpec) -> TrainingSpec | None:
    if t.parallelism.zero_stage == 3:
        return None
    return dataclasses.replace(t, parallelism=dataclasses.replace(t.parallelism, zero_stage=3))


def _cpu_offload(t: TrainingSpec) -> TrainingSpec | None:
    if t.offload.optimizer != "none":
        return None
    stage = max(1, t.parallelism.zero_stage)
    return dataclasses.replace(
        t,
        parallelism=dataclasses.replace(t.parallelism, zero_stage=stage),
        offload=dataclasses.replace(t.offload, optimizer="cpu"),
    )


@dataclass(frozen=True, slots=True)
class WhatIf:
    """One change to a scenario; ``compute_factor`` is the step time relative to before."""

    key: str
    label: str
    change: Change
    compute_factor: float
    compute_note: str

    def apply(self, scenario: Scenario) -> Scenario | None:
        """The scenario with this change alone, or ``None`` if it changes nothing."""
        training = self.change(scenario.training)
        if training is None:
            return None
        return dataclasses.replace(scenario, training=training)


WHATIFS: tuple[WhatIf, ...] = (
    WhatIf(
        "mixed-precision",
        "Mixed precision (bf16)",
        _mixed,
        0.5,
        "about 2x faster matmuls on tensor cores",
    ),
    WhatIf(
        "checkpointing",
        "Gradient checkpointing",
        _set(activation_checkpointing="full"),
        1.33,
        "+33 % compute: the forward runs again in backward (Chen et al. 2016)",
    ),
    WhatIf(
        "lora",
        "LoRA (r=16)",
        _set(method="lora"),
        0.7,
        "about -30 % compute: no weight gradients for the frozen base",
    ),
    WhatIf(
        "qlora",
        "QLoRA (4-bit base)",
        _set(method="qlora"),
        0.9,
        "about +30 % over LoRA: weights are dequantized for every matmul",
    ),
    WhatIf("8bit-optimizer", "8-bit AdamW", _eight_bit, 1.0, "no measurable compute cost"),
    WhatIf(
        "fused-optimizer",
        "Fused optimizer",
        _set(optimizer_impl="fused"),
        1.0,
        "a slightly faster optimizer step",
    ),
    WhatIf(
        "zero3",
        "ZeRO-3 / FSDP",
        _zero3,
        1.1,
        "parameters gathered layer by layer: 1.5x the data-parallel traffic (ZeRO, sec. 7)",
    ),
    WhatIf(
        "cpu-offload",
        "CPU offload",
        _cpu_offload,
        1.3,
        "optimizer step on the CPU; gradients and weights cross PCIe every step",
    ),
    WhatIf(
        "flash-attention",
        "Flash attention",
        _set(attention="flash"),
        0.9,
        "faster attention; no s x s scores kept",
    ),
)
WHATIFS_BY_KEY = {w.key: w for w in WHATIFS}


@dataclass(frozen=True, slots=True)
class WhatIfResult:
    whatif: WhatIf
    scenario: Scenario
    estimate: Estimate
    #: device bytes saved against the current scenario (negative: it costs memory)
    saved_bytes: int


def evaluate(scenario: Scenario, current: Estimate, key: str) -> WhatIfResult | None:
    """Estimate the what-if ``key`` on ``scenario``; ``None`` if it does not apply or fails."""
    whatif = WHATIFS_BY_KEY[key]
    try:
        variant = whatif.apply(scenario)
        if variant is None:
            return None
        result = estimate(variant)
    except EstimateError:
        return None
    return WhatIfResult(whatif, variant, result, current.device_bytes - result.device_bytes)
