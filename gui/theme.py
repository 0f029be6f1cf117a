"""Light, dark or the system's colours, with Qt 6's colour-scheme hint and Fusion.

A theme switch reaches every widget at once: the application palette changes, and the
window polishes again each of its widgets with a style sheet of its own
(:func:`repolish_window`), since such a widget keeps the palette it was polished with.
Style sheets name palette roles (``palette(button)``), never fixed colours, so they
follow the switch.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory, QWidget

THEMES = ("system", "light", "dark")


def dark_palette() -> QPalette:
    p = QPalette()
    roles = QPalette.ColorRole
    base, window, text = QColor(30, 32, 36), QColor(41, 44, 50), QColor(230, 232, 235)
    for role, color in (
        (roles.Window, window), (roles.WindowText, text), (roles.Base, base),
        (roles.AlternateBase, QColor(48, 51, 58)), (roles.ToolTipBase, QColor(20, 22, 25)),
        (roles.ToolTipText, text), (roles.Text, text), (roles.Button, QColor(52, 56, 63)),
        (roles.ButtonText, text), (roles.BrightText, QColor(255, 110, 110)),
        (roles.Highlight, QColor(64, 128, 200)), (roles.HighlightedText, QColor(255, 255, 255)),
        (roles.Link, QColor(110, 170, 240)), (roles.PlaceholderText, QColor(140, 145, 152)),
        (roles.Mid, QColor(70, 74, 82)), (roles.Dark, QColor(22, 24, 27)),
        (roles.Light, QColor(80, 84, 92)), (roles.Midlight, QColor(62, 66, 74)),
        (roles.Shadow, QColor(10, 10, 10)),
    ):  # fmt: skip
        p.setColor(role, color)
    disabled = QColor(125, 128, 134)
    for role in (roles.WindowText, roles.Text, roles.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return p


#: disabled text on the light palette: Fusion's own (#bebebe) is 1.5:1 on its buttons, so
#: a disabled what-if toggle could hardly be read; this is about 3.5:1, still plainly off
DISABLED_LIGHT = QColor(0x80, 0x82, 0x87)


def light_palette(standard: QPalette) -> QPalette:
    """``standard`` (the style's palette) with disabled text that can still be read."""
    p = QPalette(standard)
    roles = QPalette.ColorRole
    for role in (roles.WindowText, roles.Text, roles.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, DISABLED_LIGHT)
    return p


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def apply_theme(app: QApplication, theme: str) -> None:
    """Follow the system's scheme (``system``) or force ``light`` / ``dark``."""
    hints = app.styleHints()
    scheme = {
        "light": Qt.ColorScheme.Light,
        "dark": Qt.ColorScheme.Dark,
    }.get(theme, Qt.ColorScheme.Unknown)
    hints.setColorScheme(scheme)
    style = QStyleFactory.create("Fusion")
    if style is not None:
        app.setStyle(style)
    want_dark = theme == "dark" or (
        theme == "system" and hints.colorScheme() == Qt.ColorScheme.Dark
    )
    palette = dark_palette() if want_dark else light_palette(app.style().standardPalette())
    app.setPalette(palette)


def repolish_window(window: QWidget) -> None:
    """Polish again the widgets of ``window`` that have a style sheet of their own, so that
    they take the application's palette: Qt resolves such a widget's palette (and the
    ``palette(...)`` roles its sheet names) when it polishes it, and an application palette
    set later does not reach it. The window calls it on a theme switch and when first
    shown (its widgets were polished when their sheets were set, maybe under the palette
    before). Each window walks only its own widgets: the application's list of top-level
    widgets can hold one on its way out."""
    for widget in (window, *window.findChildren(QWidget)):
        if widget.styleSheet():
            style = widget.style()
            style.unpolish(widget)
            style.polish(widget)
            widget.update()


#: the error red on a light and on a dark window: both at least WCAG AA (4.5:1) against
#: the window colour of their palette
ERROR_LIGHT, ERROR_DARK = QColor(0xB3, 0x20, 0x2A), QColor(0xFF, 0x7B, 0x72)


def error_color(palette: QPalette) -> QColor:
    """The colour of error text on ``palette``'s window."""
    return ERROR_DARK if is_dark(palette) else ERROR_LIGHT


def contrast(a: QColor, b: QColor) -> float:
    """The WCAG 2 contrast ratio of two colours (1 to 21)."""

    def luminance(c: QColor) -> float:
        def channel(v: float) -> float:
            return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4

        return (
            0.2126 * channel(c.redF()) + 0.7152 * channel(c.greenF()) + 0.0722 * channel(c.blueF())
        )

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)
