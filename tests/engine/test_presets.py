"""Presets are data: one file per preset, named by its name key, parsed strictly."""

import json
from pathlib import Path

import pytest

from memfit.engine import memo
from memfit.engine.errors import EstimateError
from memfit.engine.locate import resources as resources_dir
from memfit.engine.params import count_parameters
from memfit.engine.presets import (
    build_strict,
    gpu_names,
    load_gpu,
    load_model,
    model_names,
)
from memfit.engine.specs import GpuSpec, ModelSpec

FAMILIES = {
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "gpt2",
    "gpt_neox",
    "falcon",
    "olmo",
    "mixtral",
    "qwen3_moe",
    "deepseek_v3",
    "bert",
}


def test_at_least_30_models_covering_every_family() -> None:
    names = model_names()
    assert len(names) >= 30
    assert {load_model(n).family for n in names} >= FAMILIES
    sizes = [count_parameters(load_model(n)).total for n in names]
    assert min(sizes) < 150e6 and max(sizes) > 600e9
    for required in ("llama-3.1-405b", "deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b"):
        assert required in names


def test_at_least_20_gpus_with_design_names() -> None:
    names = set(gpu_names())
    assert len(names) >= 20
    for required in (
        "a100-sxm-40gb",
        "a100-sxm-80gb",
        "h100-pcie-80gb",
        "h100-sxm-80gb",
        "h200-sxm-141gb",
        "b200-sxm-180gb",
        "v100-sxm2-16gb",
        "v100-sxm2-32gb",
        "a10g",
        "l4",
        "l40s",
        "a6000",
        "rtx-3090",
        "rtx-4090",
        "rtx-5090",
        "mi250x",
        "mi300x",
        "mi325x",
        "gaudi3",
    ):
        assert required in names


@pytest.mark.parametrize("kind", ["models", "gpus"])
def test_file_name_is_name_key(kind: str) -> None:
    files = [p for p in (resources_dir() / kind).iterdir() if p.name.endswith(".json")]
    assert files
    for path in files:
        name = path.name.removesuffix(".json")
        assert json.loads(path.read_text(encoding="utf-8"))["name"] == name


def test_gpu_memory_is_what_the_tool_reports_not_marketing() -> None:
    assert load_gpu("h100-sxm-80gb").memory_mib == 81559  # nvidia-smi, not 80 GB = 76,294 MiB
    assert load_gpu("a10g").memory_mib == 23028
    for name in gpu_names():
        g = load_gpu(name)
        assert g.memory_source and g.source
        assert g.fp8_tflops == 0 or g.fp8_tflops >= g.bf16_tflops


def test_unknown_key_fails_loudly() -> None:
    data = json.loads((resources_dir() / "gpus" / "l4.json").read_text(encoding="utf-8"))
    data["memory_gb"] = 24
    with pytest.raises(EstimateError, match=r"gpu\.memory_gb: unknown key"):
        build_strict(GpuSpec, data, "gpu")
    with pytest.raises(EstimateError, match=r"model\.num_layers: missing"):
        build_strict(ModelSpec, {"name": "x"}, "model")


def test_unknown_preset_names_the_field() -> None:
    with pytest.raises(EstimateError, match=r"model\.preset: unknown preset 'llama-9'"):
        load_model("llama-9")
    with pytest.raises(EstimateError, match=r"hardware\.gpu: unknown preset 'h900'"):
        load_gpu("h900")


def test_broken_preset_file_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "bad.json").write_text("{not json")
    monkeypatch.setenv("MEMFIT_RESOURCES", str(tmp_path))
    memo.clear()
    try:
        with pytest.raises(EstimateError, match=r"preset file bad\.json cannot be read"):
            load_model("bad")
    finally:
        memo.clear()


def _validation_configs() -> dict[str, dict[str, object]]:
    """The ``config.json`` of each public checkpoint the validation datasets measured."""
    folder = Path(__file__).resolve().parent.parent / "validation"
    configs: dict[str, dict[str, object]] = {}
    for name in ("dataset.json", "dataset_conventions.json"):
        for record in json.loads((folder / name).read_text()):
            config = record["scenario"]["model"]
            configs.setdefault(str(config["_name_or_path"]), config)
    return configs


#: fields a preset may state apart from its checkpoint's config: names, and the dropout the
#: validation cases set to 0.0 (the presets keep the checkpoint's own)
_NOT_FROM_CONFIG = {"name", "display_name", "source", "family", "num_layers"}
_DROPOUT = {"attention_dropout", "hidden_dropout"}


@pytest.mark.parametrize("name", sorted(set(_validation_configs()) & set(model_names())))
def test_a_preset_reads_as_its_checkpoints_config(name: str) -> None:
    """A preset is the model its source config describes: reading the measured checkpoint's
    ``config.json`` gives the preset's every field (falcon-7b lacked ``sdpa_math``, so its
    SDPA attention was costed as the flash kernel although transformers runs the math
    fallback for it)."""
    from memfit.engine.hf_config import model_from_hf_config

    preset = load_model(name)
    read = model_from_hf_config(_validation_configs()[name])
    differ = {
        f: (getattr(read, f), getattr(preset, f))
        for f in ModelSpec.__dataclass_fields__
        if f not in _NOT_FROM_CONFIG | _DROPOUT and getattr(read, f) != getattr(preset, f)
    }
    assert differ == {}
