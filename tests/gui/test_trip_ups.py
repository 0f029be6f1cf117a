"""What a new user tripped on: the wheel over a form, Undo and Redo keys in a field.

* the wheel changes a field only while it has the keyboard focus; over any other field it
  scrolls the form (it changed LoRA rank, precision and sequence length as the form scrolled);
* Redo's keys are each registered once (Ctrl+Shift+Z was twice on Linux: "ambiguous
  shortcut", never fired), and no two of the window's actions share a key;
* Ctrl+Z and Redo in a field are the window's Undo and Redo (the field's own text undo
  took them and nothing happened), and Ctrl+Z after a rejected value discards it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QKeySequence, QValidator, QWheelEvent
from PySide6.QtTest import QTest
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QFileDialog,
    QLabel,
    QSpinBox,
    QWidget,
)
from pytestqt.qtbot import QtBot

from memfit.engine.report import scenario_line
from memfit.engine.scenario_io import load_scenario, save_scenario
from memfit.gui.chart import baseline_summary, scenario_caption
from memfit.gui.forms import CountBox, redo_keys
from memfit.gui.importing import ModelBrowser
from memfit.gui.main_window import MainWindow, NoticeBar
from tests.engine.test_imports import cached
from tests.gui.helpers import accept_first_row, type_into

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
TRAIN_CONFIGS = FIXTURES.parent / "train_configs"


def wheel(widget: QWidget, clicks: int = 1) -> None:
    """One notch (or ``clicks``) of the wheel up over the middle of ``widget``."""
    centre = QPointF(widget.rect().center())
    event = QWheelEvent(
        centre,
        QPointF(widget.mapToGlobal(centre.toPoint())),
        QPoint(0, 0),
        QPoint(0, 120 * clicks),
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(widget, event)


def rank_box(window: MainWindow) -> QSpinBox:
    box = window.training_panel.rows["training.lora.rank"].widget
    assert isinstance(box, QSpinBox)
    return box


def lora_on(window: MainWindow) -> None:
    method = window.training_panel.rows["training.method"].widget
    assert isinstance(method, QComboBox)
    method.setCurrentIndex(method.findData("lora"))
    assert window.store.scenario.training.method == "lora"


def test_the_wheel_over_an_unfocused_field_scrolls_the_form(
    window: MainWindow, qtbot: QtBot
) -> None:
    lora_on(window)
    window.resize(1280, 500)  # a form taller than its column: it scrolls
    box = rank_box(window)
    bar = window.column_scroll.verticalScrollBar()
    assert bar.maximum() > 0
    bar.setValue(bar.maximum() // 2)
    window.column_scroll.ensureWidgetVisible(box)
    window.chart.setFocus()
    before, scenario, position = box.value(), window.store.scenario, bar.value()
    assert position > 0
    wheel(box, 3)  # up
    assert box.value() == before and window.store.scenario == scenario
    assert bar.value() != position  # the wheel went on to the form's scroll area
    for path in ("training.precision", "training.sequence_length"):
        field = window.training_panel.rows[path].widget
        wheel(field)
        assert window.store.scenario == scenario, path
    # a combo of the model panel (the preset list) too
    preset = window.model_panel.preset
    index = preset.currentIndex()
    wheel(preset, -1)
    assert preset.currentIndex() == index


def test_the_wheel_changes_a_focused_field(window: MainWindow) -> None:
    lora_on(window)
    box = rank_box(window)
    box.setFocus()
    QApplication.processEvents()
    assert box.hasFocus()
    before = box.value()
    wheel(box)
    assert box.value() > before
    assert window.store.scenario.training.lora.rank == box.value()


def test_fields_take_focus_from_a_click_or_tab_not_from_the_wheel(window: MainWindow) -> None:
    for panel in window.panels:
        for row in panel.rows.values():
            assert row.widget.focusPolicy() == Qt.FocusPolicy.StrongFocus, row.path


def test_each_key_is_one_action_s(window: MainWindow) -> None:
    redo = window.redo_act.shortcuts()
    assert QKeySequence("Ctrl+Shift+Z") in redo and QKeySequence("Ctrl+Y") in redo
    assert len({k.toString() for k in redo}) == len(redo)
    seen: dict[str, str] = {}
    for action in window.findChildren(type(window.redo_act)):
        for key in action.shortcuts():
            name = key.toString()
            assert name not in seen or seen[name] == action.text(), (
                f"{name} is both {seen.get(name)!r} and {action.text()!r}"
            )
            seen[name] = action.text()


def test_redo_by_keyboard(window: MainWindow, qtbot: QtBot) -> None:
    lora_on(window)
    type_into(rank_box(window), "48")
    window.chart.setFocus()
    window.undo_act.trigger()
    assert window.store.scenario.training.lora.rank != 48
    for key in ("Ctrl+Shift+Z", "Ctrl+Y"):
        QTest.keySequence(window, QKeySequence(key))
        assert window.store.scenario.training.lora.rank == 48, key
        window.undo_act.trigger()


def test_ctrl_z_in_a_field_undoes_the_window_s_last_edit(window: MainWindow) -> None:
    lora_on(window)
    box = rank_box(window)
    box.setFocus()
    type_into(box, "64")
    assert window.store.scenario.training.lora.rank == 64
    assert box.hasFocus()
    QTest.keySequence(box, QKeySequence("Ctrl+Z"))
    assert window.store.scenario.training.lora.rank != 64
    assert box.value() == window.store.scenario.training.lora.rank
    QTest.keySequence(box, QKeySequence("Ctrl+Shift+Z"))
    assert window.store.scenario.training.lora.rank == 64


def test_ctrl_z_in_a_field_discards_its_rejected_value(window: MainWindow) -> None:
    heads = window.model_panel.rows["model.num_key_value_heads"].widget
    assert isinstance(heads, QSpinBox)
    before = window.store.scenario
    heads.setFocus()
    type_into(heads, "5")  # 32 heads: 5 KV heads is rejected
    assert window.model_panel.is_pending("model.num_key_value_heads")
    QTest.keySequence(heads, QKeySequence("Ctrl+Z"))
    assert not window.model_panel.is_pending("model.num_key_value_heads")
    assert window.store.scenario == before
    assert heads.value() == before.model.num_key_value_heads


def test_redo_keys_are_each_once_where_the_platform_s_redo_is_ctrl_shift_z(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Linux desktops bind Redo to Ctrl+Shift+Z (the offscreen platform to Ctrl+Y): the
    window added Ctrl+Shift+Z beside the platform's Redo, twice there."""
    for platform in (["Ctrl+Shift+Z"], ["Ctrl+Y"], ["Ctrl+Shift+Z", "Ctrl+Y"], []):
        monkeypatch.setattr(
            QKeySequence, "keyBindings", lambda _key, p=platform: [QKeySequence(k) for k in p]
        )
        keys = [k.toString() for k in redo_keys()]
        assert sorted(keys) == ["Ctrl+Shift+Z", "Ctrl+Y"], platform


def budget_box(window: MainWindow) -> CountBox:
    box = window.training_panel.rows["training.token_budget"].widget
    assert isinstance(box, CountBox)
    return box


@pytest.mark.parametrize(
    ("typed", "tokens", "shown"),
    [
        ("1e9", 10**9, "1 B tokens"),
        ("1000000000", 10**9, "1 B tokens"),
        ("1,000,000,000", 10**9, "1 B tokens"),
        ("10B", 10**10, "10 B tokens"),
        ("500M", 5 * 10**8, "500 M tokens"),
        ("2.5t", 25 * 10**11, "2.5 T tokens"),
        ("15 T tokens", 15 * 10**12, "15 T tokens"),
    ],
)
def test_the_token_budget_takes_plain_numbers_and_suffixes(
    window: MainWindow, typed: str, tokens: int, shown: str
) -> None:
    """``1e9`` was stored as 19 billion tokens and 1000000000 clamped to 10^16."""
    box = budget_box(window)
    box.setFocus()
    type_into(box, typed)
    assert window.store.scenario.training.token_budget == tokens
    assert box.text() == shown
    assert not window.training_panel.is_pending("training.token_budget")


def test_a_token_budget_out_of_range_is_named_and_zero_is_none(window: MainWindow) -> None:
    box = budget_box(window)
    type_into(box, "10B")
    assert window.store.scenario.training.token_budget == 10**10
    type_into(box, "2e16")
    assert window.training_panel.is_pending("training.token_budget")
    error = window.training_panel.rows["training.token_budget"].error
    assert error.isVisibleTo(window) and "10000000000000000" in error.text()
    assert window.store.scenario.training.token_budget == 10**10
    window.undo_act.trigger()  # discards the rejected value
    type_into(box, "0")
    assert window.store.scenario.training.token_budget is None
    assert box.text() == "not given"
    assert "1e9" in box.toolTip() and "10B" in box.toolTip()


def test_typing_letters_that_are_no_count_is_refused() -> None:
    box = CountBox()
    box.setRange(0, 1e17)
    state = QValidator.State
    assert box.validate("12q", 3)[0] == state.Invalid
    assert box.validate("1e", 2)[0] == state.Intermediate
    assert box.validate("10 B tok", 8)[0] == state.Intermediate
    assert box.validate("10 B tokens", 11)[0] == state.Acceptable


def test_an_imported_config_is_named_by_its_folder(window: MainWindow, tmp_path: Path) -> None:
    """Imports showed as ``qwen2 (edited)``: a config.json without ``_name_or_path`` is
    named by its folder, and a model that is no preset is shown by name and size."""
    data = json.loads((FIXTURES / "qwen2.json").read_text())
    del data["_name_or_path"]
    folder = tmp_path / "Qwen2.5-7B-local"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(data))
    assert window.importer.import_path(folder / "config.json")
    model = window.store.scenario.model
    assert model.label == "Qwen2.5-7B-local"
    panel = window.model_panel
    assert panel.preset.currentText().startswith("Qwen2.5-7B-local  (7.6")
    assert "(edited)" not in panel.preset.currentText()
    assert panel.name_field.text() == "Qwen2.5-7B-local"
    assert scenario_caption(window.store.estimate).startswith("Qwen2.5-7B-local · ")


def test_the_name_field_renames_the_model_everywhere(window: MainWindow, tmp_path: Path) -> None:
    panel = window.model_panel
    preset = window.store.scenario.model
    assert panel.name_field.text() == preset.label
    panel.name_field.setText("Our 8B run")
    panel.name_field.editingFinished.emit()
    est = window.store.estimate
    assert window.store.scenario.model.label == "Our 8B run"
    assert scenario_caption(est).startswith("Our 8B run · ")
    assert baseline_summary(est).startswith("Our 8B run, ")
    # a preset under a name of the user's is still that preset, with its size
    assert panel.preset.currentText().startswith("Our 8B run  (")
    assert "(edited)" not in panel.preset.currentText()
    assert window.save_to(tmp_path / "named.memfit.json")
    assert load_scenario(tmp_path / "named.memfit.json").model.label == "Our 8B run"
    panel.name_field.setText("")
    panel.name_field.editingFinished.emit()
    assert window.store.scenario.model == preset  # its own name back: the preset again
    window.undo_act.trigger()
    assert window.store.scenario.model.label == "Our 8B run"


def test_captions_say_the_checkpointing(window: MainWindow) -> None:
    mode = window.training_panel.rows["training.activation_checkpointing"].widget
    assert isinstance(mode, QComboBox)
    assert "checkpointing" not in scenario_caption(window.store.estimate)
    mode.setCurrentIndex(mode.findData("full"))
    assert "full checkpointing" in scenario_caption(window.store.estimate)
    assert "checkpointing full" in scenario_line(window.store.estimate)


@pytest.mark.parametrize(
    "name",
    ["config.json", "axolotl.yaml"],
)
def test_file_open_imports_a_config_instead_of_refusing_it(
    window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Open on a config.json said ``memfit_scenario: got None, expected 1``."""
    path = tmp_path / name
    if name == "config.json":
        path.write_text((FIXTURES / "mistral.json").read_text())
    else:
        path.write_text(TRAIN_CONFIGS.joinpath("axolotl-llama3-8b-lora-zero2.yml").read_text())
    before = window.store.scenario
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    window.open_act.trigger()
    assert window.store.scenario != before
    assert window.store.path is None  # imported into the document, not opened as one
    assert "Imported" in " ".join(window.notice.messages())
    window.undo_act.trigger()
    assert window.store.scenario == before


def test_file_open_still_opens_a_scenario(
    window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "run.memfit.json"
    scenario = dataclasses.replace(
        window.store.scenario,
        training=dataclasses.replace(window.store.scenario.training, micro_batch_size=3),
    )
    save_scenario(scenario, path)
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    window.open_act.trigger()
    assert window.store.path == path and window.store.scenario == scenario


def test_a_cached_model_with_only_its_config_imports(
    window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, qtbot: QtBot
) -> None:
    """Browse Local Models said ``no *.safetensors files`` where the command line reads it."""
    files = tmp_path / "files"
    files.mkdir()
    (files / "config.json").write_text((FIXTURES / "qwen2.json").read_text())
    root = tmp_path / "hub"
    cached(root, "Qwen/Qwen2.5-7B", files)
    monkeypatch.setenv("HF_HUB_CACHE", str(root))

    monkeypatch.setattr(ModelBrowser, "exec", accept_first_row)
    window.importer.browse_act.trigger()
    qtbot.waitUntil(lambda: not window.importer.busy, timeout=20_000)
    model = window.store.scenario.model
    assert model.hidden_size == json.loads((files / "config.json").read_text())["hidden_size"]
    said = " ".join(window.notice.messages())
    assert "counted from the config alone" in said
    assert model.label == "Qwen/Qwen2.5-7B"


def test_the_notice_bar_stays_a_few_lines_however_many_imports(
    window: MainWindow, qtbot: QtBot
) -> None:
    """Each import added its notes until the chart was about 90 px tall."""
    QApplication.processEvents()
    chart_before = window.chart.height()
    for i in range(40):
        window.notify(f"Imported model config number {i}: every note of an import, in words")
    QApplication.processEvents()
    lines = window.notice.label.fontMetrics().lineSpacing()
    assert window.notice.height() <= (NoticeBar.MAX_LINES + 2) * lines + 20
    assert window.chart.height() >= chart_before - (NoticeBar.MAX_LINES + 3) * lines
    assert window.chart.height() > 300
    bar = window.notice.area.verticalScrollBar()
    assert bar.maximum() > 0 and bar.value() == bar.maximum()  # the newest is shown
    assert window.notice.messages()[-1].startswith("Imported model config number 39")
    window.notice.dismiss()
    assert window.notice.isHidden()


def test_form_labels_have_mnemonics_that_focus_their_fields(window: MainWindow) -> None:
    """Form labels had no mnemonics: no field could be reached by Alt+letter."""
    letters: dict[str, str] = {}
    for panel in window.panels:
        for row in panel.rows.values():
            label = row.form.labelForField(row.widget.parentWidget())
            assert isinstance(label, QLabel)
            text = label.text().replace("&&", "")
            if "&" in text:
                letter = text[text.index("&") + 1].lower()
                assert letter not in letters, f"{row.path} and {letters.get(letter)}"
                assert label.buddy() is row.widget
                letters[letter] = row.path
    menus = {a.text()[a.text().index("&") + 1].lower() for a in window.menuBar().actions()}
    assert not menus & set(letters)
    for path in ("model.display_name", "hardware.gpu", "training.method", "training.precision"):
        assert path in letters.values(), path
    window.activateWindow()
    QApplication.processEvents()
    method = window.training_panel.rows["training.method"].widget
    key = next(k for k, p in letters.items() if p == "training.method")
    QTest.keyClick(window, key, Qt.KeyboardModifier.AltModifier)
    QApplication.processEvents()
    assert method.hasFocus()
