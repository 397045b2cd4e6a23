"""Filesystem capacity with a hung mount: a real FUSE mount whose server never answers, stacked
over a filesystem the daemon started on, so its statvfs blocks in the kernel exactly as on a hung
NFS server. The statvfs is a task on the mount's own worker: the one stuck-mount detector says
the mount hangs, and its device error with it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from checkpoint_exporter.config import Config, JobConfig, Policy
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.daemon import discovery, health, placement, reads
from checkpoint_exporter.daemon.scanner import Scanner
from checkpoint_exporter.model import FilesystemState
from tests.conftest import wait_for
from tests.faults.hungfs import hung_mount, tmpfs

pytestmark = [pytest.mark.root]  # mounts a hung FUSE filesystem and two tmpfs

MiB = 1 << 20
STUCK = 1.0  # STUCK_SECONDS and PROBE_SECONDS, shortened so the test takes seconds, not minutes
PROBE = 0.2


@pytest.fixture
def short_timers(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (health, placement, reads, discovery):
        monkeypatch.setattr(module, "STUCK_SECONDS", STUCK)
    monkeypatch.setattr(health, "PROBE_SECONDS", PROBE)


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Two 16 MiB filesystems nobody else writes to: one stays fresh, the other will hang."""
    with ExitStack() as stack:
        yield (
            stack.enter_context(tmpfs(tmp_path / "fresh")),
            stack.enter_context(tmpfs(tmp_path / "went-hung")),
        )


def test_a_hung_mount_reports_device_error_and_the_others_stay_fresh(
    tmp_path: Path, mounts: tuple[Path, Path], short_timers: None
) -> None:
    fresh, went = mounts
    jobs = []
    for mountpoint in (fresh, went):
        (mountpoint / "job").mkdir()
        jobs.append(JobConfig(mountpoint.name, mountpoint / "job", None, Policy(layout="dcp")))
    config = Config(spool=tmp_path / "spool", jobs=tuple(jobs))
    tracker = Tracker(config)
    scanner = Scanner(config, tracker, watcher_factory=None)  # inotify tiers: only probes read

    def state() -> dict[str, FilesystemState]:
        return {f.mountpoint: f for f in tracker.snapshot.filesystems}

    scanner.start()
    try:
        before = wait_for(lambda: len(s := state()) == 2 and s)
        assert before[str(went)].size_bytes == 16 * MiB and not before[str(went)].device_error
        with hung_mount(went):  # the server goes away
            fresh_at = state()[str(fresh)].checked_at

            def settled() -> dict[str, FilesystemState] | None:
                s = state()
                hung = s[str(went)].device_error
                return s if hung and s[str(fresh)].checked_at > fresh_at else None

            after = wait_for(settled)
            assert dict(tracker.snapshot.daemon.mounts)[str(went)]  # mount_stuck, the same
            assert after[str(fresh)].size_bytes == 16 * MiB
            assert not after[str(fresh)].device_error
            # The last values read stay, as of when they were read.
            last, first = after[str(went)], before[str(went)]
            assert (last.size_bytes, last.avail_bytes) == (first.size_bytes, first.avail_bytes)
            assert last.checked_at >= first.checked_at > 0

            # Many intervals later the fresh mount is still read, and the stuck mount still has
            # its one statvfs blocked: none is piled behind it.
            fresh_at = after[str(fresh)].checked_at
            wait_for(lambda: state()[str(fresh)].checked_at > fresh_at + 10 * PROBE)
            assert scanner._workers[str(went)]._tasks.empty()
            assert state()[str(went)] == last  # read no more, still in error
    finally:
        scanner.stop()
