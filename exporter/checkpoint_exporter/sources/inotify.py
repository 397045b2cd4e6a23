"""One inotify instance for every watched tree, through libc: changes are reported per key.

Why not a library: a process may open only ``fs.inotify.max_user_instances`` (128) instances,
and a watcher that opens one per tree runs out at the 129th job; and when
``fs.inotify.max_user_watches`` runs out below a watched root, a watcher that drops the failed
subdirectory silently goes blind there. Here every failure is reported: ``watch`` returns why it
could not, and ``on_lost`` names a key whose tree grew past the limit, or every key when the
reader itself fails, so the scanner polls them.

Watches heal: a root directory removed or moved away stays registered and is watched again as
soon as its path is a directory again. Watches are steered by no tenant: each directory is
opened one component at a time below its root without following symlinks, and watched through
its descriptor, so a directory swapped for a symlink cannot spread watches outside the root.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import select
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from checkpoint_exporter.sources import fsread

log = logging.getLogger(__name__)

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_MASK_ADD = 0x20000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# IN_ONLYDIR and no IN_DONT_FOLLOW: every watch is added on /proc/self/fd/<fd> of a directory
# opened without following symlinks; IN_DONT_FOLLOW would stop at that magic link itself, and
# following it leads to exactly the directory opened, never to a name looked up again.
# IN_MODIFY too: a file that grows after it appeared (a copy across filesystems, a single-file
# checkpoint written in place) or a pointer rewritten in place changes no directory's mtime; the
# event names the file, and the scanner re-stats just that file. The kernel merges repeated
# identical events, and the scanner coalesces what is left into one pass per 0.1 s.
MASK = (
    IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
    | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK
)  # fmt: skip
_NEW_DIRECTORY = IN_CREATE | IN_MOVED_TO
# A missing root is awaited in the nearest directory above it that exists: its return (or that
# of the next directory on the way to it) is an event there, not a look every
# RETRY_MISSING_SECONDS for as long as it is gone (a discovered job's deleted directory stays
# registered until forget_after). IN_MASK_ADD: that directory may be watched already, with MASK.
_AWAIT_MASK = _NEW_DIRECTORY | IN_ONLYDIR | IN_MASK_ADD
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len
# How often a missing root that cannot be awaited (an operator's symlink, whose target may come
# back anywhere; a directory above it unreadable) is looked for again: one failed open() per
# such root and look, and a recreated root is watched well within a second.
RETRY_MISSING_SECONDS = 0.25


class LimitReached(OSError):
    pass


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


def _limit_message(code: int) -> str:
    if code == errno.ENOSPC:
        return "inotify watch limit reached (sysctl fs.inotify.max_user_watches)"
    if code == errno.EMFILE:
        return "inotify instance limit reached (sysctl fs.inotify.max_user_instances)"
    return f"inotify: {os.strerror(code)}"


@dataclass(frozen=True)
class _Root:
    """One watched tree; a key (a job) may have several, one per tier."""

    key: str
    path: bytes
    recursive: bool
    max_depth: int
    follow_symlink: bool  # the root itself may be a symlink (below it, never)


@dataclass
class _Watch:
    path: bytes
    roots: set[_Root] = field(default_factory=set)
    tops: set[_Root] = field(default_factory=set)  # the roots whose own directory this is
    # missing roots awaited here -> the name below this directory on the way to each
    awaiting: dict[_Root, bytes] = field(default_factory=dict)


class Watcher:
    """Marks keys (jobs) changed; never reads files. Thread-safe; events on one thread."""

    def __init__(
        self,
        on_change: Callable[[str, str], None],
        on_overflow: Callable[[str | None], None],
        on_lost: Callable[[str, str], None] | None = None,
    ) -> None:
        self._on_change = on_change
        self._on_overflow = on_overflow
        self._on_lost = on_lost
        self._libc = _libc()
        self._fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        self._init_error = _limit_message(ctypes.get_errno()) if self._fd < 0 else None
        self._watches: dict[int, _Watch] = {}
        self._awaited: dict[_Root, int] = {}  # missing root -> the watch awaiting it
        self._missing: set[_Root] = set()  # gone, awaited nowhere: looked for on a timer
        self._failure: str | None = None  # why the reader stopped; no watch is read after it
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inotify", daemon=True)

    @property
    def watch_count(self) -> int:
        """inotify watches held, those of parents awaiting a missing root included."""
        with self._lock:
            return len(self._watches)

    def start(self) -> None:
        if self._fd >= 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        os.close(self._wake_r)
        os.close(self._wake_w)

    # --- registration ----------------------------------------------------------------------

    def watch(
        self,
        key: str,
        path: str,
        recursive: bool = True,
        max_depth: int = 64,
        follow_root_symlink: bool = True,
    ) -> str | None:
        """Watch ``path`` (and its subdirectories) for ``key``; None, or why it cannot.
        ``follow_root_symlink``: whether ``path`` itself may be a symlink (an operator's choice,
        not a tenant's); below it none is ever followed."""
        if self._init_error is not None:
            return self._init_error
        root = _Root(
            key, os.fsencode(path), recursive, max_depth if recursive else 0, follow_root_symlink
        )
        with self._lock:
            if self._failure is not None:
                return self._failure
            try:
                self._add_tree(root, [], root.max_depth)
            except LimitReached as error:
                self._remove(lambda r: r == root)
                return str(error)
            except OSError as error:
                self._remove(lambda r: r == root)
                return f"cannot watch {path}: {error.strerror or error}"
            self._stop_awaiting(root)
        return None

    def unwatch(self, key: str) -> None:
        with self._lock:
            self._remove(lambda root: root.key == key)

    def _add_tree(self, root: _Root, below: list[bytes], depth_left: int) -> None:
        """Watch the directory ``below`` the root and, ``depth_left`` levels down, its
        subdirectories. Only a failure on that directory itself or a limit raises: a
        subdirectory that vanished meanwhile, or became a symlink, is simply not watched."""
        directory = fsread.open_directory(root.path, follow_symlink=root.follow_symlink)
        try:
            for name in below:
                child = fsread.open_directory(name, dir_fd=directory)
                os.close(directory)
                directory = child
            path = os.path.join(root.path, *below)
            watch = self._watches[self._add(directory, path, MASK)]
            watch.roots.add(root)
            if not below:
                watch.tops.add(root)
            self._add_subdirectories(root, directory, path, depth_left)
        finally:
            os.close(directory)

    def _add_subdirectories(
        self, root: _Root, directory: int, path: bytes, depth_left: int
    ) -> None:
        if depth_left <= 0:
            return
        try:
            with os.scandir(directory) as listing:
                names = [e.name for e in listing if e.is_dir(follow_symlinks=False)]
        except OSError:
            return  # vanished or unreadable: the scanner reports unreadable subtrees
        for name in names:
            try:
                # Relative to the parent's descriptor, never following a symlink: a directory
                # swapped for one since the listing is not entered.
                child = fsread.open_directory(name, dir_fd=directory)
            except OSError:
                continue
            try:
                child_path = os.path.join(path, os.fsencode(name))
                self._watches[self._add(child, child_path, MASK)].roots.add(root)
                self._add_subdirectories(root, child, child_path, depth_left - 1)
            except LimitReached:
                raise
            except OSError:
                continue
            finally:
                os.close(child)

    def _add(self, directory: int, path: bytes, mask: int) -> int:
        wd = self._libc.inotify_add_watch(self._fd, b"/proc/self/fd/%d" % directory, mask)
        if wd < 0:
            code = ctypes.get_errno()
            if code in (errno.ENOSPC, errno.ENOMEM):
                raise LimitReached(code, _limit_message(errno.ENOSPC))
            raise OSError(code, os.strerror(code), os.fsdecode(path))
        watch = self._watches.setdefault(wd, _Watch(path))
        watch.path = path  # the same directory under a new name after a rename: same wd
        return wd

    def _remove(self, which: Callable[[_Root], bool]) -> None:
        self._missing = {root for root in self._missing if not which(root)}
        self._awaited = {root: wd for root, wd in self._awaited.items() if not which(root)}
        for wd, watch in list(self._watches.items()):
            watch.roots = {root for root in watch.roots if not which(root)}
            watch.tops = {root for root in watch.tops if not which(root)}
            watch.awaiting = {r: name for r, name in watch.awaiting.items() if not which(r)}
            self._release(wd)

    def _release(self, wd: int) -> None:
        """Give a watch back once no root is watched or awaited through it."""
        watch = self._watches.get(wd)
        if watch is not None and not watch.roots and not watch.awaiting:
            del self._watches[wd]
            self._libc.inotify_rm_watch(self._fd, wd)

    def _await_or_heal(self, root: _Root, lost: dict[str, str]) -> bool:
        """Watch a missing root again if its directory is back, else await it (lock held);
        True when healed."""
        # Each turn awaits one directory deeper: bounded by the depth of the path.
        for _ in range(root.path.count(b"/") + 1):
            if self._heal(root, lost):
                return True
            if root.key in lost:
                return False
            awaited = self._await(root)
            if awaited is None or not os.path.lexists(awaited):
                return False
            # It appeared before the await's watch was there: no event will say so.
        return False

    def _await(self, root: _Root) -> bytes | None:
        """Await a missing root in the nearest directory above it that exists; the path of the
        directory awaited there, or None when the root is looked for on the timer instead."""
        self._stop_awaiting(root)
        if root.follow_symlink and os.path.islink(root.path):
            self._missing.add(root)  # an operator's symlink: its target may come back anywhere
            return None
        above, name = os.path.split(os.path.normpath(root.path))
        while True:
            try:
                directory = fsread.open_directory(above, follow_symlink=True)
                break
            except OSError as error:
                if error.errno not in (errno.ENOENT, errno.ENOTDIR) or above == b"/":
                    self._missing.add(root)
                    return None
                above, name = os.path.split(above)
        try:
            wd = self._add(directory, above, _AWAIT_MASK)
            self._watches[wd].awaiting[root] = name
            self._awaited[root] = wd
        except OSError:
            self._missing.add(root)
            return None
        finally:
            os.close(directory)
        return os.path.join(above, name)

    def _heal(self, root: _Root, lost: dict[str, str]) -> bool:
        """Watch a missing root again if its directory is back (lock held)."""
        try:
            self._add_tree(root, [], root.max_depth)
        except LimitReached as error:
            self._remove(lambda r: r == root)
            lost[root.key] = str(error)
            return False
        except OSError:
            return False  # not back yet (or, for a tenant's root, a symlink now)
        self._stop_awaiting(root)
        log.info("watch of %s restored: %s is a directory again", root.key, root.path)
        return True

    def _stop_awaiting(self, root: _Root) -> None:
        self._missing.discard(root)
        wd = self._awaited.pop(root, None)
        if wd is not None and wd in self._watches:
            self._watches[wd].awaiting.pop(root, None)
            self._release(wd)

    # --- events ------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._read_events()
        except Exception as error:  # whatever stopped the reader: say so, give its jobs up
            self._fail(error)

    def _read_events(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        next_retry = 0.0
        while not self._stop.is_set():
            timeout = None
            if self._missing:
                timeout = max(0.0, next_retry - time.monotonic()) * 1000
            try:
                ready = poller.poll(timeout)
            except InterruptedError:
                continue
            if self._stop.is_set():
                return
            if self._missing and time.monotonic() >= next_retry:
                next_retry = time.monotonic() + RETRY_MISSING_SECONDS
                self._retry_missing()
            if any(fd == self._fd for fd, _ in ready):
                try:
                    data = os.read(self._fd, 1 << 16)
                except BlockingIOError:
                    continue
                self._dispatch(data)

    def _fail(self, error: Exception) -> None:
        """The reader cannot go on: every key it watched is given up, so that the scanner polls
        those jobs instead of leaving them blind in silence; later ``watch`` calls say why."""
        reason = f"inotify reader failed: {type(error).__name__}: {error}"
        log.error("%s; every watched job falls back to polling", reason, exc_info=error)
        with self._lock:
            self._failure = reason
            keys = {root.key for root in self._missing}
            for watch in self._watches.values():
                keys |= {root.key for root in (*watch.roots, *watch.awaiting)}
            self._watches.clear()
            self._awaited.clear()
            self._missing.clear()
        if self._on_lost is None:
            return
        for key in sorted(keys):
            try:
                self._on_lost(key, reason)
            except Exception:
                log.exception("giving up the watch of %s failed", key)

    def _retry_missing(self) -> None:
        """Look again for the missing roots awaited nowhere (reader thread)."""
        lost: dict[str, str] = {}
        with self._lock:
            healed = [root for root in list(self._missing) if self._heal(root, lost)]
        self._report_lost(lost)
        for root in healed:
            self._report_healed(root)

    def _report_healed(self, root: _Root) -> None:
        # Whatever was written into the tree before its watch came back raised no event, and
        # the tree may be entirely new: only a full re-read of the root finds it.
        self._on_change(root.key, os.fsdecode(root.path))

    def _dispatch(self, data: bytes) -> None:
        # Every distinct path per key: the scanner re-stats each file an event named (a pointer
        # rewritten in place is seen only this way). Insertion-ordered, one call per path.
        changed: dict[str, dict[bytes, None]] = {}
        lost: dict[str, str] = {}
        healed: list[_Root] = []
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            name = data[offset + _HEADER.size : offset + _HEADER.size + length].rstrip(b"\0")
            offset += _HEADER.size + length
            if mask & IN_Q_OVERFLOW:
                self._on_overflow(None)
                continue
            with self._lock:
                watch = self._watches.get(wd)
                if watch is None:
                    continue
                if mask & IN_IGNORED:  # the directory is gone (deleted, unmounted)
                    del self._watches[wd]
                path = os.path.join(watch.path, name) if name else watch.path
                roots = set(watch.roots)
                # A root's own directory went away or moved (its watches would follow it out
                # of place), or a directory awaiting roots did: those roots are awaited anew
                # (or watched again at once, when back already: rm -rf; mkdir).
                if mask & (IN_IGNORED | IN_MOVE_SELF):
                    for root in [*watch.tops, *watch.awaiting]:
                        if root in watch.tops:
                            self._remove(lambda r, gone=root: r == gone)
                            log.info("watch of %s lost its root %s", root.key, root.path)
                        if self._await_or_heal(root, lost):
                            healed.append(root)
                elif mask & IN_ISDIR and mask & _NEW_DIRECTORY:
                    for root in roots:
                        reason = self._follow_new_directory(root, path)
                        if reason is not None:
                            lost[root.key] = reason
                    for root, awaited in list(watch.awaiting.items()):
                        if awaited == name and self._await_or_heal(root, lost):
                            healed.append(root)
            for root in roots:
                changed.setdefault(root.key, {})[path] = None
        self._report_lost(lost)
        for key, paths in changed.items():
            for path in paths:
                self._on_change(key, os.fsdecode(path))
        for root in healed:
            self._report_healed(root)

    def _report_lost(self, lost: dict[str, str]) -> None:
        for key, reason in lost.items():
            log.warning("watch of %s lost part of its tree: %s", key, reason)
            if self._on_lost is not None:
                self._on_lost(key, reason)

    def _follow_new_directory(self, root: _Root, path: bytes) -> str | None:
        if not root.recursive:
            return None
        relative = os.path.relpath(path, root.path)
        below = relative.split(b"/")
        if below[0] == b"..":
            return None  # named through another root's spelling of a shared directory
        depth_left = root.max_depth - len(below)
        if depth_left < 0:
            return None
        try:
            self._add_tree(root, below, depth_left)
        except LimitReached as error:
            return str(error)
        except OSError:
            pass  # created and gone again already, or a symlink now
        return None
