"""What must hold for every scenario, as checks that the property tests and
``benchmarks/properties.py`` share.

:data:`scenarios` draws scenario dicts over every preset, GPU and training setting
(parallel layouts included); a draw the engine rejects must raise
:class:`~memfit.engine.errors.EstimateError` naming a field, nothing else. For one that
estimates, :func:`check_all` runs every invariant and returns the names of those it
checked (each raises ``AssertionError`` with the numbers when it fails):

* ``totals`` -- bytes are integers, never negative; allocated <= reserved <= device; the
  items add up to their categories and the categories to the device total, per rank group
  too; the timeline never goes below zero;
* ``shapes`` -- a larger micro-batch or a longer sequence never lowers the allocated peak,
  and a larger micro-batch never lowers the step time;
* ``checkpointing`` -- more checkpointing (none -> every-k -> full, none -> selective)
  never raises the highest activations of the step, except by the first layer's input
  gradient (a few hidden-size tensors, :func:`input_grad_bound`); selective is compared
  with none played without the KV cache, as selective plays (transformers builds none
  under checkpointing, and the cache's copies change what a layer keeps:
  :func:`_without_cache`);
  where transformers' checkpointing makes a frozen embedding's output require grad
  (``enable_input_require_grads``), layers that save nothing without it save with it,
  and the invariant is not checked (:func:`checkpointing_requires_input_grad`);
* ``sharding`` -- a higher ZeRO stage never raises the model state a rank keeps (weights,
  gradients and optimizer states at rest), DeepSpeed's reduce bucket aside: ZeRO-2/3
  allocate it at ``min(reduce_bucket_size, n)`` elements however few GPUs share the
  rest, so on one GPU, or for a small model, it outweighs what the stage saves; at the
  peak, ZeRO-1 never above ZeRO-0, and ZeRO-3 above ZeRO-1 by at most what it keeps
  gathered and that bucket (:func:`gathered_bound`) -- FSDP and DeepSpeed gather beside
  the shard even where one GPU holds all of it;
* ``profiles`` -- every block of the step, from its profile, equals the block simulated
  directly at the step's shape;
* ``sources`` -- every point's activations, told apart by source, add up to the point's
  activations to the byte, no source is negative or empty, and the peak's sources are
  those of the peak point.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import Estimate, _stages, estimate
from memfit.engine.model_state import CATEGORIES, model_state, split_tensors
from memfit.engine.plan import make_mesh, resolve
from memfit.engine.presets import gpu_names, load_model, model_names
from memfit.engine.scenario_io import scenario_from_dict
from memfit.engine.sharding import DS_REDUCE_BUCKET, gather_buffers, shard, tensor_parallel_shard
from memfit.engine.specs import (
    ATTENTION_KERNELS,
    FRAMEWORKS,
    FROZEN_DTYPES,
    LOSSES,
    METHODS,
    MOE_IMPLEMENTATIONS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PP_SCHEDULES,
    PRECISIONS,
    STACKS,
    Scenario,
)
from memfit.engine.stacks import built as stack_built
from memfit.engine.stacks import conventions
from memfit.engine.timeline import (
    SOURCE_KINDS,
    _direct,
    block_result,
    embedding_output_grad,
    make_ctx,
)


def _with_schedule(p: dict[str, Any]) -> dict[str, Any]:
    rest = {k: v for k, v in p.items() if k != "schedule"}
    return {**rest, "pp_schedule": p["schedule"][0], "vpp": p["schedule"][1]}


parallel = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {
            "tp": st.sampled_from([1, 1, 2, 4, 8]),
            "pp": st.sampled_from([1, 1, 2, 4]),
            "cp": st.sampled_from([1, 1, 2]),
            "ep": st.sampled_from([1, 1, 2, 8]),
            "zero_stage": st.integers(0, 3),
            "framework": st.sampled_from(FRAMEWORKS),
            "schedule": st.sampled_from(
                [(s, 2 if s.startswith("interleaved") else 1) for s in PP_SCHEDULES]
            ),
            "sequence_parallel": st.booleans(),
            "expert_capacity_factor": st.sampled_from([1.0, 1.25]),
            "pp_split": st.sampled_from(["even", "balanced"]),
            "dp_replicate": st.sampled_from([1, 1, 1, 2, 4]),
        }
    ).map(_with_schedule),
)
scenarios = st.fixed_dictionaries(
    {
        "memfit_scenario": st.just(1),
        "model": st.sampled_from(model_names()).map(lambda n: {"preset": n}),
        "hardware": st.fixed_dictionaries(
            {
                "gpu": st.sampled_from(gpu_names()),
                "gpus_per_node": st.sampled_from([1, 1, 2, 8]),
                "nodes": st.sampled_from([1, 1, 2]),
            }
        ),
        "training": st.fixed_dictionaries(
            {
                "method": st.sampled_from(METHODS),
                "precision": st.sampled_from(PRECISIONS),
                "optimizer": st.sampled_from(OPTIMIZERS),
                "optimizer_impl": st.sampled_from(OPTIMIZER_IMPLS),
                "micro_batch_size": st.integers(1, 8),
                "sequence_length": st.sampled_from([1, 7, 64, 512, 1000, 2048, 8192]),
                "gradient_accumulation_steps": st.integers(1, 8),
                "activation_checkpointing": st.sampled_from(
                    ["none", "selective", "full", "every-k-layers", "first-k-layers", "per-op"]
                ),
                "checkpoint_every_k": st.integers(1, 4),
                "attention": st.sampled_from(ATTENTION_KERNELS),
                "loss": st.sampled_from(LOSSES),
                "stack": st.sampled_from(STACKS),
                "moe_implementation": st.sampled_from(MOE_IMPLEMENTATIONS),
                "torch_compile": st.booleans(),
                "frozen_weights_dtype": st.sampled_from(FROZEN_DTYPES),
                "lora": st.fixed_dictionaries(
                    {
                        "rank": st.sampled_from([1, 8, 64]),
                        "targets": st.sampled_from([["q_proj", "v_proj"], ["all-linear"]]),
                        "dropout": st.sampled_from([0.0, 0.05]),
                    }
                ),
                "freeze": st.fixed_dictionaries(
                    {"trainable": st.sampled_from([["lm_head"], ["norms", "mlp"]])}
                ),
                "parallelism": parallel,
            }
        ),
    }
)


def build(data: dict[str, Any]) -> tuple[Scenario, Estimate] | None:
    """The scenario and its estimate, or ``None`` when the engine refuses it (with an
    :class:`EstimateError` naming a field: anything else propagates)."""
    try:
        scenario = scenario_from_dict(data)
        return scenario, estimate(scenario)
    except EstimateError as exc:
        assert exc.field and str(exc).startswith(exc.field + ": "), str(exc)
        return None


def _training(scenario: Scenario, **changes: Any) -> Scenario:
    return dataclasses.replace(scenario, training=dataclasses.replace(scenario.training, **changes))


def _estimate(scenario: Scenario) -> Estimate | None:
    try:
        return estimate(scenario)
    except EstimateError:  # the change itself is not possible for this scenario
        return None


def check_totals(est: Estimate) -> None:
    assert est.allocated_bytes <= est.reserved_bytes <= est.device_bytes
    assert all(type(i.bytes) is int and i.bytes >= 0 for i in est.items), est.items
    breakdown = est.breakdown
    assert set(breakdown) == set(CATEGORIES)
    assert sum(breakdown.values()) == est.device_bytes
    for group in est.rank_groups:
        assert group.allocated_bytes <= group.reserved_bytes <= group.device_bytes
        assert all(i.bytes >= 0 for i in group.items)
        assert sum(i.bytes for i in group.items) == group.device_bytes <= est.device_bytes
        assert group.host_bytes >= 0 and group.nvme_bytes >= 0
    for p in est.timeline:
        assert min(p.parameters, p.gradients, p.optimizer_states, p.activations) >= 0, p
    assert est.host_bytes >= 0 and est.host_node_bytes >= 0


def check_shapes(scenario: Scenario, est: Estimate) -> None:
    t = scenario.training
    bigger = _estimate(_training(scenario, micro_batch_size=t.micro_batch_size + 1))
    if bigger is not None:
        assert bigger.allocated_bytes >= est.allocated_bytes, "micro-batch + 1"
        slower, faster = bigger.time.step_time_s, est.time.step_time_s
        # never faster; equal where every kernel sits at its floor or in one GEMM tile (a few
        # rows), up to the order the terms were summed in
        assert slower >= faster * (1 - 1e-12), ("step time, micro-batch + 1", faster, slower)
    if t.sequence_length * 2 <= scenario.model.max_position_embeddings * 64:
        longer = _estimate(_training(scenario, sequence_length=t.sequence_length * 2))
        if longer is not None:
            assert longer.allocated_bytes >= est.allocated_bytes, "sequence x 2"


def _peak_activations(est: Estimate) -> int:
    """The most activations any point of any pipeline stage holds. Every stage, not only
    the one with the highest total: a change of checkpointing can move the highest total to
    another stage (a first stage's embedding gradient, a last stage's loss), whose
    activations are not comparable with the first one's."""
    if len(est.rank_groups) == 1:
        return max((p.activations for p in est.timeline), default=0)
    plan = resolve(est.scenario)
    stages = _stages(plan.scenario, plan.rank_model(), plan.mesh, plan.ranks())
    return max((p.activations for _, rank in stages for p in rank.timeline.points), default=0)


def input_grad_bound(scenario: Scenario) -> int:
    """What checkpointing may add over no checkpointing: with a frozen embedding it makes
    the first layer compute an input gradient it otherwise skips -- at most eight
    fp32 hidden-size tensors of one micro-batch per rank (the gradients of the layer's
    inputs and their sums)."""
    t = scenario.training
    if t.method == "full" or (t.method == "freeze" and "embeddings" in t.freeze.trainable):
        return 0
    tokens = t.micro_batch_size * t.sequence_length
    return 8 * 4 * tokens * scenario.model.hidden_size


def checkpointing_requires_input_grad(scenario: Scenario) -> bool:
    """Whether checkpointing makes the embedding's output require grad where it would not
    without: transformers' ``enable_input_require_grads`` on a frozen embedding, for the
    model as its stack builds it (LitGPT's model has no such hook, nor a tied head)."""
    model, t = stack_built(scenario).model, scenario.training
    return embedding_output_grad(model, t, True, True) and not embedding_output_grad(
        model, t, True, False
    )


def _without_cache(scenario: Scenario, none: int) -> int:
    """The highest activations of ``scenario`` without checkpointing and without the KV
    cache its stack builds then (``none``: with it, as the stack has it). transformers
    turns the cache off under any checkpointing, so the cache is not what checkpointing
    changes: where it copies the keys and values out of a fused q/k/v projection, the
    projection is freed, while without it attention saves views that keep the whole
    projection -- two more hidden-size tensors a layer (Pythia, Phi-3), more than a
    short sequence's attention core saves."""
    cached = conventions(_training(scenario, activation_checkpointing="none").training).kv_cache
    if not cached:
        return none
    other = _estimate(
        _training(scenario, activation_checkpointing="none", kv_cache_in_outputs=False)
    )
    return none if other is None else _peak_activations(other)


def check_checkpointing(scenario: Scenario, est: Estimate) -> None:
    if checkpointing_requires_input_grad(scenario):
        # nothing before the layers trains: without checkpointing autograd saves nothing
        # in layers that train nothing, while transformers' checkpointing makes the
        # embedding output require grad, so every layer keeps its input -- checkpointing
        # costs more. Where nothing makes it require grad, a checkpointed layer that
        # trains nothing records nothing and keeps nothing, as without checkpointing
        return
    levels: dict[str, int] = {}
    for mode in ("none", "selective", "every-k-layers", "full"):
        if mode == scenario.training.activation_checkpointing:
            levels[mode] = _peak_activations(est)
            continue
        offload = scenario.training.offload
        if mode in ("none", "selective") and offload.activations != "none":
            offload = dataclasses.replace(offload, activations="none")
        other = _estimate(_training(scenario, activation_checkpointing=mode, offload=offload))
        if other is not None:
            levels[mode] = _peak_activations(other)
    if "none" in levels and "selective" in levels:
        levels["none, no cache"] = _without_cache(scenario, levels["none"])
    slack = input_grad_bound(scenario)
    for less, more in (
        ("none", "every-k-layers"),
        ("every-k-layers", "full"),
        ("none, no cache", "selective"),
    ):
        if less in levels and more in levels:
            assert levels[more] <= levels[less] + slack, (less, more, levels, slack)


def _rank_state(scenario: Scenario) -> int | None:
    try:
        mesh = make_mesh(scenario)
    except EstimateError:
        return None
    model = tensor_parallel_shard(scenario.model, mesh.tp, mesh.ep)
    part = "all" if mesh.pp == 1 else "first"
    state = shard(model_state(model, scenario.training, part), scenario, mesh, model, part).state
    return sum(
        i.bytes for i in state.items if i.category != "overhead" and i.role != "reduce-bucket"
    )


def check_sharding(scenario: Scenario) -> None:
    par = scenario.training.parallelism
    states = []
    for zero in range(4):
        changed = dataclasses.replace(par, zero_stage=zero)
        state = _rank_state(_training(scenario, parallelism=changed))
        if state is not None:
            states.append((zero, state))
    values = [s for _, s in states]
    assert values == sorted(values, reverse=True), states


def gathered_bound(scenario: Scenario) -> int:
    """What ZeRO-3 may add over ZeRO-1 at the peak, the stated exception of the sharding
    invariant there: the units ZeRO-3 / FSDP keep gathered beyond the shards, at their
    largest (:func:`memfit.engine.sharding.gather_buffers`, for the model as its stack builds it),
    DeepSpeed's reduce bucket, which ZeRO-3 allocates at ``min(reduce_bucket_size, n)``
    however few GPUs share the rest, and the root unit's gradients (the embedding's and
    the LM head's, where they train), at most 4 bytes an element: FSDP makes them
    unsharded in its parameter dtype and sums a weight's uses out of place (three
    gradients' worth for the head of a chunked loss, traced), where mixed precision
    without it sums them into the autocast copy's gradient and then into ``.grad``."""
    b = stack_built(scenario)
    par = b.training.parallelism
    three = dataclasses.replace(b.training, parallelism=dataclasses.replace(par, zero_stage=3))
    mesh = make_mesh(dataclasses.replace(b, training=three))
    model = tensor_parallel_shard(b.model, mesh.tp, mesh.ep)
    g = gather_buffers(three, model)
    root = sum(t.total for t in split_tensors(model, three).trainable if t.layers is None)
    bound = max(g.forward, g.backward + g.grads + g.reduce) + 4 * root
    if par.framework == "deepspeed":
        bound += 2 * min(DS_REDUCE_BUCKET, model_state(model, three).trainable_params)
    return bound


def check_sharding_at_peak(scenario: Scenario) -> None:
    """At the peak, ZeRO-1 never above ZeRO-0, and ZeRO-3 above ZeRO-1 by no more than
    :func:`gathered_bound` (one pipeline stage: the bound is the stage's)."""
    par = scenario.training.parallelism
    if par.framework == "megatron" or par.pp > 1:
        return
    peaks = {}
    for zero in (0, 1, 3):
        other = _estimate(
            _training(scenario, parallelism=dataclasses.replace(par, zero_stage=zero))
        )
        if other is not None:
            peaks[zero] = other.allocated_bytes
    if 0 in peaks and 1 in peaks:
        assert peaks[1] <= peaks[0], ("ZeRO-1 above ZeRO-0", peaks)
    if 1 in peaks and 3 in peaks:
        bound = gathered_bound(scenario)
        assert peaks[3] - peaks[1] <= bound, ("ZeRO-3 over ZeRO-1", peaks, bound)


def check_profiles(scenario: Scenario) -> None:
    mesh = make_mesh(scenario)
    model = tensor_parallel_shard(scenario.model, mesh.tp, mesh.ep)
    ctx = make_ctx(model, scenario.training)
    chunked = scenario.training.loss == "chunked"
    for kind in ["dense", "head"] + (["moe"] if model.is_moe else []):
        for x_grad in (True, False):
            got = block_result(model, ctx, kind, x_grad, chunked)[0]
            assert got == _direct(model, ctx, kind, x_grad, chunked), (kind, x_grad)


def check_sources(est: Estimate) -> None:
    steps = est.steps
    assert steps is not None
    points, sources = steps.points, steps.sources()
    assert len(points) == len(sources)
    for point, parts in zip(points, sources, strict=True):
        told = sum(s.bytes for s in parts)
        assert told == point.activations, (point, told, parts)
        assert all(s.bytes > 0 and s.kind in SOURCE_KINDS for s in parts), parts
    assert sum(s.bytes for s in steps.peak_sources()) == steps.peak.activations


def check_all(data: dict[str, Any], deep: bool = True) -> list[str]:
    """Every invariant for the scenario ``data``; the names of those checked."""
    built = build(data)
    if built is None:
        return []
    scenario, est = built
    check_totals(est)
    check_sources(est)
    done = ["totals", "profiles", "sources"]
    check_profiles(scenario)
    if deep:
        check_shapes(scenario, est)
        check_checkpointing(scenario, est)
        check_sharding(scenario)
        check_sharding_at_peak(scenario)
        done += ["shapes", "checkpointing", "sharding"]
    return done


def model_label(data: dict[str, Any]) -> str:
    return load_model(data["model"]["preset"]).label
