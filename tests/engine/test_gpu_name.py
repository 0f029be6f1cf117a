"""A GPU can be named (``hardware.gpu_name``): a custom GPU, or a preset with its memory
overridden. The name is the device's ``display_name``; files keep it, older files read."""

import dataclasses
import re
from pathlib import Path

import pytest

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.presets import load_gpu, load_model
from memfit.engine.report import to_markdown
from memfit.engine.scenario_io import (
    custom_gpu,
    default_gpu_name,
    load_scenario,
    named_gpu,
    save_scenario,
    scenario_from_dict,
    scenario_to_dict,
)
from memfit.engine.specs import GPU_NAME_CHARS, GpuSpec, HardwareSpec, Scenario


def scenario(gpu: GpuSpec, memory_gib: float | None = None) -> Scenario:
    return Scenario(load_model("gpt2"), HardwareSpec(gpu, memory_gib=memory_gib))


def test_a_named_preset_with_an_override_survives_a_file(tmp_path: Path) -> None:
    gpu = named_gpu(load_gpu("h100-sxm-80gb"), "H100 MIG 3g.40gb")
    s = scenario(gpu, memory_gib=39.5)
    data = scenario_to_dict(s)
    assert data["hardware"]["gpu"] == "h100-sxm-80gb"
    assert data["hardware"]["gpu_name"] == "H100 MIG 3g.40gb"
    path = tmp_path / "mig.memfit.json"
    save_scenario(s, path)
    back = load_scenario(path)
    assert back == s
    assert back.hardware.gpu.display_name == "H100 MIG 3g.40gb"


def test_a_named_custom_gpu_survives_a_file(tmp_path: Path) -> None:
    s = scenario(named_gpu(custom_gpu(20.5), "Lab card"), memory_gib=20.5)
    path = tmp_path / "lab.memfit.json"
    save_scenario(s, path)
    back = load_scenario(path)
    assert back.hardware.gpu.display_name == "Lab card"
    assert back.hardware.capacity_bytes == s.hardware.capacity_bytes


def test_the_default_name_is_not_written_and_old_files_read() -> None:
    s = scenario(load_gpu("l4"))
    assert "gpu_name" not in scenario_to_dict(s)["hardware"]
    custom = scenario(custom_gpu(12.0), memory_gib=12.0)
    assert "gpu_name" not in scenario_to_dict(custom)["hardware"]
    old = {"memfit_scenario": 1, "model": {"preset": "gpt2"}, "hardware": {"gpu": "l4"}}
    assert scenario_from_dict(old).hardware.gpu == load_gpu("l4")
    assert default_gpu_name(custom.hardware.gpu) == "Custom GPU (12 GiB)"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "hardware.gpu_name: got 0 characters, expected 1 to 64"),
        ("   ", "hardware.gpu_name: got 0 characters, expected 1 to 64"),
        ("x" * 65, "hardware.gpu_name: got 65 characters, expected 1 to 64"),
        ("a\nb", "hardware.gpu_name"),
        (7, "hardware.gpu_name"),
    ],
)
def test_a_bad_name_is_refused_naming_the_field(name: object, message: str) -> None:
    data = {
        "memfit_scenario": 1,
        "model": {"preset": "gpt2"},
        "hardware": {"gpu": "l4", "gpu_name": name},
    }
    with pytest.raises(EstimateError, match=re.escape(message)):
        scenario_from_dict(data)


def test_a_name_of_64_characters_fits_and_a_longer_display_name_does_not() -> None:
    assert len(named_gpu(load_gpu("l4"), "y" * GPU_NAME_CHARS).display_name) == 64
    with pytest.raises(EstimateError, match=r"^gpu\.display_name"):
        dataclasses.replace(load_gpu("l4"), display_name="z" * 65)


def test_the_name_is_what_reports_call_the_gpu() -> None:
    s = scenario(named_gpu(load_gpu("rtx-4090"), "4090 under a 16 GiB cap"), memory_gib=16.0)
    text = to_markdown(estimate(s))
    assert "4090 under a 16 GiB cap" in text
