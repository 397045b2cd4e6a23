from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checkpoint_exporter.units import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("1h30m", 5400),
        ("7d", 604800),
        ("1w", 604800),
        ("500ms", 0.5),
        ("0", 0),
        ("1y", 31536000),
        (60, 60),
        (2.5, 2.5),
    ],
)
def test_parse(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "15", "6os", "-5m", "1m1h", "1h1h", "1.5h", "m", True, None, -1]
)
def test_parse_refuses(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@given(st.integers(min_value=0, max_value=10**11))
def test_format_round_trips(millis: int) -> None:
    assert parse_duration(format_duration(millis / 1000)) == pytest.approx(millis / 1000)


def test_format_is_shortest() -> None:
    assert format_duration(90) == "1m30s"
    assert format_duration(604800) == "1w"
    assert format_duration(0) == "0s"
