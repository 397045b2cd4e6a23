"""scan: what a big checkpoint tree costs — the cold scan, the idle daemon, and scrapes over it.

Trees of DCP jobs (bench/tree.py): SMALL = 50 jobs x 20 generations x 9 shards (10,000 files)
and LARGE = 50 x 20 x 999 (1,000,000 files). Same jobs and generations, so the two differ only
in the number of files.

- cold: the first full read of every job (the scanner's TreeReader, in this process) against
  ``find ROOT -printf '%s\\n'`` on the same tree, alternated, page cache warm for both; and the
  real exporter from start until every job shows its committed generation in /metrics.
- idle: the real exporter over the tree, in poll and in inotify mode: CPU seconds per hour and
  RSS while nothing changes, plus the hourly full reconcile, measured as a cold read.
- scrape: /metrics p50/p99 over 200 scrapes of that exporter (inotify mode), per tree.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from checkpoint_exporter.config import ScanConfig
from checkpoint_exporter.sources.listing import OpsBudget, TreeReader
from process import Exporter, percentile, write_config
from tree import Shape, build

SMALL = Shape(jobs=50, generations=20, shards=9)
LARGE = Shape(jobs=50, generations=20, shards=999)


def read_all(root: Path) -> tuple[float, int]:
    """Seconds for a first full read of every job under ``root``, and the files it found."""
    started, files = time.perf_counter(), 0
    for job in sorted(os.listdir(root)):
        tree, _ = TreeReader(root / job, OpsBudget()).read()
        assert tree is not None
        files += tree.totals().files
    return time.perf_counter() - started, files


def _read_all_fresh(root: Path) -> tuple[float, int]:
    """``read_all`` in a new interpreter, as the daemon's first scan runs: not in this process,
    whose heap still holds the million paths it just created."""
    code = (
        "import json, pathlib, sys, scan; "
        "print(json.dumps(scan.read_all(pathlib.Path(sys.argv[1]))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(root)], check=True, capture_output=True, text=True,
        cwd=Path(__file__).resolve().parent,
    ).stdout  # fmt: skip
    seconds, files = json.loads(out)
    return float(seconds), int(files)


def find_seconds(root: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["find", str(root), "-printf", "%s\n"], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def cold(root: Path, shape: Shape, rounds: int = 5) -> dict[str, object]:
    os.sync()  # the tree was just written: no writeback of its inodes during the runs
    find_seconds(root)  # both measured with the tree's metadata in the page cache
    finds, reads = [], []
    for _ in range(rounds):
        finds.append(find_seconds(root))
        seconds, files = _read_all_fresh(root)
        assert files == shape.files, f"read {files} files of {shape.files}"
        reads.append(seconds)
    find, ours = statistics.median(finds), statistics.median(reads)
    return {"files": shape.files, "find_s": find, "exporter_read_s": ours, "ratio": ours / find,
            "us_per_file": ours / shape.files * 1e6}  # fmt: skip


def _jobs(root: Path, shape: Shape) -> dict[str, Path]:
    return {f"job-{i}": root / f"job-{i}" for i in range(shape.jobs)}


def settle(
    exporter: Exporter, quiet: float = 0.02, window: float = 2.0, limit: float = 300
) -> None:
    """Wait until the first validations are done: a ``window`` that costs under ``quiet`` CPU
    seconds (1% of a core for the defaults)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        before = exporter.cpu_seconds()
        time.sleep(window)
        if exporter.cpu_seconds() - before < quiet:
            return
    raise TimeoutError(f"the exporter was still busy after {limit} s")


def idle(
    root: Path, shape: Shape, mode: str, seconds: float, scrapes: int, reconcile_read_s: float
) -> dict[str, object]:
    """The exporter over the tree with nothing changing; ``scrapes`` scrapes at the end."""
    config = write_config(
        root.parent / f"config-{mode}.yaml", _jobs(root, shape), watch=mode, poll_interval="5s"
    )
    started = time.monotonic()
    with Exporter(config) as exporter:
        exporter.scrape()  # the port answers /metrics, the first pass still running
        port = time.monotonic() - started
        exporter.wait_for_jobs(shape.jobs, timeout=900, files=shape.shards + 1)
        first_scan = time.monotonic() - started
        settle(exporter)
        cpu, wall = exporter.cpu_seconds(), time.monotonic()
        time.sleep(seconds)
        cpu, wall = exporter.cpu_seconds() - cpu, time.monotonic() - wall
        rss = exporter.rss_mb()
        latencies, body = [], exporter.scrape()
        for _ in range(scrapes):
            began = time.perf_counter()
            body = exporter.scrape()
            latencies.append(time.perf_counter() - began)
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    per_hour = cpu / wall * 3600
    reconcile_per_hour = reconcile_read_s * 3600 / ScanConfig().reconcile_interval
    return {
        "files": shape.files, "mode": mode, "start_to_port_s": port,
        "first_scan_to_metrics_s": first_scan,
        "idle_seconds": wall, "cpu_s_per_hour": per_hour,
        "reconcile_cpu_s_per_hour": reconcile_per_hour,
        "core_percent": (per_hour + reconcile_per_hour) / 36, "rss_mb": rss,
        "scrape_p50_ms": statistics.median(latencies) * 1000 if latencies else 0.0,
        "scrape_p99_ms": percentile(latencies, 0.99) * 1000, "series": series,
    }  # fmt: skip


def bench_scan(
    shapes: tuple[Shape, ...] = (SMALL, LARGE),
    idle_seconds: float = 60,
    scrapes: int = 200,
    workdir: Path | None = None,
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """(cold rows, idle rows)."""
    base = Path(tempfile.mkdtemp(prefix="checkpoint-exporter-scan-", dir=workdir))
    cold_rows, idle_rows = [], []
    try:
        for shape in shapes:
            root = base / f"tree-{shape.files}" / "ckpt"
            print(f"building {shape.files:,} files ...", file=sys.stderr)
            build(root, shape)
            row = cold(root, shape)
            cold_rows.append(row)
            for mode in ("poll", "inotify"):
                print(f"idle over {shape.files:,} files, {mode} ...", file=sys.stderr)
                idle_rows.append(
                    idle(root, shape, mode, idle_seconds, scrapes if mode == "inotify" else 0,
                         float(row["exporter_read_s"]))
                )  # fmt: skip
            shutil.rmtree(root.parent)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return cold_rows, idle_rows
