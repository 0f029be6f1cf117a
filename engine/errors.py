"""The one error type of the engine, and the checks that raise it.

Every problem with user input -- a preset name, a field of a scenario file, a CLI flag --
surfaces as :class:`EstimateError`, whose message names the field, the value it got and
what would have been accepted:

>>> check_int("training.micro_batch_size", -1, 1, 65536)
Traceback (most recent call last):
...
memfit.engine.errors.EstimateError: training.micro_batch_size: got -1, expected an integer ...
"""

from __future__ import annotations

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
#: the longest message (a field and what is wrong with it, a note) MemFit gives: the field,
#: the value as :func:`shown` cuts it and what is accepted (the longest list of accepted
#: values, the model families read, takes about 300) fit in it, a whole input never
MAX_MESSAGE = 480
#: the longest field name an error keeps whole (a key of the user's file can be any length)
MAX_FIELD = 120
#: a run of characters without a space longer than this is cut: a pasted value, a number of
#: thousands of digits, a path
LONG_RUN = 80
_LONG_RUN = re.compile(rf"\S{{{LONG_RUN + 1},}}")


def _cut_run(match: re.Match[str]) -> str:
    """A long run cut to its start, keeping the punctuation that closes it (a quote, a
    colon)."""
    run = match.group()
    closing = run[len(run.rstrip(":;,.)]}'\"")) :][:3]
    return run[: LONG_RUN - 1] + "…" + closing


def bounded(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` short enough for one line of a message: each run of more than
    :data:`LONG_RUN` characters without a space cut to its start and "…", then, if it is
    still over ``limit`` characters, its middle left out -- the start of a message names
    the field, its end what is accepted.

    >>> text = bounded("n: got '" + "9" * 5000 + "', expected [1, 64]")
    >>> len(text), text[-21:]
    (106, "9…', expected [1, 64]")
    >>> len(bounded("x " * 2500, 100))
    100
    """
    text = _LONG_RUN.sub(_cut_run, text)
    if len(text) <= limit:
        return text
    tail = limit // 3
    return text[: limit - tail - 3] + " … " + text[-tail:]


class EstimateError(ValueError):
    """Invalid input to the estimator; the message names the field and the accepted values.

    Both are :func:`bounded`: whatever a caller puts in, the message stays one short line
    (:data:`MAX_MESSAGE` characters at most)."""

    def __init__(self, field: str, message: str) -> None:
        field = bounded(field, MAX_FIELD)
        message = bounded(message, MAX_MESSAGE - len(field) - 2)
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
    """Return ``value`` as a float if it is a number in ``[lo, hi]``; raise otherwise. NaN
    compares false with every bound, so it is refused too; an integer is compared with the
    bounds exactly, as an integer, so one of thousands of digits is refused with the range
    before anything turns it into a float (which would overflow).

    >>> try:
    ...     check_float("training.lora.alpha", 10**400, 0.0, 1e6)
    ... except EstimateError as exc:
    ...     print(exc.detail)
    got an integer of about 400 digits, expected a number in [0, 1e+06]
    """
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
