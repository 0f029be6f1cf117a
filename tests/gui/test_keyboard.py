"""Keyboard and context menus: Ctrl+W closes, Ctrl+F finds a model, a ghost is applied
from the keyboard (Enter on its toggle, Ctrl+Return) and from its toggle's context menu."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtTest import QTest

from memfit.gui.main_window import MainWindow


def first_offered(window: MainWindow) -> str:
    return next(k for k in window.whatif.buttons if k in window.whatif.results)


def test_ctrl_w_closes_and_compare_all_has_its_own_key(window: MainWindow) -> None:
    assert window.close_act.shortcut() == QKeySequence(QKeySequence.StandardKey.Close)
    assert window.compare_all_act.shortcut() == QKeySequence("Ctrl+Shift+A")
    assert window.close_act in window.file_menu.actions()
    window.close_act.trigger()
    assert not window.isVisible()


def test_ctrl_f_focuses_the_preset_search(window: MainWindow) -> None:
    window.model_panel.search.setText("llama")
    window.find_act.trigger()
    assert window.find_act.shortcut() == QKeySequence(QKeySequence.StandardKey.Find)
    assert window.model_panel.search.selectedText() == "llama"


def test_enter_on_a_toggle_applies_its_change(window: MainWindow) -> None:
    key = first_offered(window)
    expected = window.whatif.results[key].scenario
    button = window.whatif.buttons[key]
    button.setFocus()
    QTest.keyClick(button, Qt.Key.Key_Return)
    assert window.store.scenario == expected
    window.undo_act.trigger()
    assert window.store.scenario != expected


def test_ctrl_return_applies_the_first_shown_ghost(window: MainWindow) -> None:
    before = window.store.scenario
    window.apply_whatif_act.trigger()  # nothing shown: nothing changes
    assert window.store.scenario == before
    key = first_offered(window)
    expected = window.whatif.results[key].scenario
    window.whatif.buttons[key].setChecked(True)
    window.apply_whatif_act.trigger()
    assert window.store.scenario == expected


def test_the_context_menu_shows_and_applies(window: MainWindow) -> None:
    key = first_offered(window)
    bar = window.whatif
    menu = bar._menu(key)
    show, apply = menu.actions()
    assert show.text() == "Show Ghost Bar" and apply.isEnabled()
    show.trigger()
    assert bar.buttons[key].isChecked()
    assert bar._menu(key).actions()[0].text() == "Hide Ghost Bar"
    expected = bar.results[key].scenario
    apply.trigger()
    assert window.store.scenario == expected
    disabled = next((k for k, b in bar.buttons.items() if not b.isEnabled()), None)
    if disabled is not None:
        assert not bar._menu(disabled).actions()[1].isEnabled()


def test_a_rejected_scenario_is_explained_in_the_panel_words(window: MainWindow) -> None:
    import dataclasses

    t = window.store.scenario.training
    lora = dataclasses.replace(t.lora, targets=("kv_a_proj",))  # not a layer of a Llama
    window.store.edit(
        dataclasses.replace(
            window.store.scenario, training=dataclasses.replace(t, method="lora", lora=lora)
        )
    )
    reason = window.chart.stale_reason()
    row = window.training_panel.rows["training.lora.targets"]
    assert reason.startswith(row.label.replace("&", "").rstrip(":") + ": ")
    assert "training.lora.targets" not in reason
    assert window.in_user_words("no.such.field: x") == "no.such.field: x"


def test_error_text_keeps_wcag_aa_contrast_in_both_themes(window: MainWindow) -> None:
    from PySide6.QtGui import QPalette
    from PySide6.QtWidgets import QApplication

    from memfit.gui.forms import ErrorLabel
    from memfit.gui.theme import contrast

    label = next(r.error for r in window.training_panel.rows.values())
    assert isinstance(label, ErrorLabel)
    for theme in ("light", "dark"):
        window.set_theme(theme, save=False)
        QApplication.processEvents()
        palette = label.palette()
        background = palette.color(QPalette.ColorRole.Window)
        shown = label.styleSheet().split("color: ")[1].split(";")[0]
        from PySide6.QtGui import QColor

        assert contrast(QColor(shown), background) >= 4.5, theme
    window.set_theme("light", save=False)
