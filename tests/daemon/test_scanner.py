"""The scanner as a real exporter process over real trees: discovery limits, polling chosen
from the mount table, and a 20,000-shard generation. Faults are in tests/faults/."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from tests.conftest import sample, wait_for, write_config
from tests.helpers.trees import dcp_generation


def test_discover_roots_limit_and_forget(tmp_path: Path, exporter) -> None:
    root = tmp_path / "ckpt"
    for name in ("a", "b", "c", "d"):
        dcp_generation(root / name / "step-1")
    os.utime(root / "d", (time.time() - 3600, time.time() - 3600))  # the newest are watched
    (root / "not a job name!").mkdir()
    config = write_config(
        tmp_path,
        f"discover: [{{root: {root}, max_jobs: 3, forget_after: 2s, poll_interval: 1s}}]\n",
    )
    served = exporter("--config.file", str(config))
    text = served.metrics()
    for name in ("a", "b", "c"):
        assert sample(text, "checkpoint_last_committed_step", training_job=name) == 1
    assert sample(text, "checkpoint_job_info", training_job="d") is None
    assert sample(text, "checkpoint_exporter_discover_excess_jobs", root=str(root)) == 1
    assert "over max_jobs=3" in "".join(served.drain_log())
    shutil.rmtree(root / "c")
    wait_for(lambda: served.value("checkpoint_job_info", training_job="d", tier="durable"), 10)
    text = served.metrics()
    assert sample(text, "checkpoint_job_info", training_job="c", tier="durable") is None
    assert sample(text, "checkpoint_exporter_discover_excess_jobs", root=str(root)) == 0


def test_network_filesystems_are_polled(tmp_path: Path, exporter) -> None:
    job = tmp_path / "nfs" / "job"
    job.mkdir(parents=True)
    procfs = tmp_path / "proc"
    (procfs / "self").mkdir(parents=True)
    (procfs / "self" / "mountinfo").write_text(
        "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw\n"
        f"97 22 0:53 / {tmp_path / 'nfs'} rw,relatime shared:60 - nfs4 filer:/ckpt rw,vers=4.2\n"
    )
    config = write_config(tmp_path, f"jobs: [{{name: j, path: {job}, poll_interval: 1s}}]\n")
    served = exporter("--config.file", str(config), "--path.procfs", str(procfs))
    assert served.value("checkpoint_exporter_watch_info", training_job="j", mode="poll") == 1
    dcp_generation(tmp_path / "staging" / "step-5")
    os.rename(tmp_path / "staging" / "step-5", job / "step-5")
    # Found by a poll (no watch event): at its poll_interval is test_loop.py's, on a fake clock.
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="j") == 5, 10)


def test_a_generation_of_twenty_thousand_shards(tmp_path: Path, exporter) -> None:
    job = tmp_path / "job"
    job.mkdir()
    config = write_config(tmp_path, f"jobs: [{{name: j, path: {job}, layout: dcp}}]\n")
    served = exporter("--config.file", str(config))
    dcp_generation(tmp_path / "staging" / "step-7", shards=20_000, shard_bytes=8)
    os.rename(tmp_path / "staging" / "step-7", job / "step-7")
    wait_for(lambda: served.value("checkpoint_last_committed_valid", training_job="j") == 1, 60)
    text = served.metrics()
    assert sample(text, "checkpoint_last_committed_files", training_job="j") == 20_001
    assert sample(text, "checkpoint_last_committed_size_bytes", training_job="j") == (
        20_000 * 8 + (job / "step-7" / ".metadata").stat().st_size
    )
