"""Time from a tenant is bounded ([tenants] item 7), with a real exporter: a generation dated a
year ahead (`touch -d '+365 days'`) pinned checkpoint_last_committed_step and _timestamp for a
year, so a later truncated save stayed hidden (a missed CheckpointInvalid), and the skew gauge
let the year go after sixteen ordinary changes."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.conftest import wait_for, write_config
from tests.helpers.trees import dcp_generation

YEAR = 365 * 86400.0


def test_a_generation_dated_a_year_ahead_hides_no_later_save(tmp_path: Path, exporter) -> None:
    job = tmp_path / "job"
    dcp_generation(job / "step-1")
    ahead = time.time() + YEAR
    for name in os.listdir(job / "step-1"):
        os.utime(job / "step-1" / name, (ahead, ahead))
    os.utime(job / "step-1", (ahead, ahead))
    config = write_config(tmp_path, f"jobs: [{{name: j, path: {job}, poll_interval: 1s}}]\n")
    served = exporter("--config.file", str(config))
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="j") == 1)
    published = served.value("checkpoint_last_committed_timestamp_seconds", training_job="j")
    assert published is not None and published < time.time() + 5  # when seen, not next year
    # The next save is truncated: one shard lost half its bytes before the marker was written.
    dcp_generation(tmp_path / "staging" / "step-2", shard_bytes=64)
    with open(tmp_path / "staging" / "step-2" / "__1_0.distcp", "r+b") as shard:
        shard.truncate(32)
    os.rename(tmp_path / "staging" / "step-2", job / "step-2")
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="j") == 2)
    wait_for(lambda: served.value("checkpoint_last_committed_valid", training_job="j") == 0)
    skew = served.value("checkpoint_storage_clock_skew_seconds", training_job="j")
    assert skew is not None and skew > YEAR / 2  # reported, for the ticket that names it
