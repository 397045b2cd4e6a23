"""detect: from a commit marker written to the commit visible in /metrics.

A job saves COMMITS times: the generation's files, a random pause (so commits do not line up
with the poll period), then its commit marker. ``dcp``: ``.metadata`` by rename, as DCP commits.
``pointer``: DeepSpeed's ``latest`` rewritten in place (``open(path, "w")``), which changes no
directory's mtime, as DeepSpeed and Megatron-LM commit. The clock starts after the marker is
written and stops when a scrape shows the new step as the last committed one. The scraper polls
/metrics every 2 ms; the incremental renderer makes each scrape cost well under 1 ms.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import statistics
import tempfile
import time
import zipfile
from pathlib import Path

from checkpoint_exporter.demo.cluster import dcp_metadata
from process import Exporter, percentile, write_config
from tree import SHARD_BYTES, shard_names, write_generation

SHARDS = 4
_STEP = re.compile(rb'^checkpoint_last_committed_step\{[^}]*training_job="j"[^}]*\} (\S+)$', re.M)


def _committed_step(exporter: Exporter) -> float | None:
    match = _STEP.search(exporter.scrape())
    return float(match.group(1)) if match else None


def _write_tag(directory: Path) -> None:
    """A DeepSpeed tag: its model states, a zip as torch.save writes."""
    directory.mkdir()
    with zipfile.ZipFile(directory / "mp_rank_00_model_states.pt", "w") as archive:
        archive.writestr("archive/data.pkl", b"\0" * SHARD_BYTES)


def _point_at(job: Path, step: int) -> None:
    with open(job / "latest", "w") as pointer:  # in place, as DeepSpeed writes it
        pointer.write(f"global_step{step}")


def bench_detect(
    mode: str, commits: int = 100, poll_interval: float = 1.0, writer: str = "dcp"
) -> dict[str, object]:
    base = Path(tempfile.mkdtemp(prefix="checkpoint-exporter-detect-"))
    metadata = dcp_metadata(dict.fromkeys(shard_names(SHARDS), SHARD_BYTES))
    job = base / "ckpt"
    job.mkdir()
    prefix = "global_step" if writer == "pointer" else "step-"
    if writer == "pointer":
        _write_tag(job / "global_step0")
        _point_at(job, 0)
    else:
        write_generation(job / "step-0", SHARDS, metadata)
    config = write_config(
        base / "config.yaml",
        {"j": job},
        watch=mode,
        poll_interval=f"{poll_interval:g}s",
        layout="deepspeed" if writer == "pointer" else "dcp",
    )
    latencies: list[float] = []
    rng = random.Random(8)
    try:
        with Exporter(config) as exporter:
            while _committed_step(exporter) != 0:
                time.sleep(0.05)
            for step in range(1, commits + 1):
                generation = job / f"{prefix}{step}"
                if writer == "pointer":
                    _write_tag(generation)
                else:
                    generation.mkdir()
                    for name in shard_names(SHARDS):
                        (generation / name).write_bytes(b"\0" * SHARD_BYTES)
                time.sleep(rng.uniform(0.0, poll_interval if mode == "poll" else 0.2))
                if writer == "pointer":
                    time.sleep(0.02)  # the tag's files strictly older than the pointer
                    _point_at(job, step)
                else:
                    (generation / ".metadata.tmp").write_bytes(metadata)
                    os.rename(generation / ".metadata.tmp", generation / ".metadata")
                committed = time.monotonic()
                deadline = committed + poll_interval + 30
                while _committed_step(exporter) != step:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"step {step} not visible after {deadline - committed} s"
                        )
                    time.sleep(0.002)
                latencies.append(time.monotonic() - committed)
                shutil.rmtree(job / f"{prefix}{step - 3}", ignore_errors=True)  # retention
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {
        "mode": mode, "writer": writer,
        "poll_interval_s": poll_interval if mode == "poll" else None,
        "commits": len(latencies), "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000, "max_ms": max(latencies) * 1000,
        "target_p99_ms": (poll_interval + 1) * 1000 if mode == "poll" else 1000,
    }  # fmt: skip
