"""Scenarios side by side (File > Compare Scenarios): the current one, the pinned
baseline and saved files in one table -- the settings that differ, memory per category,
the totals, the step time, tokens/s and the cost (:mod:`memfit.engine.compare`) -- exported
as CSV or Markdown like the chart's data.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QGuiApplication
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from memfit.engine.compare import Compared, table, to_csv, to_markdown
from memfit.engine.files import write_text

EXPORT_FILTERS = "CSV (*.csv);;Markdown table (*.md)"


class CompareWindow(QDialog):
    """A non-modal window with the comparison's table; Export writes CSV or Markdown (by
    the file's suffix), Copy puts the Markdown table on the clipboard."""

    def __init__(self, compared: Compared, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.compared = compared
        self.setWindowTitle(f"Compare {len(compared.names)} scenarios - MemFit")
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        rows = table(compared)
        self.table = QTableWidget(0, 1 + len(compared.names))
        self.table.setHorizontalHeaderLabels(["", *compared.names])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setWordWrap(False)
        bold = QFont(self.font())
        bold.setBold(True)
        right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        section = ""
        for sec, item, cells in rows:
            if sec != section:
                r = self.table.rowCount()
                self.table.insertRow(r)
                head = QTableWidgetItem(sec)
                head.setFont(bold)
                self.table.setItem(r, 0, head)
                self.table.setSpan(r, 0, 1, self.table.columnCount())
                section = sec
            r = self.table.rowCount()
            self.table.insertRow(r)
            self.table.setItem(r, 0, QTableWidgetItem(item))
            for c, text in enumerate(cells, 1):
                cell = QTableWidgetItem(text)
                cell.setTextAlignment(right)
                self.table.setItem(r, c, cell)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        self.table.setCurrentCell(-1, -1)  # nothing looks selected until the user selects
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 8)
        note = QLabel(
            "Settings that differ, then memory per GPU (GiB = 2^30 bytes), the step time and "
            "the run. Each scenario is estimated as it is."
        )
        note.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.copy_button = QPushButton("&Copy as Markdown")
        buttons.addButton(self.copy_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.copy_button.clicked.connect(self.copy_markdown)
        self.export_button = QPushButton("&Export...")
        buttons.addButton(self.export_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.export_button.clicked.connect(self.export_dialog)
        buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addWidget(note)
        layout.addWidget(self.table, 1)
        layout.addWidget(buttons)
        self.resize(760, 620)

    def cell(self, item: str, column: int) -> str:
        """The text of row ``item`` in scenario ``column`` (0-based), for tests."""
        for r in range(self.table.rowCount()):
            first = self.table.item(r, 0)
            if first is not None and first.text() == item:
                cell = self.table.item(r, column + 1)
                return cell.text() if cell is not None else ""
        raise KeyError(item)

    def copy_markdown(self) -> None:
        QGuiApplication.clipboard().setText(to_markdown(self.compared))

    def export_dialog(self) -> None:
        name, chosen = QFileDialog.getSaveFileName(
            self, "Export the comparison", "memfit-comparison.csv", EXPORT_FILTERS
        )
        if name:
            path = Path(name)
            if path.suffix.lower() not in (".csv", ".md"):
                path = path.with_suffix(".md" if "Markdown" in chosen else ".csv")
            self.export(path)

    def export(self, path: Path) -> None:
        """Write the comparison to ``path``: Markdown for ``.md``, else CSV."""
        text = to_markdown(self.compared) if path.suffix.lower() == ".md" else to_csv(self.compared)
        write_text(path, text)
