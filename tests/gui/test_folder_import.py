"""A model folder (or a cached model) is read off the GUI thread, with a progress dialog
whose Cancel stops the reading and leaves the scenario as it was."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPushButton
from pytestqt.qtbot import QtBot

from memfit.engine import checkpoint
from memfit.gui.main_window import MainWindow
from memfit.gui.monkey import MessageBoxes
from tests.engine.test_checkpoint import CONFIG, model_folder, plain_tensors
from tests.engine.test_checkpoint_limits import many_tensors
from tests.gui.helpers import answer_read_as

WAIT_MS = 20_000


def settle(window: MainWindow, qtbot: QtBot) -> None:
    qtbot.waitUntil(lambda: not window.importer.busy, timeout=WAIT_MS)


class Gate:
    """Holds the background read after its first header until the test lets it go, so
    that what the dialog shows and what a cancel stops are certain, not a race."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.read: list[str] = []
        self.first = threading.Event()
        self.go = threading.Event()
        real = checkpoint._header_tensors

        def header_tensors(path: Path, *args: Any, **kwargs: Any) -> Any:
            found = real(path, *args, **kwargs)
            self.read.append(path.name)
            if len(self.read) == 1:
                self.first.set()
                self.go.wait(WAIT_MS / 1000)
            return found

        monkeypatch.setattr(checkpoint, "_header_tensors", header_tensors)


def test_a_folder_is_read_in_the_background_and_applies_as_before(
    window: MainWindow, qtbot: QtBot, tmp_path: Path
) -> None:
    before = window.store.scenario
    folder = model_folder(tmp_path / "tiny", plain_tensors())
    assert window.importer.import_path(folder)
    assert window.importer.busy and window.importer.progress is not None
    settle(window, qtbot)
    assert window.importer.progress is None
    assert window.store.scenario.model.hidden_size == CONFIG["hidden_size"]
    assert "Imported model folder tiny" in " ".join(window.notice.messages())
    assert window.recent_files()[0] == str(folder)
    window.undo_act.trigger()
    assert window.store.scenario == before


def test_the_dialog_shows_the_header_bytes_read(
    window: MainWindow, qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = many_tensors(tmp_path / "large", files=4, per_file=20_000)
    total = sum(int.from_bytes(p.read_bytes()[:8], "little") for p in folder.glob("*.safetensors"))
    gate = Gate(monkeypatch)
    window.importer.import_path(folder)
    dialog = window.importer.progress
    assert dialog is not None and dialog.isVisible()
    assert dialog.labelText() == "Reading the checkpoint headers of large"
    qtbot.waitUntil(gate.first.is_set, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: dialog.maximum() == total and dialog.value() > 0, timeout=WAIT_MS)
    assert dialog.value() < total
    gate.go.set()
    settle(window, qtbot)
    assert gate.read == sorted(p.name for p in folder.glob("*.safetensors"))
    assert "in 80,000 tensors" in " ".join(window.notice.messages())


def test_cancel_stops_the_reading_and_changes_nothing(
    window: MainWindow,
    qtbot: QtBot,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    message_boxes: MessageBoxes,
) -> None:
    before = window.store.scenario
    undo_steps = window.store.undo_stack.count()
    folder = many_tensors(tmp_path / "large", files=4, per_file=20_000)
    gate = Gate(monkeypatch)
    window.importer.import_path(folder)
    qtbot.waitUntil(gate.first.is_set, timeout=WAIT_MS)
    dialog = window.importer.progress
    assert dialog is not None
    qtbot.mouseClick(dialog.findChild(QPushButton), Qt.MouseButton.LeftButton)
    gate.go.set()
    settle(window, qtbot)
    assert gate.read == ["model-00000-of-00004.safetensors"]  # stopped at the next poll
    assert window.store.scenario == before
    assert window.store.undo_stack.count() == undo_steps
    assert window.importer.progress is None
    assert "cancelled" in window.statusBar().currentMessage()
    assert not message_boxes.texts()
    # the next import runs as usual
    small = model_folder(tmp_path / "tiny", plain_tensors())
    window.importer.import_path(small)
    settle(window, qtbot)
    assert window.store.scenario.model.hidden_size == CONFIG["hidden_size"]


def test_a_bad_folder_is_named_and_changes_nothing(
    window: MainWindow, qtbot: QtBot, tmp_path: Path, message_boxes: MessageBoxes
) -> None:
    before = window.store.scenario
    folder = model_folder(tmp_path / "bad", plain_tensors())
    shard = folder / "model.safetensors"
    shard.write_bytes((10**9).to_bytes(8, "little") + shard.read_bytes()[8:])
    window.importer.import_path(folder)
    settle(window, qtbot)
    assert window.store.scenario == before
    assert "Could not import bad" in message_boxes.texts()[-1]
    assert "model.safetensors" in message_boxes.texts()[-1]


def test_a_folder_of_an_unknown_family_can_be_read_as_a_look_alike(
    window: MainWindow, qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = model_folder(tmp_path / "odd", plain_tensors())
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "mpt-like"}))
    asked = answer_read_as(monkeypatch, "llama")
    window.importer.import_path(folder)
    settle(window, qtbot)
    assert asked and "odd" in asked[0]
    assert window.store.scenario.model.read_as == "llama"


def test_closing_the_window_stops_the_reading(
    window: MainWindow, qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = many_tensors(tmp_path / "large", files=4, per_file=20_000)
    gate = Gate(monkeypatch)
    window.importer.import_path(folder)
    qtbot.waitUntil(gate.first.is_set, timeout=WAIT_MS)
    threading.Timer(0.2, gate.go.set).start()
    window.close()
    assert not window.importer.busy
    assert len(gate.read) == 1
