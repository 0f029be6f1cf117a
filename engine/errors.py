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

import math
import re
import reprlib
from collections.abc import Iterable
from typing import Any

#: how much of a rejected value an error message shows
SHOWN_CHARS = 60
#: the longest text a name, label or source may be
MAX_TEXT = 2000
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 3, SHOWN_CHARS, 60, 60
#: control characters (C0, DEL, C1: terminal escapes, line breaks) and lone surrogates
_NOT_TEXT = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


class EstimateError(ValueError):
    """Invalid input to the estimator; the message names the field and the accepted values."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message


def shown(value: Any) -> str:
    """``repr(value)``, cut to :data:`SHOWN_CHARS` characters: an error message stays one
    short line whatever the input (a 4,000-digit integer, a megabyte of text)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of about {int(value.bit_length() * 0.30103):,} digits"
    text = _SHORT.repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def check_int(field: str, value: Any, lo: int, hi: int) -> int:
    """Return ``value`` if it is an integer (not a bool) in ``[lo, hi]``; raise otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise EstimateError(field, f"got {shown(value)}, expected an integer in [{lo}, {hi}]")
    return value


def check_float(field: str, value: Any, lo: float, hi: float) -> float:
    """Return ``value`` as a float if it is a finite number in ``[lo, hi]``; raise otherwise
    (NaN compares false with every bound, so it is refused too)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise EstimateError(field, f"got {shown(value)}, expected a number in [{lo:g}, {hi:g}]")
    return float(value)


def check_bool(field: str, value: Any) -> bool:
    """Return ``value`` if it is ``true`` or ``false``: the strings "false" and "no", and
    the numbers 0 and 1, are not booleans."""
    if not isinstance(value, bool):
        raise EstimateError(field, f"got {shown(value)}, expected true or false")
    return value


def check_text(field: str, value: Any, empty: bool = False) -> str:
    """Return ``value`` if it is text a person can read: a string of valid Unicode (no
    lone surrogates), without control characters (no terminal escape codes, no line
    breaks), at most :data:`MAX_TEXT` characters, and not empty unless ``empty``."""
    if not isinstance(value, str) or (not value and not empty):
        raise EstimateError(field, f"got {shown(value)}, expected a non-empty string")
    if len(value) > MAX_TEXT:
        raise EstimateError(field, f"got {len(value):,} characters, expected at most {MAX_TEXT:,}")
    bad = _NOT_TEXT.search(value)
    if bad:
        what = "a lone surrogate" if bad.group() >= "\ud800" else "a control character"
        raise EstimateError(field, f"got {shown(value)}: {what} is not allowed in text")
    return value


def check_str(field: str, value: Any) -> str:
    """A non-empty name or label (see :func:`check_text`)."""
    return check_text(field, value)


def check_choice(field: str, value: Any, choices: Iterable[str]) -> str:
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise EstimateError(field, f"got {shown(value)}, expected one of {', '.join(options)}")
    return value


def check_finite(field: str, value: Any) -> float:
    """A finite real number (not a bool, not NaN, not infinite)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise EstimateError(field, f"got {shown(value)}, expected a finite number")
    return float(value)
