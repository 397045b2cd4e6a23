"""What the exporter depends on going away: the spool's disk filling up, NVML vanishing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, require_tool, sample, wait_for, write_config
from tests.helpers.trees import dcp_generation

pytestmark = [pytest.mark.root]

FAKES = REPO / "tests" / "fakes"

# A training job in its own process, saving one generation with the instrument.
_TRAINING_JOB = """
import os, sys, warnings
from pathlib import Path
from checkpoint_exporter import instrument
from tests.helpers.trees import dcp_generation
job, spool, step = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    path = job / f"step-{step}"
    with instrument.saving(training_job="j", step=step, path=path, spool=spool) as s:
        s.staged()
        s.resume()
        dcp_generation(job.parent / "staging" / f"step-{step}")
        os.rename(job.parent / "staging" / f"step-{step}", job / f"step-{step}")
        s.written()
print(len([w for w in caught if "spool unavailable" in str(w.message)]))
"""


def _train(job: Path, spool: Path, step: int) -> int:
    """Run one save; returns how many spool warnings the job printed."""
    result = subprocess.run(
        [sys.executable, "-c", _TRAINING_JOB, str(job), str(spool), str(step)],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=True,
    )  # fmt: skip
    return int(result.stdout.strip())


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A real 256 KiB tmpfs, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.fail("mounting a tmpfs needs root (CI runs the suite as root)")
    mountpoint = tmp_path / "small"
    mountpoint.mkdir()
    subprocess.run(
        [require_tool("mount"), "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mountpoint)],
        check=True,
    )
    try:
        yield mountpoint
    finally:
        subprocess.run([require_tool("umount"), "-l", str(mountpoint)], check=True)


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # full
    finally:
        os.close(fd)
    return filler


def test_spool_disk_full(tmp_path: Path, small_filesystem: Path, exporter) -> None:
    """Events cannot be written: the job trains on, warned once; the save is still counted, from
    disk alone; once space is back, the next save has its phases again."""
    job, spool = tmp_path / "job", small_filesystem / "spool"
    dcp_generation(job / "step-1")
    spool.mkdir()
    config = write_config(
        tmp_path, f"spool: {spool}\njobs: [{{name: j, path: {job}, layout: dcp}}]\n"
    )
    served = exporter("--config.file", str(config))
    filler = _fill(small_filesystem)

    assert _train(job, spool, 2) == 1  # one warning, no exception
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="j") == 2)
    count = "checkpoint_save_duration_seconds_count"
    # Counted from the disk alone; a second count of it would show with the next save's (below).
    wait_for(lambda: served.value(count, training_job="j", phase="total") == 1)
    text = served.metrics()
    assert sample(text, "checkpoint_saves_committed_total", training_job="j") == 1
    assert sample(text, count, training_job="j", phase="total") == 1
    assert sample(text, count, training_job="j", phase="write") in (None, 0)
    assert served.process.poll() is None

    filler.unlink()
    assert _train(job, spool, 3) == 0
    wait_for(lambda: served.value(count, training_job="j", phase="write") == 1)
    text = served.metrics()
    assert sample(text, "checkpoint_saves_committed_total", training_job="j") == 2
    assert sample(text, count, training_job="j", phase="total") == 2
    assert sample(text, "checkpoint_exporter_spool_events_total", event="committed") == 1
    assert sample(text, "checkpoint_last_committed_valid", training_job="j") == 1


def test_nvml_disappearing_mid_run(tmp_path: Path, exporter) -> None:
    """The driver goes away under the running exporter: the gpu collector reports no data, the
    rest of the scrape is untouched, and NVML is picked up again when it comes back."""
    state = tmp_path / "nvml.json"
    gpus = [{"util": 30, "memory_used": 1}] * 2
    state.write_text(json.dumps({"init": "ok", "gpus": gpus}))
    job = tmp_path / "job"
    dcp_generation(job / "step-1")
    config = write_config(
        tmp_path,
        f"telemetry: {{sample_interval: 200ms, gpu: auto}}\njobs: [{{name: j, path: {job}}}]\n",
    )
    served = exporter(
        "--config.file", str(config),
        env={"PYTHONPATH": str(FAKES), "FAKE_NVML_STATE": str(state)},
    )  # fmt: skip
    success = "checkpoint_exporter_scrape_collector_success"
    wait_for(lambda: served.value(success, collector="gpu") == 1)

    state.write_text(json.dumps({"init": "driver_not_loaded", "gpus": gpus}))
    wait_for(lambda: served.value(success, collector="gpu") == 0)
    for _ in range(5):
        text = served.metrics()
        assert sample(text, success, collector="checkpoints") == 1
        assert sample(text, success, collector="jobs") == 1
        assert sample(text, "checkpoint_last_committed_step", training_job="j") == 1
    state.write_text(json.dumps({"init": "ok", "gpus": gpus}))
    wait_for(lambda: served.value(success, collector="gpu") == 1, timeout=15)  # 10 s retry
    log = "".join(served.drain_log())
    assert log.count("GPU telemetry lost") == 1, log
    assert served.process.poll() is None
