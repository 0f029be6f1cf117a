"""The window at its sizes: the what-if toggles use the width they have (one row in a wide
window, wrapped rows in a narrow one, each at its full size, in the engine's order), and
the chart's y-axis title is never longer than the plot is high."""

from __future__ import annotations

from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QApplication, QLabel, QWidget
from pytestqt.qtbot import QtBot

from memfit.gui.chart import SHORT_Y_LABEL, TINY_Y_LABEL, Y_LABEL
from memfit.gui.flow import FlowLayout
from memfit.gui.main_window import MainWindow


def _rows(widgets: list[QWidget]) -> list[int]:
    return sorted({w.geometry().y() for w in widgets})


def test_toggles_take_one_row_when_wide_and_wrap_when_narrow(
    window: MainWindow, qapp: QApplication
) -> None:
    bar = window.whatif
    shown = [w for w in bar._grid.widgets() if not w.isHidden()]
    window.resize(1920, 1080)
    qapp.processEvents()
    assert len(_rows(shown)) == 1
    window.resize(1024, 640)
    qapp.processEvents()
    assert len(_rows(shown)) >= 2
    for w in shown:  # never squeezed below the width its text needs
        assert w.width() >= w.sizeHint().width()
        assert w.geometry().right() <= bar.width()
    # the bar asks for the height of its rows, so nothing under it overlaps the toggles
    assert bar.height() >= max(w.geometry().bottom() for w in shown)


def test_flow_layout_places_in_order_and_measures_its_height(qtbot: QtBot) -> None:
    host = QWidget()
    qtbot.addWidget(host)
    flow = FlowLayout(host, spacing=4, row_spacing=2)
    flow.setContentsMargins(0, 0, 0, 0)
    labels = [QLabel(f"item {i}") for i in range(6)]
    for label in labels:
        flow.addWidget(label)
    flow.insert_widget(0, first := QLabel("first"))
    assert flow.widgets() == [first, *labels] and flow.count() == 7
    width = max(w.sizeHint().width() for w in flow.widgets())
    height = max(w.sizeHint().height() for w in flow.widgets())
    # as narrow as the widest item: one to a row
    assert flow.heightForWidth(width) == 7 * height + 6 * 2
    wide = sum(w.sizeHint().width() for w in flow.widgets()) + 6 * 4
    assert flow.heightForWidth(wide) == height
    labels[0].hide()  # hidden widgets take no room
    assert flow.heightForWidth(width) == 6 * height + 5 * 2
    taken = flow.takeAt(0)
    assert taken is not None and taken.widget() is first and flow.count() == 6
    assert flow.itemAt(99) is None and flow.takeAt(99) is None


def test_the_y_axis_title_fits_the_plot_height(window: MainWindow, qapp: QApplication) -> None:
    chart = window.chart
    axis = chart.plot_item.getAxis("left")
    metrics = QFontMetrics(axis.label.font())
    for size, titles in (
        ((1920, 1080), (Y_LABEL,)),
        ((1280, 800), (Y_LABEL, SHORT_Y_LABEL)),
        ((1024, 640), (SHORT_Y_LABEL, TINY_Y_LABEL)),
    ):
        window.resize(*size)
        qapp.processEvents()
        assert chart.y_label() in titles
        height = chart.plot_item.getViewBox().height()
        assert metrics.horizontalAdvance(chart.y_label()) <= height
