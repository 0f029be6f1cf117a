"""Every input of the left column says in words what it is and what it changes in memory,
then the accepted range of a number box (:mod:`memfit.gui.tooltips`)."""

from __future__ import annotations

import re

from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QLineEdit,
    QSpinBox,
    QWidget,
)

from memfit.gui.forms import FormPanel
from memfit.gui.main_window import MainWindow
from memfit.gui.tooltips import TIPS

BARE_RANGE = re.compile(r"^[\w .,/()-]*:?\s*[\d,.]+ to [\d,.e+]+.*$")


def plain(tip: str) -> str:
    doc = QTextDocument()
    doc.setHtml(tip)
    return doc.toPlainText()


def inputs(panel: FormPanel) -> list[QWidget]:
    """Every input widget of ``panel`` (not the line edit inside a spin or combo box)."""
    kinds = (QComboBox, QAbstractSpinBox, QCheckBox, QLineEdit)
    return [
        w
        for w in panel.findChildren(QWidget)
        if isinstance(w, kinds)
        and not (isinstance(w, QLineEdit) and isinstance(w.parent(), QAbstractSpinBox | QComboBox))
    ]


def tip_of(window: MainWindow, path: str) -> str:
    for panel in window.panels:
        if path in panel.rows:
            return plain(panel.rows[path].widget.toolTip())
    raise KeyError(path)


def test_every_input_explains_itself_in_words(window: MainWindow) -> None:
    seen = 0
    for panel in window.panels:
        for widget in inputs(panel):
            seen += 1
            text = plain(widget.toolTip())
            name = widget.accessibleName() or type(widget).__name__
            assert text.strip(), name
            words = text.split("\nAccepted:")[0]
            assert not BARE_RANGE.match(words), (name, words)
            assert len(re.findall(r"[A-Za-z]{2,}", words)) >= 5, (name, words)
            assert "one of" not in words, (name, words)  # no generated list of choices
    assert seen > 60


def test_number_boxes_end_with_their_accepted_range(window: MainWindow) -> None:
    for panel in window.panels:
        for row in panel.rows.values():
            widget = row.widget
            if not isinstance(widget, QSpinBox | QDoubleSpinBox):
                continue
            last = plain(widget.toolTip()).splitlines()[-1]
            assert last.startswith("Accepted: ") and " to " in last, (row.path, last)
    assert tip_of(window, "training.micro_batch_size").endswith("Accepted: 1 to 65,536.")
    assert tip_of(window, "hardware.utilization_target").endswith("Accepted: 10 to 100 %.")


def test_the_texts_live_in_one_place_and_name_real_rows(window: MainWindow) -> None:
    rows = {path for panel in window.panels for path in panel.rows}
    assert set(TIPS) <= rows, set(TIPS) - rows
    for path in rows:
        assert path in TIPS, path
        assert TIPS[path].split(".")[0] in tip_of(window, path), path


def test_key_knobs_say_what_they_do(window: MainWindow) -> None:
    checkpointing = tip_of(window, "training.activation_checkpointing")
    assert "selective" in checkpointing and "softmax" in checkpointing
    assert "full" in checkpointing and "input" in checkpointing
    zero = tip_of(window, "training.parallelism.zero_stage")
    assert "stage 2 also the gradients" in zero and "stage 1 the optimizer states" in zero
    assert "one forward and backward" in tip_of(window, "training.micro_batch_size")
    accumulation = tip_of(window, "training.gradient_accumulation_steps")
    assert "Micro-batches per optimizer step" in accumulation
    assert "not memory" in tip_of(window, "training.lora.alpha")
    targets = window.training_panel.targets.boxes
    assert "query projection" in plain(targets["q_proj"].toolTip())


def test_the_status_bar_gets_the_words_too(window: MainWindow) -> None:
    widget = window.training_panel.rows["training.micro_batch_size"].widget
    assert widget.statusTip().startswith("Sequences one GPU runs")
    assert "\n" not in widget.statusTip()
