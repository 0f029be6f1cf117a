"""What-if changes: one switch each, applied to a scenario alone, with its compute cost.

The app shows each as a toggle with a ghost bar beside the current one; the CLI can list
them too. A change that does not apply gives ``None`` from :meth:`WhatIf.apply`, and
:func:`assess` says why: LoRA when LoRA is already on, ZeRO-3 with nothing to shard (one
GPU, or a data-parallel group of one), flash attention when the kernel in use already is
flash.

What a change costs in time is modelled, not assumed: :func:`assess` plays the changed
scenario through the step-time model (:mod:`engine.steptime`) and gives the ratio of the
two step times, with a note whose percentage is written from that same ratio
(:func:`compute_text`), so the two can never disagree. Checkpointing costs about a third
more on a compute-bound step and less where the step waits on communication; QLoRA costs
its dequantization over LoRA; mixed precision is faster.

>>> from engine.presets import load_gpu, load_model
>>> from engine.specs import HardwareSpec, Scenario
>>> s = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("l4")))
>>> WHATIFS_BY_KEY["8bit-optimizer"].apply(s).training.optimizer
'adamw-8bit'
>>> WHATIFS_BY_KEY["zero3"].unavailable(s)
'one GPU: there is nothing to shard'
>>> compute_text(1.33)
'+33 % step time'

Several changes at once: :func:`combined` applies them one after another in
:data:`COMBINE_ORDER` (what is trained, then the number formats, the optimizer, the
sharding, the activations and the loop), each to the scenario the earlier ones left. A
change that conflicts with one already applied (:data:`CONFLICTS`), that no longer applies,
or that the engine rejects together with the others is skipped, and the result says which
and why:

>>> both = combined(s, estimate(s), ["checkpointing", "8bit-optimizer"])
>>> both.applied, both.whatif.label
(('8bit-optimizer', 'checkpointing'), 'Combined: 8-bit AdamW + Gradient checkpointing')
>>> combined(s, estimate(s), ["lora", "qlora"]).skipped
(('lora', 'conflicts with QLoRA (4-bit base): both set the training method'),)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.errors import EstimateError
from engine.estimate import Estimate, estimate
from engine.layers import attention_kernel
from engine.sharding import nothing_to_shard
from engine.specs import Scenario, TrainingSpec
from engine.stacks import conventions
from engine.steptime import step_time

#: A change: the new training spec, or the reason it does not apply to this scenario.
Change = Callable[[Scenario], TrainingSpec | str]


def compute_text(factor: float) -> str:
    """The step-time factor as the words shown with a what-if: ``+33 % step time``."""
    if round(100 * (factor - 1)) == 0:
        return "same step time"
    return f"{100 * (factor - 1):+.0f} % step time"


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
    reason = nothing_to_shard(s, 3)
    if reason:
        return reason
    return dataclasses.replace(t, parallelism=dataclasses.replace(t.parallelism, zero_stage=3))


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


def _release_outputs(s: Scenario) -> TrainingSpec | str:
    t = s.training
    if not conventions(t).outputs_held:
        return f"the {t.stack} loop already releases the model output before backward"
    return dataclasses.replace(t, outputs_held_through_backward=False)


def _release_previous(s: Scenario) -> TrainingSpec | str:
    t = s.training
    if not conventions(t).previous_held:
        return f"the {t.stack} loop already frees each step before the next"
    return dataclasses.replace(t, previous_step_held=False)


@dataclass(frozen=True, slots=True)
class WhatIf:
    """One change to a scenario, and why it changes the step time (by how much is
    modelled for each scenario by :func:`assess`)."""

    key: str
    label: str
    change: Change
    #: what the change does to the step, in words
    compute_reason: str

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
        "matmuls on the tensor cores at the 16-bit rate",
    ),
    WhatIf(
        "checkpointing",
        "Gradient checkpointing",
        _set("the scenario already checkpoints every layer", activation_checkpointing="full"),
        "the forward runs again in backward (Chen et al. 2016)",
    ),
    WhatIf(
        "lora",
        "LoRA (r=16)",
        _set("the scenario already trains LoRA adapters", method="lora"),
        "no weight gradients for the frozen base",
    ),
    WhatIf(
        "qlora",
        "QLoRA (4-bit base)",
        _set("the scenario already trains QLoRA adapters", method="qlora"),
        "no weight gradients for the frozen base, but the 4-bit weights are dequantized "
        "for every matmul",
    ),
    WhatIf("8bit-optimizer", "8-bit AdamW", _eight_bit, "fewer optimizer bytes to update"),
    WhatIf(
        "fused-optimizer",
        "Fused optimizer",
        _set("the optimizer is already fused", optimizer_impl="fused"),
        "one kernel per step for the optimizer update, no temporaries",
    ),
    WhatIf(
        "zero3",
        "ZeRO-3 / FSDP",
        _zero3,
        "parameters gathered layer by layer: 1.5x the data-parallel traffic (ZeRO, sec. 7)",
    ),
    WhatIf(
        "cpu-offload",
        "CPU offload",
        _cpu_offload,
        "optimizer step on the CPU; gradients and weights cross the host link every step",
    ),
    WhatIf(
        "release-outputs",
        "Release outputs before backward",
        _release_outputs,
        "no compute change: the loop keeps only the loss (loss = out.loss; del out)",
    ),
    WhatIf(
        "release-previous-step",
        "Free the previous step",
        _release_previous,
        "no compute change: the loop deletes its loss and outputs after each step "
        "(del loss, logits), so the next forward does not carry them",
    ),
    WhatIf(
        "flash-attention",
        "Flash attention",
        _flash,
        "the attention core in one kernel; no s x s scores kept",
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
    #: the keys of the changes made, in the order they were applied
    applied: tuple[str, ...] = ()
    #: (key, reason) for each change asked for and not made (see :func:`combined`)
    skipped: tuple[tuple[str, str], ...] = ()


def assess(scenario: Scenario, current: Estimate, key: str) -> WhatIfResult | str:
    """Estimate the what-if ``key`` on ``scenario``; the reason when it does not apply or
    the engine rejects the changed scenario."""
    return assess_change(scenario, current, WHATIFS_BY_KEY[key])


def assess_change(scenario: Scenario, current: Estimate, whatif: WhatIf) -> WhatIfResult | str:
    """:func:`assess` of a change that need not be one of :data:`WHATIFS` (the remedies of
    :mod:`engine.explain`)."""
    try:
        change = whatif.change(scenario)
        if isinstance(change, str):
            return change
        variant = dataclasses.replace(scenario, training=change)
        result = estimate(variant)
    except EstimateError as exc:
        return f"the changed scenario is invalid: {exc}"
    factor = step_time(variant).step_time_s / step_time(scenario).step_time_s
    note = f"{compute_text(factor)}: {whatif.compute_reason}"
    return WhatIfResult(
        whatif,
        variant,
        result,
        current.device_bytes - result.device_bytes,
        factor,
        note,
        (whatif.key,),
    )


def evaluate(scenario: Scenario, current: Estimate, key: str) -> WhatIfResult | None:
    """Estimate the what-if ``key`` on ``scenario``; ``None`` if it does not apply or fails
    (:func:`assess` says why)."""
    result = assess(scenario, current, key)
    return result if isinstance(result, WhatIfResult) else None


#: The order :func:`combined` applies changes in. What is trained comes first (an 8-bit
#: optimizer then holds the adapters' moments, not the full model's); the compute precision
#: before the attention kernel (flash needs 16-bit compute, and SDPA already runs it there);
#: the optimizer before the sharding and offload that place its state; the activations and
#: the training loop's habits last, since they change nothing the others read.
COMBINE_ORDER: tuple[str, ...] = (
    "qlora",
    "lora",
    "mixed-precision",
    "flash-attention",
    "8bit-optimizer",
    "fused-optimizer",
    "zero3",
    "cpu-offload",
    "checkpointing",
    "release-outputs",
    "release-previous-step",
)

#: Pairs of changes that set the same field to different values: applied one after the
#: other, the second would silently undo the first. The one first in :data:`COMBINE_ORDER`
#: is made; the other is skipped, with this reason.
CONFLICTS: dict[frozenset[str], str] = {
    frozenset({"lora", "qlora"}): "both set the training method",
}

#: The key of a combination of what-ifs, where one is drawn or applied.
COMBINED_KEY = "combined"


@dataclass(frozen=True, slots=True)
class _Replay:
    """A change that makes the changes ``keys`` in turn; equal to another of the same keys,
    so two results of one combination compare equal."""

    keys: tuple[str, ...]

    def __call__(self, s: Scenario) -> TrainingSpec | str:
        for key in self.keys:
            training = WHATIFS_BY_KEY[key].change(s)
            if isinstance(training, str):
                return f"{WHATIFS_BY_KEY[key].label}: {training}"
            s = dataclasses.replace(s, training=training)
        return s.training


def combined(scenario: Scenario, current: Estimate, keys: Sequence[str]) -> WhatIfResult | str:
    """The what-ifs ``keys`` made together on ``scenario``, in :data:`COMBINE_ORDER`.

    Each change is made on the scenario the ones before it left. A change is skipped
    -- and named in :attr:`WhatIfResult.skipped` with the reason -- when it conflicts
    with one already made (:data:`CONFLICTS`), when it does not apply to the scenario
    as changed so far (flash attention after mixed precision: SDPA already runs the
    flash kernel), or when the engine rejects the scenario with it. One change made
    gives exactly what :func:`assess` gives for it (plus the skipped ones); several give a
    :class:`WhatIf` keyed :data:`COMBINED_KEY`, labelled ``Combined: A + B``. The reason,
    when none of ``keys`` can be made. An unknown key raises ``ValueError``.
    """
    unknown = [key for key in keys if key not in WHATIFS_BY_KEY]
    if unknown:
        raise ValueError(f"unknown what-if: {unknown[0]!r}")
    asked = set(keys)
    variant = scenario
    applied: list[str] = []
    skipped: list[tuple[str, str]] = []
    result: Estimate | None = None
    for key in (k for k in COMBINE_ORDER if k in asked):
        whatif = WHATIFS_BY_KEY[key]
        clash = next((k for k in applied if frozenset({k, key}) in CONFLICTS), None)
        if clash is not None:
            reason = CONFLICTS[frozenset({clash, key})]
            skipped.append((key, f"conflicts with {WHATIFS_BY_KEY[clash].label}: {reason}"))
            continue
        training = whatif.change(variant)
        if isinstance(training, str):
            skipped.append((key, training))
            continue
        candidate = dataclasses.replace(variant, training=training)
        try:
            result = estimate(candidate)
        except EstimateError as exc:
            skipped.append((key, f"the engine rejects it with the others: {exc}"))
            continue
        variant = candidate
        applied.append(key)
    if result is None or not applied:
        reasons = "; ".join(f"{WHATIFS_BY_KEY[k].label}: {why}" for k, why in skipped)
        return f"none of the changes applies ({reasons})" if reasons else "no change asked for"
    if len(applied) == 1:
        single = assess(scenario, current, applied[0])
        if isinstance(single, str):  # cannot happen: it applied above, alone
            return single
        return dataclasses.replace(single, skipped=tuple(skipped))
    labels = [WHATIFS_BY_KEY[k].label for k in applied]
    whatif = WhatIf(
        COMBINED_KEY,
        "Combined: " + " + ".join(labels),
        _Replay(tuple(applied)),
        "; ".join(WHATIFS_BY_KEY[k].compute_reason for k in applied),
    )
    factor = step_time(variant).step_time_s / step_time(scenario).step_time_s
    return WhatIfResult(
        whatif,
        variant,
        result,
        current.device_bytes - result.device_bytes,
        factor,
        f"{compute_text(factor)}: {whatif.compute_reason}",
        tuple(applied),
        tuple(skipped),
    )
