"""Block profiles are exact: at every shape, the profile built once with symbolic sizes
gives to the byte what the block built at that shape and simulated directly gives -- for
every block kind, model family, precision, kernel and parallel layout."""

import dataclasses

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from memfit.engine.errors import EstimateError
from memfit.engine.graph import Lin, larger
from memfit.engine.layers import CHUNK_ROWS
from memfit.engine.presets import load_model, model_names
from memfit.engine.sharding import tensor_parallel_shard
from memfit.engine.specs import (
    ATTENTION_KERNELS,
    PRECISIONS,
    LoraSpec,
    ModelSpec,
    ParallelismSpec,
    TrainingSpec,
)
from memfit.engine.timeline import _direct, _profile, block_result, make_ctx
from memfit.engine.timeline.blocks import block_model
from memfit.engine.timeline.context import FULL, HEAD_LOGITS, TRAINED, _build

layouts = st.fixed_dictionaries(
    {
        "tp": st.sampled_from([1, 2, 4, 8]),
        "sp": st.booleans(),
        "cp": st.sampled_from([1, 2, 4]),
        "ep": st.sampled_from([1, 2, 4, 8]),
        "capacity": st.sampled_from([1.0, 1.1, 1.25, 1.333, 2.0]),
    }
)
trainings = st.fixed_dictionaries(
    {
        "method": st.sampled_from(["full", "lora", "qlora", "freeze"]),
        "precision": st.sampled_from(PRECISIONS),
        "attention": st.sampled_from(ATTENTION_KERNELS),
        "activation_checkpointing": st.sampled_from(["none", "selective"]),
        "loss": st.sampled_from(["standard", "chunked"]),
        "torch_compile": st.booleans(),
        "torch_compile_scope": st.sampled_from([None, "model", "layers", "layers+loss"]),
        "lora": st.builds(
            LoraSpec,
            rank=st.sampled_from([1, 8, 64]),
            targets=st.sampled_from([("q_proj", "v_proj"), ("all-linear",)]),
            dropout=st.sampled_from([0.0, 0.1]),
        ),
    }
)


def rank_model_and_training(
    name: str, layout: dict[str, object], fields: dict[str, object], seq: int
) -> tuple[ModelSpec, TrainingSpec] | None:
    """The model one rank holds and the training, or ``None`` where the layout does not
    apply to the model."""
    model = load_model(name)
    tp, ep = int(layout["tp"]), int(layout["ep"])  # type: ignore[call-overload]
    kv = model.num_key_value_heads
    if model.num_attention_heads % tp or (kv % tp and tp % kv):
        return None
    if ep > 1 and not (model.is_moe and model.num_experts % ep == 0):
        return None
    if model.architecture == "encoder" and layout["sp"]:
        return None
    par = ParallelismSpec(
        tp=tp,
        cp=int(layout["cp"]),  # type: ignore[call-overload]
        ep=ep,
        sequence_parallel=bool(layout["sp"]) and tp > 1,
        expert_capacity_factor=float(layout["capacity"]),  # type: ignore[arg-type]
    )
    training = TrainingSpec(sequence_length=seq, parallelism=par, **fields)  # type: ignore[arg-type]
    return tensor_parallel_shard(model, tp, ep), training


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(model_names()),
    layouts,
    trainings,
    st.integers(1, 16),
    st.integers(1, 9000),
)
def test_profile_equals_direct_simulation(
    name: str, layout: dict[str, object], fields: dict[str, object], batch: int, units: int
) -> None:
    tp, cp = int(layout["tp"]), int(layout["cp"])  # type: ignore[call-overload]
    sp = tp if layout["sp"] else 1
    # the mesh makes the sequence divide into 2 cp chunks, each a multiple of sp
    seq = units * sp * 2 * cp
    pair = rank_model_and_training(name, layout, fields, seq)
    assume(pair is not None)
    assert pair is not None
    model, training = pair
    try:
        ctx = dataclasses.replace(make_ctx(model, training), batch=batch)
    except EstimateError:  # LoRA targets the model does not have
        assume(False)
    assert ctx.seq == seq // cp
    # a known defect (test_known_defects.py): a compiled block of a model with attention
    # sinks is kept as weighed at its held-out shape, which holds from 4 tokens on
    assume(not (model.attention_sinks and training.torch_compile and ctx.seq < 4))
    key = dataclasses.replace(ctx, batch=1, seq=1)
    chunked = training.loss == "chunked"
    kinds = ["dense", "head"] + (["moe"] if model.is_moe else [])
    for kind in kinds:
        for x_grad in (True, False):
            prof, _ = _profile(model, key, kind, x_grad, chunked)
            assert prof is not None, f"{kind} of {name} has no exact profile"
            direct = _direct(model, ctx, kind, x_grad, chunked)
            assert prof.at(ctx.terms()) == direct
            assert block_result(model, ctx, kind, x_grad, chunked)[0] == direct


def test_every_preset_has_an_exact_profile_for_every_block() -> None:
    """The fast path covers every preset, eager and compiled: no block falls back to
    direct simulation."""
    for compiled in (False, True):
        training = TrainingSpec(sequence_length=4096, torch_compile=compiled)
        for name in model_names():
            model = load_model(name)
            key = dataclasses.replace(make_ctx(model, training), batch=1, seq=1)
            kinds = ["dense", "head"] + (["moe"] if model.is_moe else [])
            if model.full_attention_every:  # its global layers among sliding ones
                kinds.append("dense+full")
            for kind in kinds:
                assert _profile(model, key, kind, True, False)[0] is not None, (name, kind)


def test_sequence_parallelism_is_exact_at_long_sequences() -> None:
    """Sequence-parallel blocks divide the token rows by tp; a profile fitted at sizes tp
    does not divide was off by 61 % for Pythia-1B at tp 8 and 131,072 tokens."""
    layout = {"tp": 8, "sp": True, "cp": 1, "ep": 1, "capacity": 1.0}
    pair = rank_model_and_training("pythia-1b", layout, {}, 131072)
    assert pair is not None
    model, training = pair
    ctx = make_ctx(model, training)
    for kind in ("dense", "head"):
        assert block_result(model, ctx, kind, True, False)[0] == _direct(
            model, ctx, kind, True, False
        )


def test_expert_capacity_rounds_rows_up_exactly() -> None:
    """With a capacity factor the busiest expert rank receives ceil(b s k c) rows, which
    is not linear in b s; it is a term of its own, so Mixtral at ep 8 stays exact."""
    layout = {"tp": 1, "sp": False, "cp": 1, "ep": 8, "capacity": 1.25}
    pair = rank_model_and_training("mixtral-8x7b", layout, {}, 4096)
    assert pair is not None
    model, training = pair
    for batch, seq in ((1, 4096), (3, 777), (1, 1)):
        ctx = dataclasses.replace(make_ctx(model, training), batch=batch, seq=seq)
        rows = -(-batch * seq * 2 * 1250 // 1000)
        assert ctx.terms()[3] == rows
        assert block_result(model, ctx, "moe", True, False)[0] == _direct(
            model, ctx, "moe", True, False
        )


def test_a_chunked_loss_holds_at_most_its_tokens_of_rows() -> None:
    model = load_model("llama-3.2-1b")
    short = dataclasses.replace(make_ctx(model, TrainingSpec(loss="chunked")), batch=1, seq=100)
    assert short.terms()[4] == 100
    long = dataclasses.replace(short, seq=5000)
    assert long.terms()[4] == CHUNK_ROWS


def test_symbolic_sizes_are_exact_linear_forms() -> None:
    tokens, pairs = Lin.unit("tokens"), Lin.unit("pairs")
    size = (tokens * 4096 * 2) // 8 + 3 * pairs + 64
    values = (16 * 1024, 16 * 1024 * 1024, 0, 0, 0, 1)
    assert size.evaluate(values) == 16 * 1024 * 4096 * 2 // 8 + 3 * 16 * 1024 * 1024 + 64
    assert larger(tokens * 8, tokens) == tokens * 8
    assert (tokens // 3).evaluate((9, 0, 0, 0, 0, 1)) == 3


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(model_names()),
    layouts,
    trainings,
    st.integers(1, 8),
    st.data(),
)
def test_a_block_reads_no_layer_count(
    name: str, layout: dict[str, object], fields: dict[str, object], batch: int, data: st.DataObject
) -> None:
    """Every stage of a model shares its blocks' profiles (:func:`block_model`): a block
    built for a pipeline stage of any length, with any of its layers dense, equals the
    block built for the one-layer model, symbolic and at a shape."""
    pair = rank_model_and_training(name, layout, fields, 2 * 1024)
    assume(pair is not None)
    assert pair is not None
    model, training = pair
    layers = data.draw(st.integers(1, model.num_layers))
    stage = dataclasses.replace(
        model, num_layers=layers, first_dense_layers=data.draw(st.integers(0, layers))
    )
    try:
        ctx = dataclasses.replace(make_ctx(stage, training), batch=batch)
    except EstimateError:  # LoRA targets the model does not have
        assume(False)
    one = block_model(stage)
    assert (one.num_layers, one.first_dense_layers) == (1, 0)
    chunked = training.loss == "chunked"
    kinds = ["dense", "head", HEAD_LOGITS, "dense" + TRAINED] + (["moe"] if model.is_moe else [])
    if model.full_attention_every:
        kinds.append("dense" + FULL)
    for at in (ctx, dataclasses.replace(ctx, batch=1, seq=1, symbolic=True)):
        for kind in kinds:
            for x_grad in (True, False):
                assert _build(stage, at, kind, x_grad, chunked) == _build(
                    one, at, kind, x_grad, chunked
                ), (kind, x_grad, at.symbolic)


def test_the_stages_of_a_pipeline_share_their_block_profiles() -> None:
    """Llama 3 70B on 4 pipeline stages of 20 layers and on 8 of 10: the layers' and the
    head's profiles are the same objects (one profile per block, not per stage)."""
    from memfit.engine.timeline.stepplan import _layout

    model = load_model("llama-3-70b")
    ctx = dataclasses.replace(make_ctx(model, TrainingSpec()), batch=1, seq=1)
    laid = [
        _layout(block_model(dataclasses.replace(model, num_layers=n)), ctx, (("dense", True),) * n,
                (False,) * n, True, True, False, False, False, False)
        for n in (20, 10)
    ]  # fmt: skip
    assert laid[0].blocks == laid[1].blocks
    assert all(a is b for a, b in zip(laid[0].profiles, laid[1].profiles, strict=True))
