"""/metrics: the one render path, from a snapshot, re-rendering only the jobs that changed.

Rendering every series on every scrape costs about 7 us per series in prometheus_client, 0.14 s
at 200 jobs (bench/scrape.py), while a scrape usually finds one or two jobs changed. The per-job
collectors (``per_job = True``) are therefore asked for one job at a time, and each job's lines are
kept until that job's ``version`` moves: the core raises it on every change and never gives a
job name a version it had before (a job removed and added again included); 0 means unversioned.
A snapshot's whole exporter body is kept until the next snapshot, and concurrent scrapers share
one render.
prometheus_client still does all the formatting, family by family, so the bytes are exactly what
its own encoders produce for ``Renderer.collect()`` (the same families, all at once), in
Prometheus text and OpenMetrics alike.

The exporter's own process metrics (process_*, python_*), on by default as in node_exporter,
come from prometheus_client's collectors in a private registry, freshly on every scrape, and
are appended through the same encoders.

A sample no encoder can write (a value no float holds: a tenant's ``global_step`` of 10**400
that a reader let through) would fail its whole collector, for every job. The renderer drops
that one series instead, logs it once, and serves the rest.
"""

from __future__ import annotations

import copy
import functools
import logging
import platform
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from typing import TypeVar

from prometheus_client import GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample

from checkpoint_exporter import __version__
from checkpoint_exporter.exposition.collectors.base import (
    BUILD_INFO,
    SCRAPE_COLLECTOR_DURATION,
    SCRAPE_COLLECTOR_SUCCESS,
    NoDataError,
    SnapshotCollector,
)
from checkpoint_exporter.model import JobState, Snapshot

log = logging.getLogger(__name__)

Encoder = Callable[[CollectorRegistry], bytes]
Part = TypeVar("Part")
# What an encoder does, as a cache key: prometheus_client (0.26) makes a new functools.partial
# for every OpenMetrics request, equal in what it does, never the same object.
EncoderKey = Hashable
# Encoders whose renders are kept: each format and escaping a scraper asks for is one; a
# scraper cycling through Accept variants evicts the least recently used.
MAX_ENCODERS = 8
# Dropped series logged, each once; past this many, more are dropped without a word.
MAX_LOGGED_DROPS = 1024
# Labels that tell apart the samples of one series (a histogram's buckets, a summary's
# quantiles): a series is dropped whole.
_WITHIN_SERIES = frozenset({"le", "quantile"})


def encoder_key(encoder: Encoder) -> EncoderKey:
    if isinstance(encoder, functools.partial):
        return (encoder.func, encoder.args, tuple(sorted(encoder.keywords.items())))
    return encoder


def runtime_registry() -> CollectorRegistry:
    """prometheus_client's process, platform and GC collectors, in a registry of their own."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


class _Families:
    """Just enough of a registry for prometheus_client's encoders."""

    def __init__(self, families: Sequence[Metric]):
        self._families = families

    def collect(self) -> Sequence[Metric]:
        return self._families


def _encode(encoder: Encoder, families: Sequence[Metric]) -> bytes:
    return encoder(_Families(families))  # type: ignore[arg-type]


def _without_eof(encoded: bytes) -> bytes:
    return encoded[: -len(b"# EOF\n")] if encoded.endswith(b"# EOF\n") else encoded


def _split(encoded: bytes) -> tuple[bytes, bytes]:
    """(HELP/TYPE/UNIT lines, sample lines) of one encoded family. Sample lines never start
    with '#', and a label value's line breaks are escaped, so splitting on b"\\n" is exact."""
    header, samples = [], []
    for line in encoded.split(b"\n"):
        if not line or line == b"# EOF":
            continue
        (header if line.startswith(b"#") else samples).append(line + b"\n")
    return b"".join(header), b"".join(samples)


def _unwritable(value: object) -> bool:
    """Whether no encoder can write ``value`` (every one writes it through float())."""
    if type(value) is float:  # the common case, cheaply
        return False
    try:
        float(value)  # type: ignore[arg-type]
    except (OverflowError, TypeError, ValueError):
        return True
    return False


def _series(sample: Sample) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in sample.labels.items() if k not in _WITHIN_SERIES))


def _described(value: object) -> str:
    """A value for the log, never its digits: a 10**400 would make a 401-character line (and
    one of over 4,300 digits cannot become text at all)."""
    if isinstance(value, int):
        return f"an integer of {value.bit_length()} bits"
    return f"a {type(value).__name__}"


def _build_info() -> Metric:
    build = BUILD_INFO.family()
    build.add_metric([__version__, platform.python_version()], 1)
    return build


class Renderer:
    """Every scrape's body: build info, each enabled collector wrapped (as node_exporter does)
    in a success and a duration series so one broken source never fails the scrape, then the
    runtime metrics when ``runtime`` is given."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        collectors: Sequence[SnapshotCollector],
        runtime: CollectorRegistry | None = None,
    ) -> None:
        self.snapshot = snapshot
        self._collectors = tuple(collectors)
        self._runtime = runtime
        # (encoder, collector, job) -> (JobState.version rendered, telemetry it saw, sample lines)
        self._jobs: dict[tuple[EncoderKey, str, str], tuple[int, object, list[bytes]]] = {}
        self._headers: dict[tuple[EncoderKey, str], list[bytes]] = {}
        # The last snapshot's body per encoder, least recently used first.
        self._bodies: OrderedDict[EncoderKey, tuple[Snapshot, bytes]] = OrderedDict()
        self._lock = threading.Lock()
        self._logged_drops: set[tuple[str, str, tuple[tuple[str, str], ...]]] = set()
        self.jobs_rendered = 0  # jobs rendered afresh, for tests and benchmarks
        self.bodies_rendered = 0  # snapshots rendered afresh

    def render(self, encoder: Encoder) -> bytes:
        """The scrape's body in ``encoder``'s format."""
        return b"".join(self.render_parts(encoder))

    def render_parts(self, encoder: Encoder) -> tuple[bytes, bytes]:
        """The body as (the snapshot's part, kept until the next snapshot; the runtime part,
        fresh): a server writes them one after the other rather than copy megabytes."""
        return self._exporter_body(encoder), _encode(encoder, self._runtime_families())

    def collect(self) -> list[Metric]:
        """The same families, built whole on every call: the prometheus_client collector
        interface, for a registry (``metrics.build_registry``) and for the tests that hold
        ``render`` to it byte for byte."""
        snapshot = self.snapshot()
        families, tail = self._each_collector(lambda c: self._families(c, snapshot))
        return [_build_info(), *families, *tail, *self._runtime_families()]

    def _runtime_families(self) -> list[Metric]:
        return list(self._runtime.collect()) if self._runtime is not None else []

    def cached_encoders(self) -> int:
        """How many encoders' renders are kept (at most MAX_ENCODERS)."""
        return len({key[0] for key in self._headers} | set(self._bodies))

    def _exporter_body(self, encoder: Encoder) -> bytes:
        key = encoder_key(encoder)
        snapshot = self.snapshot()
        cached = self._bodies.get(key)
        if cached is not None and cached[0] is snapshot:
            return cached[1]
        # One render per snapshot however many scrapers arrive at once: the rest wait for it
        # (rendering is CPU-bound, so rendering in parallel would only be slower for all).
        with self._lock:
            snapshot = self.snapshot()
            cached = self._bodies.get(key)
            if cached is not None and cached[0] is snapshot:
                return cached[1]
            self._make_room(key)
            parts, tail = self._each_collector(lambda c: self._collector(c, snapshot, encoder, key))
            build = _without_eof(_encode(encoder, [_build_info()]))
            body = b"".join([build, *parts, _without_eof(_encode(encoder, tail))])
            self._forget_gone(snapshot)
            self._bodies[key] = (snapshot, body)
            self._bodies.move_to_end(key)
            self.bodies_rendered += 1
            return body

    def _make_room(self, key: EncoderKey) -> None:
        """Keep the renders of the MAX_ENCODERS encoders used last, ``key`` among them."""
        if key in self._bodies:
            self._bodies.move_to_end(key)
            return
        while len(self._bodies) >= MAX_ENCODERS:
            gone, _ = self._bodies.popitem(last=False)
            self._jobs = {k: v for k, v in self._jobs.items() if k[0] != gone}
            self._headers = {k: v for k, v in self._headers.items() if k[0] != gone}

    def _each_collector(
        self, output: Callable[[SnapshotCollector], list[Part]]
    ) -> tuple[list[Part], list[Metric]]:
        """Every collector's ``output``, and the success and duration families that say how
        each one went. A collector that fails or has no data contributes nothing."""
        parts: list[Part] = []
        success = SCRAPE_COLLECTOR_SUCCESS.family()
        duration = SCRAPE_COLLECTOR_DURATION.family()
        for collector in self._collectors:
            started = time.perf_counter()
            try:
                parts += output(collector)
                ok = 1
            except NoDataError as reason:
                ok = 0
                log.debug("collector returned no data: collector=%s reason=%s",
                          collector.name, reason)  # fmt: skip
            except Exception:
                ok = 0
                log.exception("collector failed: collector=%s", collector.name)
            duration.add_metric([collector.name], time.perf_counter() - started)
            success.add_metric([collector.name], ok)
        return parts, [success, duration]

    def _collector(
        self, collector: SnapshotCollector, snapshot: Snapshot, encoder: Encoder, key: EncoderKey
    ) -> list[bytes]:
        if not collector.per_job:
            return [_without_eof(_encode(encoder, self._families(collector, snapshot)))]
        # Without jobs: the families' headers, and whether the collector has data at all.
        empty = self._families(collector, replace(snapshot, jobs=()))
        headers = self._headers.get((key, collector.name))
        if headers is None or len(headers) != len(empty):
            headers = [_split(_encode(encoder, [family]))[0] for family in empty]
            self._headers[(key, collector.name)] = headers
        samples: list[list[bytes]] = [[] for _ in headers]
        for job in snapshot.jobs:
            for index, lines in enumerate(self._job(collector, snapshot, job, encoder, key)):
                samples[index].append(lines)
        return [header + b"".join(lines) for header, lines in zip(headers, samples, strict=True)]

    def _job(
        self, collector: SnapshotCollector, snapshot: Snapshot, job: JobState, encoder: Encoder,
        encoder_key: EncoderKey,
    ) -> list[bytes]:  # fmt: skip
        key = (encoder_key, collector.name, job.name)
        cached = self._jobs.get(key)
        # Version 0 is a state nobody versioned (the dataclass default): never reused.
        if (
            cached is not None
            and job.version
            and cached[0] == job.version
            and cached[1] == snapshot.telemetry
        ):
            return cached[2]
        families = self._families(collector, replace(snapshot, jobs=(job,)))
        lines = [_split(_encode(encoder, [family]))[1] for family in families]
        self._jobs[key] = (job.version, snapshot.telemetry, lines)
        self.jobs_rendered += 1
        return lines

    def _families(self, collector: SnapshotCollector, snapshot: Snapshot) -> list[Metric]:
        """What ``collector`` says of ``snapshot``, less the series no encoder can write."""
        return [self._writable(collector.name, f) for f in collector.collect(snapshot)]

    def _writable(self, collector: str, family: Metric) -> Metric:
        """``family`` without its series that hold a sample no encoder can write: a copy, as
        the collector may keep and reuse its own."""
        bad = {_series(s): s.value for s in family.samples if _unwritable(s.value)}
        if not bad:
            return family
        for series, value in bad.items():
            key = (collector, family.name, series)
            if key not in self._logged_drops and len(self._logged_drops) < MAX_LOGGED_DROPS:
                self._logged_drops.add(key)
                log.warning(
                    "series dropped: collector=%s metric=%s labels=%s: its value, %s, is no "
                    "number a float holds; the collector's other series are served",
                    collector, family.name, dict(series), _described(value),
                )  # fmt: skip
        kept = copy.copy(family)
        kept.samples = [s for s in family.samples if _series(s) not in bad]
        return kept

    def _forget_gone(self, snapshot: Snapshot) -> None:
        if len(self._jobs) > len(snapshot.jobs) * len(self._collectors) * 2:
            names = {job.name for job in snapshot.jobs}
            self._jobs = {key: value for key, value in self._jobs.items() if key[2] in names}
