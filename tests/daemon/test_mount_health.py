"""One detector of a mount's health, turn by turn (fake clocks, inline workers, no thread): each
mount behind a watched tier is statvfs'd as a task on its own worker, every PROBE_SECONDS; that
answer is its capacity, and its device error is the answer failing or the worker being stuck,
the same STUCK_SECONDS detector that reports checkpoint_exporter_mount_stuck."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from checkpoint_exporter.config import Config, JobConfig, PathsConfig, Policy
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.daemon.health import PROBE_SECONDS
from checkpoint_exporter.daemon.scanner import STUCK_SECONDS, Scanner
from checkpoint_exporter.daemon.workers import Fallback, InlineWorker, Progress, Task
from checkpoint_exporter.model import FilesystemState
from checkpoint_exporter.sources.telemetry.filesystem import (
    ProbeState,
    Reading,
    Target,
    capacity_of,
)
from tests.helpers.clocks import Clocks

REAL_STATVFS = os.statvfs


class HangingWorker(InlineWorker):
    """An inline worker whose mount can hang: while hung, its tasks wait (the first of them
    makes no progress from when it came), and they run, in order, once it answers again."""

    def __init__(self, mountpoint: str, deliver: Callable[[object], None], clocks: Clocks):
        super().__init__(mountpoint, deliver)
        self.clocks = clocks
        self.hung = False
        self.held: list[tuple[Task, Progress | None, str, Fallback | None]] = []
        self.held_since = 0.0
        self.names: list[str] = []  # every task submitted, by name

    def submit(
        self,
        task: Task,
        progress: Progress | None = None,
        *,
        name: str = "",
        fallback: Fallback | None = None,
    ) -> None:
        self.names.append(name)
        if not self.hung:
            super().submit(task, progress, name=name, fallback=fallback)
            return
        if not self.held:
            self.held_since = self.clocks.mono
        self.held.append((task, progress, name, fallback))

    def stalled_for(self, now: float) -> float:
        return now - self.held_since if self.held else 0.0

    def answer(self) -> None:
        self.hung = False
        held, self.held = self.held, []
        for task, progress, name, fallback in held:
            super().submit(task, progress, name=name, fallback=fallback)


@dataclass
class Node:
    scanner: Scanner
    tracker: Tracker
    clocks: Clocks
    mountpoint: Path
    workers: dict[str, HangingWorker]

    @property
    def worker(self) -> HangingWorker:
        return self.workers[str(self.mountpoint)]

    def turns(self, seconds: float = 0.0, count: int = 2) -> None:
        """``seconds`` later, turns enough for what is due to be sent and its answer applied."""
        self.clocks.advance(seconds)
        for _ in range(count):
            self.scanner.turn()

    def filesystem(self) -> FilesystemState | None:
        found = [
            f for f in self.tracker.snapshot.filesystems if f.mountpoint == str(self.mountpoint)
        ]
        return found[0] if found else None

    def stuck(self) -> bool:
        return dict(self.tracker.snapshot.daemon.mounts)[str(self.mountpoint)]


def _node(tmp_path: Path, jobs: int = 1, watch: str = "poll") -> Node:
    """Jobs on one filesystem the mount table names (an xfs at ``ckpt``)."""
    mountpoint = tmp_path / "ckpt"
    procfs = tmp_path / "proc"
    (procfs / "self").mkdir(parents=True)
    (procfs / "self" / "mountinfo").write_text(
        "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw\n"
        f"98 22 253:0 / {mountpoint} rw,relatime shared:2 - xfs /dev/mapper/vg-ckpt rw\n"
    )
    policy = Policy(layout="dcp", watch=watch)
    configs = []
    for n in range(jobs):
        (mountpoint / f"job-{n}").mkdir(parents=True)
        configs.append(JobConfig(f"j{n}", mountpoint / f"job-{n}", None, policy))
    config = Config(spool=tmp_path / "spool", jobs=tuple(configs), paths=PathsConfig(procfs=procfs))
    tracker = Tracker(config)
    clocks = Clocks(wall=time.time())
    workers: dict[str, HangingWorker] = {}

    def worker(mount: str, deliver: Callable[[object], None]) -> HangingWorker:
        workers[mount] = HangingWorker(mount, deliver, clocks)
        return workers[mount]

    scanner = Scanner(
        config,
        tracker,
        watcher_factory=None,
        clock=lambda: clocks.wall,
        monotonic=lambda: clocks.mono,
        worker_factory=worker,
    )
    node = Node(scanner, tracker, clocks, mountpoint, workers)
    node.turns()  # placed, probed, first read
    return node


def _statvfs_calls(monkeypatch: pytest.MonkeyPatch, failing: set[str]) -> list[str]:
    """Every statvfs, by path; one of ``failing`` raises ESTALE (a stale NFS handle)."""
    calls: list[str] = []

    def statvfs(path: str) -> os.statvfs_result:
        calls.append(str(path))
        if str(path) in failing:
            raise OSError(errno.ESTALE, os.strerror(errno.ESTALE), str(path))
        return REAL_STATVFS(path)

    monkeypatch.setattr(os, "statvfs", statvfs)
    return calls


def test_a_probe_is_one_statvfs_of_the_mountpoint_on_its_worker_per_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three polled jobs on one mount: one statvfs of the mountpoint per PROBE_SECONDS, on that
    mount's worker, whatever the number of jobs; its answer is the filesystem's capacity."""
    calls = _statvfs_calls(monkeypatch, failing=set())
    node = _node(tmp_path, jobs=3)
    mountpoint = str(node.mountpoint)
    assert node.worker.names.count(f"statvfs {mountpoint}") == 1  # at once, when placed
    assert calls == [mountpoint]
    stats = REAL_STATVFS(mountpoint)
    first = node.filesystem()
    assert first == FilesystemState(
        mountpoint, "/dev/mapper/vg-ckpt", "xfs", stats.f_blocks * stats.f_frsize,
        first.avail_bytes, 0.2, device_error=False, checked_at=node.clocks.wall,
    )  # fmt: skip
    node.turns(PROBE_SECONDS - 1)
    assert calls.count(mountpoint) == 1
    node.turns(1)
    assert calls.count(mountpoint) == 2 and node.worker.names.count(f"statvfs {mountpoint}") == 2
    # The job whose directory is cleaned up takes nothing from its filesystem's health.
    (node.mountpoint / "job-0").rmdir()
    node.turns(PROBE_SECONDS)
    assert node.filesystem() == FilesystemState(
        mountpoint, "/dev/mapper/vg-ckpt", "xfs", first.size_bytes, node.filesystem().avail_bytes,
        0.2, device_error=False, checked_at=node.clocks.wall,
    )  # fmt: skip


def test_a_failing_statvfs_is_a_device_error_with_the_last_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing: set[str] = set()
    _statvfs_calls(monkeypatch, failing)
    node = _node(tmp_path)
    read = node.filesystem()
    assert read is not None and not read.device_error and read.checked_at > 0
    failing.add(str(node.mountpoint))
    node.turns(PROBE_SECONDS)
    failed = node.filesystem()
    assert failed.device_error and not node.stuck()  # it answered: an error, not a hang
    assert (failed.size_bytes, failed.avail_bytes, failed.checked_at) == (
        read.size_bytes, read.avail_bytes, read.checked_at
    )  # fmt: skip
    failing.clear()
    node.turns(PROBE_SECONDS)
    again = node.filesystem()
    assert not again.device_error and again.checked_at == node.clocks.wall


def test_a_filesystem_whose_statvfs_never_succeeded_is_reported_in_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _statvfs_calls(monkeypatch, failing={str(tmp_path / "ckpt")})
    node = _node(tmp_path)
    never = node.filesystem()
    assert (never.device_error, never.checked_at, never.size_bytes) == (True, 0.0, 0)


def test_a_stuck_worker_is_the_mounts_device_error_and_recovery_clears_both(
    tmp_path: Path,
) -> None:
    node = _node(tmp_path)
    read = node.filesystem()
    node.worker.hung = True  # the next task blocks in the kernel
    node.turns(PROBE_SECONDS)
    assert node.worker.held and not node.stuck() and not node.filesystem().device_error
    node.turns(STUCK_SECONDS)
    assert node.stuck()
    hung = node.filesystem()
    assert hung.device_error  # in the same publication as mount_stuck
    assert (hung.size_bytes, hung.avail_bytes, hung.checked_at) == (
        read.size_bytes, read.avail_bytes, read.checked_at
    )  # fmt: skip
    # Stuck: no probe piles up on it.
    probes = node.worker.names.count(f"statvfs {node.mountpoint}")
    node.turns(3 * PROBE_SECONDS)
    assert node.worker.names.count(f"statvfs {node.mountpoint}") == probes

    node.worker.answer()
    node.turns()
    assert not node.stuck()
    recovered = node.filesystem()
    assert not recovered.device_error and recovered.checked_at == node.clocks.wall


def test_a_mountpoint_that_is_gone_is_not_reported_until_it_is_back(tmp_path: Path) -> None:
    """Unmounted and removed: not a device error (nothing is hung), just no longer there."""
    node = _node(tmp_path)
    read = node.filesystem()
    moved = tmp_path / "moved"
    node.mountpoint.rename(moved)
    node.turns(PROBE_SECONDS)
    assert node.filesystem() is None
    moved.rename(node.mountpoint)
    node.turns(PROBE_SECONDS)
    back = node.filesystem()
    assert not back.device_error and back.checked_at > read.checked_at


def test_an_inotify_mounts_probe_confirms_its_tiers_views(tmp_path: Path) -> None:
    """An inotify-watched tier is not read while nothing changes: the probe's answer says its
    view is current."""
    node = _node(tmp_path, watch="inotify")
    (tier,) = node.scanner._sources["j0"].tiers
    assert tier.first_done
    node.turns(PROBE_SECONDS)
    assert tier.confirmed == node.clocks.wall


def test_a_mount_not_yet_read_is_not_reported_as_empty() -> None:
    target = Target("/m", "dev", "fs")
    assert capacity_of(ProbeState(target, "/m"), stuck=False) is None
    hung = capacity_of(ProbeState(target, "/m"), stuck=True)
    assert hung is not None and hung.device_error and hung.checked_at == 0.0
    last = Reading(1000, 400, 50.0)
    failed = capacity_of(ProbeState(target, "/m", last, failed="Stale file handle"), False)
    assert failed.device_error and (failed.size_bytes, failed.checked_at) == (1000, 50.0)
    assert capacity_of(ProbeState(None, "/some/job"), stuck=True) is None  # no mount to name
