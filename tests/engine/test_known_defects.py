"""The defects of the next engine step, each as the example it was found with.

Every test here is a strict ``xfail``: it states what must hold and fails today for a
named mechanism. A fix makes it pass, which fails the run until its marker goes -- so
none of these can be fixed, or broken further, without this file saying so.
"""

from __future__ import annotations

import pytest


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="torch.compile's partitioner chooses what a block keeps by weighing its tensors' "
    "sizes, and a block's profile weighs them at its held-out shape (3 x 37 tokens): "
    "gpt-oss's sink softmax (the scores joined with one column) makes the choice flip "
    "below 4 tokens -- at 2 a layer keeps the joined scores where the profile keeps the "
    "max's indices and the shifted scores, 1 KiB a layer more than the direct play",
)
def test_a_compiled_profile_holds_at_every_length_for_a_model_with_sinks() -> None:
    from dataclasses import replace

    from memfit.engine.presets import load_model
    from memfit.engine.specs import TrainingSpec
    from memfit.engine.timeline.blocks import _direct, _profile
    from memfit.engine.timeline.context import make_ctx

    model = load_model("gpt-oss-20b")
    training = TrainingSpec(
        precision="fp32", attention="eager", torch_compile=True, sequence_length=2
    )
    ctx = make_ctx(model, training)
    prof, _ = _profile(model, replace(ctx, batch=1, seq=1), "dense", True, False)
    assert prof is not None
    assert prof.at(ctx.terms()) == _direct(model, ctx, "dense", True, False)
