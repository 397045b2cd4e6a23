"""Opening files and directories under watched paths: read-only, never through a symlink, never
blocking.

Checkpoint trees on shared filesystems are written by many users. A FIFO or device planted where
a marker file should be must not hang the exporter, and a symlink must not lead it out of the
tree; every open of a watched file or directory goes through here.
"""

from __future__ import annotations

import errno
import os
import stat

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


# Directories: read-only; below a configured root never entered through a symlink, even one
# swapped in after the lstat that found the directory (the root itself may be a symlink).
_ROOT_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
_DIRECTORY_FLAGS = _ROOT_DIRECTORY_FLAGS | os.O_NOFOLLOW


class NotRegularFile(OSError):
    pass


class NotBeneath(OSError):
    """A name resolved beneath a directory leads through a symlink (or up, out of it)."""

    def __init__(self, component: str, reason: str) -> None:
        super().__init__(errno.ELOOP, f"{component} {reason}")
        self.component = component


def open_regular(path: str | os.PathLike[str], dir_fd: int | None = None) -> int:
    """A read-only descriptor of a regular file; refuses symlinks, FIFOs and devices.
    With ``dir_fd``, ``path`` is a name in that directory (nothing above it is resolved again)."""
    fd = os.open(path, _FLAGS, dir_fd=dir_fd)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"{os.fspath(path)} is not a regular file")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_directory(
    path: str | os.PathLike[str], follow_symlink: bool = False, dir_fd: int | None = None
) -> int:
    """A read-only descriptor of a directory, to list it and stat its entries relative to it.
    With ``dir_fd``, ``path`` is a name in that directory: a tree walked this way cannot be led
    out of its root by a directory swapped for a symlink between two looks."""
    flags = _ROOT_DIRECTORY_FLAGS if follow_symlink else _DIRECTORY_FLAGS
    return os.open(path, flags, dir_fd=dir_fd)


def read_bytes(path: str | os.PathLike[str], limit: int, dir_fd: int | None = None) -> bytes:
    """The whole file, refusing one larger than ``limit`` bytes."""
    fd = open_regular(path, dir_fd)
    try:
        return read_open(fd, limit, os.fspath(path))
    finally:
        os.close(fd)


def read_open(fd: int, limit: int, name: str) -> bytes:
    """The whole of an open file, refusing one larger than ``limit`` bytes (also one that grows
    past it while read)."""
    size = os.fstat(fd).st_size
    if size > limit:
        raise ValueError(f"{name} is {size} bytes, above the {limit}-byte limit")
    chunks, remaining = [], limit + 1
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    data = b"".join(chunks)
    if len(data) > limit:
        raise ValueError(f"{name} grew above the {limit}-byte limit while read")
    return data


# --- names read inside a checkpoint ---------------------------------------------------------
# A shard's relative_path, an index's weight_map, a manifest's file names: a tenant writes them,
# and may plant a symlink anywhere along them. They are resolved beneath the directory that
# holds them, one component at a time, never through a symlink: nothing outside is sized,
# read, or even looked up (a link into a hung mount costs nothing).


def stat_regular_beneath(relative: str, dir_fd: int) -> os.stat_result:
    """``lstat`` of the regular file ``relative`` below ``dir_fd``; NotBeneath for a symlink on
    the way or at the end, NotRegularFile for anything else that is not a regular file."""
    parent, name = _parent_beneath(relative, dir_fd)
    try:
        status = os.lstat(name, dir_fd=parent)
    finally:
        os.close(parent)
    if stat.S_ISLNK(status.st_mode):
        raise NotBeneath(relative, "is a symlink: not followed")
    if not stat.S_ISREG(status.st_mode):
        raise NotRegularFile(f"{relative} is not a regular file")
    return status


def open_regular_beneath(relative: str, dir_fd: int) -> int:
    """``open_regular`` of ``relative`` below ``dir_fd``, reached as ``stat_regular_beneath``."""
    parent, name = _parent_beneath(relative, dir_fd)
    try:
        return open_regular(name, parent)
    except OSError as error:
        if error.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise NotBeneath(relative, "is a symlink: not followed") from None
        raise
    finally:
        os.close(parent)


def _parent_beneath(relative: str, dir_fd: int) -> tuple[int, str]:
    """A descriptor of the directory holding ``relative`` below ``dir_fd``, each directory on
    the way opened relative to the one before with O_NOFOLLOW, and the last component."""
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise NotBeneath(relative, "leads out of its directory: not followed")
    *directories, name = parts or ["."]
    current = os.dup(dir_fd)  # closed as each step's child replaces it; the caller's stays
    try:
        for depth, part in enumerate(directories, 1):
            try:
                child = open_directory(part, dir_fd=current)
            except OSError as error:
                # O_NOFOLLOW | O_DIRECTORY on a symlink: ELOOP or ENOTDIR, by kernel.
                if error.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(
                    os.lstat(part, dir_fd=current).st_mode
                ):
                    walked = "/".join(directories[:depth])
                    raise NotBeneath(walked, "is a symlink: not followed") from None
                raise
            os.close(current)
            current = child
    except BaseException:
        os.close(current)
        raise
    return current, name
