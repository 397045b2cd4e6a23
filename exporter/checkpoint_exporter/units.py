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


def parse_duration(value: object) -> float:
    """Seconds from ``90s``, ``1h30m``, ``500ms`` or a plain non-negative number of seconds.

    Raises ValueError with a reason a person can act on.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 90s, 15m or 1h, got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"duration must be a finite, non-negative number, got {value!r}")
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
                f"invalid duration {value!r}: expected numbers with units y, w, d, h, m, s, ms "
                "(for example 90s, 15m, 1h30m)"
            )
        number, unit = match.groups()
        rank = unit_rank[unit]
        if rank <= previous_rank:
            raise ValueError(
                f"invalid duration {value!r}: units must go from largest to smallest, each once"
            )
        previous_rank = rank
        total += int(number) * _UNITS[rank][1]
        position = match.end()
    if position == 0:
        raise ValueError("empty duration: expected something like 90s, 15m or 1h")
    return total


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
