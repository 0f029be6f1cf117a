"""Files the app writes behave like an editor's saves: a link is followed, a FIFO or device
is refused (naming it), the file's mode is kept, a new file gets the user's default mode,
and no temporary file is left behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QFileDialog, QMessageBox

from memfit.gui import chart_export
from memfit.gui.main_window import MainWindow
from memfit.gui.monkey import MessageBoxes

KINDS = [("chart.png", "export_chart"), ("chart.svg", "export_chart"), ("data.csv", "export_data")]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.mark.parametrize(("name", "method"), KINDS)
def test_exports_follow_links_and_keep_the_mode(
    window: MainWindow, tmp_path: Path, name: str, method: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    fresh = out / name
    getattr(window, method)(fresh)
    assert mode(fresh) == 0o666 & ~umask()  # never a temporary file's 0o600
    target = out / f"target-{name}"
    target.write_bytes(b"old")
    target.chmod(0o640)
    link = out / f"link-{name}"
    link.symlink_to(target.name)
    getattr(window, method)(link)
    assert link.is_symlink() and target.read_bytes() != b"old"
    assert mode(target) == 0o640
    if name.endswith(".png"):
        assert not QImage(str(target)).isNull()
    assert sorted(p.name for p in out.iterdir()) == sorted([name, target.name, link.name])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize(("name", "method"), KINDS)
def test_exports_refuse_a_fifo_without_blocking(
    window: MainWindow, tmp_path: Path, name: str, method: str
) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    with pytest.raises(OSError, match=name.replace(".", r"\.")):
        getattr(window, method)(fifo)
    assert fifo.is_fifo()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_the_export_dialog_says_why_in_plain_text(
    window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, message_boxes: MessageBoxes
) -> None:
    fifo = tmp_path / "<b>chart<i>.png"
    os.mkfifo(fifo)
    monkeypatch.setattr(
        QFileDialog, "getSaveFileName", lambda *a, **k: (str(fifo), "PNG image (*.png)")
    )
    window.export_chart_dialog()
    shown = message_boxes.shown[-1]
    assert shown.text.startswith("Export failed") and "<b>chart<i>.png" in shown.text
    assert shown.text_format == Qt.TextFormat.PlainText


def test_png_and_svg_are_made_in_memory(window: MainWindow) -> None:
    png = chart_export.png_bytes(window.chart, 2)
    assert png.startswith(b"\x89PNG")
    assert QImage.fromData(png).width() == 2 * window.chart.width()
    assert b"<svg" in chart_export.svg_bytes(window.chart)


def test_saving_a_scenario_into_a_fifo_is_refused(
    window: MainWindow, tmp_path: Path, message_boxes: MessageBoxes
) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("needs FIFOs")
    fifo = tmp_path / "run.memfit.json"
    os.mkfifo(fifo)
    assert not window.save_to(fifo)
    assert "run.memfit.json" in message_boxes.shown[-1].text and fifo.is_fifo()


def test_saving_over_a_read_only_scenario_is_refused_and_the_edits_kept(
    window: MainWindow, tmp_path: Path, message_boxes: MessageBoxes
) -> None:
    path = tmp_path / "shared.memfit.json"
    assert window.save_to(path)
    before = path.read_bytes()
    path.chmod(0o444)
    window.training_panel.rows["training.micro_batch_size"].widget.setValue(7)
    assert window.store.modified
    window.save_act.trigger()
    shown = message_boxes.shown[-1]
    assert shown.text.startswith("Could not save shared.memfit.json")
    assert "read-only" in shown.text and shown.text_format == Qt.TextFormat.PlainText
    assert shown.icon == QMessageBox.Icon.Warning
    assert path.read_bytes() == before and mode(path) == 0o444
    assert window.store.modified and window.isWindowModified()
    assert window.store.path == path
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
