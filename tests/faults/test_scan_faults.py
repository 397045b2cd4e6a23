"""The tree changing or refusing under the scanner: retention deleting, renames during a read,
permission denied on a subtree, and storage clocks that disagree with the node's."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from checkpoint_exporter.core.tracker import ValidationRequest
from checkpoint_exporter.daemon.validator import Validator
from checkpoint_exporter.sources import dcp_metadata
from checkpoint_exporter.sources.validate import Limits
from tests.conftest import as_nobody, parse_samples, sample, wait_for, write_config
from tests.helpers.trees import dcp_generation, scan

pytestmark = [pytest.mark.root, pytest.mark.daemon]


def test_retention_racing_the_scanner(tmp_path: Path, exporter) -> None:
    job = tmp_path / "job"
    job.mkdir()
    staging = tmp_path / "staging"
    config = write_config(tmp_path, f"jobs: [{{name: j, path: {job}, layout: dcp}}]\n")
    served = exporter("--config.file", str(config))
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            served.metrics()

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for step in range(1, 61):
            dcp_generation(staging / f"step-{step}", shards=20)
            os.rename(staging / f"step-{step}", job / f"step-{step}")
            # Seen committed before retention takes it, as every real generation is (retention
            # keeps three saves' intervals): a generation first seen half-deleted, shards
            # without .metadata, is a save in progress to the exporter (noted as left).
            wait_for(lambda step=step: served.value(
                "checkpoint_last_committed_step", training_job="j") == step, 10)  # fmt: skip
            if step > 3:
                shutil.rmtree(job / f"step-{step - 3}")  # keep_latest_k=3, racing the scans
    finally:
        stop.set()
        scraper.join()
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="j") == 60, 10)
    wait_for(lambda: served.value("checkpoint_retained_generations", training_job="j") == 3, 10)
    wait_for(lambda: served.value("checkpoint_last_committed_valid", training_job="j") == 1, 10)
    assert served.value("checkpoint_saves_aborted_total", training_job="j") == 0
    assert served.process.poll() is None


def test_unreadable_subtrees_and_outward_symlinks(exporter) -> None:
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
        served = exporter("--config.file", str(config), prefix=as_nobody())
        text = served.metrics()
        assert sample(text, "checkpoint_last_committed_step", training_job="j") == 1
        assert sample(text, "checkpoint_last_committed_size_bytes", training_job="j") == (
            (job / "step-1" / ".metadata").stat().st_size + 32
        )  # the symlink to /etc/passwd is neither followed nor counted
        assert sample(text, "checkpoint_exporter_scan_errors_total") >= 1
        assert "permission denied" in "".join(served.drain_log())
        assert served.process.poll() is None
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=True)


def _validate_once(root: Path, generation: str) -> object:
    _, found = scan(root, "dcp")
    item = found[generation]
    request = ValidationRequest("j", "durable", generation, (item.bytes, item.files, 0.0), item)
    validator = Validator(Limits())
    validator.start()
    try:
        validator.submit(request, str(root))
        return validator.verdicts.get(timeout=10)[1]
    finally:
        validator.stop()


def test_a_generation_renamed_while_being_read(tmp_path: Path, monkeypatch) -> None:
    """The scan saw the generation; the writer renames it away just before the validator opens
    its metadata: never a failure. The validator reads through the generation's directory
    descriptor, so it judges the very directory it opened (valid), or gives no verdict at all
    (judged again on the next scan)."""
    root = tmp_path / "job"
    dcp_generation(root / "step-1")
    read = dcp_metadata.read

    def rename_then_read(path, *args):  # type: ignore[no-untyped-def]
        if (root / "step-1").exists():
            os.rename(root / "step-1", root / "step-1.old")
        return read(path, *args)

    monkeypatch.setattr(dcp_metadata, "read", rename_then_read)
    verdict = _validate_once(root, "step-1")
    assert verdict is None or verdict.valid

    # The same read of a generation that really lost a shard is still a failure.
    monkeypatch.setattr(dcp_metadata, "read", read)
    dcp_generation(root / "step-2")
    (root / "step-2" / "__1_0.distcp").unlink()
    verdict = _validate_once(root, "step-2")
    assert verdict is not None and verdict.reason == "missing_shard"


def test_generations_renamed_back_and_forth(tmp_path: Path, exporter) -> None:
    """Writers that publish by rename, racing the validator: no failure is ever counted and the
    generation in place at the end is judged valid."""
    job, aside = tmp_path / "job", tmp_path / "aside"
    aside.mkdir()
    dcp_generation(job / "step-1", shards=200)
    config = write_config(tmp_path, f"jobs: [{{name: j, path: {job}, layout: dcp}}]\n")
    served = exporter("--config.file", str(config))
    for index in range(150):
        os.rename(job / "step-1", aside / "step-1")
        time.sleep(0.004 * (index % 5))
        os.rename(aside / "step-1", job / "step-1")
        time.sleep(0.003 * (index % 7))
    wait_for(lambda: served.value("checkpoint_last_committed_valid", training_job="j") == 1)
    text = served.metrics()
    failures = {k: v for k, v in parse_samples(text).items() if "validation_failures" in k}
    assert failures and not any(failures.values()), failures
    assert sample(text, "checkpoint_retained_generations", training_job="j") == 1


def _skewed_generation(staging: Path, skew: float) -> Path:
    """A DCP generation stamped by a file server whose clock is ``skew`` seconds off."""
    dcp_generation(staging)
    stamp = time.time() + skew
    for path in (*staging.iterdir(), staging):
        os.utime(path, (stamp, stamp))
    return staging


def test_storage_clocks_ahead_and_behind(tmp_path: Path, exporter) -> None:
    """Five minutes of skew either way: no negative duration, no false deadline miss, and the
    skew is reported."""
    ahead, behind, spool = (
        tmp_path / "ahead" / "job",
        tmp_path / "behind" / "job",
        tmp_path / "spool",
    )
    ahead.mkdir(parents=True)
    behind.mkdir(parents=True)
    config = write_config(tmp_path, f"""
spool: {spool}
defaults: {{deadline: 60s, layout: dcp}}
jobs:
  - {{name: ahead, path: {ahead}}}
  - {{name: behind, path: {behind}}}
""")  # fmt: skip
    served = exporter("--config.file", str(config))
    from checkpoint_exporter import instrument

    with instrument.saving(training_job="ahead", step=1, spool=str(spool)) as save:
        save.staged()
        save.resume()
        os.rename(_skewed_generation(tmp_path / "staging" / "a", +300), ahead / "step-1")
        save.written()
    # No events for this one: timed from the disk alone.
    os.rename(_skewed_generation(tmp_path / "staging" / "b", -300), behind / "step-1")

    def settled() -> bool:
        text = served.metrics()
        return all(
            sample(text, "checkpoint_save_duration_seconds_count", training_job=job, phase="total")
            == 1
            for job in ("ahead", "behind")
        )

    wait_for(settled)
    # The ranks' account of "ahead" once their timeline settled (the disk's may come first): a
    # second count, or a skewed phase, would come with it.
    phase = "checkpoint_last_save_phase_seconds"
    wait_for(lambda: served.value(phase, training_job="ahead", phase="write") is not None)
    text = served.metrics()
    skew = "checkpoint_storage_clock_skew_seconds"
    assert 290 < sample(text, skew, training_job="ahead") <= 301
    assert -301 <= sample(text, skew, training_job="behind") < -290
    for job in ("ahead", "behind"):
        assert sample(text, "checkpoint_deadline_misses_total", training_job=job) == 0, job
        total = sample(text, "checkpoint_last_save_phase_seconds", training_job=job, phase="total")
        assert 0 <= total < 10, (job, total)
        histogram = "checkpoint_save_duration_seconds_sum"
        assert 0 <= sample(text, histogram, training_job=job, phase="total") < 10, job
        assert sample(text, "checkpoint_saves_aborted_total", training_job=job) == 0, job
    phases = parse_samples(text)
    assert not [k for k, v in phases.items() if "phase_seconds" in k and v < 0], phases
