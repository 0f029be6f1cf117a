"""The first screen: at 1280x800 the inputs a user changes first are visible without
scrolling; the architecture and the rarer hardware rows fold, with a summary line. No
choice or value of a field is cut, the fields take the width the column is given, and
the item table shows six rows."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QDoubleSpinBox,
    QSpinBox,
    QStyle,
    QStyleOptionComboBox,
    QStyleOptionSpinBox,
)

from memfit.gui.main_window import MainWindow

FIRST_SCREEN = (
    "hardware.gpu",
    "hardware.gpus_per_node",
    "training.method",
    "training.precision",
    "training.micro_batch_size",
    "training.sequence_length",
    "training.activation_checkpointing",
)


def row_widget(window: MainWindow, path: str):  # type: ignore[no-untyped-def]
    for panel in window.panels:
        if path in panel.rows:
            return panel.rows[path].widget
    raise KeyError(path)


def test_the_first_inputs_fit_the_first_screen_at_1280x800(window: MainWindow) -> None:
    window.resize(1280, 800)
    QApplication.processEvents()
    viewport = window.column_scroll.viewport()
    assert window.column_scroll.verticalScrollBar().value() == 0
    for path in FIRST_SCREEN:
        widget = row_widget(window, path)
        assert widget.isVisible(), path
        top = widget.mapTo(viewport, widget.rect().topLeft()).y()
        bottom = widget.mapTo(viewport, widget.rect().bottomLeft()).y()
        assert top >= 0 and bottom <= viewport.height(), (path, top, bottom)
    preset = window.model_panel.preset
    assert preset.mapTo(viewport, preset.rect().bottomLeft()).y() <= viewport.height()


def test_the_architecture_folds_with_a_summary_and_opens_on_an_error(
    window: MainWindow,
) -> None:
    arch = window.model_panel.architecture
    assert not arch.is_expanded()
    assert not row_widget(window, "model.num_layers").isVisible()
    model = window.store.scenario.model
    assert f"{model.num_layers} layers" in arch.summary.text()
    assert f"vocab {model.vocab_size:,}" in arch.summary.text()
    heads = window.model_panel.rows["model.num_key_value_heads"]
    heads.widget.setValue(5)  # not a divisor of the attention heads: rejected
    assert arch.is_expanded() and not heads.error.isHidden()


def test_more_hardware_folds_with_what_it_holds(window: MainWindow) -> None:
    more = window.hardware_panel.more
    assert not more.is_expanded()
    assert "budget 85 %" in more.summary.text()
    more.set_expanded(True)
    assert row_widget(window, "hardware.utilization_target").isVisible()


# -- nothing cut, the column's width used, the item table tall enough --------------------


def show_every_row(window: MainWindow) -> None:
    """Unfold every section and show every row, also those that need another setting."""
    window.model_panel.architecture.set_expanded(True)
    window.hardware_panel.more.set_expanded(True)
    window.training_panel.conventions.set_expanded(True)
    for panel in window.panels:
        for path in panel.rows:
            panel.set_row_visible(path, True)
    QApplication.processEvents()


def edit_width(widget: QComboBox | QAbstractSpinBox) -> int:
    """The width of the text area of a combo or spin box (without its arrows)."""
    style = widget.style()
    if isinstance(widget, QComboBox):
        combo = QStyleOptionComboBox()
        widget.initStyleOption(combo)
        control, sub = QStyle.ComplexControl.CC_ComboBox, QStyle.SubControl.SC_ComboBoxEditField
        return style.subControlRect(control, combo, sub, widget).width()
    spin = QStyleOptionSpinBox()
    widget.initStyleOption(spin)
    control, sub = QStyle.ComplexControl.CC_SpinBox, QStyle.SubControl.SC_SpinBoxEditField
    return style.subControlRect(control, spin, sub, widget).width()


def test_no_choice_or_value_is_cut_at_1280x800(window: MainWindow) -> None:
    window.resize(1280, 800)
    show_every_row(window)
    checked = 0
    for panel in window.panels:
        for combo in panel.findChildren(QComboBox):
            assert combo.isVisible(), combo.accessibleName()
            metrics = combo.fontMetrics()
            texts = [combo.itemText(i) for i in range(combo.count())]
            longest = max(texts, key=metrics.horizontalAdvance)
            need = metrics.horizontalAdvance(longest)
            assert edit_width(combo) >= need, (combo.accessibleName(), longest)
            checked += 1
        for spin in panel.findChildren(QAbstractSpinBox):
            if not isinstance(spin, QSpinBox | QDoubleSpinBox):
                continue
            widest = spin.textFromValue(spin.maximum()) + spin.suffix()
            need = spin.fontMetrics().horizontalAdvance(widest)
            assert edit_width(spin) >= need, (spin.accessibleName(), widest)
            checked += 1
    assert checked > 60


def test_the_fields_stretch_with_the_column(window: MainWindow) -> None:
    window.resize(1920, 1080)  # room for a wider column beside the chart
    QApplication.processEvents()
    fields = [row_widget(window, p) for p in ("hardware.gpu", "training.method")]
    before = [f.width() for f in fields]
    column = window.splitter.sizes()[0]
    window.splitter.setSizes([column + 200, sum(window.splitter.sizes()) - column - 200])
    QApplication.processEvents()
    assert window.splitter.sizes()[0] >= column + 150
    for field, width in zip(fields, before, strict=True):
        assert field.width() >= width + 150, field.accessibleName()


def test_the_item_table_shows_six_rows_at_1280x800(window: MainWindow) -> None:
    window.resize(1280, 800)
    QApplication.processEvents()
    table = window.table
    assert table.isVisible() and table.rowCount() >= 6
    shown = sum(
        table.visualRect(table.model().index(row, 0)).bottom() <= table.viewport().height()
        for row in range(table.rowCount())
    )
    assert shown >= 6
    # and the chart keeps most of the height
    assert window.chart.height() > 2 * table.height()
