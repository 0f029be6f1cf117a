"""What ``torch.compile`` makes of a block's memory: inductor fuses the element-wise ops
between the matrix products and the attention kernels into kernels that write only what
leaves them, and AOTAutograd's min-cut partitioner chooses what the forward keeps for the
backward -- the cheapest set of tensors from which the backward can recompute every
element-wise value it needs.

The rules, from PyTorch 2.13's ``torch/_functorch/partitioners.py``
(``min_cut_rematerialization_partition``, ``solve_min_cut``) with inductor's defaults
(``torch/_functorch/config.py``):

* a tensor the backward needs is either kept or recomputed in the backward from kept
  ones; keeping a tensor costs its bytes (twice its bytes where every reader in the
  forward fuses with it, so that keeping it would materialize it), the parameters are
  free to keep (``treat_parameters_as_free_to_save``);
* matrix products, the attention kernels, collectives and every op not on the
  partitioner's list of recomputable ops (``ban_recompute_not_in_allowlist``) are never
  recomputed, nor are random ops (dropout's mask) nor the block's input;
* a reduction whose output is under a quarter of its input is never recomputed
  (``ban_recompute_reductions``: a norm keeps its per-row statistic);
* a tensor a non-fusible op of the backward reads is never recomputed
  (``ban_recompute_materialized_backward``): a matrix product's input, which its weight
  gradient reads, is kept as it is.

The cut is solved on the block's own tensors (:func:`partition`); each run of
consecutive element-wise ops then becomes one op per connected group, which reads what
comes from outside, writes what leaves it (read outside, kept, or handed on), and keeps
what the cut assigns it. There is no autocast cache in a compiled graph: a weight's
16-bit copy lives until its last reader, and on only where the backward needs it.

>>> b = Block("toy", input_bytes=100)
>>> b.op("mm", ["x"], [("h", 100)], saves=["x"], grads=["x"], weight_grad=8, gemm=(1, 1, 1, 1))
>>> b.op("silu", ["h"], [("a", 100)], saves=["h"], grads=["h"])
>>> b.op("scale", ["a"], [("y", 100)], saves=["a"], grads=["a"])
>>> compiled = partition(b, "y")
>>> [op.name for op in compiled.ops], sorted(t for op in compiled.ops for t in op.saves)
(['mm', 'fused'], ['h', 'x'])
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from itertools import pairwise

from memfit.engine.graph import COLLECTIVES, Block, Op, Size, connected

#: ops of :mod:`memfit.engine.layers` that do not fuse with element-wise work (compute
#: intensive, collectives, custom kernels -- a fused linear cross-entropy's chunk among
#: them --, ops outside the partitioner's recomputable list) besides every matrix product
#: (``Op.gemm``) and attention kernel (``sdpa_*``)
OPAQUE = COLLECTIVES | frozenset(
    {"matmul_qk", "matmul_pv",
     "dequantize", "dequantize_backward", "release_logits", "te_norm", "fused_swiglu",
     "fused_rope", "fused_softmax", "topk", "index_add", "index_copy", "cat",
     "chunk_loss"}
)  # fmt: skip
#: random ops: fusible, never recomputed
RANDOM = frozenset({"dropout"})

_INF = float("inf")


def fuses(op: Op) -> bool:
    """``op`` is element-wise work inductor fuses (and the partitioner may recompute)."""
    return op.gemm is None and not op.name.startswith("sdpa_") and op.name not in OPAQUE


class _Flow:
    """A maximum flow on a small graph of named nodes, and the source's side of the
    minimum cut it leaves (:meth:`source_side`)."""

    def __init__(self) -> None:
        self.cap: dict[str, dict[str, float]] = {}

    def edge(self, a: str, b: str, c: float) -> None:
        self.cap.setdefault(a, {})
        self.cap.setdefault(b, {})
        self.cap[a][b] = self.cap[a].get(b, 0) + c
        self.cap[b].setdefault(a, 0)

    def source_side(self, s: str, t: str) -> set[str]:
        """The nodes on the source's side of a minimum cut: those the source still
        reaches once the flow is maximum. Every maximum flow leaves the same ones (the
        smallest source side of any minimum cut), so the algorithm that finds the flow
        does not change them. Dinic's (1970): each round labels every node with its
        distance from the source over edges with capacity left, then pushes flow along
        shortest paths until none is left (one search a round, not one a path: a
        mixture-of-experts layer's graph of 128 experts took 0.1 s a cut by shortest
        augmenting paths, Edmonds-Karp)."""
        cap = self.cap
        cap.setdefault(s, {})
        cap.setdefault(t, {})
        while True:
            level = {s: 0}
            queue = deque([s])
            while queue:
                a = queue.popleft()
                for b, c in cap[a].items():
                    if c > 0 and b not in level:
                        level[b] = level[a] + 1
                        queue.append(b)
            if t not in level:
                return set(level)
            self._block(s, t, level)

    def _block(self, s: str, t: str, level: dict[str, int]) -> None:
        """Push flow from ``s`` to ``t`` along paths that go one ``level`` further each
        edge, until every such path has an edge without capacity left."""
        cap = self.cap
        ahead: dict[str, list[str]] = {}  # per node reached: its edges one level on
        tried = dict.fromkeys(level, 0)  # per node: its edges ahead found full or dead
        path = [s]
        while path:
            a = path[-1]
            if a == t:
                steps = list(pairwise(path))
                push = min(cap[x][y] for x, y in steps)
                if push == _INF:
                    raise ValueError("nothing bounds the cut")  # a bug: always cuttable
                for x, y in steps:
                    cap[x][y] -= push
                    cap[y][x] += push
                path = [s]
                continue
            edges = ahead.get(a)
            if edges is None:
                on = level[a] + 1
                edges = ahead[a] = [b for b in cap[a] if level.get(b) == on]
            i = tried[a]
            while i < len(edges) and cap[a][edges[i]] <= 0:
                i += 1
            tried[a] = i
            if i < len(edges):
                path.append(edges[i])
            else:  # a dead end: back one node, past this edge
                path.pop()
                if path:
                    tried[path[-1]] += 1


def kept_set(block: Block, output: str, weigh: Callable[[Size], int], start: int = 0) -> set[str]:
    """The tensors the partitioner keeps for the backward of the compiled region
    ``block.ops[start:]``: a minimum cut between what the forward must compute and what
    the backward needs, each tensor weighed by ``weigh`` of its size (:func:`partition`)."""
    ops = block.ops
    made: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    before = {"x"} | {t for op in ops[:start] for t, _ in op.outputs}
    for i, op in enumerate(ops[start:], start):
        for t in op.inputs:
            readers.setdefault(t, []).append(i)
        for t, _ in op.outputs:
            made[t] = i
    needed = {t for op in ops[start:] for t in op.saves}
    # the region's inputs (the block's, and what an eager part before it made): forward
    # inputs, never recomputed
    banned = {t for t in readers if t in before}
    for op in ops[start:]:
        outs = [t for t, _ in op.outputs]
        if not fuses(op) or op.name in RANDOM:
            banned.update(outs)
        elif op.inputs:
            # a reduction whose output is under a quarter of what it reads
            read = sum(weigh(block.sizes[t]) for t in op.inputs)
            if any(4 * weigh(block.sizes[t]) < read for t in outs):
                banned.update(outs)
        if not fuses(op):
            banned.update(op.saves)  # read by a non-fusible op of the backward
    flow = _Flow()
    for t, size in block.sizes.items():
        if t not in made and t not in banned:
            continue
        fused_readers = all(fuses(ops[i]) for i in readers.get(t, []))
        materialized = t in before or t == output or t in block.held or not fused_readers
        flow.edge(t + ":in", t + ":out", weigh(size) * (1 if materialized else 2))
        if t in banned:
            flow.edge("source", t + ":in", _INF)
        if t in needed:
            flow.edge(t + ":out", "sink", _INF)
    for op in ops[start:]:
        for a in op.inputs:
            for o, _ in op.outputs:
                flow.edge(a + ":out", o + ":in", _INF)
    side = flow.source_side("source", "sink")
    return {t for t in block.sizes if t + ":in" in side and t + ":out" not in side}


def partition(
    block: Block, output: str, weigh: Callable[[Size], int] | None = None, start: int = 0
) -> Block:
    """``block`` with ``block.ops[start:]`` as ``torch.compile`` runs them (see the
    module's text; the ops before ``start`` run eager, as they are): the region's
    element-wise runs fused, the tensors :func:`kept_set` chooses kept, each by the op
    whose backward comes last among those that read it (the first of them in the
    forward), no autocast cache in the region. ``weigh`` turns a size into bytes to
    compare (a symbolic block's sizes are weighed at one shape); by default sizes are
    bytes already."""
    weigh = weigh or _as_int
    block = _deduplicated(block, start)
    ops = block.ops
    kept = kept_set(block, output, weigh, start)
    made = {t: i for i, op in enumerate(ops[start:], start) for t, _ in op.outputs}

    def frontier(t: str, seen: set[str]) -> set[str]:
        """The kept tensors ``t`` is recomputed from (itself, where kept)."""
        if t in kept:
            return {t}
        if t in seen or t not in made:
            return set()
        seen.add(t)
        return set().union(*(frontier(a, seen) for a in ops[made[t]].inputs))

    first_need: dict[str, int] = {}
    for i, op in enumerate(ops[start:], start):
        for t in op.saves:
            for k in frontier(t, set()):
                first_need.setdefault(k, i)

    groups = [[i] for i in range(start)] + _runs(ops, start)
    group_of = {i: g for g, members in enumerate(groups) for i in members}
    readers: dict[str, set[int]] = {}
    for i, op in enumerate(ops):
        for t in op.inputs:
            readers.setdefault(t, set()).add(group_of[i])
    keeps: dict[int, list[str]] = {}
    for t in sorted(first_need, key=lambda t: (first_need[t], t)):
        keeps.setdefault(group_of[first_need[t]], []).append(t)

    out = Block(block.name, block.input_bytes)
    out.sizes.update(block.sizes)
    out.views = dict(block.views)
    out.held = set(block.held)
    # autocast's cache holds the copies the eager part made
    out.cached = {t for t in block.cached if made.get(t, -1) < start}
    out.kept_by_functions = set(block.kept_by_functions)
    for g, members in enumerate(groups):
        saves = keeps.get(g, [])
        if members[0] < start:
            out.ops.append(ops[members[0]])
            continue
        if len(members) == 1 and not fuses(ops[members[0]]):
            op = ops[members[0]]
            out.ops.append(_with(op, tuple(saves)))
            continue
        mine = set(members)
        inputs: list[str] = []
        outputs: list[tuple[str, Size]] = []
        grads: list[str] = []
        weight_grad: Size = 0
        out_grad: Size = 0
        for i in members:
            op = ops[i]
            for t in op.inputs:
                if made.get(t) not in mine and t not in inputs:
                    inputs.append(t)
                    if any(t in ops[j].grads for j in members):
                        grads.append(t)
            for t, size in op.outputs:
                leaves = readers.get(t, set()) - {g} or t in kept or t == output
                if leaves or t in block.held:
                    outputs.append((t, size))
                    if op.out_grad:
                        out_grad = out_grad + size
            weight_grad = weight_grad + op.weight_grad
        trains = any(ops[i].trains for i in members)
        name = ops[members[0]].name if len(members) == 1 else "fused"
        out.ops.append(
            Op(name, tuple(inputs), tuple(outputs), tuple(saves), tuple(grads), weight_grad, 0,
               None, trains, out_grad)
        )  # fmt: skip
    out.core = _remap(block.core, group_of)
    out.repeated = _remap(block.repeated, group_of)
    return out


def _deduplicated(block: Block, start: int) -> Block:
    """``block`` with each repeated cast of one tensor to one dtype in ``ops[start:]`` made
    once: the traced graph merges identical ops (autocast casts a linear's input in every
    call -- q, k and v each their own copy, eager -- and the compiled graph once)."""
    first: dict[tuple[str, tuple[str, ...], tuple[Size, ...]], tuple[str, ...]] = {}
    alias: dict[str, str] = {}
    ops: list[Op] = []
    dropped: list[Op | None] = []  # each op of ``block``: itself where it is dropped
    for i, op in enumerate(block.ops):
        inputs = tuple(alias.get(t, t) for t in op.inputs)
        outs = tuple(t for t, _ in op.outputs)
        if op.name == "to" and not op.weight_grad and i >= start:
            key = (op.name, inputs, tuple(size for _, size in op.outputs))
            if key in first:
                alias.update(zip(outs, first[key], strict=True))
                dropped.append(op)
                continue
            first[key] = outs
        saves = tuple(dict.fromkeys(alias.get(t, t) for t in op.saves))
        grads = tuple(dict.fromkeys(alias.get(t, t) for t in op.grads))
        dropped.append(None)
        same = (inputs, saves, grads) == (op.inputs, op.saves, op.grads)
        ops.append(op if same else _with(op, saves, inputs, grads))
    if not alias:
        return block
    out = Block(block.name, block.input_bytes, ops, dict(block.sizes))
    out.views = dict(block.views)
    out.held = {alias.get(t, t) for t in block.held}
    out.cached = set(block.cached)
    out.kept_by_functions = {alias.get(t, t) for t in block.kept_by_functions}
    # the spans of ops, counted in the ops kept: ``before[i]`` ops are kept before op i
    before = [0]
    for i, op in enumerate(block.ops):
        before.append(before[-1] + (op is not dropped[i]))
    out.core, out.repeated = ((before[a], before[b]) for a, b in (block.core, block.repeated))
    return out


def _runs(ops: list[Op], start: int) -> list[list[int]]:
    """The ops from ``start`` on in forward order as groups: each non-fusible op alone;
    each run of consecutive fusible ops split into the groups a tensor one makes and
    another reads joins."""
    groups: list[list[int]] = []
    run: list[int] = []

    def close() -> None:
        groups.extend(connected(ops, run))
        run.clear()

    for i, op in enumerate(ops[start:], start):
        if fuses(op):
            run.append(i)
            continue
        close()
        groups.append([i])
    close()
    return groups


def _remap(span: tuple[int, int], group_of: dict[int, int]) -> tuple[int, int]:
    start, end = span
    if end <= start:
        return (0, 0)
    return (group_of[start], group_of[end - 1] + 1)


def _with(
    op: Op,
    saves: tuple[str, ...],
    inputs: tuple[str, ...] | None = None,
    grads: tuple[str, ...] | None = None,
) -> Op:
    """``op`` keeping ``saves`` (reading ``inputs`` and giving ``grads``, where given)."""
    return dataclasses.replace(
        op, saves=saves, inputs=op.inputs if inputs is None else inputs,
        grads=op.grads if grads is None else grads,
    )  # fmt: skip


def _as_int(size: Size) -> int:
    if not isinstance(size, int):
        raise TypeError("a symbolic size needs a shape to be weighed at")
    return size
