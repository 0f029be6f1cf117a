"""A custom GPU's peaks, and a power limit or clock share, are edited in the Hardware panel."""

from __future__ import annotations

from PySide6.QtWidgets import QDoubleSpinBox

from memfit.engine.scenario_io import scenario_from_dict
from memfit.gui.panels import HardwarePanel
from memfit.gui.store import ScenarioStore


def panel_for(hardware: dict[str, object]) -> tuple[HardwarePanel, ScenarioStore]:
    data = {"memfit_scenario": 1, "model": {"preset": "gpt2"}, "hardware": hardware}
    store = ScenarioStore(scenario_from_dict(data))
    panel = HardwarePanel(store)
    panel.more.set_expanded(True)
    return panel, store


def spin(panel: HardwarePanel, path: str) -> QDoubleSpinBox:
    widget = panel.rows[path].widget
    assert isinstance(widget, QDoubleSpinBox)
    return widget


def test_a_custom_gpus_peaks_are_given_and_taken_back(qtbot: object) -> None:
    panel, store = panel_for({"gpu": "custom", "memory_gib": 40})
    bf16 = spin(panel, "hardware.bf16_tflops")
    assert bf16.value() == 0.0 and bf16.specialValueText() == "H100's (assumed)"
    assert "peaks assumed" in panel.more.summary.text()
    bf16.setValue(312.0)
    gpu = store.scenario.hardware.gpu
    assert (gpu.bf16_tflops, gpu.fp16_tflops) == (312.0, 312.0)
    assert "bf16_tflops" not in gpu.assumed
    panel.rows["hardware.architecture"].widget.setCurrentIndex(  # type: ignore[attr-defined]
        panel.rows["hardware.architecture"].widget.findData("ampere")  # type: ignore[attr-defined]
    )
    assert store.scenario.hardware.gpu.architecture == "ampere"
    assert store.scenario.hardware.gpu.bf16_tflops == 312.0  # one figure kept beside another
    bf16.setValue(0.0)
    assert "bf16_tflops" in store.scenario.hardware.gpu.assumed
    # changing the memory keeps the figures
    spin(panel, "hardware.memory_gib").setValue(48.0)
    assert store.scenario.hardware.gpu.architecture == "ampere"


def test_a_presets_figures_are_hidden(qtbot: object) -> None:
    panel, _ = panel_for({"gpu": "h100-sxm-80gb"})
    for key in ("architecture", "bf16_tflops", "memory_bandwidth_gb_s", "tdp_w"):
        assert not panel.rows[f"hardware.{key}"].widget.isVisibleTo(panel)
    panel, _ = panel_for({"gpu": "custom", "memory_gib": 40})
    assert panel.rows["hardware.bf16_tflops"].widget.isVisibleTo(panel)


def test_a_power_limit_out_of_range_is_named_and_not_stored(qtbot: object) -> None:
    panel, store = panel_for({"gpu": "h100-sxm-80gb"})
    power = spin(panel, "hardware.power_limit_w")
    assert power.specialValueText() == "stock (700 W TDP)"
    power.setValue(500.0)
    assert store.scenario.hardware.power_limit_w == 500.0
    assert "capped at 500 W" in panel.more.summary.text()
    power.setValue(900.0)
    assert store.scenario.hardware.power_limit_w == 500.0
    error = panel.rows["hardware.power_limit_w"].error
    assert not error.isHidden() and "[245, 700] W" in error.text()


def test_switching_to_a_gpu_without_a_tdp_drops_the_power_limit(qtbot: object) -> None:
    panel, store = panel_for({"gpu": "h100-sxm-80gb", "power_limit_w": 600})
    panel.gpu.setCurrentIndex(panel.gpu.findData("a10g"))
    assert store.scenario.hardware.gpu.name == "a10g"
    assert store.scenario.hardware.power_limit_w is None
    assert not spin(panel, "hardware.power_limit_w").isEnabled()
    clock = spin(panel, "hardware.clock_share")
    clock.setValue(80.0)
    assert store.scenario.hardware.clock_share == 0.8
