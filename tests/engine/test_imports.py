"""What a user brings (engine.imports) and the CLI that reads it: scenario files,
config.json, model folders, cached models and training configurations, by path, by pasted
text and by ``memfit estimate --model / --from-config``, ``memfit cache``, ``memfit
checkpoint``. No network: the cache and the checkpoints are written by the tests."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
from pathlib import Path

import pytest

from memfit.engine.cli import main
from memfit.engine.errors import EstimateError
from memfit.engine.imports import import_cached, import_path, import_text
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.scenario_io import save_scenario, scenario_to_dict
from memfit.engine.specs import HardwareSpec, Scenario, TrainingSpec
from tests.engine.test_checkpoint import CONFIG, ENGINE_COUNT, model_folder, plain_tensors

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LLAMA = FIXTURES / "hf_configs" / "llama.json"
TRAINING = FIXTURES / "train_configs"


def base() -> Scenario:
    return Scenario(
        load_model("llama-3.2-1b"), HardwareSpec(gpu=load_gpu("h100-sxm-80gb")), TrainingSpec()
    )


def cached(root: Path, repo_id: str, folder: Path, commit: str = "a" * 40) -> None:
    """``folder``'s files as the hub lays a snapshot out: blobs, relative links, refs/main."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    for file in folder.iterdir():
        blob = repo / "blobs" / f"{file.name}-blob"
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, blob)
        link = repo / "snapshots" / commit / file.name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


# -- engine.imports --------------------------------------------------------------------------


def test_a_scenario_file_replaces_the_scenario(tmp_path: Path) -> None:
    path = tmp_path / "a.memfit.json"
    other = base()
    save_scenario(other, path)
    imported = import_path(path, Scenario(load_model("gpt2"), other.hardware, TrainingSpec()))
    assert imported.kind == "scenario" and imported.scenario == other


def test_a_config_json_replaces_only_the_model() -> None:
    imported = import_path(LLAMA, base())
    assert imported.kind == "model-config"
    assert imported.scenario.model.hidden_size == json.loads(LLAMA.read_text())["hidden_size"]
    assert imported.scenario.training == base().training
    assert any("parameters" in m for m in imported.messages)


def test_a_model_folder_compares_its_checkpoint(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "tiny", plain_tensors())
    imported = import_path(folder, base())
    assert imported.kind == "model-folder"
    assert imported.scenario.model.num_layers == CONFIG["num_hidden_layers"]
    assert any(f"{ENGINE_COUNT:,} parameters" in m and "matches" in m for m in imported.messages)
    short = model_folder(tmp_path / "short", plain_tensors(layers=1))
    said = " ".join(import_path(short, base()).messages)
    assert "differs from the engine's" in said


def test_a_folder_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EstimateError, match=r"without a config\.json"):
        import_path(tmp_path, base())


@pytest.mark.parametrize("name", sorted(p.name for p in TRAINING.iterdir()))
def test_every_training_config_applies_to_a_scenario(name: str) -> None:
    imported = import_path(TRAINING / name, base())
    assert imported.kind == "training-config"
    assert imported.messages[0].endswith(f"stack {imported.scenario.training.stack}")
    assert imported.scenario.hardware.gpu == base().hardware.gpu


def test_pasted_text_of_each_kind() -> None:
    scenario = import_text(json.dumps(scenario_to_dict(base())), base())
    assert scenario.kind == "scenario"
    assert import_text(LLAMA.read_text(), base()).kind == "model-config"
    yaml_text = (TRAINING / "litgpt-llama-3.1-8b-qlora.yaml").read_text()
    pasted = import_text(yaml_text, base())
    assert pasted.kind == "training-config"
    assert pasted.scenario.training.stack == "lightning"
    assert pasted.scenario.training.method == "qlora"
    with pytest.raises(EstimateError, match="empty"):
        import_text("  \n", base())
    with pytest.raises(EstimateError):
        import_text("{not json, not a config", base())


def test_a_cached_model_imports_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "hub"
    cached(root, "org/tiny", model_folder(tmp_path / "files", plain_tensors()))
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    imported = import_cached("org/tiny", base())
    assert imported.kind == "cached-model"
    assert imported.source.startswith("org/tiny@aaaaaaaa")
    assert imported.scenario.model.hidden_size == CONFIG["hidden_size"]
    with pytest.raises(EstimateError):
        import_cached("org/missing", base())


# -- the CLI ---------------------------------------------------------------------------------


def test_cli_estimates_a_cached_model_and_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "hub"
    files = model_folder(tmp_path / "files", plain_tensors())
    cached(root, "org/tiny", files)
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    code, text = run("estimate", "--model", "org/tiny", "--gpu", "a10g", "--json")
    assert code == 0
    assert json.loads(text)["parameters"]["total"] == ENGINE_COUNT
    code, text = run("estimate", "--model", str(files), "--gpu", "a10g", "--json")
    assert code == 0 and json.loads(text)["parameters"]["total"] == ENGINE_COUNT
    assert run("estimate", "--model", "org/none", "--gpu", "a10g")[0] == 2


def test_cli_lists_the_cache_and_reads_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "hub"
    cached(root, "org/tiny", model_folder(tmp_path / "files", plain_tensors()))
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    code, text = run("cache")
    assert code == 0 and "1 models in" in text and "org/tiny" in text and "main" in text
    code, text = run("cache", "--json")
    listed = json.loads(text)["models"]
    assert [m["repo_id"] for m in listed] == ["org/tiny"]
    code, text = run("checkpoint", "org/tiny")
    assert code == 0
    assert f"checkpoint {ENGINE_COUNT:,}, MemFit {ENGINE_COUNT:,}" in text
    assert "MISMATCH" not in text
    short = model_folder(tmp_path / "short", plain_tensors(layers=1))
    code, text = run("checkpoint", str(short), "--json")
    assert code == 0 and json.loads(text)["mismatch"] is True
    assert run("checkpoint", str(tmp_path / "nowhere"))[0] == 2


def test_cli_from_config_fills_training_and_flags_still_win(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(TRAINING / "litgpt-llama-3.1-8b-qlora.yaml")
    saved = tmp_path / "s.memfit.json"

    def training(*flags: str) -> dict[str, object]:
        code, _ = run(
            "estimate", "--from-config", path, "--gpu", "a10g", "--save", str(saved), *flags
        )
        assert code == 0
        data: dict[str, object] = json.loads(saved.read_text())["training"]
        return data

    t = training()
    assert (t["stack"], t["method"]) == ("lightning", "qlora")
    assert json.loads(saved.read_text())["model"] == {"preset": "llama-3.1-8b"}
    assert "memfit: note: litgpt configuration read from" in capsys.readouterr().err
    assert training("--batch", "7")["micro_batch_size"] == 7
    # a file that names no preset needs the model given
    deepspeed = str(TRAINING / "deepspeed-zero2-bf16.json")
    assert run("estimate", "--from-config", deepspeed, "--gpu", "a10g")[0] == 2
    assert "give --model" in capsys.readouterr().err
    code, _ = run("estimate", "--from-config", deepspeed, "--gpu", "a10g", "--model", "gpt2")
    assert code == 0


def test_lora_targets_that_miss_the_new_model_become_all_linear() -> None:
    deepseek = FIXTURES / "hf_configs" / "deepseek_v3.json"
    lora = dataclasses.replace(base().training, method="lora")
    imported = import_path(deepseek, dataclasses.replace(base(), training=lora))
    assert imported.scenario.training.lora.targets == ("all-linear",)
    assert any("all-linear instead" in m for m in imported.messages)
    # targets that match are kept
    kept = import_path(LLAMA, dataclasses.replace(base(), training=lora))
    assert kept.scenario.training.lora.targets == lora.lora.targets


def test_the_json_estimate_names_the_model_and_how_it_was_read(tmp_path: Path) -> None:
    bigcode = FIXTURES / "hf_configs" / "gpt_bigcode.json"
    code, text = run("estimate", "--model-config", str(bigcode), "--gpu", "a10g", "--json")
    assert code == 0
    model = json.loads(text)["model"]
    assert model["family"] == "gpt_bigcode" and model["read_as"] == ""
    llava = FIXTURES / "hf_configs" / "llava.json"
    code, text = run("estimate", "--model-config", str(llava), "--gpu", "h100-sxm-80gb", "--json")
    assert code == 0 and json.loads(text)["model"]["text_model_of"] == "llava"
