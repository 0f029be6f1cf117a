"""The first screen: at 1280x800 the inputs a user changes first are visible without
scrolling; the architecture and the rarer hardware rows fold, with a summary line."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication

from gui.main_window import MainWindow

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
    viewport = window.scroll.viewport()
    assert window.scroll.verticalScrollBar().value() == 0
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
