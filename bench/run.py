"""Benchmarks: `make bench`. Prints a table and writes bench/results/<name>.json.

scrape: /metrics latency over loopback HTTP (keep-alive, 200 scrapes) as the number of watched
jobs grows. The exporter runs in-process, exactly as `serve` wires it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from checkpoint_exporter import __version__
from checkpoint_exporter.collectors import enabled_collectors
from checkpoint_exporter.config import parse_config
from checkpoint_exporter.metrics import build_registry
from checkpoint_exporter.server import MetricsServer
from checkpoint_exporter.tracker import Tracker

RESULTS = Path(__file__).resolve().parent / "results"


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def bench_scrape(job_counts: list[int], scrapes: int) -> list[dict[str, float]]:
    rows = []
    for count in job_counts:
        with tempfile.TemporaryDirectory() as root:
            jobs = []
            for index in range(count):
                (Path(root) / f"job-{index}").mkdir()
                jobs.append(f"  - {{name: job-{index}, path: job-{index}}}")
            text = "web: {listen_address: '127.0.0.1:0'}\njobs:\n" + "\n".join(jobs) + "\n"
            config = parse_config(text, "bench.yaml", Path(root))
            tracker = Tracker(config)
            tracker.publish()
            registry = build_registry(lambda t=tracker: t.snapshot, enabled_collectors({}))
            server = MetricsServer(config.web, registry, lambda t=tracker: t.snapshot)
            server.start()
            try:
                connection = http.client.HTTPConnection(
                    "127.0.0.1", server.address.port, timeout=10
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
    args = parser.parse_args()
    rows = bench_scrape(args.jobs, args.scrapes)
    print(f"scrape latency over loopback HTTP, {args.scrapes} scrapes each")
    print(f"{'jobs':>6} {'series':>7} {'bytes':>8} {'p50 ms':>8} {'p99 ms':>8} {'us/series':>10}")
    for row in rows:
        print(
            f"{row['jobs']:>6} {row['series']:>7} {row['bytes']:>8} {row['p50_ms']:>8.2f} "
            f"{row['p99_ms']:>8.2f} {row['us_per_series']:>10.2f}"
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
