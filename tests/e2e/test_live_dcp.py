"""A running exporter watching real multi-process PyTorch DCP jobs (torch CPU build, gloo).

This is the issue's "done when": each commit of `dcp.save` and `dcp.async_save` shows in
/metrics within a second (inotify) with the right step, size, file count and validity; a save
killed mid-commit is in tests/faults/test_process_faults.py; broken
and hostile generations are judged invalid without the exporter running anything.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import Exporter, sample, wait_for, write_config
from tests.helpers.writer import Writer

pytestmark = [pytest.mark.daemon]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("live")
    for job in ("live", "broken"):
        (root / job).mkdir()
    config = write_config(
        root,
        """
defaults: {interval: 1m, deadline: 20s}
jobs:
  - {name: live, path: live, watch: inotify}
  - {name: broken, path: broken, layout: dcp}
""",
    )
    exporter = Exporter("--config.file", str(config))
    yield root, exporter
    exporter.close()


def metrics(exporter: Exporter) -> str:
    return exporter.get("/metrics").text


def scrape_until(
    exporter: Exporter, name: str, value: float | None, timeout: float = 10, **labels: str
) -> str:
    """Scrape until ``name{labels}`` reads ``value``; returns that scrape's text."""
    last: list[str] = [""]

    def check() -> bool:
        last[0] = metrics(exporter)
        return sample(last[0], name, **labels) == value

    wait_for(check, timeout=timeout, interval=0.01)
    return last[0]


def test_each_commit_is_visible_within_a_second(cluster) -> None:
    root, exporter = cluster
    writer = Writer(root / "live", "--steps", "4", "--interval", "1.5", "--mode", "both")
    try:
        latencies, modes = [], set()
        for _ in range(4):
            line = writer.next()
            step, path = line["step"], Path(line["path"])
            modes.add(line["mode"])

            scrape_until(exporter, "checkpoint_last_committed_step", step, 5, training_job="live")
            latencies.append(time.time() - (path / ".metadata").stat().st_mtime)
            files = sorted(p for p in path.iterdir() if p.is_file())
            text = scrape_until(exporter, "checkpoint_last_committed_valid", 1, training_job="live")
            assert sample(text, "checkpoint_last_committed_files", training_job="live") == len(
                files
            )
            assert sample(text, "checkpoint_last_committed_size_bytes", training_job="live") == sum(
                p.stat().st_size for p in files
            )
        assert modes == {"sync", "async"}
        print(f"commit-to-metrics latencies: {[round(x, 3) for x in latencies]}")
        assert max(latencies) < 1.0, latencies
        text = metrics(exporter)
        assert sample(text, "checkpoint_saves_committed_total", training_job="live") == 4
        assert sample(text, "checkpoint_saves_in_progress", training_job="live") == 0
        assert sample(text, "checkpoint_retained_generations", training_job="live") == 4
        assert sample(text, "checkpoint_deadline_misses_total", training_job="live") == 0
        assert (
            sample(
                text, "checkpoint_save_duration_seconds_count", training_job="live", phase="total"
            )
            == 4
        )
        assert (
            sample(text, "checkpoint_job_info", training_job="live", layout="dcp") == 1
        )  # step-N, no checkpoint/ parent
        assert (
            sample(text, "checkpoint_exporter_watch_info", training_job="live", mode="inotify") == 1
        )
    finally:
        writer.kill()


def _publish(source: Path, target: Path) -> None:
    """Land a finished generation the way DCP does: everything at once, by a rename."""
    os.rename(source, target)


def test_broken_and_hostile_generations_are_invalid(cluster, tmp_path: Path) -> None:
    root, exporter = cluster
    staging = tmp_path / "staging"
    staging.mkdir()
    writer = Writer(staging, "--steps", "1", "--first-step", "1", "--interval", "0")
    try:
        writer.next()
    finally:
        writer.kill()
    good = staging / "step-1"
    _publish(shutil.copytree(good, staging / "a"), root / "broken" / "step-1")
    wait_for(
        lambda: (
            sample(metrics(exporter), "checkpoint_last_committed_valid", training_job="broken") == 1
        )
    )

    truncated = shutil.copytree(good, staging / "b")
    shard = truncated / "__1_0.distcp"
    os.truncate(shard, shard.stat().st_size // 2)
    _publish(truncated, root / "broken" / "step-2")
    wait_for(
        lambda: (
            sample(metrics(exporter), "checkpoint_last_committed_step", training_job="broken") == 2
        )
    )
    wait_for(
        lambda: (
            sample(metrics(exporter), "checkpoint_last_committed_valid", training_job="broken") == 0
        )
    )
    assert sample(
        metrics(exporter), "checkpoint_validation_failures_total", training_job="broken",
        reason="truncated_shard",
    ) == 1  # fmt: skip

    _publish(shutil.copytree(good, staging / "c"), root / "broken" / "step-3")
    wait_for(
        lambda: (
            sample(metrics(exporter), "checkpoint_last_committed_valid", training_job="broken") == 1
        )
    )
    (root / "broken" / "step-3" / "__0_0.distcp").unlink()  # a shard deleted after the commit
    # Being deleted (retention takes files one by one) until it stays still for the settle
    # period; then the shard is lost for good, and the generation is judged again.
    wait_for(
        lambda: sample(
            metrics(exporter), "checkpoint_validation_failures_total", training_job="broken",
            reason="missing_shard",
        ) == 1
    )  # fmt: skip
    assert sample(metrics(exporter), "checkpoint_last_committed_valid", training_job="broken") == 0

    marker = tmp_path / "pwned"
    hostile = shutil.copytree(good, staging / "d")

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    import pickle

    (hostile / ".metadata").write_bytes(pickle.dumps(Payload()))
    _publish(hostile, root / "broken" / "step-4")
    wait_for(
        lambda: (
            sample(metrics(exporter), "checkpoint_last_committed_step", training_job="broken") == 4
        )
    )
    # step-3's verdict (invalid) stands until step-4's own is known: wait for that one.
    wait_for(
        lambda: sample(
            metrics(exporter), "checkpoint_validation_failures_total", training_job="broken",
            reason="bad_metadata",
        ) == 1
    )  # fmt: skip
    assert sample(metrics(exporter), "checkpoint_last_committed_valid", training_job="broken") == 0
    text = metrics(exporter)
    assert (
        sample(
            text,
            "checkpoint_validation_failures_total",
            training_job="broken",
            reason="missing_shard",
        )
        == 1
    )
    assert (
        sample(
            text,
            "checkpoint_validation_failures_total",
            training_job="broken",
            reason="bad_metadata",
        )
        == 1
    )
    assert sample(text, "checkpoint_retained_valid_generations", training_job="broken") == 1
    assert not marker.exists()
    assert exporter.process.poll() is None


def test_history_at_startup_sets_gauges_not_counters(cluster) -> None:
    root, _ = cluster
    config = write_config(
        root,
        "jobs: [{name: live, path: live}, {name: broken, path: broken, layout: dcp}]\n",
        "again.yaml",
    )
    restarted = Exporter("--config.file", str(config))
    try:
        text = metrics(restarted)
        assert sample(text, "checkpoint_last_committed_step", training_job="live") == 400
        assert sample(text, "checkpoint_saves_committed_total", training_job="live") == 0
        assert sample(text, "checkpoint_retained_generations", training_job="live") == 4
        text = scrape_until(restarted, "checkpoint_last_committed_valid", 0, training_job="broken")
        assert (
            sample(
                text,
                "checkpoint_validation_failures_total",
                training_job="broken",
                reason="bad_metadata",
            )
            == 0
        )
    finally:
        restarted.close()
