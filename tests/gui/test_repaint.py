"""What an edit repaints: the chart and what changed, not the frames around them; the
chart drawn without antialiasing on screen and with it in an exported image."""

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QImage, QPainter, QPalette
from PySide6.QtWidgets import QApplication, QWidget

from memfit.gui.chart_export import chart_image
from memfit.gui.main_window import MainWindow


class Paints(QObject):
    """Counts the paint events each watched widget gets."""

    def __init__(self, widgets: list[QWidget]) -> None:
        super().__init__()
        self.counts = dict.fromkeys(widgets, 0)
        for widget in widgets:
            widget.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Paint and watched in self.counts:
            self.counts[watched] += 1  # type: ignore[index]
        return False


def settle() -> None:
    for _ in range(3):
        QApplication.processEvents()


def test_an_edit_repaints_the_chart_not_the_tabs_around_it(window: MainWindow) -> None:
    """The Memory page and the top of it are opaque, and the tabs draw no frame: an edit
    repaints the chart inside them without painting them behind it (each paint of the
    tab widget's frame cost a twentieth of an edit)."""
    window.resize(1280, 800)
    window.show()
    settle()
    paints = Paints([window.views, window.chart.plot.viewport()])
    spin = window.training_panel.rows["training.micro_batch_size"].widget
    spin.setValue(spin.value() + 1)
    settle()
    assert paints.counts[window.chart.plot.viewport()] >= 1  # the chart shows the edit
    assert paints.counts[window.views] == 0


def test_the_chart_draws_without_antialiasing_and_exports_with_it(window: MainWindow) -> None:
    chart = window.chart
    hints: list[bool] = []
    real = chart.render

    def render(*args: object) -> None:
        hints.append(bool(chart.plot.renderHints() & QPainter.RenderHint.Antialiasing))
        real(*args)  # type: ignore[arg-type]

    chart.render = render  # type: ignore[method-assign]
    assert not chart.plot.renderHints() & QPainter.RenderHint.Antialiasing
    image = chart_image(chart)
    assert hints == [True] and not image.isNull()
    assert not chart.plot.renderHints() & QPainter.RenderHint.Antialiasing  # back on screen
    assert chart.cut_marks.opts["antialias"]  # the one slanted line keeps it


def test_the_grid_is_drawn_opaque_in_the_colour_it_shows(window: MainWindow) -> None:
    """The left axis' grid lines: pyqtgraph gives them a translucent pen and draws them
    without antialiasing, which Qt's raster engine does some twenty times slower than an
    opaque line; they are drawn opaque in the colour the translucent pen shows over the
    plot's background, light and dark alike."""
    axis = window.chart.plot_item.getAxis("left")
    settle()
    image = QImage(10, 10, QImage.Format.Format_ARGB32_Premultiplied)
    painter = QPainter(image)
    try:
        specs = axis.generateDrawSpecs(painter)
        plain = pg.AxisItem.generateDrawSpecs(axis, painter)
    finally:
        painter.end()
    assert specs is not None and plain is not None
    ticks, translucent = specs[1], plain[1]
    assert len(ticks) == len(translucent) > 4  # major and minor lines of the grid
    assert any(pen.color().alpha() < 255 for pen, _, _ in translucent)
    background = window.chart.palette().color(QPalette.ColorRole.Base)
    assert axis.background == background
    for (pen, a, b), (seen, c, d) in zip(ticks, translucent, strict=True):
        assert pen.color().alpha() == 255 and (a, b) == (c, d)
        shown = seen.color()
        for got, over, under in zip(
            pen.color().getRgbF()[:3], shown.getRgbF()[:3], background.getRgbF()[:3], strict=True
        ):
            assert abs(got - (shown.alphaF() * over + (1 - shown.alphaF()) * under)) < 1e-6
