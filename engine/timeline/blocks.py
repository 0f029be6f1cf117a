"""Each block of the step (a layer, the head and loss) built from :mod:`memfit.engine.layers` and
played op by op (:func:`memfit.engine.graph.simulate`), or profiled once with symbolic sizes
(:func:`_profile`): its peaks, what it keeps and hands on, its autocast copies."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from memfit.engine import memo
from memfit.engine.graph import Block, BlockResult, Profile, Size, profile, simulate
from memfit.engine.layers import Ctx, returns_attention_weights
from memfit.engine.specs import ModelSpec
from memfit.engine.timeline.context import HEAD_LOGITS, _build

#: (batch, sequence length / sp) at which every new profile is checked against the block
#: simulated directly: odd sizes, so that a size that is not the linear form the profile
#: holds cannot agree by accident
HELD_OUT = (3, 37)


class Casts(NamedTuple):
    """Bytes of a block's autocast weight copies (the same at every shape): ``made`` --
    every copy, held by autocast's cache from the moment it is made to the end of the
    forward; ``saved`` -- those an op saved for backward, held on from the end of the
    forward until the block's backward. A layer whose input needs no gradient saves
    none of the copies its first projections read."""

    made: int
    saved: int


def _casts(block: Block) -> Casts:
    return Casts(block.weight_copies, block.saved_copies)


@memo.cached(maxsize=512)
def block_model(model: ModelSpec) -> ModelSpec:
    """``model`` as one block of it reads it, to key what is built per block: a block's
    ops read the model's widths and kinds of layer, never how many layers the model (or
    a pipeline stage of it) holds nor how many of them are dense (a block is told its
    kind). Every stage of a model, and the model whole, shares its blocks' profiles
    (tested over every preset)."""
    if model.num_layers == 1 and not model.first_dense_layers:
        return model
    return dataclasses.replace(model, num_layers=1, first_dense_layers=0)


@memo.cached(maxsize=16384)
def _profile(
    model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool, chunked: bool
) -> tuple[Profile | None, Casts]:
    """A block for every batch and sequence length: built once with symbolic sizes
    (:func:`memfit.engine.graph.profile`), checked against a direct simulation at
    :data:`HELD_OUT`, and the bytes of the autocast weight copies it makes and saves.
    ``None`` when the block's sizes are not linear forms of the shape terms: every shape
    of it is then simulated directly (:func:`_direct`)."""
    b, s = HELD_OUT
    held_out = dataclasses.replace(ctx, batch=b, seq=s * ctx.sp)
    try:
        block, out = _build(model, dataclasses.replace(ctx, symbolic=True), kind, x_grad, chunked)
        prof = profile(block, out, x_grad)
        if prof.at(held_out.terms()) == _direct(model, held_out, kind, x_grad, chunked):
            return prof, _casts(block)
    except (TypeError, ValueError):  # a size that no linear form of the terms holds
        pass
    return None, _casts(_build(model, held_out, kind, x_grad, chunked)[0])


@memo.cached(maxsize=4096)
def _direct(model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool, chunked: bool) -> BlockResult:
    """The block built at ``ctx``'s own batch and sequence length, and simulated."""
    return simulate(*_build(model, ctx, kind, x_grad, chunked), x_grad)


@memo.cached(maxsize=4096)
def layer_block(model: ModelSpec, ctx: Ctx, moe: bool) -> Block:
    """The ops of one layer (dense, or with its experts) at ``ctx``'s own shape, its input
    needing a gradient: the block the memory walk plays for a layer, as the step time
    prices it (:mod:`memfit.engine.steptime`)."""
    return _build(model, ctx, "moe" if moe else "layer", True, False)[0]


@memo.cached(maxsize=4096)
def head_block(model: ModelSpec, ctx: Ctx) -> Block:
    """The final norm, the LM head and the loss at ``ctx``'s own shape (a fused loss, where
    ``ctx.loss`` is ``chunked``, holds one chunk of rows): the block the memory walk plays
    last, as the step time prices it."""
    return _build(model, ctx, "head", True, ctx.loss == "chunked")[0]


def block_result(
    model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool, chunked: bool, key: Ctx | None = None
) -> tuple[BlockResult, Casts]:
    """One block of the step at ``ctx``'s shape, from its profile where the profile holds,
    else simulated directly; and the bytes of its autocast weight copies. ``key`` is
    ``ctx`` without its shape (the profile's cache key), when the caller has it."""
    key = key or dataclasses.replace(ctx, batch=1, seq=1)
    prof, copies = _profile(model, key, kind, x_grad, chunked)
    if prof is not None:
        try:
            return prof.at(ctx.terms()), copies
        except ValueError:  # not a whole number of bytes here: outside the exact domain
            pass
    return _direct(model, ctx, kind, x_grad, chunked), copies


#: the op names of :mod:`memfit.engine.layers` that are ``aten.mm`` in PyTorch, and those of the
#: attention kernels, for torchtitan's per-op policy
_MM_OPS = ("mm", "lora_A", "lora_B")


def per_op_saved(block: Block) -> Size:
    """Bytes torchtitan's per-op selective checkpointing keeps of a layer beyond its input
    (``selective_ac_option = "op"``): the outputs of the attention kernel and of every
    odd-numbered ``mm`` of the layer (the 1st, 3rd, ...); everything else is recomputed
    in backward, where the kept outputs are used as they are."""
    total: Size = 0
    count = 0
    for op in block.ops:
        if op.name in _MM_OPS:
            count += 1
            if count % 2:
                total = total + sum((size for _, size in op.outputs), start=0)
        elif op.name.startswith("sdpa_"):
            total = total + sum((size for _, size in op.outputs), start=0)
    return total


@memo.cached(maxsize=4096)
def _per_op(model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool) -> Size:
    """:func:`per_op_saved` of a layer kind, at ``ctx``'s shape or symbolic."""
    return per_op_saved(_build(model, ctx, kind, x_grad, False)[0])


@memo.cached(maxsize=4096)
def _returned(model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool) -> tuple[Size, Size]:
    """What a layer kind returns beside its output (:attr:`~memfit.engine.graph.Block.returned`,
    Falcon's attention weights), at ``ctx``'s shape or symbolic: its bytes, and those of
    it no op saved -- alive through the next layer's forward where that layer keeps
    nothing of its own (checkpointed: all of it; recorded: only what it did not save)."""
    if not returns_attention_weights(model, ctx):
        return 0, 0
    block = _build(model, ctx, kind, x_grad, False)[0]
    saved = {t for op in block.ops for t in op.saves}
    returned = sorted(block.returned)
    return (
        sum((block.sizes[t] for t in returned), start=0),
        sum((block.sizes[t] for t in returned if t not in saved), start=0),
    )


def function_kept(block: Block) -> Size:
    """Bytes of the tensors custom autograd functions of ``block`` keep on their ``ctx``
    (:attr:`~memfit.engine.graph.Block.kept_by_functions`): they live as long as the graph."""
    return sum((block.sizes[t] for t in sorted(block.kept_by_functions)), start=0)


@memo.cached(maxsize=4096)
def _function_kept(model: ModelSpec, ctx: Ctx, kind: str, x_grad: bool, chunked: bool) -> Size:
    """:func:`function_kept` of a block kind, at ``ctx``'s shape or symbolic. Of the LM
    head only a 4-bit head keeps anything: its input, the final norm's output, whatever
    the loss (a head run in pieces views it; that head is built at concrete shapes only,
    so it is read from the unchunked one)."""
    if kind == HEAD_LOGITS:  # the head's own block counts it
        return 0
    if kind == "head":
        if not (ctx.quantized and ctx.quantized_head):
            return 0
        ctx = dataclasses.replace(ctx, loss="standard")
    return function_kept(_build(model, ctx, kind, x_grad, chunked)[0])
