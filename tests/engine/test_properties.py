"""Any scenario dict either estimates, with integer bytes that add up, or raises EstimateError."""

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.presets import gpu_names, model_names
from memfit.engine.scenario_io import scenario_from_dict
from memfit.engine.specs import FRAMEWORKS, METHODS, OPTIMIZERS, PP_SCHEDULES, PP_SPLITS, PRECISIONS
from tests.engine.fuzzing import DEEP, HUGE


def nested(levels: int) -> list[Any]:
    """A list nested ``levels`` deep, built without recursion."""
    node: list[Any] = []
    for _ in range(levels - 1):
        node = [node]
    return node


junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10**7),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.sampled_from(HUGE),  # integers no float holds
    st.sampled_from(DEEP).map(nested),  # nesting that a JSON file could hold
)

training = st.fixed_dictionaries(
    {},
    optional={
        "method": st.one_of(st.sampled_from(METHODS), junk),
        "precision": st.one_of(st.sampled_from(PRECISIONS), junk),
        "optimizer": st.one_of(st.sampled_from(OPTIMIZERS), junk),
        "micro_batch_size": st.one_of(st.integers(-2, 64), junk),
        "sequence_length": st.one_of(st.integers(-2, 1 << 20), junk),
        "lora": st.fixed_dictionaries(
            {},
            optional={
                "rank": st.one_of(st.integers(-1, 20000), junk),
                "targets": st.one_of(
                    st.lists(
                        st.sampled_from(
                            ["q_proj", "v_proj", "all-linear", "q_a_proj", "gate_proj", "bogus"]
                        ),
                        min_size=0,
                        max_size=3,
                    ),
                    junk,
                ),
            },
        ),
        "activation_checkpointing": st.sampled_from(["none", "full", "selective"]),
        "gradient_accumulation_steps": st.one_of(st.integers(0, 16), junk),
        "parallelism": st.fixed_dictionaries(
            {},
            optional={
                "tp": st.one_of(st.sampled_from([1, 2, 3, 4, 8]), junk),
                "pp": st.one_of(st.sampled_from([1, 2, 3, 4]), junk),
                "cp": st.one_of(st.sampled_from([1, 2, 4]), junk),
                "ep": st.one_of(st.sampled_from([1, 2, 8]), junk),
                "vpp": st.one_of(st.sampled_from([1, 2, 3]), junk),
                "zero_stage": st.one_of(st.integers(-1, 4), junk),
                "pp_schedule": st.one_of(st.sampled_from(PP_SCHEDULES), junk),
                "framework": st.one_of(st.sampled_from(FRAMEWORKS), junk),
                "sequence_parallel": st.one_of(st.booleans(), junk),
                "hybrid_shard": st.one_of(st.booleans(), junk),
                "expert_capacity_factor": st.one_of(st.floats(0, 100), junk),
            },
        ),
        "offload": st.fixed_dictionaries(
            {},
            optional={
                "optimizer": st.sampled_from(["none", "cpu", "nvme", "gpu"]),
                "parameters": st.sampled_from(["none", "cpu", "nvme"]),
                "activations": st.one_of(st.sampled_from(["none", "cpu"]), junk),
            },
        ),
        "freeze": st.fixed_dictionaries(
            {},
            optional={
                "trainable": st.lists(
                    st.sampled_from(["lm_head", "norms", "mlp", "x"]), max_size=2
                ),
                "last_layers": st.one_of(st.integers(-1, 200), junk),
            },
        ),
    },
)
scenarios = st.fixed_dictionaries(
    {
        "memfit_scenario": st.just(1),
        "model": st.one_of(st.sampled_from(model_names()).map(lambda n: {"preset": n}), junk),
        "hardware": st.fixed_dictionaries(
            {"gpu": st.one_of(st.sampled_from(gpu_names()), junk)},
            optional={
                "memory_gib": st.one_of(st.floats(0, 1e5), junk),
                "gpus_per_node": st.one_of(st.sampled_from([1, 2, 4, 8, 16]), junk),
                "nodes": st.one_of(st.sampled_from([1, 2, 3]), junk),
                "host_memory_gib": st.one_of(st.floats(0, 4096), junk),
            },
        ),
        "training": training,
    }
)


@settings(max_examples=600, deadline=None)
@given(scenarios)
def test_estimate_or_a_named_error(data: dict[str, Any]) -> None:
    check(data)


def check(data: dict[str, Any]) -> None:
    try:
        est = estimate(scenario_from_dict(data))
    except EstimateError as exc:
        assert exc.field and str(exc).startswith(exc.field + ": ")
        return
    assert all(type(i.bytes) is int and i.bytes >= 0 for i in est.items)
    assert sum(est.breakdown.values()) == est.device_bytes
    for group in est.rank_groups:  # every rank group adds up too, worst first in the headline
        assert sum(i.bytes for i in group.items) == group.device_bytes <= est.device_bytes
    assert est.host_node_bytes >= 0 and est.host_verdict in ("fits", "oom", "unknown")
    assert est.budget_bytes <= est.capacity_bytes


def with_schedule(p: dict[str, Any]) -> dict[str, Any]:
    """Interleaved 1F1B comes with 2 virtual stages, every other schedule with 1."""
    rest = {k: v for k, v in p.items() if k != "schedule"}
    return {**rest, "pp_schedule": p["schedule"][0], "vpp": p["schedule"][1]}


parallel = st.fixed_dictionaries(
    {
        "tp": st.sampled_from([1, 2, 4, 8]),
        "pp": st.sampled_from([1, 2, 4]),
        "cp": st.sampled_from([1, 2]),
        "ep": st.sampled_from([1, 1, 1, 2, 8]),
        "zero_stage": st.integers(0, 3),
        "framework": st.sampled_from(FRAMEWORKS),
        "schedule": st.sampled_from(
            [(s, 2 if s.startswith("interleaved") else 1) for s in PP_SCHEDULES]
        ),
        "sequence_parallel": st.booleans(),
        "hybrid_shard": st.booleans(),
        "expert_capacity_factor": st.sampled_from([1.0, 1.25, 2.0]),
        "pp_split": st.sampled_from(PP_SPLITS),
    }
).map(with_schedule)
cluster = st.fixed_dictionaries(
    {
        "memfit_scenario": st.just(1),
        "model": st.sampled_from(model_names()).map(lambda n: {"preset": n}),
        "hardware": st.fixed_dictionaries(
            {
                "gpu": st.sampled_from(gpu_names()),
                "gpus_per_node": st.sampled_from([2, 4, 8]),
                "nodes": st.sampled_from([1, 2, 4]),
            },
            optional={"host_memory_gib": st.floats(16, 4096)},
        ),
        "training": st.fixed_dictionaries(
            {
                "method": st.sampled_from(METHODS),
                "precision": st.sampled_from(PRECISIONS),
                "micro_batch_size": st.integers(1, 4),
                "sequence_length": st.sampled_from([512, 1024, 4096]),
                "gradient_accumulation_steps": st.integers(1, 8),
                "activation_checkpointing": st.sampled_from(["none", "full", "selective"]),
                "parallelism": parallel,
                "offload": st.fixed_dictionaries(
                    {
                        "optimizer": st.sampled_from(["none", "cpu", "nvme"]),
                        "parameters": st.sampled_from(["none", "cpu"]),
                        "activations": st.sampled_from(["none", "cpu"]),
                    }
                ),
            }
        ),
    }
)


@settings(max_examples=400, deadline=None)
@given(cluster)
def test_any_cluster_estimates_per_rank_or_names_the_field(data: dict[str, Any]) -> None:
    """Every combination of the multi-GPU settings on real presets: a per-rank estimate
    whose groups add up, or an error naming the field."""
    check(data)
    try:
        est = estimate(scenario_from_dict(data))
    except EstimateError:
        return
    mesh = est.mesh
    assert mesh is not None and mesh.dp * mesh.tp * mesh.pp * mesh.cp == mesh.world
    assert len(est.rank_groups) == mesh.pp
    assert est.device_bytes == max(g.device_bytes for g in est.rank_groups)
