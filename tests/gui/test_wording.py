"""Error texts in the user's words: the fields an engine message names read as the
panels' labels, under the field and in the stale banner alike."""

from __future__ import annotations

import dataclasses

from memfit.gui.forms import in_user_words
from memfit.gui.main_window import MainWindow
from tests.gui.helpers import bad_mesh


def test_field_paths_and_names_read_as_row_labels(window: MainWindow) -> None:
    heads = window.model_panel.rows["model.num_attention_heads"].label.rstrip(":")
    kv = window.model_panel.rows["model.num_key_value_heads"].label.rstrip(":")
    said = in_user_words(
        "model.num_key_value_heads: got 5, expected a divisor of num_attention_heads (32)"
    )
    assert said == f"{kv}: got 5, expected a divisor of {heads} (32)"
    # a section no row shows is named in words, and the names inside become labels
    per_node = window.hardware_panel.rows["hardware.gpus_per_node"].label.rstrip(":")
    said = in_user_words(
        "training.parallelism: tp x pp x cp = 3 must divide the 8 GPUs (gpus_per_node x nodes)"
    )
    assert said.startswith("Parallelism: ") and f"({per_node} x nodes)" in said
    assert "_" not in said
    # words that are no field stay as they are; so does a message without a field
    assert in_user_words("the file is not JSON") == "the file is not JSON"
    assert in_user_words("memfit_scenario: missing") == "memfit_scenario: missing"


def test_the_stale_banner_and_the_field_error_use_the_labels(window: MainWindow) -> None:
    window.store.reset(bad_mesh())
    banner = window.chart.verdict_text()
    assert "gpus_per_node" not in banner and "training.parallelism" not in banner
    model = window.store.scenario.model
    panel = window.model_panel
    row = panel.rows["model.num_key_value_heads"]
    window.store.reset(dataclasses.replace(window.store.scenario, model=model))
    row.widget.setValue(5)  # type: ignore[attr-defined]
    row.widget.editingFinished.emit()  # type: ignore[attr-defined]
    text = row.error.text()
    assert text and "num_attention_heads" not in text
    assert panel.rows["model.num_attention_heads"].label.rstrip(":") in text


def test_a_refusal_gives_its_field_without_reading_it_back_from_the_text(
    window: MainWindow,
) -> None:
    """The store keeps the engine's refusal with its field; the panels name the field from
    it, so a field whose detail holds ``": "`` or a field path no row shows is named as the
    engine gave it (nothing parses the message back into a field)."""
    from memfit.engine.errors import EstimateError

    window.store.reset(bad_mesh())
    refusal = window.store.refusal
    assert refusal is not None and refusal.field == "training.parallelism"
    assert str(refusal) == window.store.error
    rank = window.training_panel.rows["training.lora.rank"].label.rstrip(":")
    said = in_user_words(EstimateError("training.lora.rank", "got 0: expected 1 to 4096"))
    assert said == f"{rank}: got 0: expected 1 to 4096"
    # the engine's detail may itself look like "field: text"; it stays the detail
    said = in_user_words(EstimateError("model", "model.hidden_size: is odd"))
    assert said.startswith("Model: ")
