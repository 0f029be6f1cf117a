"""Every text that comes from a file, a config or the user is shown as plain text.

Markup that would really render -- an ``<img>`` of a local image and an ``<h1>`` -- goes
into every text field of a scenario the spec accepts (the model's names and source, the
GPU's name and the rest of its texts), the scenario's file name, a notice and a config's
``model_type``; then every widget of the window and of the dialogs it opens is walked
(labels, tooltips of widgets, actions, tabs, items and chart items, the chart's texts,
message boxes, the read-as prompt): none renders it (:func:`memfit.gui.monkey.rendered_markup`).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QApplication, QDialog, QInputDialog, QLabel
from pytestqt.qtbot import QtBot

from memfit.engine.errors import EstimateError
from memfit.engine.estimate import estimate
from memfit.engine.scenario_io import save_scenario
from memfit.engine.specs import GPU_NAME_CHARS, GpuSpec, HardwareSpec, ModelSpec, Scenario
from memfit.engine.sweep import Space
from memfit.gui.main_window import MainWindow
from memfit.gui.monkey import MARKUP_SIGNS, MessageBoxes, rendered_markup
from memfit.gui.store import default_scenario

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

Mark = Callable[[str], str]


@pytest.fixture
def mark() -> Iterator[Mark]:
    """``mark(words)``: ``words`` after an ``<img>`` of a real local image and an ``<h1>``
    (and braces, which a format string would take for a field)."""
    folder = Path(tempfile.mkdtemp(prefix="mf"))
    image = folder / "i.png"
    picture = QImage(8, 8, QImage.Format.Format_RGB32)
    picture.fill(QColor("red"))
    assert picture.save(str(image))
    yield lambda words: f'<img src="{image}"><h1>{{x}} {words}'
    shutil.rmtree(folder)


def with_marks(scenario: Scenario, mark: Mark) -> tuple[Scenario, list[str]]:
    """``scenario`` with markup in every text field of its model and GPU that the spec
    and the estimate accept; and the fields it went into."""
    model, gpu, done = scenario.model, scenario.hardware.gpu, []
    for field in dataclasses.fields(ModelSpec):
        if isinstance(getattr(model, field.name), str):
            try:
                candidate = dataclasses.replace(model, **{field.name: mark(field.name)})
                estimate(dataclasses.replace(scenario, model=candidate))
            except EstimateError:
                continue
            model = candidate
            done.append(f"model.{field.name}")
    for field in dataclasses.fields(GpuSpec):
        if isinstance(getattr(gpu, field.name), str):
            text = mark("GPU")[-GPU_NAME_CHARS:] if field.name == "display_name" else mark("")
            try:
                candidate_gpu = dataclasses.replace(gpu, **{field.name: text})
                hardware = dataclasses.replace(scenario.hardware, gpu=candidate_gpu)
                estimate(dataclasses.replace(scenario, hardware=hardware))
            except EstimateError:
                continue
            gpu = candidate_gpu
            done.append(f"gpu.{field.name}")
    hardware = HardwareSpec(**{**_fields(scenario.hardware), "gpu": gpu})
    return dataclasses.replace(scenario, model=model, hardware=hardware), done


def _fields(spec: object) -> dict[str, object]:
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}  # type: ignore[arg-type]


def rich_boxes(message_boxes: MessageBoxes) -> list[str]:
    return [
        box.text
        for box in message_boxes.shown
        if any(sign in box.text for sign in MARKUP_SIGNS)
        and box.text_format != Qt.TextFormat.PlainText
    ]


def test_markup_in_every_field_is_plain_text_everywhere(
    window: MainWindow, qtbot: QtBot, tmp_path: Path, mark: Mark, message_boxes: MessageBoxes
) -> None:
    scenario, fields = with_marks(default_scenario(), mark)
    wanted = {"model.name", "model.display_name", "model.source", "gpu.display_name"}
    assert wanted <= set(fields), fields
    # the scenario's file name: no slash in a name, so the image is beside it
    named = tmp_path / '<img src="i.png"><h1>{x} run.memfit.json'
    QImage(4, 4, QImage.Format.Format_RGB32).save(str(tmp_path / "i.png"))
    gpu = dataclasses.replace(
        default_scenario().hardware.gpu, display_name=scenario.hardware.gpu.display_name
    )  # a file names its GPU by preset, and the name the user gave it
    save_scenario(
        dataclasses.replace(scenario, hardware=dataclasses.replace(scenario.hardware, gpu=gpu)),
        named,
    )
    assert window.open_path(named)
    assert named.name in window.windowTitle()
    window.store.edit(scenario)  # the GPU's own texts, which a file names by preset
    window.notify(mark("a notice"))
    window.pin_baseline()
    smaller = dataclasses.replace(
        scenario, training=dataclasses.replace(scenario.training, micro_batch_size=1)
    )
    window.store.edit(smaller)
    window.compare_all()
    for page in (window.activations, window.step_view, window.table):
        window.show_details(page)
        QApplication.processEvents()
    chart = window.chart
    for bar in range(len(chart._bars)):
        for y0, height in chart.segments(bar).values():
            tip = chart.tooltip_at(bar, y0 + height / 2)
            assert not any(sign in tip for sign in MARKUP_SIGNS), tip
    tradeoffs = window.tradeoffs
    window.views.setCurrentWidget(tradeoffs)
    current = window.store.scenario
    with qtbot.waitSignal(tradeoffs.sweeper.finished, timeout=120_000):
        tradeoffs.start_sweep(
            Space(precisions=("bf16-mixed",), checkpointing=("none", "full"), micro_batches=(1,))
        )
    shown = {  # each tab, and when it shows the current scenario's results
        1: lambda: getattr(tradeoffs.curves_view.curves(), "scenario", None) == current,
        2: lambda: bool(tradeoffs.hardware_view.rows()),
        3: lambda: getattr(tradeoffs.fit_view.result(), "scenario", None) == current,
    }
    for tab, done in shown.items():
        tradeoffs.tabs.setCurrentIndex(tab)
        qtbot.waitUntil(done, timeout=120_000)
    assert any("<img" in row.display_name for row in tradeoffs.hardware_view.rows())
    assert rendered_markup([window]) == []
    # a file that cannot be opened, named with markup: said in plain text
    broken = tmp_path / '<img src="i.png"><h1>broken.memfit.json'
    broken.write_text("{oops")
    assert not window.open_path(broken)
    assert rich_boxes(message_boxes) == [] and broken.name in message_boxes.shown[-1].text


def test_the_status_bar_names_the_gpu_in_plain_text(window: MainWindow, mark: Mark) -> None:
    scenario, _fields = with_marks(default_scenario(), mark)
    window.store.edit(scenario)
    tip = window.summary.toolTip()
    assert "&lt;img" in tip and not any(sign in tip for sign in MARKUP_SIGNS)
    assert rendered_markup([window.statusBar()]) == []


def test_the_read_as_prompt_shows_the_configs_words_as_plain_text(
    window: MainWindow, tmp_path: Path, mark: Mark, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = json.loads((FIXTURES / "hf_configs" / "llama.json").read_text())
    config["model_type"] = mark("family")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    shown: list[tuple[str, list[str]]] = []

    def answer(dialog: QInputDialog) -> int:
        labels = [label.text() for label in dialog.findChildren(QLabel)]
        shown.append((dialog.labelText(), rendered_markup([dialog])))
        assert any("<img" in text for text in labels)  # the words are there, as they are
        return QDialog.DialogCode.Rejected.value

    monkeypatch.setattr(QInputDialog, "exec", answer)
    before = window.store.scenario
    assert not window.importer.import_path(path)
    assert len(shown) == 1 and "<h1>" in shown[0][0]
    assert shown[0][1] == []
    assert window.store.scenario == before
