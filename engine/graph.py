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


def simulate(block: Block, output: str, input_grad: bool = True) -> BlockResult:
    """Play ``block`` forward and backward; ``output`` is the tensor handed on."""
    ops, size = block.ops, block.sizes
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
    level = peak = size["x"]
    for i, op in enumerate(ops):
        for t, nbytes in op.outputs:
            live.add(t)
            level += nbytes
        peak = max(peak, level)
        for t in [*op.inputs, *(t for t, _ in op.outputs)]:
            keep = t in saved or t == output or t in block.held
            if t in live and not keep and last_read.get(t, -1) <= i:
                live.discard(t)
                level -= size[t]
    kept = level - size[output]

    # backward: start from the kept tensors plus the gradient of the output
    grad_of = {output: size[output]}
    level = kept + size[output]
    back_peak = level
    param_grads = 0
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        extra = op.transient_backward
        new = 0
        for t in op.grads:
            if t == "x" and not input_grad:
                continue
            if t in grad_of:
                extra = max(extra, size[t])  # summing into the existing gradient
            else:
                grad_of[t] = size[t]
                new += size[t]
        level += new + op.weight_grad
        param_grads += op.weight_grad
        back_peak = max(back_peak, level + extra)
        for t, _ in op.outputs:
            level -= grad_of.pop(t, 0)
        for t in op.saves:
            if last_save.get(t) == i and t in live:
                live.discard(t)
                level -= size[t]
    held = sum(size[t] for t in block.held)
    return BlockResult(
        kept - held, peak, size[output], back_peak - held, grad_of.get("x", 0), param_grads, held
    )
