"""Input no parser or check was written for: integers no float holds, nesting thousands of
levels deep, values thousands of characters long, duplicate keys, settings beyond the
model. Each is refused with one short error that names the field and what it accepts;
nothing crashes and no error line repeats a long value."""

import ast
import contextlib
import dataclasses
import io
import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memfit.engine.cli import main, make_parser
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.files import MAX_DEPTH, parse_json
from memfit.engine.imports import import_text
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.scenario_io import scenario_from_dict, scenario_to_dict
from memfit.engine.specs import (
    GpuSpec,
    HardwareSpec,
    LoraSpec,
    ModelSpec,
    ParallelismSpec,
    Scenario,
    TrainingSpec,
)
from memfit.engine.train_configs import import_training_config

ENGINE = Path(__file__).resolve().parents[2] / "engine"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
#: the longest line a message of MemFit may print (the longest list of accepted values
#: makes one of about 470 characters; a value repeated whole, thousands)
LINE = 500
HUGE = (10**308, 10**399, -(10**399), 10**3999, -(10**3999))
LONG = "x" * 5000


def _id(value: object) -> str:
    """A short test id: an integer by its sign and digits."""
    if isinstance(value, int) and abs(value) > 10**20:
        return f"{'-' if value < 0 else ''}{len(str(abs(value)))}-digits"
    return repr(value)[:20]


def cli(*args: str) -> tuple[int, list[str]]:
    """Exit status and stderr lines of ``memfit ARGS``."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(list(args), out=io.StringIO())
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 2
    return code, err.getvalue().splitlines()


def one_error(code: int, lines: list[str], *words: str) -> str:
    """The one ``memfit: error:`` line, short, with ``words`` in it."""
    assert code == 2, lines
    assert len(lines) == 1 and " error: " in lines[0], lines
    assert len(lines[0]) <= LINE, f"{len(lines[0])} characters: {lines[0][:200]}"
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def base_dict(**training: Any) -> dict[str, Any]:
    return {
        "memfit_scenario": 1,
        "model": {"preset": "gpt2"},
        "hardware": {"gpu": "l4"},
        "training": training,
    }


# -- integers no float holds -------------------------------------------------------------


def _float_fields(cls: type) -> list[str]:
    hints = typing.get_type_hints(cls)
    return [
        f.name
        for f in dataclasses.fields(cls)
        if hints[f.name] is float or hints[f.name] == float | None
    ]


_SPECS: dict[type, tuple[str, Any]] = {
    ModelSpec: ("model.", load_model("gpt2")),
    GpuSpec: ("gpu.", load_gpu("l4")),
    HardwareSpec: ("hardware.", HardwareSpec(gpu=load_gpu("l4"))),
    LoraSpec: ("training.lora.", LoraSpec()),
    ParallelismSpec: ("training.parallelism.", ParallelismSpec()),
}


@pytest.mark.parametrize("value", [*HUGE, float("nan"), float("inf"), float("-inf")], ids=_id)
@pytest.mark.parametrize(
    "cls, name", [(cls, name) for cls in _SPECS for name in _float_fields(cls)]
)
def test_every_float_field_refuses_what_no_float_holds_with_its_range(
    cls: type, name: str, value: float
) -> None:
    prefix, base = _SPECS[cls]
    with pytest.raises(EstimateError) as caught:
        dataclasses.replace(base, **{name: value})
    assert caught.value.field == prefix + name
    assert "expected a number in [" in caught.value.detail
    assert len(str(caught.value)) < LINE


def test_every_float_field_of_every_spec_is_covered() -> None:
    assert all(_float_fields(cls) for cls in _SPECS)
    assert not _float_fields(TrainingSpec) and not _float_fields(Scenario)


@pytest.mark.parametrize("value", HUGE, ids=_id)
@pytest.mark.parametrize(
    "path",
    [
        ("training", "lora", "alpha"),
        ("training", "lora", "dropout"),
        ("training", "parallelism", "expert_capacity_factor"),
        ("hardware", "memory_gib"),
        ("hardware", "utilization_target"),
        ("hardware", "host_memory_gib"),
        ("hardware", "network_gb_s"),
        ("hardware", "price_per_gpu_hour"),
        ("hardware", "matmul_efficiency"),
    ],
)
def test_a_huge_integer_in_a_scenario_is_a_named_error(path: tuple[str, ...], value: int) -> None:
    data = base_dict()
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    with pytest.raises(EstimateError) as caught:
        scenario_from_dict(data)
    assert caught.value.field == ".".join(path)
    assert "[" in caught.value.detail and len(str(caught.value)) < LINE


@pytest.mark.parametrize("digits", [309, 400, 4000])
@pytest.mark.parametrize(
    "field",
    ["training.lora.alpha", "training.lora.dropout", "hardware.memory_gib", "hardware.nodes"],
)
def test_a_huge_integer_through_cli_set_is_one_short_error(field: str, digits: int) -> None:
    for sign in ("", "-"):
        code, lines = cli(
            "estimate", "--model", "gpt2", "--gpu", "l4", "--set", f"{field}={sign}1{'0' * digits}"
        )
        one_error(code, lines, field, "[")


@pytest.mark.parametrize("flag", ["--alpha", "--lora-dropout", "--memory-gib", "--budget"])
def test_a_huge_integer_in_a_float_flag_is_one_short_error(flag: str) -> None:
    code, lines = cli("estimate", "--model", "gpt2", "--gpu", "l4", flag, "1" + "0" * 400)
    one_error(code, lines, "[")


@pytest.mark.parametrize("value", HUGE, ids=_id)
@pytest.mark.parametrize("key", ["attn_pdrop", "resid_pdrop", "n_embd", "n_layer"])
def test_a_huge_integer_in_a_config_json_is_one_short_error(
    tmp_path: Path, key: str, value: int
) -> None:
    config = json.loads((FIXTURES / "hf_configs" / "gpt2.json").read_text())
    config[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, lines = cli("estimate", "--model-config", str(path), "--gpu", "l4")
    assert code == 2 and len(lines) == 1 and len(lines[0]) <= LINE, lines


@pytest.mark.parametrize("digits", [309, 400, 4000])
@pytest.mark.parametrize("key", ["lora_alpha", "lora_dropout", "lora_r", "micro_batch_size"])
def test_a_huge_integer_in_a_training_config_is_one_short_error(
    tmp_path: Path, key: str, digits: int
) -> None:
    for sign in ("", "-"):
        text = (FIXTURES / "train_configs" / "axolotl-llama3-8b-lora-zero2.yml").read_text()
        lines = [line for line in text.splitlines() if not line.startswith(key + ":")]
        path = tmp_path / "axolotl.yml"
        path.write_text("\n".join([*lines, f"{key}: {sign}1{'0' * digits}"]) + "\n")
        code, out = cli(
            "estimate",
            "--model",
            "llama-3-8b",
            "--gpu",
            "h100-sxm-80gb",
            "--from-config",
            str(path),
        )
        one_error(code, out, key)


@pytest.mark.parametrize("value", HUGE, ids=_id)
def test_a_huge_batch_in_a_deepspeed_config_is_read_without_repeating_it(value: int) -> None:
    text = (FIXTURES / "train_configs" / "deepspeed-zero2-bf16.json").read_text()
    data = json.loads(text)
    data["train_batch_size"] = value
    try:
        imported = import_training_config(text=json.dumps(data))
    except EstimateError as exc:
        assert exc.field == "train_batch_size" and len(str(exc)) < LINE
    else:
        assert all(len(n) < LINE for n in imported.notes), imported.notes


# -- nesting -------------------------------------------------------------------------------


def _json_nest(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


def _yaml_nest(levels: int) -> str:
    return "a: [" * levels + "1" + "]" * levels


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 300, 990, 50_000])
def test_pasted_json_nested_too_deeply_is_refused(levels: int) -> None:
    base = scenario_from_dict(base_dict())
    for text in (_json_nest(levels), "[" * levels + "]" * levels):
        with pytest.raises(EstimateError, match="nested too deeply"):
            import_text(text, base)


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 300, 990, 50_000])
def test_pasted_yaml_nested_too_deeply_is_refused(levels: int) -> None:
    base = scenario_from_dict(base_dict())
    for text in ("lora_r: 8\nx: " + "[" * levels + "]" * levels, _yaml_nest(levels)):
        with pytest.raises(EstimateError, match=r"nested deeper|nested too deeply"):
            import_text(text, base)


def test_json_up_to_the_depth_limit_is_read() -> None:
    assert parse_json(_json_nest(MAX_DEPTH)) is not None
    with pytest.raises(EstimateError, match="nested too deeply"):
        parse_json(_json_nest(MAX_DEPTH + 1))


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 990, 50_000])
def test_deep_json_in_every_file_and_flag_is_one_short_error(tmp_path: Path, levels: int) -> None:
    path = tmp_path / "deep.json"
    path.write_text(_json_nest(levels))
    for args in (
        ("--scenario", str(path)),
        ("--model-config", str(path), "--gpu", "l4"),
        ("--model", "gpt2", "--gpu", "l4", "--from-config", str(path)),
        ("--model", "gpt2", "--gpu", "l4", "--set", f"training.lora.targets={_json_nest(levels)}"),
        ("--model", "gpt2", "--gpu", "l4", "--set", "training=" + "[" * levels + "]" * levels),
    ):
        line = one_error(*cli("estimate", *args))
        # a training config of 50,000 levels is refused for its size first
        assert "nested too deeply" in line or "bytes are refused" in line, line


_PARSERS = {
    # the one JSON reader of user text (and its finder of a duplicate key's line), and the
    # one YAML reader of training configs
    ("files.py", "*"),
    ("train_configs/parse.py", "_parse_yaml"),
    # bundled data shipped with MemFit: presets and training stacks, never user text
    ("presets.py", "*"),
    ("stacks.py", "*"),
    # the safetensors header reader: bounded by its own header size, with its own handling
    # of duplicate keys and of nesting too deep for the parser
    ("checkpoint.py", "_raw_header"),
}


_PARSING_CALLS = {("json", "loads"), ("json", "load"), ("yaml", "load"), ("yaml", "safe_load")}


def _parsing_calls() -> Iterator[tuple[str, str, int]]:
    """(file, function, line) of every ``json.loads`` / ``yaml.load`` / ``yaml.safe_load``
    call in the engine."""
    for path in sorted(ENGINE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
                continue
            name = getattr(func, "name", "<module>")
            for node in ast.walk(func):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and (node.func.value.id, node.func.attr) in _PARSING_CALLS
                ):
                    yield path.relative_to(ENGINE).as_posix(), name, node.lineno


def test_user_text_is_parsed_only_by_the_bounded_parsers() -> None:
    calls = set(_parsing_calls())
    assert any(f == "files.py" for f, _, _ in calls)  # the scan sees the parsers themselves
    stray = [
        (f, fn, line)
        for f, fn, line in calls
        if (f, fn) not in _PARSERS and (f, "*") not in _PARSERS and fn != "<module>"
    ]
    assert not stray, stray


# -- long values ---------------------------------------------------------------------------


def _estimate_flags() -> list[tuple[str, Any]]:
    """Every flag of ``memfit estimate`` that takes a value, with its action."""
    parser = make_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    estimate = sub.choices["estimate"]  # type: ignore[union-attr]
    return [
        (a.option_strings[-1], a)
        for a in estimate._actions
        if a.option_strings and a.nargs != 0 and a.dest != "help"
    ]


@pytest.mark.parametrize("flag", [f for f, _ in _estimate_flags()])
def test_a_5000_character_value_in_any_flag_is_not_repeated(flag: str) -> None:
    for value in (LONG, "x " * 2500, "9" * 5000, "\x1b" * 5000):
        code, lines = cli("estimate", "--model", "gpt2", "--gpu", "l4", flag, value)
        assert all(len(line) <= LINE for line in lines), [line[:200] for line in lines]
        if code != 0:
            one_error(code, lines)


@pytest.mark.parametrize(
    "item",
    [
        f"training.lora.alpha={LONG}",
        f"{LONG}=1",
        f"training.{LONG}=1",
        f"training.method={LONG}",
        f'training.method="{LONG}"',
        f'training.lora.targets=["{LONG}"]',
        f"hardware.gpu={LONG}",
        f"model.preset={LONG}",
        f"hardware.gpu_name={LONG}",
        f"training.micro_batch_size={'9' * 4000}",
        f"training.micro_batch_size={'9' * 5000}",
        LONG,
        "x " * 2500,
    ],
)
def test_a_5000_character_set_is_not_repeated(item: str) -> None:
    one_error(*cli("estimate", "--model", "gpt2", "--gpu", "l4", "--set", item))


def _leaves(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    else:
        yield path


@pytest.mark.parametrize(
    "value", [LONG, "x " * 2500, ["q_proj", LONG], {LONG: 1}, "\x1b[31m" * 1000]
)
def test_a_5000_character_value_in_any_scenario_field_is_not_repeated(value: Any) -> None:
    base = scenario_from_dict(base_dict(method="lora"))
    for path in _leaves(scenario_to_dict(base)):
        data = scenario_to_dict(base)
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        try:
            scenario_from_dict(data)
        except EstimateError as exc:
            assert len(str(exc)) < LINE, (path, str(exc)[:200])
            assert exc.field.startswith(path[0]), (path, exc.field)


def test_a_model_named_with_2000_characters_is_not_repeated_whole() -> None:
    config = json.loads((FIXTURES / "hf_configs" / "gpt2.json").read_text())
    config["_name_or_path"] = "n" * 2000  # the longest name accepted
    imported = import_text(json.dumps(config), scenario_from_dict(base_dict()))
    assert imported.scenario.model.label == "n" * 2000
    assert all(len(m) < LINE for m in imported.messages), [len(m) for m in imported.messages]


@pytest.mark.parametrize("where", ["key", "value", "section"])
def test_a_5000_character_key_or_value_in_a_training_config_is_not_repeated(where: str) -> None:
    text = (FIXTURES / "train_configs" / "axolotl-llama3-8b-lora-zero2.yml").read_text()
    extra = {
        "key": f"{LONG}: 1",
        "value": f"optimizer: {LONG}",
        "section": f"fsdp_config:\n  {LONG}: true",
    }[where]
    base = scenario_from_dict(base_dict())
    try:
        imported = import_text(text + extra + "\n", base)
    except EstimateError as exc:
        assert len(str(exc)) < LINE, str(exc)[:200]
    else:
        assert all(len(m) < LINE for m in imported.messages), imported.messages


# -- leniencies ----------------------------------------------------------------------------


@pytest.mark.parametrize("layers", [13, 100, 4096])
def test_more_last_layers_than_the_model_has_is_an_error(layers: int) -> None:
    args = ("estimate", "--model", "gpt2", "--gpu", "l4", "--method", "freeze")
    one_error(*cli(*args, "--last-layers", str(layers)), "training.freeze.last_layers", "[0, 12]")
    assert cli(*args, "--last-layers", "12")[0] == 0


def test_last_layers_past_the_model_is_refused_in_a_scenario_file_too() -> None:
    scenario = scenario_from_dict(base_dict(method="freeze", freeze={"last_layers": 13}))
    with pytest.raises(EstimateError, match=r"last_layers: got 13, .*\[0, 12\]"):
        estimate(scenario)
    freeze = dataclasses.replace(scenario.training.freeze, last_layers=12)
    assert (
        estimate(
            dataclasses.replace(
                scenario, training=dataclasses.replace(scenario.training, freeze=freeze)
            )
        ).trainable_params
        > 0
    )


def test_expert_shards_on_a_dense_model_is_an_error() -> None:
    with pytest.raises(EstimateError) as caught:
        dataclasses.replace(load_model("gpt2"), expert_shards=2)
    assert caught.value.field == "model.expert_shards"
    assert "1" in caught.value.detail and "dense" in caught.value.detail
    moe = load_model("mixtral-8x7b")
    assert dataclasses.replace(moe, expert_shards=2).local_experts == moe.num_experts // 2


@pytest.mark.parametrize(
    "text, key, line",
    [
        ("adapter: lora\nlora_r: 8\nlora_r: 16\n", "lora_r", 3),
        ("adapter: lora\nfsdp_config:\n  a: 1\n  a: 2\n", "a", 4),
        ('{"lora_r": 8,\n "adapter": "lora",\n "lora_r": 16}', "lora_r", 3),
        ('{"per_device_train_batch_size": 1,\n "fsdp_config": {"a": 1,\n "a": 2}}', "a", 3),
    ],
)
def test_a_duplicate_key_in_a_training_config_names_the_key_and_its_line(
    text: str, key: str, line: int
) -> None:
    with pytest.raises(EstimateError) as caught:
        import_training_config(text=text)
    assert f"'{key}' appears twice" in str(caught.value)
    assert f"line {line}" in str(caught.value)


def test_a_duplicate_key_in_a_scenario_or_config_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.memfit.json"
    path.write_text('{"memfit_scenario": 1,\n"model": {"preset": "gpt2"},\n"model": {}}')
    one_error(*cli("estimate", "--scenario", str(path)), "'model' appears twice", "line 3")
    with pytest.raises(EstimateError, match=r"line 2: the key 'n_layer' appears twice"):
        parse_json('{"n_layer": 1,\n"a": {"n_layer": 1}, "n_layer": 2}')


def test_the_same_key_in_different_mappings_and_yaml_merge_overrides_are_not_duplicates() -> None:
    assert parse_json('{"a": {"k": 1}, "b": {"k": 2}, "c": [{"k": 1}, {"k": 2}]}')
    text = (
        "base_model: meta-llama/Llama-3.1-8B\nadapter: lora\n"
        "defaults: &d\n  lora_r: 8\n  lora_alpha: 16\nlora:\n  <<: *d\n  lora_r: 16\n"
    )
    assert import_training_config(text=text).format == "axolotl"
