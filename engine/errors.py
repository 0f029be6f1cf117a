"""The one error type of the engine, and the checks that raise it.

Every problem with user input -- a preset name, a field of a scenario file, a CLI flag --
surfaces as :class:`EstimateError`, whose message names the field, the value it got and
what would have been accepted:

>>> check_int("training.micro_batch_size", -1, 1, 65536)
Traceback (most recent call last):
...
engine.errors.EstimateError: training.micro_batch_size: got -1, expected an integer in [1, 65536]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class EstimateError(ValueError):
    """Invalid input to the estimator; the message names the field and the accepted values."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message


def check_int(field: str, value: Any, lo: int, hi: int) -> int:
    """Return ``value`` if it is an integer (not a bool) in ``[lo, hi]``; raise otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise EstimateError(field, f"got {value!r}, expected an integer in [{lo}, {hi}]")
    return value


def check_float(field: str, value: Any, lo: float, hi: float) -> float:
    """Return ``value`` as a float if it is a real number in ``[lo, hi]``; raise otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise EstimateError(field, f"got {value!r}, expected a number in [{lo:g}, {hi:g}]")
    return float(value)


def check_bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise EstimateError(field, f"got {value!r}, expected true or false")
    return value


def check_str(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise EstimateError(field, f"got {value!r}, expected a non-empty string")
    return value


def check_choice(field: str, value: Any, choices: Iterable[str]) -> str:
    options = tuple(choices)
    if value not in options:
        raise EstimateError(field, f"got {value!r}, expected one of {', '.join(options)}")
    return str(value)
