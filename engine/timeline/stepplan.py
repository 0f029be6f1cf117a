"""A step compiled for every shape (:class:`StepPlan`): the compiled forms of its highest
points (:mod:`memfit.engine.timeline.compiled`), evaluated for a micro-batch and sequence length,
the
step played point by point where the forms cannot say, and :class:`Joint`, the stages of a
pipeline evaluated together."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from operator import mul
from typing import Any, TypeVar

import numpy as np

from memfit.engine import memo
from memfit.engine.graph import Profile, Size, concrete
from memfit.engine.layers import CHUNK_ROWS, Ctx
from memfit.engine.model_state import DTYPE_BYTES, ModelState, saved_components
from memfit.engine.plan.precision import precision_of
from memfit.engine.specs import ModelSpec, TrainingSpec
from memfit.engine.stacks import conventions
from memfit.engine.timeline.blocks import (
    Casts,
    _direct,
    _function_kept,
    _per_op,
    _profile,
    _returned,
    block_model,
)
from memfit.engine.timeline.compiled import (
    _BLOCK,
    _DROPOUT,
    _FIRST_BLOCK,
    _HIDDEN,
    _INT64_SAFE,
    KINDS,
    Moments,
    _Compiler,
    _Entry,
    _Forms,
    _KeptAt,
    _KeptForms,
    _Layer,
    _Max,
    _Recipe,
    dtype_of,
    state_of,
)
from memfit.engine.timeline.context import (
    HEAD_LOGITS,
    Gather,
    Stage,
    carries_previous,
    layers_and_head_grad,
    make_ctx,
    optimizer_temporaries,
    plays_logits_point,
    trains_embedding,
)
from memfit.engine.timeline.points import Point, Timeline, _total
from memfit.engine.timeline.sources import Source, _in_flight_source, _Kept, _output_source

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Every:
    """Every point of a step as forms (:meth:`StepPlan.every`): the points in order, what
    one micro-batch keeps, the other micro-batches in flight, the model output held."""

    played: tuple[_Entry, ...]
    per_microbatch: Any
    waiting: Any
    held: Any
    #: the model output the loss leaves held (the KV cache the layers handed to it aside)
    output: Any
    #: what the layers keep, by kind, as the points saw it (their sources)
    kept: _KeptForms
    #: every form above, one row each, by its id: evaluated at a shape in one product
    rows: tuple[int, ...]
    matrix: np.ndarray
    #: the largest absolute coefficient of each column: what bounds a value
    columns: tuple[int, ...]


def _values_of(
    played: tuple[_Entry, ...], kept: _KeptForms, more: tuple[Any, ...]
) -> list[np.ndarray]:
    """Every form the points of :class:`_Every` hold: activations (each form of a peak),
    gradients, sources, what the layers keep, and ``more``."""
    out: list[np.ndarray] = []

    def take(v: Any) -> None:
        if isinstance(v, _Max):
            out.extend(v.forms)
        elif isinstance(v, np.ndarray):
            out.append(v)

    for *_, grads, a, why in played:
        take(grads)
        take(a)
        for w in why:
            if not isinstance(w, _KeptAt):
                take(w[1])
    for entry in kept.entries:
        if len(entry) == 3:
            take(entry[1])
    for v in more:
        take(v)
    return out


@dataclass(frozen=True, slots=True, eq=False)
class _Layout:
    """The blocks of a step and how its layers are laid out of them (see
    :func:`_layout`). Compared by identity: one object per set of arguments of
    :func:`_layout` while its cache holds it, so that a key that holds it is cheap to
    hash (and an equal one made again is only another key)."""

    #: the distinct blocks (kind, input needs a gradient), their profiles and copies
    blocks: tuple[tuple[str, bool], ...]
    profiles: tuple[Profile | None, ...]
    copies: tuple[Casts, ...]
    #: each layer: its block, whether it is checkpointed, its copies made and saved
    layers: tuple[_Layer, ...]
    unfolded: tuple[int, ...]
    head: int
    logits_block: int
    #: per block, as linear forms of the shape: what the per-op policy saves, what custom
    #: functions keep on their ctx, and what it returns beside its output, alive through
    #: the next layer's forward (:func:`~memfit.engine.timeline.blocks._returned`: all of
    #: it, and what it did not save); ``None`` where no linear form holds one (a block
    #: built at concrete shapes only: it is evaluated at each shape, as an unfolded block)
    per_op: tuple[Size | None, ...]
    kept_of: tuple[Size | None, ...]
    returned: tuple[tuple[Size, Size] | None, ...]


def _linear(size: Callable[..., T], *args: Any) -> T | None:
    """``size(*args)``, a size of a block built with symbolic sizes; ``None`` where the
    block cannot be built so (transformers' eager experts loop routes whole tokens to
    each expert: :func:`memfit.engine.layers._moe_eager`) or no linear form of the shape
    holds the size."""
    try:
        return size(*args)
    except (TypeError, ValueError):
        return None


@memo.cached(maxsize=4096)
def _layout(
    model: ModelSpec,
    ctx: Ctx,
    kinds: tuple[tuple[str, bool], ...],
    ckpt: tuple[bool, ...],
    last: bool,
    head_grad: bool,
    chunked: bool,
    logits: bool,
    per_op: bool,
    function_kept: bool,
) -> _Layout:
    """The blocks of a step whose layers are ``kinds`` (checkpointed where ``ckpt``
    says) at ``ctx``, with the LM head where the stage is the ``last`` (its input
    needing a gradient where ``head_grad``), a point at the
    logits where ``logits``; the per-op policy's saved outputs of each block where
    ``per_op``, and where ``function_kept`` what custom functions keep on their ctx. The
    same for every share of the model state: kept for every strategy that lays its
    layers out alike."""
    blocks: list[tuple[str, bool]] = []

    def block(kind: str, x_grad: bool) -> int:
        if (kind, x_grad) not in blocks:
            blocks.append((kind, x_grad))
        return blocks.index((kind, x_grad))

    of_layer = [block(kind, x_grad) for kind, x_grad in kinds]
    head = block("head", head_grad) if last else -1
    logits_block = block(HEAD_LOGITS, head_grad) if logits else -1
    found = [_profile(model, ctx, kind, x_grad, chunked) for kind, x_grad in blocks]
    profiles = tuple(p for p, _ in found)
    copies = tuple(c for _, c in found)
    symbolic = dataclasses.replace(ctx, symbolic=True)
    # the per-op policy's saved outputs of each block, as linear forms of the shape
    saved: tuple[Size | None, ...] = (0,) * len(blocks)
    if per_op:
        saved = tuple(
            _linear(_per_op, model, symbolic, kind, x_grad)
            if kind not in ("head", HEAD_LOGITS)
            else 0
            for kind, x_grad in blocks
        )
    # what custom functions of each block keep on their ctx, where the previous step's
    # graph lives on into this one, or where checkpointing cannot drop it (QLoRA's 4-bit
    # matmul keeps its input on its ctx, past the checkpoint's saved-tensor hooks)
    kept_of: tuple[Size | None, ...] = (0,) * len(blocks)
    if function_kept:
        kept_of = tuple(
            _linear(_function_kept, model, symbolic, kind, x_grad, chunked)
            for kind, x_grad in blocks
        )
    returned = tuple(
        _linear(_returned, model, symbolic, kind, x_grad)
        if kind not in ("head", HEAD_LOGITS)
        else (0, 0)
        for kind, x_grad in blocks
    )
    per_shape = {
        b
        for b, sizes in enumerate(zip(saved, kept_of, returned, strict=True))
        if any(x is None for x in sizes)
    }
    return _Layout(
        tuple(blocks),
        profiles,
        copies,
        tuple((b, on, *copies[b]) for b, on in zip(of_layer, ckpt, strict=True)),
        tuple(b for b, p in enumerate(profiles) if p is None or p.den != 1 or b in per_shape),
        head,
        logits_block,
        saved,
        kept_of,
        returned,
    )


@dataclass(frozen=True, slots=True, eq=False)
class StepPlan:
    """Everything of one step (a rank's, see :func:`step_timeline`) that does not depend
    on the micro-batch size and the sequence length; :meth:`play` adds the shape."""

    model: ModelSpec
    #: the step's context at batch 1 x sequence 1: the key of the block profiles
    ctx: Ctx
    chunked: bool
    layers: int
    checkpointed_layers: int
    offload_inputs: bool
    hidden_size: int
    res: int
    sp: int
    stage: Stage
    grad_share: Fraction
    params: int
    temp: int
    #: the moments that do not depend on the shape
    before: Point
    step: Point
    after: Point
    #: the embedding's gradient, and the part of it summed into a tied LM head's
    dense_grad: int
    tied: int
    #: what compiling the step reads (see :func:`_compile`), and the compiled forms
    recipe: _Recipe = field(repr=False)
    #: the blocks and layers (:func:`_layout`), the model and context they are laid out for
    layout: _Layout = field(repr=False)
    _compiled: list[_Forms] = field(default_factory=list, repr=False)
    _every: dict[bool, _Every] = field(default_factory=dict, repr=False)

    @property
    def blocks(self) -> tuple[tuple[str, bool], ...]:
        """The distinct blocks of the step (kind, input needs a gradient)."""
        return self.layout.blocks

    @property
    def profiles(self) -> tuple[Profile | None, ...]:
        """Each block's profile (``None``: simulated directly at each shape)."""
        return self.layout.profiles

    @property
    def copies(self) -> tuple[Casts, ...]:
        """Each block's autocast copies."""
        return self.layout.copies

    @property
    def unfolded(self) -> tuple[int, ...]:
        """The blocks whose values are evaluated at each shape (no integer profile)."""
        return self.layout.unfolded

    @staticmethod
    def build(
        model: ModelSpec,
        training: TrainingSpec,
        state: ModelState,
        grad_share: Fraction,
        optimizer_share: Fraction,
        gather: Gather,
        stage: Stage,
        grad_buffer: int,
    ) -> StepPlan:
        """The plan of :func:`step_timeline`'s step (only ``training``'s strategy and
        whether a sliding window masks its sequence are read)."""
        ctx = make_ctx(model, training).replaced(batch=1, seq=1)
        copied = "embeddings" in saved_components(training)
        # the embedding's backward runs where its weight trains (a head tied to it
        # trains it too) or PEFT trains a copy of it
        trains_embeddings = stage.first and (trains_embedding(ctx.trainable) or copied)
        kinds, ckpt, head_grad = layers_and_head_grad(model, training, ctx, stage.first)
        chunked = training.loss == "chunked"
        carries = carries_previous(training, stage)
        laid = _layout(
            block_model(model),
            ctx,
            tuple(kinds),
            tuple(ckpt),
            stage.last,
            stage.last and head_grad,
            chunked,
            plays_logits_point(training, stage, chunked),
            conventions(training).checkpointing == "per-op",
            carries or (ctx.quantized and any(ckpt)),
        )
        layers = laid.layers
        params = state.category_bytes("parameters")
        opt = state.category_bytes("optimizer_states")
        temp = int(optimizer_temporaries(model, training, state) * optimizer_share)
        dense_grad = model.vocab_size * model.hidden_size * precision_of(training).master
        tied = dense_grad if model.tie_word_embeddings else 0
        if copied:  # PEFT's copy of the embedding: in its dtype, the head not tied to it
            dense_grad = (
                model.vocab_size
                * model.hidden_size
                * DTYPE_BYTES[conventions(training).frozen_dtype]
            )
            tied = 0
        recipe = _Recipe(
            layers,
            laid.head,
            training.offload.activations == "cpu",
            conventions(training).reentrant,
            carries,
            gather,
            grad_buffer,
            opt,
            trains_embeddings,
            laid.per_op,
            laid.kept_of,
            laid.logits_block,
            laid.returned,
        )
        return StepPlan(
            model=model,
            ctx=ctx,
            chunked=chunked,
            layers=len(layers),
            checkpointed_layers=sum(ckpt),
            offload_inputs=training.offload.activations == "cpu",
            hidden_size=model.hidden_size,
            res=ctx.res,
            sp=ctx.sp,
            stage=stage,
            grad_share=grad_share,
            params=params,
            temp=temp,
            before=Point("before", None, KINDS[0][1], params, grad_buffer, opt, 0),
            step=Point(
                "optimizer",
                None,
                KINDS[10][1],
                params,
                state.category_bytes("gradients"),
                opt + temp,
                0,
            ),
            after=Point("optimizer", None, KINDS[11][1], params, grad_buffer, opt, 0),
            dense_grad=dense_grad,
            tied=tied,
            recipe=recipe,
            layout=laid,
        )

    def forms(self) -> _Forms:
        """The step compiled into linear forms (:func:`_compile`), once."""
        if not self._compiled:
            self._compiled.append(_Forms.of(self))
        return self._compiled[0]

    def every(self, ledger: bool = False) -> _Every:
        """Every point of the step as forms (:class:`_Every`), with the sources of their
        activations where ``ledger`` asks; compiled once each."""
        found = self._every.get(ledger)
        if found is None:
            compiler = _Compiler(self, dtype_of(self), every=True, ledger=ledger)
            _, per_microbatch, waiting, held, _ = compiler.run()
            played = tuple(compiler.played)
            output, kept = compiler.hv[6], compiler.kept_why
            arrays: dict[int, np.ndarray] = {}
            for value in _values_of(played, kept, (per_microbatch, waiting, held, output)):
                arrays.setdefault(id(value), value)
            width = compiler.size
            if arrays:
                matrix = np.stack(list(arrays.values()))
                columns = tuple(int(c) for c in np.abs(matrix).max(axis=0))
            else:
                matrix, columns = np.zeros((0, width), dtype=np.int64), (0,) * width
            fits = all(c < _INT64_SAFE for c in columns)
            found = _Every(
                played,
                per_microbatch,
                waiting,
                held,
                output,
                kept,
                tuple(arrays),
                matrix.astype(np.int64) if fits else matrix,
                columns,
            )
            self._every[ledger] = found
        return found

    @property
    def accumulated(self) -> int:
        """The gradients the optimizer step finds beyond those live through the whole step
        (the buffers): with gradient accumulation, the micro-batches after the first run
        their forward and backward with all of them live (``.grad`` is summed into, not
        freed, until the optimizer step; traced: a step of 2 or 4 micro-batches peaks above
        one of 1)."""
        return self.step.gradients - self.before.gradients

    def points_at(
        self, batch: int, seq: int, explain: bool = False, accumulating: bool = False
    ) -> tuple[tuple[Point, ...], int, int, tuple[tuple[Source, ...], ...]]:
        """Every point of the step at ``batch`` x ``seq`` (the sequence per context rank):
        before it, forward and backward, the optimizer step and after zero_grad; what one
        micro-batch keeps; the model output held through the optimizer step; and with
        ``explain`` each point's activations told apart by source (they add up to its
        activations, to the byte). ``accumulating``: more than one micro-batch a step --
        the forward and backward are the last micro-batch's, with the gradients of the
        earlier ones live (:attr:`accumulated`)."""
        # the compile with the ledger holds the same points: use it where it is made
        every = self._every.get(True) or self.every(explain)
        x = self._values(batch, seq)
        bound = sum(c * abs(v) for c, v in zip(every.columns, x, strict=True))
        if bound < _INT64_SAFE:  # one product in int64, exact
            found = every.matrix @ np.array(x, dtype=np.int64)
        else:
            found = every.matrix.astype(object) @ np.array(x, dtype=object)
        values = dict(zip(every.rows, found.tolist(), strict=True))

        def ev(v: Any) -> int:
            if isinstance(v, _Max):
                return max(ev(f) for f in v.forms)
            if isinstance(v, np.ndarray):
                return int(values[id(v)])
            return int(v)

        num, den = self.grad_share.numerator, self.grad_share.denominator
        waiting = ev(every.waiting)
        held = ev(every.held)
        points = [self.before]
        state = state_of(self)
        for kind, layer, p_of, g_of, grads, a, _ in every.played:
            p, g = p_of.at(state), g_of.at(state)
            phase, label = KINDS[kind]
            if accumulating:
                shared = self.accumulated
            else:
                shared = ev(grads)
                if num != 1 or den != 1:
                    shared = shared * num // den
            at = None if layer < 0 else layer
            points.append(Point(phase, at, label, p, shared + g, self.recipe.opt, ev(a) + waiting))
        points.append(dataclasses.replace(self.step, activations=held))
        points.append(dataclasses.replace(self.after, activations=held))
        sources: list[tuple[Source, ...]] = []
        if explain:
            sources = self._sources(every, ev, waiting, held)
        return tuple(points), ev(every.per_microbatch), held, tuple(sources)

    def _sources(
        self, every: _Every, ev: Callable[[Any], int], waiting: int, held: int
    ) -> list[tuple[Source, ...]]:
        """Each point's sources (:meth:`points_at`), in the order of its points."""
        out: list[tuple[Source, ...]] = [()]  # before the step: no activations
        kept, done = _Kept(), 0
        flight = _in_flight_source(waiting)
        for *_, why in every.played:
            parts: list[Source] = []
            for w in why:
                if isinstance(w, _KeptAt):
                    for entry in w.kept.entries[done : w.upto]:
                        if len(entry) == 1:
                            kept.only(entry[0])
                        else:
                            kept.add(entry[0], ev(entry[1]), entry[2])
                    done = max(done, w.upto)
                    parts += kept.sources()
                else:
                    template, value = w
                    parts.append(dataclasses.replace(template, bytes=ev(value)))
            parts.append(flight)
            out.append(tuple(s for s in parts if s.bytes))
        # the optimizer step and after zero_grad: the model output held, the KV cache with it
        for entry in every.kept.entries[done:]:
            if len(entry) == 1:
                kept.only(entry[0])
            else:
                kept.add(entry[0], ev(entry[1]), entry[2])
        output = [_output_source(ev(every.output)), *kept.sources()]
        out += [tuple(s for s in output if s.bytes)] * 2
        return out

    # -- the shape ----------------------------------------------------------------------

    def terms(self, batch: Any, seq: Any) -> tuple[Any, ...]:
        """The values of :data:`~memfit.engine.graph.TERMS` at ``batch`` x ``seq`` (the sequence
        per context rank), as :meth:`memfit.engine.layers.Ctx.terms` gives them; integers, or
        arrays of one value per shape."""
        ctx = self.ctx
        tokens = batch * seq
        routed = tokens * ctx.topk
        if ctx.ep > 1:
            routed = -(-routed * round(ctx.capacity * 1000) // 1000)
        chunk = (
            np.minimum(tokens, CHUNK_ROWS)
            if isinstance(tokens, np.ndarray)
            else min(tokens, CHUNK_ROWS)
        )
        return (tokens, tokens * seq, batch * (-(-seq // 32) * 32), routed, chunk, 1)

    def offloaded_inputs(self, batch: Any, seq: Any) -> Any:
        """Host bytes of one micro-batch's checkpointed layer inputs under activation
        offload (0 without it), at ``batch`` x ``seq`` (the sequence per context rank):
        integers, or arrays of one value per shape."""
        if not self.offload_inputs:
            return 0
        return self.checkpointed_layers * (batch * seq * self.hidden_size * self.res // self.sp)

    def _block(self, b: int, batch: int, seq: int, terms: tuple[int, ...]) -> tuple[int, ...]:
        """Block ``b`` at ``batch`` x ``seq`` (its :data:`TERMS` ``terms``) as
        :func:`block_result` gives it: from its profile where the profile holds whole
        bytes there, else simulated directly; then the sizes no linear form holds
        (:meth:`_per_shape`)."""
        prof = self.profiles[b]
        r = None
        if prof is not None:
            # not a whole number of bytes here: outside the forms
            with contextlib.suppress(ValueError):
                r = prof.at(terms)
        if r is None:
            kind, x_grad = self.blocks[b]
            ctx = dataclasses.replace(self.ctx, batch=batch, seq=seq)
            r = _direct(self.model, ctx, kind, x_grad, self.chunked)
        return (
            r.kept,
            r.forward_peak,
            r.output,
            r.backward_peak,
            r.input_grad,
            r.param_grads,
            r.held,
            *self._per_shape(b, batch, seq),
        )

    def _per_shape(self, b: int, batch: int, seq: int) -> tuple[int, int, int, int]:
        """What block ``b``'s per-op policy saves, what its custom functions keep and what
        it returns beside its output (all of it, and what it did not save) at ``batch``
        x ``seq``, where no linear form holds them (:attr:`_Layout.per_op` and the rest
        ``None``); 0 where one does (the compile reads the form then)."""
        laid = self.layout
        per_op, kept, returned = laid.per_op[b], laid.kept_of[b], laid.returned[b]
        if per_op is not None and kept is not None and returned is not None:
            return (0, 0, 0, 0)
        kind, x_grad = self.blocks[b]
        ctx = dataclasses.replace(self.ctx, batch=batch, seq=seq)
        every, unsaved = _returned(self.model, ctx, kind, x_grad) if returned is None else (0, 0)
        return (
            concrete(_per_op(self.model, ctx, kind, x_grad)) if per_op is None else 0,
            concrete(_function_kept(self.model, ctx, kind, x_grad, self.chunked))
            if kept is None
            else 0,
            concrete(every),
            concrete(unsaved),
        )

    def _values(self, batch: int, seq: int) -> list[int]:
        """The shape quantities at one shape."""
        terms = self.terms(batch, seq)
        tokens, h, sp = terms[0], self.hidden_size, self.sp
        out = [*terms, tokens * h * self.res // sp, tokens * h // sp]
        for b in self.unfolded:
            out += self._block(b, batch, seq, terms)
        return out

    def _values_many(self, batch: np.ndarray, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The shape quantities at many shapes (one column each, int64), and the shapes
        that need a block of their own evaluated (left as zeros here)."""
        x = np.zeros((_FIRST_BLOCK + _BLOCK * len(self.unfolded), len(batch)), dtype=np.int64)
        for i, term in enumerate(self.terms(batch, seq)):
            x[i] = term
        tokens, h, sp = x[0], self.hidden_size, self.sp
        x[_HIDDEN] = tokens * h * self.res // sp
        x[_DROPOUT] = tokens * h // sp
        return x, np.full(len(batch), bool(self.unfolded))

    # -- the play -----------------------------------------------------------------------

    def _fits(self, x: Sequence[int], extra: int) -> bool:
        """Whether int64 holds every value of a play whose shape quantities are at most
        ``x`` in absolute value, with up to ``extra`` more micro-batches in flight."""
        forms = self.forms()
        rows = sum(map(mul, forms.columns, map(abs, x)))
        share = max(self.grad_share.numerator, self.grad_share.denominator, 1)
        largest = (4 * rows * share + forms.largest_constant) * (extra + 2)
        return forms.fits and largest < _INT64_SAFE

    def _evaluate(self, x: np.ndarray, exact: bool, accumulating: bool) -> tuple[Any, ...]:
        """The candidates' activations, gradients and totals, what a micro-batch keeps,
        the other micro-batches in flight, the logits held, and whether every checked run
        is monotone there, from the shape quantities ``x`` (a column per shape)."""
        forms = self.forms()
        matrix, buffers, constant = forms.matrix, forms.buffers, forms.constant
        if exact:  # in Python integers
            matrix, buffers, constant = (a.astype(object) for a in (matrix, buffers, constant))
        v = matrix @ x
        n = len(forms.kinds)
        num, den = self.grad_share.numerator, self.grad_share.denominator
        g = v[n : 2 * n]
        if accumulating:  # every gradient live: the same at every point
            g = g * 0 + self.accumulated
        elif num != 1 or den != 1:
            g = g * num // den
        if x.ndim > 1:
            buffers, constant = buffers[:, None], constant[:, None]
        g = g + buffers
        total = constant + g + v[:n]
        ok: Any = True
        for k in range(0 if accumulating else forms.checks):
            rise = v[2 * n + 3 + 2 * k] * num
            slope = rise - den * v[2 * n + 4 + 2 * k]
            ok = ok & ((rise % den == 0) | (slope >= den) | (slope <= -den))
        return v[:n], g, total, v[2 * n], v[2 * n + 1], v[2 * n + 2], ok

    def play(
        self,
        batch: int,
        seq: int,
        replay: Callable[[], tuple[Point, ...]],
        explain: Callable[[], tuple[tuple[Source, ...], ...]] | None = None,
        accumulating: bool = False,
    ) -> Timeline:
        """The step at ``batch`` x ``seq`` (the sequence per context rank); ``replay``
        plays its every point when they are asked for, ``explain`` their sources;
        ``accumulating`` as :meth:`points_at`."""
        x = self._values(batch, seq)
        exact = not self._fits(x, 0)  # in Python integers where int64 might overflow
        a, g, total, per_microbatch, waiting, held, ok = self._evaluate(
            np.array(x, dtype=object if exact else np.int64), exact, accumulating
        )
        played: list[tuple[Point, ...]] = []
        if ok:
            forms = self.forms()
            best = int(total.argmax())  # the first of equal highest points
            phase, label = KINDS[forms.kinds[best]]
            layer = forms.layer_of[best]
            top = Point(
                phase,
                None if layer < 0 else layer,
                label,
                forms.fixed_parameters[best],
                int(g[best]),
                forms.fixed_optimizer[best],
                int(a[best]) + int(waiting),
            )
        else:  # a run whose floored gradient share is not monotone: every point
            played.append(replay())
            top = max((p for p in played[0] if p.phase in _PLAYED), key=_total)
        step, after = self.step, self.after
        if held:  # a model output held by the loop lives through the step and zero_grad
            step = dataclasses.replace(step, activations=int(held))
            after = dataclasses.replace(after, activations=int(held))
        moments = (self.before, top, step, after)
        peak = max(moments, key=_total)
        return Timeline(
            peak,
            peak.parameters - self.params,
            int(held),
            self.temp if peak.phase == "optimizer" else 0,
            self.params,
            self.temp,
            int(per_microbatch),
            moments,
            replay,
            played,
            explain,
        )

    def moments(
        self,
        batch: np.ndarray,
        seq: np.ndarray,
        extra: int = 0,
        accumulating: np.ndarray | None = None,
    ) -> Moments | None:
        """The highest point of forward and backward at every shape ``batch[i]`` x
        ``seq[i]`` (integer arrays of one length) at once, as :meth:`play` finds it, with
        room for up to ``extra`` more micro-batches in flight and ``accumulating[i]`` as
        :meth:`points_at`; ``None`` where the values might not fit in int64 (play each
        shape then)."""
        found = joint((self,)).moments(batch, seq, extra, accumulating)
        if found is None:
            return None
        return Moments(*(getattr(found, f.name)[0] for f in dataclasses.fields(Moments)))


#: the total of a candidate that pads a plan's candidates in a :class:`Joint`: never
#: the highest (every real total is at least 0)
_NEVER = -(1 << 61)


@dataclass(frozen=True, slots=True, eq=False)
class Joint:
    """Several step plans (a strategy's pipeline stages) over the same shape quantities,
    evaluated together: their matrices stacked, each plan's candidates padded to the
    same number with candidates that are never the highest."""

    plans: tuple[StepPlan, ...]
    #: per plan: its candidates' activations, gradients before the share, then what a
    #: micro-batch keeps, the other micro-batches in flight, the logits held, and the
    #: pairs of rows of the runs to check; all plans' rows stacked
    matrix: np.ndarray
    candidates: int
    checks: int
    #: per plan and candidate (plan x candidate x 1)
    constant: np.ndarray
    buffers: np.ndarray
    #: per plan and candidate: kind, layer, parameters, optimizer states
    arrays: tuple[np.ndarray, ...]
    #: per plan (plan x 1 x 1): the gradient share, and the gradients live through a
    #: later micro-batch of an accumulating step (:attr:`StepPlan.accumulated`)
    num: np.ndarray
    den: np.ndarray
    accumulated: np.ndarray

    def moments(
        self,
        batch: np.ndarray,
        seq: np.ndarray,
        extra: int = 0,
        accumulating: np.ndarray | None = None,
    ) -> Moments | None:
        """:meth:`StepPlan.moments` of every plan: arrays of plan x shape."""
        first = self.plans[0]
        if not len(batch) or not len(self.matrix):
            return None
        terms = first.terms(int(batch.max()), int(seq.max()))  # each term grows with both
        h, sp = first.hidden_size, first.sp
        largest = [*terms, terms[0] * h * first.res // sp, terms[0] * h // sp]
        if not all(p._fits(largest, extra) for p in self.plans):
            return None
        x, _ = first._values_many(batch.astype(np.int64), seq.astype(np.int64))
        n, c = len(batch), self.candidates
        v = (self.matrix @ x).reshape(len(self.plans), -1, n)
        a = v[:, :c]
        g = v[:, c : 2 * c] * self.num // self.den
        if accumulating is not None and accumulating.any():  # every gradient live
            g = np.where(accumulating[None, None, :], self.accumulated, g)
        g = g + self.buffers
        total = self.constant + g + a
        ok = np.ones((len(self.plans), n), dtype=bool)
        for k in range(self.checks):
            rise = v[:, 2 * c + 3 + 2 * k] * self.num[:, 0]
            slope = rise - self.den[:, 0] * v[:, 2 * c + 4 + 2 * k]
            den = self.den[:, 0]
            ok &= (rise % den == 0) | (slope >= den) | (slope <= -den)
        if accumulating is not None:
            ok |= accumulating[None, :]
        best = total.argmax(axis=1)  # plan x shape: the first of equal highest points
        plan = np.arange(len(self.plans))[:, None]
        col = np.arange(n)[None, :]
        kinds, layers, parameters, optimizer = (x[plan, best] for x in self.arrays)
        return Moments(
            kind=kinds,
            layer=layers,
            parameters=parameters,
            gradients=g[plan, best, col],
            optimizer_states=optimizer,
            activations=a[plan, best, col] + v[:, 2 * c + 1],
            per_microbatch=v[:, 2 * c],
            logits=v[:, 2 * c + 2],
            single=~ok,
        )


def _forms_each(plans: Sequence[StepPlan]) -> list[_Forms]:
    """:meth:`StepPlan.forms` of each of ``plans``: those not compiled yet made together
    (:meth:`_Forms.of_each`)."""
    todo = [p for p in dict.fromkeys(plans) if not p._compiled]
    if len(todo) > 1:
        for plan, forms in zip(todo, _Forms.of_each(todo), strict=True):
            if not plan._compiled:  # another thread's, made meanwhile, stays
                plan._compiled.append(forms)
    return [p.forms() for p in plans]


@memo.cached(maxsize=4096)
def joint(plans: tuple[StepPlan, ...]) -> Joint:
    """The plans of a strategy's stages evaluated together (:class:`Joint`); empty where
    one of them has a block of its own to evaluate at each shape or does not fit int64
    (its moments are then ``None``)."""
    compiled = _forms_each(plans)
    c = max(len(f.kinds) for f in compiled)
    checks = max(f.checks for f in compiled)
    usable = all(f.fits and not p.unfolded for p, f in zip(plans, compiled, strict=True))
    num = np.array([p.grad_share.numerator for p in plans], dtype=np.int64)[:, None, None]
    den = np.array([p.grad_share.denominator for p in plans], dtype=np.int64)[:, None, None]
    accumulated = np.array([p.accumulated for p in plans], dtype=np.int64)[:, None, None]
    if not usable:
        empty = np.zeros(0)
        nothing = np.zeros((0, _FIRST_BLOCK), dtype=np.int64)
        return Joint(plans, nothing, c, checks, empty, empty, (empty,) * 4, num, den, accumulated)
    # every array int64 here (each plan's forms fit)
    rows, constant, buffers = [], [], []
    arrays: list[list[np.ndarray]] = [[], [], [], []]
    for p in compiled:
        k = len(p.kinds)
        m = p.matrix
        width = m.shape[1] if len(m) else _FIRST_BLOCK
        pad = np.zeros((c - k, width), dtype=np.int64)
        act, grads, rest = m[:k], m[k : 2 * k], m[2 * k :]
        more = np.zeros((2 * (checks - p.checks), width), dtype=np.int64)
        rows.append(np.concatenate([act, pad, grads, pad, rest, more]))
        zeros = np.zeros(c - k, dtype=np.int64)
        constant.append(np.concatenate([p.constant, np.full(c - k, _NEVER, dtype=np.int64)]))
        buffers.append(np.concatenate([p.buffers, zeros]))
        for out, values in zip(arrays, p.arrays, strict=True):
            out.append(np.concatenate([values, zeros]))
    return Joint(
        plans=plans,
        matrix=np.concatenate(rows),
        candidates=c,
        checks=checks,
        constant=np.stack(constant)[:, :, None],
        buffers=np.stack(buffers)[:, :, None],
        arrays=tuple(np.stack(x) for x in arrays),
        num=num,
        den=den,
        accumulated=accumulated,
    )


_PLAYED = ("forward", "backward")
