"""A hung filesystem for tests: a FUSE mount whose server never answers.

Every lookup, stat or statvfs at or below the mount point blocks in the kernel (killably),
exactly like a hard NFS mount whose server went away; so does a listing of the parent directory
that stats its entries. Closing the /dev/fuse descriptor aborts the connection (blocked calls
then fail with ENOTCONN) and the mount is detached: ``hung_mount`` always does both on exit, so
a failing test leaves nothing hanging. Needs root and /dev/fuse.

    def test_x(hungfs: Path) -> None:   # tmp_path / "hung", hung for the test's duration

A filesystem that hangs while the exporter runs (the usual case: an NFS server going away) is a
``tmpfs`` the exporter starts on, with ``hung_mount`` stacked over it later: the mount table the
exporter read names that mount point, and every lookup below it then hangs.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: bytes, mountpoint: Path, fstype: bytes, options: bytes) -> None:
    if _libc.mount(source, os.fsencode(mountpoint), fstype, 0, options) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"cannot mount {fstype.decode()} at {mountpoint}: {os.strerror(code)}")


@contextmanager
def hung_mount(mountpoint: Path) -> Iterator[Path]:
    """A FUSE filesystem nobody serves at ``mountpoint`` (made if missing; a mount already
    there is covered), until exit."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    fd = os.open("/dev/fuse", os.O_RDWR)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
    try:
        _mount(b"hungfs", mountpoint, b"fuse", options)
    except OSError:
        os.close(fd)
        raise
    try:
        yield mountpoint
    finally:
        os.close(fd)  # blocked calls return ENOTCONN
        _libc.umount2(os.fsencode(mountpoint), MNT_DETACH)


@contextmanager
def tmpfs(mountpoint: Path) -> Iterator[Path]:
    """A small tmpfs at ``mountpoint`` (made here): a filesystem of its own, until exit."""
    mountpoint.mkdir(parents=True)
    _mount(b"tmpfs", mountpoint, b"tmpfs", b"size=16m")
    try:
        yield mountpoint
    finally:
        _libc.umount2(os.fsencode(mountpoint), MNT_DETACH)


@pytest.fixture
def hungfs(tmp_path: Path) -> Iterator[Path]:
    with hung_mount(tmp_path / "hung") as mountpoint:
        yield mountpoint
