"""metadata: the stat/listdir/open load the daemon puts on storage while a 4,096-rank save runs.

The job already holds RETAINED committed generations of RANKS shards each. A writer then saves a
new generation as 4,096 ranks would: every rank's shard appears over WRITE_SECONDS, then rank 0
commits ``.metadata``. The exporter counts every metadata operation it issues on watched paths
(``checkpoint_exporter_scan_metadata_operations_total``, spent from the scanner's budget); the
counter is read every 0.25 s. Reported per run: operations during the save (shards appearing to
the commit visible and validated), their average rate, and operations per new file, against the
files already there (what a design that rescanned everything would cost per pass); and the first
scan's duration, which shows the budget at work on the NFS run.

Three runs: inotify on local disk; polling every 5 s on local disk; polling on a mount the
exporter takes for NFS (a fixture mountinfo under --path.procfs), where the configured budget
(``scan.metadata_ops_per_second``) applies.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from checkpoint_exporter.demo.cluster import dcp_metadata
from process import Exporter, write_config
from tree import CREATE_FLAGS, SHARD_BYTES, shard_names, write_generation

RANKS = 4096
RETAINED = 10
WRITE_SECONDS = 4.0
OPS = "checkpoint_exporter_scan_metadata_operations_total"


def _nfs_procfs(base: Path, mountpoint: Path) -> Path:
    procfs = base / "proc"
    (procfs / "self").mkdir(parents=True)
    (procfs / "self/mountinfo").write_text(
        "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw\n"
        f"98 22 0:53 / {mountpoint} rw,relatime shared:2 - nfs4 filer:/ckpt rw,vers=4.2\n"
    )
    return procfs


def _save(generation: Path, ranks: int, metadata: bytes, sample: Callable[[], None]) -> None:
    """The shards appear over WRITE_SECONDS in 64 batches, then .metadata commits."""
    generation.mkdir()
    names = shard_names(ranks)
    batches = 64
    for batch in range(batches):
        for name in names[batch * ranks // batches : (batch + 1) * ranks // batches]:
            fd = os.open(generation / name, CREATE_FLAGS, 0o644)
            os.ftruncate(fd, SHARD_BYTES)
            os.close(fd)
        time.sleep(WRITE_SECONDS / batches)
        sample()
    (generation / ".metadata.tmp").write_bytes(metadata)
    os.rename(generation / ".metadata.tmp", generation / ".metadata")


def bench_metadata_run(
    label: str, mode: str, nfs: bool, budget: float, ranks: int = RANKS, retained: int = RETAINED
) -> dict[str, object]:
    base = Path(tempfile.mkdtemp(prefix="checkpoint-exporter-metadata-"))
    try:
        job = base / "ckpt"
        metadata = dcp_metadata(dict.fromkeys(shard_names(ranks), SHARD_BYTES))
        for step in range(retained):
            write_generation(job / f"step-{step}", ranks, metadata)
        flags = ("--path.procfs", str(_nfs_procfs(base, job))) if nfs else ()
        config = write_config(
            base / "config.yaml", {"j": job},
            f"scan: {{metadata_ops_per_second: {budget:g}}}",
            watch=mode, poll_interval="5s", retained_generations=str(retained + 2),
        )  # fmt: skip
        began = time.monotonic()
        with Exporter(config, *flags) as exporter:
            exporter.wait_for_jobs(1, timeout=300, files=ranks + 1)
            first_scan = time.monotonic() - began
            # Settled: 6 s (past a poll period) in which the first scan's validations are done
            # and only the idle passes' directory lstats remain (a few dozen).
            while True:
                before = exporter.total(OPS)
                time.sleep(6)
                if exporter.total(OPS) - before < 100:
                    break
            samples: list[tuple[float, float]] = []

            def sample() -> None:
                if not samples or time.monotonic() - samples[-1][0] >= 0.25:
                    samples.append((time.monotonic(), exporter.total(OPS)))

            sample()
            started = time.monotonic()
            _save(job / f"step-{retained}", ranks, metadata, sample)
            while True:
                sample()
                steps = [
                    value
                    for (name, _), value in exporter.samples().items()
                    if name == "checkpoint_last_committed_step"
                ]
                valid = exporter.total("checkpoint_last_committed_valid")
                if steps and steps[0] == retained and valid == 1:
                    break
                if time.monotonic() - started > 300:
                    raise TimeoutError("the save was not seen committed and valid in 300 s")
                time.sleep(0.25)
            elapsed = time.monotonic() - started
    finally:
        shutil.rmtree(base, ignore_errors=True)
    row = _row(label, ranks, retained, elapsed, samples, budget if nfs else None)
    return {**row, "first_scan_s": first_scan}


def _row(
    label: str, ranks: int, retained: int, elapsed: float,
    samples: list[tuple[float, float]], budget: float | None,
) -> dict[str, object]:  # fmt: skip
    operations = samples[-1][1] - samples[0][1]
    # The counter is published once per scan pass, so rates read from it are coarse: the
    # average over the save is reported. The budget's own pacing is unit-tested
    # (tests/sources/test_listing.py); here it shows as the first scan's duration.
    rate = operations / (samples[-1][0] - samples[0][0])
    return {
        "run": label, "ranks": ranks, "files_already_there": retained * (ranks + 1),
        "save_to_valid_s": elapsed, "operations": operations,
        "operations_per_new_file": operations / (ranks + 1),
        "ops_per_second_during_save": rate, "budget_ops_per_second": budget,
    }  # fmt: skip


def bench_metadata(ranks: int = RANKS, retained: int = RETAINED) -> list[dict[str, object]]:
    return [
        bench_metadata_run("inotify, local disk", "inotify", False, 10_000, ranks, retained),
        bench_metadata_run("poll 5 s, local disk", "poll", False, 10_000, ranks, retained),
        bench_metadata_run("poll 5 s, NFS, budget 2,000/s", "poll", True, 2_000, ranks, retained),
    ]
