"""scrape: /metrics latency over loopback HTTP (keep-alive, SCRAPES scrapes) as jobs grow.

Four ways per job count: every series rendered by prometheus_client on every scrape; the
incremental renderer with one job changed before each scrape (a save somewhere in the cluster);
and an unchanged snapshot, whose render is reused -- all three with the exporter's own process
and Python metrics, on by default; and the unchanged snapshot without them
(--web.disable-exporter-metrics), to show what they cost. The exporter runs in-process, wired as
``serve`` wires it, over trackers filled with synthetic jobs of GENERATIONS generations.

The anchor, in the same run: Debian's prometheus-node-exporter with only its netdev, filesystem
and diskstats collectors, scraped the same way. Time per series compares the two.
"""

from __future__ import annotations

import http.client
import shutil
import socket
import statistics
import subprocess
import time
from collections.abc import Callable

from checkpoint_exporter.config import WebConfig
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.exposition.collectors import enabled_collectors
from checkpoint_exporter.exposition.metrics import build_registry
from checkpoint_exporter.exposition.renderer import Renderer, runtime_registry
from checkpoint_exporter.exposition.server import MetricsServer
from checkpoint_exporter.model import DURABLE
from process import percentile
from tests.helpers.synthetic import generations, synthetic_tracker

MODES = ("prometheus_client", "one job changed", "unchanged", "unchanged, no exporter metrics")
NODE_EXPORTER = "node_exporter (netdev, filesystem, diskstats)"


def _scrapes(port: int, scrapes: int, before: Callable[[], None]) -> tuple[list[float], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/metrics")
    body = connection.getresponse().read()  # the first render of every job
    latencies = []
    for _ in range(scrapes):
        before()
        started = time.perf_counter()
        connection.request("GET", "/metrics")
        body = connection.getresponse().read()
        latencies.append(time.perf_counter() - started)
    connection.close()
    return latencies, body


def _row(jobs: int | None, render: str, latencies: list[float], body: bytes) -> dict[str, object]:
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    p50 = statistics.median(latencies)
    return {
        "jobs": jobs, "render": render, "series": series, "bytes": len(body),
        "p50_ms": p50 * 1000, "p99_ms": percentile(latencies, 0.99) * 1000,
        "us_per_series": p50 / series * 1e6,
    }  # fmt: skip


def _change_one_job(tracker: Tracker) -> Callable[[], None]:
    """Each call commits a new generation in the next job, as saves across a cluster do."""
    names = list(tracker.jobs)
    state = {"turn": 0, "step": 1000}

    def change() -> None:
        job = tracker.jobs[names[state["turn"] % len(names)]]
        state["turn"] += 1
        state["step"] += 1
        now = time.time()
        job.observe(DURABLE, generations(10, now, state["step"]), now)
        tracker.publish()

    return change


class _EverySeries:
    """The baseline: prometheus_client renders the whole registry on every scrape."""

    def __init__(self, snapshot: Callable[[], object], collectors: list) -> None:
        self.snapshot = snapshot
        self._registry = build_registry(snapshot, collectors, runtime_metrics=True)

    def render_parts(self, encoder: Callable[[object], bytes]) -> tuple[bytes]:
        return (encoder(self._registry),)


def bench_scrape(job_counts: list[int], scrapes: int, count: int) -> list[dict[str, object]]:
    rows = []
    for jobs in job_counts:
        for mode in MODES:
            tracker = synthetic_tracker(jobs, count)
            collectors = enabled_collectors({})
            snapshot = lambda t=tracker: t.snapshot  # noqa: E731
            if mode == MODES[0]:
                renderer = _EverySeries(snapshot, collectors)
            else:
                runtime = None if mode == MODES[3] else runtime_registry()
                renderer = Renderer(snapshot, collectors, runtime)
            web = WebConfig(listen_address="127.0.0.1:0")
            server = MetricsServer(web, renderer)  # type: ignore[arg-type]
            change = _change_one_job(tracker) if mode == MODES[1] else (lambda: None)
            server.start()
            try:
                latencies, body = _scrapes(server.address.port, scrapes, change)
            finally:
                server.stop()
            rows.append(_row(jobs, mode, latencies, body))
    return rows


def bench_node_exporter(scrapes: int) -> dict[str, object] | None:
    """The anchor; None where prometheus-node-exporter is not installed."""
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        return None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
         "--collector.netdev", "--collector.filesystem", "--collector.diskstats"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                latencies, body = _scrapes(port, scrapes, lambda: None)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=10)
    return _row(None, NODE_EXPORTER, latencies, body)
