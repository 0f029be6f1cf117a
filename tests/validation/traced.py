"""The conventions the tracing harness (``validation/step.py``) runs a step with.

The harness builds the model with transformers, holds the model output through backward and
the optimizer step (``out = model(...)``; ``out.loss.backward()``; ``del out`` after
``zero_grad``, so nothing of a step outlives it), lets transformers
build its KV cache, keeps adapters in the trainable weights' dtype and frozen weights in
the compute dtype; a third step releases the output before backward. A traced case's
scenario states its conventions where it differs; these fill in the rest.
"""

from __future__ import annotations

import copy
from typing import Any

HARNESS = {
    "stack": "custom",
    "outputs_held_through_backward": True,
    "kv_cache_in_outputs": True,
    "frozen_weights_dtype": "auto",
    "model_implementation": "transformers",
    "previous_step_held": False,
    # transformers 5's checkpointing (``use_reentrant=False``), whatever a stack says
    "reentrant_checkpointing": False,
}


def as_traced(scenario: dict[str, Any], held: bool | None = None) -> dict[str, Any]:
    """``scenario`` with the harness's conventions wherever it does not set them; ``held``:
    the output held through backward or released before it, whatever the scenario says."""
    out = copy.deepcopy(scenario)
    training = out.setdefault("training", {})
    for key, value in HARNESS.items():
        training.setdefault(key, value)
    if held is not None:
        training["outputs_held_through_backward"] = held
    if "lora" in training:
        training["lora"].setdefault("adapter_dtype", "auto")
    return out


def traced_peak(case: dict[str, Any], held: bool) -> int:
    """The traced allocated peak of ``case`` with the output held or released (a record
    holds its own convention's peak and the other one's beside it)."""
    m = case["measured"]
    own = as_traced(case["scenario"])["training"]["outputs_held_through_backward"]
    if held != own:
        m = m["outputs_held_through_backward" if held else "outputs_released_before_backward"]
    return int(m["peak_allocated_bytes"])
