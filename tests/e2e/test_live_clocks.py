"""All four clocks from a real instrumented DCP job, and restore drills, through /metrics.

A 2-process gloo job saves through instrument.save, instrument.async_save (a plain Future) and
instrument.async_save with DefaultStager async staging (an AsyncSaveResponse); a running exporter
tails its spool. Then restore drills, structural and --full, succeed on a good generation and
fail, counted, on a truncated one; --full without torch is not a failed restore.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CLI, REPO, Exporter, sample, wait_for, write_config
from tests.helpers.drill import hidden_torch

pytestmark = [pytest.mark.torch, pytest.mark.daemon]

WRITER = REPO / "tests" / "helpers" / "dcp_writer.py"
PHASES = ("pause", "staging", "write", "commit", "total")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("clocks")
    (root / "ckpt").mkdir()
    config = write_config(
        root,
        f"spool: {root / 'spool'}\n"
        "defaults: {deadline: 30s}\n"
        "jobs: [{name: llama, path: ckpt}]\n",
    )
    exporter = Exporter("--config.file", str(config))
    yield root, config, exporter
    exporter.close()


def metrics(exporter: Exporter) -> str:
    return exporter.get("/metrics").text


def test_all_four_clocks_of_an_instrumented_job(node) -> None:
    root, _, exporter = node
    env = {**os.environ, "CHECKPOINT_EXPORTER_SPOOL": str(root / "spool")}
    writer = subprocess.run(
        [sys.executable, str(WRITER), str(root / "ckpt"), "--steps", "3", "--interval", "1",
         "--instrument", "llama"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert writer.returncode == 0, writer.stderr[-3000:]
    assert [line.split('"mode": "')[1].split('"')[0] for line in writer.stdout.splitlines()] == [
        "save", "async", "staged",
    ]  # fmt: skip

    def all_three_timed() -> bool:
        text = metrics(exporter)
        return (
            sample(
                text, "checkpoint_save_duration_seconds_count", training_job="llama", phase="pause"
            )
            == 3
        )

    wait_for(all_three_timed, timeout=10)
    text = metrics(exporter)
    last = {
        phase: sample(text, "checkpoint_last_save_phase_seconds", training_job="llama", phase=phase)
        for phase in PHASES
    }
    assert all(value is not None and value >= 0 for value in last.values()), last
    assert last["pause"] <= last["total"] and last["staging"] <= last["total"]
    assert last["staging"] + last["write"] + last["commit"] == pytest.approx(
        last["total"], abs=0.05
    )
    for phase in PHASES:
        assert (
            sample(
                text, "checkpoint_save_duration_seconds_count", training_job="llama", phase=phase
            )
            == 3
        )
    write_end = sample(
        text, "checkpoint_last_save_local_write_end_timestamp_seconds", training_job="llama"
    )
    assert time.time() - 60 < write_end <= time.time()
    assert sample(text, "checkpoint_saves_committed_total", training_job="llama") == 3
    assert sample(text, "checkpoint_deadline_misses_total", training_job="llama") == 0
    # Each save's events are counted once, from both ranks.
    assert sample(text, "checkpoint_exporter_spool_events_total", event="save_start") == 6
    assert sample(text, "checkpoint_exporter_spool_events_total", event="committed") == 6
    assert sample(text, "checkpoint_exporter_spool_invalid_lines_total") is None


def drill(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, "restore-drill", "--config.file", str(config), "--job", "llama", *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_restore_drills_reach_metrics(node) -> None:
    root, config, exporter = node
    structural = drill(config)
    assert structural.returncode == 0, structural.stderr
    assert "generation=step-300" in structural.stderr and "succeeded" in structural.stderr
    wait_for(
        lambda: sample(metrics(exporter), "checkpoint_restores_total", training_job="llama") == 1, 5
    )

    full = drill(config, "--full")
    assert full.returncode == 0, full.stderr
    assert "full restore: torch 2.13" in full.stderr
    assert "loaded 2 tensors" in full.stdout  # one from each rank
    wait_for(
        lambda: sample(metrics(exporter), "checkpoint_restores_total", training_job="llama") == 2, 5
    )
    text = metrics(exporter)
    assert sample(text, "checkpoint_restore_failures_total", training_job="llama") == 0
    success = sample(
        text, "checkpoint_restore_last_success_timestamp_seconds", training_job="llama"
    )
    assert time.time() - 30 < success <= time.time()
    assert sample(text, "checkpoint_restore_last_duration_seconds", training_job="llama") > 0

    # A truncated newest generation: the drill fails, exits non-zero, and the failure is counted.
    broken = shutil.copytree(root / "ckpt" / "step-300", root / "broken-400")
    shard = broken / "__0_0.distcp"
    os.truncate(shard, shard.stat().st_size // 3)
    os.rename(broken, root / "ckpt" / "step-400")
    failed = drill(config, "--full")
    assert failed.returncode == 1
    assert "FAILED" in failed.stderr and "truncated_shard" in failed.stderr
    wait_for(
        lambda: (
            sample(metrics(exporter), "checkpoint_restore_failures_total", training_job="llama")
            == 1
        ),
        5,
    )
    text = metrics(exporter)
    assert sample(text, "checkpoint_restores_total", training_job="llama") == 3
    assert (
        sample(text, "checkpoint_restore_last_success_timestamp_seconds", training_job="llama")
        == success
    )

    named = drill(config, "--generation", "step-200")
    assert named.returncode == 0 and "generation=step-200" in named.stderr
    assert drill(config, "--generation", "step-999").returncode == 1
    # Both reach the metrics before the next test reads them (its baseline would race them).
    wait_for(
        lambda: (
            sample(metrics(exporter), "checkpoint_restores_total", training_job="llama") == 5
            and sample(metrics(exporter), "checkpoint_restore_failures_total", training_job="llama")
            == 2
        ),
        10,
    )


def test_full_drill_without_torch_is_not_a_failed_restore(node, tmp_path: Path) -> None:
    """It says so, runs the structural drill (which passes here) and exits 3: neither "restored"
    nor a failed restore the exporter would count."""
    _, config, exporter = node
    failures = sample(metrics(exporter), "checkpoint_restore_failures_total", training_job="llama")
    restores = sample(metrics(exporter), "checkpoint_restores_total", training_job="llama")
    result = subprocess.run(
        [*CLI, "restore-drill", "--config.file", str(config), "--job", "llama", "--full",
         "--generation", "step-200"],
        capture_output=True, text=True, timeout=300, env=hidden_torch(tmp_path / "no-torch"),
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert "torch is not installed here: --full needs it" in result.stderr
    assert "FAILED" not in result.stderr and "loaded" not in result.stdout
    wait_for(
        lambda: (
            sample(metrics(exporter), "checkpoint_restores_total", training_job="llama")
            == restores + 1
        ),
        5,
    )
    text = metrics(exporter)
    assert sample(text, "checkpoint_restore_failures_total", training_job="llama") == failures


def test_unknown_job_is_a_usage_error(node) -> None:
    _, config, _ = node
    result = subprocess.run(
        [*CLI, "restore-drill", "--config.file", str(config), "--job", "nope"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "no job named 'nope'" in result.stderr
