"""A layout that lines its widgets up left to right and wraps them to the width it has.

:class:`FlowLayout` places its items in the order they were added, as many to a row as the
width takes, and asks for the height its rows need at a width (``heightForWidth``), so a
row of toggles uses a wide window's width and wraps in a narrow one.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QLayoutItem, QWidget, QWidgetItem

__all__ = ["FlowLayout"]


class FlowLayout(QLayout):
    """Items left to right in rows, wrapped at the layout's width."""

    def __init__(self, parent: QWidget | None = None, spacing: int = 4, row_spacing: int = 2):
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._spacing = spacing
        self._row_spacing = row_spacing

    # -- the items -------------------------------------------------------------------------

    def addItem(self, item: QLayoutItem) -> None:
        self._items.append(item)

    def insert_widget(self, index: int, widget: QWidget) -> None:
        """``widget`` at ``index`` of the order (the end when ``index`` is past it)."""
        self.addChildWidget(widget)
        self._items.insert(min(index, len(self._items)), QWidgetItem(widget))
        self.invalidate()

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def widgets(self) -> list[QWidget]:
        """The widgets in their order."""
        return [w for item in self._items if (w := item.widget()) is not None]

    # -- sizes -----------------------------------------------------------------------------

    def expandingDirections(self) -> Qt.Orientation:
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return self._arrange(QRect(0, 0, width, 0), place=False)

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        self._arrange(rect, place=True)

    def sizeHint(self) -> QSize:
        return self.minimumSize()

    def minimumSize(self) -> QSize:
        """The widest item, one row high: the layout can always wrap down to it."""
        size = QSize()
        for item in self._shown():
            size = size.expandedTo(item.minimumSize())
        margins = self.contentsMargins()
        return size + QSize(margins.left() + margins.right(), margins.top() + margins.bottom())

    def _shown(self) -> list[QLayoutItem]:
        shown = []
        for item in self._items:
            widget = item.widget()
            if widget is None or not widget.isHidden():
                shown.append(item)
        return shown

    def _arrange(self, rect: QRect, place: bool) -> int:
        """Lay the shown items out in ``rect`` (only measure unless ``place``); the
        height they take."""
        margins = self.contentsMargins()
        area = rect.adjusted(margins.left(), margins.top(), -margins.right(), -margins.bottom())
        x, y, row_height = area.x(), area.y(), 0
        for item in self._shown():
            hint = item.sizeHint()
            if x > area.x() and x + hint.width() > area.right() + 1:  # wrap
                x, y = area.x(), y + row_height + self._row_spacing
                row_height = 0
            if place:
                item.setGeometry(QRect(QPoint(x, y), hint))
            x += hint.width() + self._spacing
            row_height = max(row_height, hint.height())
        return y + row_height - rect.y() + margins.bottom()
