"""Colours and styling shared by the Tradeoffs plots, for light and dark palettes.

* :func:`verdict_colour` -- the verdict colours of the breakdown chart's banner
  (:data:`memfit.gui.chart.VERDICTS`), lightened on a dark background so that points stay
  readable there;
* :data:`SERIES_COLOURS` -- Okabe--Ito colours for two series (a darker and a lighter
  variant each, for light and dark backgrounds);
* :func:`style_plot` -- background, axes, grid and labels of a pyqtgraph plot from a
  widget's palette;
* :func:`palette_colours` -- background, text and a muted colour between them (the
  breakdown chart's, :func:`memfit.gui.chart.palette_colours`).
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QEvent
from PySide6.QtGui import QBrush, QColor, QPalette

from memfit.gui.chart import CAPACITY_COLOUR, VERDICTS
from memfit.gui.chart import palette_colours as palette_colours  # the plots share it

#: verdict -> words in a legend
VERDICT_WORDS = {"fits": "fits", "tight": "tight", "oom": "does not fit"}

#: (on a light background, on a dark one): Okabe & Ito's blue / sky blue, vermillion /
#: orange, for "no checkpointing" and "full checkpointing"
SERIES_COLOURS = {
    "none": ("#0072B2", "#56B4E9"),
    "full": ("#D55E00", "#E69F00"),
}


def palette_changed(widget: object, event: QEvent) -> bool:
    """``event`` changes the palette of ``widget``, once the widget is built (a palette
    event may come while QWidget's constructor runs, before ``_built`` is set)."""
    kinds = (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange)
    return event.type() in kinds and getattr(widget, "_built", False)


def is_dark_background(colour: QColor) -> bool:
    return colour.lightness() < 128


def verdict_colour(verdict: str, dark: bool) -> QColor:
    """The verdict's colour, lighter on a dark background (the banner's own colours are
    chosen for white text on them)."""
    colour = QColor(VERDICTS[verdict][1])
    if dark:
        colour = colour.lighter({"fits": 170, "tight": 110, "oom": 150}[verdict])
    return colour


def series_colour(key: str, dark: bool) -> QColor:
    light, dark_variant = SERIES_COLOURS[key]
    return QColor(dark_variant if dark else light)


def capacity_colour(dark: bool) -> QColor:
    colour = QColor(CAPACITY_COLOUR)
    return colour.lighter(125) if dark else colour


def style_plot(item: pg.PlotItem, palette: QPalette) -> None:
    """Axes of ``item`` and their labels in the palette's text colour."""
    _background, foreground, _muted = palette_colours(palette)
    for name in ("left", "bottom"):
        axis = item.getAxis(name)
        axis.setPen(pg.mkPen(foreground))
        axis.setTextPen(pg.mkPen(foreground))
        if axis.labelText:
            axis.setLabel(axis.labelText, color=foreground.name())


def line_label_fill(palette: QPalette) -> QBrush:
    """A see-through fill behind a line's label, so the label reads over points."""
    background, _fg, _muted = palette_colours(palette)
    fill = QColor(background)
    fill.setAlpha(210)
    return QBrush(fill)
