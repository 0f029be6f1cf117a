"""GUI test setup: no message box ever blocks a test.

Every ``QMessageBox.exec`` is answered by :class:`~gui.monkey.MessageBoxes`: with the
answers a test queues, else Discard (when offered) or OK. What each box said, and in which
text format, is recorded for the test to check.
"""

import pytest
from PySide6.QtWidgets import QMessageBox

from gui.monkey import MessageBoxes


@pytest.fixture(autouse=True)
def message_boxes(monkeypatch: pytest.MonkeyPatch) -> MessageBoxes:
    boxes = MessageBoxes()
    monkeypatch.setattr(QMessageBox, "exec", boxes.exec_function())
    return boxes
