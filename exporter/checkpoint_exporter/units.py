"""Prometheus-style durations (``90s``, ``15m``, ``1h30m``, ``7d``), parsed and printed.

Config files, plan inputs and generated rules all speak this one notation, so an SRE can copy
a value between them unchanged.
"""

from __future__ import annotations

import math
import re

# Largest unit first: the order a duration string must use, as in Prometheus.
_UNITS: tuple[tuple[str, float], ...] = (
    ("y", 365 * 86400.0),
    ("w", 7 * 86400.0),
    ("d", 86400.0),
    ("h", 3600.0),
    ("m", 60.0),
    ("s", 1.0),
    ("ms", 0.001),
)
_PART = re.compile(r"(\d+)(ms|[ywdhms])")

# The longest duration anything accepts. Every duration ends up in a timer (a thread's wait,
# a sleep, a deadline on the monotonic clock), and those overflow a little above 292 years
# (threading.TIMEOUT_MAX, Prometheus' own limit too): 100y leaves room for "now + duration".
MAX_DURATION = 100 * 365 * 86400.0
_MAX_DIGITS = 15  # 100y is 3,153,600,000,000 ms: 13 digits


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} characters)"


def parse_duration(value: object, maximum: float = MAX_DURATION) -> float:
    """Seconds from ``90s``, ``1h30m``, ``500ms`` or a plain non-negative number of seconds.

    Raises ValueError with a reason a person can act on, also for durations above ``maximum``
    (100 years by default), which would overflow a timer at run time.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 90s, 15m or 1h, got {value!r}")
    if isinstance(value, (int, float)):
        # A huge int is compared as an int: converting it to float would itself overflow.
        if (isinstance(value, float) and not math.isfinite(value)) or value < 0:
            raise ValueError(f"duration must be a finite, non-negative number, got {_shown(value)}")
        if value > maximum:
            raise ValueError(_too_long(value, maximum))
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a duration such as 90s, 15m or 1h, got {type(value).__name__}")
    text = value.strip()
    if text == "0":
        return 0.0
    total = 0.0
    position = 0
    previous_rank = -1
    unit_rank = {unit: rank for rank, (unit, _) in enumerate(_UNITS)}
    while position < len(text):
        match = _PART.match(text, position)
        if match is None:
            raise ValueError(
                f"invalid duration {_shown(value)}: expected numbers with units y, w, d, h, m, "
                "s, ms (for example 90s, 15m, 1h30m)"
            )
        number, unit = match.groups()
        rank = unit_rank[unit]
        if rank <= previous_rank:
            raise ValueError(
                f"invalid duration {_shown(value)}: units must go from largest to smallest, "
                "each once"
            )
        previous_rank = rank
        if len(number.lstrip("0")) > _MAX_DIGITS:
            raise ValueError(_too_long(value, maximum))
        total += int(number) * _UNITS[rank][1]
        position = match.end()
    if position == 0:
        raise ValueError("empty duration: expected something like 90s, 15m or 1h")
    if total > maximum:
        raise ValueError(_too_long(value, maximum))
    return total


def _too_long(value: object, maximum: float) -> str:
    return f"duration {_shown(value)} is too long: at most {format_duration(maximum)}"


def format_duration(seconds: float) -> str:
    """The shortest Prometheus-style spelling of ``seconds`` (milliseconds precision)."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"cannot format {seconds!r} as a duration")
    millis = round(seconds * 1000)
    if millis == 0:
        return "0s"
    parts = []
    for unit, size in _UNITS:
        size_ms = round(size * 1000)
        count, millis = divmod(millis, size_ms)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
