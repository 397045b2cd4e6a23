"""Tails the event spool that instrumented jobs write (``instrument.py``).

The spool root is mode 1733: any user can create a directory in it, so every directory, file,
name and line here is hostile, and so is the amount of it. The reader therefore

- never trusts a path twice: the root is opened once per poll, every job directory is opened
  relative to that descriptor with ``O_NOFOLLOW | O_DIRECTORY``, listed through its descriptor,
  every file opened relative to it with ``O_NOFOLLOW`` and checked with ``fstat`` against the
  listing, and old files removed with ``unlink(name, dir_fd=...)``. A directory or file swapped
  for a symlink between the listing and the use is skipped: nothing outside the spool is read or
  removed.
- reads on a budget: at most ``poll_bytes`` bytes and ``poll_lines`` lines per poll, all
  directories together, shared max-min fairly between the directories with unread data (a quiet
  job's few lines first, then the busy ones, least recently served first), so one flooding job
  cannot spend the others' share. A file further behind than ``max_backlog`` skips ahead (the
  skipped bytes counted in ``dropped_bytes_total["backlog"]``); a file already there when it is
  first followed is read from its last ``history_bytes`` only.
- follows only the directories of jobs it knows (``known_jobs``). The others are listed at most
  every ``unknown_relist`` seconds, ``unknown_per_poll`` per poll, never read: their growth is
  counted in ``dropped_bytes_total["unknown_job"]`` and their old files are removed like any
  other. The root itself is listed again only when its mtime changed (at most every
  ``root_relist_min`` seconds) or every ``root_relist_max`` seconds.
- refuses events dated more than ``FUTURE_SLACK`` seconds ahead of the local clock or more than
  ``MAX_EVENT_AGE`` behind it (``dropped_total["future"]``, ``dropped_total["past"]``): one
  event must not be able to make a duration infinite or a timestamp stick in year 9999.

Files are followed by inode, not by name, so a rotation (``x.jsonl`` renamed to ``x.jsonl.1``)
mid-read loses nothing; a partial last line waits for its newline (re-read, not buffered: a
thousand torn files cost no memory); a torn, oversized, unknown or malformed line is counted
once and skipped. Everything present at the first poll is history. Files untouched for
``retention`` are removed once read (the spool is the exporter's own directory, not a watched
checkpoint path).
"""

from __future__ import annotations

import errno
import heapq
import logging
import os
import stat
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from checkpoint_exporter.instrument import EVENTS, SCHEMA_VERSION
from checkpoint_exporter.sources.untrusted import finite_number, json_value

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024
# Budgets (see docs/security.md, "Budgets"). A typical event line is ~200 bytes and costs ~8 us
# to parse, so a full poll is ~5,000 events and well under 0.1 s of CPU.
POLL_BYTES = 1024 * 1024  # read per poll, all directories together
POLL_LINES = 8192  # parsed per poll, all directories together (a flood of "{}" lines is cheap
# in bytes, not in lines)
MIN_SHARE_BYTES = 64 * 1024  # a served directory gets at least this much of a poll ...
MIN_SHARE_LINES = 512  # ... and this many lines, so a poll serves at most 16 busy directories
MAX_BACKLOG = 8 * 1024 * 1024  # a file further behind skips ahead to its last 8 MiB
HISTORY_BYTES = 256 * 1024  # of a file already there when first followed, its tail is read
MAX_FILES_PER_DIR = 1024  # spool files followed in one directory (one per rank per restart)
MAX_UNKNOWN_DIRS = 100_000  # directories of unknown jobs remembered (for cleanup and counts)
ROOT_RELIST_MIN = 2.0  # seconds: the root is listed again when its mtime moved, this often ...
ROOT_RELIST_MAX = 30.0  # ... and in any case this often
UNKNOWN_RELIST = 60.0  # seconds between two listings of one unknown job's directory
UNKNOWN_PER_POLL = 64  # unknown directories listed per poll at most
FUTURE_SLACK = 300.0  # an event dated further ahead of this node's clock is refused
MAX_EVENT_AGE = 366 * 86400.0  # an event dated further back is refused
# Steps, ranks and sizes become float samples: past 2**53 a float no longer holds every integer
# (and 10**400 overflows it), so a larger one is a schema error, never a number exported.
MAX_INT = 2**53

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC  # the configured root may be a symlink
_DIR_FLAGS = _ROOT_FLAGS | os.O_NOFOLLOW
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
# Gone since the listing, or swapped: ELOOP is what O_NOFOLLOW says of a symlink.
_VANISHED = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


@dataclass(frozen=True, slots=True)
class Event:
    ts: float
    event: str
    training_job: str
    step: int | None
    rank: int
    world_size: int
    host: str
    path: str | None
    bytes: int | None
    error: str | None
    history: bool = False  # already in the spool when the exporter started
    drill: bool = False  # a restore drill's event, not the training job's own


FileKey = tuple[int, int]  # (st_dev, st_ino)


@dataclass(slots=True)
class _Followed:
    """One spool file. Bytes before ``offset`` are parsed; a torn last line is re-read from
    ``offset`` once the file grew past ``scanned``."""

    name: str
    size: int = 0  # at the last listing
    mtime: float = 0.0
    offset: int = 0  # start of the first line not yet parsed
    scanned: int = 0  # everything before this was looked at
    skipping: bool = False  # inside an over-long line (already counted): drop to its newline
    history_end: int = 0  # lines ending at or before this offset were there before we followed
    served: int = 0  # the poll that last read it

    @property
    def pending(self) -> int:
        return max(0, self.size - self.scanned)


@dataclass(slots=True)
class _Dir:
    """A followed job directory: its identity at the last listing and its files."""

    ident: FileKey = (0, 0)
    files: dict[FileKey, _Followed] = field(default_factory=dict)
    history: bool = True  # files found at its first listing are history
    listed: bool = False
    served: int = 0

    @property
    def pending(self) -> int:
        return sum(f.pending for f in self.files.values())


@dataclass(slots=True)
class _Unknown:
    """A directory of a job the exporter does not know: listed rarely, never read."""

    due: float  # monotonic time of its next listing
    size: int | None = None  # bytes of its spool files at the last listing
    history: bool = False  # was there at the first poll, or was listed: its content is old


@dataclass
class SpoolReader:
    directory: Path
    retention: float = 7 * 86400.0
    # The names of the jobs the daemon watches; None: every directory is a job (tools, tests).
    known_jobs: Callable[[], Collection[str]] | None = None
    poll_bytes: int = POLL_BYTES
    poll_lines: int = POLL_LINES
    max_backlog: int = MAX_BACKLOG
    history_bytes: int = HISTORY_BYTES
    root_relist_min: float = ROOT_RELIST_MIN
    root_relist_max: float = ROOT_RELIST_MAX
    unknown_relist: float = UNKNOWN_RELIST
    unknown_per_poll: int = UNKNOWN_PER_POLL
    monotonic: Callable[[], float] = time.monotonic
    events_total: Counter[str] = field(default_factory=Counter)
    invalid_total: Counter[str] = field(default_factory=Counter)
    # Events refused (future, past; and, where the daemon shares this counter with the jobs'
    # Clocks, open_saves_cap, open_restores_cap, ranks_cap, before_start).
    dropped_total: Counter[str] = field(default_factory=Counter)
    # Bytes never parsed: unknown_job (a directory no configured job owns), backlog (skipped
    # ahead of a file too far behind).
    dropped_bytes_total: Counter[str] = field(default_factory=Counter)
    backlog_bytes: int = 0  # unread bytes of the followed files, as of the last poll
    poll_seconds_total: float = 0.0  # time spent polling: the spool's cost, made visible
    _dirs: dict[str, _Dir] = field(default_factory=dict)
    _unknown: dict[str, _Unknown] = field(default_factory=dict)
    _due: list[tuple[float, str]] = field(default_factory=list)  # heap over _unknown
    _names: frozenset[str] = frozenset()  # subdirectories at the last root listing
    _root: tuple[int, int, int] | None = None  # dev, ino, mtime_ns at the last root listing
    _root_listed_at: float = float("-inf")
    _polls: int = 0
    _reported_errors: set[str] = field(default_factory=set)

    def poll(self, now: float | None = None) -> list[Event]:
        """New complete lines of the followed spool files, parsed, within this poll's budget;
        the bad ones counted."""
        started = time.perf_counter()
        try:
            return self._poll(time.time() if now is None else now)
        finally:
            self.poll_seconds_total += time.perf_counter() - started

    def _poll(self, now: float) -> list[Event]:
        first = self._polls == 0
        self._polls += 1
        events: list[Event] = []
        try:
            root = os.open(self.directory, _ROOT_FLAGS)
        except FileNotFoundError:
            self._dirs.clear()  # the first instrumented job will create it
            self.backlog_bytes = 0
            return events
        except OSError as error:
            self._report(str(self.directory), error)
            return events
        try:
            self._list_root(root, first)
            self._follow(root, first, now)
            self._read(root, now, events)
            self._visit_unknown(root, now)
        finally:
            os.close(root)
        self.backlog_bytes = sum(d.pending for d in self._dirs.values())
        events.sort(key=lambda e: e.ts)
        return events

    # --- the root ----------------------------------------------------------------------------

    def _list_root(self, root: int, first: bool) -> None:
        info = os.fstat(root)
        identity = (info.st_dev, info.st_ino, info.st_mtime_ns)
        clock = self.monotonic()
        since = clock - self._root_listed_at
        if self._root is not None and identity[:2] == self._root[:2]:  # the same directory
            moved = identity != self._root
            if since < self.root_relist_max and not (moved and since >= self.root_relist_min):
                return
        try:
            names = frozenset(self._subdirectories(root))
        except OSError as error:
            self._report(str(self.directory), error)
            return
        self._root, self._root_listed_at = identity, clock
        self._names = names
        for name in [n for n in self._unknown if n not in names]:
            del self._unknown[name]
        if len(self._due) > 2 * len(self._unknown) + 64:  # drop stale heap entries
            self._due = [(due, n) for due, n in self._due if n in self._unknown]
            heapq.heapify(self._due)
        known = self._known()
        if known is None:
            return  # every directory is followed
        for name in names:
            if name not in self._unknown and name not in self._dirs and name not in known:
                self._remember(name, history=first)

    def _remember(self, name: str, history: bool) -> None:
        """Start listing ``name`` as the directory of an unknown job."""
        if len(self._unknown) >= MAX_UNKNOWN_DIRS:
            self._report("unknown directories", OSError(f"more than {MAX_UNKNOWN_DIRS}"))
            return
        clock = self.monotonic()
        self._unknown[name] = _Unknown(clock, history=history)
        heapq.heappush(self._due, (clock, name))

    @property
    def job_directories(self) -> frozenset[str]:
        """The names of the spool's job directories at its last listing (no I/O)."""
        return self._names

    def _subdirectories(self, root: int) -> list[str]:
        with os.scandir(root) as entries:
            return [e.name for e in entries if e.is_dir(follow_symlinks=False)]

    def _known(self) -> Collection[str] | None:
        return None if self.known_jobs is None else self.known_jobs()

    # --- followed directories: list them all, every poll ---------------------------------------

    def _follow(self, root: int, first: bool, now: float) -> None:
        known = self._known()
        wanted = self._names if known is None else known
        for name in list(self._dirs):
            if name not in wanted:
                del self._dirs[name]  # forgotten job: its state goes with it
                if name in self._names and known is not None:
                    self._remember(name, history=True)
        for name in wanted:
            if not _plain_name(name):
                continue
            directory = self._dirs.get(name)
            if directory is None:
                unknown = self._unknown.pop(name, None)
                history = first or (unknown is not None and unknown.history)
                directory = _Dir(history=history)
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=root)
            except OSError as error:
                self._dirs.pop(name, None)
                if error.errno not in _VANISHED:
                    self._report(f"{self.directory}/{name}", error)
                continue
            try:
                self._dirs[name] = directory
                emptied = self._list_dir(name, fd, directory, now)
            finally:
                os.close(fd)
            if emptied and self._remove_directory(root, name):
                del self._dirs[name]

    def _list_dir(self, name: str, fd: int, directory: _Dir, now: float) -> bool:
        """List a followed directory, removing its files older than ``retention``; whether it
        is left without spool files and idle for ``retention`` (see ``_remove_directory``)."""
        info = os.fstat(fd)
        directory.ident = (info.st_dev, info.st_ino)
        try:
            entries = self._spool_files(fd)
        except OSError as error:
            self._report(f"{self.directory}/{name}", error)
            return False
        removed = False
        files: dict[FileKey, _Followed] = {}
        for file_name, st in entries:
            key = (st.st_dev, st.st_ino)
            followed = directory.files.get(key)
            if followed is None:
                followed = _Followed(file_name)
                if directory.history and not directory.listed:
                    followed.history_end = st.st_size
                    start = max(0, st.st_size - self.history_bytes)
                    followed.offset = followed.scanned = start
                    followed.skipping = start > 0  # to the next line start (not counted)
            if st.st_size < followed.offset:  # truncated or replaced in place
                followed = _Followed(file_name)
            followed.name, followed.size, followed.mtime = file_name, st.st_size, st.st_mtime
            files[key] = followed
            if (
                followed.size == followed.scanned
                and now - followed.mtime > self.retention
                and self._remove(fd, name, file_name, key)
            ):
                del files[key]
                removed = True
        directory.files = files
        directory.listed = True
        return not files and (removed or now - info.st_mtime > self.retention)

    def _remove_directory(self, root: int, name: str) -> bool:
        """Remove a job's spool directory left empty by retention: its job has written nothing
        for ``retention``, and a node-scope process, which knows the jobs on a shared root by
        their spool directories, would otherwise export every job that ever ran here. rmdir
        fails on a directory a job just wrote into again (instrument recreates a removed one)."""
        try:
            os.rmdir(name, dir_fd=root)
        except OSError:
            return False
        self._names = self._names - {name}  # gone now, whenever the root is listed again
        return True

    def _spool_files(self, fd: int) -> list[tuple[str, os.stat_result]]:
        """The regular ``*.jsonl*`` files of a directory, stat-ed through its descriptor."""
        files = []
        with os.scandir(fd) as entries:
            for entry in entries:
                if ".jsonl" not in entry.name:
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(info.st_mode):
                    files.append((entry.name, info))
                    if len(files) >= MAX_FILES_PER_DIR:
                        break
        return files

    # --- reading, on the poll's budget ---------------------------------------------------------

    def _read(self, root: int, now: float, out: list[Event]) -> None:
        busy = [(name, d) for name, d in self._dirs.items() if d.pending]
        # Max-min fair: the directories with little to read first (they take less than a fair
        # share and leave the rest to the others), then the busy ones, least recently served
        # first, so that over successive polls every one of them is served.
        busy.sort(key=lambda item: (item[1].pending > MIN_SHARE_BYTES, item[1].served, item[0]))
        bytes_left, lines_left = self.poll_bytes, self.poll_lines
        for index, (name, directory) in enumerate(busy):
            if bytes_left <= 0 or lines_left <= 0:
                break
            remaining = len(busy) - index
            share = _share(bytes_left, remaining, MIN_SHARE_BYTES)
            lines = _share(lines_left, remaining, MIN_SHARE_LINES)
            used, parsed = self._read_dir(root, name, directory, share, lines, now, out)
            bytes_left -= used
            lines_left -= parsed
            directory.served = self._polls

    def _read_dir(
        self, root: int, name: str, directory: _Dir, budget: int, lines: int, now: float,
        out: list[Event],
    ) -> tuple[int, int]:  # fmt: skip
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=root)
        except OSError:
            return 0, 0  # gone or swapped since the listing: the next poll sees which
        used = parsed = 0
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != directory.ident:
                return 0, 0  # another directory under this name since the listing
            busy = sorted(
                (f for f in directory.files.items() if f[1].pending),
                key=lambda item: (item[1].pending > MIN_SHARE_BYTES, item[1].served, item[1].name),
            )
            for index, (key, followed) in enumerate(busy):
                if used >= budget or parsed >= lines:
                    break
                remaining = len(busy) - index
                share = _share(budget - used, remaining, 1)
                line_share = _share(lines - parsed, remaining, 1)
                got, count = self._read_file(fd, name, key, followed, share, line_share, now, out)
                used += got
                parsed += count
                followed.served = self._polls
        finally:
            os.close(fd)
        return used, parsed

    def _read_file(
        self, dir_fd: int, job: str, key: FileKey, followed: _Followed, budget: int, lines: int,
        now: float, out: list[Event],
    ) -> tuple[int, int]:  # fmt: skip
        try:
            fd = os.open(followed.name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as error:
            if error.errno not in _VANISHED:
                self._report(f"{self.directory}/{job}/{followed.name}", error)
            return 0, 0
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != key:
                return 0, 0  # swapped since the listing: not the file that was listed
            if info.st_size < followed.offset:
                return 0, 0  # truncated since the listing: the next listing starts it over
            followed.size = max(followed.size, info.st_size)
            if info.st_size - followed.offset > self.max_backlog:
                # A flood: keep its newest bytes, count the rest, resume at a line start.
                skip_to = info.st_size - self.max_backlog
                self.dropped_bytes_total["backlog"] += skip_to - followed.offset
                followed.offset = followed.scanned = skip_to
                followed.skipping = os.pread(fd, 1, skip_to - 1) != b"\n"
            # From a line start, read enough to hold the longest line: a line that does not fit
            # into the request would otherwise be re-read for ever.
            want = budget if followed.skipping else max(budget, MAX_LINE + 1)
            data = os.pread(fd, min(want, info.st_size - followed.offset), followed.offset)
        except OSError as error:
            self._report(f"{self.directory}/{job}/{followed.name}", error)
            return 0, 0
        finally:
            os.close(fd)
        return len(data), self._lines(data, job, followed, lines, now, out)

    def _lines(
        self, data: bytes, job: str, followed: _Followed, lines: int, now: float,
        out: list[Event],
    ) -> int:  # fmt: skip
        start = followed.offset
        end = start + len(data)
        pos = 0
        if followed.skipping:
            newline = data.find(b"\n")
            if newline < 0:
                followed.offset = followed.scanned = end
                return 0
            followed.skipping, pos = False, newline + 1
        parsed = 0
        while parsed < lines:
            newline = data.find(b"\n", pos)
            if newline < 0:
                break
            history = start + newline + 1 <= followed.history_end
            self._parse(data[pos:newline], job, history, now, out)
            parsed += 1
            pos = newline + 1
        else:
            if data.find(b"\n", pos) >= 0:  # out of lines for this poll: the rest next time
                followed.offset = followed.scanned = start + pos
                return parsed
        followed.offset, followed.scanned = start + pos, end
        if end - followed.offset > MAX_LINE:  # counted once, skipped to its newline
            self.invalid_total["too_long"] += 1
            followed.offset, followed.skipping = end, True
        return parsed

    def _parse(self, line: bytes, job: str, history: bool, now: float, out: list[Event]) -> None:
        if len(line) > MAX_LINE:  # even of blanks: as the same line unterminated would be
            self.invalid_total["too_long"] += 1
            return
        if not line.strip():
            return
        try:
            record = json_value(line)
        except ValueError:
            self.invalid_total["not_json"] += 1
            return
        event = _validate(record, job, history)
        if isinstance(event, str):
            self.invalid_total[event] += 1
            return
        if event.ts > now + FUTURE_SLACK:
            self.dropped_total["future"] += 1
            return
        if event.ts < now - MAX_EVENT_AGE:
            self.dropped_total["past"] += 1
            return
        self.events_total[event.event] += 1
        out.append(event)

    # --- directories of unknown jobs: listed rarely, never read ------------------------------

    def _visit_unknown(self, root: int, now: float) -> None:
        clock = self.monotonic()
        known = self._known()
        visited = 0
        while self._due and self._due[0][0] <= clock and visited < self.unknown_per_poll:
            due, name = heapq.heappop(self._due)
            unknown = self._unknown.get(name)
            if unknown is None or unknown.due != due:
                continue  # stale heap entry
            if known is None or name in known or name in self._dirs:
                del self._unknown[name]  # followed now
                continue
            visited += 1
            size = self._list_unknown(root, name, now)
            if size is None:
                del self._unknown[name]  # gone, or not a directory: the root listing tells
                continue
            if unknown.size is not None or not unknown.history:
                self.dropped_bytes_total["unknown_job"] += max(0, size - (unknown.size or 0))
            unknown.size, unknown.history = size, True
            unknown.due = clock + self.unknown_relist
            heapq.heappush(self._due, (unknown.due, name))

    def _list_unknown(self, root: int, name: str, now: float) -> int | None:
        """Total bytes of the directory's spool files; old ones are removed."""
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=root)
        except OSError:
            return None
        total, left, removed = 0, 0, False
        try:
            idle = now - os.fstat(fd).st_mtime > self.retention
            for file_name, st in self._spool_files(fd):
                key = (st.st_dev, st.st_ino)
                if now - st.st_mtime > self.retention and self._remove(fd, name, file_name, key):
                    removed = True
                    continue
                total += st.st_size
                left += 1
        except OSError as error:
            self._report(f"{self.directory}/{name}", error)
            return total
        finally:
            os.close(fd)
        if not left and (removed or idle) and self._remove_directory(root, name):
            return None
        return total

    # --- helpers -----------------------------------------------------------------------------

    def _remove(self, dir_fd: int, job: str, name: str, key: FileKey) -> bool:
        """Unlink ``name`` in the directory open as ``dir_fd``, if it is still the file listed
        (a rename in between is the job's own directory's business, never a path elsewhere)."""
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if (info.st_dev, info.st_ino) != key or not stat.S_ISREG(info.st_mode):
                return False
            os.unlink(name, dir_fd=dir_fd)
            log.debug("removed old spool file %s/%s/%s", self.directory, job, name)
            return True
        except FileNotFoundError:
            return True
        except OSError as error:
            self._report(f"{self.directory}/{job}/{name}", error)
            return False

    def _report(self, where: str, error: OSError) -> None:
        if where not in self._reported_errors and len(self._reported_errors) < 1000:
            self._reported_errors.add(where)
            log.warning("spool: %s: %s", where, error.strerror or error)


def _share(left: int, remaining: int, minimum: int) -> int:
    return min(left, max(minimum, left // max(1, remaining)))


def _plain_name(name: object) -> bool:
    return (
        isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
        and "\0" not in name
    )  # fmt: skip


def _validate(record: object, job: str, history: bool = False) -> Event | str:
    """An Event, or the reason the record is invalid."""
    if not isinstance(record, dict) or record.get("v") != SCHEMA_VERSION:
        return "schema"
    if record.get("event") not in EVENTS:
        return "unknown_event"
    ts, rank, world = record.get("ts"), record.get("rank", 0), record.get("world_size", 1)
    step, path = record.get("step"), record.get("path")
    size, error = record.get("bytes"), record.get("error")
    drill = record.get("drill", False)
    timestamp = finite_number(ts)
    checks = (
        timestamp is not None,
        record.get("training_job") == job,  # a job writes only into its own directory
        _is_int(rank) and 0 <= rank <= MAX_INT and _is_int(world) and 1 <= world <= MAX_INT,
        step is None or (_is_int(step) and 0 <= step <= MAX_INT),
        path is None or isinstance(path, str),
        size is None or (_is_int(size) and 0 <= size <= MAX_INT),
        error is None or isinstance(error, str),
        isinstance(drill, bool),
    )
    if not all(checks):
        return "schema"
    assert timestamp is not None  # checked above
    return Event(
        ts=timestamp,
        event=record["event"],
        training_job=job,
        step=step,
        rank=rank,
        world_size=world,
        host=str(record.get("host", ""))[:256],
        path=path[:4096] if path else path,
        bytes=size,
        error=error[:1000] if error else None,
        history=history,
        drill=drill,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
