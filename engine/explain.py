"""The biggest block explained: the activations at the peak, told apart by source.

The activations of a step are many tensors: what autograd saves for backward in every
layer, the inputs of checkpointed layers, the logits and the loss's buffers, the model
output the training loop holds, the layer in flight with its transients, a checkpointed
layer's forward played again, the gradient flowing back. :func:`memfit.engine.timeline.step_sources`
tells every moment's activations apart by these sources as the step is played, each with
its formula and where the formula comes from; they add up to the moment's activations to
the byte.

:func:`explained` groups the peak's sources by kind, largest first, and for each kind a
user can act on, estimates the change that removes it -- a chunked loss for the logits,
checkpointing for the saved tensors, releasing the previous step -- so that the saving
is an estimate of the changed scenario, not a guess.

>>> from memfit.engine.estimate import estimate
>>> from memfit.engine.presets import load_gpu, load_model
>>> from memfit.engine.specs import HardwareSpec, Scenario
>>> est = estimate(Scenario(load_model("gpt2"), HardwareSpec(load_gpu("l4"))))
>>> sum(s.bytes for s in activation_sources(est)) == est.breakdown["activations"]
True
>>> [g.title for g in explained(est, remedies=False)]
['Saved for backward', 'Logits and loss', 'Inputs and masks']
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.engine import changes
from memfit.engine.changes import Change
from memfit.engine.estimate import Estimate
from memfit.engine.timeline import SOURCE_KINDS, Source
from memfit.engine.whatif import assess_change

#: what each kind of source is, in a few words, for a group's title
TITLES = {
    "saved": "Saved for backward",
    "checkpointed": "Inputs of checkpointed layers",
    "kv-cache": "KV cache in the model output",
    "logits": "Logits and loss",
    "working": "Layer in flight (transients)",
    "recompute": "Recomputation",
    "gradient": "Gradient flowing back",
    "inputs": "Inputs and masks",
    "previous": "The previous step",
    "in-flight": "Other micro-batches in flight",
}
assert set(TITLES) == set(SOURCE_KINDS)


#: the change that removes each kind of source, where a user can make one: ids of the
#: registry (:mod:`memfit.engine.changes`)
REMEDY_IDS = {
    "logits": "chunked-loss",
    "saved": "checkpointing",
    "checkpointed": "offload-activations",
    "kv-cache": "no-kv-cache",
    "working": "flash-attention",
    "previous": "release-previous-step",
}
REMEDIES: dict[str, Change] = {kind: changes.BY_ID[i] for kind, i in REMEDY_IDS.items()}


@dataclass(frozen=True, slots=True)
class Remedy:
    """A change that removes (some of) a group of sources, estimated."""

    label: str
    #: device bytes the change saves against the current scenario (negative: it costs)
    saved_bytes: int
    #: what the change costs in step time, in words
    compute_note: str


@dataclass(frozen=True, slots=True)
class SourceGroup:
    """The sources of one kind at the peak, and the change that removes them."""

    kind: str
    title: str
    bytes: int
    sources: tuple[Source, ...]
    remedy: Remedy | None = None


def activation_sources(est: Estimate) -> tuple[Source, ...]:
    """The activations at the peak of ``est`` (its worst rank group), by source: they add
    up to the activations of the breakdown."""
    if est.steps is None:
        return ()
    return est.steps.peak_sources()


def remedy(est: Estimate, kind: str) -> Remedy | None:
    """The change that removes sources of ``kind``, estimated on ``est``'s scenario;
    ``None`` when there is none, it does not apply, or the changed scenario is rejected."""
    change = REMEDIES.get(kind)
    if change is None:
        return None
    result = assess_change(est.scenario, est, change)
    if isinstance(result, str):  # it does not apply, or the engine rejects the change
        return None
    return Remedy(change.label, result.saved_bytes, result.compute_note)


def explained(est: Estimate, remedies: bool = True) -> tuple[SourceGroup, ...]:
    """The peak's sources grouped by kind, largest first; with ``remedies``, each group
    with the change that removes it, estimated (:func:`remedy`)."""
    by_kind: dict[str, list[Source]] = {}
    for source in activation_sources(est):
        by_kind.setdefault(source.kind, []).append(source)
    groups = [
        SourceGroup(
            kind,
            TITLES[kind],
            sum(s.bytes for s in parts),
            tuple(sorted(parts, key=lambda s: -s.bytes)),
            remedy(est, kind) if remedies else None,
        )
        for kind, parts in by_kind.items()
    ]
    return tuple(sorted(groups, key=lambda g: -g.bytes))


def groups_to_dict(groups: tuple[SourceGroup, ...]) -> list[dict[str, object]]:
    """``groups`` as JSON-ready dicts, bytes as integers."""
    return [
        {
            "kind": g.kind,
            "title": g.title,
            "bytes": g.bytes,
            "sources": [
                {"name": s.name, "bytes": s.bytes, "formula": s.formula, "source": s.source}
                for s in g.sources
            ],
            "remedy": None
            if g.remedy is None
            else {
                "change": g.remedy.label,
                "saved_bytes": g.remedy.saved_bytes,
                "compute": g.remedy.compute_note,
            },
        }
        for g in groups
    ]


def groups_text(est: Estimate, groups: tuple[SourceGroup, ...]) -> str:
    """``groups`` as lines of text, GiB (2^30 bytes) with two decimals."""
    total = est.breakdown["activations"]
    lines = [f"Activations at the peak by source: {total / 2**30:,.2f} GiB (2^30 bytes)"]
    for g in groups:
        share = g.bytes / total if total else 0.0
        lines.append(f"  {g.title:<36} {g.bytes / 2**30:>9,.2f}  {share:>4.0%}")
        lines += [f"    {s.name:<70} {s.bytes / 2**30:>9,.2f}" for s in g.sources]
        if g.remedy is not None and g.remedy.saved_bytes > 0:
            lines.append(
                f"    -> {g.remedy.label} saves {g.remedy.saved_bytes / 2**30:,.2f} GiB "
                f"({g.remedy.compute_note})"
            )
    return "\n".join(lines)
