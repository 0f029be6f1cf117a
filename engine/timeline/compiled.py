"""The step written once, played with symbolic sizes (:class:`_Compiler`): every point
(the timeline, explain) or its highest points as linear forms of the shape
(:class:`_Forms`), which a :class:`~memfit.engine.timeline.stepplan.StepPlan` evaluates
for any micro-batch and sequence length at once."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from memfit.engine import memo
from memfit.engine.graph import TERMS, Profile, Size, _coefs
from memfit.engine.timeline.context import Gather
from memfit.engine.timeline.sources import (
    _PREVIOUS_OUTPUT,
    Source,
    _grad_source,
    _head_source,
    _input_sources,
    _output_source,
    _previous_sources,
    _returned_source,
    _work_source,
)

if TYPE_CHECKING:
    from memfit.engine.timeline.stepplan import StepPlan

#: the moments of a step by (phase, label); results over many shapes name them by index
KINDS = (
    ("before", "weights and optimizer states"),
    ("forward", "embedding"),
    ("forward", "layer"),
    ("forward", "LM head and loss"),
    ("forward", "send to the next stage"),
    ("backward", "loss and LM head"),
    ("backward", "gradient from the next stage"),
    ("backward", "recompute"),
    ("backward", "layer"),
    ("backward", "embedding"),
    ("optimizer", "optimizer step"),
    ("optimizer", "after zero_grad"),
    ("forward", "LM head"),
)
_EMBED_F, _LAYER_F, _HEAD_F, _SEND_F = 1, 2, 3, 4
_HEAD_B, _RECV_B, _RECOMPUTE, _LAYER_B, _EMBED_B = 5, 6, 7, 8, 9
_LOGITS_F = 12

#: the longest group of layers looked for as the repeated unit of a run
_GROUP = 8
#: int64 holds every value of a play over many shapes when a bound on them is below this
_INT64_SAFE = 1 << 62

#: one layer of a run: the block it is, whether it is checkpointed, its autocast copies
#: made and saved (:class:`Casts`)
_Layer = tuple[int, bool, int, int]
#: a run: its first layer's index, the layers of its repeated group, the repetitions
_Run = tuple[int, tuple[_Layer, ...], int]


@memo.cached(maxsize=4096)
def _runs(layers: tuple[_Layer, ...], start: int, step: int) -> tuple[_Run, ...]:
    """``layers`` (from layer ``start``, one ``step`` apart) as runs of a repeated group:
    at each position, the group of at most :data:`_GROUP` layers whose repetitions cover
    the most layers. Any split into runs gives the same peak; fewer runs, less work.
    Kept: every plan of a layout splits its layers alike."""
    out: list[_Run] = []
    i, n = 0, len(layers)
    while i < n:
        size, reps = 1, 1
        for p in range(1, min(_GROUP, (n - i) // 2) + 1):
            unit = layers[i : i + p]
            r = 1
            while layers[i + r * p : i + (r + 1) * p] == unit:
                r += 1
            if r > 1 and r * p > size * reps:
                size, reps = p, r
        out.append((start + step * i, tuple(layers[i : i + size]), reps))
        i += size * reps
    return tuple(out)


#: the shape quantities every point of a step is a linear form in: the six
#: :data:`~memfit.engine.graph.TERMS` (``one`` last), a hidden-size tensor between blocks
#: (``b s h x res / sp``), the embedding's 1-byte dropout mask (``b s h / sp``), then the
#: eleven values of each block that is not folded in (a block without an integer
#: profile, or with a size no linear form holds: see :func:`_compile`): the seven of
#: :class:`~memfit.engine.graph.BlockResult` (kept, forward peak, output, backward peak,
#: input gradient, parameter gradients, held), what the per-op policy saves, what custom
#: functions keep, and what it returns beside its output, all and unsaved (these four
#: read only where the layout has no form for them)
_ONE, _HIDDEN, _DROPOUT, _FIRST_BLOCK = len(TERMS) - 1, len(TERMS), len(TERMS) + 1, len(TERMS) + 2
_BLOCK = 11
#: of those, the :class:`~memfit.engine.graph.BlockResult`'s
_RESULT = 7
#: the block values of those four (:meth:`_Compiler.size_form`)
_PER_OP, _FUNCTION_KEPT, _RETURNED, _RETURNED_UNSAVED = 7, 8, 9, 10


@dataclass(frozen=True, slots=True)
class Moments:
    """The highest point of the forward and backward at many shapes, one array entry per
    shape (:meth:`StepPlan.moments`), and what the step's other moments need."""

    #: index into :data:`KINDS`
    kind: np.ndarray
    #: the layer, -1 for a point that is not a layer's
    layer: np.ndarray
    parameters: np.ndarray
    gradients: np.ndarray
    optimizer_states: np.ndarray
    activations: np.ndarray
    per_microbatch: np.ndarray
    logits: np.ndarray
    #: shapes these arrays do not hold exactly (a block simulated directly there, or a
    #: run of floored gradient shares not monotone there): play each with
    #: :meth:`StepPlan.play`
    single: np.ndarray


class _Max:
    """The largest of a few linear forms -- a block's forward or backward peak, from its
    profile's candidates: a point that holds it is a candidate for the step's highest
    point once per form (the highest of them is the point's own value)."""

    __slots__ = ("forms",)
    __array_ufunc__ = None  # an array plus a _Max is a _Max

    def __init__(self, forms: list[np.ndarray]) -> None:
        self.forms = forms

    def __add__(self, other: np.ndarray) -> _Max:
        return _Max([f + other for f in self.forms])

    __radd__ = __add__

    def __sub__(self, other: np.ndarray) -> _Max:
        return _Max([f - other for f in self.forms])


#: the quantities of a rank's model state that the constant bytes of a step's points are
#: linear in (:class:`_Sym`): its parameters, optimizer states and gradient buffers, the
#: bytes ZeRO-3 / FSDP keep gathered (:class:`~memfit.engine.timeline.context.Gather`, all
#: 0 where it gathers nothing), 1 where it gathers nothing (else 0: autocast's copies
#: count where no unit is gathered), and 1
STATE = (
    "params", "opt", "grad_buffer", "forward", "backward", "grads", "reduce", "unit", "local",
    "one",
)  # fmt: skip


class _Sym:
    """Bytes that are a linear form, with integer coefficients, in the rank's state
    quantities (:data:`STATE`): what a point holds beside its activations and gradients
    -- the parameters with the gathered units or autocast's copies, the optimizer
    states, the gradient buffers. The step is compiled with these symbols, so that one
    compile serves every share of the model state that gathers (or not) the same way;
    :meth:`at` gives the bytes of one share."""

    __slots__ = ("c",)
    __array_ufunc__ = None  # never mixed into a form of the shape

    def __init__(self, c: tuple[int, ...]) -> None:
        self.c = c

    # a symbol is never changed in place: an operation that changes nothing returns it
    def __add__(self, other: _Sym | int) -> _Sym:
        if isinstance(other, _Sym):  # every form of a step adds these: map, no generator
            return _Sym(tuple(map(operator.add, self.c, other.c)))
        if not other:
            return self
        return _Sym((*self.c[:-1], self.c[-1] + other))

    __radd__ = __add__

    def __mul__(self, k: int) -> _Sym:
        if k == 1:
            return self
        return _Sym(tuple([k * a for a in self.c]))

    __rmul__ = __mul__

    def __sub__(self, other: _Sym | int) -> _Sym:
        if isinstance(other, _Sym):
            return _Sym(tuple(map(operator.sub, self.c, other.c)))
        return self + (-other)

    def at(self, state: Sequence[int]) -> int:
        """The bytes at the state quantities ``state`` (in the order of :data:`STATE`)."""
        return sum(a * b for a, b in zip(self.c, state, strict=True))


#: each state quantity alone, as a symbol
_VARS = tuple(_Sym(tuple(int(j == i) for j in range(len(STATE)))) for i in range(len(STATE)))
_PARAMS, _LOCAL = STATE.index("params"), STATE.index("local")


class _Gathered(NamedTuple):
    """:class:`~memfit.engine.timeline.context.Gather` with its bytes as symbols."""

    forward: _Sym
    backward: _Sym
    grads: _Sym
    reduce: _Sym
    unit: _Sym


#: a point of the step that can be its highest (see :func:`_compile`): kind, layer,
#: parameters, optimizer states and gradient buffers (in the state quantities), and the
#: linear forms of its gradients before the rank's share is taken and of its activations
_Candidate = tuple[int, int, _Sym, _Sym, _Sym, np.ndarray, np.ndarray]
#: a run whose floored gradient share is checked: the growth of its gradients per
#: repetition, the fall of its activations, and of its other bytes (gathered units or
#: autocast's copies)
_Check = tuple[np.ndarray, np.ndarray, _Sym]


class _Recipe(NamedTuple):
    """What a :class:`~memfit.engine.timeline.stepplan.StepPlan` is compiled from, beyond its
    model, context and profiles."""

    layers: Sequence[_Layer]
    head: int
    #: what the step reads of the training: checkpointed inputs wait on the host
    #: (activation offload), checkpointing is reentrant, the previous step's graph and
    #: output live on into this one (:func:`~memfit.engine.timeline.context.carries_previous`)
    offload_inputs: bool
    reentrant: bool
    carries: bool
    gather: Gather
    grad_buffer: int
    opt: int
    trains_embeddings: bool
    per_op: Sequence[Size | None]
    function_kept_of: Sequence[Size | None]
    logits_block: int
    #: per block: what it returns beside its output, all and not saved (_Layout.returned)
    returned: Sequence[tuple[Size, Size] | None]


#: a source of a point's activations, its bytes not evaluated yet: the source with 0
#: bytes and its value (a form, a :class:`_Max`, or an integer)
_Deferred = tuple[Any, Any]
#: a point of the step played whole (:attr:`_Compiler.every`): kind, layer, parameters,
#: gradient buffers, the form of its gradients before the share, its activations (a form
#: or a :class:`_Max`) and its sources
_Entry = tuple[int, int, _Sym, _Sym, Any, Any, tuple[Any, ...]]


def _inputs_why(batch: Any, rope: Any, bool_mask: Any, mask: Any) -> list[_Deferred]:
    """The inputs' sources (:func:`_input_sources`), their bytes deferred."""
    templates = _input_sources(0, 0, 0, 0)
    return list(zip(templates, (batch, rope, bool_mask, mask), strict=True))


class _KeptForms:
    """What the layers so far keep, by kind, as the walk's ledger counts it
    (:class:`~memfit.engine.timeline.sources._Kept`), its bytes deferred: the additions in
    order, which a point sees up to where it was played (:class:`_KeptAt`)."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        #: (key, bytes, layers) added, or (key,) where every other part is forgotten
        self.entries: list[tuple[Any, ...]] = []

    def add(self, key: str, value: Any, layers: int) -> None:
        self.entries.append((key, value, layers))

    def only(self, key: str) -> None:
        self.entries.append((key,))

    def sources(self) -> tuple[_KeptAt]:
        return (_KeptAt(self, len(self.entries)),)


class _KeptAt:
    """The kept parts a point sees: the additions of :class:`_KeptForms` before it."""

    __slots__ = ("kept", "upto")

    def __init__(self, kept: _KeptForms, upto: int) -> None:
        self.kept, self.upto = kept, upto


class _Compiler:
    """The step, written once: played with symbolic sizes (:meth:`run`), every point's
    bytes a linear form over the shape quantities.

    Two plays of the same description:

    * **every point** (``every``): each layer a run of its own, every point in order with
      the sources of its activations (the explain ledger) -- what
      :meth:`~memfit.engine.timeline.stepplan.StepPlan.points_at` evaluates at a shape:
      the timeline's points, ``explain``, and the reference the other play is held to;
    * **the candidates for the highest point**: the points that can be it -- every point
      outside runs, and both ends of every run's later repetitions (see the module
      docstring) -- what one matrix product evaluates at one or many shapes; with what
      one micro-batch keeps, the other micro-batches in flight and the logits held; and
      for each run whose floored gradient share is not affine, the growth of its
      gradients and the fall of the rest per repetition (it is monotone only where they
      differ by a byte or more).

    A block with an integer profile is folded in: its values are the profile's forms
    (its peaks a :class:`_Max` of them); the values of the ``unfolded`` ones are shape
    quantities of their own. The forms are int64 vectors where ``dtype`` says they fit,
    else Python integers."""

    def __init__(
        self, plan: StepPlan, dtype: type, every: bool = False, ledger: bool = False
    ) -> None:
        recipe = plan.recipe
        #: every point, in order, not the candidates of the highest: each layer its own
        #: run; with ``ledger``, each point with the sources of its activations (explain)
        self.every, self.ledger = every, every and ledger
        self.played: list[_Entry] = []
        self.fixed_why: list[_Deferred] = []
        self.kept_why = _KeptForms()
        layers, head, per_op = recipe.layers, recipe.head, recipe.per_op
        trains_embeddings, function_kept_of = recipe.trains_embeddings, recipe.function_kept_of
        logits_block = recipe.logits_block
        self.plan, self.dtype, self.carries = plan, dtype, recipe.carries
        self.model, self.stage, self.ctx = plan.model, plan.stage, plan.ctx
        self.layers: Sequence[_Layer] = layers
        self.head = head
        # the rank's state enters as symbols (:class:`_Sym`): the compiled step holds for
        # every share of the model state that gathers (or not) the same way
        self.gather = _Gathered(*_VARS[3:8])
        self.opt, self.grad_buffer = _VARS[1], _VARS[2]
        #: 1 where no unit is gathered: what autocast's copies add to the parameters (the
        #: parameters a point holds: :meth:`held`)
        self.local = _VARS[_LOCAL]
        self.trains_embeddings, self.logits_block = trains_embeddings, logits_block
        self.profiles, self.unfolded = plan.profiles, plan.unfolded
        self.size = _FIRST_BLOCK + _BLOCK * len(plan.unfolded)
        # rows shared: no form changes in place
        self.basis: np.ndarray = np.eye(self.size, dtype=dtype)
        self.values: dict[tuple[int, int], Any] = {}
        self.cands: list[_Candidate] = []
        self.one, self.tokens = self.var(_ONE), self.var(0)
        self.pairs, self.hidden = self.var(1), self.var(_HIDDEN)
        self.nothing = 0 * self.one
        ckpt_input = self.nothing if recipe.offload_inputs else self.hidden
        # what a checkpointed layer of each block keeps: its input, what per-op saves, and
        # what custom autograd functions keep on their ctx (non-reentrant checkpointing
        # drops only what goes through its saved-tensor hooks: bitsandbytes' 4-bit matmul
        # keeps its input from the forward to the layer's backward, and its recomputation's
        # copy goes with the recomputed graph). Reentrant checkpointing runs the forward
        # without autograd: no function keeps anything there
        self.function_kept_of: Sequence[Size | None] = function_kept_of
        self.returned: Sequence[tuple[Size, Size] | None] = recipe.returned
        self.kept_on = [
            ckpt_input
            + (self.size_form(b, _PER_OP, per_op[b]) if per_op else self.nothing)
            + (self.nothing if recipe.reentrant else self.kept_by_functions(b))
            for b in range(len(plan.profiles))
        ]

    def var(self, i: int) -> np.ndarray:
        row: np.ndarray = self.basis[i]
        return row

    def form(self, prof: Profile, coefs: tuple[int, ...]) -> np.ndarray:
        v: np.ndarray = np.zeros(self.size, dtype=self.dtype)
        v[list(prof.terms)] = coefs
        return v

    def value(self, b: int, f: int) -> Any:
        """Field ``f`` of block ``b``: a form, or for a peak a :class:`_Max` of forms."""
        values = self.values
        if (b, f) not in values:
            prof = self.profiles[b]
            if b in self.unfolded or prof is None:
                values[b, f] = self.var(_FIRST_BLOCK + _BLOCK * self.unfolded.index(b) + f)
            elif f in (1, 3):
                forms = prof.forward if f == 1 else prof.backward
                values[b, f] = _Max([self.form(prof, v) for v in forms])
            else:
                fields = (prof.kept, (), prof.output, (), prof.input_grad, prof.param_grads)
                values[b, f] = self.form(prof, (*fields, prof.held)[f])
        return values[b, f]

    linear = peak = value

    def saved_form(self, size_of: Size) -> np.ndarray:
        v: np.ndarray = np.zeros(self.size, dtype=self.dtype)
        for j, a in enumerate(_coefs(size_of)):
            if a != int(a):
                raise ValueError("a per-op saved size that is not whole bytes")
            v[j] = int(a)
        return v

    def size_form(self, b: int, field: int, size: Size | None) -> np.ndarray:
        """A size of block ``b`` as a form: the layout's linear form, or where it has none
        (``None``) the block's value ``field`` at each shape."""
        if size is None:
            form: np.ndarray = self.value(b, field)
            return form
        return self.saved_form(size)

    def kept_by_functions(self, b: int) -> np.ndarray:
        """What block ``b``'s custom autograd functions keep on their ctx, as a form."""
        return self.size_form(b, _FUNCTION_KEPT, self.function_kept_of[b])

    def add(
        self,
        kind: int,
        layer: int,
        p: _Sym,
        g: _Sym,
        grads: np.ndarray,
        a: Any,
        own: tuple[_Deferred, ...] = (),
    ) -> None:
        if self.every:
            why = (*self.fixed_why, *self.kept_why.sources(), *own) if self.ledger else ()
            self.played.append((kind, layer, p, g, grads, a, why))
            return
        for f in a.forms if isinstance(a, _Max) else [a]:
            self.cands.append((kind, layer, p, self.opt, g, grads, f))

    def buffers(self, reducing: _Sym | int) -> _Sym:
        return self.grad_buffer + self.gather.grads + reducing

    def held(self, gathered: _Sym, copies: int) -> _Sym:
        """The parameters a point holds: the shards with the ``gathered`` units where ZeRO-3
        / FSDP gathers (the gathered symbols are 0 where it does not), else with
        autocast's ``copies``."""
        c = list(gathered.c)  # params + gathered + copies x local, in one symbol
        c[_PARAMS] += 1
        c[_LOCAL] += copies
        return _Sym(tuple(c))

    def runs(self, layers: Sequence[_Layer], start: int, step: int) -> tuple[_Run, ...]:
        """The layers as runs (:func:`_runs`); every point: each layer a run of its own."""
        if self.every:
            return tuple((start + step * i, (layer,), 1) for i, layer in enumerate(layers))
        return _runs(tuple(layers), start, step)

    def why(self, template: Callable[[], Source], value: Any) -> tuple[_Deferred, ...]:
        """A source of a point's activations (``template()``, made with the ledger only),
        its bytes ``value``."""
        return ((template(), value),) if self.ledger else ()

    def run(self) -> tuple[list[_Candidate], np.ndarray, np.ndarray, np.ndarray, list[_Check]]:
        model, ctx, stage = self.model, self.ctx, self.stage
        tokens, pairs, nothing = self.tokens, self.pairs, self.nothing
        rope = 2 * model.head_dim * ctx.res if model.position_embedding == "rotary" else 0
        eager = ctx.attention == "eager"
        bool_mask = pairs if ctx.masked and not eager else nothing
        base = (16 + rope) * tokens + bool_mask
        # the previous step's graph (what custom functions keep) and model output
        graph_kept = old_output = nothing
        if self.carries:
            for b, on, _, _ in self.layers:
                if not on:
                    graph_kept = graph_kept + self.kept_by_functions(b)
                    if ctx.outputs_held:  # a released output took its KV cache with it
                        old_output = old_output + self.linear(b, 6)
            graph_kept = graph_kept + self.kept_by_functions(self.head)
            old_output = old_output + self.linear(self.head, 6)
        mask = ctx.res * pairs if eager else nothing
        if self.ledger:
            inputs = (16 * tokens, rope * tokens, bool_mask, mask)
            self.fixed_why = [
                *_inputs_why(*inputs),
                (_previous_sources(0, 0)[0], graph_kept),
                (_previous_sources(0, 0)[1], old_output),
            ]
        fixed = base + mask + graph_kept + old_output
        kept, copies, per_microbatch, waiting, held = self._forward(fixed, old_output)
        cache = nothing
        cached_layers = 0
        for b, on, _, _ in self.layers:
            if not on:
                cache = cache + self.linear(b, 6)
                cached_layers += 1
        if not ctx.outputs_held:
            # the model output, released once the loss is computed, takes the KV cache
            # the layers handed to it: alive through the forward and the loss only
            kept, per_microbatch = kept - cache, per_microbatch - cache
            waiting = waiting - (stage.inflight - 1) * cache
            if self.ledger:
                self.kept_why.add("kv-cache", -cache, -cached_layers)
            cache = nothing
        if self.ledger:
            inputs = (16 * tokens, rope * tokens, bool_mask, nothing)
            self.fixed_why = [*_inputs_why(*inputs), (_output_source(0), held)]
        checks = self._backward(base + held, kept, copies, cache)
        # the model output, with what the layers handed to it, lives through the optimizer
        return self.cands, per_microbatch, waiting, held + cache, checks

    def _kept_by(self, unit: tuple[_Layer, ...], handed: bool) -> np.ndarray:
        """What a repetition of ``unit`` adds to the activations kept (``handed``: with
        what it hands to the model output, the KV cache, which backward does not free)."""
        out, one = self.nothing, self.one
        for b, on, c, _ in unit:
            if on:
                out = out + self.kept_on[b]
            else:
                out = out + (self.linear(b, 0) - c * one)
                out = out + self.linear(b, 6) if handed else out
        return out

    def _forward_unit(
        self,
        unit: tuple[_Layer, ...],
        i: int,
        kept: np.ndarray,
        copies: int,
        fixed: np.ndarray,
        prev: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The candidates of ``unit``'s layers from layer ``i`` on; returns what they keep
        and what the last one returned that the next one's forward holds. ``prev``: what
        the layer before returned and kept not (:attr:`_Recipe.returned`), alive through
        this unit's first layer's forward."""
        gather, one, kinds = self.gather, self.one, self.plan.blocks
        for b, on, c, _ in unit:
            p = self.held(i * gather.unit + gather.forward, copies + c)
            work = self.peak(b, 1) - c * one
            own = self.why(partial(_work_source, "forward", 0, i), work)
            if self.ledger and prev is not self.nothing:
                own = (*own, *self.why(partial(_returned_source, 0, i - 1), prev))
            point = fixed + kept + work + prev
            self.add(_LAYER_F, i, p, self.grad_buffer, self.nothing, point, own)
            returned = self.returned[b]
            if returned is None:  # evaluated at each shape
                prev = self.value(b, _RETURNED if on else _RETURNED_UNSAVED)
            else:
                every, unsaved = returned
                prev = self.saved_form(every if on else unsaved) if every else self.nothing
            kept = kept + (
                self.kept_on[b] if on else self.linear(b, 0) - c * one + self.linear(b, 6)
            )
            if self.ledger and on:
                self.kept_why.add("checkpointed", self.kept_on[b], 1)
            elif self.ledger:
                self.kept_why.add(kinds[b][0], self.linear(b, 0) - c * one, 1)
                self.kept_why.add("kv-cache", self.linear(b, 6), 1)
            copies += c
            i += 1
        return kept, prev

    def _forward(
        self, fixed: np.ndarray, old_output: np.ndarray
    ) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray]:
        """The forward's candidates; returns what the layers keep, autocast's copies left
        after the forward, one micro-batch's activations, the others' in flight and the
        logits held."""
        model, stage, gather = self.model, self.stage, self.gather
        nothing, one, hidden, tokens = self.nothing, self.one, self.hidden, self.tokens
        grad_buffer, layers = self.grad_buffer, self.layers
        chunked = self.plan.chunked
        kept = nothing
        if stage.first:
            kept = int(model.embedding_norm) * (hidden + 8 * tokens)
            kept = kept + (self.var(_DROPOUT) if model.hidden_dropout > 0 else nothing)
            p = self.held(gather.forward, 0)
            own = self.why(partial(_work_source, "embedding", 0, None), hidden)
            self.add(_EMBED_F, -1, p, grad_buffer, nothing, fixed + hidden, own)
        if self.ledger:
            self.kept_why.add("embedding", kept, 0)
        copies = 0
        prev = nothing  # what the layer before returned: nothing before the first
        for start, unit, reps in self.runs(layers, 0, 1):
            kept, prev = self._forward_unit(unit, start, kept, copies, fixed, prev)
            copies += sum(c for _, _, c, _ in unit)
            if reps > 1:
                n, rest = len(unit), reps - 1
                d_kept, d_copies = self._kept_by(unit, True), sum(c for _, _, c, _ in unit)
                for t in sorted({0, rest - 1}):  # a run's highest point is at one of its ends
                    at = start + n + t * n
                    self._forward_unit(
                        unit, at, kept + t * d_kept, copies + t * d_copies, fixed, prev
                    )
                kept = kept + rest * d_kept
                copies += rest * d_copies
        head = self.head
        if stage.last:
            hv = [
                self.peak(head, f) if f in (1, 3) else self.linear(head, f) for f in range(_RESULT)
            ]
            head_copies, head_saved = self.plan.copies[head]
        else:  # the output goes to the next stage; its gradient comes back
            hv = [nothing, hidden, nothing, 2 * hidden, hidden, nothing, nothing]
            head_copies = head_saved = 0
        self.hv, self.head_saved = hv, head_saved
        units = len(layers) * gather.unit
        p = self.held(units + gather.forward, copies + head_copies)
        if self.logits_block >= 0:
            c = self.plan.copies[self.logits_block].made
            q = self.held(units + gather.forward, copies + c)
            peak = self.peak(self.logits_block, 1) - c * one
            own = self.why(partial(_head_source, "logits", 0, chunked), peak)
            self.add(_LOGITS_F, -1, q, grad_buffer, nothing, fixed + kept + peak, own)
        if self.ledger:  # the previous step's model output is gone once this forward returns
            self.fixed_why = [w for w in self.fixed_why if w[0].name != _PREVIOUS_OUTPUT]
        kind = _HEAD_F if stage.last else _SEND_F
        peak = hv[1] - head_copies * one
        own = self.why(partial(_head_source, "forward", 0, chunked, stage.last), peak)
        self.add(kind, -1, p, grad_buffer, nothing, fixed - old_output + kept + peak, own)
        copies += head_copies
        held = hv[6]
        per_microbatch = kept + held
        waiting = (stage.inflight - 1) * per_microbatch + (nothing if stage.first else hidden)
        # autocast's cache is cleared: the copies of checkpointed layers go, and of the
        # others those that backward did not save
        copies -= head_copies - head_saved
        copies -= sum(c if on else c - saved for _, on, c, saved in layers)
        return kept, copies, per_microbatch, waiting, held

    def _backward_unit(self, unit: tuple[_Layer, ...], i: int, state: _State) -> _State:
        kept, copies, grads, units, grad_in, reducing = state
        gather, one, fixed = self.gather, self.one, self.fixed_b
        g_bwd, kinds = gather.backward, self.plan.blocks
        for b, on, c, saved in unit:
            g = self.buffers(reducing)
            work = self.peak(b, 3) - saved * one
            own = self.why(partial(_work_source, "backward", 0, i), work)
            if on:
                kept = kept - self.kept_on[b]
                if self.ledger:
                    self.kept_why.add("checkpointed", -self.kept_on[b], -1)
                p = self.held(units + g_bwd, copies + c)
                redo = self.peak(b, 1) - c * one
                again = (
                    *self.why(partial(_grad_source, 0, i), grad_in),
                    *self.why(partial(_work_source, "recompute", 0, i), redo),
                )
                self.add(_RECOMPUTE, i, p, g, grads, fixed + kept + grad_in + redo, again)
                p = self.held(units + g_bwd, copies + saved)
                self.add(_LAYER_B, i, p, g, grads, fixed + kept + work, own)
            else:
                kept = kept - (self.linear(b, 0) - c * one)
                if self.ledger:
                    self.kept_why.add(kinds[b][0], -(self.linear(b, 0) - c * one), -1)
                p = self.held(units + g_bwd, copies)
                self.add(_LAYER_B, i, p, g, grads, fixed + kept + work, own)
                copies -= saved
            grads = grads + self.linear(b, 5)
            grad_in = self.linear(b, 4)
            units -= gather.unit
            reducing = gather.reduce
            i -= 1
        return kept, copies, grads, units, grad_in, reducing

    def _backward(
        self, fixed: np.ndarray, kept: np.ndarray, copies: int, cache: np.ndarray
    ) -> list[_Check]:
        """The backward's candidates; returns the runs to check."""
        gather, one, hv = self.gather, self.one, self.hv
        layers, plan = self.layers, self.plan
        self.fixed_b = fixed
        n_layers = len(layers)
        units = n_layers * gather.unit
        p = self.held(units + gather.backward, copies)
        kind = _HEAD_B if self.stage.last else _RECV_B
        peak = hv[3] - self.head_saved * one
        own = self.why(partial(_head_source, "backward", 0, plan.chunked, self.stage.last), peak)
        self.add(kind, -1, p, self.buffers(0), self.nothing, fixed + kept + peak, own)
        copies -= self.head_saved
        state: _State = (kept, copies, hv[5], units, hv[4], 0)
        checks: list[_Check] = []
        for start, unit, reps in self.runs(layers[::-1], n_layers - 1, -1):
            state = self._backward_unit(unit, start, state)
            if reps <= 1:
                continue
            kept, copies, grads, units, grad_in, reducing = state
            n, rest = len(unit), reps - 1
            d_kept = self._kept_by(unit, False)
            d_grads = sum((self.linear(b, 5) for b, _, _, _ in unit), self.nothing)
            d_copies = sum(saved for _, on, _, saved in unit if not on)
            d_units = n * gather.unit
            # floored shares: monotone only if they move enough
            if plan.grad_share.denominator != 1 and rest > 2:
                checks.append((d_grads, d_kept, d_units + d_copies * self.local))
            for t in sorted({0, rest - 1}):
                at = (kept - t * d_kept, copies - t * d_copies, grads + t * d_grads)
                state_t = (*at, units - t * d_units, grad_in, reducing)
                self._backward_unit(unit, start - n - t * n, state_t)
            state = (
                kept - rest * d_kept,
                copies - rest * d_copies,
                grads + rest * d_grads,
                units - rest * d_units,
                grad_in,
                reducing,
            )
        kept, copies, grads, units, grad_in, reducing = state
        if self.ledger:  # the embedding's saved tensors went with its backward; the cache stays
            self.kept_why.only("kv-cache")
        if self.trains_embeddings:
            p = self.held(units + gather.backward, 0)
            own_grads = grads + (plan.dense_grad - plan.tied) * one
            peak = fixed + cache + grad_in + plan.tied * one
            why = (
                *self.why(partial(_grad_source, 0, None), grad_in),
                *self.why(partial(_work_source, "tied gradient", 0, None), plan.tied * one),
            )
            self.add(_EMBED_B, -1, p, self.buffers(reducing), own_grads, peak, why)
        return checks


#: what the backward carries from layer to layer: what is kept, autocast's copies, the
#: gradients, the gathered units, the input gradient and the reduce-scatter input
_State = tuple[np.ndarray, int, np.ndarray, Any, np.ndarray, Any]


def dtype_of(plan: StepPlan) -> type:
    """int64 for the forms of ``plan`` where every coefficient fits, else Python integers:
    every coefficient of a form is a sum over the layers of profile coefficients and
    constants, raised by the micro-batches in flight."""
    recipe, model, stage = plan.recipe, plan.model, plan.stage
    gather = recipe.gather
    largest = max(
        [p.largest for p in plan.profiles if p is not None]
        + [plan.params, recipe.opt, recipe.grad_buffer, plan.dense_grad]
        + [sum(c.made for c in plan.copies)]
        + [gather.forward, gather.backward, gather.grads, gather.reduce, gather.unit]
        + [64 + 4 * model.head_dim]
    )
    bound = 4 * (stage.inflight + 2) * (len(recipe.layers) + 8) * largest
    return np.int64 if bound < _INT64_SAFE else object


def state_of(plan: StepPlan) -> tuple[int, ...]:
    """The state quantities (:data:`STATE`) of ``plan``'s rank: where ZeRO-3 / FSDP
    gathers nothing, every gathered quantity 0 and ``local`` 1."""
    recipe = plan.recipe
    g = recipe.gather
    gathered = (g.forward, g.backward, g.grads, g.reduce, g.unit) if g.active else (0,) * 5
    return (plan.params, recipe.opt, recipe.grad_buffer, *gathered, int(not g.active), 1)


def compile_key(plan: StepPlan) -> tuple[object, ...]:
    """Everything :class:`_Compiler` reads of ``plan`` but its state quantities: plans
    with the same key compile to the same :class:`_Skeleton`. The layout
    (:func:`~memfit.engine.timeline.stepplan._layout`: the blocks, their profiles, copies
    and per-layer parts, laid out for the plan's model and context) stands for all it is
    made from; :func:`dtype_of` reads the state too, so it is part of the key."""
    r = plan.recipe
    return (
        plan.layout,
        plan.stage,
        plan.dense_grad,
        plan.tied,
        plan.grad_share.denominator != 1,
        r.offload_inputs,
        r.reentrant,
        r.carries,
        r.trains_embeddings,
        dtype_of(plan),
    )


#: int64 holds a sum of products whose float64 estimate is below this
_FLOAT_SAFE = float(1 << 61)


def _times(coefs: np.ndarray, state: np.ndarray) -> np.ndarray:
    """``coefs @ state`` exactly: in int64 where a bound on every value fits, else in
    Python integers."""
    bound = np.abs(coefs).astype(float) @ np.abs(state).astype(float)
    if coefs.dtype != object and (not len(bound) or bound.max() < _FLOAT_SAFE):
        out: np.ndarray = coefs @ state
        return out
    exact: np.ndarray = coefs.astype(object) @ state.astype(object)
    return exact


@dataclass(frozen=True, slots=True)
class _Skeleton:
    """A step compiled with its state quantities as symbols (:class:`_Sym`): the
    candidates' kinds and layers, their parameters and gradient buffers as coefficients
    of :data:`STATE`, and the matrix of :class:`_Forms` but for the state's share of the
    rows of the runs to check. :meth:`at` makes the :class:`_Forms` of one rank's
    state; every plan of the same :func:`compile_key` shares one skeleton."""

    kinds: tuple[int, ...]
    layer_of: tuple[int, ...]
    parameters: np.ndarray
    buffers: np.ndarray
    matrix: np.ndarray
    columns: tuple[int, ...]
    #: per run checked: its row of other bytes in the matrix (the gathered units, or
    #: autocast's copies where none is), and what the state adds to its ``one`` column
    moves: tuple[tuple[int, _Sym], ...]
    checks: int
    dtype: type

    @staticmethod
    def compile(plan: StepPlan) -> _Skeleton:
        dtype = dtype_of(plan)
        cands, per_microbatch, waiting, held, checks = _Compiler(plan, dtype).run()
        rows = [c[6] for c in cands] + [c[5] for c in cands] + [per_microbatch, waiting, held]
        first = len(rows)
        for d_grads, d_kept, _ in checks:
            rows += [d_grads, d_kept]
        matrix = np.stack(rows)
        # the gathered units, or autocast's copies where none is: the state's
        moves = tuple((first + 2 * k + 1, move) for k, (_, _, move) in enumerate(checks))
        n = len(STATE)

        def coefficients(values: list[_Sym]) -> np.ndarray:
            flat = [x for v in values for x in v.c]
            fits = max(flat, default=0) < _INT64_SAFE and -min(flat, default=0) < _INT64_SAFE
            return np.array(flat, dtype=np.int64 if fits else object).reshape(-1, n)

        return _Skeleton(
            kinds=tuple(c[0] for c in cands),
            layer_of=tuple(c[1] for c in cands),
            parameters=coefficients([c[2] for c in cands]),
            buffers=coefficients([c[4] for c in cands]),
            matrix=matrix,
            columns=tuple(int(c) for c in np.abs(matrix).max(axis=0)),
            moves=moves,
            checks=len(checks),
            dtype=dtype,
        )

    def at(self, state: tuple[int, ...]) -> _Forms:
        """The compiled forms of the rank whose state quantities are ``state``."""
        matrix, columns = self.matrix, self.columns
        if self.moves:
            matrix = matrix.copy()
            for row, move in self.moves:
                matrix[row, _ONE] += move.at(state)
            columns = tuple(int(c) for c in np.abs(matrix).max(axis=0))
        s = np.array(state, dtype=np.int64 if max(map(abs, state)) < _INT64_SAFE else object)
        parameters, buffers = _times(self.parameters, s), _times(self.buffers, s)
        opt = state[1]
        constant = parameters + opt
        largest_constant = int(np.abs(constant).max()) + int(np.abs(buffers).max())
        fits = self.dtype is np.int64 and largest_constant < _INT64_SAFE
        as_type = np.int64 if fits else object
        return self._forms(
            parameters.astype(as_type),
            constant.astype(as_type),
            buffers.astype(as_type),
            opt,
            largest_constant,
            (matrix if fits else matrix.astype(object), columns),
            (np.array(self.kinds, dtype=as_type), np.array(self.layer_of, dtype=as_type)),
        )

    def _forms(
        self,
        parameters: np.ndarray,
        constant: np.ndarray,
        buffers: np.ndarray,
        opt: int,
        largest_constant: int,
        matrix: tuple[np.ndarray, tuple[int, ...]],
        kinds: tuple[np.ndarray, np.ndarray],
    ) -> _Forms:
        """The forms of one state from its parts evaluated (every array int64 where they
        fit, else of Python integers): the candidates' parameters, constants and gradient
        buffers, the optimizer states, the matrix with its columns' bounds, and the
        candidates' kinds and layers as arrays."""
        n = len(self.kinds)
        return _Forms(
            kinds=self.kinds,
            layer_of=self.layer_of,
            fixed_parameters=tuple(parameters.tolist()),
            fixed_optimizer=(opt,) * n,
            arrays=(*kinds, parameters, np.full(n, opt, dtype=parameters.dtype)),
            constant=constant,
            buffers=buffers,
            matrix=matrix[0],
            fits=parameters.dtype == np.int64,
            columns=matrix[1],
            largest_constant=largest_constant,
            checks=self.checks,
        )

    def at_each(self, states: Sequence[tuple[int, ...]]) -> list[_Forms | None]:
        """:meth:`at` of each of ``states``, equal to it, evaluated together: one product
        of the state quantities with the coefficients for all of them. ``None`` for a
        state to call :meth:`at` with instead: every one where a run checked moves with
        the state, where a coefficient, a state quantity or a product might not fit
        int64; the one whose constants might not."""
        n = len(self.kinds)
        k = len(states)
        if (
            self.moves
            or not n
            or self.dtype is not np.int64
            or self.parameters.dtype != np.int64
            or self.buffers.dtype != np.int64
            or max(abs(v) for state in states for v in state) >= _INT64_SAFE
        ):
            return [None] * k
        s = np.array(states, dtype=np.int64)  # state x quantity
        size = np.abs(s).astype(float)
        for coefs in (self.parameters, self.buffers):
            if (size @ np.abs(coefs).astype(float).T).max() >= _FLOAT_SAFE:
                return [None] * k
        parameters = s @ self.parameters.T  # state x candidate, exact in int64
        buffers = s @ self.buffers.T
        opts = [state[1] for state in states]
        constants = parameters + s[:, 1:2]
        # added in Python integers: two int64 maxima can overflow together
        top_constant = np.abs(constants).max(axis=1).tolist()
        top_buffer = np.abs(buffers).max(axis=1).tolist()
        largest = [c + b for c, b in zip(top_constant, top_buffer, strict=True)]
        kinds = (np.array(self.kinds, dtype=np.int64), np.array(self.layer_of, dtype=np.int64))
        return [
            self._forms(
                parameters[j],
                constants[j],
                buffers[j],
                opt,
                largest[j],
                (self.matrix, self.columns),
                kinds,
            )
            if largest[j] < _INT64_SAFE
            else None
            for j, opt in enumerate(opts)
        ]


_SKELETONS: memo.Table[tuple[object, ...], _Skeleton] = memo.Table(f"{__name__}._SKELETONS", 4096)


@dataclass(frozen=True, slots=True)
class _Forms:
    """A step plan compiled (:func:`_compile`): the candidates for the highest point of
    forward and backward -- kind, layer and their constant parameters, optimizer states
    and gradient buffers -- and the matrix of their linear forms over the shape
    quantities: activations, gradients before the share, then what a micro-batch keeps,
    the other micro-batches in flight, the logits held, then the pairs of rows of the
    runs to check."""

    kinds: tuple[int, ...]
    layer_of: tuple[int, ...]
    fixed_parameters: tuple[int, ...]
    fixed_optimizer: tuple[int, ...]
    #: the four above as arrays (for many shapes at once)
    arrays: tuple[np.ndarray, ...]
    constant: np.ndarray
    buffers: np.ndarray
    matrix: np.ndarray
    #: whether ``constant``, ``buffers`` and ``matrix`` are int64 (else Python integers)
    fits: bool
    #: the largest absolute coefficient of each column of the matrix, and the largest
    #: absolute constant and buffer together: what bounds the values of a play
    columns: tuple[int, ...]
    largest_constant: int
    checks: int

    @staticmethod
    def of(plan: StepPlan) -> _Forms:
        """``plan`` compiled: its :class:`_Skeleton`, shared by every plan of the same
        :func:`compile_key`, at its rank's state quantities."""
        key = compile_key(plan)
        skeleton = _SKELETONS.get(key) or _SKELETONS.keep(key, _Skeleton.compile(plan))
        return skeleton.at(state_of(plan))

    @staticmethod
    def of_each(plans: Sequence[StepPlan]) -> list[_Forms]:
        """:meth:`of` of each of ``plans``, equal to it: the plans of one skeleton (a
        sweep's strategies that differ in their share of the model state) evaluated at
        their states together (:meth:`_Skeleton.at_each`)."""
        out: list[_Forms | None] = [None] * len(plans)
        alike: dict[tuple[object, ...], list[int]] = {}
        for i, plan in enumerate(plans):
            alike.setdefault(compile_key(plan), []).append(i)
        for key, indices in alike.items():
            first = plans[indices[0]]
            skeleton = _SKELETONS.get(key) or _SKELETONS.keep(key, _Skeleton.compile(first))
            states = [state_of(plans[i]) for i in indices]
            made = skeleton.at_each(states) if len(indices) > 1 else [None]
            for i, state, forms in zip(indices, states, made, strict=True):
                out[i] = forms if forms is not None else skeleton.at(state)
        return cast(list[_Forms], out)  # every plan has its forms
