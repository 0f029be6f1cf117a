"""One strict boundary: every input that is not what a field takes is one EstimateError
naming the field -- never a traceback, never a silent reading of "false" as true."""

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import pytest

from memfit.engine.cli import main, printable
from memfit.engine.errors import EstimateError, shown
from memfit.engine.hf_config import model_from_hf_config
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.scenario_io import load_scenario, scenario_from_dict
from memfit.engine.specs import (
    FreezeSpec,
    GpuSpec,
    HardwareSpec,
    LoraSpec,
    ModelSpec,
    OffloadSpec,
    ParallelismSpec,
    QuantSpec,
    TrainingSpec,
)

LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 1000,
}


def scenario(**sections: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "memfit_scenario": 1,
        "model": {"preset": "gpt2"},
        "hardware": {"gpu": "l4"},
    }
    data.update(sections)
    return data


def error_of(data: Any) -> EstimateError:
    with pytest.raises(EstimateError) as info:
        scenario_from_dict(data)
    return info.value


# -- every field of every spec is typed strictly -------------------------------------------

SPECS = {
    ModelSpec: (load_model("llama-3-8b"), "model."),
    GpuSpec: (load_gpu("l4"), "gpu."),
    HardwareSpec: (HardwareSpec(load_gpu("l4")), "hardware."),
    TrainingSpec: (TrainingSpec(), "training."),
    LoraSpec: (LoraSpec(), "training.lora."),
    QuantSpec: (QuantSpec(), "training.qlora."),
    FreezeSpec: (FreezeSpec(), "training.freeze."),
    ParallelismSpec: (ParallelismSpec(), "training.parallelism."),
    OffloadSpec: (OffloadSpec(), "training.offload."),
}


def wrong_values(kind: Any) -> list[Any]:
    """Values of other types than ``kind``, the near misses first."""
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return [{}, "x", 1]
    if kind in (int, int | None):
        return ["64", 64.0, True, None] if kind is int else ["64", 64.0, True]
    if kind in (float, float | None):
        return ["0.5", float("nan"), float("inf"), True] + ([None] if kind is float else [])
    if kind in (bool, bool | None):
        return ["false", "no", 0, 1] + ([None] if kind is bool else [])
    if kind in (str, str | None):
        return [1, "\ud800", "a\x1b[31m", ["a"]] + ([None] if kind is str else [])
    if typing.get_origin(kind) is tuple:
        return ["q_proj", ["q_proj"], ("q_proj", 3), ("\x1b",)]
    raise AssertionError(f"no wrong values for {kind!r}")


FIELDS = [
    (cls, f.name, kind)
    for cls in SPECS
    for f, kind in zip(dataclasses.fields(cls), typing.get_type_hints(cls).values(), strict=False)
    if f.name in typing.get_type_hints(cls)
]


@pytest.mark.parametrize(
    ("cls", "name", "kind"), FIELDS, ids=[f"{c.__name__}.{n}" for c, n, _ in FIELDS]
)
def test_every_field_refuses_a_value_of_another_type(cls: type, name: str, kind: Any) -> None:
    spec, prefix = SPECS[cls]
    kind = typing.get_type_hints(cls)[name]
    for value in wrong_values(kind):
        with pytest.raises(EstimateError) as info:
            dataclasses.replace(spec, **{name: value})  # type: ignore[type-var]
        assert info.value.field.startswith(prefix + name), (name, value, info.value.field)


# -- the defects found by fuzzing, class by class ------------------------------------------


def test_a_block_size_given_as_a_string_is_an_error_not_a_crash() -> None:
    err = error_of(scenario(training={"method": "qlora", "qlora": {"block_size": "64"}}))
    assert err.field == "training.qlora.block_size"


@pytest.mark.parametrize("memory", [float("nan"), float("inf"), 1e308, -1.0, "24", True])
def test_a_custom_device_with_an_impossible_memory_names_the_field(memory: object) -> None:
    err = error_of(scenario(hardware={"gpu": "custom", "memory_gib": memory}))
    assert err.field == "hardware.memory_gib"


def test_booleans_and_numbers_in_a_config_are_not_strings() -> None:
    """``"tie_word_embeddings": "false"`` was read as true, ``"attention_bias": "no"``
    added biases."""
    for key, value in (
        ("tie_word_embeddings", "false"),
        ("attention_bias", "no"),
        ("mlp_bias", 0),
        ("attention_dropout", "0.1"),
        ("use_sliding_window", "yes"),
    ):
        with pytest.raises(EstimateError) as info:
            model_from_hf_config({**LLAMA, key: value})
        assert info.value.field == f"model.{key}"
    assert (
        model_from_hf_config({**LLAMA, "tie_word_embeddings": False}).tie_word_embeddings is False
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_attention_heads": 0}, "model.num_attention_heads"),
        ({"hidden_size": 0}, "model.hidden_size"),
        ({"hidden_act": 5}, "model.hidden_act"),
        ({"hidden_act": ["silu"]}, "model.hidden_act"),
        ({"model_type": {"a": 1}}, "model.model_type"),
        ({"text_config": "llama"}, "model.text_config"),
        ({"_name_or_path": "\ud800"}, "model._name_or_path"),
        ({"num_hidden_layers": "32"}, "model.num_hidden_layers"),
    ],
)
def test_hostile_configs_name_the_key(change: dict[str, Any], field: str) -> None:
    with pytest.raises(EstimateError) as info:
        model_from_hf_config({**LLAMA, **change})
    assert info.value.field == field


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (scenario(memfit_scenario=True), "memfit_scenario"),
        (scenario(memfit_scenario=1.0), "memfit_scenario"),
        (scenario(name="\ud800"), "name"),
        (scenario(name="x\x1b[2J"), "name"),
        (scenario(model={"preset": "\ud800"}), "model.preset"),
        (scenario(model={"spec": {**json.loads("{}"), "name": "\ud800"}}), "model.spec"),
        (scenario(hardware={"gpu": 5}), "hardware.gpu"),
        (scenario(training={"micro_batch_size": 10**4000}), "training.micro_batch_size"),
    ],
)
def test_scenario_values_that_are_not_what_the_field_takes(data: Any, field: str) -> None:
    err = error_of(data)
    assert err.field.startswith(field)
    assert len(str(err)) < 300  # one short line, even for a 4,000-digit integer


def test_hostile_json_files_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = {
        "deep.json": "[" * 5000 + "]" * 5000,
        "digits.json": '{"memfit_scenario": ' + "1" * 5000 + "}",
        "surrogate.json": '{"memfit_scenario": 1, "name": "\\ud800", "model": "gpt2", '
        '"hardware": {"gpu": "l4"}}',
    }
    for name, text in texts.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(EstimateError):
            load_scenario(path)
        assert main(["estimate", "--scenario", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("memfit: error: "), err


@pytest.mark.parametrize(
    "value", ["9" * 5000, "[" * 5000, '"\\u001b[31m"', '"\\ud800"', "NaN", "1e999"]
)
def test_set_values_that_break_a_parser_are_one_line(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["estimate", "--model", "gpt2", "--gpu", "l4", "--set", f"hardware.memory_gib={value}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("memfit: error: ")


def test_terminal_escapes_never_reach_the_terminal() -> None:
    assert printable("a\x1b[31mb\nc\ud800") == "a\\x1b[31mb\nc\\ud800"
    assert "\x1b" not in shown("\x1b[2J")
