"""Exporting a :class:`~gui.chart.BreakdownChart` as an image, without any dialog.

* :func:`chart_image` -- the whole chart (verdict banner, plot, note) as a ``QImage``, at
  ``scale`` times its logical size; used for PNG export and for "Copy chart";
* :func:`export_png` -- :func:`chart_image` written to a PNG file;
* :func:`export_svg` -- the plot as SVG through pyqtgraph's ``SVGExporter``, or the whole
  widget painted into Qt's ``QSvgGenerator`` where that exporter fails.

Each function restores whatever it changes (the widget's size) before it returns.
"""

from __future__ import annotations

import os

from pyqtgraph.exporters import SVGExporter
from PySide6.QtCore import QByteArray, QPoint, QRect, QSize
from PySide6.QtGui import QImage, QImageWriter, QPainter
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import QApplication

from gui.chart import BreakdownChart

PathLike = str | os.PathLike[str]


class ExportError(OSError):
    """An image could not be written; the message names the file."""


def _resized(chart: BreakdownChart, size: QSize | None) -> QSize:
    """Resize ``chart`` to ``size`` (when given) and lay it out; return the old size."""
    old = chart.size()
    if size is not None and size != old:
        chart.resize(size)
    chart.ensurePolished()
    if layout := chart.layout():
        layout.activate()
    # the plot's own (graphics) layout settles through posted events
    QApplication.sendPostedEvents()
    return old


def chart_image(chart: BreakdownChart, scale: int = 1, *, size: QSize | None = None) -> QImage:
    """The whole chart rendered at ``scale`` x its logical size (``size`` if given).

    The image has ``scale`` as its device pixel ratio, so text and lines are drawn at the
    higher resolution rather than scaled up.
    """
    if scale < 1:
        raise ValueError(f"scale must be a whole number from 1, got {scale!r}")
    old = _resized(chart, size)
    try:
        logical = chart.size()
        image = QImage(logical * scale, QImage.Format.Format_ARGB32_Premultiplied)
        image.setDevicePixelRatio(scale)
        image.fill(chart.palette().color(chart.backgroundRole()))
        chart.render(image)
        return image
    finally:
        if chart.size() != old:
            chart.resize(old)


def export_png(
    chart: BreakdownChart, path: PathLike, scale: int = 1, *, size: QSize | None = None
) -> None:
    """Write the whole chart to ``path`` as PNG, ``scale`` x its logical size in pixels."""
    image = chart_image(chart, scale, size=size)
    writer = QImageWriter(os.fspath(path), QByteArray(b"png"))
    if not writer.write(image):
        raise ExportError(
            f"could not write the PNG file {os.fspath(path)!r}: {writer.errorString()}"
        )


def export_svg(chart: BreakdownChart, path: PathLike) -> None:
    """Write the plot to ``path`` as SVG (vector text and shapes).

    pyqtgraph's ``SVGExporter`` on the plot item comes first; should it raise, the whole
    widget is painted into a ``QSvgGenerator`` instead.
    """
    file_name = os.fspath(path)
    _resized(chart, None)
    try:
        SVGExporter(chart.plot_item).export(fileName=file_name)
    except Exception:  # the exporter depends on Qt internals; Qt's own generator is the fallback
        _export_svg_with_qt(chart, file_name)


def _export_svg_with_qt(chart: BreakdownChart, file_name: str) -> None:
    generator = QSvgGenerator()
    generator.setFileName(file_name)
    generator.setSize(chart.size())
    generator.setViewBox(QRect(0, 0, chart.width(), chart.height()))
    generator.setTitle("MemFit memory breakdown")
    painter = QPainter()
    if not painter.begin(generator):
        raise ExportError(f"could not write the SVG file {file_name!r}")
    try:
        chart.render(painter, QPoint())
    finally:
        painter.end()
