"""A small autograd-liveness simulator: which tensors one block allocates, keeps and frees.

A block (a decoder layer, the LM head and loss, ...) is written as the sequence of ops its
PyTorch module runs, each op naming the tensors it reads, the tensors it creates (with
their bytes) and the tensors autograd *saves* for its backward. :func:`simulate` then plays
the forward and the backward the way autograd does:

* forward -- an op's outputs are allocated; a tensor is freed after its last reader unless
  an op saved it (or it is the block's output); saved tensors live until their backward;
* backward -- ops run in reverse; each allocates gradients for its differentiable inputs
  (a second consumer's gradient is summed into the first, briefly needing a second buffer),
  the parameter gradient it produces (kept: ``.grad``) and any transient workspace; the
  gradient of an op's outputs and the tensors only it saved are freed once it has run.

The result is per block: the bytes it keeps after forward, the highest point reached above
its starting level in forward and in backward, and the bytes of parameter gradients it
leaves behind. These are the terms the step timeline (:mod:`engine.timeline`) repeats
layer by layer. Liveness is what PyTorch's caching allocator sees as *allocated* bytes.

>>> b = Block("toy", input_bytes=400)
>>> b.op("linear", ["x"], [("y", 800)], saves=["x"], grads=["x"], weight_grad=64)
>>> r = simulate(b, "y")
>>> (r.kept, r.forward_peak, r.param_grads)
(400, 1200, 64)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Op:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, int], ...]
    saves: tuple[str, ...]
    grads: tuple[str, ...]
    weight_grad: int
    transient_backward: int


@dataclass(slots=True)
class Block:
    """The ops of one module in forward order; ``"x"`` is the input, ``input_bytes`` its size."""

    name: str
    input_bytes: int
    ops: list[Op] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    #: tensors that stay alive until the whole backward is over (the returned logits)
    held: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.sizes["x"] = self.input_bytes

    def op(
        self,
        name: str,
        inputs: list[str],
        outputs: list[tuple[str, int]],
        saves: list[str] | tuple[str, ...] = (),
        grads: list[str] | tuple[str, ...] = (),
        weight_grad: int = 0,
        transient_backward: int = 0,
    ) -> None:
        """Append an op. ``grads`` are the inputs that receive a gradient in backward;
        ``weight_grad`` the bytes of parameter gradient it accumulates into ``.grad``;
        ``transient_backward`` workspace its backward needs beyond the input gradients."""
        for tensor, nbytes in outputs:
            self.sizes[tensor] = nbytes
        self.ops.append(
            Op(
                name,
                tuple(inputs),
                tuple(outputs),
                tuple(saves),
                tuple(grads),
                weight_grad,
                transient_backward,
            )
        )


@dataclass(frozen=True, slots=True)
class BlockResult:
    #: bytes of tensors alive after forward, apart from the output (input included if saved)
    kept: int
    #: the highest live bytes during forward, the input counted (it is live at the start)
    forward_peak: int
    #: bytes of the output
    output: int
    #: the highest live bytes during backward, counted from ``kept`` + the output gradient
    backward_peak: int
    #: bytes of the input gradient left at the end of backward
    input_grad: int
    #: parameter gradients produced (they stay, as ``.grad``)
    param_grads: int
    #: bytes of ``held`` tensors, freed only after the whole backward
    held: int = 0


def _play(
    block: Block, output: str, input_grad: bool, size: Any, w_grad: Any, extra_of: Any, zero: Any
) -> tuple[Any, list[Any], Any, list[Any], Any, Any, Any]:
    """The liveness walk; every possible peak is returned as a candidate, so that it works
    on plain byte counts and on vectors of byte counts alike (see :func:`profile`)."""
    ops = block.ops
    saved: set[str] = set()
    last_save: dict[str, int] = {}  # earliest op (forward order) that saved it
    last_read: dict[str, int] = {}
    for i, op in enumerate(ops):
        for t in op.inputs:
            last_read[t] = i
        for t in op.saves:
            saved.add(t)
            last_save.setdefault(t, i)

    # forward
    live = {"x"}
    level = size["x"]
    fwd = [level]
    for i, op in enumerate(ops):
        for t, _ in op.outputs:
            live.add(t)
            level = level + size[t]
        fwd.append(level)
        for t in [*op.inputs, *(t for t, _ in op.outputs)]:
            keep = t in saved or t == output or t in block.held
            if t in live and not keep and last_read.get(t, -1) <= i:
                live.discard(t)
                level = level - size[t]
    kept = level - size[output]

    # backward: start from the kept tensors plus the gradient of the output
    grad_of = {output: size[output]}
    level = kept + size[output]
    bwd = [level]
    param_grads = zero
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        extras = [extra_of[i]]
        for t in op.grads:
            if t == "x" and not input_grad:
                continue
            if t in grad_of:
                extras.append(size[t])  # summing into the existing gradient
            else:
                grad_of[t] = size[t]
                level = level + size[t]
        level = level + w_grad[i]
        param_grads = param_grads + w_grad[i]
        bwd.extend(level + e for e in extras)
        for t, _ in op.outputs:
            if t in grad_of:
                level = level - grad_of.pop(t)
        for t in op.saves:
            if last_save.get(t) == i and t in live:
                live.discard(t)
                level = level - size[t]
    held = zero
    for t in block.held:
        held = held + size[t]
    return (
        kept - held,
        fwd,
        size[output],
        [b - held for b in bwd],
        grad_of.get("x", zero),
        param_grads,
        held,
    )


def simulate(block: Block, output: str, input_grad: bool = True) -> BlockResult:
    """Play ``block`` forward and backward; ``output`` is the tensor handed on."""
    w_grad = [op.weight_grad for op in block.ops]
    extra = [op.transient_backward for op in block.ops]
    kept, fwd, out, bwd, g_in, grads, held = _play(
        block, output, input_grad, block.sizes, w_grad, extra, 0
    )
    return BlockResult(kept, max(fwd), out, max(bwd), g_in, grads, held)


def basis(batch: int, seq: int) -> tuple[int, int, int, int]:
    """What every tensor size is linear in: b s (per token), b s^2 (attention scores),
    b ceil32(s) (memory-efficient attention's padded log-sum-exp), and 1 (weights)."""
    return (batch * seq, batch * seq * seq, batch * (-(-seq // 32) * 32), 1)


#: (batch, seq) points at which a block is built to find its size coefficients; their
#: basis vectors are linearly independent
SAMPLES = ((1, 40), (1, 64), (2, 100), (3, 7))


@dataclass(frozen=True, slots=True)
class Profile:
    """A block's results as linear functions of :func:`basis`: build once, evaluate fast."""

    kept: np.ndarray
    output: np.ndarray
    input_grad: np.ndarray
    param_grads: np.ndarray
    held: np.ndarray
    forward: np.ndarray  # candidates x 4
    backward: np.ndarray

    def at(self, batch: int, seq: int) -> BlockResult:
        v = np.array(basis(batch, seq), dtype=np.float64)

        def val(a: np.ndarray) -> int:
            return round(float(a @ v))

        return BlockResult(
            val(self.kept),
            round(float((self.forward @ v).max())),
            val(self.output),
            round(float((self.backward @ v).max())),
            val(self.input_grad),
            val(self.param_grads),
            val(self.held),
        )


def profile(builds: list[tuple[Block, str]], input_grad: bool = True) -> Profile:
    """Combine the same block built at each of :data:`SAMPLES` into a :class:`Profile`."""
    first, output = builds[0]
    names = list(first.sizes)
    for block, out in builds[1:]:
        if out != output or list(block.sizes) != names or len(block.ops) != len(first.ops):
            raise ValueError(f"{first.name}: the block's ops depend on the shape")
    samples = np.array([[float(b.sizes[n]) for b, _ in builds] for n in names])
    size = dict(zip(names, samples, strict=True))
    w_grad = [
        np.array([float(b.ops[i].weight_grad) for b, _ in builds]) for i in range(len(first.ops))
    ]
    extra = [
        np.array([float(b.ops[i].transient_backward) for b, _ in builds])
        for i in range(len(first.ops))
    ]
    kept, fwd, out, bwd, g_in, grads, held = _play(
        first, output, input_grad, size, w_grad, extra, np.zeros(4)
    )
    # sample values -> coefficients of the basis: solve A c = samples for every vector
    inverse_t = np.linalg.inv(np.array([basis(b, s) for b, s in SAMPLES], dtype=np.float64)).T

    def coef(a: Any) -> np.ndarray:
        return np.asarray(a, dtype=np.float64) @ inverse_t

    return Profile(
        coef(kept),
        coef(out),
        coef(g_in),
        coef(grads),
        coef(held),
        coef(np.array(fwd)),
        coef(np.array(bwd)),
    )
