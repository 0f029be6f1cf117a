"""The memfit command line: JSON shape, tables, overrides and one-line errors."""

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memfit.engine.cli import main
from memfit.engine.presets import model_names

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
        "--stack",
        "accelerate-loop",
    )
    assert code == 0
    assert "Llama 3 8B on NVIDIA H100 SXM 80GB" in text
    assert "trainable 6,815,744" in text
    assert 'Stack        accelerate-loop: model_implementation="transformers"' in text
    assert "outputs_held_through_backward=true" in text
    assert "activations" in text and "model output held by the loop" in text
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
            "memfit.engine",
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


def test_version_is_printed() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "memfit.engine", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0
    assert re.fullmatch(r"MemFit \d+\.\d+\.\d+\S*\n", proc.stdout), proc.stdout


def test_the_version_is_read_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command reads no package metadata (it takes about 9 ms); ``--version`` reads it
    and prints it as argparse's version action does, exit code 0."""
    from memfit.engine import cli

    asked: list[bool] = []

    def version() -> str:
        asked.append(True)
        return "1.2.3"

    monkeypatch.setattr(cli, "version", version)
    out = io.StringIO()
    assert main(["presets", "gpus"], out=out) == 0
    assert asked == []
    with pytest.raises(SystemExit) as exit_:
        cli.make_parser().parse_args(["--version"])
    assert exit_.value.code in (0, None) and asked == [True]
    assert capsys.readouterr().out == "MemFit 1.2.3\n"
    assert "--version" in cli.make_parser().format_help()


PIPELINE = (
    "estimate",
    "--model",
    "llama-3.1-70b",
    "--gpu",
    "h100-sxm-80gb",
    "--gpus-per-node",
    "8",
    "--nodes",
    "2",
    "--method",
    "full",
    "--seq",
    "4096",
    "--grad-accum",
    "8",
    "--checkpointing",
    "full",
    "--tp",
    "8",
    "--pp",
    "2",
    "--zero",
    "1",
)
OFFLOAD = (
    "estimate",
    "--model",
    "llama-3-8b",
    "--gpu",
    "h100-sxm-80gb",
    "--gpus-per-node",
    "8",
    "--method",
    "full",
    "--zero",
    "3",
    "--offload-optimizer",
    "cpu",
    "--offload-parameters",
    "cpu",
)


def gib(n: int) -> str:
    return f"{n / 2**30:,.2f}"


def test_per_rank_table_marks_the_worst_group() -> None:
    code, text = run(*PIPELINE, "--set", "training.parallelism.sequence_parallel=true")
    assert code == 0
    data = json.loads(run(*PIPELINE, "--sequence-parallel", "--json")[1])
    assert "mesh: world 16 = tp 8 x pp 2 x cp 1 x dp 1 | vpp 1 (1f1b) | ZeRO shard" in text
    lines = text.splitlines()
    assert "Per rank group, per GPU, GiB (2^30 B)" in lines
    rows = {
        line[2:].split("  ")[0]: line
        for line in lines
        if line[2:].startswith("pp stage") and line[:2] in ("* ", "  ")
    }
    assert len(data["ranks"]) == 2 and set(rows) == {r["group"] for r in data["ranks"]}
    for rank in data["ranks"]:
        line = rows[rank["group"]]
        assert line.startswith("* ") == (rank["group"] == data["worst_group"])
        numbers = line.split()[-5:]
        assert numbers == [
            gib(rank["allocated_bytes"]),
            gib(rank["reserved_bytes"]),
            gib(rank["device_bytes"]),
            "optimizer" if rank["peak_phase"] == "before" else rank["peak_phase"],
            gib(rank["host_bytes"]),
        ]
    assert f"(the worst rank group: {data['worst_group']})" in text
    assert "host RAM" not in text  # no offload and no host figure


def test_single_gpu_has_no_rank_table() -> None:
    code, text = run("estimate", "--model", "gpt2", "--gpu", "l4")
    assert code == 0
    assert "mesh:" not in text and "Per rank group" not in text and "host RAM" not in text


def test_one_node_of_eight_gets_the_table_and_host_ram() -> None:
    code, text = run(*OFFLOAD, "--set", "hardware.host_memory_gib=512")
    assert code == 0
    data = json.loads(run(*OFFLOAD, "--host-memory-gib", "512", "--json")[1])
    assert "mesh: world 8 = tp 1 x pp 1 x cp 1 x dp 8 | vpp 1 | ZeRO shard group 8" in text
    assert any(line.startswith("* all ranks") for line in text.splitlines())
    per_node = data["host"]["per_node_bytes"]
    assert per_node == 8 * data["ranks"][0]["host_bytes"] > 0
    assert f"host RAM per node (offload){gib(per_node):>41}   8 GPUs x" in text
    assert f"host RAM per node (given){gib(512 * 2**30):>43}" in text
    assert data["host"] == {
        "per_node_bytes": per_node,
        "capacity_bytes": 512 * 2**30,
        "verdict": "fits",
    }
    assert text.rstrip().endswith("host verdict: FITS")


@pytest.mark.parametrize(
    ("args", "verdict"),
    [
        (["--host-memory-gib", "64"], "OOM"),
        ([], "UNKNOWN"),
    ],
)
def test_host_verdict_oom_and_unknown(args: list[str], verdict: str) -> None:
    code, text = run(*OFFLOAD, *args)
    assert code == 0 and f"host verdict: {verdict}" in text
    if verdict == "UNKNOWN":
        assert "give it with --host-memory-gib N" in text


def test_host_ram_given_without_offload_is_shown() -> None:
    code, text = run("estimate", "--model", "gpt2", "--gpu", "l4", "--host-memory-gib", "64")
    assert code == 0 and "host verdict: FITS" in text


def test_set_reaches_the_new_fields(tmp_path: Path) -> None:
    saved = tmp_path / "s.memfit.json"
    code, _text = run(
        *PIPELINE,
        "--set",
        "training.parallelism.pp_schedule=gpipe",
        "--set",
        "hardware.host_memory_gib=512",
        "--set",
        "training.parallelism.sequence_parallel=true",
        "--set",
        "training.parallelism.framework=megatron",
        "--set",
        "training.offload.activations=cpu",
        "--save",
        str(saved),
    )
    assert code == 0
    data = json.loads(saved.read_text())
    par = data["training"]["parallelism"]
    assert (par["pp_schedule"], par["sequence_parallel"], par["framework"]) == (
        "gpipe",
        True,
        "megatron",
    )
    assert data["hardware"]["host_memory_gib"] == 512
    assert data["training"]["offload"]["activations"] == "cpu"
    # GPipe keeps all 8 micro-batches of the last stage: more than 1F1B's one
    gpipe = json.loads(run(*PIPELINE, "--pp-schedule", "gpipe", "--json")[1])
    one_f = json.loads(run(*PIPELINE, "--json")[1])
    last = [r["breakdown"]["activations"] for r in (gpipe["ranks"][1], one_f["ranks"][1])]
    assert last[0] > last[1]
    code, text = run(*PIPELINE, "--pp-schedule", "interleaved-1f1b", "--vpp", "2")
    assert code == 0 and "vpp 2 (interleaved-1f1b)" in text


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--set", "training.parallelism.vpp=2"], "training.parallelism.vpp"),
        (["--pp-schedule", "interleaved-1f1b", "--vpp", "3"], "training.parallelism.vpp"),
        (["--set", "training.parallelism.pp_schedule=zigzag"], "training.parallelism.pp_schedule"),
        (
            ["--set", "training.parallelism.sequence_parallel=maybe"],
            "training.parallelism.sequence_parallel",
        ),
        (["--set", "training.parallelism.framework=jax"], "training.parallelism.framework"),
        (["--set", "hardware.host_memory_gib=0"], "hardware.host_memory_gib"),
        (
            ["--set", "training.parallelism.expert_capacity_factor=0.5"],
            "training.parallelism.expert_capacity_factor",
        ),
        (
            ["--offload-activations", "cpu", "--checkpointing", "none"],
            "training.offload.activations",
        ),
        (["--zero", "0", "--hybrid-shard"], "training.parallelism.hybrid_shard"),
        (["--nodes", "3"], "training.parallelism"),
    ],
)
def test_bad_multi_gpu_values_are_one_line_and_exit_2(
    args: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*PIPELINE, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"memfit: error: {field}:" in err


def test_a_command_runs_with_the_cycle_collector_off_and_leaves_it_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The collector's passes cost a planning command about a sixth of its time and free
    almost nothing: off while a command runs, back as it was after (an error too)."""
    import gc

    from memfit.engine import cli

    seen: list[bool] = []
    real = cli._main

    def spy(*args: object) -> int:
        seen.append(gc.isenabled())
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(cli, "_main", spy)
    assert gc.isenabled()
    assert (
        cli.main(["estimate", "--model", "gpt2", "--gpu", "h100-sxm-80gb"], out=io.StringIO()) == 0
    )
    assert cli.main(["estimate", "--model", "gpt2", "--gpu", "no-such-gpu"], out=io.StringIO()) == 2
    assert seen == [False, False] and gc.isenabled()
    # what the command made is not walked at once: the young generation is empty
    assert gc.get_count()[0] < 100 and gc.get_freeze_count() == 0
    gc.disable()
    try:
        cli.main(["estimate", "--model", "gpt2", "--gpu", "h100-sxm-80gb"], out=io.StringIO())
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_command_line_starts_without_the_readers_its_command_does_not_use() -> None:
    """A planning command starts in about a quarter of a second, of which the imports
    are most: the training-config importers (and YAML), the checkpoint and hub-cache
    readers, the explainer, the size axis, the comparison and the package metadata are
    imported by the commands that use them, not by every start."""
    code = (
        "import sys, memfit.engine.cli; "
        "print(' '.join(m for m in sys.modules if m.startswith(('yaml', 'email', 'memfit'))))"
    )
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())  # fmt: skip
    later = {
        "yaml",
        "email",
        "memfit.engine.train_configs",
        "memfit.engine.imports",
        "memfit.engine.checkpoint",
        "memfit.engine.hub_cache",
        "memfit.engine.explain",
        "memfit.engine.scaling",
        "memfit.engine.compare",
    }
    assert "memfit.engine.sweep" in loaded
    assert not loaded & later, sorted(loaded & later)
