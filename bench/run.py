"""Benchmarks: `make bench`. Prints a table and writes bench/results/<name>.json.

scrape: /metrics latency over loopback HTTP (keep-alive, 200 scrapes) as the number of watched
jobs grows, rendering every scrape and reusing the render of an unchanged snapshot. The exporter
runs in-process, wired as `serve` wires it, over trackers filled with synthetic generations.
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import statistics
import time
from pathlib import Path

from checkpoint_exporter import __version__
from checkpoint_exporter.collectors import enabled_collectors
from checkpoint_exporter.config import Config, Policy, WebConfig
from checkpoint_exporter.layouts.base import Found
from checkpoint_exporter.metrics import build_registry
from checkpoint_exporter.model import COMMITTED, DURABLE, WatchedPath
from checkpoint_exporter.server import MetricsServer
from checkpoint_exporter.spool import Event
from checkpoint_exporter.tracker import JobTracker, Tracker

RESULTS = Path(__file__).resolve().parent / "results"


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _tracker(jobs: int, generations: int) -> Tracker:
    """``jobs`` instrumented jobs with ``generations`` committed generations each: every
    per-job series the exporter has, all phase histograms included (the worst case)."""
    tracker = Tracker(Config())
    now = time.time()
    for index in range(jobs):
        name = f"job-{index}"
        job = JobTracker(name, (WatchedPath(DURABLE, f"/ckpt/{name}", "inotify"),), Policy())
        found = [
            Found(f"step-{step}", step, COMMITTED, now - 900 * (generations - step),
                  now - 900 * (generations - step) + 30, now - 900 * (generations - step) + 30,
                  10**9, 1000)
            for step in range(generations)
        ]  # fmt: skip
        job.observe(DURABLE, found[:-1], now - 1000)
        points = ("save_start", "resume", "staged", "written", "committed")
        events = [
            Event(now - 40 + offset, event, name, generations - 1, 0, 1, "node", None, None, None)
            for offset, event in enumerate(points)
        ]
        job.apply_events(events, now - 10)
        job.observe(DURABLE, found, now - 5)
        job.tick(now)
        tracker.add(job)
    tracker.publish()
    return tracker


def bench_scrape(job_counts: list[int], scrapes: int, generations: int) -> list[dict[str, float]]:
    rows = []
    for count in job_counts:
        tracker = _tracker(count, generations)
        for cached in (False, True):
            registry = build_registry(lambda t=tracker: t.snapshot, enabled_collectors({}))
            web = WebConfig(listen_address="127.0.0.1:0")
            server = MetricsServer(web, registry, lambda t=tracker: t.snapshot, cached)
            server.start()
            try:
                connection = http.client.HTTPConnection(
                    "127.0.0.1", server.address.port, timeout=30
                )
                latencies, body = [], b""
                for _ in range(scrapes):
                    started = time.perf_counter()
                    connection.request("GET", "/metrics")
                    body = connection.getresponse().read()
                    latencies.append(time.perf_counter() - started)
                connection.close()
            finally:
                server.stop()
            series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
            p50 = statistics.median(latencies)
            rows.append(
                {
                    "jobs": count,
                    "render": "cached" if cached else "every scrape",
                    "series": series,
                    "bytes": len(body),
                    "p50_ms": p50 * 1000,
                    "p99_ms": _percentile(latencies, 0.99) * 1000,
                    "us_per_series": p50 / series * 1e6,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--jobs", type=int, nargs="+", default=[10, 200, 1000])
    parser.add_argument("--generations", type=int, default=10)
    args = parser.parse_args()
    rows = bench_scrape(args.jobs, args.scrapes, args.generations)
    print(
        f"/metrics over loopback HTTP, {args.scrapes} scrapes each, {args.generations} "
        "generations per job, every phase histogram present"
    )
    print(
        f"{'jobs':>6} {'render':>13} {'series':>7} {'bytes':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'us/series':>10}"
    )
    for row in rows:
        print(
            f"{row['jobs']:>6} {row['render']:>13} {row['series']:>7} {row['bytes']:>9} "
            f"{row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} {row['us_per_series']:>10.2f}"
        )
    RESULTS.mkdir(exist_ok=True)
    machine = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "version": __version__,
    }
    (RESULTS / "scrape.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    print(f"wrote {RESULTS / 'scrape.json'}")


if __name__ == "__main__":
    main()
