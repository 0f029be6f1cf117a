"""Scenarios and window helpers shared by the GUI tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QSettings, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QAbstractSpinBox, QApplication, QDialog, QInputDialog, QWidget

from memfit.engine.presets import load_gpu, load_model
from memfit.engine.specs import HardwareSpec, ParallelismSpec, Scenario, TrainingSpec
from memfit.gui.lifetime import delete_now
from memfit.gui.main_window import MainWindow

ROOT = Path(__file__).resolve().parents[2]


def run_offscreen(code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -c code args`` in a process of its own, offscreen, with the source tree
    importable and ``env`` added to the environment."""
    full = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(ROOT), **env)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
        check=False,
    )


def bad_mesh() -> Scenario:
    """Tensor parallel 3 on 8 GPUs: the spec accepts it, the estimate does not."""
    return Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8),
        TrainingSpec(method="full", parallelism=ParallelismSpec(tp=3)),
    )


def cluster() -> Scenario:
    """Llama 3 8B full fine-tuning with FSDP on 8 H100s: a sweep of thousands."""
    return Scenario(
        load_model("llama-3-8b"),
        HardwareSpec(load_gpu("h100-sxm-80gb"), gpus_per_node=8),
        TrainingSpec(
            method="full",
            micro_batch_size=2,
            gradient_accumulation_steps=4,
            sequence_length=4096,
            parallelism=ParallelismSpec(zero_stage=3),
        ),
    )


def ini(tmp_path: Path) -> QSettings:
    return QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)


def type_into(spin: QAbstractSpinBox, text: str) -> None:
    """Select the spin box's text, type ``text`` and press Enter, as a user does."""
    spin.selectAll()
    QTest.keyClicks(spin, text)
    QTest.keyClick(spin, Qt.Key.Key_Return)


def field_mismatches(window: MainWindow) -> list[str]:
    """Visible rows whose widget does not show the scenario's value (and holds no
    rejected value with its error)."""
    from memfit.gui.monkey import agree

    out = []
    for panel in window.panels:
        for row in panel.rows.values():
            if not row.widget.isVisibleTo(panel):
                continue
            shown, value = row.read(), row.get(window.store.scenario)
            if agree(row, shown, value):
                continue
            if panel.is_pending(row.path) and not row.error.isHidden():
                continue
            out.append(f"{row.path}: {shown!r} != {value!r}")
    return out


def answer_read_as(monkeypatch: pytest.MonkeyPatch, family: str) -> list[str]:
    """Answer every read-as prompt with ``family``; the prompts' texts, as they come."""
    asked: list[str] = []

    def choose(dialog: QInputDialog) -> int:
        asked.append(dialog.labelText())
        dialog.setTextValue(family)
        return QDialog.DialogCode.Accepted.value

    monkeypatch.setattr(QInputDialog, "exec", choose)
    return asked


def free_top_levels(before: list[QWidget]) -> list[str]:
    """Close every top-level widget that is not in ``before`` and delete the main windows
    among them, with every delete pytest-qt (or anything else) left pending; the widgets
    that refused to close, by class and title.

    Only main windows are deleted here: the other new top-level widgets are the windows'
    own (dialogs, popups: they go with them) or pyqtgraph's parentless context menus and
    Qt's helper widgets, which their Python owners free; deleting those from Qt crashes.
    """
    new = [w for w in QApplication.topLevelWidgets() if not any(w is b for b in before)]
    for widget in new:
        # a main window closes again even if hidden: its close stops its background work
        if widget.isVisible() or isinstance(widget, MainWindow):
            widget.close()
    refused = [w for w in new if w.isVisible()]
    delete_now(*(w for w in new if isinstance(w, MainWindow) and not w.isVisible()))
    return [f"{type(w).__name__} {w.windowTitle()!r}" for w in refused]


def accept_first_row(browser: Any) -> QDialog.DialogCode:
    """A :class:`memfit.gui.importing.ModelBrowser`'s ``exec`` as a user answers it: the
    first model chosen (patch it in: ``monkeypatch.setattr(ModelBrowser, "exec", ...)``)."""
    browser.view.selectRow(0)
    browser.accept()
    return QDialog.DialogCode.Accepted
