"""The memfit command line: JSON shape, tables, overrides and one-line errors."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli import main
from engine.presets import model_names

METHODS = ("full", "lora", "qlora")


def run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(args), out=out)
    return code, out.getvalue()


def write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("model", model_names())
def test_every_preset_with_a_few_methods(model: str, tmp_path: Path) -> None:
    for method in METHODS:
        scenario = write(
            tmp_path / "s.memfit.json",
            {
                "memfit_scenario": 1,
                "model": {"preset": model},
                "hardware": {"gpu": "h100-sxm-80gb"},
                "training": {"method": method, "lora": {"rank": 8, "targets": ["all-linear"]}},
            },
        )
        code, text = run("estimate", "--scenario", str(scenario), "--json")
        assert code == 0
        data = json.loads(text)
        assert data["memfit_estimate"] == 1
        b = data["breakdown"]
        five = (
            b["parameters"]
            + b["gradients"]
            + b["optimizer_states"]
            + b["activations"]
            + b["overhead"]
        )
        assert five == data["device_bytes"]
        assert sum(i["bytes"] for i in b["items"]) == data["device_bytes"]
        assert data["verdict"] in ("fits", "tight", "oom")
        assert data["peak_phase"] in ("forward", "backward", "optimizer")
        assert max(p["bytes"] for p in data["timeline"]) == data["allocated_bytes"] - sum(
            i["bytes"]
            for i in b["items"]
            if i["category"] == "overhead" and i["name"].startswith(("loss", "fp8"))
        )
        assert data["allocated_bytes"] <= data["reserved_bytes"] <= data["device_bytes"]
        assert data["parameters"]["trainable"] <= data["parameters"]["total"]


def test_readable_table_for_the_issue_example() -> None:
    code, text = run(
        "estimate",
        "--model",
        "llama-3-8b",
        "--gpu",
        "h100-sxm-80gb",
        "--method",
        "lora",
        "--rank",
        "16",
        "--precision",
        "bf16-mixed",
        "--optimizer",
        "adamw",
        "--batch",
        "4",
        "--seq",
        "2048",
    )
    assert code == 0
    assert "Llama 3 8B on NVIDIA H100 SXM 80GB" in text
    assert "trainable 6,815,744" in text
    assert "activations" in text and "logits held by the model output" in text
    assert "GiB (2^30 B)" in text


def test_flags_override_the_file(tmp_path: Path) -> None:
    scenario = write(
        tmp_path / "s.memfit.json",
        {
            "memfit_scenario": 1,
            "model": {"preset": "gpt2"},
            "hardware": {"gpu": "l4"},
            "training": {"method": "lora", "lora": {"rank": 4}},
        },
    )
    code, text = run(
        "estimate",
        "--scenario",
        str(scenario),
        "--json",
        "--rank",
        "8",
        "--set",
        'training.lora.targets=["all-linear"]',
        "--set",
        "hardware.utilization_target=0.5",
    )
    assert code == 0
    data = json.loads(text)
    assert data["parameters"]["trainable"] == 12 * 8 * (
        (768 + 2304) + (768 + 768) + (768 + 3072) + (3072 + 768)
    )
    assert data["budget_bytes"] == data["capacity_bytes"] // 2


def test_save_writes_a_scenario_that_loads(tmp_path: Path) -> None:
    target = tmp_path / "out.memfit.json"
    assert run("estimate", "--model", "gpt2", "--gpu", "l4", "--save", str(target))[0] == 0
    code, text = run("estimate", "--scenario", str(target), "--json")
    assert code == 0 and json.loads(text)["parameters"]["total"] == 124_439_808


def test_presets_lists() -> None:
    code, text = run("presets", "models", "--json")
    assert code == 0 and len(json.loads(text)) >= 30
    code, text = run("presets", "gpus")
    assert code == 0 and "h100-sxm-80gb" in text


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--model", "llama-9", "--gpu", "l4"], "model.preset"),
        (["--model", "gpt2", "--gpu", "l4", "--batch", "-1"], "training.micro_batch_size"),
        (
            ["--model", "gpt2", "--gpu", "l4", "--method", "lora", "--rank", "1000"],
            "training.lora.rank",
        ),
        (["--model", "gpt2"], "hardware"),
        (["--model", "gpt2", "--gpu", "l4", "--set", "training.nope=1"], "training.nope"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"memfit: error: {field}:" in err


def test_bad_files_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_json = tmp_path / "x.memfit.json"
    not_json.write_text("this is not json")
    assert main(["estimate", "--scenario", str(not_json)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err
    config = write(tmp_path / "config.json", {"model_type": "llama", "hidden_size": 64})
    assert main(["estimate", "--model-config", str(config), "--gpu", "l4"]) == 2
    assert "model.num_attention_heads: missing from the config" in capsys.readouterr().err
    assert main(["estimate", "--scenario", str(tmp_path / "absent.json")]) == 2
    assert "cannot read absent.json" in capsys.readouterr().err


def test_console_script_has_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine",
            "estimate",
            "--model",
            "gpt2",
            "--gpu",
            "l4",
            "--batch",
            "x",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
