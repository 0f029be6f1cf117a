"""A custom GPU's own figures, and what a power limit or clock share does to the step time."""

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from memfit.engine.cli import time_lines
from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.presets import gpu_names, load_gpu
from memfit.engine.scenario_io import (
    CUSTOM_GPU_KEYS,
    custom_gpu,
    load_scenario,
    resized_custom_gpu,
    save_scenario,
    scenario_from_dict,
    scenario_to_dict,
)
from memfit.engine.specs import Scenario
from memfit.engine.steptime import (
    SM_FIXED_POWER_SHARE,
    device,
    device_notes,
    step_time,
    sustained_clock,
)

H100 = load_gpu("h100-sxm-80gb")
#: the H100 SXM's figures as a custom GPU gives them
H100_FIGURES: dict[str, Any] = {
    "architecture": "hopper",
    "bf16_tflops": H100.bf16_tflops,
    "fp16_tflops": H100.fp16_tflops,
    "fp8_tflops": H100.fp8_tflops,
    "fp32_tflops": H100.fp32_tflops,
    "memory_bandwidth_gb_s": H100.memory_bandwidth_gb_s,
    "interconnect_gb_s": H100.interconnect_gb_s,
    "host_link": H100.host_link,
}
#: compute-bound: Llama-3-8B at 4,096 tokens on one H100 is bound by its matmuls
LLAMA = {"preset": "llama-3-8b"}
LONG = {"sequence_length": 4096}
#: memory-bound: GPT-2 at one 128-token sequence is bound by bandwidth and launches
GPT2 = {"preset": "gpt2"}
SHORT = {"sequence_length": 128, "micro_batch_size": 1}


def scenario(hardware: dict[str, Any], model: Any = None, training: Any = None) -> Scenario:
    return scenario_from_dict(
        {
            "memfit_scenario": 1,
            "model": model or LLAMA,
            "hardware": hardware,
            "training": training or LONG,
        }
    )


def h100_as_custom(**extra: Any) -> dict[str, Any]:
    return {"gpu": "custom", "memory_gib": H100.memory_mib / 1024, **H100_FIGURES, **extra}


@pytest.mark.parametrize(
    "training",
    [
        LONG,
        {"sequence_length": 2048, "precision": "fp8-mixed"},
        {"sequence_length": 2048, "precision": "fp32"},
        {"sequence_length": 1024, "parallelism": {"zero_stage": 3}},
    ],
)
def test_a_custom_gpu_with_the_h100s_figures_is_the_h100(training: dict[str, Any]) -> None:
    gpus = 8 if "parallelism" in training else 1
    preset = scenario({"gpu": "h100-sxm-80gb", "gpus_per_node": gpus}, training=training)
    custom = scenario(h100_as_custom(gpus_per_node=gpus), training=training)
    assert custom.hardware.gpu.assumed == ()
    assert step_time(custom).step_time_s == step_time(preset).step_time_s
    assert step_time(custom).terms == step_time(preset).terms
    assert estimate(custom).device_bytes == estimate(preset).device_bytes
    assert estimate(custom).time.assumptions == estimate(preset).time.assumptions


def test_a_custom_gpu_without_figures_says_its_step_time_is_assumed() -> None:
    s = scenario({"gpu": "custom", "memory_gib": 80})
    gpu = s.hardware.gpu
    # the memory model keeps its generic rows, as before; the peaks are the H100's
    assert gpu.architecture == "unknown"
    assert gpu.bf16_tflops == H100.bf16_tflops
    assert set(gpu.assumed) >= {"bf16_tflops", "memory_bandwidth_gb_s", "interconnect_gb_s"}
    notes = estimate(s).time.assumptions
    assert any("assumed device" in n and "NVIDIA H100 SXM 80GB" in n for n in notes)
    assert any("no architecture given" in n for n in notes)
    text = "\n".join(time_lines(estimate(s).time))
    assert "assumed: Custom GPU (80 GiB): step time of an assumed device" in text
    # the step time is the H100's at the generic efficiencies: a real figure, not 1 TFLOP/s
    h100 = step_time(scenario({"gpu": "h100-sxm-80gb"})).step_time_s
    assert 0.8 < step_time(s).step_time_s / h100 < 1.25
    # a file that gave only memory writes no figures back
    assert set(scenario_to_dict(s)["hardware"]) & set(CUSTOM_GPU_KEYS) == set()


def test_a_16_bit_peak_carries_to_the_others_and_sets_the_time() -> None:
    gpu = custom_gpu(40.0, bf16_tflops=312.0, memory_bandwidth_gb_s=1555.0)
    assert gpu.fp16_tflops == 312.0
    assert gpu.fp8_tflops == H100.fp8_tflops * 312.0 / H100.bf16_tflops
    assert gpu.fp32_tflops == H100.fp32_tflops * 312.0 / H100.bf16_tflops
    assert gpu.assumed == (
        "fp16_tflops",
        "fp8_tflops",
        "fp32_tflops",
        "interconnect_gb_s",
        "host_link",
    )
    fp16 = custom_gpu(40.0, fp16_tflops=100.0)
    assert (fp16.bf16_tflops, fp16.fp16_tflops) == (100.0, 100.0)
    # half the H100's peaks (as an H100 otherwise): matmul-bound steps take longer
    half = {k: v / 2 for k, v in H100_FIGURES.items() if k.endswith("tflops")}
    slow = scenario(h100_as_custom(**half))
    fast = scenario(h100_as_custom())
    assert device(slow).matmul_flops == device(fast).matmul_flops / 2
    assert 1.5 < step_time(slow).step_time_s / step_time(fast).step_time_s < 2.0
    # a node's GPUs with no NVLink talk over the host link
    none = scenario(h100_as_custom(interconnect_gb_s=0, host_link="pcie-gen4", gpus_per_node=8))
    assert none.hardware.gpu.host_link_gb_s == 32.0
    assert device(none).intra == device(scenario({**h100_as_custom(), "gpus_per_node": 8})).host / 2


@pytest.mark.parametrize(
    "hardware",
    [
        h100_as_custom(),
        {"gpu": "custom", "memory_gib": 24, "bf16_tflops": 165.2},
        {"gpu": "custom", "memory_gib": 24, "host_link_gb_s": 25.0, "tdp_w": 450},
        {"gpu": "custom", "memory_gib": 24, "host_link": "pcie-gen4", "host_link_gb_s": 25.0},
        {"gpu": "custom", "memory_gib": 24, "host_link": "nvlink-c2c"},
        {"gpu": "custom", "memory_gib": 40, "architecture": "cdna3", "interconnect_gb_s": 0},
        {"gpu": "custom", "memory_gib": 24, "tdp_w": 450, "power_limit_w": 300},
        {"gpu": "custom", "memory_gib": 24, "clock_share": 0.75},
        {"gpu": "custom", "memory_gib": 24, "gpu_name": "MIG 3g.40gb", "fp8_tflops": 0},
        {"gpu": "h100-sxm-80gb", "power_limit_w": 450},
        {"gpu": "l4", "clock_share": 0.9},
    ],
)
def test_the_figures_round_trip_through_a_file(hardware: dict[str, Any], tmp_path: Path) -> None:
    s = scenario(hardware)
    path = tmp_path / "gpu.memfit.json"
    save_scenario(s, path)
    assert load_scenario(path) == s
    written = json.loads(path.read_text())["hardware"]
    for key, value in hardware.items():
        if key != "memory_gib":
            assert written[key] == value, key


def test_an_older_file_loads_as_before() -> None:
    s = scenario({"gpu": "h100-sxm-80gb", "gpus_per_node": 8})
    assert (s.hardware.power_limit_w, s.hardware.clock_share) == (None, None)
    assert sustained_clock(s) == 1.0
    assert device_notes(s) == ()
    written = scenario_to_dict(s)["hardware"]
    assert "power_limit_w" not in written and "clock_share" not in written


def test_resizing_a_custom_gpu_keeps_its_figures() -> None:
    gpu = custom_gpu(24.0, bf16_tflops=165.2, tdp_w=450)
    bigger = resized_custom_gpu(gpu, 48.0)
    assert bigger.display_name == "Custom GPU (48 GiB)"
    assert (bigger.bf16_tflops, bigger.tdp_w, bigger.assumed) == (165.2, 450, gpu.assumed)
    named = resized_custom_gpu(dataclasses.replace(gpu, display_name="my card"), 48.0)
    assert named.display_name == "my card"


@pytest.mark.parametrize(
    ("hardware", "message"),
    [
        (
            {"bf16_tflops": -1},
            r"hardware\.bf16_tflops: got -1, expected a number in \[0\.001, 1e\+06\]",
        ),
        ({"fp32_tflops": "67"}, r"hardware\.fp32_tflops: got '67', expected a number in"),
        ({"fp8_tflops": True}, r"hardware\.fp8_tflops: got True, expected a number"),
        ({"memory_bandwidth_gb_s": 0.5}, r"hardware\.memory_bandwidth_gb_s: .*\[1, 1e\+06\]"),
        ({"interconnect_gb_s": -900}, r"hardware\.interconnect_gb_s: .*\[0, 100000\]"),
        ({"host_link_gb_s": 0}, r"hardware\.host_link_gb_s: .*\[1, 100000\]"),
        ({"host_link": "pcie5"}, r"hardware\.host_link: got 'pcie5', expected one of pcie-gen3"),
        (
            {"architecture": "pascal"},
            r"hardware\.architecture: got 'pascal', expected one of volta",
        ),
        ({"tdp_w": 1e9}, r"hardware\.tdp_w: .*\[10, 5000\]"),
        ({"power_limit_w": 300}, r"hardware\.power_limit_w: Custom GPU \(24 GiB\) has no TDP"),
        (
            {"tdp_w": 450, "power_limit_w": 100},
            r"expected a number in \[157\.5, 450\] W: 35 to 100 % of the 450 W TDP",
        ),
        ({"clock_share": 0}, r"hardware\.clock_share: got 0, expected a number in \[0\.2, 1\]"),
        ({"clock_share": 1.2}, r"hardware\.clock_share: got 1\.2"),
        ({"tdp_w": 450, "power_limit_w": 400, "clock_share": 0.9}, r"not both"),
    ],
)
def test_bad_figures_name_the_field_and_range(hardware: dict[str, Any], message: str) -> None:
    with pytest.raises(EstimateError, match=message):
        scenario({"gpu": "custom", "memory_gib": 24, **hardware})


@pytest.mark.parametrize(
    ("hardware", "message"),
    [
        (
            {"gpu": "h100-sxm-80gb", "bf16_tflops": 1000},
            r"hardware\.bf16_tflops: only a custom GPU",
        ),
        (
            {"gpu": "h100-sxm-80gb", "power_limit_w": 800},
            r"in \[245, 700\] W: 35 to 100 % of the 700 W TDP of NVIDIA H100 SXM",
        ),
        ({"gpu": "h100-sxm-80gb", "power_limit_w": 200}, r"hardware\.power_limit_w: got 200"),
        (
            {"gpu": "a10g", "power_limit_w": 200},
            r"NVIDIA A10G .* has no TDP on record; give hardware\.clock_share",
        ),
    ],
)
def test_a_presets_figures_are_its_own(hardware: dict[str, Any], message: str) -> None:
    with pytest.raises(EstimateError, match=message):
        scenario(hardware)


def test_presets_cite_their_tdp() -> None:
    with_tdp = [load_gpu(n) for n in gpu_names() if load_gpu(n).tdp_w is not None]
    assert {g.name for g in with_tdp} >= {"h100-sxm-80gb", "h200-sxm-141gb", "a100-sxm-80gb"}
    assert all(g.tdp_source for g in with_tdp)
    assert load_gpu("h100-sxm-80gb").tdp_w == 700.0


def test_the_clock_follows_the_cube_root_of_the_dynamic_power() -> None:
    s = scenario({"gpu": "h100-sxm-80gb", "power_limit_w": 500})
    fixed = SM_FIXED_POWER_SHARE * 700
    assert sustained_clock(s) == pytest.approx(((500 - fixed) / (700 - fixed)) ** (1 / 3))
    assert sustained_clock(s) == pytest.approx(0.840, abs=5e-4)
    watts = [250, 300, 400, 500, 600, 700]
    clocks = [
        sustained_clock(scenario({"gpu": "h100-sxm-80gb", "power_limit_w": w})) for w in watts
    ]
    assert clocks == sorted(clocks) and clocks[-1] == 1.0


def test_a_power_limit_slows_compute_bound_steps() -> None:
    stock = scenario({"gpu": "h100-sxm-80gb"})
    capped = scenario({"gpu": "h100-sxm-80gb", "power_limit_w": 500})
    clock = sustained_clock(capped)
    d0, d1 = device(stock), device(capped)
    assert d1.matmul_flops == d0.matmul_flops * clock
    assert d1.attention_flops == d0.attention_flops * clock
    assert d1.fp32_flops == d0.fp32_flops * clock
    assert (d1.bandwidth, d1.intra, d1.host, d1.peak_flops) == (
        d0.bandwidth,
        d0.intra,
        d0.host,
        d0.peak_flops,
    )
    t0, t1 = step_time(stock), step_time(capped)
    assert t0.bound == "compute"
    # the matmuls take 1/clock as long; the step's memory-bound part does not
    assert 1.05 < t1.step_time_s / t0.step_time_s < 1 / clock
    assert t1.mfu < t0.mfu  # MFU stays against the datasheet peak
    notes = estimate(capped).time.assumptions
    assert any("SM clock 84.0 %" in n and "500 W of the 700 W TDP" in n for n in notes)


def test_a_power_limit_leaves_memory_bound_steps_alone() -> None:
    stock = scenario({"gpu": "h100-sxm-80gb"}, model=GPT2, training=SHORT)
    capped = scenario({"gpu": "h100-sxm-80gb", "power_limit_w": 400}, model=GPT2, training=SHORT)
    assert step_time(stock).bound == "memory_bandwidth"
    assert step_time(capped).step_time_s == step_time(stock).step_time_s


def test_a_cap_at_the_tdp_and_a_full_clock_share_change_nothing() -> None:
    stock = step_time(scenario({"gpu": "h100-sxm-80gb"}))
    for hardware in ({"power_limit_w": 700}, {"clock_share": 1.0}):
        t = step_time(scenario({"gpu": "h100-sxm-80gb", **hardware}))
        assert t.step_time_s == stock.step_time_s


def test_a_clock_share_scales_the_compute_rates() -> None:
    s = scenario({"gpu": "h100-sxm-80gb", "clock_share": 0.75})
    assert device(s).matmul_flops == device(scenario({"gpu": "h100-sxm-80gb"})).matmul_flops * 0.75
    assert any("SM clock 75.0 %" in n for n in estimate(s).time.assumptions)


def test_another_gpu_drops_the_boards_power_limit() -> None:
    from memfit.engine.solve import hardware_with

    own = scenario({"gpu": "h100-sxm-80gb", "power_limit_w": 500})
    assert hardware_with(own, "h100-sxm-80gb") == own
    other = hardware_with(own, "l40s").hardware  # 500 W is beyond the L40S's 350 W TDP
    assert (other.gpu.name, other.power_limit_w, other.clock_share) == ("l40s", None, None)
    clocked = hardware_with(scenario({"gpu": "l4", "clock_share": 0.8}), "a10g").hardware
    assert clocked.clock_share is None
