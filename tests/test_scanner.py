"""The scanner against a hostile, changing world: a real exporter process over real trees.

Discovery limits, polling chosen from the mount table, inotify overflow, permission-denied
subtrees, symlinks out of the root, retention racing the scan, and a 20,000-shard generation.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import Exporter, as_nobody, sample, wait_for, write_config
from tests.helpers.trees import dcp_generation, dcp_metadata_bytes


def metrics(exporter: Exporter) -> str:
    return exporter.get("/metrics").text


def value(exporter: Exporter, name: str, **labels: str) -> float | None:
    return sample(metrics(exporter), name, **labels)


@pytest.fixture
def exporters():
    started: list[Exporter] = []

    def start(*args: str, prefix: list[str] | None = None) -> Exporter:
        instance = Exporter(*args, prefix=prefix)
        started.append(instance)
        return instance

    yield start
    for instance in started:
        instance.close()


def test_discover_roots_limit_and_forget(tmp_path: Path, exporters) -> None:
    root = tmp_path / "ckpt"
    for name in ("a", "b", "c", "d"):
        dcp_generation(root / name / "step-1")
    (root / "not a job name!").mkdir()
    config = write_config(
        tmp_path,
        f"discover: [{{root: {root}, max_jobs: 3, forget_after: 2s, poll_interval: 1s}}]\n",
    )
    exporter = exporters("--config.file", str(config))
    text = metrics(exporter)
    for name in ("a", "b", "c"):
        assert sample(text, "checkpoint_last_committed_step", training_job=name) == 1
    assert sample(text, "checkpoint_job_info", training_job="d") is None
    assert sample(text, "checkpoint_exporter_discover_excess_jobs", root=str(root)) == 1
    assert "over max_jobs=3" in "".join(exporter.drain_log())
    shutil.rmtree(root / "c")
    wait_for(lambda: value(exporter, "checkpoint_job_info", training_job="d", tier="durable"), 10)
    text = metrics(exporter)
    assert sample(text, "checkpoint_job_info", training_job="c", tier="durable") is None
    assert sample(text, "checkpoint_exporter_discover_excess_jobs", root=str(root)) == 0


def test_network_filesystems_are_polled(tmp_path: Path, exporters) -> None:
    job = tmp_path / "nfs" / "job"
    job.mkdir(parents=True)
    procfs = tmp_path / "proc"
    (procfs / "self").mkdir(parents=True)
    (procfs / "self" / "mountinfo").write_text(
        "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw\n"
        f"97 22 0:53 / {tmp_path / 'nfs'} rw,relatime shared:60 - nfs4 filer:/ckpt rw,vers=4.2\n"
    )
    config = write_config(tmp_path, f"jobs: [{{name: j, path: {job}, poll_interval: 1s}}]\n")
    exporter = exporters("--config.file", str(config), "--path.procfs", str(procfs))
    assert value(exporter, "checkpoint_exporter_watch_info", training_job="j", mode="poll") == 1
    dcp_generation(tmp_path / "staging" / "step-5")
    os.rename(tmp_path / "staging" / "step-5", job / "step-5")
    started = time.monotonic()
    wait_for(lambda: value(exporter, "checkpoint_last_committed_step", training_job="j") == 5, 5)
    assert time.monotonic() - started < 1 + 1.5  # poll interval + a scan


def test_inotify_overflow_is_counted_and_reconciled(tmp_path: Path, exporters) -> None:
    """A real kernel queue overflow: the queue limit is lowered while the exporter starts."""
    limit = Path("/proc/sys/fs/inotify/max_queued_events")
    job = tmp_path / "job"
    job.mkdir()
    config = write_config(tmp_path, f"jobs: [{{name: j, path: {job}, watch: inotify}}]\n")
    saved = limit.read_text()
    try:
        limit.write_text("64\n")  # read by the kernel when the exporter creates its instance
        exporter = exporters("--config.file", str(config))
    finally:
        limit.write_text(saved)
    generation = job / "step-1"
    generation.mkdir()
    for index in range(2000):
        (generation / f"__{index}_0.distcp").write_bytes(b"")
    wait_for(lambda: (value(exporter, "checkpoint_exporter_watch_overflows_total") or 0) >= 1, 10)
    # The reconcile that follows sees every file, though most events were dropped.
    wait_for(lambda: value(exporter, "checkpoint_saves_in_progress", training_job="j") == 1, 10)
    (generation / ".metadata").write_bytes(dcp_metadata_bytes(2000, 0))
    wait_for(
        lambda: value(exporter, "checkpoint_last_committed_files", training_job="j") == 2001, 10
    )
    wait_for(lambda: value(exporter, "checkpoint_last_committed_valid", training_job="j") == 1, 10)


def test_unreadable_subtrees_and_outward_symlinks(exporters) -> None:
    """Run as an unprivileged user against a tree with a root-only generation and symlinks
    that point out of the job's root: nothing is followed, the rest is reported."""
    base = Path(tempfile.mkdtemp(prefix="ckpt-hostile-"))
    try:
        os.chmod(base, 0o755)
        job = base / "job"
        dcp_generation(job / "step-1")
        dcp_generation(job / "step-2")
        os.chmod(job / "step-2", 0o700)  # root's; the exporter runs as nobody
        (job / "step-3").symlink_to("/etc")
        (job / "step-1" / "passwd").symlink_to("/etc/passwd")
        (job / "escape").symlink_to("/")
        subprocess.run(["chmod", "-R", "go+rX", str(job / "step-1")], check=True)
        os.chmod(job, 0o755)
        config = write_config(base, f"jobs: [{{name: j, path: {job}, layout: dcp}}]\n")
        os.chmod(config, 0o644)
        exporter = exporters("--config.file", str(config), prefix=as_nobody())
        text = metrics(exporter)
        assert sample(text, "checkpoint_last_committed_step", training_job="j") == 1
        assert sample(text, "checkpoint_last_committed_size_bytes", training_job="j") == (
            (job / "step-1" / ".metadata").stat().st_size + 32
        )  # the symlink to /etc/passwd is neither followed nor counted
        assert sample(text, "checkpoint_exporter_scan_errors_total") >= 1
        assert "permission denied" in "".join(exporter.drain_log())
        assert exporter.process.poll() is None
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=True)


def test_retention_racing_the_scanner(tmp_path: Path, exporters) -> None:
    job = tmp_path / "job"
    job.mkdir()
    staging = tmp_path / "staging"
    config = write_config(tmp_path, f"jobs: [{{name: j, path: {job}, layout: dcp}}]\n")
    exporter = exporters("--config.file", str(config))
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            metrics(exporter)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for step in range(1, 61):
            dcp_generation(staging / f"step-{step}", shards=20)
            os.rename(staging / f"step-{step}", job / f"step-{step}")
            if step > 3:
                shutil.rmtree(job / f"step-{step - 3}")  # keep_latest_k=3, racing the scans
    finally:
        stop.set()
        scraper.join()
    wait_for(lambda: value(exporter, "checkpoint_last_committed_step", training_job="j") == 60, 10)
    wait_for(lambda: value(exporter, "checkpoint_retained_generations", training_job="j") == 3, 10)
    wait_for(lambda: value(exporter, "checkpoint_last_committed_valid", training_job="j") == 1, 10)
    assert value(exporter, "checkpoint_saves_aborted_total", training_job="j") == 0
    assert exporter.process.poll() is None


def test_a_generation_of_twenty_thousand_shards(tmp_path: Path, exporters) -> None:
    job = tmp_path / "job"
    job.mkdir()
    config = write_config(tmp_path, f"jobs: [{{name: j, path: {job}, layout: dcp}}]\n")
    exporter = exporters("--config.file", str(config))
    dcp_generation(tmp_path / "staging" / "step-7", shards=20_000, shard_bytes=8)
    os.rename(tmp_path / "staging" / "step-7", job / "step-7")
    wait_for(lambda: value(exporter, "checkpoint_last_committed_valid", training_job="j") == 1, 60)
    text = metrics(exporter)
    assert sample(text, "checkpoint_last_committed_files", training_job="j") == 20_001
    assert sample(text, "checkpoint_last_committed_size_bytes", training_job="j") == (
        20_000 * 8 + (job / "step-7" / ".metadata").stat().st_size
    )
