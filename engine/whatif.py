"""What-if changes: one switch each, applied to a scenario alone, with its compute cost.

The app shows each as a toggle with a ghost bar beside the current one. The toggles are
changes of the registry (:mod:`memfit.engine.changes`), which holds each one's rule: a change
that does not apply is refused by :meth:`~memfit.engine.changes.Change.why_not`, and
:func:`assess` says why: LoRA when LoRA is already on, ZeRO-3 with nothing to shard (one
GPU, or a data-parallel group of one), flash attention when the kernel in use already is
flash.

What a change costs in time is modelled, not assumed: :func:`assess` plays the changed
scenario through the step-time model (:mod:`memfit.engine.steptime`) and gives the ratio of the
two step times, with a note whose percentage is written from that same ratio
(:func:`compute_text`), so the two can never disagree. Checkpointing costs about a third
more on a compute-bound step and less where the step waits on communication; QLoRA costs
its dequantization over LoRA; mixed precision is faster.

>>> from memfit.engine.presets import load_gpu, load_model
>>> from memfit.engine.specs import HardwareSpec, Scenario
>>> s = Scenario(load_model("gpt2"), HardwareSpec(load_gpu("l4")))
>>> WHATIFS_BY_KEY["8bit-optimizer"].apply(s).training.optimizer
'adamw-8bit'
>>> WHATIFS_BY_KEY["zero3"].why_not(s)
'one GPU: there is nothing to shard'
>>> compute_text(1.33)
'+33 % step time'

Several changes at once: :func:`combined` applies them one after another in
:data:`COMBINE_ORDER` (the registry's: what is trained, then the number formats, the
attention kernel, the loop, the optimizer, the activations and the sharding), each to the
scenario the earlier ones left. A change that sets what one already applied sets
(:func:`conflict`), that no longer applies, or that the engine rejects together with the
others is skipped, and the result says which and why:

>>> both = combined(s, estimate(s), ["checkpointing", "8bit-optimizer"])
>>> both.applied, both.whatif.label
(('8bit-optimizer', 'checkpointing'), 'Combined: 8-bit AdamW + Gradient checkpointing')
>>> combined(s, estimate(s), ["lora", "qlora"]).skipped
(('lora', 'conflicts with QLoRA (4-bit base): both set the training method'),)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from memfit.engine import changes
from memfit.engine.changes import Change
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import Estimate, estimate
from memfit.engine.specs import Scenario
from memfit.engine.steptime import step_time

#: A what-if is a change of the registry (:mod:`memfit.engine.changes`): its ``key`` is the id.
WhatIf = Change


def compute_text(factor: float) -> str:
    """The step-time factor as the words shown with a what-if: ``+33 % step time``."""
    if round(100 * (factor - 1)) == 0:
        return "same step time"
    return f"{100 * (factor - 1):+.0f} % step time"


#: the toggles, in the order they are shown
WHATIFS: tuple[WhatIf, ...] = changes.pick(
    (
        "mixed-precision",
        "checkpointing",
        "lora",
        "qlora",
        "8bit-optimizer",
        "fused-optimizer",
        "zero3",
        "cpu-offload",
        "release-outputs",
        "release-previous-step",
        "gradient-bucket-view",
        "flash-attention",
    )
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
    :mod:`memfit.engine.explain`)."""
    variant = whatif.attempt(scenario)
    if isinstance(variant, str):
        return variant
    try:
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


#: The order :func:`combined` makes changes in: the registry's
#: (:data:`memfit.engine.changes.CHANGES`).
#: What is trained comes first (an 8-bit optimizer then holds the adapters' moments, not
#: the full model's); the compute precision before the attention kernel (flash needs 16-bit
#: compute, and SDPA already runs it there); the optimizer before the sharding and offload
#: that place its state.
COMBINE_ORDER: tuple[str, ...] = changes.in_order(WHATIFS_BY_KEY)

#: The key of a combination of what-ifs, where one is drawn or applied.
COMBINED_KEY = "combined"


def conflict(applied: Sequence[str], key: str) -> str | None:
    """Why ``key`` is not made after the changes ``applied``: one of them sets what it sets
    (the training method, for LoRA and QLoRA), and made second it would silently undo the
    first; ``None`` where none does."""
    clash = changes.clash(applied, key)
    if clash is None:
        return None
    return f"conflicts with {WHATIFS_BY_KEY[clash].label}: both set {WHATIFS_BY_KEY[key].setting}"


def combined(scenario: Scenario, current: Estimate, keys: Sequence[str]) -> WhatIfResult | str:
    """The what-ifs ``keys`` made together on ``scenario``, in :data:`COMBINE_ORDER`.

    Each change is made on the scenario the ones before it left. A change is skipped
    -- and named in :attr:`WhatIfResult.skipped` with the reason -- when it sets what one
    already made sets (:func:`conflict`), when it does not apply to the scenario as changed
    so far (flash attention after mixed precision: SDPA already runs the flash kernel), or
    when the engine rejects the scenario with it. One change made gives exactly what
    :func:`assess` gives for it (plus the skipped ones); several give a change keyed
    :data:`COMBINED_KEY` that makes them in turn, labelled ``Combined: A + B``. The reason,
    when none of ``keys`` can be made. An unknown key raises ``ValueError``.
    """
    unknown = [key for key in keys if key not in WHATIFS_BY_KEY]
    if unknown:
        raise ValueError(f"unknown what-if: {unknown[0]!r}")
    variant = scenario
    applied: list[str] = []
    skipped: list[tuple[str, str]] = []
    result: Estimate | None = None
    for key in changes.in_order(keys):
        reason = conflict(applied, key)
        if reason is not None:
            skipped.append((key, reason))
            continue
        candidate = WHATIFS_BY_KEY[key].attempt(variant)
        if isinstance(candidate, str):
            skipped.append((key, candidate))
            continue
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
    whatif = changes.in_turn(COMBINED_KEY, "Combined: " + " + ".join(labels), applied)
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
