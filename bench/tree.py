"""Checkpoint trees for the benchmarks: many DCP jobs of many generations of many shards.

Shards are sparse files (ftruncate), so a million of them cost inodes, not gigabytes, and each
generation's ``.metadata`` names every shard with its length, so the validator accepts it.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from checkpoint_exporter.demo.cluster import dcp_metadata

SHARD_BYTES = 4096
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class Shape:
    jobs: int
    generations: int
    shards: int

    @property
    def files(self) -> int:
        return self.jobs * self.generations * (self.shards + 1)  # + .metadata


def shard_names(shards: int) -> list[str]:
    return [f"__{rank}_0.distcp" for rank in range(shards)]


def write_generation(directory: Path, shards: int, metadata: bytes | None = None) -> None:
    """One committed DCP generation: the shards, then ``.metadata`` (DCP's commit marker)."""
    directory.mkdir(parents=True)
    for name in shard_names(shards):
        fd = os.open(directory / name, CREATE_FLAGS, 0o644)
        try:
            os.ftruncate(fd, SHARD_BYTES)
        finally:
            os.close(fd)
    if metadata is None:
        metadata = dcp_metadata(dict.fromkeys(shard_names(shards), SHARD_BYTES))
    (directory / ".metadata").write_bytes(metadata)


def build(root: Path, shape: Shape, progress: bool = True) -> float:
    """Writes ``root/job-J/step-G/...`` for the shape; returns the seconds it took."""
    started = time.monotonic()
    metadata = dcp_metadata(dict.fromkeys(shard_names(shape.shards), SHARD_BYTES))
    for job in range(shape.jobs):
        for step in range(shape.generations):
            write_generation(root / f"job-{job}" / f"step-{step}", shape.shards, metadata)
        if progress and shape.files >= 100_000:
            done = (job + 1) * shape.generations * (shape.shards + 1)
            print(f"  built {done:,} of {shape.files:,} files", file=sys.stderr, end="\r")
    if progress and shape.files >= 100_000:
        print(file=sys.stderr)
    return time.monotonic() - started
