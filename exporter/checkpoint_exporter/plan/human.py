"""Numbers as people read them: sizes and rates in the unit that makes them 1 to 999 (a server's
0.01 GB/s reads as 12.30 MB/s), durations in their two largest units (1h 30m, not 5400 s).

Decimal units throughout, as the worksheet's (GB = 1e9 bytes). The JSON and YAML outputs keep
the plain numbers; only the table and its summary use these.
"""

from __future__ import annotations

import math

_DECIMAL = ("B", "kB", "MB", "GB", "TB", "PB", "EB")

# Largest first. No weeks: "1y 35d" reads, "1y 5w" makes the reader count.
_DURATIONS: tuple[tuple[str, float], ...] = (
    ("y", 365 * 86400.0),
    ("d", 86400.0),
    ("h", 3600.0),
    ("m", 60.0),
    ("s", 1.0),
)


def _scaled(count: float, suffix: str = "") -> str:
    """``count`` bytes in the largest decimal unit that leaves at least 1 of it."""
    if count == 0:
        return f"0 B{suffix}"
    value, unit = count, _DECIMAL[0]
    for unit in _DECIMAL:
        # Rounded first, so 999.999 GB reads 1.00 TB rather than 1,000.00 GB.
        if abs(round(value, 2)) < 1000 or unit == _DECIMAL[-1]:
            break
        value /= 1000
    return f"{value:,.2f} {unit}{suffix}"


def size(gigabytes: float) -> str:
    """1,078 GB -> 1.08 TB; 0.5 GB -> 500.00 MB."""
    return _scaled(gigabytes * 1e9)


def rate(gigabytes_per_second: float) -> str:
    """0.0123 GB/s -> 12.30 MB/s; 1,234.5 GB/s -> 1.23 TB/s."""
    return _scaled(gigabytes_per_second * 1e9, "/s")


def duration(seconds: float, up: bool = False) -> str:
    """The two largest units, the second rounded: 5,097.8 s -> 1h 25m; 77 s -> 1m 17s.

    ``up`` rounds up instead, for a deadline: what the storage allows must not read shorter
    than it is. Under a minute, whole seconds (below 10 s, two significant digits).
    """
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"cannot show {seconds!r} as a duration")
    if seconds < 10:
        shown = math.ceil(seconds * 10) / 10 if up else seconds
        return f"{shown:.2g}s"
    settle = math.ceil if up else round
    for index, (_, size_) in enumerate(_DURATIONS[:-1]):
        step = _DURATIONS[index + 1][1]
        total = settle(seconds / step - (1e-9 if up else 0)) * step
        if total >= size_:
            return _two_units(total, index)
    return f"{settle(seconds)}s"


def _two_units(total: float, index: int) -> str:
    """``total`` (a whole number of the unit below ``index``) as e.g. 1h 25m."""
    (big, big_size), (small, small_size) = _DURATIONS[index], _DURATIONS[index + 1]
    whole, rest = divmod(round(total / small_size), round(big_size / small_size))
    return f"{whole:,}{big} {rest}{small}" if rest else f"{whole:,}{big}"


def seconds_and_duration(seconds: float) -> str:
    """5,097.8 s (1h 25m): the exact figure for checking, the duration for reading."""
    return f"{seconds:,.1f} s ({duration(seconds)})"


def share(fraction: float) -> str:
    return f"{fraction:.2%}"
