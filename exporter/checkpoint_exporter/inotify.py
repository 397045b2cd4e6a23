"""One inotify instance for every watched tree, through libc: changes are reported per key.

Why not a library: a process may open only ``fs.inotify.max_user_instances`` (128) instances,
and a watcher that opens one per tree runs out at the 129th job; and when
``fs.inotify.max_user_watches`` runs out below a watched root, a watcher that drops the failed
subdirectory silently goes blind there. Here every failure is reported: ``watch`` returns why it
could not, and ``on_lost`` names a key whose tree grew past the limit, so the scanner polls it.
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
from collections.abc import Callable
from dataclasses import dataclass, field

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
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# IN_MODIFY too: a file that grows after it appeared (a copy across filesystems, a single-file
# checkpoint written in place) or a pointer rewritten in place changes no directory's mtime; the
# event names the file, and the scanner re-stats just that file. The kernel merges repeated
# identical events, and the scanner coalesces what is left into one pass per 0.1 s.
MASK = (
    IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
    | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK
)  # fmt: skip
_NEW_DIRECTORY = IN_CREATE | IN_MOVED_TO
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len


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


@dataclass
class _Watch:
    path: bytes
    roots: set[_Root] = field(default_factory=set)


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
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inotify", daemon=True)

    @property
    def watch_count(self) -> int:
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

    def watch(self, key: str, path: str, recursive: bool = True, max_depth: int = 64) -> str | None:
        """Watch ``path`` (and its subdirectories) for ``key``; None, or why it cannot."""
        if self._init_error is not None:
            return self._init_error
        root = _Root(key, os.fsencode(path), recursive, max_depth if recursive else 0)
        with self._lock:
            try:
                self._add_tree(root, root.path, root.max_depth)
            except LimitReached as error:
                self._remove(lambda r: r == root)
                return str(error)
            except OSError as error:
                self._remove(lambda r: r == root)
                return f"cannot watch {path}: {error.strerror or error}"
        return None

    def unwatch(self, key: str) -> None:
        with self._lock:
            self._remove(lambda root: root.key == key)

    def _add_tree(self, root: _Root, top: bytes, depth_left: int) -> None:
        """Watch ``top`` and, ``depth_left`` levels down, its subdirectories (never through a
        symlink). Only a failure on ``top`` itself or a limit raises: a subdirectory that
        vanished meanwhile is simply not watched."""
        self._add(root, top)
        if depth_left <= 0:
            return
        stack = [(top, depth_left)]
        while stack:
            directory, left = stack.pop()
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue  # vanished or unreadable: the scanner reports unreadable subtrees
            for entry in entries:
                try:
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    self._add(root, entry.path)
                except LimitReached:
                    raise
                except OSError:
                    continue
                if left > 1:
                    stack.append((entry.path, left - 1))

    def _add(self, root: _Root, path: bytes) -> None:
        wd = self._libc.inotify_add_watch(self._fd, path, MASK)
        if wd < 0:
            code = ctypes.get_errno()
            if code in (errno.ENOSPC, errno.ENOMEM):
                raise LimitReached(code, _limit_message(errno.ENOSPC))
            raise OSError(code, os.strerror(code), os.fsdecode(path))
        watch = self._watches.setdefault(wd, _Watch(path))
        watch.path = path  # the same directory under a new name after a rename: same wd
        watch.roots.add(root)

    def _remove(self, which: Callable[[_Root], bool]) -> None:
        for wd, watch in list(self._watches.items()):
            watch.roots = {root for root in watch.roots if not which(root)}
            if not watch.roots:
                del self._watches[wd]
                self._libc.inotify_rm_watch(self._fd, wd)

    # --- events ------------------------------------------------------------------------------

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._stop.is_set():
            try:
                ready = poller.poll()
            except InterruptedError:
                continue
            if self._stop.is_set():
                return
            if any(fd == self._fd for fd, _ in ready):
                try:
                    data = os.read(self._fd, 1 << 16)
                except BlockingIOError:
                    continue
                except OSError as error:
                    log.error("reading inotify events failed: %s", error)
                    return
                try:
                    self._dispatch(data)
                except Exception:  # a callback's bug must not stop every job's watch
                    log.exception("handling inotify events failed")

    def _dispatch(self, data: bytes) -> None:
        # Every distinct path per key: the scanner re-stats each file an event named (a pointer
        # rewritten in place is seen only this way). Insertion-ordered, one call per path.
        changed: dict[str, dict[bytes, None]] = {}
        lost: dict[str, str] = {}
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
                if mask & IN_ISDIR and mask & _NEW_DIRECTORY:
                    for root in roots:
                        reason = self._follow_new_directory(root, path)
                        if reason is not None:
                            lost[root.key] = reason
            for root in roots:
                changed.setdefault(root.key, {})[path] = None
        for key, reason in lost.items():
            log.warning("watch of %s lost part of its tree: %s", key, reason)
            if self._on_lost is not None:
                self._on_lost(key, reason)
        for key, paths in changed.items():
            for path in paths:
                self._on_change(key, os.fsdecode(path))

    def _follow_new_directory(self, root: _Root, path: bytes) -> str | None:
        if not root.recursive:
            return None
        relative = os.path.relpath(path, root.path)
        depth_left = root.max_depth - (relative.count(b"/") + 1)
        if depth_left < 0:
            return None
        try:
            self._add_tree(root, path, depth_left)
        except LimitReached as error:
            return str(error)
        except OSError:
            pass  # created and gone again already
        return None
