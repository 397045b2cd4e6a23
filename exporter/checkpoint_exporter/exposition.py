"""/metrics rendered from a snapshot, re-rendering only the jobs that changed since last time.

Rendering every series on every scrape costs about 7 us per series in prometheus_client, 0.14 s
at 200 jobs (bench/scrape.py), while a scrape usually finds one or two jobs changed. The per-job
collectors (``per_job = True``) are therefore asked for one job at a time, and each job's lines are
kept until that job's state object is replaced (the tracker keeps it while nothing changes).
prometheus_client still does all the formatting, family by family, so the bytes are exactly
what its own encoders produce for the same snapshot, in Prometheus text and OpenMetrics alike.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry

from checkpoint_exporter import __version__, metrics
from checkpoint_exporter.model import JobState, Snapshot

log = logging.getLogger(__name__)

Encoder = Callable[[CollectorRegistry], bytes]


class _Families:
    """Just enough of a registry for prometheus_client's encoders."""

    def __init__(self, families: Sequence[Metric]):
        self._families = families

    def collect(self) -> Sequence[Metric]:
        return self._families


def _encode(encoder: Encoder, families: Sequence[Metric]) -> bytes:
    return encoder(_Families(families))  # type: ignore[arg-type]


def _split(encoded: bytes) -> tuple[bytes, bytes]:
    """(HELP/TYPE/UNIT lines, sample lines) of one encoded family. Sample lines never start
    with '#', and a label value's line breaks are escaped, so splitting on b"\\n" is exact."""
    header, samples = [], []
    for line in encoded.split(b"\n"):
        if not line or line == b"# EOF":
            continue
        (header if line.startswith(b"#") else samples).append(line + b"\n")
    return b"".join(header), b"".join(samples)


class Renderer:
    """Renders what ``metrics.ExporterCollector`` yields, byte for byte, reusing unchanged jobs."""

    def __init__(
        self, snapshot: Callable[[], Snapshot], collectors: Sequence[metrics.SnapshotCollector]
    ) -> None:
        self._snapshot = snapshot
        self._collectors = tuple(collectors)
        # (encoder, collector, job) -> (the JobState rendered, telemetry it saw, sample lines)
        self._jobs: dict[tuple[Encoder, str, str], tuple[JobState, object, list[bytes]]] = {}
        self._headers: dict[tuple[Encoder, str], list[bytes]] = {}
        self.jobs_rendered = 0  # jobs rendered afresh, for tests and benchmarks

    def render(self, encoder: Encoder) -> bytes:
        snapshot = self._snapshot()
        build = metrics.BUILD_INFO.family()
        build.add_metric([__version__, platform.python_version()], 1)
        parts = [_without_eof(_encode(encoder, [build]))]
        success = metrics.SCRAPE_COLLECTOR_SUCCESS.family()
        duration = metrics.SCRAPE_COLLECTOR_DURATION.family()
        for collector in self._collectors:
            started = time.perf_counter()
            try:
                parts += self._collector(collector, snapshot, encoder)
                ok = 1
            except metrics.NoDataError as reason:
                ok = 0
                log.debug("collector returned no data: collector=%s reason=%s",
                          collector.name, reason)  # fmt: skip
            except Exception:
                ok = 0
                log.exception("collector failed: collector=%s", collector.name)
            duration.add_metric([collector.name], time.perf_counter() - started)
            success.add_metric([collector.name], ok)
        parts.append(_encode(encoder, [success, duration]))  # ends with # EOF in OpenMetrics
        self._forget_gone(snapshot)
        return b"".join(parts)

    def _collector(
        self, collector: metrics.SnapshotCollector, snapshot: Snapshot, encoder: Encoder
    ) -> list[bytes]:
        if not collector.per_job:
            return [_without_eof(_encode(encoder, list(collector.collect(snapshot))))]
        # Without jobs: the families' headers, and whether the collector has data at all.
        empty = list(collector.collect(replace(snapshot, jobs=())))
        headers = self._headers.get((encoder, collector.name))
        if headers is None or len(headers) != len(empty):
            headers = [_split(_encode(encoder, [family]))[0] for family in empty]
            self._headers[(encoder, collector.name)] = headers
        samples: list[list[bytes]] = [[] for _ in headers]
        for job in snapshot.jobs:
            for index, lines in enumerate(self._job(collector, snapshot, job, encoder)):
                samples[index].append(lines)
        return [header + b"".join(lines) for header, lines in zip(headers, samples, strict=True)]

    def _job(
        self,
        collector: metrics.SnapshotCollector,
        snapshot: Snapshot,
        job: JobState,
        encoder: Encoder,
    ) -> list[bytes]:
        key = (encoder, collector.name, job.name)
        cached = self._jobs.get(key)
        if cached is not None and cached[0] is job and cached[1] == snapshot.telemetry:
            return cached[2]
        families = list(collector.collect(replace(snapshot, jobs=(job,))))
        lines = [_split(_encode(encoder, [family]))[1] for family in families]
        self._jobs[key] = (job, snapshot.telemetry, lines)
        self.jobs_rendered += 1
        return lines

    def _forget_gone(self, snapshot: Snapshot) -> None:
        if len(self._jobs) > len(snapshot.jobs) * len(self._collectors) * 2:
            names = {job.name for job in snapshot.jobs}
            self._jobs = {key: value for key, value in self._jobs.items() if key[2] in names}


def _without_eof(encoded: bytes) -> bytes:
    return encoded[: -len(b"# EOF\n")] if encoded.endswith(b"# EOF\n") else encoded
