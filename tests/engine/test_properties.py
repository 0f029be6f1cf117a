"""Any scenario dict either estimates, with integer bytes that add up, or raises EstimateError."""

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import EstimateError
from engine.estimate import estimate
from engine.presets import gpu_names, model_names
from engine.scenario_io import scenario_from_dict
from engine.specs import METHODS, OPTIMIZERS, PRECISIONS

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10**7),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
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
            optional={"memory_gib": st.one_of(st.floats(0, 1e5), junk)},
        ),
        "training": training,
    }
)


@settings(max_examples=300, deadline=None)
@given(scenarios)
def test_estimate_or_a_named_error(data: dict[str, Any]) -> None:
    try:
        est = estimate(scenario_from_dict(data))
    except EstimateError as exc:
        assert exc.field and str(exc).startswith(exc.field + ": ")
        return
    assert all(type(i.bytes) is int and i.bytes >= 0 for i in est.items)
    assert sum(est.breakdown.values()) == est.device_bytes
    assert est.budget_bytes <= est.capacity_bytes
