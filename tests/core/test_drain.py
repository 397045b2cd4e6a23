"""Draining from a fast staging tier to durable storage: the matching rule, and a real two-tier
copy at a throttled rate watched by a running exporter."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from checkpoint_exporter.core.drain import drain_state
from checkpoint_exporter.model import COMMITTED, DURABLE, STAGING, WRITING, Generation
from tests.conftest import Exporter, sample, wait_for, write_config
from tests.helpers.trees import dcp_generation


def gen(gen_id: str, tier: str, state: str, size: int, commit: float | None = None) -> Generation:
    return Generation(gen_id, tier, None, state, 0.0, 0.0, commit, size, 1)


def test_the_matching_rule() -> None:
    staging = [
        gen("s1", STAGING, COMMITTED, 100, commit=10),
        gen("s2", STAGING, COMMITTED, 100, commit=20),
        gen("s3", STAGING, COMMITTED, 100, commit=30),
        gen("s4", STAGING, WRITING, 50),
    ]
    durable = [
        gen("s1", DURABLE, COMMITTED, 100),  # drained
        gen("s2", DURABLE, COMMITTED, 60),  # committed, but short: not drained
        gen("s3", DURABLE, WRITING, 100),  # still copying
    ]
    state = drain_state(staging, durable)
    assert (state.backlog_generations, state.backlog_bytes) == (2, 200)
    assert state.oldest_undrained_commit == 20 and state.drained == {"s1": 100}
    assert drain_state([], durable).oldest_undrained_commit == 0.0


@pytest.mark.slow
def test_a_real_two_tier_copy(tmp_path: Path) -> None:
    staging, durable, scratch = tmp_path / "nvme", tmp_path / "filer", tmp_path / "scratch"
    for directory in (staging, durable, scratch):
        directory.mkdir()
    config = write_config(
        tmp_path, f"jobs: [{{name: j, path: {durable}, staging: {staging}, layout: dcp}}]\n"
    )
    exporter = Exporter("--config.file", str(config))
    copied: list[int] = []
    backlog_seen: list[tuple[float, float]] = []
    stop = threading.Event()

    def value(name: str) -> float | None:
        return sample(exporter.get("/metrics").text, name, training_job="j")

    def copier(steps: list[int], bytes_per_second: float) -> None:
        """Drain each generation: shards first, then .metadata (its commit), at a capped rate."""
        for step in steps:
            source = staging / f"step-{step}"
            wait_for(lambda s=source: (s / ".metadata").exists(), timeout=30)
            target = durable / f"step-{step}"
            target.mkdir()
            files = sorted(source.iterdir(), key=lambda p: p.name == ".metadata")
            for file in files:
                shutil.copyfile(file, target / file.name)
                copied.append(file.stat().st_size)
                time.sleep(file.stat().st_size / bytes_per_second)

    def watch_backlog() -> None:
        while not stop.is_set():
            backlog_seen.append(
                (value("checkpoint_drain_backlog_generations") or 0,
                 value("checkpoint_drain_backlog_bytes") or 0)
            )  # fmt: skip
            time.sleep(0.05)

    try:
        watcher = threading.Thread(target=watch_backlog)
        watcher.start()
        drain = threading.Thread(target=copier, args=([1, 2, 3], 8e6))
        drain.start()
        for step in (1, 2, 3):  # the job saves faster than the drain copies
            dcp_generation(scratch / f"step-{step}", shards=8, shard_bytes=512 * 1024)
            os.rename(scratch / f"step-{step}", staging / f"step-{step}")
            time.sleep(0.2)
        drain.join(timeout=60)
        wait_for(lambda: value("checkpoint_drain_backlog_generations") == 0, timeout=10)
        stop.set()
        watcher.join()
        assert max(gens for gens, _ in backlog_seen) >= 2  # it rose ...
        assert max(size for _, size in backlog_seen) >= 2 * 8 * 512 * 1024
        assert value("checkpoint_drain_backlog_bytes") == 0  # ... and fell to nothing
        assert value("checkpoint_oldest_undrained_commit_timestamp_seconds") == 0
        wait_for(lambda: value("checkpoint_drained_bytes_total") == sum(copied), timeout=10)
        assert value("checkpoint_staged_bytes_total") == sum(copied)
        assert value("checkpoint_saves_committed_total") == 3
        assert value("checkpoint_drain_lost_generations_total") == 0

        # A staged generation deleted before its durable copy committed is lost.
        dcp_generation(scratch / "step-9")
        os.rename(scratch / "step-9", staging / "step-9")
        wait_for(lambda: value("checkpoint_drain_backlog_generations") == 1, timeout=10)
        shutil.rmtree(staging / "step-9")
        wait_for(lambda: value("checkpoint_drain_lost_generations_total") == 1, timeout=10)
        assert value("checkpoint_drain_backlog_generations") == 0
    finally:
        stop.set()
        exporter.close()
