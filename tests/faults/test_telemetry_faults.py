"""Filesystem capacity with a hung mount: a real FUSE mount whose server never answers, so
statvfs on it blocks in the kernel exactly as on a hung NFS server."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_exporter.config import Config, PathsConfig, TelemetryConfig
from checkpoint_exporter.sources.telemetry.filesystem import Capacity
from checkpoint_exporter.sources.telemetry.node import NodeTelemetry
from checkpoint_exporter.sources.watch import Mount
from tests.conftest import REPO, wait_for
from tests.faults.hungfs import hung_mount
from tests.helpers.node import FakeNode

pytestmark = [pytest.mark.root]  # mounts a hung FUSE filesystem and a tmpfs

libc = ctypes.CDLL(None, use_errno=True)
MNT_DETACH = 2
MiB = 1 << 20


def _mount(source: str, target: Path, fstype: str, options: str) -> None:
    if libc.mount(source.encode(), str(target).encode(), fstype.encode(), 0, options.encode()):
        error = ctypes.get_errno()
        raise OSError(error, f"mount {fstype} on {target}: {os.strerror(error)}")


@pytest.fixture
def hung(tmp_path: Path) -> Iterator[Path]:
    """A FUSE mount nobody serves: lookups and statvfs on it block until the fixture ends."""
    with hung_mount(tmp_path / "hung") as mountpoint:
        yield mountpoint


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB filesystem nobody else writes to."""
    mountpoint = tmp_path / "fresh"
    mountpoint.mkdir()
    _mount("tmpfs", mountpoint, "tmpfs", "size=16m")
    try:
        yield mountpoint
    finally:
        libc.umount2(str(mountpoint).encode(), MNT_DETACH)


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return FakeNode(tmp_path / "node", tmp_path / "node-ckpt").build()


def _config(node: FakeNode) -> Config:
    return Config(
        paths=PathsConfig(procfs=node.procfs, sysfs=node.sysfs),
        telemetry=TelemetryConfig(gpu="off"),
    )


def _blocked_on_fuse(pid: int) -> bool:
    """Whether a thread of the process waits in the kernel for a FUSE answer."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "wchan").read_text().startswith("fuse"):
                return True
        except OSError:
            continue  # the thread ended
    return False


def test_a_hung_mount_reports_device_error_and_the_others_stay_fresh(
    tmp_path: Path, node: FakeNode, hung: Path, tmpfs: Path
) -> None:
    # "went-hung" answers first, then hangs: statvfs of a mountpoint follows a symlink, which
    # is then turned towards the hung mount. "hung" never answers at all.
    went_hung = tmp_path / "went-hung"
    went_hung.symlink_to(tmpfs)
    telemetry = NodeTelemetry(_config(node), capacity_interval=0.1, capacity_budget=0.3)
    for mountpoint in (tmpfs, hung, went_hung):
        telemetry.place(str(mountpoint / "job"), Mount(str(mountpoint), "dev", "fs", "0:99"))
    went = str(went_hung)
    telemetry.start()
    try:

        def state() -> dict[str, Capacity]:
            return {c.mountpoint: c for c in telemetry.capacity.capacities()}

        before = wait_for(lambda: (s := state())[went].checked_at > 0 and s)
        assert before[went].size_bytes == 16 * MiB and not before[went].device_error
        (tmp_path / "turn").symlink_to(hung / "x")
        os.replace(tmp_path / "turn", went_hung)
        fresh_at = state()[str(tmpfs)].checked_at

        def settled() -> dict[str, Capacity] | None:
            s = state()
            stuck = s[went].device_error and s[str(hung)].device_error
            return s if stuck and s[str(tmpfs)].checked_at > fresh_at else None

        after = wait_for(settled)
        assert after[str(tmpfs)].size_bytes == 16 * MiB and not after[str(tmpfs)].device_error
        # The last values read stay, as of when they were read.
        last = after[went]
        assert (last.size_bytes, last.avail_bytes, last.checked_at) == (
            before[went].size_bytes, before[went].avail_bytes, before[went].checked_at
        )  # fmt: skip
        assert after[str(hung)].checked_at == 0.0
        # The rest of the node is sampled as before: filesystems are no part of the sampler.
        assert dict(telemetry.available())["network"]

        # Many intervals later the fresh mount is still read, and each stuck mount still has
        # its one probe blocked: none is piled on it.
        fresh_at = after[str(tmpfs)].checked_at
        wait_for(lambda: state()[str(tmpfs)].checked_at > fresh_at + 0.5)
        probes = [t.name for t in threading.enumerate() if t.name.startswith("statvfs ")]
        assert sorted(probes) == sorted(f"statvfs {m}" for m in (hung, went_hung))
    finally:
        telemetry.stop()
    # stop() returned while both probes still wait in the kernel (they end when the hung mount
    # is aborted, after the test): it waited for neither.
    blocked = [t for t in threading.enumerate() if t.name.startswith("statvfs ")]
    assert sorted(t.name for t in blocked if t.is_alive()) == sorted(probes)


CHILD = """
import signal, sys, threading
from pathlib import Path
from checkpoint_exporter.config import Config, PathsConfig, TelemetryConfig
from checkpoint_exporter.sources.telemetry.node import NodeTelemetry
from checkpoint_exporter.sources.watch import Mount

procfs, sysfs, hung = sys.argv[1:]
asked = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: asked.set())
paths = PathsConfig(procfs=Path(procfs), sysfs=Path(sysfs))
telemetry = NodeTelemetry(Config(paths=paths, telemetry=TelemetryConfig(gpu="off")))
telemetry.place(hung, Mount(hung, "hungfs", "fuse", "0:99"))
telemetry.start()
print("started", flush=True)
asked.wait()
telemetry.stop()
"""


def test_a_process_with_a_mount_hung_exits_on_sigterm(node: FakeNode, hung: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(node.procfs), str(node.sysfs), str(hung)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        ready, _, _ = select.select([child.stdout], [], [], 15)
        assert ready and child.stdout.readline() == "started\n"
        wait_for(lambda: _blocked_on_fuse(child.pid))  # its statvfs probe is stuck in the kernel
        child.send_signal(signal.SIGTERM)
        try:  # a hang guard, not a speed claim: stop() waits for no probe (the test above)
            returncode = child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("still running 30 s after SIGTERM, with a mount hung")
        assert returncode == 0
    finally:
        if child.poll() is None:
            child.kill()  # a wait for FUSE is killable
            child.wait()
        child.stdout.close()
