"""Watches that heal, end to end: a job root removed and recreated is watched again at once,
and a failed inotify reader hands its jobs to polling and says so."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from tests.conftest import wait_for, write_config
from tests.helpers.trees import dcp_generation

# Runs the exporter in-process after starting a thread that, once the file named by its first
# argument appears, puts a directory where the process's inotify descriptor was: the reader's
# next read() fails as the kernel fails it (EISDIR), with no fake in the exporter.
BREAK_INOTIFY = """
import os, runpy, sys, threading, time

trigger = sys.argv[1]


def break_inotify():
    while not os.path.exists(trigger):
        time.sleep(0.02)
    directory = os.open(os.path.dirname(trigger), os.O_RDONLY | os.O_DIRECTORY)
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:inotify":
                os.dup2(directory, int(name))
        except OSError:
            continue
    open(trigger + ".done", "w").close()


threading.Thread(target=break_inotify, daemon=True).start()
sys.argv = ["checkpoint-exporter", *sys.argv[5:]]  # after: python -m checkpoint_exporter
runpy.run_module("checkpoint_exporter", run_name="__main__", alter_sys=True)
"""


def _publish(job: Path, step: int) -> None:
    """A DCP generation committed the way a writer's rename commits it."""
    staging = job.parent / "staging" / f"step-{step}"
    dcp_generation(staging)
    os.rename(staging, job / f"step-{step}")


def test_a_recreated_job_root_is_watched_again(tmp_path: Path, exporter) -> None:
    job, other = tmp_path / "job", tmp_path / "other"
    job.mkdir()
    other.mkdir()
    # The reconcile (and a poll) far away: only the healed watch can see the new generations.
    config = write_config(tmp_path, f"""
scan: {{reconcile_interval: 1h}}
jobs:
  - {{name: j, path: {job}, watch: inotify, poll_interval: 1h}}
  - {{name: other, path: {other}, watch: inotify, poll_interval: 1h}}
""")  # fmt: skip
    served = exporter("--config.file", str(config))
    _publish(job, 1)
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="j") == 1, 5)
    shutil.rmtree(job)
    job.mkdir()
    _publish(job, 2)  # may land before the watch is back: the healed root is re-read in full
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="j") == 2, 5)
    _publish(job, 3)  # and what follows raises events again
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="j") == 3, 5)
    assert served.value("checkpoint_exporter_watch_info", training_job="j", mode="inotify") == 1
    _publish(other, 1)
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="other") == 1, 5)


def test_a_failed_inotify_reader_falls_back_to_polling(tmp_path: Path, exporter) -> None:
    jobs = [tmp_path / "a", tmp_path / "b"]
    for job in jobs:
        job.mkdir()
    config = write_config(tmp_path, f"""
scan: {{reconcile_interval: 1h}}
jobs:
  - {{name: a, path: {jobs[0]}, watch: inotify, poll_interval: 1s}}
  - {{name: b, path: {jobs[1]}, watch: inotify, poll_interval: 1s}}
""")  # fmt: skip
    trigger = tmp_path / "break-inotify"
    served = exporter(
        "--config.file", str(config), prefix=[sys.executable, "-c", BREAK_INOTIFY, str(trigger)]
    )
    for name in ("a", "b"):  # the port opens first; the jobs are watched behind it
        wait_for(
            lambda name=name: (
                served.value("checkpoint_exporter_watch_info", training_job=name, mode="inotify")
                == 1
            )
        )
    trigger.touch()
    wait_for(Path(f"{trigger}.done").exists)
    (jobs[0] / "wake").touch()  # an event on the old instance wakes the reader into read()
    for name in ("a", "b"):
        wait_for(
            lambda name=name: (
                served.value("checkpoint_exporter_watch_info", training_job=name, mode="poll") == 1
            )
        )
    assert "inotify reader failed" in "".join(served.drain_log())
    for job in jobs:
        _publish(job, 7)
    for name in ("a", "b"):
        wait_for(
            lambda name=name: (
                served.value("checkpoint_last_committed_step", training_job=name) == 7
            ),
            5,
        )
