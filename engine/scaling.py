"""The size axis of a model family: models of its presets' shape at the sizes between
theirs, and the largest of them that fits a scenario's hardware and training.

Presets are discrete -- Qwen3 14B fits, Qwen3 32B does not -- while a run planned from
scratch can take any size of the family's shape. :func:`size_axis` lays the family's dense
presets out by parameters and fills the gap between each two neighbours A < B with the
distinct models whose width and depth lie between theirs; :func:`largest_on_axis` finds
the largest of them that fits.

A point at position ``t`` of the gap (0 at A, 1 at B) takes, each interpolated
geometrically as ``x_A^(1-t) * x_B^t`` and then rounded:

- the layers (to an integer) and the hidden size;
- the intermediate size, to a multiple of 256 (or of the largest power of two that A's and
  B's are both multiples of, where smaller); interpolating it so is interpolating the
  intermediate/hidden ratio geometrically as well;
- the attention: A's head dim and A's key/value heads (as many as the heads where A has
  multi-head attention). Where A and B each have as many heads times the head dim as the
  hidden size (Llama, GPT-2), the heads stay so -- the hidden size is rounded to a
  multiple of the head dim times the heads that share a key/value head -- otherwise
  (Qwen3, Gemma 3) the attention width is interpolated on its own, the heads rounded to
  a multiple of the key/value heads and the hidden size to a multiple of 128 (or of the
  largest power of two A's and B's are both multiples of, where smaller);
- everything else -- vocabulary, tied embeddings, norms, positions, context -- A's.

Rounding makes the distinct models few (tens a gap); the axis holds each once, in order,
with the presets themselves at the ends of the gaps. A point whose parameters would not
lie strictly between the previous point's and B's (A's vocabulary on B's width and depth
can outgrow B) is left out, so the parameters grow along the axis. The axis runs from the
family's smallest preset to its largest and never beyond: no point is extrapolated.

Mixture-of-experts presets have no axis (their size is not a width and a depth), nor do
presets whose architecture differs in kind from the family's others (Falcon 40B's norms
against Falcon 7B's): :attr:`Axis.left_out` says which and why.

>>> axis = size_axis("qwen3")
>>> [p.preset for p in axis.points if p.preset]
['qwen3-0.6b', 'qwen3-4b', 'qwen3-8b', 'qwen3-14b', 'qwen3-32b']
>>> all(a.params < b.params for a, b in itertools.pairwise(axis.points))
True
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

from memfit.engine.batch import Totals, totals
from memfit.engine.errors import EstimateError, shown
from memfit.engine.params import count_parameters
from memfit.engine.presets import load_model, model_names
from memfit.engine.solve import largest
from memfit.engine.specs import ModelSpec, Scenario
from memfit.engine.steptime import step_time

#: the fields that say what kind of architecture a model is; presets of a family that
#: differ in one of them are not points of one axis (sizes and counts are not among them)
KIND_FIELDS = (
    "architecture",
    "mlp",
    "activation",
    "norm",
    "norms_per_layer",
    "norm_placement",
    "final_norm",
    "qk_norm",
    "position_embedding",
    "embedding_norm",
    "attention_bias",
    "attention_out_bias",
    "mlp_bias",
    "lm_head_bias",
    "fused_qkv",
    "fused_gate_up",
    "parallel_attention",
    "full_attention_every",
    "sdpa_math",
    "eager_attention",
    "attention_sinks",
    "rope_keeps_dtype",
    "pooler",
    "lm_head_transform",
)
#: the largest multiple the intermediate size is rounded to
INTERMEDIATE_MULTIPLE = 256
#: the largest multiple a hidden size not tied to the heads is rounded to
HIDDEN_MULTIPLE = 128


@dataclass(frozen=True, slots=True)
class AxisPoint:
    """One model of the axis: a preset (``preset`` its name) or a model between the
    presets ``below`` and ``above``, of the family's shape and not a released model."""

    model: ModelSpec
    params: int
    preset: str = ""
    below: str = ""
    above: str = ""


@dataclass(frozen=True, slots=True)
class Axis:
    """A family's size axis: its points, smallest first; the presets it runs through; the
    family's presets it leaves out, each with why."""

    family: str
    points: tuple[AxisPoint, ...]
    presets: tuple[str, ...]
    left_out: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class AxisFit:
    """The largest point of an axis that fits, its device total against the budget and
    its tokens/s; ``above``: the next point up the axis, which does not fit (``None``
    where the answer is the family's largest preset: the axis ends there)."""

    point: AxisPoint
    device_bytes: int
    budget_bytes: int
    tokens_per_s: float
    above: AxisPoint | None


def kind(model: ModelSpec) -> tuple[object, ...]:
    """What kind of architecture ``model`` is: :data:`KIND_FIELDS`, whether it slides a
    window, uses latent attention or routes to experts."""
    return (
        *(getattr(model, f) for f in KIND_FIELDS),
        model.sliding_window > 0,
        model.is_mla,
        model.is_moe,
    )


def _shape(model: ModelSpec) -> ModelSpec:
    """``model`` without what names it: two presets of one shape are one model."""
    return dataclasses.replace(model, name="-", display_name="", source="")


def _usable(family: str, names: Iterable[str]) -> tuple[list[AxisPoint], list[tuple[str, str]]]:
    """The family's presets an axis runs through, smallest first, and those it leaves out
    with why; an :class:`EstimateError` naming ``--family`` where none is the family's."""
    models = [m for m in (load_model(n) for n in names) if m.family == family]
    if not models:
        raise EstimateError("--family", f"got {shown(family)}: no preset of that family")
    left_out: list[tuple[str, str]] = []
    dense = []
    for m in models:
        if m.is_moe:
            left_out.append((m.name, "a mixture of experts: its size is not a width and depth"))
        else:
            dense.append((count_parameters(m).total, m.name, m))
    dense.sort(key=lambda r: (r[0], r[1]))
    if not dense:
        return [], left_out
    # the kind most presets are of (a tie: the kind of the largest)
    kinds = [kind(m) for _, _, m in dense]
    main = max(reversed(kinds), key=kinds.count)
    model_of_main = dense[kinds.index(main)][2]
    points: list[AxisPoint] = []
    for params, name, m in dense:
        if kind(m) != main:
            differ = [f for f in KIND_FIELDS if getattr(m, f) != getattr(model_of_main, f)]
            what = ", ".join(differ) or "attention: a sliding window or latent"
            left_out.append((name, f"an architecture of another kind (its {what})"))
        elif points and _shape(points[-1].model) == _shape(m):
            left_out.append((name, f"the same model as {points[-1].preset}"))
        elif points and params == points[-1].params:
            left_out.append((name, f"as many parameters as {points[-1].preset}"))
        else:
            points.append(AxisPoint(m, params, preset=name))
    return points, left_out


def _pow2_dividing(*values: int, at_most: int) -> int:
    """The largest power of two, ``at_most`` at most, that divides every value."""
    g = math.gcd(*values)
    return min(at_most, g & -g) if g else at_most


def _grown(a: int, b: int, t: float) -> float:
    """``a^(1-t) b^t``: from ``a`` at 0 to ``b`` at 1, geometrically."""
    return math.exp((1 - t) * math.log(a) + t * math.log(b))


def _rounded(x: float, multiple: int) -> int:
    return max(multiple, math.floor(x / multiple + 0.5) * multiple)


def _changes(a: int, b: int, multiple: int) -> list[float]:
    """The positions in (0, 1) where ``a^(1-t) b^t`` rounded to ``multiple`` changes."""
    if a <= 0 or b <= 0 or a == b:
        return []
    lo, hi = sorted((a, b))
    out = []
    for k in range(lo // multiple, hi // multiple + 1):
        edge = (k + 0.5) * multiple
        if lo < edge < hi:
            out.append(math.log(edge / a) / math.log(b / a))
    return out


class _Gap:
    """How the models between two neighbouring presets A < B are made."""

    def __init__(self, a: ModelSpec, b: ModelSpec) -> None:
        self.a, self.b = a, b
        self.head_dim = a.head_dim
        mha = a.num_key_value_heads == a.num_attention_heads
        # the heads one key/value head serves come in multiples of this
        self.group = 1 if mha else a.num_key_value_heads
        self.mha = mha
        self.tied = all(m.num_attention_heads * m.head_dim == m.hidden_size for m in (a, b))
        if self.tied:
            self.hidden_multiple = self.head_dim * self.group
        else:
            self.hidden_multiple = _pow2_dividing(
                a.hidden_size, b.hidden_size, at_most=HIDDEN_MULTIPLE
            )
        self.width = (a.num_attention_heads * a.head_dim, b.num_attention_heads * b.head_dim)
        self.mlp_multiple = _pow2_dividing(
            a.intermediate_size, b.intermediate_size, at_most=INTERMEDIATE_MULTIPLE
        )

    def positions(self) -> list[float]:
        """One position inside each stretch of the gap over which no rounded figure
        changes: every distinct model of the gap, in order."""
        a, b = self.a, self.b
        edges = sorted(
            {
                0.0,
                1.0,
                *_changes(a.hidden_size, b.hidden_size, self.hidden_multiple),
                *_changes(a.num_layers, b.num_layers, 1),
                *_changes(a.intermediate_size, b.intermediate_size, self.mlp_multiple),
                *([] if self.tied else _changes(*self.width, self.head_dim * self.group)),
            }
        )
        return [(x + y) / 2 for x, y in itertools.pairwise(edges)]

    def model_at(self, t: float) -> ModelSpec:
        a, b = self.a, self.b
        hidden = _rounded(_grown(a.hidden_size, b.hidden_size, t), self.hidden_multiple)
        if self.tied:
            heads = hidden // self.head_dim
        else:
            heads = _rounded(_grown(*self.width, t), self.head_dim * self.group) // self.head_dim
        mlp = (
            _rounded(_grown(a.intermediate_size, b.intermediate_size, t), self.mlp_multiple)
            if a.intermediate_size and b.intermediate_size
            else a.intermediate_size
        )
        return dataclasses.replace(
            a,
            num_layers=max(1, round(_grown(a.num_layers, b.num_layers, t))),
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=heads if self.mha else a.num_key_value_heads,
            intermediate_size=mlp,
        )


def _size(params: int, digits: int) -> str:
    return f"{params / 1e9:.{digits}f}B" if params >= 10**9 else f"{params / 1e6:.{digits - 1}f}M"


def _named(point: AxisPoint, near: tuple[int, ...], a: ModelSpec, b: ModelSpec) -> AxisPoint:
    """``point`` named by its size, in as many digits as set it apart from the sizes
    ``near`` it (``qwen3 axis 21.3B``), and labelled as what it is."""
    digits = next(
        (d for d in range(1, 4) if all(_size(n, d) != _size(point.params, d) for n in near)), 4
    )
    family, size = point.model.family, _size(point.params, digits)
    model = dataclasses.replace(
        point.model,
        name=f"{family} axis {size}",
        display_name=f"{family} axis {size}",
        source=(
            f"the {family} size axis between {a.label} and {b.label}: a model of their "
            "shape, interpolated, not a released model"
        ),
    )
    return dataclasses.replace(point, model=model)


def size_axis(family: str, names: Iterable[str] | None = None) -> Axis:
    """The size axis of ``family`` through its presets (``names``, else every preset):
    see the module's docstring. An :class:`EstimateError` naming ``--family`` where the
    family has no preset, or fewer than two it can run through."""
    stops, left_out = _usable(family, model_names() if names is None else names)
    if len(stops) < 2:
        why = "; ".join(f"{n}: {w}" for n, w in left_out)
        have = f"only {stops[0].preset}" if stops else "none"
        raise EstimateError(
            "--family",
            f"got {shown(family)}: a size axis needs two dense presets of one kind, it has "
            f"{have}" + (f" (left out: {why})" if why else ""),
        )
    points = [stops[0]]
    for lo, hi in itertools.pairwise(stops):
        gap = _Gap(lo.model, hi.model)
        between: list[AxisPoint] = []
        for t in gap.positions():
            try:
                model = gap.model_at(t)
            except EstimateError:
                continue  # a shape ModelSpec refuses is no point of the axis
            params = count_parameters(model).total
            if (between[-1] if between else lo).params < params < hi.params:
                between.append(AxisPoint(model, params, below=lo.preset, above=hi.preset))
        sizes = [lo.params, *(p.params for p in between), hi.params]
        for i, p in enumerate(between):
            points.append(_named(p, (sizes[i], sizes[i + 2]), lo.model, hi.model))
        points.append(hi)
    return Axis(family, tuple(points), tuple(p.preset for p in stops), tuple(left_out))


def families_with_axis(names: Iterable[str] | None = None) -> list[str]:
    """The families of the presets (``names``, else every one) that have a size axis."""
    names = list(model_names() if names is None else names)
    out = []
    for family in sorted({load_model(n).family for n in names}):
        try:
            size_axis(family, names)
        except EstimateError:
            continue
        out.append(family)
    return out


def largest_on_axis(scenario: Scenario, axis: Axis) -> AxisFit | None:
    """The largest point of ``axis`` that fits with the scenario's hardware and training
    (``None`` where even the smallest preset does not).

    Memory grows with the size along the axis, so a search by doubling and bisection on
    the points' index finds it in a few estimates; where the estimates it made do not grow
    with the index (or one is refused: a layer count the pipeline cannot split), every
    point is estimated and the largest that fits is the answer."""
    seen: dict[int, Totals | None] = {}

    def at(i: int) -> Totals | None:
        if i not in seen:
            try:
                seen[i] = totals(dataclasses.replace(scenario, model=axis.points[i].model))
            except EstimateError:
                seen[i] = None
        return seen[i]

    def ok(i: int) -> bool:
        t = at(i)
        return t is not None and t.device_bytes <= t.budget_bytes

    last = len(axis.points) - 1
    best = largest(ok, 0, last)
    probes = [seen[i] for i in sorted(seen)]
    grows = all(
        x is not None and y is not None and x.device_bytes <= y.device_bytes
        for x, y in itertools.pairwise(probes)
    )
    if not grows or None in probes:
        best = next((i for i in range(last, -1, -1) if ok(i)), None)
    fit = None if best is None else seen[best]
    if best is None or fit is None:
        return None
    point = axis.points[best]
    speed = step_time(dataclasses.replace(scenario, model=point.model)).tokens_per_s
    above = axis.points[best + 1] if best < last else None
    return AxisFit(point, fit.device_bytes, fit.budget_bytes, speed, above)
