"""Processes dying mid-save: the writer (a real multi-process DCP job) and the exporter itself."""

from __future__ import annotations

import signal
from pathlib import Path

from checkpoint_exporter import instrument
from tests.conftest import sample, wait_for, write_config
from tests.helpers.trees import dcp_generation, dcp_metadata_bytes
from tests.helpers.writer import Writer


def test_writer_killed_mid_commit(tmp_path: Path, exporter) -> None:
    job = tmp_path / "job"
    job.mkdir()
    # abort_after as short as the deadline: the test waits for no progress, not ten minutes.
    config = write_config(
        tmp_path, f"jobs: [{{name: j, path: {job}, deadline: 3s, abort_after: 3s}}]\n"
    )
    served = exporter("--config.file", str(config))
    writer = Writer(
        job, "--steps", "2", "--first-step", "10", "--step-every", "10",
        "--interval", "0.5", "--hang-in-finish", "20",
    )  # fmt: skip
    try:
        assert writer.next()["step"] == 10
        assert writer.next()["event"] == "in-finish"  # shards of step 20 written, no .metadata
        wait_for(lambda: served.value("checkpoint_saves_in_progress", training_job="j") == 1)
    finally:
        writer.kill()  # SIGKILL to the whole process group: no rank gets to clean up
    # Aborted at abort_after, and counted once by every later read and tick: the core's
    # test_a_save_that_stops_is_aborted_at_the_tick_it_asked_for, on its own clock.
    wait_for(lambda: served.value("checkpoint_saves_aborted_total", training_job="j") == 1, 15)
    text = served.metrics()
    assert sample(text, "checkpoint_saves_aborted_total", training_job="j") == 1
    assert sample(text, "checkpoint_saves_committed_total", training_job="j") == 1
    assert sample(text, "checkpoint_last_committed_step", training_job="j") == 10
    assert sample(text, "checkpoint_last_committed_valid", training_job="j") == 1
    assert sample(text, "checkpoint_saves_in_progress", training_job="j") == 0
    assert not (job / "step-20" / ".metadata").exists()


def test_exporter_killed_and_restarted_mid_save(tmp_path: Path, exporter) -> None:
    """State comes back from disk and the spool; history never grows a counter; the save in
    flight across the restart is counted once, with its phases, when it commits."""
    job, spool = tmp_path / "job", tmp_path / "spool"
    for step in (1, 2):
        dcp_generation(job / f"step-{step}")
    config = write_config(
        tmp_path, f"spool: {spool}\njobs: [{{name: j, path: {job}, layout: dcp, deadline: 60s}}]\n"
    )
    first = exporter("--config.file", str(config))
    with instrument.saving(training_job="j", step=2, path=job / "step-2", spool=str(spool)):
        pass  # the events of an earlier save: history for the second exporter
    wait_for(lambda: first.value("checkpoint_saves_committed_total", training_job="j") == 0)

    in_flight = job / "step-3"
    with instrument.saving(training_job="j", step=3, path=in_flight, spool=str(spool)) as save:
        in_flight.mkdir()
        for rank in range(2):
            (in_flight / f"__{rank}_0.distcp").write_bytes(b"\0" * 16)
        wait_for(lambda: first.value("checkpoint_saves_in_progress", training_job="j") == 1)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)

        second = exporter("--config.file", str(config))
        text = second.metrics()
        assert sample(text, "checkpoint_saves_in_progress", training_job="j") == 1
        assert sample(text, "checkpoint_last_committed_step", training_job="j") == 2
        for counter in ("saves_committed", "saves_aborted", "deadline_misses"):
            assert sample(text, f"checkpoint_{counter}_total", training_job="j") == 0, counter
        assert (
            sample(text, "checkpoint_save_duration_seconds_count", training_job="j", phase="total")
            == 0
        )
        save.staged()
        save.resume()
        save.written()
        (in_flight / ".metadata").write_bytes(dcp_metadata_bytes(2, 16))

    wait_for(lambda: second.value("checkpoint_last_committed_step", training_job="j") == 3)
    wait_for(lambda: second.value("checkpoint_last_committed_valid", training_job="j") == 1)
    # The ranks' account, once their timeline settled: a second count would come with it.
    phase = "checkpoint_last_save_phase_seconds"
    wait_for(lambda: second.value(phase, training_job="j", phase="write") is not None)
    text = second.metrics()
    assert sample(text, "checkpoint_saves_committed_total", training_job="j") == 1
    assert sample(text, "checkpoint_saves_aborted_total", training_job="j") == 0
    for phase in ("total", "pause", "staging", "write", "commit"):
        histogram = "checkpoint_save_duration_seconds_count"
        assert sample(text, histogram, training_job="j", phase=phase) == 1, phase
    assert sample(text, "checkpoint_last_save_phase_seconds", training_job="j", phase="write") > 0
