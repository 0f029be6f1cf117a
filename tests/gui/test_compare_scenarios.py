"""Scenarios side by side: the current one, the pinned baseline and saved files, in the app
(File > Compare Scenarios) and from the command line (memfit compare)."""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path

import pytest
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog
from pytestqt.qtbot import QtBot

from memfit.engine.cli import main
from memfit.engine.compare import compare, settings, table
from memfit.engine.estimate import GIB, estimate
from memfit.engine.scenario_io import save_scenario
from memfit.gui.main_window import MainWindow
from memfit.gui.monkey import MessageBoxes


def qlora(window: MainWindow) -> object:
    s = window.store.scenario
    return dataclasses.replace(s, training=dataclasses.replace(s.training, method="qlora"))


def test_compare_the_current_the_baseline_and_a_file(
    window: MainWindow, tmp_path: Path, qtbot: QtBot, monkeypatch: object
) -> None:
    window.pin_baseline_act.trigger()
    path = tmp_path / "qlora.memfit.json"
    other = qlora(window)
    save_scenario(other, path)  # type: ignore[arg-type]
    window.store.edit(
        dataclasses.replace(
            window.store.scenario,
            training=dataclasses.replace(window.store.scenario.training, micro_batch_size=2),
        ),
        "Micro-batch 2",
    )
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: ([str(path)], ""))  # type: ignore[attr-defined]
    window.compare_act.trigger()
    shown = window._compare_window
    assert shown is not None and shown.isVisible()
    c = shown.compared
    assert c.names[1:] == ("pinned baseline", "qlora.memfit.json")
    assert c.names[0].startswith("current: Llama 3 8B")
    diffs = dict(c.differing)
    assert diffs["training.micro_batch_size"] == (2, 4, 4)
    assert diffs["training.method"] == ("lora", "lora", "qlora")
    ests = [window.store.estimate, window.baseline, estimate(other)]  # type: ignore[arg-type]
    for i, est in enumerate(ests):
        assert est is not None
        assert shown.cell("device", i) == f"{est.device_bytes / GIB:.3f}"
        assert shown.cell("tokens/s", i) == f"{est.time.tokens_per_s:.0f}"
    assert shown.cell("training.method", 2) == "qlora"
    shown.export(tmp_path / "c.csv")
    rows = list(csv.reader(io.StringIO((tmp_path / "c.csv").read_text())))
    assert rows[0] == ["section", "item", *c.names]
    shown.export(tmp_path / "c.md")
    assert (tmp_path / "c.md").read_text().startswith("| | current: Llama 3 8B")
    shown.copy_markdown()
    assert QGuiApplication.clipboard().text() == (tmp_path / "c.md").read_text()
    shown.close()


def test_nothing_to_compare_or_a_bad_file_is_said(
    window: MainWindow, tmp_path: Path, message_boxes: MessageBoxes
) -> None:
    assert window.compare_with([]) is None
    assert "Nothing to compare with" in window.statusBar().currentMessage()
    bad = tmp_path / "bad.memfit.json"
    bad.write_text("{}")
    assert window.compare_with([bad]) is None
    assert message_boxes.texts()[-1].startswith("Could not compare:")


def test_the_command_line_compares_files(tmp_path: Path, window: MainWindow) -> None:
    a, b = tmp_path / "a.memfit.json", tmp_path / "b.memfit.json"
    save_scenario(window.store.scenario, a)
    save_scenario(qlora(window), b)  # type: ignore[arg-type]
    out = io.StringIO()
    assert main(["compare", str(a), str(b)], out) == 0
    text = out.getvalue()
    assert text.startswith("| | a.memfit.json | b.memfit.json |")
    assert "| training.method | lora | qlora |" in text and "GiB = 2^30 bytes." in text
    assert main(["compare", str(a), str(b), "--csv", str(tmp_path / "x.csv")], io.StringIO()) == 0
    c = compare([("a", window.store.scenario), ("b", qlora(window))])  # type: ignore[list-item]
    assert (tmp_path / "x.csv").read_text().splitlines()[1:] == [
        ",".join(cell if "," not in cell else f'"{cell}"' for cell in (s, i, *cells))
        for s, i, cells in table(c)
    ]
    assert main(["compare", str(a)], io.StringIO()) == 2
    assert "training.method" in settings(window.store.scenario)


def test_export_from_the_window_picks_the_format_by_choice(
    window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    window.pin_baseline_act.trigger()
    shown = window.compare_with([])  # the current scenario and the baseline
    assert shown is not None and shown.compared.names[1] == "pinned baseline"
    monkeypatch.setattr(
        QFileDialog,
        "getSaveFileName",
        lambda *a, **k: (str(tmp_path / "out"), "Markdown table (*.md)"),
    )
    shown.export_dialog()
    assert (tmp_path / "out.md").read_text().startswith("| | current: ")
    shown.close()
