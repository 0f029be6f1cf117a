"""A custom GPU, or a preset with its memory overridden, can be named in the Hardware
panel; the name is what the chart, exports and the saved scenario call the device."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QComboBox, QLineEdit
from pytestqt.qtbot import QtBot

from memfit.engine.report import to_markdown
from memfit.engine.scenario_io import load_scenario
from memfit.gui.chart import scenario_caption
from memfit.gui.main_window import MainWindow


def gpu_combo(window: MainWindow) -> QComboBox:
    return window.hardware_panel.gpu


def name_field(window: MainWindow) -> QLineEdit:
    return window.hardware_panel.gpu_name


def choose(combo: QComboBox, data: str) -> None:
    """Pick the item of ``data`` as a user does (the change, then ``activated``)."""
    index = combo.findData(data)
    assert index >= 0, data
    combo.setCurrentIndex(index)
    combo.activated.emit(index)


def type_name(qtbot: QtBot, field: QLineEdit, text: str) -> None:
    field.selectAll()
    qtbot.keyClicks(field, text) if text else field.clear()
    qtbot.keyClick(field, Qt.Key.Key_Return)


def test_a_custom_gpu_is_chosen_and_named(window: MainWindow, qtbot: QtBot) -> None:
    before = window.store.scenario.hardware.capacity_bytes
    window.hardware_panel.more.set_expanded(False)
    choose(gpu_combo(window), "custom")
    hw = window.store.scenario.hardware
    assert hw.gpu.name == "custom" and hw.memory_gib == round(before / 2**30, 1)
    assert window.hardware_panel.more.is_expanded()  # its memory and name are there
    field = name_field(window)
    assert field.isVisible() and field.placeholderText().startswith("Custom GPU (")
    type_name(qtbot, field, "Lab card 24G")
    hw = window.store.scenario.hardware
    assert hw.gpu.display_name == "Lab card 24G"
    assert gpu_combo(window).currentText().startswith("Lab card 24G (")
    est = window.store.estimate
    assert est is not None
    assert "1 x Lab card 24G" in scenario_caption(est)
    assert "Lab card 24G" in to_markdown(est)
    assert window.chart.capacity_line.label.format.startswith("Lab card 24G capacity")
    assert "named Lab card 24G" in window.hardware_panel.more.summary.text()


def test_a_preset_with_an_override_is_named_and_keeps_it_through_a_file(
    window: MainWindow, qtbot: QtBot, tmp_path: Path
) -> None:
    window.hardware_panel.more.set_expanded(True)
    window.hardware_panel.rows["hardware.memory_gib"].widget.setValue(39.5)
    type_name(qtbot, name_field(window), "H100 MIG 3g.40gb")
    hw = window.store.scenario.hardware
    assert hw.gpu.name == "h100-sxm-80gb" and hw.gpu.display_name == "H100 MIG 3g.40gb"
    assert gpu_combo(window).currentText() == "H100 MIG 3g.40gb (39.5 GiB)"
    path = tmp_path / "mig.memfit.json"
    assert window.save_to(path)
    assert load_scenario(path).hardware.gpu.display_name == "H100 MIG 3g.40gb"
    choose(gpu_combo(window), "l4")  # something else before the file is opened again
    assert window.store.scenario.hardware.gpu.name == "l4"
    assert window.open_path(path)
    assert window.store.scenario.hardware.gpu.display_name == "H100 MIG 3g.40gb"
    assert name_field(window).text() == "H100 MIG 3g.40gb"
    # another preset is another device: its own name, the override kept
    choose(gpu_combo(window), "a100-sxm-80gb")
    hw = window.store.scenario.hardware
    assert hw.gpu.display_name.startswith("NVIDIA A100") and hw.memory_gib == 39.5
    assert name_field(window).text() == ""
    combo = gpu_combo(window)
    h100 = combo.itemText(combo.findData("h100-sxm-80gb"))
    assert h100.startswith("H100 SXM 80GB (")  # the other items keep the preset's text


def test_an_empty_name_gives_the_own_name_back(window: MainWindow, qtbot: QtBot) -> None:
    window.hardware_panel.more.set_expanded(True)
    own = window.store.scenario.hardware.gpu.display_name
    type_name(qtbot, name_field(window), "Mine")
    assert window.store.scenario.hardware.gpu.display_name == "Mine"
    type_name(qtbot, name_field(window), "")
    assert window.store.scenario.hardware.gpu.display_name == own
    assert name_field(window).placeholderText() == own


def test_a_name_the_engine_refuses_stays_in_its_field_with_the_message(
    window: MainWindow,
) -> None:
    window.hardware_panel.more.set_expanded(True)
    before = window.store.scenario
    assert name_field(window).maxLength() == 64
    row = window.hardware_panel.rows["hardware.gpu_name"]
    row.widget.setText("GPU\tname")  # a pasted tab: a control character
    window.hardware_panel.commit(row, row.widget.text())
    assert window.store.scenario == before
    assert not row.error.isHidden() and "control character" in row.error.text()
    assert row.widget.text() == "GPU\tname"
    window.hardware_panel.commit(row, "   ")  # spaces only: no name, the own one back
    assert window.store.scenario == before and row.error.isHidden()


def test_leaving_a_custom_gpu_drops_its_memory(window: MainWindow) -> None:
    choose(gpu_combo(window), "custom")
    choose(gpu_combo(window), "l4")
    hw = window.store.scenario.hardware
    assert hw.gpu.name == "l4" and hw.memory_gib is None
    combo = gpu_combo(window)
    assert combo.itemText(combo.findData("custom")) == "Custom GPU (no preset)"


def test_the_status_summary_names_the_gpu(window: MainWindow, qtbot: QtBot) -> None:
    window.hardware_panel.more.set_expanded(True)
    type_name(qtbot, name_field(window), "Rack 7 card")
    tip = QTextDocument()
    tip.setHtml(window.summary.toolTip())  # rich text, the name in it escaped
    assert tip.toPlainText().startswith("Per GPU of Rack 7 card:")
