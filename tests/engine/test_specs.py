"""Validation on construction: one EstimateError naming the field, value and range."""

import dataclasses

import pytest

from memfit.engine.errors import EstimateError
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, LoraSpec, ModelSpec, Scenario, TrainingSpec


def test_error_is_a_value_error_naming_field_value_and_range() -> None:
    with pytest.raises(EstimateError) as info:
        TrainingSpec(micro_batch_size=-3)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == (
        "training.micro_batch_size: got -3, expected an integer in [1, 65536]"
    )
    assert info.value.field == "training.micro_batch_size"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"precision": "fp64"}, r"training\.precision: got 'fp64', expected one of fp32, "),
        ({"optimizer": "adam"}, r"training\.optimizer: got 'adam', expected one of adamw, "),
        ({"method": "dora"}, r"training\.method: got 'dora'"),
        ({"sequence_length": 0}, r"training\.sequence_length: got 0"),
        ({"micro_batch_size": True}, r"training\.micro_batch_size: got True"),
        ({"attention": "flash3"}, r"training\.attention: got 'flash3'"),
    ],
)
def test_training_fields(kwargs: dict, message: str) -> None:
    with pytest.raises(EstimateError, match=message):
        TrainingSpec(**kwargs)


def test_lora_fields() -> None:
    with pytest.raises(EstimateError, match=r"training\.lora\.targets: got 'qkv'"):
        LoraSpec(targets=("qkv",))
    with pytest.raises(EstimateError, match=r"training\.lora\.rank: got 0"):
        LoraSpec(rank=0)


def test_model_fields() -> None:
    m = load_model("llama-3-8b")
    with pytest.raises(
        EstimateError, match=r"model\.num_key_value_heads: got 7, expected a divisor"
    ):
        dataclasses.replace(m, num_key_value_heads=7)
    with pytest.raises(EstimateError, match=r"model\.hidden_size: got -1"):
        dataclasses.replace(m, hidden_size=-1)
    with pytest.raises(EstimateError, match=r"model\.num_experts_per_tok: is set but num_experts"):
        dataclasses.replace(m, num_experts_per_tok=2)


def test_rank_above_hidden_size_is_rejected_by_the_scenario() -> None:
    hw = HardwareSpec(load_gpu("l4"))
    training = TrainingSpec(method="lora", lora=LoraSpec(rank=1024))
    with pytest.raises(EstimateError, match=r"training\.lora\.rank: got 1024, .*\[1, 768\]"):
        Scenario(load_model("gpt2"), hw, training)


def test_specs_are_frozen_and_hashable() -> None:
    m = load_model("gpt2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.hidden_size = 1  # type: ignore[misc]
    assert hash(m) == hash(dataclasses.replace(m))


def test_hardware_capacity_and_budget_are_integers() -> None:
    hw = HardwareSpec(load_gpu("h100-sxm-80gb"))
    assert hw.capacity_bytes == 81559 * 2**20
    assert hw.budget_bytes == hw.capacity_bytes * 85 // 100
    custom = HardwareSpec(load_gpu("h100-sxm-80gb"), memory_gib=40, utilization_target=0.9)
    assert custom.capacity_bytes == 40 * 2**30
    assert custom.budget_bytes == 36 * 2**30
    with pytest.raises(EstimateError, match=r"hardware\.utilization_target"):
        HardwareSpec(load_gpu("l4"), utilization_target=1.5)


def test_model_spec_round_trips_through_asdict() -> None:
    m = load_model("deepseek-v3")
    assert ModelSpec(**dataclasses.asdict(m)) == m
