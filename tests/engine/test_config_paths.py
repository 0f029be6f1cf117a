"""Files a training config names (a DeepSpeed config by path): read only from the config's
own folder, never echoed.

A config's ``deepspeed:`` key (Axolotl, TrainingArguments) and accelerate's
``deepspeed_config_file`` name another file. It is looked for relative to the config's
folder and read only when it resolves inside that folder, links followed; anything else
is left unread -- the ZeRO stage then comes from its name, as for a file that is not
there -- and a note says why, unless the reader is told to allow it. Whatever such a file
holds never appears in an error or a note: a config naming the user's hub token must not
print the token.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from memfit.engine.cli import main
from memfit.engine.errors import EstimateError
from memfit.engine.imports import import_path
from memfit.engine.scenario_io import scenario_from_dict
from memfit.engine.train_configs import ImportedConfig, import_training_config

SECRET = "hf_TopSecretToken0123456789abcdef"
DEFAULT = scenario_from_dict(
    {"memfit_scenario": 1, "model": {"preset": "gpt2"}, "hardware": {"gpu": "l4"}}
)

#: the config's text naming a file; one per key that names a DeepSpeed config
NAMERS: dict[str, Callable[[str], tuple[str, str]]] = {
    "axolotl": lambda ref: ("run.yml", f"base_model: gpt2\ndeepspeed: {json.dumps(ref)}\n"),
    "training-arguments": lambda ref: (
        "args.json",
        json.dumps({"per_device_train_batch_size": 2, "optim": "adamw_torch", "deepspeed": ref}),
    ),
    "accelerate": lambda ref: (
        "accelerate.yaml",
        "distributed_type: DEEPSPEED\nnum_processes: 8\n"
        f"deepspeed_config:\n  deepspeed_config_file: {json.dumps(ref)}\n",
    ),
}


def everything(imported: ImportedConfig) -> str:
    return "\n".join([*imported.notes, *imported.ignored, json.dumps(imported.training)])


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A user's home with a hub token beside the run's folder ``run/``."""
    token = tmp_path / "home" / ".cache" / "huggingface" / "token"
    token.parent.mkdir(parents=True)
    token.write_text(SECRET + "\n")
    (tmp_path / "run").mkdir()
    return tmp_path


def config(home: Path, namer: str, ref: str) -> Path:
    name, text = NAMERS[namer](ref)
    path = home / "run" / name
    path.write_text(text)
    return path


# -- where a named file may be -------------------------------------------------------------

#: ways a named path leaves the config's folder: (the path as the config names it, setup)
ESCAPES: dict[str, Callable[[Path], str]] = {
    "absolute": lambda home: str(home / "home" / ".cache" / "huggingface" / "token"),
    "dot-dot": lambda home: "../home/.cache/huggingface/token",
    "dot-dot-inside-first": lambda home: "sub/../../home/.cache/huggingface/token",
    "link-to-a-file": lambda home: _link(home, "ds_zero3.json", "../home/.cache/huggingface/token"),
    "link-to-a-folder": lambda home: (
        _link(home, "configs", "../home/.cache/huggingface") + "/token"
    ),
    "device": lambda home: "/dev/zero",
}


def _link(home: Path, name: str, target: str) -> str:
    (home / "run" / name).symlink_to(target)
    return name


@pytest.mark.parametrize("namer", sorted(NAMERS))
@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_a_named_file_outside_the_configs_folder_is_not_read(
    home: Path, namer: str, escape: str
) -> None:
    (home / "run" / "sub").mkdir()
    ref = ESCAPES[escape](home)
    imported = import_training_config(config(home, namer, ref))
    text = everything(imported)
    assert SECRET not in text
    assert imported.training["parallelism"]["framework"] == "deepspeed"
    (note,) = [n for n in imported.notes if "outside" in n]
    assert "not read" in note and "config's folder" in note and "--allow-outside-paths" in note
    if escape == "link-to-a-file":  # not read, and its name still says the stage
        assert imported.training["parallelism"]["zero_stage"] == 3
    # as an import of the app: the same
    done = import_path(home / "run" / config(home, namer, ref).name, DEFAULT)
    assert SECRET not in "\n".join(done.messages)
    assert any("outside" in m for m in done.messages)


@pytest.mark.parametrize("namer", sorted(NAMERS))
def test_allowed_outside_the_file_is_read_and_its_content_still_not_shown(
    home: Path, namer: str
) -> None:
    path = config(home, namer, "../home/.cache/huggingface/token")
    with pytest.raises(EstimateError) as info:
        import_training_config(path, allow_outside_paths=True)
    assert SECRET not in str(info.value)
    assert "token" in str(info.value)
    with pytest.raises(EstimateError) as info:
        import_path(path, DEFAULT, allow_outside_paths=True)
    assert SECRET not in str(info.value)
    # a real DeepSpeed config outside is read when allowed
    outside = home / "shared" / "ds.json"
    outside.parent.mkdir()
    outside.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    path = config(home, namer, "../shared/ds.json")
    assert "zero_stage" not in import_training_config(path).training["parallelism"]
    allowed = import_training_config(path, allow_outside_paths=True)
    assert allowed.training["parallelism"]["zero_stage"] == 2


def test_a_dangling_link_inside_is_a_file_not_found(home: Path) -> None:
    (home / "run" / "ds_zero2.json").symlink_to("gone.json")
    imported = import_training_config(config(home, "axolotl", "ds_zero2.json"))
    assert imported.training["parallelism"]["zero_stage"] == 2
    assert any("was not found: ZeRO stage 2 read from its name" in n for n in imported.notes)


def test_inside_the_folder_links_and_subfolders_are_read(home: Path) -> None:
    (home / "run" / "configs").mkdir()
    (home / "run" / "configs" / "ds.json").write_text(
        json.dumps({"zero_optimization": {"stage": 1}})
    )
    (home / "run" / "ds-link.json").symlink_to("configs/ds.json")
    for ref in ("configs/ds.json", "ds-link.json", str(home / "run" / "configs" / "ds.json")):
        imported = import_training_config(config(home, "axolotl", ref))
        assert imported.training["parallelism"]["zero_stage"] == 1, ref


# -- what a named file holds ----------------------------------------------------------------

#: named files whose content is hostile: (file name, content)
HOSTILE: dict[str, tuple[str, str]] = {
    "one-line token": ("token", SECRET + "\n"),
    "one-line token as json": ("ds.json", SECRET),
    "html": ("ds.html", f"<html><body><h1>{SECRET}</h1><img src=x></body></html>"),
    "yaml stage": ("ds.yaml", f"zero_optimization:\n  stage: {SECRET}\n"),
    "yaml alias": ("ds.yaml", f"zero_optimization: *{SECRET}\n"),
    "yaml offload device": (
        "ds.yaml",
        f"zero_optimization:\n  stage: 3\n  offload_optimizer:\n    device: {SECRET}\n",
    ),
    "json optimizer": ("ds.json", json.dumps({"optimizer": {"type": SECRET}})),
    "json bf16": ("ds.json", json.dumps({"bf16": {"enabled": SECRET}})),
    "json section": ("ds.json", json.dumps({"zero_optimization": [SECRET]})),
    "json micro-batch": ("ds.json", json.dumps({"train_micro_batch_size_per_gpu": SECRET})),
    "json accumulation": ("ds.json", json.dumps({"gradient_accumulation_steps": [SECRET, 1]})),
    "json list": ("ds.json", json.dumps([SECRET])),
    "json no deepspeed key": ("ds.json", json.dumps({SECRET: 1})),
    "env file": ("ds.env", f"HF_TOKEN={SECRET}\n"),
    "credentials": ("ds.ini", f"[default]\naws_secret_access_key = {SECRET}\n"),
    "tab": ("ds.yaml", f"\t{SECRET}: 1\n"),
}


@pytest.mark.parametrize("namer", sorted(NAMERS))
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_no_error_or_note_shows_what_a_named_file_holds(home: Path, namer: str, case: str) -> None:
    name, content = HOSTILE[case]
    (home / "run" / name).write_text(content)
    path = config(home, namer, name)
    with pytest.raises(EstimateError) as info:
        import_training_config(path)
    message = str(info.value)
    assert SECRET not in message
    assert name in message and "deepspeed" in info.value.field
    assert len(message) < 300


def test_a_named_deepspeed_config_still_says_what_it_sets_and_ignores(home: Path) -> None:
    (home / "run" / "ds.json").write_text(
        json.dumps(
            {
                "zero_optimization": {"stage": 3, "sub_group_size": 1e9},
                "train_micro_batch_size_per_gpu": 2,
                "gradient_accumulation_steps": 4,
                "train_batch_size": 64,
            }
        )
    )
    imported = import_training_config(config(home, "axolotl", "ds.json"))
    assert imported.training["parallelism"]["zero_stage"] == 3
    assert imported.training["micro_batch_size"] == 2
    assert any("sub_group_size" in item for item in imported.ignored)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_special_files_inside_the_folder_are_refused_without_blocking(home: Path) -> None:
    os.mkfifo(home / "run" / "ds.json")
    (home / "run" / "ds-dir.json").mkdir()
    for ref, kind in (("ds.json", "FIFO"), ("ds-dir.json", "directory")):
        with pytest.raises(EstimateError, match=kind) as info:
            import_training_config(config(home, "axolotl", ref))
        assert info.value.field == "deepspeed"


def test_the_command_line_flag_allows_paths_outside(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(home, "axolotl", "../home/.cache/huggingface/token")
    args = ["estimate", "--from-config", str(path), "--model", "gpt2", "--gpu", "l4"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "outside the config's folder" in err and SECRET not in err
    assert main([*args, "--allow-outside-paths"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memfit: error: deepspeed") and SECRET not in err
    assert len(err.splitlines()) == 1
