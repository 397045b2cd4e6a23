"""A minimal client for Prometheus' HTTP query API (``/api/v1/query``, ``/api/v1/query_range``)
over urllib, and the parsing of the verb's time-range arguments.

Only what the report needs: vectors and matrices as plain tuples, errors that name the URL.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from checkpoint_exporter.units import parse_duration

Labels = tuple[tuple[str, str], ...]


class PrometheusError(Exception):
    """Prometheus could not be reached, refused a query, or answered what cannot be its answer;
    the message names the URL (and the query, and why)."""


# Prometheus' answers are untrusted input (whoever runs it, or anything posing as it at that
# URL): what one answer may cost is bounded, and anything beyond is an error naming the query.
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # 240-point series of 1,000 jobs are about 7 MiB
# All the answers of one client together: what they become in memory is about five times their
# size (a sample of 75 bytes is held in about 340), so this bounds what the verb holds.
MAX_TOTAL_BYTES = 64 * 1024 * 1024
MAX_ERROR_BYTES = 64 * 1024  # of the body of a refusal, for its message
# A sample's value: NaN and +-Inf are Prometheus' own; a finite one beyond this is no byte count,
# duration or count a checkpoint exporter reports, and would overflow the report's arithmetic
# (1e308 did), as a non-zero one below MIN_MAGNITUDE would divide by zero in it (5e-324 did).
MAX_MAGNITUDE = 1e18
MIN_MAGNITUDE = 1e-100
# A sample's time: unix seconds between 1970 and 2286.
MAX_TIME = 1e10
_MAX_SHOWN = 60  # characters of a refused value quoted in a message


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


class _Malformed(Exception):
    """Where in an answer, and what is wrong there."""


# Control characters and the bidirectional overrides ("Trojan Source") in a label would reach a
# terminal or a rendered report as they are: they are shown escaped instead.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with control and bidi-override characters, and lone surrogates (which no UTF-8
    file can hold), written as escapes."""
    text = _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else f"{text[:_MAX_SHOWN]}...({len(text)} characters)"


def _labels(metric: object, where: str) -> Labels:
    if not isinstance(metric, dict):
        raise _Malformed(f"{where}.metric is not a mapping of labels")
    for name, value in metric.items():
        if not isinstance(value, str):
            raise _Malformed(f"{where}.metric[{_shown(name)}] is not a string: {_shown(value)}")
    return tuple(sorted((printable(str(k)), printable(v)) for k, v in metric.items()))


def _time(raw: object, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise _Malformed(f"{where} is not a time: {_shown(raw)}")
    if not 0 <= raw <= MAX_TIME:  # NaN fails this too; compared before any conversion
        raise _Malformed(f"{where} is out of range: {_shown(raw)} is not a unix time")
    return float(raw)


def _number(raw: object, where: str) -> float:
    """A sample value: Prometheus writes it as a string (NaN, +Inf, -Inf included)."""
    if not isinstance(raw, str) or len(raw) > 40:
        raise _Malformed(f"{where} is not a sample value: {_shown(raw)}")
    try:
        value = float(raw)
    except ValueError:
        raise _Malformed(f"{where} is not a number: {_shown(raw)}") from None
    if math.isfinite(value) and value != 0 and not MIN_MAGNITUDE <= abs(value) <= MAX_MAGNITUDE:
        raise _Malformed(
            f"{where} is out of range: {_shown(raw)} (a magnitude from {MIN_MAGNITUDE:g} to "
            f"{MAX_MAGNITUDE:g} is expected)"
        )
    return value


def _pair(raw: object, where: str) -> tuple[float, float]:
    if not isinstance(raw, list) or len(raw) != 2:
        raise _Malformed(f"{where} is not [time, value]: {_shown(raw)}")
    return _time(raw[0], f"{where}[0]"), _number(raw[1], f"{where}[1]")


def _items(result: object) -> list[dict[str, object]]:
    if not isinstance(result, list):
        raise _Malformed(f"data.result is not a list: {_shown(result)}")
    for index, item in enumerate(result):
        if not isinstance(item, dict):
            raise _Malformed(f"data.result[{index}] is not a mapping: {_shown(item)}")
    return result


def _vector(data: dict[str, object]) -> list[Sample]:
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        return [Sample((), _pair(result, "data.result")[1])]
    if kind != "vector":
        return []
    return [
        Sample(
            _labels(item.get("metric"), f"data.result[{i}]"),
            _pair(item.get("value"), f"data.result[{i}].value")[1],
        )
        for i, item in enumerate(_items(result))
    ]


def _matrix(data: dict[str, object]) -> list[Series]:
    if data.get("resultType") != "matrix":
        return []
    out = []
    for i, item in enumerate(_items(data.get("result"))):
        values = item.get("values", [])
        if not isinstance(values, list):
            raise _Malformed(f"data.result[{i}].values is not a list: {_shown(values)}")
        points = tuple(_pair(v, f"data.result[{i}].values[{j}]") for j, v in enumerate(values))
        out.append(Series(_labels(item.get("metric"), f"data.result[{i}]"), points))
    return out


class _Deadline:
    """One request's total time: at the deadline its sockets are shut down, so no read outlives
    it, however slowly the bytes come (a per-read timeout restarts with every byte)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        # A duplicate of the descriptor: shutting it down ends the connection under whatever
        # (TLS included) reads from the original.
        watched = socket.socket(fileno=os.dup(sock.fileno()))
        with self._lock:
            self._sockets.append(watched)
            if self.expired:
                self._shut(watched)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            for watched in self._sockets:
                watched.close()
            self._sockets.clear()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for watched in self._sockets:
                self._shut(watched)

    @staticmethod
    def _shut(watched: socket.socket) -> None:
        with contextlib.suppress(OSError):
            watched.shutdown(socket.SHUT_RDWR)


class _Watching:
    """urllib's handlers, with every connection they make watched by ``deadline``."""

    deadline: _Deadline

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        deadline = self.deadline

        class Watched(http_class):  # type: ignore[misc, valid-type]
            def connect(self) -> None:
                super().connect()
                deadline.watch(self.sock)

        return super().do_open(Watched, req, **kwargs)  # type: ignore[misc]


class _HTTP(_Watching, urllib.request.HTTPHandler):
    pass


class _HTTPS(_Watching, urllib.request.HTTPSHandler):
    pass


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    handlers = [_HTTP(), _HTTPS()]
    for handler in handlers:
        handler.deadline = deadline
    return urllib.request.build_opener(*handlers)  # proxies from the environment, as urlopen


class PrometheusClient:
    """``query`` and ``query_range`` against one Prometheus (or Thanos / Mimir query) URL.
    ``timeout`` is each request's whole time, from connecting to the answer's last byte."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.received = 0  # bytes of every answer so far, for MAX_TOTAL_BYTES

    def _get(self, path: str, params: dict[str, str]) -> dict[str, object]:
        """The ``data`` of the answer to ``params``' query, read within the timeout."""
        query = params.get("query", "")
        address = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        deadline = _Deadline(self.timeout)
        try:
            body = self._fetch(address, query, deadline)
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            if deadline.expired:
                raise self._error(query, f"no whole answer within {self.timeout:g} s") from None
            reason = getattr(error, "reason", None) or error
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {reason}") from None
        finally:
            deadline.close()
        if deadline.expired:
            raise self._error(query, f"no whole answer within {self.timeout:g} s")
        try:
            document = json.loads(body)
        except RecursionError:
            raise self._error(query, "the answer is JSON nested too deeply") from None
        except ValueError:
            raise self._error(
                query, "the answer is not JSON: is --prometheus.url the Prometheus server's URL?"
            ) from None
        if not isinstance(document, dict) or document.get("status") != "success":
            detail = document.get("error") if isinstance(document, dict) else document
            raise PrometheusError(
                f"Prometheus at {self.url}: query {query!r} failed: {printable(str(detail))[:1000]}"
            )
        data = document.get("data")
        return data if isinstance(data, dict) else {}

    def _fetch(self, address: str, query: str, deadline: _Deadline) -> bytes:
        try:
            reply = _opener(deadline).open(address, timeout=self.timeout)
        except urllib.error.HTTPError as error:
            # Prometheus answers a bad query with 400 and a JSON error body.
            with error:
                try:
                    detail = json.loads(error.read(MAX_ERROR_BYTES)).get("error", error.reason)
                except (ValueError, RecursionError, AttributeError, OSError):
                    detail = error.reason
            raise PrometheusError(
                f"Prometheus at {self.url} refused {query!r}: {printable(str(detail))[:1000]}"
            ) from None
        limit = min(MAX_ANSWER_BYTES, MAX_TOTAL_BYTES - self.received)
        too_large = (
            f"the answer is larger than {_mib(MAX_ANSWER_BYTES)}"
            if limit == MAX_ANSWER_BYTES
            else f"the answers together are larger than {_mib(MAX_TOTAL_BYTES)}"
        )
        with reply:
            length = reply.headers.get("Content-Length", "")
            if length.isdigit() and int(length) > limit:
                raise self._error(query, too_large)
            chunks, size = [], 0
            while chunk := reply.read(min(1024 * 1024, limit + 1 - size)):
                size += len(chunk)
                if size > limit:
                    raise self._error(query, too_large)
                chunks.append(chunk)
        self.received += size
        return b"".join(chunks)

    def _error(self, query: str, reason: str) -> PrometheusError:
        # The query in full: the verb built it (from --selector), so it is not hostile.
        return PrometheusError(f"Prometheus at {self.url}: query {query!r}: {reason}")

    def query(self, expr: str, at: float) -> list[Sample]:
        data = self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        try:
            return _vector(data)
        except _Malformed as error:
            raise self._error(expr, f"malformed answer: {error}") from None

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self._get(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        try:
            return _matrix(data)
        except _Malformed as error:
            raise self._error(expr, f"malformed answer: {error}") from None

    def reachable(self) -> None:
        """Raises PrometheusError unless the URL answers as Prometheus' query API."""
        self.query("vector(1)", time.time())


def _mib(size: int) -> str:
    return f"{size / 1024 / 1024:g} MiB"


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
