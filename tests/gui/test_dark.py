"""View > Colours switches every widget at once: after light -> dark no widget keeps a
light background (the what-if toggles have style sheets of their own, the case that used
to stay light), and back."""

from __future__ import annotations

import statistics

import pyqtgraph as pg
from PySide6.QtGui import QColor, QImage, QPalette
from PySide6.QtWidgets import QApplication, QWidget

from memfit.gui.main_window import MainWindow
from memfit.gui.theme import contrast


def switch(window: MainWindow, theme: str) -> None:
    window.set_theme(theme, save=False)
    QApplication.processEvents()


def in_plot(widget: QWidget) -> bool:
    """Whether ``widget`` is (inside) a pyqtgraph view: its bars have data colours."""
    parent: QWidget | None = widget
    while parent is not None:
        if isinstance(parent, pg.GraphicsView):
            return True
        parent = parent.parentWidget()
    return False


def median_lightness(image: QImage, step: int = 3) -> float:
    values = [
        QColor(image.pixel(x, y)).lightness()
        for y in range(0, image.height(), step)
        for x in range(0, image.width(), step)
    ]
    return statistics.median(values)


def shown_widgets(window: MainWindow) -> list[QWidget]:
    return [
        w
        for w in window.findChildren(QWidget)
        if w.isVisible() and w.width() > 4 and w.height() > 4 and not in_plot(w)
    ]


def light_widgets(window: MainWindow) -> list[str]:
    """The shown widgets whose background role or grabbed pixels are mostly light."""
    out = []
    for w in shown_widgets(window):
        background = w.palette().color(w.backgroundRole())
        if background.lightness() >= 128 or median_lightness(w.grab().toImage()) >= 128:
            out.append(f"{type(w).__name__} {w.objectName() or w.accessibleName()!r}")
    return out


def test_dark_reaches_every_widget_at_once(window: MainWindow) -> None:
    switch(window, "light")
    buttons = window.whatif.buttons
    disabled = [b for b in buttons.values() if b.isVisible() and not b.isEnabled()]
    assert disabled, "the default scenario has a what-if that does not apply"
    assert median_lightness(disabled[0].grab().toImage()) >= 128
    switch(window, "dark")
    assert light_widgets(window) == []
    for button in (*disabled, *(b for b in buttons.values() if b.isVisible())):
        assert button.palette().color(QPalette.ColorRole.Button).lightness() < 128
        assert median_lightness(button.grab().toImage()) < 128, button.text()
    # the whole window, but the plots: at most a sliver of light pixels (text)
    image = window.grab().toImage()
    plots = [
        w.geometry().translated(w.mapTo(window, w.rect().topLeft()) - w.pos())
        for w in window.findChildren(pg.GraphicsView)
        if w.isVisible()
    ]
    pixels = [
        QColor(image.pixel(x, y)).lightness()
        for y in range(0, image.height(), 4)
        for x in range(0, image.width(), 4)
        if not any(r.contains(x, y) for r in plots)
    ]
    light = sum(v >= 160 for v in pixels) / len(pixels)
    assert light < 0.06, light


def test_a_checked_toggle_that_is_off_stays_dark_and_readable(window: MainWindow) -> None:
    switch(window, "light")
    button = next(b for b in window.whatif.buttons.values() if b.isEnabled())
    button.setChecked(True)
    # an invalid scenario turns every toggle off, the checked one with it
    window.parallelism_panel.rows["training.parallelism.tp"].widget.setValue(3)
    assert button.isChecked() and not button.isEnabled()
    switch(window, "dark")
    image = button.grab().toImage()
    assert median_lightness(image) < 128
    background = button.palette().color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Button)
    text = button.palette().color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText)
    assert contrast(text, background) >= 2.5  # off, yet it can be read


def test_back_to_light_reaches_every_widget_too(window: MainWindow) -> None:
    switch(window, "dark")
    switch(window, "light")
    for button in window.whatif.buttons.values():
        if button.isVisible():
            assert median_lightness(button.grab().toImage()) >= 128, button.text()
    palette = window.whatif.buttons["cpu-offload"].palette()
    disabled = palette.color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText)
    assert contrast(disabled, palette.color(QPalette.ColorRole.Button)) >= 3.0


def test_field_errors_keep_aa_contrast_after_a_switch(window: MainWindow) -> None:
    row = window.model_panel.rows["model.num_key_value_heads"]
    row.widget.setValue(5)  # rejected: the message shows under the field
    for theme in ("dark", "light", "dark"):
        switch(window, theme)
        shown = row.error.styleSheet().split("color:")[1].split(";")[0].strip()
        background = row.error.palette().color(QPalette.ColorRole.Window)
        assert contrast(QColor(shown), background) >= 4.5, theme


def test_a_window_started_in_dark_has_dark_toggles(qtbot: object, tmp_path: object) -> None:
    """The saved theme is set before the window is first shown (a start in dark): the
    toggles, polished when their sheets were set, take the dark palette when shown."""
    from pathlib import Path

    from PySide6.QtCore import QSettings

    from memfit.gui.store import default_scenario

    folder = Path(str(tmp_path))
    settings = QSettings(str(folder / "s.ini"), QSettings.Format.IniFormat)
    settings.setValue("view/theme", "dark")
    window = MainWindow(settings=settings, data_dir=folder, scenario=default_scenario())
    qtbot.addWidget(window)  # type: ignore[attr-defined]
    try:
        window.resize(1280, 800)
        window.show()
        QApplication.processEvents()
        off = [
            b
            for b in window.whatif.buttons.values()
            if b.isVisible() and b.isEnabled() and not b.isChecked()
        ]
        assert off
        for button in off:
            assert median_lightness(button.grab().toImage(), step=2) < 128, button.text()
    finally:
        window.set_theme("system", save=False)
