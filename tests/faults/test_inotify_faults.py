"""inotify under pressure: the kernel queue overflowing, and the watch and instance limits."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.conftest import require_tool, sample, wait_for, write_config
from tests.helpers.trees import dcp_generation, dcp_metadata_bytes

pytestmark = [pytest.mark.netns]


def _limited(watches: int) -> list[str]:
    """A command prefix: a user namespace whose inotify watch limit is ``watches`` (a
    per-namespace limit, so nothing outside the test is affected)."""
    return [
        require_tool("unshare"), "--user", "--map-root-user", "sh", "-c",
        f'echo {watches} > /proc/sys/user/max_inotify_watches && exec "$@"', "limited",
    ]  # fmt: skip


def test_inotify_overflow_is_counted_and_reconciled(tmp_path: Path, exporter) -> None:
    """A real kernel queue overflow: the queue limit is lowered while the exporter starts."""
    limit = Path("/proc/sys/fs/inotify/max_queued_events")
    job = tmp_path / "job"
    job.mkdir()
    config = write_config(tmp_path, f"jobs: [{{name: j, path: {job}, watch: inotify}}]\n")
    saved = limit.read_text()
    try:
        limit.write_text("64\n")  # read by the kernel when the exporter creates its instance
        served = exporter("--config.file", str(config))
    finally:
        limit.write_text(saved)
    generation = job / "step-1"
    generation.mkdir()
    (generation / "__0_0.distcp").write_bytes(b"")
    wait_for(lambda: served.value("checkpoint_saves_in_progress", training_job="j") == 1, 10)
    # Stopped, the exporter cannot drain its queue: the 64-event queue must overflow however
    # fast its reader would otherwise have been.
    os.kill(served.process.pid, signal.SIGSTOP)
    try:
        for index in range(1, 2000):
            (generation / f"__{index}_0.distcp").write_bytes(b"")
    finally:
        os.kill(served.process.pid, signal.SIGCONT)
    wait_for(lambda: (served.value("checkpoint_exporter_watch_overflows_total") or 0) >= 1, 10)
    # The reconcile that follows sees every file, though most events were dropped.
    wait_for(lambda: served.value("checkpoint_saves_in_progress", training_job="j") == 1, 10)
    (generation / ".metadata").write_bytes(dcp_metadata_bytes(2000, 0))
    wait_for(lambda: served.value("checkpoint_last_committed_files", training_job="j") == 2001, 10)
    wait_for(lambda: served.value("checkpoint_last_committed_valid", training_job="j") == 1, 10)


def _publish(job: Path, step: int) -> None:
    dcp_generation(job.parent / "staging" / f"step-{step}")
    os.rename(job.parent / "staging" / f"step-{step}", job / f"step-{step}")


def test_watch_limit_at_start_falls_back_to_polling(tmp_path: Path, exporter) -> None:
    job = tmp_path / "job"
    for step in range(1, 21):
        dcp_generation(job / f"step-{step}")  # 21 directories to watch, 10 allowed
    config = write_config(
        tmp_path, f"jobs: [{{name: j, path: {job}, watch: inotify, poll_interval: 1s}}]\n"
    )
    served = exporter("--config.file", str(config), prefix=_limited(10))
    text = served.metrics()
    assert sample(text, "checkpoint_exporter_watch_info", training_job="j", mode="poll") == 1
    assert sample(text, "checkpoint_exporter_watch_info", training_job="j", mode="inotify") is None
    assert "inotify watch limit reached" in "".join(served.drain_log())
    _publish(job, 21)
    # Found by a poll (no watch event): at its poll_interval is test_loop.py's, on a fake clock.
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="j") == 21, 10)


def test_watch_limit_reached_mid_run_falls_back_to_polling(tmp_path: Path, exporter) -> None:
    """The tree outgrows the limit while watched: the job is polled from then on instead of
    silently missing what happens in the directories that could not be watched."""
    job = tmp_path / "job"
    job.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    config = write_config(tmp_path, f"""
jobs:
  - {{name: j, path: {job}, watch: inotify, poll_interval: 1s}}
  - {{name: other, path: {other}, watch: inotify}}
""")  # fmt: skip
    served = exporter("--config.file", str(config), prefix=_limited(10))
    assert served.value("checkpoint_exporter_watch_info", training_job="j", mode="inotify") == 1
    for step in range(1, 13):
        _publish(job, step)
    wait_for(
        lambda: served.value("checkpoint_exporter_watch_info", training_job="j", mode="poll") == 1
    )
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="j") == 12, 5)
    # A shard deleted from the newest generation, whose directory was never watched, is seen
    # (once still for the settle period: a generation losing files may be retention at work).
    (job / "step-12" / "__1_0.distcp").unlink()
    wait_for(lambda: served.value("checkpoint_last_committed_valid", training_job="j") == 0, 15)
    # The other job keeps its inotify watch: the one that hit the limit gave its watches back.
    assert served.value("checkpoint_exporter_watch_info", training_job="other", mode="inotify") == 1
    _publish(other, 1)
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="other") == 1, 2)
