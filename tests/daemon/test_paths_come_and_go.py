"""Paths that come and go, with a real exporter: jobs are configured before they make their
directories and removed after, discover roots fill with finished runs and tenants' empty
directories, and a spool may not exist or not be writable. None of it stops the exporter, a
reload, or the watching of what appears later ([pager] item 5)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import sample, wait_for, write_config
from tests.helpers.trees import dcp_generation

DAY = 86400.0


def age(path: Path, seconds: float) -> None:
    """Date a tree ``seconds`` back, its files and its directories (deepest first)."""
    when = time.time() - seconds
    for directory, _, files in sorted(os.walk(path), key=lambda w: -w[0].count("/")):
        for name in files:
            os.utime(Path(directory) / name, (when, when))
        os.utime(directory, (when, when))


@pytest.mark.parametrize("watch", ["inotify", "poll"])
def test_a_job_whose_directory_does_not_exist_yet_is_watched_once_it_appears(
    tmp_path: Path, exporter, watch: str
) -> None:
    job = tmp_path / "ckpt" / "llama"
    config = write_config(
        tmp_path, f"jobs: [{{name: llama, path: {job}, watch: {watch}, poll_interval: 1s}}]\n"
    )
    served = exporter("--config.file", str(config))  # started: exit 2 before
    assert any("does not exist yet" in line for line in served.drain_log())
    text = served.metrics()
    assert sample(text, "checkpoint_exporter_path_missing", training_job="llama") == 1
    assert sample(text, "checkpoint_job_info", training_job="llama", tier="durable") == 1
    dcp_generation(job / "step-100")
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="llama") == 100)
    assert served.value("checkpoint_exporter_path_missing", training_job="llama") == 0


def test_a_reload_adding_a_job_not_there_yet_succeeds(tmp_path: Path, exporter) -> None:
    (tmp_path / "a").mkdir()
    config = write_config(tmp_path, f"jobs: [{{name: a, path: {tmp_path / 'a'}}}]\n")
    served = exporter("--config.file", str(config))
    write_config(
        tmp_path,
        f"jobs: [{{name: a, path: {tmp_path / 'a'}}}, {{name: b, path: {tmp_path / 'b'}}}]\n",
    )
    served.process.send_signal(signal.SIGHUP)
    wait_for(lambda: served.value("checkpoint_exporter_path_missing", training_job="b") == 1)
    assert served.value("checkpoint_exporter_config_last_reload_successful") == 1
    dcp_generation(tmp_path / "b" / "step-3")
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="b") == 3)


def test_a_discover_root_that_appears_later_is_listed_then(tmp_path: Path, exporter) -> None:
    root = tmp_path / "runs"
    config = write_config(tmp_path, f"discover: [{{root: {root}, poll_interval: 1s}}]\n")
    served = exporter("--config.file", str(config))
    assert served.value("checkpoint_exporter_discover_root_missing", root=str(root)) == 1
    dcp_generation(root / "run-1" / "step-7")
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="run-1") == 7)
    assert served.value("checkpoint_exporter_discover_root_missing", root=str(root)) == 0


def test_discovery_watches_the_newest_runs_and_empty_directories_take_no_slot(
    tmp_path: Path, exporter
) -> None:
    """max_jobs is 2. A tenant's empty directories fill no slot; a new run pushes out the run
    idle the longest (it was the newest that was dropped); the run pushed out does not take its
    slot back at the next listing while it stays as it was."""
    root = tmp_path / "runs"
    for name in ("old", "older"):
        dcp_generation(root / name / "step-1")
    age(root / "older", 3 * DAY)
    age(root / "old", 2 * DAY)
    for index in range(5):
        (root / f"squat-{index}").mkdir()
    config = write_config(
        tmp_path, f"discover: [{{root: {root}, max_jobs: 2, poll_interval: 1s}}]\n"
    )
    served = exporter("--config.file", str(config))
    text = served.metrics()
    assert sample(text, "checkpoint_last_committed_step", training_job="old") == 1
    assert sample(text, "checkpoint_last_committed_step", training_job="older") == 1
    assert sample(text, "checkpoint_job_info", training_job="squat-0") is None
    assert sample(text, "checkpoint_exporter_discover_excess_jobs", root=str(root)) == 0
    dcp_generation(root / "new" / "step-9")
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="new") == 9)
    excess = "checkpoint_exporter_discover_excess_jobs"
    wait_for(lambda: served.value(excess, root=str(root)) == 1)  # "older" waits, not watched
    text = served.metrics()
    assert sample(text, "checkpoint_job_info", training_job="older") is None
    assert sample(text, "checkpoint_last_committed_step", training_job="old") == 1
    assert any("job older (idle since" in line for line in served.drain_log())
    for listing in range(1, 4):  # three listings: "older" stays out, "old" stays in
        # A run idler still than "older" is one more in excess: seen, its listing has run.
        dcp_generation(root / f"oldest-{listing}" / "step-1")
        age(root / f"oldest-{listing}", (3 + listing) * DAY)
        wait_for(lambda n=listing: served.value(excess, root=str(root)) == 1 + n)
        text = served.metrics()
        assert sample(text, "checkpoint_job_info", training_job="older") is None
        assert sample(text, "checkpoint_last_committed_step", training_job="old") == 1


def test_a_gone_run_kept_until_forget_after_makes_room_too(tmp_path: Path, exporter) -> None:
    """max_jobs is 1. The watched run's directory is removed (its job kept, last state visible,
    until forget_after) and a new run appears: the gone run, idle longest, makes room. Before,
    making room looked up the gone run in the listing (a KeyError that failed the scanner's
    turn, every listing): the new run was never watched."""
    root = tmp_path / "runs"
    dcp_generation(root / "old" / "step-1")
    age(root / "old", 2 * DAY)
    config = write_config(
        tmp_path,
        f"discover: [{{root: {root}, max_jobs: 1, forget_after: 1h, poll_interval: 1s}}]\n",
    )
    served = exporter("--config.file", str(config))
    assert served.value("checkpoint_last_committed_step", training_job="old") == 1
    shutil.rmtree(root / "old")
    dcp_generation(root / "new" / "step-9")
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="new") == 9)
    assert served.value("checkpoint_job_info", training_job="old", tier="durable") is None
    assert not any("scanner turn failed" in line for line in served.drain_log())


def test_the_spool_is_reported_unwritable_until_training_jobs_can_write_it(
    tmp_path: Path, exporter
) -> None:
    spool = tmp_path / "spool"
    config = write_config(tmp_path, f"spool: {spool}\n")
    served = exporter("--config.file", str(config))
    wait_for(lambda: served.value("checkpoint_exporter_spool_writable") == 0)
    spool.mkdir(mode=0o755)  # what the kubelet makes of a hostPath DirectoryOrCreate
    os.chmod(spool, 0o755)
    # Still unwritable at every check after this one: test_loop.py's, check by check.
    assert served.value("checkpoint_exporter_spool_writable") == 0
    os.chmod(spool, 0o1733)
    wait_for(lambda: served.value("checkpoint_exporter_spool_writable") == 1, 10)
    assert any("cannot be written by training jobs" in line for line in served.drain_log())
