"""What-if changes: one switch each, applied to a scenario alone, with its compute cost.

The app shows each as a toggle with a ghost bar beside the current one; the CLI can list
them too. A change that does not apply gives ``None`` from :meth:`WhatIf.apply`, and
:func:`assess` says why: LoRA when LoRA is already on, ZeRO-3 with nothing to shard (one
GPU, or a data-parallel group of one), flash attention when the kernel in use already is
flash.

The compute cost of a change can depend on the scenario (QLoRA costs less than full
fine-tuning but more than LoRA), so it is :meth:`WhatIf.cost` of a scenario: a factor on
the step time and a note whose percentage is written from that same factor
(:func:`compute_text`), so the two can never disagree.

>>> from engine.presets import load_gpu, load_model
>>> from engine.specs import HardwareSpec, Scenario
>>> s = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("l4")))
>>> WHATIFS_BY_KEY["8bit-optimizer"].apply(s).training.optimizer
'adamw-8bit'
>>> WHATIFS_BY_KEY["zero3"].unavailable(s)
'one GPU: there is nothing to shard'
>>> compute_text(1.33)
'+33 % compute'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import EstimateError
from engine.estimate import Estimate, estimate
from engine.layers import attention_kernel
from engine.sharding import make_mesh
from engine.specs import Scenario, TrainingSpec

#: A change: the new training spec, or the reason it does not apply to this scenario.
Change = Callable[[Scenario], TrainingSpec | str]
#: A scenario-dependent compute cost: (factor on the step time, why).
Cost = Callable[[Scenario], tuple[float, str]]

#: QLoRA's dequantization of the 4-bit base for every matmul, relative to LoRA
#: (Dettmers et al. 2023 report QLoRA training about 30 % slower than 16-bit LoRA)
QLORA_OVER_LORA = 1.3
#: LoRA relative to full fine-tuning: no weight gradients for the frozen base
LORA_OVER_FULL = 0.7


def compute_text(factor: float) -> str:
    """The step-time factor as the words shown with a what-if: ``+33 % compute``."""
    if round(100 * (factor - 1)) == 0:
        return "same compute"
    return f"{100 * (factor - 1):+.0f} % compute"


def _set(reason: str, **fields: object) -> Change:
    """A change that sets ``fields``; ``reason`` when they already have those values."""

    def change(s: Scenario) -> TrainingSpec | str:
        t = s.training
        if all(getattr(t, k) == v for k, v in fields.items()):
            return reason
        return dataclasses.replace(t, **fields)  # type: ignore[arg-type]

    return change


def _mixed(s: Scenario) -> TrainingSpec | str:
    t = s.training
    if t.precision != "fp32":
        return f"the scenario already computes in 16 bits or fewer ({t.precision})"
    return dataclasses.replace(t, precision="bf16-mixed")


def _eight_bit(s: Scenario) -> TrainingSpec | str:
    t = s.training
    if t.optimizer != "adamw":
        return f"needs AdamW; the optimizer is {t.optimizer}"
    return dataclasses.replace(t, optimizer="adamw-8bit")


def _zero3(s: Scenario) -> TrainingSpec | str:
    t = s.training
    if t.parallelism.zero_stage == 3:
        return "the scenario already uses ZeRO-3 / FSDP FULL_SHARD"
    if s.hardware.world_size == 1:
        return "one GPU: there is nothing to shard"
    training = dataclasses.replace(t, parallelism=dataclasses.replace(t.parallelism, zero_stage=3))
    try:
        mesh = make_mesh(dataclasses.replace(s, training=training))
    except EstimateError as exc:
        return f"the parallel layout is invalid: {exc}"
    if mesh.shard == 1:
        return (
            "the data-parallel shard group is one GPU (tensor, pipeline and context "
            "parallelism take them all): there is nothing to shard"
        )
    return training


def _cpu_offload(s: Scenario) -> TrainingSpec | str:
    t = s.training
    if t.offload.optimizer != "none":
        return f"the optimizer is already offloaded ({t.offload.optimizer})"
    stage = max(1, t.parallelism.zero_stage)
    return dataclasses.replace(
        t,
        parallelism=dataclasses.replace(t.parallelism, zero_stage=stage),
        offload=dataclasses.replace(t.offload, optimizer="cpu"),
    )


def _flash(s: Scenario) -> TrainingSpec | str:
    t = s.training
    if attention_kernel(t.attention, fp32=t.precision == "fp32") == "flash":
        if t.attention == "flash":
            return "the scenario already uses flash attention"
        return "SDPA already runs the flash kernel for 16-bit compute"
    if t.precision == "fp32":
        # FlashAttention has fp16/bf16 kernels only (Dao et al. 2022; PyTorch's SDPA
        # flash backend likewise): offering it on fp32 would promise a kernel that cannot run
        return "flash attention needs 16-bit compute; this scenario computes in fp32"
    return dataclasses.replace(t, attention="flash")


def _lora_cost(s: Scenario) -> tuple[float, str]:
    if s.training.method == "qlora":
        return 1 / QLORA_OVER_LORA, "the 16-bit base is not dequantized for every matmul"
    return LORA_OVER_FULL, "no weight gradients for the frozen base"


def _qlora_cost(s: Scenario) -> tuple[float, str]:
    if s.training.method == "lora":
        return QLORA_OVER_LORA, "over LoRA, the 4-bit weights are dequantized for every matmul"
    return (
        LORA_OVER_FULL * QLORA_OVER_LORA,
        "no weight gradients for the frozen base (-30 %), but the 4-bit weights are "
        "dequantized for every matmul (+30 % over LoRA)",
    )


@dataclass(frozen=True, slots=True)
class WhatIf:
    """One change to a scenario; ``compute_factor`` is the step time relative to before
    (for most scenarios; :meth:`cost` gives the factor for a given one)."""

    key: str
    label: str
    change: Change
    compute_factor: float
    #: why the step time changes by ``compute_factor``
    compute_reason: str
    #: the cost for a given scenario, when it depends on the scenario
    cost_for: Cost | None = None

    @property
    def compute_note(self) -> str:
        """``+33 % compute: the forward runs again in backward ...``"""
        return f"{compute_text(self.compute_factor)}: {self.compute_reason}"

    def cost(self, scenario: Scenario) -> tuple[float, str]:
        """The step-time factor of this change on ``scenario`` and its note; the note's
        percentage is written from the factor."""
        factor, reason = (
            self.cost_for(scenario)
            if self.cost_for is not None
            else (self.compute_factor, self.compute_reason)
        )
        return factor, f"{compute_text(factor)}: {reason}"

    def unavailable(self, scenario: Scenario) -> str | None:
        """Why this change does not apply to ``scenario``; ``None`` when it applies."""
        result = self.change(scenario)
        return result if isinstance(result, str) else None

    def apply(self, scenario: Scenario) -> Scenario | None:
        """The scenario with this change alone, or ``None`` if it does not apply."""
        training = self.change(scenario)
        if isinstance(training, str):
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
        _set("the scenario already checkpoints every layer", activation_checkpointing="full"),
        1.33,
        "the forward runs again in backward (Chen et al. 2016)",
    ),
    WhatIf(
        "lora",
        "LoRA (r=16)",
        _set("the scenario already trains LoRA adapters", method="lora"),
        LORA_OVER_FULL,
        "no weight gradients for the frozen base",
        _lora_cost,
    ),
    WhatIf(
        "qlora",
        "QLoRA (4-bit base)",
        _set("the scenario already trains QLoRA adapters", method="qlora"),
        LORA_OVER_FULL * QLORA_OVER_LORA,
        "no weight gradients for the frozen base, but the 4-bit weights are dequantized "
        "for every matmul",
        _qlora_cost,
    ),
    WhatIf("8bit-optimizer", "8-bit AdamW", _eight_bit, 1.0, "no measurable compute cost"),
    WhatIf(
        "fused-optimizer",
        "Fused optimizer",
        _set("the optimizer is already fused", optimizer_impl="fused"),
        1.0,
        "one kernel per step for the optimizer update; the step time barely changes",
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
        _flash,
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
    #: the step time relative to the current scenario's, and what it comes from
    compute_factor: float = 1.0
    compute_note: str = ""


def assess(scenario: Scenario, current: Estimate, key: str) -> WhatIfResult | str:
    """Estimate the what-if ``key`` on ``scenario``; the reason when it does not apply or
    the engine rejects the changed scenario."""
    whatif = WHATIFS_BY_KEY[key]
    try:
        change = whatif.change(scenario)
        if isinstance(change, str):
            return change
        variant = dataclasses.replace(scenario, training=change)
        result = estimate(variant)
    except EstimateError as exc:
        return f"the changed scenario is invalid: {exc}"
    factor, note = whatif.cost(scenario)
    return WhatIfResult(
        whatif, variant, result, current.device_bytes - result.device_bytes, factor, note
    )


def evaluate(scenario: Scenario, current: Estimate, key: str) -> WhatIfResult | None:
    """Estimate the what-if ``key`` on ``scenario``; ``None`` if it does not apply or fails
    (:func:`assess` says why)."""
    result = assess(scenario, current, key)
    return result if isinstance(result, WhatIfResult) else None
