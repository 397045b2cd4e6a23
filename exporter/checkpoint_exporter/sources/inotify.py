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

No directory is opened, and no watch added, under the lock or on the reader thread: below a
watched root a mount may hang (or a lookup be slow), and the kernel then waits in that call. The
lock guards the watch tables only, and the reader hands new directories and missing roots to a
thread per root; so one hung directory stalls only its own root, while every other ``watch``,
``unwatch``, event and ``stop`` goes on.
"""

from __future__ import annotations

import contextlib
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
# How long ``stop`` waits for the reader, which never touches a filesystem and so is woken at once.
STOP_JOIN_SECONDS = 0.5
STOPPED = "inotify watcher stopped"
# A root's follow-up work besides following a new directory (named by its path, as bytes): its
# directory (or the one it was awaited in) went away, or, missing, it is looked for on the timer.
_AWAIT = "await"
_RETRY = "retry"


class LimitReached(OSError):
    pass


class _Cancelled(Exception):
    """The root was unwatched, or the watcher stopped or failed, while its tree was being added."""


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
    """Marks keys (jobs) changed; never reads files. Thread-safe; callbacks on one thread."""

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
        self._lock = threading.Lock()  # the tables below; held for no filesystem call
        self._roots: set[_Root] = set()  # registered: watched, awaited, missing or being healed
        self._watches: dict[int, _Watch] = {}
        self._awaited: dict[_Root, int] = {}  # missing root -> the watch awaiting it
        self._missing: set[_Root] = set()  # gone, awaited nowhere: looked for on a timer
        self._pending: dict[_Root, dict[bytes | str, None]] = {}  # work queued per root thread
        self._reports: list[Callable[[], None]] = []  # callbacks the reader makes for the others
        # inotify_add_watch calls in flight outside the lock, and, while there are any, the
        # watches removed meanwhile (wd -> removal number): a call that found one of those got
        # a descriptor that names nothing by the time it is recorded.
        self._adding = 0
        self._removals = 0
        self._removed: dict[int, int] = {}
        self._failure: str | None = None  # why the reader stopped; no watch is read after it
        self._reading = False  # the reader thread runs: it uses the descriptors
        self._closed = False
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
            self._reading = True
            self._thread.start()

    def stop(self) -> None:
        """Returns at once, whatever hangs: the descriptors are closed by whichever thread
        lets go of them last (one adding a watch on a hung filesystem may never)."""
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            self._wake_reader()
        if self._thread.is_alive():
            self._thread.join(timeout=STOP_JOIN_SECONDS)
        with self._lock:
            self._close_if_unused()

    def _close_if_unused(self) -> None:
        """(lock held) Close the descriptors once stopped and no thread uses them: closed
        under a thread still using one, its number could name another file by then."""
        if self._stop.is_set() and not self._reading and not self._adding and not self._closed:
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
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
        not a tenant's); below it none is ever followed. What changes before it returns may
        raise no event: read the tree after it."""
        if self._init_error is not None:
            return self._init_error
        root = _Root(
            key, os.fsencode(path), recursive, max_depth if recursive else 0, follow_root_symlink
        )
        with self._lock:
            if self._failure is not None:
                return self._failure
            if self._stop.is_set():
                return STOPPED
            self._roots.add(root)
        try:
            self._add_tree(root, [], root.max_depth)
        except _Cancelled:
            with self._lock:  # unwatched meanwhile: nothing to report
                return self._failure or (STOPPED if self._stop.is_set() else None)
        except LimitReached as error:
            self._unwatch_root(root)
            return str(error)
        except OSError as error:
            self._unwatch_root(root)
            return f"cannot watch {path}: {error.strerror or error}"
        with self._lock:
            self._stop_awaiting(root)
        return None

    def unwatch(self, key: str) -> None:
        """Returns at once, even while a thread is stuck adding this key's watches: those are
        given back when it returns."""
        with self._lock:
            self._roots = {root for root in self._roots if root.key != key}
            self._drop(lambda root: root.key == key)

    def _unwatch_root(self, root: _Root) -> None:
        with self._lock:
            self._roots.discard(root)
            self._drop(lambda r: r == root)

    def _live(self, root: _Root) -> bool:
        """(lock held) Whether ``root``'s watches are still wanted."""
        return root in self._roots and self._failure is None and not self._stop.is_set()

    def _add_tree(self, root: _Root, below: list[bytes], depth_left: int) -> None:
        """Watch the directory ``below`` the root and, ``depth_left`` levels down, its
        subdirectories (lock not held). Only a failure on that directory itself or a limit
        raises: a subdirectory that vanished meanwhile, or became a symlink, is not watched."""
        directory = fsread.open_directory(root.path, follow_symlink=root.follow_symlink)
        try:
            for name in below:
                child = fsread.open_directory(name, dir_fd=directory)
                os.close(directory)
                directory = child
            path = os.path.join(root.path, *below)
            self._add(directory, path, MASK, root, top=not below)
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
                self._add(child, child_path, MASK, root)
                self._add_subdirectories(root, child, child_path, depth_left - 1)
            except LimitReached:
                raise
            except OSError:
                continue
            finally:
                os.close(child)

    def _add(
        self,
        directory: int,
        path: bytes,
        mask: int,
        root: _Root,
        top: bool = False,
        awaiting: bytes | None = None,
    ) -> None:
        """Watch an open directory for ``root`` (lock not held): the system call outside the
        lock, which may wait on the filesystem, then the tables under it."""
        while True:
            with self._lock:
                if not self._live(root):
                    raise _Cancelled
                self._adding += 1
                removals_before = self._removals
            wd = self._libc.inotify_add_watch(self._fd, b"/proc/self/fd/%d" % directory, mask)
            code = ctypes.get_errno()
            with self._lock:
                self._adding -= 1
                try:
                    # Removed since this call found it (given up by another root, or its
                    # directory gone): the kernel has no such watch now; a new call makes one.
                    if wd >= 0 and self._removed.get(wd, -1) < removals_before:
                        self._claim(wd, path, root, top, awaiting)
                        return
                finally:
                    if not self._adding:
                        self._removed.clear()
                        self._close_if_unused()
            if wd < 0:
                if code in (errno.ENOSPC, errno.ENOMEM):
                    raise LimitReached(code, _limit_message(errno.ENOSPC))
                raise OSError(code, os.strerror(code), os.fsdecode(path))

    def _claim(self, wd: int, path: bytes, root: _Root, top: bool, awaiting: bytes | None) -> None:
        """(lock held) Record a watch the kernel made (or already had) for ``root``; one for a
        root unwatched meanwhile is given back, unless another root holds it."""
        live = self._live(root)
        if live and awaiting is not None and self._awaited.get(root) not in (None, wd):
            self._stop_awaiting(root)
        watch = self._watches.setdefault(wd, _Watch(path))
        watch.path = path  # the same directory under a new name after a rename: same wd
        if live and awaiting is None:
            watch.roots.add(root)
            if top:
                watch.tops.add(root)
        elif live:
            watch.awaiting[root] = awaiting
            self._awaited[root] = wd
        self._release(wd)
        if not live:
            raise _Cancelled

    def _drop(self, which: Callable[[_Root], bool]) -> None:
        """(lock held) Give up the watches of the roots ``which`` selects."""
        self._missing = {root for root in self._missing if not which(root)}
        self._awaited = {root: wd for root, wd in self._awaited.items() if not which(root)}
        for wd, watch in list(self._watches.items()):
            watch.roots = {root for root in watch.roots if not which(root)}
            watch.tops = {root for root in watch.tops if not which(root)}
            watch.awaiting = {r: name for r, name in watch.awaiting.items() if not which(r)}
            self._release(wd)

    def _release(self, wd: int) -> None:
        """(lock held) Give a watch back once no root is watched or awaited through it;
        inotify_rm_watch never waits on a filesystem."""
        watch = self._watches.get(wd)
        if watch is not None and not watch.roots and not watch.awaiting:
            del self._watches[wd]
            self._note_removed(wd)
            if not self._closed:
                self._libc.inotify_rm_watch(self._fd, wd)

    def _note_removed(self, wd: int) -> None:
        """(lock held) For the calls in flight that may have found this watch (see _add)."""
        if self._adding:
            self._removed[wd] = self._removals
            self._removals += 1

    def _stop_awaiting(self, root: _Root) -> None:
        """(lock held)"""
        self._missing.discard(root)
        wd = self._awaited.pop(root, None)
        if wd is not None and wd in self._watches:
            self._watches[wd].awaiting.pop(root, None)
            self._release(wd)

    # --- follow-up work, a thread per root ----------------------------------------------------

    def _submit(self, root: _Root, task: bytes | str) -> None:
        """(lock held) Queue work for ``root`` (a directory to follow, or _AWAIT, _RETRY) on its
        own thread, started for as long as it has work: a directory that hangs holds up only
        the root below which it lies."""
        if not self._live(root):
            return
        pending = self._pending.get(root)
        if pending is None:
            pending = self._pending[root] = {}
            name = f"inotify {root.key}"
            threading.Thread(target=self._work, args=(root,), name=name, daemon=True).start()
        pending[task] = None  # once: the same directory created twice in a burst, a retry

    def _work(self, root: _Root) -> None:
        while True:
            with self._lock:
                pending = self._pending[root]
                if not pending or not self._live(root):
                    del self._pending[root]
                    return
                task = next(iter(pending))
                del pending[task]
            try:
                if isinstance(task, bytes):
                    self._follow_new_directory(root, task)
                elif task == _AWAIT:
                    self._await_or_heal(root)
                else:
                    self._heal(root)
            except _Cancelled:
                continue
            except Exception as error:  # a bug: this root is given up, the others go on
                log.exception("watching %s below %s failed", root.key, root.path)
                self._lose(root, f"inotify watch failed: {type(error).__name__}: {error}")

    def _report(self, callback: Callable[[], None]) -> None:
        """Have the reader thread make a callback, as it makes every other."""
        with self._lock:
            self._reports.append(callback)
            self._wake_reader()

    def _wake_reader(self) -> None:
        """(lock held)"""
        if not self._closed:
            with contextlib.suppress(BlockingIOError):  # full: the reader is woken already
                os.write(self._wake_w, b"x")

    def _lose(self, root: _Root, reason: str) -> None:
        self._unwatch_root(root)
        self._report(lambda: self._report_lost({root.key: reason}))

    def _follow_new_directory(self, root: _Root, path: bytes) -> None:
        below = _below(root, path)
        if below is None:
            return
        try:
            self._add_tree(root, below, root.max_depth - len(below))
        except LimitReached as error:
            self._lose(root, str(error))
            return
        except OSError:
            return  # created and gone again already, or a symlink now
        # What was written into it before its watch was recorded raised no event read here.
        self._report(lambda: self._on_change(root.key, os.fsdecode(path)))

    def _await_or_heal(self, root: _Root) -> None:
        """Watch a missing root again if its directory is back, else await it."""
        # Each turn awaits one directory deeper: bounded by the depth of the path.
        for _ in range(root.path.count(b"/") + 1):
            if self._heal(root):
                return
            awaited = self._await(root)
            if awaited is None or not os.path.lexists(awaited):
                return
            # It appeared before the await's watch was there: no event will say so.

    def _await(self, root: _Root) -> bytes | None:
        """Await a missing root in the nearest directory above it that exists; the path of the
        directory awaited there, or None when the root is looked for on the timer instead."""
        with self._lock:
            if not self._live(root):
                raise _Cancelled
            self._stop_awaiting(root)
        if root.follow_symlink and os.path.islink(root.path):
            self._look_for_later(root)  # an operator's symlink: its target may come back anywhere
            return None
        above, name = os.path.split(os.path.normpath(root.path))
        while True:
            try:
                directory = fsread.open_directory(above, follow_symlink=True)
                break
            except OSError as error:
                if error.errno not in (errno.ENOENT, errno.ENOTDIR) or above == b"/":
                    self._look_for_later(root)
                    return None
                above, name = os.path.split(above)
        try:
            self._add(directory, above, _AWAIT_MASK, root, awaiting=name)
        except OSError:
            self._look_for_later(root)
            return None
        finally:
            os.close(directory)
        return os.path.join(above, name)

    def _look_for_later(self, root: _Root) -> None:
        with self._lock:
            if self._live(root):
                self._missing.add(root)
                self._wake_reader()  # to wait for the retry time, not for the next event

    def _heal(self, root: _Root) -> bool:
        """Watch a missing root again if its directory is back; True when healed."""
        try:
            self._add_tree(root, [], root.max_depth)
        except LimitReached as error:
            self._lose(root, str(error))
            raise _Cancelled from error
        except OSError:
            return False  # not back yet (or, for a tenant's root, a symlink now)
        with self._lock:
            self._stop_awaiting(root)
        log.info("watch of %s restored: %s is a directory again", root.key, root.path)
        # Whatever was written into the tree before its watch came back raised no event, and
        # the tree may be entirely new: only a full re-read of the root finds it.
        self._report(lambda: self._on_change(root.key, os.fsdecode(root.path)))
        return True

    # --- events ------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._read_events()
        except Exception as error:  # whatever stopped the reader: say so, give its jobs up
            self._fail(error)
        finally:
            with self._lock:
                self._reading = False
                self._close_if_unused()

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
                with self._lock:
                    for root in self._missing:
                        self._submit(root, _RETRY)
            ready_fds = {fd for fd, _ in ready}
            if self._wake_r in ready_fds:
                while True:
                    try:
                        os.read(self._wake_r, 1 << 12)
                    except BlockingIOError:
                        break
            if self._fd in ready_fds:
                try:
                    data = os.read(self._fd, 1 << 16)
                except BlockingIOError:
                    data = b""
                self._dispatch(data)
            with self._lock:
                reports, self._reports = self._reports, []
            for report in reports:
                report()

    def _fail(self, error: Exception) -> None:
        """The reader cannot go on: every key it watched is given up, so that the scanner polls
        those jobs instead of leaving them blind in silence; later ``watch`` calls say why."""
        reason = f"inotify reader failed: {type(error).__name__}: {error}"
        log.error("%s; every watched job falls back to polling", reason, exc_info=error)
        with self._lock:
            self._failure = reason
            keys = {root.key for root in self._roots}
            self._roots.clear()
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

    def _dispatch(self, data: bytes) -> None:
        # Every distinct path per key: the scanner re-stats each file an event named (a pointer
        # rewritten in place is seen only this way). Insertion-ordered, one call per path.
        changed: dict[str, dict[bytes, None]] = {}
        gone: list[_Root] = []
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            name = data[offset + _HEADER.size : offset + _HEADER.size + length].rstrip(b"\0")
            offset += _HEADER.size + length
            if mask & IN_Q_OVERFLOW:
                self._on_overflow(None)
                continue
            with self._lock:
                if mask & IN_IGNORED:  # the directory is gone (deleted, unmounted)
                    self._note_removed(wd)
                watch = self._watches.get(wd)
                if watch is None:
                    continue
                if mask & IN_IGNORED:
                    del self._watches[wd]
                path = os.path.join(watch.path, name) if name else watch.path
                roots = set(watch.roots)
                # A root's own directory went away or moved (its watches would follow it out
                # of place), or a directory awaiting roots did: those roots are awaited anew
                # (or watched again at once, when back already: rm -rf; mkdir).
                if mask & (IN_IGNORED | IN_MOVE_SELF):
                    for root in [*watch.tops, *watch.awaiting]:
                        if root in watch.tops:
                            self._drop(lambda r, lost=root: r == lost)
                            gone.append(root)
                        self._submit(root, _AWAIT)
                elif mask & IN_ISDIR and mask & _NEW_DIRECTORY:
                    for root in roots:
                        if _below(root, path) is not None:
                            self._submit(root, path)
                    for root, awaited in watch.awaiting.items():
                        if awaited == name:
                            self._submit(root, _AWAIT)
            for root in roots:
                changed.setdefault(root.key, {})[path] = None
        for root in gone:
            log.info("watch of %s lost its root %s", root.key, root.path)
        for key, paths in changed.items():
            for path in paths:
                self._on_change(key, os.fsdecode(path))

    def _report_lost(self, lost: dict[str, str]) -> None:
        for key, reason in lost.items():
            log.warning("watch of %s lost part of its tree: %s", key, reason)
            if self._on_lost is not None:
                self._on_lost(key, reason)


def _below(root: _Root, path: bytes) -> list[bytes] | None:
    """The names from ``root`` down to a new directory at ``path``, or None when the root does
    not follow it (not recursive, too deep, or named through another root's spelling)."""
    if not root.recursive:
        return None
    below = os.path.relpath(path, root.path).split(b"/")
    if below[0] == b".." or len(below) > root.max_depth:
        return None
    return below
