"""objects: what s3:// jobs cost in requests, against moto's S3 server on 127.0.0.1.

  listing  one s3:// job whose prefix holds 100,000 objects (100 DCP generations of 999 shards
           and a ``.metadata``): its reader opened as the daemon opens it
           (``sources.stores.open_reader`` with the layouts' marker and content names, the
           default metadata budget), read directly: the cold read (time, requests), the read
           after it (every generation listed again until two listings agree), then idle reads.
  idle     100 s3:// jobs of 3 committed DCP generations each, in one bucket, read by the
           daemon's core loop (``Scanner`` turn by turn, ``InlineWorker``) on an injected clock
           at the default 30 s poll of object URLs, for ``minutes`` of that clock: LIST and
           LIST_UPLOADS requests per minute, and the exporter's CPU per minute.

moto runs in a child process (python bench/objects.py serve), its buckets filled through its
in-process backend before it listens (100,000 PUTs over HTTP would take minutes); every request
the exporter makes goes over HTTP, counted by the store's RequestCounter as in production.
Times include moto's, on the same cores: what a real store takes differs, the request counts do
not.

Targets (issue 27): the cold read of 100,000 keys within about 100 LIST pages plus a few, a
tenth of MAX_REQUESTS_PER_READ; an idle read of sealed generations 2 requests (one LIST, one
LIST_UPLOADS) however many objects; 100 idle jobs at most 100 x 2 requests per 30 s, 400 a
minute, flat over time.

    python bench/objects.py [--generations 100] [--jobs 100] [--minutes 5]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from checkpoint_exporter.config import Config, ScanConfig, parse_config
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.daemon.scanner import Scanner
from checkpoint_exporter.daemon.workers import InlineWorker
from checkpoint_exporter.model import COMMITTED
from checkpoint_exporter.sources import layouts, stores
from checkpoint_exporter.sources.layouts.base import Options
from checkpoint_exporter.sources.listing import OpsBudget
from checkpoint_exporter.sources.object_store import LIST, LIST_UPLOADS, RequestCounter
from checkpoint_exporter.sources.objects import MAX_REQUESTS_PER_READ
from checkpoint_exporter.storage_url import parse_object_url

BIG, FLEET = "big", "fleet"  # the buckets: one job of 100,000 objects; the 100 idle jobs
SHARDS = 999  # per generation, beside its .metadata: 1,000 objects
FLEET_GENERATIONS, FLEET_SHARDS = 3, 4
SHARD = b"s" * 64
POLL_SECONDS = 30.0  # object URLs' default poll_interval
IDLE_READS = 5
# Of the injected clock, after the warm-up: ten polls of every job. The run takes about three
# minutes on 2 cores, most of it moto listing 100,000 keys (it scans them all for each page).
MINUTES = 5


def _generation(bucket: str, backend: object, prefix: str, step: int, shards: int) -> None:
    for rank in range(shards):
        backend.put_object(bucket, f"{prefix}/step-{step}/__{rank}_0.distcp", SHARD)  # type: ignore[attr-defined]
    backend.put_object(bucket, f"{prefix}/step-{step}/.metadata", b"m" * 256)  # type: ignore[attr-defined]


def serve(port: int, generations: int, jobs: int) -> None:
    """The child: fill both buckets through moto's backend, then listen on 127.0.0.1."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.server import ThreadedMotoServer

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    backend.create_bucket(BIG, "us-east-1")
    for step in range(generations):
        _generation(BIG, backend, "run", step * 100, SHARDS)
    backend.create_bucket(FLEET, "us-east-1")
    for job in range(jobs):
        for step in range(FLEET_GENERATIONS):
            _generation(FLEET, backend, f"job-{job}", step * 100, FLEET_SHARDS)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    print("ready", flush=True)
    sys.stdin.read()  # until the parent closes it (or goes)
    server.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def populated_moto(generations: int, jobs: int) -> Iterator[str]:
    """moto filled and listening, in a child process; the AWS environment pointed at it."""
    from tests.helpers.moto_s3 import TEST_ENV  # the tests' fake credentials: moto takes any

    port = _free_port()
    child = subprocess.Popen(
        [sys.executable, __file__, "serve", str(port), str(generations), str(jobs)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, **TEST_ENV},
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    saved = dict(os.environ)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        os.environ.update({**TEST_ENV, "AWS_ENDPOINT_URL": endpoint})
        yield endpoint
    finally:
        os.environ.clear()
        os.environ.update(saved)
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _spent(before: dict[str, int], after: tuple[tuple[str, int], ...]) -> dict[str, int]:
    return {op: n - before.get(op, 0) for op, n in after if n != before.get(op, 0)}


def bench_listing(generations: int) -> dict:
    """One job of ``generations`` x 1,000 objects: its reads, request by request."""
    reader = stores.open_reader(
        parse_object_url(f"s3://{BIG}/run"), {}, OpsBudget(ScanConfig().metadata_ops_per_second),
        RequestCounter(), content_names=layouts.ALL_CONTENT_FILES,
        marker_names=layouts.MARKER_NAMES, max_depth=ScanConfig().max_depth,
    )  # fmt: skip
    reads = []
    for _ in range(2 + IDLE_READS):
        before = dict(reader.counter.totals()[0])
        wall, cpu = time.perf_counter(), time.process_time()
        tree, stats = reader.read()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert tree is not None and not stats.errors, stats.errors
        reads.append({"seconds": wall, "cpu_seconds": cpu,
                      "requests": _spent(before, reader.counter.totals()[0])})  # fmt: skip
    parse = time.perf_counter()
    layout, found = layouts.identify(tree, Options())
    parse = time.perf_counter() - parse
    committed = sum(1 for item in found if item.state == COMMITTED)
    assert (layout, committed) == ("dcp", generations), (layout, committed)
    objects = sum(len(tree.subdirs[name].names) for name in tree.subdirs)
    idle = reads[2:]
    return {
        "objects": objects, "generations": committed, "layout": layout,
        "cold_seconds": reads[0]["seconds"], "cold_cpu_seconds": reads[0]["cpu_seconds"],
        "cold_requests": reads[0]["requests"], "second_requests": reads[1]["requests"],
        "second_seconds": reads[1]["seconds"],
        "idle_requests_per_read": sum(sum(r["requests"].values()) for r in idle) / len(idle),
        "idle_ms_per_read": 1000 * sum(r["seconds"] for r in idle) / len(idle),
        "layout_parse_seconds": parse, "max_requests_per_read": MAX_REQUESTS_PER_READ,
    }  # fmt: skip


def _fleet_requests(tracker: Tracker) -> Counter[str]:
    total: Counter[str] = Counter()
    for _, usage in tracker.snapshot.daemon.object_stores:
        total.update(dict(usage.requests))
    return total


def bench_fleet(jobs: int, minutes: float, workdir: Path) -> dict:
    """``jobs`` idle s3:// jobs in the daemon's loop, one turn per second of an injected clock."""
    names = [f"job-{i}" for i in range(jobs)]
    lines = [f"  - {{name: {n}, path: 's3://{FLEET}/{n}', layout: dcp}}" for n in names]
    config = parse_config("jobs:\n" + "\n".join(lines) + "\n", base_dir=workdir)
    spool = workdir / "spool"
    spool.mkdir(mode=0o1733)
    spool.chmod(0o1733)  # as deployed: writable by training jobs, so the daemon does not warn
    config = Config(**{**config.__dict__, "spool": spool})
    tracker = Tracker(config)
    clock = {"wall": time.time(), "mono": 1000.0}
    scanner = Scanner(
        config, tracker, watcher_factory=None, clock=lambda: clock["wall"],
        monotonic=lambda: clock["mono"], worker_factory=InlineWorker,
    )  # fmt: skip

    def run(seconds: float) -> None:
        for _ in range(int(seconds)):
            scanner.turn()
            clock["wall"] += 1
            clock["mono"] += 1

    # Warm up: each job's first read, and the next polls that seal its generations.
    run(4 * POLL_SECONDS)
    committed = [
        sum(1 for g in state.generations if g.state == COMMITTED) for state in tracker.snapshot.jobs
    ]
    assert committed == [FLEET_GENERATIONS] * jobs, committed
    before, cpu, wall = _fleet_requests(tracker), time.process_time(), time.perf_counter()
    per_minute = []
    for _ in range(int(minutes)):
        start = _fleet_requests(tracker)
        run(60)
        per_minute.append(sum((_fleet_requests(tracker) - start).values()))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    spent = _fleet_requests(tracker) - before
    return {
        "jobs": jobs, "generations_per_job": FLEET_GENERATIONS, "minutes": minutes,
        "poll_interval_s": POLL_SECONDS, "requests": dict(spent),
        "list_per_minute": spent[LIST] / minutes,
        "list_uploads_per_minute": spent[LIST_UPLOADS] / minutes,
        "requests_per_minute": sum(spent.values()) / minutes,
        "min_per_minute": min(per_minute), "max_per_minute": max(per_minute),
        "expected_per_minute": jobs * 2 * 60 / POLL_SECONDS,
        "cpu_seconds_per_minute": cpu / minutes, "core_percent": cpu / (minutes * 60) * 100,
        "wall_seconds": wall,
    }  # fmt: skip


def bench_objects(generations: int = 100, jobs: int = 100, minutes: float = MINUTES) -> dict:
    with populated_moto(generations, jobs), tempfile.TemporaryDirectory() as tmp:
        return {
            "listing": bench_listing(generations),
            "idle": bench_fleet(jobs, minutes, Path(tmp)),
        }


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        port, generations, jobs = map(int, sys.argv[2:5])
        serve(port, generations, jobs)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--generations", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=MINUTES)
    args = parser.parse_args()
    print(json.dumps(bench_objects(args.generations, args.jobs, args.minutes), indent=2))


if __name__ == "__main__":
    sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]
    main()
