"""idle: what an idle job costs -- exporter CPU at 10 and at 1,000 idle jobs, inotify and poll.

Each job holds one committed DCP generation of 9 shards (bench/tree.py), and the spool directory
is present, as in every deployment, with no events in it. The real exporter
starts over them (the port opens before any job is read: ``start_to_port_s``), every job shows
its generation in /metrics and the first validations finish (``scan.settle``); then nothing
changes for ``seconds`` and the exporter's CPU is measured. The window is three minutes: a
minute's either caught one of the garbage collector's full collections or not, which moved a
single result by more than what separates 10 jobs from 1,000.

Target (issue 15): CPU at 1,000 idle jobs within 1.5x of CPU at 10 idle jobs, and under 0.5 % of
a core, in both watch modes. An idle inotify job costs nothing between events; a polled job is
read every ``poll_interval`` by design (inotify cannot see other nodes' writes), so poll mode
runs at ``POLL_INTERVAL``, stated in the results (docs/performance.md).

    python bench/idle.py [--seconds 180] [--jobs 10 1000] [--poll-interval 60s]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from process import Exporter, write_config
from scan import settle
from tree import Shape, build

POLL_INTERVAL = "60s"
JOB_COUNTS = (10, 1000)
IDLE_SECONDS = 180.0


def idle_row(root: Path, jobs: int, mode: str, seconds: float, poll_interval: str) -> dict:
    paths = {f"job-{i}": root / f"job-{i}" for i in range(jobs)}
    config = write_config(
        root.parent / f"config-{jobs}-{mode}.yaml", paths, watch=mode, poll_interval=poll_interval
    )
    started = time.monotonic()
    with Exporter(config) as exporter:
        port_s = time.monotonic() - started  # it logged its URL: the port is open
        exporter.wait_for_jobs(jobs, timeout=600)
        ready_s = time.monotonic() - started
        settle(exporter)
        cpu, wall = exporter.cpu_seconds(), time.monotonic()
        time.sleep(seconds)
        cpu, wall = exporter.cpu_seconds() - cpu, time.monotonic() - wall
        rss = exporter.rss_mb()
    return {
        "jobs": jobs, "mode": mode, "poll_interval": poll_interval if mode == "poll" else None,
        "start_to_port_s": port_s, "start_to_all_jobs_s": ready_s, "idle_seconds": wall,
        "cpu_s_per_hour": cpu / wall * 3600, "core_percent": cpu / wall * 100, "rss_mb": rss,
    }  # fmt: skip


def bench_idle(
    counts: tuple[int, ...] = JOB_COUNTS,
    seconds: float = IDLE_SECONDS,
    poll_interval: str = POLL_INTERVAL,
    workdir: Path | None = None,
) -> list[dict]:
    base = Path(tempfile.mkdtemp(prefix="checkpoint-exporter-idle-", dir=workdir))
    rows = []
    try:
        root = base / "ckpt"
        build(root, Shape(jobs=max(counts), generations=1, shards=9), progress=False)
        # The spool directory every deployment has (the config names base/spool), with no job
        # writing events: an idle job must cost nothing there either.
        (base / "spool").mkdir()
        for mode in ("inotify", "poll"):
            for jobs in counts:
                print(f"idle: {jobs} jobs, {mode} ...", file=sys.stderr)
                rows.append(idle_row(root, jobs, mode, seconds, poll_interval))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for mode in ("inotify", "poll"):
        mine = [r for r in rows if r["mode"] == mode]
        few, many = min(mine, key=lambda r: r["jobs"]), max(mine, key=lambda r: r["jobs"])
        many["ratio_to_fewest"] = many["cpu_s_per_hour"] / max(few["cpu_s_per_hour"], 1e-9)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=IDLE_SECONDS)
    parser.add_argument("--jobs", type=int, nargs="+", default=list(JOB_COUNTS))
    parser.add_argument("--poll-interval", default=POLL_INTERVAL)
    args = parser.parse_args()
    rows = bench_idle(tuple(args.jobs), args.seconds, args.poll_interval)
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
