"""What a training stack can run: its abilities, as data.

A scenario names its training stack (``training.stack``) for the conventions of the loop
that runs the step (:mod:`memfit.engine.stacks`); the same file says what that loop can run
at all -- which frameworks and ZeRO/FSDP stages, which parallel axes, pipeline schedules,
offloads, precisions, checkpointing modes, optimizers and training methods, and whether it
compiles. A plan the stack cannot run is no plan for its user: the changes of the registry
(:mod:`memfit.engine.changes`, and so the what-if toggles, make-it-fit and the remedies) do
not apply where the changed scenario leaves the stack's abilities, and a sweep (the map,
the fastest configurations) leaves such configurations out; switching to a stack that can
is a change of its own (:func:`memfit.engine.stacks.stacks_that_can`). This module holds the
vocabulary and the check; :mod:`memfit.engine.stacks` reads the files and asks it of a
scenario's stack (:func:`memfit.engine.stacks.refusals`).

In the stack's JSON, ``abilities`` holds, for each ability it limits, either a list of
the values it runs or ``false`` for a feature it does not have; an ability left out
limits nothing. ``abilities_why`` says, for each, where that comes from (the file and
version it was read from)::

    "abilities": {"pp": false, "zero_stage": [0, 1, 2, 3],
                  "activation_checkpointing": ["none", "full"]},
    "abilities_why": {"pp": "transformers' Trainer has no pipeline schedule (...)"}

>>> from memfit.engine.specs import ParallelismSpec
>>> t = TrainingSpec(parallelism=ParallelismSpec(pp=2))
>>> [r.words for r in refused({"pp": False}, {"pp": "no schedule"}, t)]
['pipeline parallelism (pp 2)']
>>> refused({"zero_stage": (0, 3)}, {"zero_stage": "FSDP"}, t)
()
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memfit.engine.errors import EstimateError
from memfit.engine.specs import (
    ACTIVATION_OFFLOAD,
    CHECKPOINTING,
    FRAMEWORKS,
    METHODS,
    OFFLOAD_TARGETS,
    OPTIMIZERS,
    PARALLEL_AXES,
    PP_SCHEDULES,
    PRECISIONS,
    TrainingSpec,
)


@dataclass(frozen=True, slots=True)
class Ability:
    """One thing a stack may or may not run: its key in the stack's ``abilities``, the
    value a training has for it (``None``: the training does not use it), and that value
    in words. ``values``: what a list may hold; empty for a feature (``false`` or absent)."""

    key: str
    value: Callable[[TrainingSpec], Any]
    words: Callable[[Any], str]
    values: tuple[Any, ...] = ()


def _size(axis: str) -> Callable[[TrainingSpec], Any]:
    def value(t: TrainingSpec) -> Any:
        size = t.parallelism.size(axis)
        return size if size > 1 else None

    return value


def _axis_words(key: str, label: str) -> Callable[[Any], str]:
    """``pipeline parallelism (pp 4)``, from the axis' label (``Pipeline parallel``)."""
    return lambda size: f"{label.lower()}ism ({key} {size})"


#: every ability a stack file may limit, in the order a refusal names them
ABILITIES: tuple[Ability, ...] = (
    Ability("method", lambda t: t.method, lambda v: f"{v} training", METHODS),
    Ability("precision", lambda t: t.precision, lambda v: f"{v} precision", PRECISIONS),
    Ability("optimizer", lambda t: t.optimizer, lambda v: f"the {v} optimizer", OPTIMIZERS),
    Ability(
        "optimizer_in_backward",
        lambda t: True if t.optimizer_in_backward else None,
        lambda v: "the optimizer step in backward",
    ),
    Ability(
        "activation_checkpointing",
        lambda t: t.activation_checkpointing if t.activation_checkpointing != "none" else None,
        lambda v: f"{v} activation checkpointing",
        CHECKPOINTING,
    ),
    Ability(
        "framework",
        lambda t: t.parallelism.framework,
        lambda v: f"the {v} framework",
        FRAMEWORKS,
    ),
    Ability(
        "zero_stage",
        lambda t: t.parallelism.zero_stage,
        lambda v: f"ZeRO stage {v}",
        (0, 1, 2, 3),
    ),
    *(
        Ability(a.key, _size(a.key), _axis_words(a.key, a.label))
        for a in PARALLEL_AXES
        if a.section == "model"
    ),
    Ability(
        "sequence_parallel",
        lambda t: True if t.parallelism.sequence_parallel else None,
        lambda v: "sequence parallelism",
    ),
    Ability(
        "pp_schedule",
        lambda t: t.parallelism.pp_schedule if t.parallelism.pp > 1 else None,
        lambda v: f"the {v} pipeline schedule",
        PP_SCHEDULES,
    ),
    Ability(
        "offload.optimizer",
        lambda t: t.offload.optimizer if t.offload.optimizer != "none" else None,
        lambda v: f"optimizer offload to {v}",
        OFFLOAD_TARGETS[1:],
    ),
    Ability(
        "offload.parameters",
        lambda t: t.offload.parameters if t.offload.parameters != "none" else None,
        lambda v: f"parameter offload to {v}",
        OFFLOAD_TARGETS[1:],
    ),
    Ability(
        "offload.activations",
        lambda t: t.offload.activations if t.offload.activations != "none" else None,
        lambda v: f"activation offload to {v}",
        ACTIVATION_OFFLOAD[1:],
    ),
    Ability(
        "torch_compile",
        lambda t: True if t.torch_compile else None,
        lambda v: "torch.compile",
    ),
)
BY_KEY = {a.key: a for a in ABILITIES}


def parse(where: str, data: Any, why: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """A stack file's ``abilities`` and ``abilities_why``, checked: each key an ability of
    :data:`ABILITIES`; ``false`` where the stack does not have it at all, else a list of
    the values it runs (or ``true`` for a feature it has); every limit with its reason."""
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise EstimateError(f"{where}: abilities", "expected a JSON object")
    why = why if isinstance(why, dict) else {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        ability = BY_KEY.get(key)
        field = f"{where}: abilities.{key}"
        if ability is None:
            raise EstimateError(field, f"unknown ability; expected one of {', '.join(BY_KEY)}")
        if value is False:  # none of its values: the stack does not have it
            out[key] = False
        elif ability.values:
            if not isinstance(value, list) or not all(
                any(type(v) is type(a) and v == a for a in ability.values) for v in value
            ):
                accepted = ", ".join(str(a) for a in ability.values)
                raise EstimateError(field, f"expected a list of values among {accepted}")
            out[key] = tuple(value)
        elif isinstance(value, bool):
            out[key] = value
        else:
            raise EstimateError(field, "expected true or false")
        if not isinstance(why.get(key), str) or not why[key]:
            raise EstimateError(f"{where}: abilities_why.{key}", "expected the reason, a string")
    return out, {k: why[k] for k in out}


@dataclass(frozen=True, slots=True)
class Refusal:
    """One thing a stack cannot run that a training asks of it: the ability, the
    training's value in words and the stack file's reason."""

    ability: str
    words: str
    why: str

    def sentence(self, label: str) -> str:
        """``Hugging Face Trainer cannot run pipeline parallelism (pp 4): ...``, for the
        stack called ``label``."""
        return f"{label} cannot run {self.words}: {self.why}"


def refused(
    abilities: dict[str, Any], why: dict[str, str], training: TrainingSpec
) -> tuple[Refusal, ...]:
    """What of ``training`` a stack of ``abilities`` (and their reasons ``why``) cannot
    run; nothing where it can run it all."""
    out = []
    for key, allowed in abilities.items():
        ability = BY_KEY[key]
        value = ability.value(training)
        if value is None:
            continue
        if allowed is False or (isinstance(allowed, tuple) and value not in allowed):
            out.append(Refusal(key, ability.words(value), why[key]))
    return tuple(out)
