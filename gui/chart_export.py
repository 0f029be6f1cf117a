"""Exporting a :class:`~gui.chart.BreakdownChart` -- or any widget that holds pyqtgraph
plots -- as an image, without any dialog.

* :func:`chart_image` -- the whole chart (verdict banner, plot, note) as a ``QImage``, at
  ``scale`` times its logical size; used for PNG export and for "Copy chart";
* :func:`png_bytes`, :func:`svg_bytes` -- the chart encoded in memory;
* :func:`export_png`, :func:`export_svg` -- those bytes saved as an editor saves
  (:func:`engine.files.write_bytes`: a symbolic link is followed, a FIFO or device is
  refused, the file's mode is kept, the write is atomic).

The SVG is the plot (``chart.plot_item``, or the graphics item given) through pyqtgraph's
``SVGExporter``, or the whole widget painted into Qt's ``QSvgGenerator`` where that
exporter fails. Each function restores whatever it
changes (the widget's size) before it returns.
"""

from __future__ import annotations

import os

from pyqtgraph.exporters import SVGExporter
from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QPoint, QRect, QSize
from PySide6.QtGui import QImage, QImageWriter, QPainter
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import QApplication, QGraphicsItem, QWidget

from engine.files import write_bytes

PathLike = str | os.PathLike[str]


class ExportError(OSError):
    """An image could not be written; the message names the file."""


def _resized(chart: QWidget, size: QSize | None) -> QSize:
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


def chart_image(chart: QWidget, scale: int = 1, *, size: QSize | None = None) -> QImage:
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


def png_bytes(chart: QWidget, scale: int = 1, *, size: QSize | None = None) -> bytes:
    """The whole chart as PNG data, ``scale`` x its logical size in pixels."""
    image = chart_image(chart, scale, size=size)
    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    writer = QImageWriter(buffer, QByteArray(b"png"))
    if not writer.write(image):
        raise ExportError(f"could not encode the chart as PNG: {writer.errorString()}")
    return bytes(buffer.data().data())


def export_png(
    chart: QWidget, path: PathLike, scale: int = 1, *, size: QSize | None = None
) -> None:
    """Write the whole chart to ``path`` as PNG, ``scale`` x its logical size in pixels."""
    _write(path, png_bytes(chart, scale, size=size), "PNG")


def svg_bytes(
    chart: QWidget, item: QGraphicsItem | None = None, *, title: str = "MemFit memory breakdown"
) -> bytes:
    """The plot as SVG (vector text and shapes): ``item`` (a plot or a layout of plots),
    by default the chart's ``plot_item``.

    pyqtgraph's ``SVGExporter`` on the item comes first; should it raise, the whole
    widget is painted into a ``QSvgGenerator`` instead, titled ``title``.
    """
    _resized(chart, None)
    if item is None:
        item = getattr(chart, "plot_item", None)
    try:
        if item is None:
            raise TypeError("no plot item to export")
        data = SVGExporter(item).export(toBytes=True)
        if not isinstance(data, bytes):
            raise TypeError(f"the SVG exporter gave {type(data).__name__}, not bytes")
        return data
    except Exception:  # the exporter depends on Qt internals; Qt's own generator is the fallback
        return _svg_with_qt(chart, title)


def export_svg(
    chart: QWidget,
    path: PathLike,
    item: QGraphicsItem | None = None,
    *,
    title: str = "MemFit memory breakdown",
) -> None:
    """Write the plot to ``path`` as SVG (see :func:`svg_bytes`)."""
    _write(path, svg_bytes(chart, item, title=title), "SVG")


def _write(path: PathLike, data: bytes, kind: str) -> None:
    try:
        write_bytes(path, data)
    except OSError as exc:
        raise ExportError(f"could not write the {kind} file {os.fspath(path)!r}: {exc}") from exc


def _svg_with_qt(chart: QWidget, title: str) -> bytes:
    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    generator = QSvgGenerator()
    generator.setOutputDevice(buffer)
    generator.setSize(chart.size())
    generator.setViewBox(QRect(0, 0, chart.width(), chart.height()))
    generator.setTitle(title)
    painter = QPainter()
    if not painter.begin(generator):
        raise ExportError("could not paint the chart as SVG")
    try:
        chart.render(painter, QPoint())
    finally:
        painter.end()
    return bytes(buffer.data().data())
