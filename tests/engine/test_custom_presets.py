"""The user's own presets: a folder of the built-in data's shape (``models/``, ``gpus/``,
``stacks/``), read beside the built-in presets, each file checked as a built-in one is;
a file that does not load is one line naming it and its field, and the rest load."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from memfit.engine import memo
from memfit.engine.cli import main
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.locate import preset_files, user_presets_dir
from memfit.engine.presets import (
    custom_names,
    gpu_names,
    load_gpu,
    load_model,
    model_names,
    preset_problems,
)
from memfit.engine.scenario_io import scenario_from_dict
from memfit.engine.specs import STACKS, HardwareSpec, Scenario, TrainingSpec, stack_names
from memfit.engine.stacks import load_stack, loadable_stack_names, stacks
from tests.engine.helpers import builtin_preset


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty user folder of presets, read afresh."""
    folder = tmp_path / "presets"
    for kind in ("models", "gpus", "stacks"):
        (folder / kind).mkdir(parents=True)
    monkeypatch.setenv("MEMFIT_USER_PRESETS", str(folder))
    memo.clear()
    yield folder
    memo.clear()


def write(folder: Path, kind: str, name: str, data: object) -> Path:
    path = folder / kind / f"{name}.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    memo.clear()
    return path


def my_model() -> dict[str, object]:
    return {
        **builtin_preset("models", "llama-3-8b"),
        "name": "my-llama",
        "display_name": "My Llama",
    }


def my_gpu() -> dict[str, object]:
    data = builtin_preset("gpus", "h100-sxm-80gb")
    return {**data, "name": "lab-gpu", "display_name": "Lab GPU 96GB", "memory_mib": 98304}


def my_stack() -> dict[str, object]:
    return {**builtin_preset("stacks", "hf-trainer"), "name": "our-loop", "label": "Our loop"}


def test_the_folder_is_where_each_platform_keeps_such_files() -> None:
    home = {"HOME": "/home/ada"}
    assert user_presets_dir(home, "linux") == Path("/home/ada/.config/MemFit/presets")
    xdg = {**home, "XDG_CONFIG_HOME": "/cfg"}
    assert user_presets_dir(xdg, "linux") == Path("/cfg/MemFit/presets")
    # a relative XDG folder is ignored, as the XDG specification asks
    assert user_presets_dir({**home, "XDG_CONFIG_HOME": "cfg"}, "linux").parts[1] == "home"
    mac = user_presets_dir({"HOME": "/Users/ada"}, "darwin")
    assert mac == Path("/Users/ada/Library/Application Support/MemFit/presets")
    win = user_presets_dir({"APPDATA": "C:/Users/ada/AppData/Roaming"}, "win32")
    assert win == Path("C:/Users/ada/AppData/Roaming/MemFit/presets")
    chosen = {**xdg, "MEMFIT_USER_PRESETS": "/srv/team-presets"}
    assert user_presets_dir(chosen, "linux") == Path("/srv/team-presets")


def test_no_folder_gives_the_built_in_presets_only(user: Path) -> None:
    assert custom_names("models") == custom_names("gpus") == custom_names("stacks") == set()
    assert preset_problems() == ()
    assert loadable_stack_names() == STACKS
    assert "llama-3-8b" in model_names()


def test_custom_presets_load_beside_the_built_in_ones(user: Path) -> None:
    builtin_models, builtin_gpus = model_names(), gpu_names()
    write(user, "models", "my-llama", my_model())
    write(user, "gpus", "lab-gpu", my_gpu())
    write(user, "stacks", "our-loop", my_stack())
    assert set(model_names()) == {*builtin_models, "my-llama"}
    assert set(gpu_names()) == {*builtin_gpus, "lab-gpu"}
    assert loadable_stack_names() == (*STACKS, "our-loop")
    assert [s.name for s in stacks()][-1] == "our-loop"
    assert custom_names("models") == {"my-llama"}
    assert preset_problems() == ()
    model, gpu = load_model("my-llama"), load_gpu("lab-gpu")
    assert model.label == "My Llama"
    assert gpu.memory_mib == 98304
    scenario = Scenario(model, HardwareSpec(gpu), TrainingSpec(stack="our-loop"))
    assert load_stack("our-loop").label == "Our loop"
    # the stack is the built-in one renamed: the same step, the same bytes
    same = Scenario(model, HardwareSpec(gpu), TrainingSpec(stack="hf-trainer"))
    assert estimate(scenario).device_bytes == estimate(same).device_bytes
    assert estimate(scenario).capacity_bytes == 98304 << 20


def test_a_broken_file_is_one_line_naming_it_and_the_rest_load(user: Path) -> None:
    write(user, "models", "my-llama", my_model())
    bad_json = write(user, "models", "torn", "{not json")
    bad_value = write(user, "models", "wide", {**my_model(), "name": "wide", "hidden_size": -5})
    unknown = write(user, "gpus", "typo", {**my_gpu(), "name": "typo", "memory_gib": 96})
    clash = write(user, "gpus", "h100-sxm-80gb", my_gpu())
    odd_name = write(user, "models", "has space", my_model())
    bad_stack = write(
        user,
        "stacks",
        "half",
        {**my_stack(), "name": "half", "conventions": {"outputs_held_through_backward": 1}},
    )
    problems = preset_problems()
    assert len(problems) == 6, problems
    assert all("\n" not in p for p in problems)

    def line(path: Path) -> str:
        (found,) = [p for p in problems if f" {path.parent.name}/{path.name} in " in p]
        assert found.startswith(f"custom preset {path.parent.name}/{path.name} in {user}: ")
        return found

    assert "cannot be read" in line(bad_json)
    assert "model.hidden_size: got -5, expected an integer in [1," in line(bad_value)
    assert "hardware.gpu[typo].memory_gib: unknown key" in line(unknown)
    assert "a built-in preset's name" in line(clash)
    assert "is not a preset name" in line(odd_name)
    assert "conventions" in line(bad_stack)
    assert set(preset_problems("gpus")) == {line(clash), line(unknown)}
    # the rest load: the good custom one and every built-in one
    assert "my-llama" in model_names() and "torn" not in model_names()
    assert "wide" not in model_names() and "typo" not in gpu_names()
    assert load_gpu("h100-sxm-80gb").memory_mib != 98304  # the built-in one, untouched
    assert loadable_stack_names() == STACKS
    # asked for by name, a broken one is its own error, naming the field
    with pytest.raises(EstimateError, match=r"model\.hidden_size: got -5"):
        load_model("wide")
    assert "half" in stack_names()  # a scenario may name it; reading it says what is wrong
    with pytest.raises(EstimateError, match=r"conventions"):
        estimate(
            Scenario(
                load_model("my-llama"), HardwareSpec(load_gpu("l4")), TrainingSpec(stack="half")
            )
        )


def test_a_scenario_file_names_a_custom_stack(user: Path) -> None:
    write(user, "stacks", "our-loop", my_stack())
    data = {
        "memfit_scenario": 1,
        "model": {"preset": "llama-3-8b"},
        "hardware": {"gpu": "h100-sxm-80gb"},
        "training": {"stack": "our-loop"},
    }
    assert scenario_from_dict(data).training.stack == "our-loop"
    (user / "stacks" / "our-loop.json").unlink()
    memo.clear()
    with pytest.raises(EstimateError, match=r"training\.stack: got 'our-loop', expected one of"):
        scenario_from_dict(data)


def test_the_cli_lists_them_marked_and_names_the_broken_ones(
    user: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(user, "models", "my-llama", my_model())
    write(user, "models", "wide", {**my_model(), "name": "wide", "hidden_size": -5})
    write(user, "gpus", "lab-gpu", my_gpu())
    write(user, "stacks", "our-loop", my_stack())
    out = io.StringIO()
    assert main(["presets", "models"], out) == 0
    lines = out.getvalue().splitlines()
    (mine,) = [ln for ln in lines if ln.startswith("my-llama ")]
    assert mine.endswith("My Llama  (custom)")
    assert any(ln.startswith("llama-3-8b ") and "(custom)" not in ln for ln in lines)
    err = capsys.readouterr().err.splitlines()
    (note,) = err
    assert note.startswith("memfit: note: custom preset models/wide.json in ")
    assert note.endswith(": model.hidden_size: got -5, expected an integer in [1, 16777216]")
    out = io.StringIO()
    assert main(["presets", "gpus", "--json"], out) == 0
    rows = {r["name"]: r for r in json.loads(out.getvalue())}
    assert rows["lab-gpu"]["custom"] is True and rows["l4"]["custom"] is False
    assert capsys.readouterr().err == ""  # the broken model is not the GPUs' business
    out = io.StringIO()
    assert main(["presets", "stacks"], out) == 0
    assert out.getvalue().splitlines()[-1] == "our-loop              Our loop  (custom)"
    out = io.StringIO()
    status = main(
        ["estimate", "--model", "my-llama", "--gpu", "lab-gpu", "--stack", "our-loop"], out
    )
    assert status == 0
    assert out.getvalue().startswith("MemFit estimate: My Llama on Lab GPU 96GB (1 GPU)")


def test_the_listing_is_read_once_and_again_after_a_clear(user: Path) -> None:
    assert "my-llama" not in preset_files("models").files
    (user / "models" / "my-llama.json").write_text(json.dumps(my_model()))
    assert "my-llama" not in preset_files("models").files  # cached
    memo.clear()
    assert "my-llama" in preset_files("models").files


def test_the_cli_says_where_the_folder_is(user: Path) -> None:
    out = io.StringIO()
    assert main(["presets", "folder"], out) == 0
    assert out.getvalue() == f"{user}\n"
    out = io.StringIO()
    assert main(["presets", "folder", "--json"], out) == 0
    assert json.loads(out.getvalue()) == {"folder": str(user), "exists": True}
