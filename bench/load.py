"""load: many concurrent scrapers against a real exporter process while saves continue.

The exporter (``checkpoint-exporter serve`` in its own process) tracks JOBS jobs of DCP
generations on disk. A writer publishes a new generation into one job after another (by rename,
as DCP does) and removes each job's oldest, so snapshots keep changing under the scrapers.
SCRAPERS keep-alive clients scrape /metrics as fast as they are answered. Reported: scrapes,
errors (any non-200, short body or connection failure), latency percentiles, saves published,
and the exporter's RSS over the run (after a warm-up) to show whether memory stays flat.
"""

from __future__ import annotations

import http.client
import os
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from checkpoint_exporter.demo.cluster import dcp_metadata
from process import Exporter, percentile, write_config
from tree import write_generation

SHARDS = 2
SHARD_BYTES = 4096
_METADATA = dcp_metadata({f"__{rank}_0.distcp": SHARD_BYTES for rank in range(SHARDS)})


@dataclass
class LoadResult:
    jobs: int
    scrapers: int
    seconds: float
    scrapes: int
    errors: int
    scrapes_per_second: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    saves: int
    rss_start_mb: float  # after the warm-up
    rss_end_mb: float
    rss_max_mb: float
    fewest_scrapes: int  # by any one scraper: none was starved
    rss_every_10s_mb: list[float] = field(default_factory=list)
    first_error: str = ""


def _generation(directory: Path) -> None:
    write_generation(directory, SHARDS, _METADATA)


def _build(root: Path, jobs: int, generations: int) -> None:
    for index in range(jobs):
        for step in range(generations):
            _generation(root / "ckpt" / f"job-{index}" / f"step-{step}")


def _config(root: Path, jobs: int) -> Path:
    return write_config(
        root / "config.yaml",
        {f"job-{i}": root / "ckpt" / f"job-{i}" for i in range(jobs)},
        interval="10m", deadline="60s", retained_generations="12",
    )  # fmt: skip


class _Scraper(threading.Thread):
    def __init__(self, port: int, stop: threading.Event, minimum_bytes: int):
        super().__init__(daemon=True)
        self.port, self.stop, self.minimum_bytes = port, stop, minimum_bytes
        self.latencies: list[float] = []
        self.errors: list[str] = []

    def run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                connection.request("GET", "/metrics")
                reply = connection.getresponse()
                body = reply.read()
                if reply.status != 200 or len(body) < self.minimum_bytes:
                    self.errors.append(f"status {reply.status}, {len(body)} bytes")
                    continue
                self.latencies.append(time.perf_counter() - started)
            except (OSError, http.client.HTTPException) as error:
                self.errors.append(f"{type(error).__name__}: {error}")
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        connection.close()


def _saves(root: Path, jobs: int, generations: int, stop: threading.Event, every: float) -> int:
    """Publish a generation into each job in turn and drop its oldest, until stopped."""
    staging = root / "staging"
    next_step = dict.fromkeys(range(jobs), generations)
    published, index = 0, 0
    while not stop.wait(every):
        job = root / "ckpt" / f"job-{index}"
        step = next_step[index]
        _generation(staging / f"step-{step}")
        os.rename(staging / f"step-{step}", job / f"step-{step}")
        shutil.rmtree(job / f"step-{step - generations}", ignore_errors=True)
        next_step[index] = step + 1
        published += 1
        index = (index + 1) % jobs
    return published


def run_load(
    seconds: float = 60,
    scrapers: int = 50,
    jobs: int = 200,
    generations: int = 10,
    save_every: float = 0.1,
    warmup: float = 5,
) -> LoadResult:
    root = Path(tempfile.mkdtemp(prefix="checkpoint-exporter-load-"))
    exporter = None
    try:
        _build(root, jobs, generations)
        exporter = Exporter(_config(root, jobs))
        # Every job's series must be in the answer before the clock starts.
        probe = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=30)
        while True:
            probe.request("GET", "/metrics")
            body = probe.getresponse().read()
            if body.count(b"checkpoint_last_committed_step{") >= jobs:
                break
            time.sleep(0.2)
        probe.close()
        stop = threading.Event()
        saves: list[int] = []
        writer = threading.Thread(
            target=lambda: saves.append(_saves(root, jobs, generations, stop, save_every))
        )
        clients = [_Scraper(exporter.port, stop, len(body) // 2) for _ in range(scrapers)]
        writer.start()
        for client in clients:
            client.start()
        time.sleep(min(warmup, seconds / 4))
        rss = [exporter.rss_mb()]
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            time.sleep(1.0)
            rss.append(exporter.rss_mb())
        stop.set()
        writer.join()
        for client in clients:
            client.join(timeout=60)
        latencies = [x for client in clients for x in client.latencies]
        errors = [x for client in clients for x in client.errors]
        elapsed = time.monotonic() - started
        return LoadResult(
            jobs=jobs, scrapers=scrapers, seconds=round(elapsed, 1), scrapes=len(latencies),
            errors=len(errors), scrapes_per_second=len(latencies) / elapsed,
            p50_ms=statistics.median(latencies) * 1000 if latencies else 0.0,
            p99_ms=percentile(latencies, 0.99) * 1000, max_ms=max(latencies, default=0) * 1000,
            saves=saves[0] if saves else 0, rss_start_mb=rss[0], rss_end_mb=rss[-1],
            rss_max_mb=max(rss), first_error=errors[0] if errors else "",
            rss_every_10s_mb=[round(value, 1) for value in rss[::10]],
            fewest_scrapes=min(len(client.latencies) for client in clients),
        )  # fmt: skip
    finally:
        if exporter is not None:
            exporter.stop()
        shutil.rmtree(root, ignore_errors=True)


def report(result: LoadResult) -> str:
    return (
        f"{result.scrapers} scrapers x {result.seconds:.0f} s, {result.jobs} jobs, "
        f"{result.saves} saves published: {result.scrapes} scrapes "
        f"({result.scrapes_per_second:.1f}/s, at least {result.fewest_scrapes} per scraper), "
        f"{result.errors} errors, "
        f"p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms, max {result.max_ms:.1f} ms; "
        f"RSS {result.rss_start_mb:.1f} -> {result.rss_end_mb:.1f} MB "
        f"(max {result.rss_max_mb:.1f})"
    )


def as_dict(result: LoadResult) -> dict:
    return asdict(result)
