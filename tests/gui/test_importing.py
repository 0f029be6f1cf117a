"""Bringing a run into the app: File > Import (a config.json, a training configuration,
a model folder), the local model browser, paste, drag and drop, and recent imports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent, QGuiApplication
from PySide6.QtWidgets import QDialog
from pytestqt.qtbot import QtBot

from memfit.engine.presets import load_model
from memfit.engine.scenario_io import save_scenario
from memfit.gui.importing import ModelBrowser, is_scenario_file
from memfit.gui.main_window import MainWindow
from memfit.gui.monkey import MessageBoxes
from tests.engine.test_checkpoint import CONFIG, ENGINE_COUNT, model_folder, plain_tensors
from tests.engine.test_imports import cached
from tests.gui.helpers import accept_first_row, answer_read_as

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LLAMA = FIXTURES / "hf_configs" / "llama.json"
LITGPT = FIXTURES / "train_configs" / "litgpt-llama-3.1-8b-qlora.yaml"


def drop(window: MainWindow, mime: QMimeData) -> None:
    event = QDropEvent(
        QPointF(10, 10),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    window.dropEvent(event)


def notices(window: MainWindow) -> str:
    return " ".join(window.notice.messages())


def settle(window: MainWindow, qtbot: QtBot) -> None:
    """Wait for a model folder read in the background, and the imports after it."""
    qtbot.waitUntil(lambda: not window.importer.busy, timeout=20_000)


def test_import_a_config_json_is_one_undoable_edit(window: MainWindow) -> None:
    before = window.store.scenario
    assert window.importer.import_path(LLAMA)
    assert window.store.scenario.model.hidden_size == json.loads(LLAMA.read_text())["hidden_size"]
    assert window.store.scenario.training == before.training
    assert "Imported model config llama.json" in notices(window)
    window.undo_act.trigger()
    assert window.store.scenario == before


def test_import_a_training_config_names_what_it_cannot_model(window: MainWindow) -> None:
    assert window.importer.import_path(LITGPT)
    t = window.store.scenario.training
    assert (t.stack, t.method) == ("lightning", "qlora")
    assert window.store.scenario.model == load_model("llama-3.1-8b")
    assert "litgpt configuration" in notices(window)
    axolotl = FIXTURES / "train_configs" / "axolotl-llama3-8b-lora-zero2.yml"
    assert window.importer.import_path(axolotl)
    assert "not modelled: load_in_8bit" in notices(window)


def test_import_a_model_folder_shows_the_checkpoint_count(
    window: MainWindow, tmp_path: Path, qtbot: QtBot
) -> None:
    folder = model_folder(tmp_path / "tiny", plain_tensors())
    assert window.importer.import_path(folder)
    settle(window, qtbot)
    assert window.store.scenario.model.hidden_size == CONFIG["hidden_size"]
    assert f"{ENGINE_COUNT:,} parameters" in notices(window)
    assert "matches the engine's count" in notices(window)


def test_a_bad_file_is_named_and_changes_nothing(
    window: MainWindow, tmp_path: Path, message_boxes: MessageBoxes, qtbot: QtBot
) -> None:
    before = window.store.scenario
    bad = tmp_path / "broken.yaml"
    bad.write_text("lora_r: [unclosed")
    assert not window.importer.import_path(bad)
    assert window.store.scenario == before
    assert "Could not import broken.yaml" in message_boxes.texts()[-1]
    window.importer.import_path(tmp_path)  # a folder without config.json
    settle(window, qtbot)
    assert window.store.scenario == before
    assert f"Could not import {tmp_path.name}" in message_boxes.texts()[-1]


def test_paste_reads_the_clipboard(window: MainWindow, message_boxes: MessageBoxes) -> None:
    QGuiApplication.clipboard().setText(LITGPT.read_text())
    window.importer.paste_act.trigger()
    assert window.store.scenario.training.stack == "lightning"
    QGuiApplication.clipboard().setText("")
    before = window.store.scenario
    window.importer.paste_act.trigger()
    assert window.store.scenario == before
    assert "empty" in message_boxes.texts()[-1]


def test_drop_files_folders_and_text(window: MainWindow, tmp_path: Path, qtbot: QtBot) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(LLAMA))])
    drop(window, mime)
    assert window.store.scenario.model.hidden_size == json.loads(LLAMA.read_text())["hidden_size"]
    folder = model_folder(tmp_path / "tiny", plain_tensors())
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(folder)), QUrl.fromLocalFile(str(LITGPT))])
    drop(window, mime)  # in order: the model, then the training config
    settle(window, qtbot)
    assert window.store.scenario.training.stack == "lightning"
    # the config names a preset, which replaced the folder's model: the folder came first
    assert window.store.scenario.model == load_model("llama-3.1-8b")
    text = QMimeData()
    text.setText(LLAMA.read_text())
    drop(window, text)
    assert window.store.scenario.model.hidden_size == json.loads(LLAMA.read_text())["hidden_size"]


def test_a_dropped_scenario_opens_as_the_document(window: MainWindow, tmp_path: Path) -> None:
    path = tmp_path / "run.memfit.json"
    scenario = window.store.scenario
    other = type(scenario)(load_model("gpt2"), scenario.hardware, scenario.training)
    save_scenario(other, path)
    assert is_scenario_file(path)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    drop(window, mime)
    assert window.store.path == path and window.store.scenario == other


def test_recent_imports_import_again(window: MainWindow) -> None:
    window.importer.import_path(LLAMA)
    assert window.recent_files()[0] == str(LLAMA)
    window.store.edit(type(window.store.scenario)(
        load_model("gpt2"), window.store.scenario.hardware, window.store.scenario.training
    ))  # fmt: skip
    window.recent_menu.actions()[0].trigger()
    assert window.store.scenario.model.hidden_size == json.loads(LLAMA.read_text())["hidden_size"]


def test_the_model_browser_lists_the_cache_and_imports(
    window: MainWindow, qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "hub"
    cached(root, "org/tiny", model_folder(tmp_path / "files", plain_tensors()))
    cached(root, "other/small", model_folder(tmp_path / "files2", plain_tensors()))
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    browser = ModelBrowser(window)
    qtbot.addWidget(browser)
    assert browser.items.rowCount() == 2
    assert "2 models in" in browser.where.text()
    browser.search.setText("tiny")
    assert browser.proxy.rowCount() == 1
    browser.view.selectRow(0)
    browser.accept()
    assert browser.chosen is not None and browser.chosen[0] == "org/tiny"

    monkeypatch.setattr(ModelBrowser, "exec", accept_first_row)
    window.importer.browse_act.trigger()
    settle(window, qtbot)
    assert window.store.scenario.model.hidden_size == CONFIG["hidden_size"]
    assert "Imported cached model" in notices(window)


def test_an_empty_cache_says_where_it_looked(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "none"))
    browser = ModelBrowser()
    qtbot.addWidget(browser)
    assert browser.items.rowCount() == 0
    assert "No models in" in browser.where.text() and "HF_HOME" in browser.where.text()


@pytest.mark.parametrize(
    "config", sorted(p.name for p in (FIXTURES / "hf_configs").glob("*.json")), ids=str
)
def test_every_supported_family_dropped_on_the_window_estimates(
    window: MainWindow, config: str
) -> None:
    from memfit.engine.hf_config import model_from_hf_config
    from memfit.engine.params import count_parameters

    path = FIXTURES / "hf_configs" / config
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    drop(window, mime)
    expected = model_from_hf_config(json.loads(path.read_text()))
    model = window.store.scenario.model
    assert count_parameters(model).total == count_parameters(expected).total
    assert model.family == expected.family
    assert not window.store.error
    assert window.store.estimate is not None


def test_an_unknown_family_can_be_read_as_a_look_alike(
    window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    message_boxes: MessageBoxes,
) -> None:  # fmt: skip
    from PySide6.QtWidgets import QInputDialog

    config = {**json.loads(LLAMA.read_text()), "model_type": "mpt-like"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    asked = answer_read_as(monkeypatch, "llama")
    assert window.importer.import_path(path)
    assert "is not a family MemFit reads" in asked[0]
    assert window.store.scenario.model.read_as == "llama"
    assert "read as llama" in notices(window)
    # cancelled: nothing changes
    before = window.store.scenario
    monkeypatch.setattr(QInputDialog, "exec", lambda _dialog: QDialog.DialogCode.Rejected.value)
    config["num_hidden_layers"] = 3
    path.write_text(json.dumps(config))
    assert not window.importer.import_path(path)
    assert window.store.scenario == before
    # a family refused with a reason is not offered
    path.write_text(json.dumps({**config, "model_type": "jamba"}))
    assert not window.importer.import_path(path)
    assert "not supported" in message_boxes.texts()[-1]


def test_the_model_panel_says_how_a_config_was_read(window: MainWindow) -> None:
    assert window.importer.import_path(FIXTURES / "hf_configs" / "llava.json")
    assert "the text model of llava" in window.model_panel.count.text()


#: JSON nested far deeper than any configuration, as a paste or a drop may bring it
DEEP = {
    "objects": '{"a":' * 50_000 + "1" + "}" * 50_000,
    "arrays": "[" * 50_000 + "]" * 50_000,
    "objects in arrays": '[{"a":' * 25_000 + "1" + "}]" * 25_000,
    "a scenario's model": '{"memfit_scenario": 1, "model": '
    + '{"a":' * 50_000
    + "1"
    + "}" * 50_000
    + ', "hardware": {"gpu": "l4"}}',
}


def refused_as_too_deep(window: MainWindow, message_boxes: MessageBoxes, before: object) -> None:
    assert window.store.scenario == before and not window.store.modified
    text = message_boxes.texts()[-1]
    # a scenario dropped as a file opens as the document; anything else imports
    assert text.startswith(("Could not import", "Could not open")), text[:300]
    assert "nested too deeply" in text, text[:300]


@pytest.mark.parametrize("text", DEEP.values(), ids=DEEP.keys())
def test_deep_json_pasted_is_refused_in_words(
    window: MainWindow, message_boxes: MessageBoxes, text: str
) -> None:
    before = window.store.scenario
    assert not window.importer.import_pasted(text, "the clipboard")
    refused_as_too_deep(window, message_boxes, before)
    QGuiApplication.clipboard().setText(text)
    window.importer.paste_act.trigger()
    refused_as_too_deep(window, message_boxes, before)


@pytest.mark.parametrize("text", DEEP.values(), ids=DEEP.keys())
def test_deep_json_dropped_as_text_or_a_file_is_refused_in_words(
    window: MainWindow, message_boxes: MessageBoxes, tmp_path: Path, text: str
) -> None:
    before = window.store.scenario
    mime = QMimeData()
    mime.setText(text)
    drop(window, mime)
    refused_as_too_deep(window, message_boxes, before)
    path = tmp_path / "config.json"
    path.write_text(text)
    files = QMimeData()
    files.setUrls([QUrl.fromLocalFile(str(path))])
    drop(window, files)
    refused_as_too_deep(window, message_boxes, before)
    assert path.name in message_boxes.texts()[-1]
