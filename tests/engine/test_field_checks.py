"""``check_fields`` passes a value it has met before without checking it again: its verdict
and its error are those of checking every field with ``_check_type``, whatever came before."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memfit.engine import specs
from memfit.engine.errors import EstimateError
from memfit.engine.presets import load_gpu
from memfit.engine.specs import HardwareSpec, ModelSpec, TrainingSpec


class Count(enum.IntEnum):
    TWO = 2


class Text(str):
    pass


#: values of every kind a field meets, the tricky ones among them
VALUES: list[Any] = [
    0, 1, 7, -3, 10**40, True, False, 1.5, float("nan"), None,
    "", "bf16-mixed", "adamw", "a\x1bb", "\ud800", "x" * 3000, Text("adamw"), Count.TWO,
    ("attention",), ("mlp", ""), ["mlp"], {"a": 1}, b"bytes", specs.LoraSpec(),
]  # fmt: skip


def reference(spec: Any, prefix: str) -> str | None:
    """Every field checked with ``_check_type``: the error's text, or ``None``."""
    try:
        for name, kind in specs._field_types(type(spec)):
            specs._check_type(prefix + name, getattr(spec, name), kind)
    except EstimateError as exc:
        return str(exc)
    return None


def fast(spec: Any, prefix: str) -> str | None:
    try:
        specs.check_fields(spec, prefix)
    except EstimateError as exc:
        return str(exc)
    return None


def with_value(spec: Any, name: str, value: Any) -> Any:
    """``spec`` with field ``name`` set to ``value``, no check run (as a bad input is)."""
    copy = object.__new__(type(spec))
    for field in dataclasses.fields(spec):
        object.__setattr__(copy, field.name, getattr(spec, field.name))
    object.__setattr__(copy, name, value)
    return copy


BASES = [
    TrainingSpec(),
    HardwareSpec(load_gpu("h100-sxm-80gb")),
    ModelSpec("m", 2, 64, 4, 4, 16, 128, 256),
]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(BASES),
    st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(VALUES)), min_size=1, max_size=6),
)
def test_the_verdict_is_every_fields_check(base: Any, edits: list[tuple[int, Any]]) -> None:
    fields = [f.name for f in dataclasses.fields(base)]
    for pick, value in edits:  # in turn: what one check accepted is met by the next
        spec = with_value(base, fields[pick % len(fields)], value)
        assert fast(spec, "t.") == reference(spec, "t.")


@pytest.mark.parametrize("value", ["adamw", "bf16-mixed", ""])
def test_a_string_met_before_still_fails_a_field_of_another_type(value: str) -> None:
    spec = TrainingSpec()
    assert fast(with_value(spec, "optimizer", value), "") is None  # met as text first
    message = fast(with_value(spec, "micro_batch_size", value), "training.")
    assert message is not None and "training.micro_batch_size" in message


def test_a_bool_is_not_an_int_after_ints_passed() -> None:
    spec = TrainingSpec()
    assert fast(spec, "") is None
    message = fast(with_value(spec, "micro_batch_size", True), "training.")
    assert message == "training.micro_batch_size: got True, expected an integer"


def test_the_strings_kept_are_bounded() -> None:
    spec = TrainingSpec()
    for i in range(specs._TEXTS_KEPT + 10):
        specs.check_fields(with_value(spec, "loss", f"loss-{i}"), "")
    assert len(specs._TEXTS) <= specs._TEXTS_KEPT
