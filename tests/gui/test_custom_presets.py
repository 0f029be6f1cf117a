"""The user's own presets in the app: listed beside the built-in ones, marked as theirs,
chosen as any preset is; a file of theirs that does not load is a notice naming it and
its field, and the window starts with everything else."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from memfit.engine import memo
from memfit.gui.main_window import MainWindow
from memfit.gui.panels import YOURS
from memfit.gui.store import default_scenario
from tests.engine.helpers import builtin_preset
from tests.gui.helpers import ini


@pytest.fixture
def presets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "presets"
    for kind in ("models", "gpus", "stacks"):
        (folder / kind).mkdir(parents=True)
    model = {
        **builtin_preset("models", "llama-3-8b"),
        "name": "my-llama",
        "display_name": "My Llama",
    }
    (folder / "models" / "my-llama.json").write_text(json.dumps(model))
    wide = {**model, "name": "wide", "hidden_size": -5}
    (folder / "models" / "wide.json").write_text(json.dumps(wide))
    gpu = {**builtin_preset("gpus", "h100-sxm-80gb"), "name": "lab-gpu", "display_name": "Lab GPU"}
    (folder / "gpus" / "lab-gpu.json").write_text(json.dumps(gpu))
    stack = {**builtin_preset("stacks", "hf-trainer"), "name": "our-loop", "label": "Our loop"}
    (folder / "stacks" / "our-loop.json").write_text(json.dumps(stack))
    monkeypatch.setenv("MEMFIT_USER_PRESETS", str(folder))
    memo.clear()
    yield folder
    memo.clear()


def items(combo: object) -> dict[object, str]:
    return {combo.itemData(i): combo.itemText(i) for i in range(combo.count())}  # type: ignore[attr-defined]


def test_the_app_lists_them_marked_and_names_the_broken_one(
    qtbot: QtBot, tmp_path: Path, presets: Path
) -> None:
    w = MainWindow(settings=ini(tmp_path), data_dir=tmp_path, scenario=default_scenario())
    qtbot.addWidget(w)
    models = items(w.model_panel.preset)
    assert models["my-llama"].startswith("My Llama  (") and models["my-llama"].endswith(YOURS)
    assert "wide" not in models
    assert not models["llama-3-8b"].endswith(YOURS)
    gpus = items(w.hardware_panel.gpu)
    assert gpus["lab-gpu"].endswith(YOURS) and not gpus["l4"].endswith(YOURS)
    stacks = items(w.training_panel.rows["training.stack"].widget)
    assert stacks["our-loop"] == "Our loop" + YOURS
    (notice,) = [m for m in w.notice.messages() if "wide.json" in m]
    assert notice.startswith("Custom preset models/wide.json in ")
    assert "model.hidden_size: got -5" in notice

    # chosen as any preset is
    combo = w.model_panel.preset
    combo.setCurrentIndex(combo.findData("my-llama"))
    combo.activated.emit(combo.currentIndex())
    assert w.store.scenario.model.name == "my-llama"
    assert w.model_panel.current_preset_text().endswith(YOURS)
