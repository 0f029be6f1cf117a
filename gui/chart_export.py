"""Exporting a :class:`~memfit.gui.chart.BreakdownChart` -- or any widget that holds pyqtgraph
plots -- as an image, without any dialog.

* :func:`chart_image` -- the whole chart (verdict banner, plot, note) as a ``QImage``, at
  ``scale`` times its logical size, or exactly ``width`` pixels wide;
* :func:`captioned_image` -- that image under a caption naming the scenario (model,
  method, precision, micro-batch x sequence, GPUs, training stack), for PNG export and
  "Copy chart";
* :class:`ImageSize`, :data:`IMAGE_SIZES` -- the sizes a user picks from (1x, 2x, 3x the
  on-screen size; 1200 and 1920 pixels wide for slides), and :func:`image_pixels`, the
  pixel size of the captioned image at one of them;
* :func:`png_bytes`, :func:`svg_bytes` -- the chart, with its caption, encoded in memory;
* :func:`export_png`, :func:`export_svg` -- those bytes saved as an editor saves
  (:func:`memfit.engine.files.write_bytes`: a symbolic link is followed, a FIFO or device is
  refused, the file's mode is kept, the write is atomic).

A scaled size draws the chart laid out as on screen, at more pixels per logical pixel; a
fixed width does too where that takes 1 to 2 pixels per logical pixel, else lays it out
wider or narrower (:func:`layout_for`). The caption is wrapped at the width laid out, so
it is never cut.

The SVG is the plot (``chart.plot_item``, or the graphics item given) through pyqtgraph's
``SVGExporter`` -- under the caption and the verdict banner, over the chart's note, all as
SVG text -- or the whole widget painted into Qt's ``QSvgGenerator`` where that exporter
fails. The caption and verdict default to the chart's own (its ``export_context()``, see
:class:`memfit.gui.chart.ExportContext`); ``""`` leaves one out. Each function restores whatever
it changes (the widget's size) before it returns.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from pyqtgraph.exporters import SVGExporter
from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QPoint, QRect, QRectF, QSize, Qt
from PySide6.QtGui import QFont, QFontMetrics, QImage, QImageWriter, QPainter, QPalette
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import QApplication, QGraphicsItem, QWidget

from memfit.engine.files import write_bytes
from memfit.gui.chart import wrap_text

PathLike = str | os.PathLike[str]
#: the margin around the caption, in logical pixels
CAPTION_MARGIN = 8


class ExportError(OSError):
    """An image could not be written; the message names the file."""


def _settled(chart: QWidget) -> QSize:
    """Lay ``chart`` out -- and the window around it, whose pending layout could otherwise
    resize it in the middle of an export -- and return its size."""
    chart.ensurePolished()
    if layout := chart.layout():
        layout.activate()
    # the window's layout and the plot's own (graphics) layout settle through posted events
    QApplication.sendPostedEvents()
    return chart.size()


def _resized(chart: QWidget, size: QSize | None) -> QSize:
    """Resize ``chart`` to ``size`` (when given) and lay it out; return the old size."""
    old = _settled(chart)
    if size is not None and size != old:
        chart.resize(size)
        _settled(chart)
    return old


#: a fixed-width image draws the chart at 1 to 2 image pixels per logical pixel: outside
#: that, the chart is laid out at the width that gives the nearer bound, so a slide from a
#: wide window keeps readable text and one from a narrow window is not cramped
WIDTH_RATIOS = (1.0, 2.0)


@dataclass(frozen=True, slots=True)
class ImageSize:
    """A size for an exported image: ``scale`` times the chart's on-screen (logical) size,
    or -- when ``width`` is given -- exactly ``width`` pixels wide, the height in
    proportion (see :func:`layout_for`). ``label`` names it in the export dialog."""

    label: str
    scale: int = 1
    width: int | None = None


#: the sizes offered for a PNG export (an SVG is vector: it has the on-screen size)
IMAGE_SIZES = (
    ImageSize("1x", scale=1),
    ImageSize("2x", scale=2),
    ImageSize("3x", scale=3),
    ImageSize("1200 px wide", width=1200),
    ImageSize("1920 px wide", width=1920),
)


def layout_for(on_screen: QSize, scale: int = 1, width: int | None = None) -> tuple[QSize, float]:
    """The logical size to lay the chart out at and the image pixels per logical pixel.

    ``scale`` keeps the on-screen layout. ``width`` keeps it too where that takes
    :data:`WIDTH_RATIOS` pixels per logical pixel; else the chart is laid out ``width``
    (or ``width / 2``) logical pixels wide, the on-screen aspect ratio kept.
    """
    if width is None:
        if scale < 1:
            raise ValueError(f"scale must be a whole number from 1, got {scale!r}")
        return on_screen, float(scale)
    if width < 1:
        raise ValueError(f"width must be a whole number of pixels from 1, got {width!r}")
    low, high = WIDTH_RATIOS
    shown = max(1, on_screen.width())
    ratio = min(high, max(low, width / shown))
    if ratio == width / shown:
        return on_screen, ratio
    logical_width = max(1, round(width / ratio))
    logical = QSize(logical_width, max(1, round(on_screen.height() * logical_width / shown)))
    return logical, width / logical_width


def _antialiased(chart: QWidget) -> contextlib.AbstractContextManager[None]:
    """The chart drawn with antialiasing while in the block: the breakdown chart draws
    without it on screen (:meth:`memfit.gui.chart.BreakdownChart.antialiased`), an image
    keeps it."""
    antialiased = getattr(chart, "antialiased", None)
    return antialiased() if antialiased is not None else contextlib.nullcontext()


def chart_image(
    chart: QWidget, scale: int = 1, *, size: QSize | None = None, width: int | None = None
) -> QImage:
    """The whole chart rendered at ``scale`` x its logical size (``size`` if given), or
    exactly ``width`` pixels wide (the height in proportion, see :func:`layout_for`).

    The image has the pixels per logical pixel as its device pixel ratio, so text and
    lines are drawn at the higher resolution rather than scaled up.
    """
    logical, ratio = layout_for(size or _settled(chart), scale, width)
    old = _resized(chart, logical)
    try:
        pixels = QSize(
            width if width is not None else round(logical.width() * ratio),
            round(logical.height() * ratio),
        )
        image = QImage(pixels, QImage.Format.Format_ARGB32_Premultiplied)
        image.setDevicePixelRatio(ratio)
        image.fill(chart.palette().color(chart.backgroundRole()))
        with _antialiased(chart):
            chart.render(image)
        return image
    finally:
        if chart.size() != old:
            chart.resize(old)


@dataclass(frozen=True, slots=True)
class _Context:
    """What goes around the plot in a file: caption, verdict (and its colours), note."""

    caption: str
    verdict: str
    background: str = "#5F6368"
    foreground: str = "#FFFFFF"
    note: str = ""


def _context(chart: QWidget, caption: str | None, verdict: str | None) -> _Context:
    """The chart's own caption and verdict (``export_context()``), or those given."""
    own = getattr(chart, "export_context", None)
    ctx = own() if callable(own) else None
    return _Context(
        caption if caption is not None else getattr(ctx, "caption", ""),
        verdict if verdict is not None else getattr(ctx, "verdict", ""),
        getattr(ctx, "verdict_background", "#5F6368"),
        getattr(ctx, "verdict_foreground", "#FFFFFF"),
        getattr(ctx, "note", ""),
    )


def _caption_lines(text: str, width: float, metrics: QFontMetrics) -> list[str]:
    """``text`` (lines, each word-wrapped to ``width``) as the caption's lines."""
    return [line for part in text.splitlines() for line in wrap_text(part, width, metrics)]


@dataclass(frozen=True, slots=True)
class _Caption:
    """The caption laid out at the chart's logical width: fonts and lines, line spacing,
    the strip's height."""

    blocks: tuple[tuple[QFont, tuple[str, ...]], ...]
    width: int
    spacing: int
    height: int


def _caption(
    chart: QWidget, caption: str | None, verdict: str | None, logical_width: int | None = None
) -> _Caption:
    """The scenario (``caption``, by default the chart's) in bold, then ``verdict`` when
    given, word-wrapped to the chart's width (or ``logical_width``) less the margins; no
    lines, height 0, when there is neither."""
    ctx = _context(chart, caption, "")
    texts = [t for t in (ctx.caption, verdict or "") if t]
    font = QFont(chart.font())
    bold = QFont(font)
    bold.setBold(True)
    width = (logical_width or chart.width()) - 2 * CAPTION_MARGIN
    blocks = tuple(
        (f, tuple(_caption_lines(text, width, QFontMetrics(f))))
        for f, text in zip((bold, font), texts, strict=False)
    )
    spacing = max(QFontMetrics(f).lineSpacing() for f in (font, bold))
    lines = sum(len(lines) for _f, lines in blocks)
    return _Caption(blocks, width, spacing, 2 * CAPTION_MARGIN + spacing * lines if lines else 0)


def image_pixels(
    chart: QWidget, image_size: ImageSize, *, caption: str | None = None, verdict: str | None = None
) -> QSize:
    """The pixel size of :func:`captioned_image` of ``chart`` at ``image_size``."""
    logical, ratio = layout_for(_settled(chart), image_size.scale, image_size.width)
    header = _caption(chart, caption, verdict, logical.width()).height
    width = image_size.width or round(logical.width() * ratio)
    return QSize(width, round(logical.height() * ratio) + round(header * ratio))


def captioned_image(
    chart: QWidget,
    scale: int = 1,
    *,
    size: QSize | None = None,
    width: int | None = None,
    caption: str | None = None,
    verdict: str | None = None,
) -> QImage:
    """:func:`chart_image` under a caption: the scenario (``caption``, by default the
    chart's), then ``verdict`` when one is given (the chart's banner already carries its
    own). With neither, the chart's image alone. The caption is laid out at the chart's
    logical width and drawn at the image's scale, so it wraps as the chart's own text does."""
    logical, _ratio = layout_for(size or _settled(chart), scale, width)
    old = _resized(chart, logical)
    try:
        image = chart_image(chart, scale, width=width)
        layout = _caption(chart, caption, verdict)
    finally:
        if chart.size() != old:
            chart.resize(old)
    if not layout.height:
        return image
    ratio = image.devicePixelRatio()
    header = round(layout.height * ratio)
    out = QImage(
        QSize(image.width(), image.height() + header), QImage.Format.Format_ARGB32_Premultiplied
    )
    palette = chart.palette()
    out.fill(palette.color(chart.backgroundRole()))
    painter = QPainter(out)
    try:
        painter.setRenderHint(QPainter.RenderHint.TextAntialiasing)
        painter.setPen(palette.color(QPalette.ColorRole.Text))
        painter.save()
        painter.scale(ratio, ratio)  # the caption in logical pixels, as on screen
        y = CAPTION_MARGIN
        for f, lines in layout.blocks:
            painter.setFont(f)
            for line in lines:
                painter.drawText(
                    QRectF(CAPTION_MARGIN, y, layout.width, layout.spacing),
                    int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter),
                    line,
                )
                y += layout.spacing
        painter.restore()
        chart_pixels = QImage(image)
        chart_pixels.setDevicePixelRatio(1.0)  # placed pixel for pixel under the strip
        painter.drawImage(QPoint(0, header), chart_pixels)
    finally:
        painter.end()
    out.setDevicePixelRatio(ratio)
    return out


def png_bytes(
    chart: QWidget,
    scale: int = 1,
    *,
    size: QSize | None = None,
    width: int | None = None,
    caption: str | None = None,
    verdict: str | None = None,
) -> bytes:
    """The whole chart as PNG data, ``scale`` x its logical size in pixels or ``width``
    pixels wide, under its caption (see :func:`captioned_image`)."""
    image = captioned_image(chart, scale, size=size, width=width, caption=caption, verdict=verdict)
    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    writer = QImageWriter(buffer, QByteArray(b"png"))
    if not writer.write(image):
        raise ExportError(f"could not encode the chart as PNG: {writer.errorString()}")
    return bytes(buffer.data().data())


def export_png(
    chart: QWidget,
    path: PathLike,
    scale: int = 1,
    *,
    size: QSize | None = None,
    width: int | None = None,
    caption: str | None = None,
    verdict: str | None = None,
) -> None:
    """Write the whole chart to ``path`` as PNG, ``scale`` x its logical size in pixels or
    ``width`` pixels wide, under its caption (see :func:`captioned_image`)."""
    data = png_bytes(chart, scale, size=size, width=width, caption=caption, verdict=verdict)
    _write(path, data, "PNG")


def svg_bytes(
    chart: QWidget,
    item: QGraphicsItem | None = None,
    *,
    title: str = "MemFit memory breakdown",
    caption: str | None = None,
    verdict: str | None = None,
) -> bytes:
    """The plot as SVG (vector text and shapes): ``item`` (a plot or a layout of plots),
    by default the chart's ``plot_item``, under the caption and the verdict banner and
    over the chart's note (by default the chart's own; ``""`` leaves one out).

    pyqtgraph's ``SVGExporter`` on the item comes first; should it raise, the whole
    widget is painted into a ``QSvgGenerator`` instead. Either is titled ``title``.
    """
    _resized(chart, None)
    ctx = _context(chart, caption, verdict)
    if item is None:
        item = getattr(chart, "plot_item", None)
    try:
        if item is None:
            raise TypeError("no plot item to export")
        data = SVGExporter(item).export(toBytes=True)
        if not isinstance(data, bytes):
            raise TypeError(f"the SVG exporter gave {type(data).__name__}, not bytes")
        return _framed_svg(data.decode("utf-8"), chart, ctx, title).encode("utf-8")
    except Exception:  # the exporter depends on Qt internals; Qt's own generator is the fallback
        return _svg_with_qt(chart, title, ctx.caption)


def export_svg(
    chart: QWidget,
    path: PathLike,
    item: QGraphicsItem | None = None,
    *,
    title: str = "MemFit memory breakdown",
    caption: str | None = None,
    verdict: str | None = None,
) -> None:
    """Write the plot to ``path`` as SVG (see :func:`svg_bytes`)."""
    data = svg_bytes(chart, item, title=title, caption=caption, verdict=verdict)
    _write(path, data, "SVG")


def _write(path: PathLike, data: bytes, kind: str) -> None:
    try:
        write_bytes(path, data)
    except OSError as exc:
        raise ExportError(f"could not write the {kind} file {os.fspath(path)!r}: {exc}") from exc


_VIEW_BOX = re.compile(r'viewBox\s*=\s*"0 0 ([0-9.]+) ([0-9.]+)"')


def _svg_text(x: float, y: float, text: str, size: float, colour: str, **attrs: str) -> str:
    extra = "".join(f" {key.replace('_', '-')}={quoteattr(value)}" for key, value in attrs.items())
    return (
        f'<text x="{x:g}" y="{y:g}" font-family="sans-serif" font-size="{size:g}"'
        f' fill={quoteattr(colour)} stroke="none" xml:space="preserve"{extra}>'
        f"{escape(text)}</text>"
    )


def _framed_svg(svg: str, chart: QWidget, ctx: _Context, title: str) -> str:
    """pyqtgraph's SVG of the plot with the caption and the verdict banner above it and
    the note below, as text; titled ``title``."""
    found = _VIEW_BOX.search(svg)
    body_start = svg.find("<defs>")
    end = svg.rfind("</svg>")
    if found is None or body_start < 0 or end < 0:
        raise ValueError("unexpected SVG from the exporter")
    width, height = float(found.group(1)), float(found.group(2))
    palette = chart.palette()
    text_colour = palette.color(QPalette.ColorRole.Text).name()
    font = QFont(chart.font())
    size = float(font.pixelSize() if font.pixelSize() > 0 else round(font.pointSizeF() * 4 / 3))
    font.setPixelSize(round(size))
    metrics = QFontMetrics(font)
    line = metrics.lineSpacing() * 1.15
    inner = width - 2 * CAPTION_MARGIN
    head: list[str] = []
    y = float(CAPTION_MARGIN)
    bold = QFont(font)
    bold.setBold(True)
    for text in _caption_lines(ctx.caption, inner, QFontMetrics(bold)):
        head.append(
            _svg_text(
                CAPTION_MARGIN, y + metrics.ascent(), text, size, text_colour, font_weight="bold"
            )
        )
        y += line
    if ctx.verdict:
        lines = _caption_lines(ctx.verdict, inner - 12, QFontMetrics(bold))
        box = len(lines) * line + 12
        y += 4
        head.append(
            f'<rect x="{CAPTION_MARGIN}" y="{y:g}" width="{inner:g}" height="{box:g}" rx="4"'
            f' fill={quoteattr(ctx.background)} stroke="none"/>'
        )
        for i, text in enumerate(lines):
            head.append(
                _svg_text(
                    width / 2,
                    y + 6 + i * line + metrics.ascent(),
                    text,
                    size,
                    ctx.foreground,
                    font_weight="bold",
                    text_anchor="middle",
                )
            )
        y += box
    top = y + 4 if head else 0.0
    foot: list[str] = []
    y = top + height + 4
    for text in _caption_lines(ctx.note, inner, metrics):
        foot.append(
            _svg_text(
                CAPTION_MARGIN, y + metrics.ascent(), text, size, text_colour, fill_opacity="0.7"
            )
        )
        y += line
    total = y + CAPTION_MARGIN if foot else top + height
    background = palette.color(chart.backgroundRole()).name()
    out = (
        svg[: found.start()] + f'viewBox="0 0 {width:g} {total:g}"' + svg[found.end() : body_start]
    )
    out = re.sub(r"<title>.*?</title>", f"<title>{escape(title)}</title>", out, count=1, flags=re.S)
    return (
        out + f'<rect x="0" y="0" width="{width:g}" height="{total:g}" fill={quoteattr(background)}'
        ' stroke="none"/>\n'
        + "\n".join(head)
        + f'\n<g transform="translate(0,{top:g})">\n'
        + svg[body_start:end]
        + "</g>\n"
        + "\n".join(foot)
        + "\n</svg>\n"
    )


def _svg_with_qt(chart: QWidget, title: str, caption: str = "") -> bytes:
    """The whole widget (banner, plot, note) painted into Qt's SVG generator, under
    ``caption``."""
    metrics = QFontMetrics(chart.font())
    inner = chart.width() - 2 * CAPTION_MARGIN
    lines = _caption_lines(caption, inner, metrics)
    header = 2 * CAPTION_MARGIN + len(lines) * metrics.lineSpacing() if lines else 0
    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    generator = QSvgGenerator()
    generator.setOutputDevice(buffer)
    generator.setSize(QSize(chart.width(), chart.height() + header))
    generator.setViewBox(QRect(0, 0, chart.width(), chart.height() + header))
    generator.setTitle(title)
    painter = QPainter()
    if not painter.begin(generator):
        raise ExportError("could not paint the chart as SVG")
    try:
        if lines:
            painter.fillRect(
                QRect(0, 0, chart.width(), header), chart.palette().color(chart.backgroundRole())
            )
            painter.setPen(chart.palette().color(QPalette.ColorRole.Text))
            painter.setFont(chart.font())
            for i, text in enumerate(lines):
                y = CAPTION_MARGIN + i * metrics.lineSpacing() + metrics.ascent()
                painter.drawText(QPoint(CAPTION_MARGIN, y), text)
        chart.render(painter, QPoint(0, header))
    finally:
        painter.end()
    return bytes(buffer.data().data())
