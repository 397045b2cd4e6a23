"""A minimal client for Prometheus' HTTP query API (``/api/v1/query``, ``/api/v1/query_range``)
over urllib, and the parsing of the verb's time-range arguments.

Only what the report needs: vectors and matrices as plain tuples, errors that name the URL.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone

from checkpoint_exporter.units import parse_duration

Labels = tuple[tuple[str, str], ...]


class PrometheusError(Exception):
    """Prometheus could not be reached or refused a query; the message names the URL."""


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector."""

    labels: Labels
    value: float

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, "")


@dataclass(frozen=True)
class Series:
    """One series of a range query: (unix seconds, value) points in time order."""

    labels: Labels
    points: tuple[tuple[float, float], ...]

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, "")


def _labels(metric: dict[str, str]) -> Labels:
    return tuple(sorted((str(k), str(v)) for k, v in metric.items()))


def _number(raw: str) -> float:
    return float(raw)  # Prometheus writes NaN, +Inf, -Inf as strings float() reads


class PrometheusClient:
    """``query`` and ``query_range`` against one Prometheus (or Thanos / Mimir query) URL."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: dict[str, str]) -> object:
        address = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(address, timeout=self.timeout) as reply:
                body = reply.read()
        except urllib.error.HTTPError as error:
            # Prometheus answers a bad query with 400 and a JSON error body.
            try:
                detail = json.loads(error.read()).get("error", error.reason)
            except (ValueError, OSError):
                detail = error.reason
            raise PrometheusError(
                f"Prometheus at {self.url} refused {params.get('query', '')!r}: {detail}"
            ) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {reason}") from None
        try:
            document = json.loads(body)
        except ValueError:
            raise PrometheusError(
                f"{self.url} did not answer as Prometheus' HTTP API does (not JSON): "
                "is --prometheus.url the Prometheus server's base URL?"
            ) from None
        if not isinstance(document, dict) or document.get("status") != "success":
            detail = document.get("error") if isinstance(document, dict) else document
            raise PrometheusError(f"Prometheus at {self.url}: query failed: {detail}")
        return document.get("data")

    def query(self, expr: str, at: float) -> list[Sample]:
        data = self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        if not isinstance(data, dict):
            return []
        kind, result = data.get("resultType"), data.get("result") or []
        if kind == "scalar":
            return [Sample((), _number(result[1]))]
        if kind != "vector":
            return []
        return [Sample(_labels(item["metric"]), _number(item["value"][1])) for item in result]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self._get(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            return []
        return [
            Series(
                _labels(item["metric"]),
                tuple((float(t), _number(v)) for t, v in item.get("values", [])),
            )
            for item in data.get("result") or []
        ]

    def reachable(self) -> None:
        """Raises PrometheusError unless the URL answers as Prometheus' query API."""
        self.query("vector(1)", time.time())


# --- the time range ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeRange:
    start: float
    end: float

    @property
    def seconds(self) -> int:
        return max(1, round(self.end - self.start))

    @property
    def window(self) -> str:
        """The range as a PromQL duration, for ``increase(x[window])`` evaluated at ``end``."""
        return f"{self.seconds}s"

    @property
    def step(self) -> float:
        """A range-query step giving at most about 240 points a series (and at least 1 s)."""
        return float(max(1, math.ceil(self.seconds / 240)))


_RELATIVE = re.compile(r"now(?:\s*-\s*(?P<ago>\S+))?")


def parse_time(value: str, now: float) -> float:
    """Unix seconds, RFC 3339 (``2024-05-01T12:00:00Z``), ``now`` or ``now-30m``."""
    text = value.strip()
    match = _RELATIVE.fullmatch(text)
    if match:
        return now - (parse_duration(match["ago"]) if match["ago"] else 0.0)
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"{value!r} is not a time")
        return number
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{value!r} is not a time: expected unix seconds, RFC 3339 "
            "(2024-05-01T12:00:00Z), now or now-30m"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)  # as Prometheus reads a bare time: UTC
    return moment.timestamp()


def time_range(start: str | None, end: str | None, span: str | None, now: float) -> TimeRange:
    """--from / --to / --range: any two of them, or --range alone (ending now), or nothing
    (the last hour). ValueError names the argument at fault."""
    if start is not None and end is not None and span is not None:
        raise ValueError("give at most two of --from, --to and --range")
    try:
        seconds = parse_duration(span) if span is not None else None
    except ValueError as error:
        raise ValueError(f"--range={span}: {error}") from None
    if seconds is not None and seconds <= 0:
        raise ValueError(f"--range={span}: the range must be longer than zero")
    try:
        to = parse_time(end, now) if end is not None else None
    except ValueError as error:
        raise ValueError(f"--to: {error}") from None
    try:
        since = parse_time(start, now) if start is not None else None
    except ValueError as error:
        raise ValueError(f"--from: {error}") from None
    if since is None and to is None:
        to = now
    if since is None:
        assert to is not None
        since = to - (seconds if seconds is not None else 3600.0)
    elif to is None:
        to = since + seconds if seconds is not None else now
    if to <= since:
        raise ValueError(
            f"the time range is empty: --from ({_iso(since)}) is not before --to ({_iso(to)})"
        )
    if to > now + 60:
        raise ValueError(f"--to ({_iso(to)}) lies in the future")
    return TimeRange(since, to)


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, timezone.utc).isoformat(timespec="seconds")


iso = _iso
