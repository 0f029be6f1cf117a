"""What torch.compile keeps for backward (:mod:`memfit.engine.inductor`): the partitioner's
rules on small blocks, and what they do to whole estimates."""

from __future__ import annotations

import dataclasses
import random

import pytest

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.graph import Block, simulate
from memfit.engine.inductor import _Flow, kept_set, partition
from memfit.engine.presets import load_gpu, load_model, model_names
from memfit.engine.scenario_io import scenario_from_dict, scenario_to_dict
from memfit.engine.specs import HardwareSpec, Scenario, TrainingSpec
from memfit.engine.stacks import conventions
from memfit.engine.timeline.context import _build, make_ctx


def scenario(model: str, **training: object) -> Scenario:
    return Scenario(
        load_model(model),
        HardwareSpec(load_gpu("h100-sxm-80gb")),
        TrainingSpec(**training),  # type: ignore[arg-type]
    )


def with_training(s: Scenario, **fields: object) -> Scenario:
    return dataclasses.replace(s, training=dataclasses.replace(s.training, **fields))  # type: ignore[arg-type]


def _norm_then_matmul() -> Block:
    """A bf16 input upcast to fp32, a row statistic, the normalized fp32 product cast
    back, and a matmul that reads it: eager keeps the fp32 copy (6 bytes an element with
    the matmul's input); the partitioner keeps the bf16 input, the statistic and the
    matmul's input."""
    b = Block("norm", input_bytes=200)
    b.op("to", ["x"], [("xf", 400)], grads=["x"])
    b.op("mean", ["xf"], [("var", 4)], saves=["xf"], grads=["xf"])
    b.op("rsqrt", ["var"], [("rs", 4)], saves=["rs"], grads=["var"])
    b.op("mul", ["xf", "rs"], [("hn", 400)], saves=["xf", "rs"], grads=["xf", "rs"])
    b.op("to", ["hn"], [("hc", 200)], grads=["hn"])
    b.op("mm", ["hc"], [("y", 200)], saves=["hc"], grads=["hc"], weight_grad=8, gemm=(1, 1, 1, 1))
    return b


def test_the_cut_keeps_the_cheaper_tensors_from_which_the_rest_recomputes() -> None:
    block = _norm_then_matmul()
    # the statistic is a reduction (4x smaller than what it reads): never recomputed;
    # the matmul's input is read by a non-fusible backward op: kept as it is; the fp32
    # upcast is recomputed from the bf16 input
    assert kept_set(block, "y", int) == {"x", "hc", "var"}
    eager = simulate(block, "y")
    compiled = simulate(partition(block, "y"), "y")
    assert eager.kept == 400 + 4 + 200  # xf, rs, hc
    assert compiled.kept == 200 + 4 + 200  # x, var, hc
    # the fused group writes only what leaves it: no fp32 product in the forward
    assert compiled.forward_peak < eager.forward_peak
    assert compiled.param_grads == eager.param_grads


def test_repeated_casts_of_one_tensor_are_one_in_the_compiled_graph() -> None:
    """Autocast casts a linear's input at every call (q, k and v: three copies); the
    traced graph merges the identical casts into one."""
    b = Block("qkv", input_bytes=400)
    for i in range(3):
        b.op("to", ["x"], [(f"c{i}", 200)], grads=["x"])
        b.op("mm", [f"c{i}"], [(f"y{i}", 200)], saves=[f"c{i}"], grads=[f"c{i}"], gemm=(1, 1, 1, 1))
    b.op("add", ["y0", "y1"], [("s", 200)], grads=["y0", "y1"])
    b.op("add", ["s", "y2"], [("out", 200)], grads=["s", "y2"])
    assert simulate(b, "out").kept == 3 * 200
    assert simulate(partition(b, "out"), "out").kept == 200


def test_ops_before_the_region_run_eager_as_they_are() -> None:
    """A region from ``start`` on: the ops before it (a model's eager head) keep what
    they keep, and what they made is the region's input."""
    block = _norm_then_matmul()
    compiled = partition(block, "y", start=5)  # only the matmul compiled
    assert [op.saves for op in compiled.ops] == [op.saves for op in block.ops]
    assert simulate(compiled, "y") == simulate(block, "y")


def test_a_compiled_layer_keeps_less_and_fits_more_for_every_family() -> None:
    """Every preset's layer, compiled, keeps no more than eager; Llama's much less (its
    fp32 norm copies, SiLU's output and the residual stream are recomputed)."""
    for name in model_names():
        model = load_model(name)
        eager_ctx = make_ctx(model, TrainingSpec(micro_batch_size=2, sequence_length=1024))
        ctx = dataclasses.replace(eager_ctx, compiled="layers")
        kind = "moe" if model.is_moe else "dense"
        eager = simulate(*_build(model, eager_ctx, kind, True, False))
        compiled = simulate(*_build(model, ctx, kind, True, False))
        assert compiled.kept <= eager.kept, name
        assert compiled.param_grads == eager.param_grads, name
    llama = load_model("llama-3-8b")
    ctx = make_ctx(llama, TrainingSpec(precision="bf16", micro_batch_size=1, sequence_length=1))
    ctx = dataclasses.replace(ctx, batch=1, seq=1)
    eager = simulate(*_build(llama, ctx, "dense", True, False)).kept
    compiled = simulate(*_build(llama, dataclasses.replace(ctx, compiled="layers"),
                                "dense", True, False)).kept  # fmt: skip
    assert compiled < 0.8 * eager


def test_the_scope_decides_whether_the_head_and_loss_are_compiled() -> None:
    """The whole model compiled keeps neither fp32 copy of the logits; compiled layer by
    layer the head runs eager, and a compiled loss keeps the 16-bit logits and their
    log-sum-exp instead of the fp32 log-probabilities."""
    s = scenario("llama-3-8b", precision="bf16", micro_batch_size=1, sequence_length=2048)

    def head(scope: str | None, compiled: bool = True) -> int:
        t = dataclasses.replace(s.training, torch_compile=compiled, torch_compile_scope=scope)
        return simulate(*_build(s.model, make_ctx(s.model, t), "head", True, False)).backward_peak

    eager = head(None, compiled=False)
    assert head("layers") == eager
    assert head("model") < head("layers+loss") < eager


def test_torch_compile_lowers_the_estimate_and_the_stack_sets_its_scope() -> None:
    s = scenario("llama-3-8b", precision="bf16", micro_batch_size=2, sequence_length=4096)
    compiled = with_training(s, torch_compile=True)
    assert estimate(compiled).allocated_bytes < 0.9 * estimate(s).allocated_bytes
    for stack, scope in (("torchtune", "layers+loss"), ("torchtitan", "layers+loss"),
                         ("hf-trainer", "model"), ("custom", "model")):  # fmt: skip
        assert conventions(dataclasses.replace(compiled.training, stack=stack)).compile_scope == (
            scope
        )
    mine = with_training(compiled, stack="torchtune", torch_compile_scope="layers")
    assert conventions(mine.training).compile_scope == "layers"
    data = scenario_to_dict(mine)
    assert data["training"]["torch_compile_scope"] == "layers"
    assert scenario_from_dict(data) == mine
    # a file written before the field loads, with the stack's scope
    del data["training"]["torch_compile_scope"]
    assert scenario_from_dict(data).training.torch_compile_scope is None


def test_an_unknown_scope_is_refused_by_name() -> None:
    with pytest.raises(EstimateError, match=r"training\.torch_compile_scope"):
        TrainingSpec(torch_compile=True, torch_compile_scope="everything")


def test_a_view_allocates_nothing_and_keeps_its_base_where_it_is_read_or_saved() -> None:
    """A split of a fused projection: the views cost no bytes, the projection lives until
    its last view is read, and an op saving a view keeps the whole projection."""
    from memfit.engine.graph import profile

    def block(save_view: bool) -> Block:
        b = Block("fused", input_bytes=100)
        b.op("mm", ["x"], [("qkv", 300)], saves=["x"], grads=["x"], gemm=(1, 1, 1, 1))
        for name in ("q", "k", "v"):
            b.op("split_" + name, ["qkv"], [(name, 100)], grads=["qkv"], out_grad=100)
            b.views[name] = "qkv"
        b.op("attn", ["q", "k", "v"], [("o", 100)], saves=["q"] if save_view else [],
             grads=["q", "k", "v"])  # fmt: skip
        return b

    saving, reading = simulate(block(True), "o"), simulate(block(False), "o")
    # forward peak: the input, the projection, the output -- no bytes for the views
    assert saving.forward_peak == reading.forward_peak == 100 + 300 + 100
    assert saving.kept == 100 + 300  # the input, and the whole projection for its view
    assert reading.kept == 100
    symbolic = profile(block(True), "o")
    assert symbolic.at((1, 1, 1, 1, 1, 1)) == saving


def test_global_layers_among_sliding_ones_run_unmasked() -> None:
    """Gemma-3's every sixth layer attends over the whole sequence: past the window its
    SDPA runs causal with no mask to convert and keep, where the five sliding layers keep
    a 16-bit bias of the scores' size each (traced: Gemma-3-1B, six layers at 4,096
    tokens, within 0.1 %); the step time prices their attention over every key."""
    from memfit.engine.specs import full_attention
    from memfit.engine.steptime import step_time
    from memfit.engine.timeline.context import layer_kinds

    gemma = load_model("gemma-3-1b")
    assert [full_attention(gemma, i) for i in range(12)] == [False] * 5 + [True] + [False] * 5 + [
        True
    ]
    s = scenario("gemma-3-1b", precision="bf16", micro_batch_size=1, sequence_length=4096)
    kinds = [k for k, _ in layer_kinds(s.model, s.training, make_ctx(s.model, s.training), True)]
    assert kinds.count("dense+full") == gemma.num_layers // 6
    ctx = make_ctx(s.model, s.training)
    ctx = dataclasses.replace(ctx, batch=1, seq=4096)
    sliding = simulate(*_build(gemma, ctx, "dense", True, False)).kept
    full = simulate(*_build(gemma, ctx, "dense+full", True, False)).kept
    assert sliding - full == 2 * 4096 * 4096  # the bias, one a layer
    # inside the window every layer is unmasked, and alike
    short = with_training(s, sequence_length=256)
    assert "dense+full" not in [
        k
        for k, _ in layer_kinds(
            short.model, short.training, make_ctx(short.model, short.training), True
        )
    ]
    every = dataclasses.replace(s, model=dataclasses.replace(gemma, full_attention_every=0))
    assert step_time(s).step_time_s > step_time(every).step_time_s


def test_a_model_that_returns_fp32_logits_hands_its_compiled_loss_the_copy() -> None:
    """torchtune's decoder returns ``self.output(h).float()``: the fp32 copy is its output,
    made eager, and the loss compiled on its own keeps it; where the loss makes the copy
    (transformers', torchtitan's), the compiled loss recomputes it from the 16-bit logits."""
    s = scenario(
        "llama-3.2-3b", precision="bf16", micro_batch_size=1, sequence_length=2048,
        torch_compile=True, loss="standard",
    )  # fmt: skip

    def head(stack: str) -> tuple[int, str]:
        t = dataclasses.replace(s.training, stack=stack)
        block, loss = _build(s.model, make_ctx(s.model, t), "head", True, False)
        return simulate(block, loss).backward_peak, conventions(t).logits_upcast

    tune, tune_upcast = head("torchtune")
    titan, titan_upcast = head("torchtitan")
    assert (tune_upcast, titan_upcast) == ("model", "loss")
    vocab, tokens = s.model.vocab_size, 2048
    # the kept fp32 copy, against the 16-bit logits the other loss recomputes it from
    assert tune - titan >= 2 * tokens * vocab


def _shortest_paths_side(cap: dict[str, dict[str, float]], s: str, t: str) -> set[str]:
    """The source side of a minimum cut by shortest augmenting paths (Edmonds-Karp), one
    search a path: what the partitioner's cut was solved with before, kept as the oracle."""
    cap = {a: dict(b) for a, b in cap.items()}
    cap.setdefault(s, {})
    cap.setdefault(t, {})
    while True:
        parent = {s: s}
        queue = [s]
        while queue and t not in parent:
            a = queue.pop(0)
            for b, c in cap[a].items():
                if c > 0 and b not in parent:
                    parent[b] = a
                    queue.append(b)
        if t not in parent:
            return set(parent)
        push, b = float("inf"), t
        while b != s:
            push = min(push, cap[parent[b]][b])
            b = parent[b]
        b = t
        while b != s:
            cap[parent[b]][b] -= push
            cap[b][parent[b]] += push
            b = parent[b]


def test_the_cut_is_the_smallest_source_side_whatever_finds_the_flow() -> None:
    """Every maximum flow leaves the source the same nodes to reach: the cut found by
    blocking flows (Dinic) is the one shortest augmenting paths found, on random graphs
    with the partitioner's kinds of capacity (bytes, doubled bytes, unbounded)."""
    rng = random.Random(20261205)
    unbounded = cut = 0
    for _ in range(400):
        n = rng.randrange(2, 14)
        flow = _Flow()
        nodes = ["source", "sink", *(f"n{i}" for i in range(n))]
        for _ in range(rng.randrange(1, 4 * n)):
            a, b = rng.sample(nodes, 2)
            if a == "sink" or b == "source":
                continue
            c = rng.choice([float("inf"), rng.randrange(1, 50), 2 * rng.randrange(1, 50)])
            if not (a == "source" and b == "sink"):
                flow.edge(a, b, c)
        graph = {a: dict(b) for a, b in flow.cap.items()}
        try:
            side = flow.source_side("source", "sink")
        except ValueError:  # a path that nothing bounds
            assert "sink" in _reach_unbounded(graph, "source")
            unbounded += 1
            continue
        assert side == _shortest_paths_side(graph, "source", "sink")
        assert "sink" not in side
        cut += len(side) > 1  # the source reaches something: a cut inside the graph
    assert unbounded > 10 and cut > 100  # both kinds of graph drawn


def _reach_unbounded(cap: dict[str, dict[str, float]], s: str) -> set[str]:
    seen, todo = {s}, [s]
    while todo:
        a = todo.pop()
        for b, c in cap.get(a, {}).items():
            if c == float("inf") and b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


def test_a_graph_with_no_bounded_cut_is_refused() -> None:
    flow = _Flow()
    flow.edge("source", "a", float("inf"))
    flow.edge("a", "sink", float("inf"))
    with pytest.raises(ValueError, match="nothing bounds the cut"):
        flow.source_side("source", "sink")
