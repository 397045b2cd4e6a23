"""Parsing values that anyone who can write to a checkpoint tree or the spool controls.

The standard library's parsers fail in more ways than ValueError on hostile input: deep nesting
raises RecursionError, a 5,000-digit number raises ValueError from int() but OverflowError once
converted to float. These helpers turn every such failure into ValueError or None.
"""

from __future__ import annotations

import json
import math
from typing import Any


def json_value(data: bytes | str) -> Any:
    """The parsed JSON document; ValueError for anything malformed, too deep or too large."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"JSON is not UTF-8: {error.reason}") from None


EXCERPT_CHARS = 100


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """What a message may show of ``text`` read from a tenant's file: at most ``limit``
    characters, escaped unless printable, and how long it was when cut. A message that repeated
    the whole value (a 48 MB path of NUL) would carry the file into replies and log lines."""
    shown = text[:limit]
    if not shown.isprintable():
        shown = repr(shown)[1:-1]
    return shown if len(text) <= limit else f"{shown}... ({len(text):,} characters)"


def finite_number(value: object) -> float | None:
    """A JSON number as a finite float; None for booleans, NaN, infinities, out-of-range ints
    and anything that is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def decimal(text: str, digits: int = 18) -> int | None:
    """A non-negative ASCII decimal of at most ``digits`` digits (int() accepts far more: other
    scripts' digits, underscores, and 4,300-digit numbers that take real time)."""
    if 0 < len(text) <= digits and text.isascii() and text.isdigit():
        return int(text)
    return None
