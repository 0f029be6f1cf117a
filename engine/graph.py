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
leaves behind. These are the terms the step timeline (:mod:`memfit.engine.timeline`) repeats
layer by layer. Liveness is what PyTorch's caching allocator sees as *allocated* bytes.

A block is either built at one concrete shape and played with :func:`simulate`, or built
once with symbolic sizes -- each a :class:`Lin`, an exact linear form in the shape
:data:`TERMS` (b s, b s^2, ...) -- and played with :func:`profile` into a :class:`Profile`
that gives the same result at every shape. Which tensors are live when does not depend on
the shape, only their sizes do, so the walk is the same; a peak is the largest of a few
linear forms, kept as candidates and compared once the shape is known.

>>> b = Block("toy", input_bytes=400)
>>> b.op("linear", ["x"], [("y", 800)], saves=["x"], grads=["x"], weight_grad=64)
>>> r = simulate(b, "y")
>>> (r.kept, r.forward_peak, r.param_grads)
(400, 1200, 64)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from math import gcd
from operator import add, mul, sub
from typing import Any, cast

from memfit.engine import memo

#: The shape terms every tensor size of a block is linear in (see :class:`Lin`):
#: ``tokens`` b s (per-token tensors); ``pairs`` b s^2 (attention scores and masks);
#: ``padded`` b ceil32(s) (memory-efficient attention's padded log-sum-exp);
#: ``routed`` the rows the busiest expert-parallel rank receives, ceil(b s k c);
#: ``chunk`` the rows of a chunked loss, min(b s, chunk); ``one`` (weight-sized tensors).
TERMS = ("tokens", "pairs", "padded", "routed", "chunk", "one")
_ONE = len(TERMS) - 1

Coef = int | Fraction
#: the ops of the blocks that are collectives (tensor, sequence, context and expert
#: parallelism): priced by the rings, never fused nor recomputed
COLLECTIVES = frozenset({"all_gather", "reduce_scatter", "all_to_all", "ring_recv"})


class Lin:
    """A byte count that is a linear form in the shape :data:`TERMS`, with exact rational
    coefficients: the size of a tensor built for any batch and sequence length at once.

    A block built with symbolic sizes (``Ctx(symbolic=True)``) is played once by the same
    liveness walk as a concrete one; what it returns -- the bytes kept, every candidate
    for the peak -- are linear forms, and evaluating them at a shape gives to the byte what
    :func:`simulate` of the block built at that shape gives, wherever each tensor's size
    really is its linear form (the one thing that is not linear in b and s, ``floor``, only
    divides by a tensor-parallel size that the mesh makes divide the sequence).

    >>> t = Lin.unit("tokens")
    >>> size = 3 * t * 4 + 64
    >>> size.evaluate((10, 0, 0, 0, 0, 1))
    184
    """

    __slots__ = ("c",)

    def __init__(self, c: tuple[Coef, ...]) -> None:
        self.c = c

    @staticmethod
    def unit(term: str) -> Lin:
        i = TERMS.index(term)
        return Lin(tuple(int(j == i) for j in range(len(TERMS))))

    def __add__(self, other: Size) -> Lin:
        c = self.c
        if isinstance(other, Lin):
            return Lin(tuple(map(add, c, other.c)))
        return Lin((*c[:_ONE], c[_ONE] + other))  # a constant: the last term, ``one``

    __radd__ = __add__

    def __sub__(self, other: Size) -> Lin:
        c = self.c
        if isinstance(other, Lin):
            return Lin(tuple(map(sub, c, other.c)))
        return Lin((*c[:_ONE], c[_ONE] - other))

    def __rsub__(self, other: Size) -> Lin:
        return Lin(tuple(map(sub, _coefs(other), self.c)))

    def __mul__(self, k: int) -> Lin:
        if not isinstance(k, int):
            raise TypeError("a size times a size is not a size")
        return Lin(tuple(a * k for a in self.c))

    __rmul__ = __mul__

    def __floordiv__(self, k: int) -> Lin:
        """Exact division; the concrete ``//`` agrees wherever the division is exact."""
        return Lin(tuple(a // k if a % k == 0 else Fraction(a, k) for a in self.c))

    def __bool__(self) -> bool:
        return any(self.c)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int | Lin):
            return self.c == _coefs(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.c)

    def __repr__(self) -> str:
        parts = [f"{a}*{t}" for a, t in zip(self.c, TERMS, strict=True) if a]
        return "Lin(" + " + ".join(parts or ["0"]) + ")"

    def evaluate(self, values: tuple[int, ...]) -> int:
        total = sum(a * v for a, v in zip(self.c, values, strict=True))
        if type(total) is Fraction:  # not isinstance: Fraction is an ABC, slow to test
            if total.denominator != 1:
                raise ValueError(f"{self!r} is not a whole number of bytes at {values}")
            return total.numerator
        return cast(int, total)


Size = int | Lin


def _coefs(size: Size) -> tuple[Coef, ...]:
    """The coefficients of ``size`` over :data:`TERMS` (a plain integer is a constant)."""
    if isinstance(size, Lin):
        return size.c
    return tuple(size if i == _ONE else 0 for i in range(len(TERMS)))


def larger(a: Size, b: Size) -> Size:
    """The larger of two sizes; for symbolic sizes, the one that is at least the other in
    every term (a broadcast's operands: the full tensor and, say, a row statistic)."""
    if not isinstance(a, Lin) and not isinstance(b, Lin):
        return max(a, b)
    ca, cb = _coefs(a), _coefs(b)
    if all(x >= y for x, y in zip(ca, cb, strict=True)):
        return a
    if all(y >= x for x, y in zip(ca, cb, strict=True)):
        return b
    raise TypeError(f"neither of {a!r} and {b!r} is always the larger")


@dataclass(frozen=True, slots=True)
class Op:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, Size], ...]
    saves: tuple[str, ...]
    grads: tuple[str, ...]
    weight_grad: Size
    transient_backward: Size
    #: a matrix product: (rows in all, in features, out features, weights) -- ``weights``
    #: matrices of ``in x out`` sharing the rows evenly (grouped experts); the step time
    #: prices it as GEMMs (:mod:`memfit.engine.steptime`)
    gemm: tuple[Size, int, int, int] | None = None
    #: a weight the op reads needs a gradient (its backward computes one)
    trains: bool = False
    #: bytes of the gradients of its outputs its backward reads (0: autograd does not
    #: record the op)
    out_grad: Size = 0
    #: bytes its forward reads of its inputs where it does not read them whole (the loss's
    #: ``nll_loss`` reads one log-probability a row); ``None``: every input, whole
    reads: Size | None = None
    #: tensors the op's statement keeps alive beyond what it reads (a Python variable
    #: that a statement reassigns only once it has run: ``x = softmax(x, dtype=...)``
    #: holds the old ``x`` through the softmax): neither read nor differentiated, only
    #: live until the op has run
    holds: tuple[str, ...] = ()


@dataclass(slots=True)
class Block:
    """The ops of one module in forward order; ``"x"`` is the input, ``input_bytes`` its size."""

    name: str
    input_bytes: Size
    ops: list[Op] = field(default_factory=list)
    sizes: dict[str, Size] = field(default_factory=dict)
    #: tensors that stay alive until the whole backward is over (the returned logits)
    held: set[str] = field(default_factory=set)
    #: autocast's cast copies of weights, which its cache holds while the autocast region
    #: is open (leaf weights that require grad): never freed in forward; at the end of it
    #: the region closes, and only the copies that an op saved for backward stay
    cached: set[str] = field(default_factory=set)
    #: tensors a custom autograd function keeps as an attribute of its ``ctx`` instead of
    #: ``save_for_backward`` (bitsandbytes' 4-bit matmul keeps its input): backward does
    #: not release them; they live as long as the graph does
    kept_by_functions: set[str] = field(default_factory=set)
    #: tensors the module returns beside its output, which the caller's variables keep
    #: until the next block returns (Falcon's attention weights: its model loop holds a
    #: layer's outputs tuple until the next layer's replaces it)
    returned: set[str] = field(default_factory=set)
    #: the ops of the attention core, ``ops[start:end]`` (eager attention's scores,
    #: mask, softmax and products; one fused kernel otherwise)
    core: tuple[int, int] = (0, 0)
    #: ops that run once per chunk of rows, ``ops[start:end]``, where the block holds one
    #: chunk live (a fused linear cross-entropy): ``ceil(tokens / chunk)`` times a step
    repeated: tuple[int, int] = (0, 0)
    #: the first op of the loss, ``ops[loss_from:]``: what runs after the model returns
    #: its output (a loss compiled on its own, :func:`memfit.engine.inductor.partition`)
    loss_from: int = 0
    #: views -> the tensor whose storage they share (a split of a fused projection): a view
    #: allocates nothing, reading it reads its base, and saving it keeps its base
    views: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sizes["x"] = self.input_bytes

    def moved(self, op: Op) -> tuple[Size, Size]:
        """The bytes ``op`` moves: forward each input read (or what it reads of them,
        :attr:`Op.reads`) and each output written (a
        tensor only produced, a dequantized weight, counted as written); backward its
        outputs' gradients and what it saved read, its inputs' gradients written (nothing
        where autograd does not record it). What an element-wise op costs in time; linear
        forms of the shape in a block built with symbolic sizes."""
        fwd: Size = sum((self.sizes[t] for t in op.inputs), 0) if op.reads is None else op.reads
        fwd += sum((b for _, b in op.outputs), 0)
        if not op.out_grad:
            return fwd, 0
        bwd = op.out_grad + sum((self.sizes[t] for t in op.saves), 0)
        return fwd, bwd + sum((self.sizes[t] for t in op.grads), 0)

    @property
    def weight_copies(self) -> int:
        """Bytes of the autocast copies the block makes: held through the forward."""
        return sum(concrete(self.sizes[t]) for t in self.cached)

    @property
    def saved_copies(self) -> int:
        """Bytes of the autocast copies an op of the block saves for backward: held from
        the end of the forward until the block's backward (a matmul saves its weight only
        when its input needs a gradient)."""
        saved = {t for op in self.ops for t in op.saves}
        return sum(concrete(self.sizes[t]) for t in self.cached & saved)

    def op(
        self,
        name: str,
        inputs: list[str],
        outputs: list[tuple[str, Size]],
        saves: list[str] | tuple[str, ...] = (),
        grads: list[str] | tuple[str, ...] = (),
        weight_grad: Size = 0,
        transient_backward: Size = 0,
        gemm: tuple[Size, int, int, int] | None = None,
        trains: bool = False,
        out_grad: Size = 0,
        reads: Size | None = None,
        holds: list[str] | tuple[str, ...] = (),
    ) -> None:
        """Append an op. ``grads`` are the inputs that receive a gradient in backward;
        ``weight_grad`` the bytes of parameter gradient it accumulates into ``.grad``;
        ``transient_backward`` workspace its backward needs beyond the input gradients;
        ``gemm``, ``trains`` and ``out_grad`` what the step time prices (:class:`Op`)."""
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
                gemm,
                trains,
                out_grad,
                reads,
                tuple(holds),
            )
        )


def connected(ops: list[Op], members: list[int]) -> list[list[int]]:
    """The ops ``members`` (indices, in order) split into the groups that a tensor one of
    them makes and another reads joins: each group in order, the groups by their first op.
    What ``torch.compile`` fuses into one kernel (:mod:`memfit.engine.inductor`, the step
    time's pricing of it)."""
    parent = {i: i for i in members}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    made = {t: i for i in members for t, _ in ops[i].outputs}
    for i in members:
        for t in ops[i].inputs:
            if t in made:
                parent[root(i)] = root(made[t])
    groups: dict[int, list[int]] = {}
    for i in members:
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values())


@dataclass(frozen=True, slots=True)
class BlockResult:
    #: bytes of tensors alive after forward, apart from the output (input included if
    #: saved; autocast's cached copies included, saved or not)
    kept: int
    #: the highest live bytes during forward, the input counted (it is live at the start)
    forward_peak: int
    #: bytes of the output
    output: int
    #: the highest live bytes during backward, counted from ``kept`` + the output gradient
    #: less the cached copies no op saved (gone with the autocast region)
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
    views = block.views
    # what each tensor allocates: a view nothing (its base holds the storage)
    alloc = {t: zero if t in views else s for t, s in size.items()} if views else size
    saves_of = [[views.get(t, t) for t in op.saves] for op in ops] if views else None
    saved: set[str] = set()
    last_save: dict[str, int] = {}  # earliest op (forward order) that saved it
    last_read: dict[str, int] = {}
    for i, op in enumerate(ops):
        for t in (*op.inputs, *op.holds):
            last_read[t] = i
            if t in views:  # reading a view reads its base
                last_read[views[t]] = i
        for t in saves_of[i] if saves_of else op.saves:
            saved.add(t)
            last_save.setdefault(t, i)

    # forward
    live = {"x"}
    level = size["x"]
    fwd = [level]
    for i, op in enumerate(ops):
        for t, _ in op.outputs:
            live.add(t)
            level = level + alloc[t]
        fwd.append(level)
        bases = [views[t] for t in op.inputs if t in views] if views else []
        for t in [*op.inputs, *op.holds, *bases, *(t for t, _ in op.outputs)]:
            keep = t in saved or t == output or t in block.held or t in block.cached
            if t in live and not keep and last_read.get(t, -1) <= i:
                live.discard(t)
                level = level - alloc[t]
    kept = level - alloc[output]
    # the autocast region closes before backward: its cache lets go of the copies that no
    # op saved
    for t in sorted(block.cached - saved):
        if t in live:
            live.discard(t)
            level = level - alloc[t]

    # backward: start from the kept tensors plus the gradient of the output
    grad_of = {output: size[output]}
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
        for t in saves_of[i] if saves_of else op.saves:
            if last_save.get(t) == i and t in live:
                live.discard(t)
                level = level - size[t]
    held = zero
    for t in block.held:
        held = held + alloc[t]
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
    """Play ``block`` (built at a concrete shape) forward and backward; ``output`` is the
    tensor handed on."""
    w_grad: list[Size] = [op.weight_grad for op in block.ops]
    extra: list[Size] = [op.transient_backward for op in block.ops]
    kept, fwd, out, bwd, g_in, grads, held = _play(
        block, output, input_grad, block.sizes, w_grad, extra, 0
    )
    k, o, g, p, h = (concrete(v) for v in (kept, out, g_in, grads, held))
    return BlockResult(k, max(map(concrete, fwd)), o, max(map(concrete, bwd)), g, p, h)


def concrete(value: Size) -> int:
    """``value`` as a number of bytes: a block built at a concrete shape (raises
    ``TypeError`` on a symbolic size)."""
    if isinstance(value, Lin):
        raise TypeError("a symbolic size where a concrete one was expected")
    return value


def _vector(value: Size, den: int) -> tuple[int, ...]:
    """``value`` x ``den`` as integer coefficients of :data:`TERMS`."""
    coefs = _coefs(value)
    out = []
    for a in coefs:
        scaled = a * den
        if type(scaled) is Fraction:
            if scaled.denominator != 1:
                raise ValueError("the common denominator does not clear a coefficient")
            scaled = scaled.numerator
        out.append(int(scaled))
    return tuple(out)


def _denominator(values: list[Size]) -> int:
    den = 1
    for v in values:
        if isinstance(v, Lin):
            for a in v.c:
                if type(a) is Fraction:
                    den = den * a.denominator // gcd(den, a.denominator)
    return den


def _frontier(vectors: list[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """The candidates that can be the maximum somewhere: every term is non-negative, so a
    candidate no larger than another in every coefficient never is (a Pareto frontier)."""
    kept: list[tuple[int, ...]] = []
    for v in sorted(set(vectors), key=sum, reverse=True):
        if not any(all(k >= x for k, x in zip(w, v, strict=True)) for w in kept):
            kept.append(v)
    return tuple(kept)


def _dot(v: tuple[int, ...], values: tuple[int, ...]) -> int:
    return sum(map(mul, v, values))


@dataclass(frozen=True, slots=True)
class Profile:
    """A block's results as exact linear forms in :data:`TERMS`: build once, evaluate
    anywhere. Coefficients are integers over the common denominator ``den``; ``forward``
    and ``backward`` hold only the candidates for the peak that can be the maximum."""

    kept: tuple[int, ...]
    output: tuple[int, ...]
    input_grad: tuple[int, ...]
    param_grads: tuple[int, ...]
    held: tuple[int, ...]
    forward: tuple[tuple[int, ...], ...]
    backward: tuple[tuple[int, ...], ...]
    den: int = 1
    #: the indices of the :data:`TERMS` the block has (its vectors hold only these)
    terms: tuple[int, ...] = tuple(range(len(TERMS)))

    @property
    def largest(self) -> int:
        """The largest absolute coefficient of its forms."""
        return _largest(self)

    def at(self, values: tuple[int, ...]) -> BlockResult:
        """The block at the shape whose :data:`TERMS` are ``values``
        (:meth:`memfit.engine.layers.Ctx.terms`)."""
        den = self.den
        mine = tuple(values[i] for i in self.terms)

        def val(v: tuple[int, ...]) -> int:
            total = _dot(v, mine)
            if den == 1:
                return total
            if total % den:
                raise ValueError(f"not a whole number of bytes at {values}")
            return total // den

        return BlockResult(
            val(self.kept),
            max(map(val, self.forward)),
            val(self.output),
            max(map(val, self.backward)),
            val(self.input_grad),
            val(self.param_grads),
            val(self.held),
        )


@memo.cached(maxsize=4096)
def _largest(prof: Profile) -> int:
    forms = (prof.kept, prof.output, prof.input_grad, prof.param_grads, prof.held)
    return max(abs(c) for v in (*forms, *prof.forward, *prof.backward) for c in v)


def profile(block: Block, output: str, input_grad: bool = True) -> Profile:
    """Play ``block``, built with symbolic sizes, into a :class:`Profile`."""
    w_grad: list[Size] = [op.weight_grad for op in block.ops]
    extra: list[Size] = [op.transient_backward for op in block.ops]
    kept, fwd, out, bwd, g_in, grads, held = _play(
        block, output, input_grad, block.sizes, w_grad, extra, 0
    )
    singles = [kept, out, g_in, grads, held]
    den = _denominator([*singles, *fwd, *bwd])
    k, o, g, p, h = (_vector(v, den) for v in singles)
    forward = _frontier([_vector(v, den) for v in fwd])
    backward = _frontier([_vector(v, den) for v in bwd])
    every = (k, o, g, p, h, *forward, *backward)
    used = tuple(i for i in range(len(TERMS)) if any(v[i] for v in every))

    def only(v: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(v[i] for i in used)

    return Profile(
        only(k),
        only(o),
        only(g),
        only(p),
        only(h),
        tuple(map(only, forward)),
        tuple(map(only, backward)),
        den,
        used,
    )
