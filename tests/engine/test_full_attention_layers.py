"""The count of a model's full-attention layers is the count of the layers
``full_attention`` names, one by one."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from memfit.engine.presets import load_model
from memfit.engine.specs import full_attention, full_attention_layers

GEMMA = load_model("gemma-3-4b")


@given(st.integers(0, 12), st.integers(1, 130), st.sampled_from([0, 512, 4096]))
def test_the_count_is_the_layers_named(every: int, layers: int, window: int) -> None:
    model = dataclasses.replace(
        GEMMA, full_attention_every=every, num_layers=layers, sliding_window=window
    )
    named = sum(full_attention(model, i) for i in range(model.num_layers))
    assert full_attention_layers(model) == named
    assert (named > 0) == (every > 0 and window > 0 and layers >= every)
