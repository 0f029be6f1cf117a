"""The reference play of one step, point by point (:func:`_layer_by_layer`): what
:attr:`Timeline.points` holds and the compiled plan is held to."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

from memfit.engine.graph import BlockResult, _int
from memfit.engine.model_state import (
    ModelState,
)
from memfit.engine.plan.precision import precision_of
from memfit.engine.specs import ModelSpec, TrainingSpec
from memfit.engine.stacks import conventions
from memfit.engine.timeline.blocks import _function_kept, _per_op, block_result
from memfit.engine.timeline.context import (
    HEAD_LOGITS,
    Gather,
    Stage,
    carries_previous,
    make_ctx,
    optimizer_temporaries,
    plays_logits_point,
    step_layers,
)
from memfit.engine.timeline.points import Point
from memfit.engine.timeline.sources import (
    _PREVIOUS_OUTPUT,
    Source,
    _grad_source,
    _head_source,
    _in_flight_source,
    _input_sources,
    _Kept,
    _output_source,
    _previous_sources,
    _work_source,
)


def _layer_by_layer(
    model: ModelSpec,
    training: TrainingSpec,
    state: ModelState,
    grad_share: Fraction = Fraction(1),
    optimizer_share: Fraction = Fraction(1),
    gather: Gather = Gather(),
    stage: Stage = Stage(),
    grad_buffer: int = 0,
    *,
    ledger: list[tuple[Source, ...]] | None = None,
) -> tuple[tuple[Point, ...], int, int, int, int]:
    """Play one step layer by layer: every point of the timeline -- what
    :attr:`Timeline.points` holds, and the reference :class:`StepPlan` is held to -- what
    one micro-batch keeps at the end of its forward, the logits held, the model state's
    parameters and the optimizer's temporaries (see :func:`step_timeline` for the
    arguments). With a ``ledger``, each point's activations are also told apart by where
    they come from (:class:`Source`), one tuple per point, appended to it: what
    :func:`step_sources` returns."""
    walk = _Walk(model, training, state, grad_share, gather, stage, grad_buffer, ledger)
    walk.forward()
    walk.backward()
    temp = walk.optimizer(optimizer_share)
    return tuple(walk.points), walk.per_microbatch, walk.held, walk.params, temp


class _Walk:
    """One step played layer by layer (:func:`_layer_by_layer`): what the step is made of,
    the points so far, what the layers keep, and what a point adds to what its phase holds
    -- the gathered units and gradient shares of ZeRO-3/FSDP, the other in-flight
    micro-batches, a gradient buffer -- and, with a ledger, where each point's
    activations come from."""

    def __init__(
        self,
        model: ModelSpec,
        training: TrainingSpec,
        state: ModelState,
        grad_share: Fraction,
        gather: Gather,
        stage: Stage,
        grad_buffer: int,
        ledger: list[tuple[Source, ...]] | None,
    ) -> None:
        self.model, self.training, self.state, self.stage = model, training, state, stage
        self.ctx = ctx = make_ctx(model, training)
        self.gather, self.grad_buffer, self.ledger = gather, grad_buffer, ledger
        self.explain = ledger is not None
        self.g_num, self.g_den = grad_share.numerator, grad_share.denominator
        self.params = state.category_bytes("parameters")
        self.opt_states = state.category_bytes("optimizer_states")
        self.points: list[Point] = []
        self.waiting = 0  # activations of the other in-flight micro-batches (after forward)
        self.units_held = 0  # SHARD_GRAD_OP: layers gathered in forward, not yet in backward
        self.reducing = 0  # the reduce-scatter input, once the first layer's grads are reduced
        self.fixed_why: list[Source] = []  # the fixed part of the activations, told apart
        self.kept_why = _Kept()  # what the layers so far keep, by layer kind
        # the hidden-size tensors between blocks: split over tp under sequence parallelism
        self.hidden = ctx.hidden_bytes(model.hidden_size)
        self.kinds, self.ckpt = step_layers(model, training, ctx, stage.first)
        self.chunked = chunked = training.loss == "chunked"
        self.key = key = dataclasses.replace(ctx, batch=1, seq=1)
        self.head, (self.head_copies, self.head_saved) = block_result(
            model, ctx, "head", True, chunked, key
        )
        # inputs: ids and labels (int64), the embedding output and RoPE's cos/sin
        tokens = ctx.tokens
        self.batch_tensors = 2 * 8 * tokens
        self.rope = (
            2 * tokens * model.head_dim * ctx.res if model.position_embedding == "rotary" else 0
        )
        self.mask = ctx.batch * ctx.seq * ctx.seq * ctx.res if ctx.attention == "eager" else 0
        # a sliding window shorter than the sequence needs a boolean (b, 1, s, s) mask, made
        # once per forward and kept by every layer's attention until backward
        self.bool_mask = ctx.batch * ctx.seq * ctx.seq if ctx.masked and not self.mask else 0
        self.layers = [
            block_result(model, ctx, kind, x_grad, chunked, key) for kind, x_grad in self.kinds
        ]
        # what a checkpointed layer keeps: its input (unless offloaded), and under the
        # per-op policy the outputs it saves
        ckpt_input = 0 if training.offload.activations == "cpu" else self.hidden
        per_op = conventions(training).checkpointing == "per-op"
        self.kept_of = [
            ckpt_input + (_int(_per_op(model, ctx, kind, x_grad)) if per_op else 0)
            for kind, x_grad in self.kinds
        ]
        self.graph_kept, self.old_output = self._previous_step()
        self.kept_act = self.copies = self.held = self.per_microbatch = self.cache = 0

    def add(
        self,
        phase: str,
        layer: int | None,
        label: str,
        p: int,
        g: int,
        o: int,
        a: int,
        own: tuple[Source, ...] | bool = (),
    ) -> None:
        gather = self.gather
        if self.ledger is not None:
            own = own if isinstance(own, tuple) else ()
            parts = [*self.fixed_why, *self.kept_why.sources(), *own]
            if phase in ("forward", "backward") and self.waiting:
                parts.append(_in_flight_source(self.waiting))
            self.ledger.append(tuple(s for s in parts if s.bytes))
        if phase in ("forward", "backward"):
            if self.g_den != 1 or self.g_num != 1:
                g = g * self.g_num // self.g_den
            if gather.active:
                # ZeRO-3/FSDP gathers each unit in the compute dtype and frees it after use:
                # the gathered units replace autocast's copies
                forward = phase == "forward"
                held = gather.forward if forward else gather.backward
                p = self.params + self.units_held + held
                g += 0 if forward else gather.grads + self.reducing
            a += self.waiting
        if phase != "optimizer":
            g += self.grad_buffer
        self.points.append(Point(phase, layer, label, p, g, o, a))

    def _previous_step(self) -> tuple[int, int]:
        """The previous step, where the loop's variables keep it: its graph until this
        step's loss is computed -- only what custom functions keep on their ctx costs memory
        (the inputs of bitsandbytes' 4-bit matmuls) -- and its model output until this
        forward returns (the LM head's point counts only the graph: the loss comes after)."""
        if not carries_previous(self.training, self.stage):
            return 0, 0
        model, ctx, chunked = self.model, self.ctx, self.chunked
        pairs = zip(self.kinds, self.ckpt, strict=True)
        graph_kept = sum(
            _int(_function_kept(model, ctx, kind, x_grad, chunked))
            for (kind, x_grad), on in pairs
            if not on
        ) + _int(_function_kept(model, ctx, "head", True, chunked))
        old_output = self.head.held + sum(
            res.held for (res, _), on in zip(self.layers, self.ckpt, strict=True) if not on
        )
        return graph_kept, old_output

    def forward(self) -> None:
        """The points of the forward: the embedding, each layer, the LM head and the loss
        (or the send to the next stage); then autocast's cache cleared."""
        model, training, ctx, stage = self.model, self.training, self.ctx, self.stage
        params, opt_states, explain, add = self.params, self.opt_states, self.explain, self.add
        kinds, ckpt, layers, kept_of = self.kinds, self.ckpt, self.layers, self.kept_of
        tokens, h, embed_out = ctx.tokens, model.hidden_size, self.hidden
        head, head_copies, head_saved = self.head, self.head_copies, self.head_saved
        add("before", None, "weights and optimizer states", params, 0, opt_states, 0)
        base_act = self.batch_tensors + self.rope + self.bool_mask
        if explain:
            self.fixed_why[:] = _input_sources(
                self.batch_tensors, self.rope, self.bool_mask, self.mask
            )
            self.fixed_why += _previous_sources(self.graph_kept, self.old_output)
        # the level of a layer's peak is the fixed tensors, what earlier layers kept, and
        # the layer's own peak (its input, the previous output, included)
        fixed = base_act + self.mask + self.graph_kept + self.old_output
        kept_act = 0
        if stage.first:
            # the embedding's own saved tensors: BERT's LayerNorm input and statistics, and
            # the dropout mask (1 byte per element) of GPT-2 and BERT
            kept_act = (embed_out + 8 * tokens) * model.embedding_norm
            kept_act += tokens * h // ctx.sp if model.hidden_dropout > 0 else 0
            own = explain and (_work_source("embedding", embed_out, None),)
            add("forward", None, "embedding", params, 0, opt_states, fixed + embed_out, own)
        if explain:
            self.kept_why.add("embedding", kept_act, 0)
        copies = 0
        for i, (res, (c, _)) in enumerate(layers):
            own = explain and (_work_source("forward", res.forward_peak - c, i),)
            peak = fixed + kept_act + res.forward_peak - c
            add("forward", i, "layer", params + copies + c, 0, opt_states, peak, own)
            # checkpointing keeps only the layer's input; autocast's cache keeps the copies
            # (counted with the parameters), what the layer saved the rest of what it kept;
            # what the layer hands to the model output (the KV cache) stays with it
            kept_act += kept_of[i] if ckpt[i] else res.kept - c + res.held
            if explain and ckpt[i]:
                self.kept_why.add("checkpointed", kept_of[i], 1)
            elif explain:
                self.kept_why.add(kinds[i][0], res.kept - c, 1)
                self.kept_why.add("kv-cache", res.held, 1 if res.held else 0)
            copies += c
            self.units_held += self.gather.unit
        if not stage.last:  # the output goes to the next stage; its gradient comes back
            head = BlockResult(0, embed_out, 0, 2 * embed_out, embed_out, 0, 0)
            head_copies = head_saved = 0
        if plays_logits_point(training, stage, self.chunked):
            logits, (logit_copies, _) = block_result(
                model, ctx, HEAD_LOGITS, True, self.chunked, self.key
            )
            peak = logits.forward_peak - logit_copies
            own = explain and (_head_source("logits", peak, self.chunked),)
            p = params + copies + logit_copies
            add("forward", None, "LM head", p, 0, opt_states, fixed + kept_act + peak, own)
        if explain:  # the previous step's model output is gone once this forward returns
            self.fixed_why[:] = [s for s in self.fixed_why if s.name != _PREVIOUS_OUTPUT]
        peak = head.forward_peak - head_copies
        add(
            "forward",
            None,
            "LM head and loss" if stage.last else "send to the next stage",
            params + copies + head_copies,
            0,
            opt_states,
            fixed - self.old_output + kept_act + peak,
            explain and (_head_source("forward", peak, self.chunked, stage.last),),
        )
        copies += head_copies
        # 1F1B: while this micro-batch runs, the stage still keeps what the earlier
        # in-flight micro-batches saved, plus a receive buffer for the next input from the
        # previous stage
        recv = 0 if stage.first else embed_out
        self.per_microbatch = kept_act + head.held
        self._in_flight((stage.inflight - 1) * self.per_microbatch + recv)
        # the cache is cleared when autocast exits, at the end of forward: the copies of
        # checkpointed layers go (they are made again in the recomputation), and of the
        # others those that backward did not save
        copies -= head_copies - head_saved
        copies -= sum(
            c if on else c - saved for (_, (c, saved)), on in zip(layers, ckpt, strict=True)
        )
        self.head, self.head_copies, self.head_saved = head, head_copies, head_saved
        self.kept_act, self.copies, self.held = kept_act, copies, head.held

    def _in_flight(self, waiting: int) -> None:
        """Raise every forward point by the other in-flight micro-batches' ``waiting``
        bytes (and count them in every later point)."""
        self.waiting = waiting
        if not waiting:
            return
        points = self.points
        points[:] = [
            dataclasses.replace(p, activations=p.activations + waiting)
            if p.phase == "forward"
            else p
            for p in points
        ]
        if self.ledger is not None:
            self.ledger[:] = [
                (*parts, _in_flight_source(waiting)) if p.phase == "forward" else parts
                for p, parts in zip(points, self.ledger, strict=True)
            ]

    def backward(self) -> None:
        """The points of the backward: the loss and LM head, each layer from the last (its
        recomputation first where it is checkpointed), the embedding where it trains."""
        model, training, stage = self.model, self.training, self.stage
        params, opt_states, explain, add = self.params, self.opt_states, self.explain, self.add
        head, head_saved, held = self.head, self.head_saved, self.held
        kinds, ckpt, layers, kept_of = self.kinds, self.ckpt, self.layers, self.kept_of
        kept_act, copies = self.kept_act, self.copies
        grads = 0
        fixed = self.batch_tensors + self.rope + self.bool_mask + held  # the eager mask died
        if explain:
            self.fixed_why[:] = [
                *_input_sources(self.batch_tensors, self.rope, self.bool_mask, 0),
                _output_source(held),
            ]
        peak = head.backward_peak - head_saved
        add(
            "backward",
            None,
            "loss and LM head" if stage.last else "gradient from the next stage",
            params + copies,
            grads,
            opt_states,
            fixed + kept_act + peak,
            explain and (_head_source("backward", peak, self.chunked, stage.last),),
        )
        grads += head.param_grads
        copies -= head_saved
        grad_in = head.input_grad
        for i in range(model.num_layers - 1, -1, -1):
            res, (c, saved) = layers[i]
            work = explain and (_work_source("backward", res.backward_peak - saved, i),)
            if ckpt[i]:
                kept_act -= kept_of[i]
                if explain:
                    self.kept_why.add("checkpointed", -kept_of[i], -1)
                redo = res.forward_peak - c
                own = explain and (_grad_source(grad_in, i), _work_source("recompute", redo, i))
                p = params + copies + c
                peak = fixed + kept_act + grad_in + redo
                add("backward", i, "recompute", p, grads, opt_states, peak, own)
                # the recomputation's autocast region closes: the copies it saved stay
                peak = fixed + kept_act + res.backward_peak - saved
                add("backward", i, "layer", params + copies + saved, grads, opt_states, peak, work)
            else:
                kept_act -= res.kept - c
                if explain:
                    self.kept_why.add(kinds[i][0], -(res.kept - c), -1)
                peak = fixed + kept_act + res.backward_peak - saved
                add("backward", i, "layer", params + copies, grads, opt_states, peak, work)
                copies -= saved
            grads += res.param_grads
            grad_in = res.input_grad
            self.units_held -= self.gather.unit
            self.reducing = self.gather.reduce
        # what is left of the layers' activations is what they handed to the model output
        self.cache = sum(res.held for (res, _), on in zip(layers, ckpt, strict=True) if not on)
        if explain:  # the embedding's saved tensors went with its backward; the cache stays
            self.kept_why.only("kv-cache")
        trains_embeddings = stage.first and (
            training.method == "full"
            or (training.method == "freeze" and "embeddings" in training.freeze.trainable)
        )
        if trains_embeddings:
            dense_grad = model.vocab_size * model.hidden_size * precision_of(training).master
            tied = dense_grad if model.tie_word_embeddings else 0  # summed into the head's
            own = explain and (
                _grad_source(grad_in, None),
                _work_source("tied gradient", tied, None),
            )
            a = fixed + self.cache + grad_in + tied
            add(
                "backward", None, "embedding", params, grads + dense_grad - tied, opt_states, a, own
            )

    def optimizer(self, optimizer_share: Fraction) -> int:
        """The points of the optimizer step and after ``zero_grad``; returns the
        optimizer's temporaries."""
        model, training, state = self.model, self.training, self.state
        # the step's gradients are what model_state counts; backward may differ by rounding
        grads = state.category_bytes("gradients")
        temp = int(optimizer_temporaries(model, training, state) * optimizer_share)
        # a model output held by the loop lives through the optimizer step and zero_grad
        if self.explain:
            self.fixed_why[:] = [_output_source(self.held)]
        self.held += self.cache
        params, opt_states, held = self.params, self.opt_states, self.held
        self.add("optimizer", None, "optimizer step", params, grads, opt_states + temp, held)
        self.add("optimizer", None, "after zero_grad", params, self.grad_buffer, opt_states, held)
        return temp


def step_sources(*args: Any) -> tuple[tuple[Source, ...], ...]:
    """Each point's activations (:func:`_layer_by_layer`, same arguments) told apart by
    where they come from: the sources of a point add up to its activations, to the byte."""
    ledger: list[tuple[Source, ...]] = []
    _layer_by_layer(*args, ledger=ledger)
    return tuple(ledger)


def _points(*args: Any) -> tuple[Point, ...]:
    """Every point of the step (:func:`_layer_by_layer`)."""
    points: tuple[Point, ...] = _layer_by_layer(*args)[0]
    return points
