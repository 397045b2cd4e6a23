"""SIGHUP reloads the configuration, as Prometheus does: jobs added, removed or changed take
effect, unchanged jobs keep their state and counters, and a bad file is logged and ignored."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.conftest import wait_for, write_config
from tests.helpers.trees import dcp_generation

RELOADED = "checkpoint_exporter_config_last_reload_successful"
RELOADED_AT = "checkpoint_exporter_config_last_reload_success_timestamp_seconds"


def _commit(staging: Path, job: Path, step: int) -> None:
    dcp_generation(staging / f"step-{step}")
    os.rename(staging / f"step-{step}", job / f"step-{step}")


def test_sighup_reloads_the_configuration(tmp_path: Path, exporter) -> None:
    a, b, staging = tmp_path / "a", tmp_path / "b", tmp_path / "staging"
    a.mkdir()
    b.mkdir()
    spool = f"spool: {tmp_path / 'spool'}\n"
    job_a = f"{{name: a, path: {a}, layout: dcp}}"
    job_b = f"{{name: b, path: {b}, layout: dcp}}"
    config = write_config(tmp_path, f"{spool}jobs: [{job_a}]\n")
    served = exporter("--config.file", str(config))
    assert served.value(RELOADED) == 1
    started_at = served.value(RELOADED_AT)
    _commit(staging, a, 1)
    wait_for(lambda: served.value("checkpoint_saves_committed_total", training_job="a") == 1)

    config.write_text(f"{spool}jobs: [{job_a}, {job_b}]\n")  # a job added
    served.process.send_signal(signal.SIGHUP)
    wait_for(lambda: served.value("checkpoint_job_info", training_job="b") == 1)
    assert served.value(RELOADED) == 1 and served.value(RELOADED_AT) > started_at
    assert served.value("checkpoint_saves_committed_total", training_job="a") == 1  # kept

    config.write_text(f"{spool}jobs: [{{name: a, layout: dcp}}]\n")  # broken: a has no path
    served.process.send_signal(signal.SIGHUP)
    wait_for(lambda: served.value(RELOADED) == 0)
    assert any("configuration reload failed" in line for line in served.drain_log())
    _commit(staging, a, 2)  # the running configuration goes on
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="a") == 2)
    assert served.value("checkpoint_job_info", training_job="b") == 1

    config.write_text(f"{spool}jobs: [{job_a}]\n")  # fixed, and b removed
    served.process.send_signal(signal.SIGHUP)
    wait_for(lambda: served.value(RELOADED) == 1)
    wait_for(lambda: served.value("checkpoint_job_info", training_job="b") is None)
    assert served.value("checkpoint_saves_committed_total", training_job="a") == 2
    assert served.process.poll() is None
    code, _ = served.stop()  # a hung exit fails in stop(): its wait has a timeout
    assert code == 0


def test_a_reload_changing_a_job_takes_effect(tmp_path: Path, exporter) -> None:
    a = tmp_path / "a"
    a.mkdir()
    spool = f"spool: {tmp_path / 'spool'}\n"
    config = write_config(tmp_path, f"{spool}jobs: [{{name: a, path: {a}, deadline: 60s}}]\n")
    served = exporter("--config.file", str(config))
    assert served.value("checkpoint_deadline_seconds", training_job="a") == 60
    config.write_text(f"{spool}jobs: [{{name: a, path: {a}, deadline: 90s}}]\n")
    served.process.send_signal(signal.SIGHUP)
    wait_for(lambda: served.value("checkpoint_deadline_seconds", training_job="a") == 90)


def test_a_reload_changing_a_discover_root_applies_to_its_jobs(tmp_path: Path, exporter) -> None:
    """A discover root's policy changed by reload reaches the jobs already found under it."""
    root = tmp_path / "root"
    dcp_generation(root / "j1" / "step-1")  # an empty directory is no job yet
    spool = f"spool: {tmp_path / 'spool'}\n"
    config = write_config(tmp_path, f"{spool}discover: [{{root: {root}, interval: 15m}}]\n")
    served = exporter("--config.file", str(config))
    wait_for(lambda: served.value("checkpoint_interval_seconds", training_job="j1") == 900)
    first_seen = served.value("checkpoint_job_first_seen_timestamp_seconds", training_job="j1")
    config.write_text(f"{spool}discover: [{{root: {root}, interval: 1m}}]\n")
    served.process.send_signal(signal.SIGHUP)
    wait_for(lambda: served.value("checkpoint_interval_seconds", training_job="j1") == 60)
    assert served.value(RELOADED) == 1
    # Found again under its root, the same job: what was known of its life stays.
    seen = served.value("checkpoint_job_first_seen_timestamp_seconds", training_job="j1")
    assert seen == first_seen


def test_a_reload_that_changes_a_job_keeps_what_is_known_of_its_life(
    tmp_path: Path, exporter
) -> None:
    """A job that said it finished, reconfigured (its deadline changed): still finished, still
    first seen when it was, so it does not start paging again."""
    from checkpoint_exporter import instrument

    job = tmp_path / "a"
    job.mkdir()
    spool = tmp_path / "spool"
    head = f"spool: {spool}\njobs: [{{name: a, path: {job}, layout: dcp"
    config = write_config(tmp_path, head + "}]\n")
    served = exporter("--config.file", str(config))
    instrument.finished(training_job="a", spool=str(spool))
    wait_for(lambda: served.value("checkpoint_job_finished", training_job="a") == 1)
    first_seen = served.value("checkpoint_job_first_seen_timestamp_seconds", training_job="a")
    config.write_text(head + ", deadline: 2m}]\n")
    served.process.send_signal(signal.SIGHUP)
    wait_for(lambda: served.value("checkpoint_deadline_seconds", training_job="a") == 120)
    assert served.value("checkpoint_job_finished", training_job="a") == 1
    assert served.value("checkpoint_job_first_seen_timestamp_seconds", training_job="a") == (
        first_seen
    )
