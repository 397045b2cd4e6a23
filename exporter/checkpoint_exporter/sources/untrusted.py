"""Parsing values that anyone who can write to a checkpoint tree or the spool controls.

The standard library's parsers fail in more ways than ValueError on hostile input: deep nesting
raises RecursionError, a 5,000-digit number raises ValueError from int() but OverflowError once
converted to float. These helpers turn every such failure into ValueError or None.

A number that parses is still the tenant's: every one is range-checked where it is read, so that
no later conversion fails for every job (a ``global_step`` of 10**400 made ``float()`` overflow
in the exposition and failed the whole collector).
"""

from __future__ import annotations

import json
from typing import Any

from checkpoint_exporter.events import finite_number  # noqa: F401 - one parser of JSON numbers

# A step is exported as a float sample: up to 2**53 every integer is exact, so one step and the
# next never export as the same value. Beyond it, the step is unknown.
MAX_STEP = 2**53
# The largest off_t (no file, offset or length exceeds it) and int64 nanoseconds (a writer's
# time.time_ns(): up to the year 2262).
INT64_MAX = 2**63 - 1


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


def decimal(text: str, digits: int = 18) -> int | None:
    """A non-negative ASCII decimal of at most ``digits`` digits (int() accepts far more: other
    scripts' digits, underscores, and 4,300-digit numbers that take real time)."""
    if 0 < len(text) <= digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def bounded_int(value: object, high: int, low: int = 0) -> int | None:
    """``value`` when it is an int (a bool is none) from ``low`` to ``high``, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value
    return None


def step(value: object) -> int | None:
    """A training step read from a tenant's file: an int from 0 to MAX_STEP, else unknown."""
    return bounded_int(value, MAX_STEP)


def step_digits(text: str) -> int | None:
    """A step written in ASCII digits (a generation's name: leading zeros allowed, as in
    Megatron's ``iter_0000010``), or None when it is no such number or past MAX_STEP."""
    significant = text.lstrip("0") or text[-1:]  # "000" is 0; "" stays nothing
    return step(decimal(significant, len(str(MAX_STEP))))
