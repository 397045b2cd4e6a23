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
- lists on a budget too: at most ``poll_entries`` directory entries per poll, all listings
  together, shared max-min fairly like the bytes. A listing that does not finish within its
  share goes on from where it stopped at the next poll (the directory held open meanwhile), so
  a directory of a million names costs its own job's events their latency, never another's.
- follows only the directories of jobs it knows (``known_jobs``). The others are listed at most
  every ``unknown_relist`` seconds, ``unknown_per_poll`` per poll, never read: their growth is
  counted in ``dropped_bytes_total["unknown_job"]`` and their old files are removed like any
  other. The root itself is listed again only when its mtime changed (at most every
  ``root_relist_min`` seconds) or every ``root_relist_max`` seconds.
- reads a job's directory only when its owner is the job's. Whoever makes ``<spool>/<job>``
  first owns it, so a tenant could make another job's directory before that job did and forge
  its events (the other job's ranks then get "permission denied"). ``known_jobs`` says, per
  job, the uids its directories may belong to (the configured ``spool_owner``, else the owner of
  the job's checkpoint tree), ``None`` where nothing says (one owner alone is then trusted:
  two is a contest nothing settles, and neither is read), or ``HOLD`` while the daemon has not
  read the tree yet (listed, so that history stays history, but neither read nor refused). A
  rank that finds its job's directory owned by another user writes beside it, into
  ``<job>@<uid>`` (or ``<job>@<uid>.<random>`` if that is taken too), which is read when that
  uid owns it and is the job's. Root's directories and files are always read: root can do
  anything on the node anyway. The exporter's own uid (``own_uid``) writes the restore drills,
  for any job: its directories are read for drill events only (any other event in them is
  refused and counted in ``dropped_total["not_drill"]``), and never make a second owner. A
  refused directory is listed like an unknown job's, its growth counted in
  ``dropped_bytes_total["owner"]``, the job named in ``squatted`` and the directory in one log
  line; a file of another user in a job's own directory is not read either (counted the same
  way).
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
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from checkpoint_exporter.events import FUTURE_SLACK, MAX_EVENT_AGE, Event, parse
from checkpoint_exporter.sources.untrusted import json_value

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
ROOT_MTIME_TICK = 1.0  # seconds: more than a filesystem's timestamp granularity (NFS: 1 s)
UNKNOWN_RELIST = 60.0  # seconds between two listings of one unknown job's directory
UNKNOWN_PER_POLL = 64  # unknown directories listed per poll at most
# Directory entries looked at per poll, all listings together. A listing costs about 0.2-0.4 us
# of CPU per entry, so a poll lists for at most about 3 ms; a directory of a million names takes
# about 120 polls (25 s) to go round, at the cost of its own job's events.
POLL_ENTRIES = 8192
MIN_SHARE_ENTRIES = 1024  # a listing advanced in a poll gets at least this many
# ``known_jobs`` may say, per job, whose its spool directories are: a set of uids, None (nothing
# says: one owner alone is trusted), or HOLD (not known yet: neither read nor refused).
Owners = frozenset[int] | None
HOLD: frozenset[int] = frozenset()

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC  # the configured root may be a symlink
_DIR_FLAGS = _ROOT_FLAGS | os.O_NOFOLLOW
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
# Gone since the listing, or swapped: ELOOP is what O_NOFOLLOW says of a symlink.
_VANISHED = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


FileKey = tuple[int, int]  # (st_dev, st_ino)


@dataclass(frozen=True, slots=True)
class Listed:
    """A job's spool directories as of their last complete listings (``SpoolReader.listed``)."""

    mtime: float  # their last change: their own mtimes, and their spool files'
    spool_files: bool  # whether any held a spool file: an empty one is a mkdir, no job yet


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


class _Listing:
    """One directory's listing, advanced poll after poll within the entries budget. It holds
    the directory open (its entries are stat-ed through that descriptor), so what it lists,
    and what is removed once it is done, is the directory it started on, whatever the name
    points to by then."""

    __slots__ = ("_entries", "count", "done", "fd", "files", "ident", "mtime", "owner")

    def __init__(self, fd: int, info: os.stat_result) -> None:
        self.ident: FileKey = (info.st_dev, info.st_ino)
        self.owner, self.mtime = info.st_uid, info.st_mtime
        self.files: list[tuple[str, os.stat_result]] = []  # the regular *.jsonl* ones
        self.count = 0  # entries looked at so far
        self.done = False
        self.fd = -1
        self._entries = os.scandir(fd)
        self.fd = fd  # owned from here on: DirEntry.stat uses it, not the iterator's own copy

    def advance(self, budget: int) -> int:
        """Look at up to ``budget`` more entries; how many it looked at."""
        looked = 0
        for entry in self._entries:
            looked += 1
            if ".jsonl" in entry.name:
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    info = None
                if info is not None and stat.S_ISREG(info.st_mode):
                    self.files.append((entry.name, info))
                    if len(self.files) >= MAX_FILES_PER_DIR:
                        self.done = True
                        break
            if looked >= budget:
                break
        else:
            self.done = True
        self.count += looked
        return looked

    def close(self) -> None:
        if self.fd >= 0:
            self._entries.close()
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()


@dataclass(slots=True)
class _Dir:
    """A followed job directory: its identity and owner at the last listing, and its files."""

    job: str
    ident: FileKey = (0, 0)
    owner: int = -1
    files: dict[FileKey, _Followed] = field(default_factory=dict)
    # Files of another user in it (not read): their sizes at the last listing, to count growth.
    refused: dict[FileKey, int] = field(default_factory=dict)
    history: bool = True  # files found at its first listing are history
    listed: bool = False
    # Its job's owner is not known yet (HOLD): listed, so that what was there at the first poll
    # stays history, but not read.
    held: bool = False
    drills_only: bool = False  # the exporter's own uid's: only drill events are read
    served: int = 0
    listing: _Listing | None = None  # in progress
    entries: int = 0  # what its last complete listing looked at (its listing's cost)
    advanced: int = 0  # the poll that last advanced its listing

    @property
    def pending(self) -> int:
        return sum(f.pending for f in self.files.values())


@dataclass(slots=True)
class _Unknown:
    """A directory not followed: of a job the exporter does not know, or of a known job but
    refused for its owner. Listed rarely, never read."""

    due: float  # monotonic time of its next listing
    size: int | None = None  # bytes of its spool files at the last listing
    history: bool = False  # was there at the first poll, or was listed: its content is old
    reason: str = "unknown_job"  # or "owner": what its growth is counted as
    listing: _Listing | None = None  # in progress
    entries: int = 0
    advanced: int = 0


@dataclass
class SpoolReader:
    directory: Path
    retention: float = 7 * 86400.0
    # The names of the jobs the daemon watches, or a mapping of them to whose their directories
    # are (``Owners``; a plain collection: nobody says); None: every directory is a job.
    known_jobs: Callable[[], Collection[str] | Mapping[str, Owners]] | None = None
    poll_bytes: int = POLL_BYTES
    poll_lines: int = POLL_LINES
    max_backlog: int = MAX_BACKLOG
    history_bytes: int = HISTORY_BYTES
    root_relist_min: float = ROOT_RELIST_MIN
    root_relist_max: float = ROOT_RELIST_MAX
    unknown_relist: float = UNKNOWN_RELIST
    unknown_per_poll: int = UNKNOWN_PER_POLL
    poll_entries: int = POLL_ENTRIES
    # The uid the drills run as, the exporter's own (``checkpoint-exporter restore-drill`` runs
    # as the exporter does): its directories are read for drill events only.
    own_uid: int = field(default_factory=os.geteuid)
    monotonic: Callable[[], float] = time.monotonic
    events_total: Counter[str] = field(default_factory=Counter)
    invalid_total: Counter[str] = field(default_factory=Counter)
    # Events refused here (future, past, not_drill). The daemon adds what the jobs' clocks
    # refuse (open_saves_cap, open_restores_cap, ranks_cap, before_start) when it publishes.
    dropped_total: Counter[str] = field(default_factory=Counter)
    # Bytes never parsed: unknown_job (a directory no configured job owns), backlog (skipped
    # ahead of a file too far behind), owner (a directory or file of a user not the job's).
    dropped_bytes_total: Counter[str] = field(default_factory=Counter)
    # Known jobs with directories refused for their owner, and how many, as of the last poll.
    squatted: dict[str, int] = field(default_factory=dict)
    backlog_bytes: int = 0  # unread bytes of the followed files, as of the last poll
    poll_seconds_total: float = 0.0  # time spent polling: the spool's cost, made visible
    _dirs: dict[str, _Dir] = field(default_factory=dict)
    _unknown: dict[str, _Unknown] = field(default_factory=dict)
    _due: list[tuple[float, str]] = field(default_factory=list)  # heap over _unknown
    _unknown_listing: set[str] = field(default_factory=set)  # of _unknown, with a listing on
    _names: frozenset[str] = frozenset()  # subdirectories at the last root listing
    _jobs: frozenset[str] = frozenset()  # the jobs they are for
    _aliases: dict[str, list[str]] = field(default_factory=dict)  # job -> its <job>@... among them
    _root: tuple[int, int, int] | None = None  # dev, ino, mtime_ns at the last root listing
    _root_listed_at: float = float("-inf")
    _root_settled: bool = False  # the root's mtime was older than a tick at its last listing
    _polls: int = 0
    _reported_errors: set[str] = field(default_factory=set)
    _reported_owners: set[tuple[str, int]] = field(default_factory=set)
    _reported_drills: set[str] = field(default_factory=set)  # own_uid's, with other events
    # Directory name -> (last change, spool files left) at its last complete listing.
    _seen: dict[str, tuple[float, bool]] = field(default_factory=dict)

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
            for name in list(self._dirs):  # the first instrumented job will create it
                self._forget(name)
            for name in list(self._unknown):
                self._drop_unknown(name)
            self.backlog_bytes = 0
            return events
        except OSError as error:
            self._report(str(self.directory), error)
            return events
        try:
            known = self._known()
            current = self._list_root(root, first, known, now)
            self._follow(root, first, known, current)
            self._visit_unknown(root, known)
            self._advance(root, now)
            self._read(root, now, events)
        finally:
            os.close(root)
        self.backlog_bytes = sum(d.pending for d in self._dirs.values())
        events.sort(key=lambda e: e.ts)
        return events

    # --- the root ----------------------------------------------------------------------------

    def _list_root(
        self, root: int, first: bool, known: Mapping[str, Owners] | None, now: float
    ) -> bool:
        """List the root when due; True when its last listing holds every name it holds now:
        its mtime has not moved since, and was not so recent at the listing that a change in
        the same timestamp tick could have followed it."""
        info = os.fstat(root)
        identity = (info.st_dev, info.st_ino, info.st_mtime_ns)
        clock = self.monotonic()
        since = clock - self._root_listed_at
        if self._root is not None and identity[:2] == self._root[:2]:  # the same directory
            moved = identity != self._root
            if since < self.root_relist_max and not (moved and since >= self.root_relist_min):
                return not moved and self._root_settled
        try:
            names = frozenset(self._subdirectories(root))
        except OSError as error:
            self._report(str(self.directory), error)
            return False
        self._root, self._root_listed_at = identity, clock
        self._root_settled = now - info.st_mtime > ROOT_MTIME_TICK
        self._set_names(names)
        for name in [n for n in self._unknown if n not in names]:
            self._drop_unknown(name)
        if len(self._due) > 2 * len(self._unknown) + 64:  # drop stale heap entries
            self._due = [(due, n) for due, n in self._due if n in self._unknown]
            heapq.heapify(self._due)
        if known is None:
            return self._root_settled  # every directory is followed
        for name in names:
            if name not in self._unknown and name not in self._dirs and _job_of(name) not in known:
                self._remember(name, history=first)
        return self._root_settled

    def _set_names(self, names: frozenset[str]) -> None:
        self._names = names
        for name in [n for n in self._seen if n not in names]:
            del self._seen[name]
        self._jobs = frozenset(job for job in map(_job_of, names) if job)
        self._aliases = {}
        for name in names:
            if "@" in name:
                self._aliases.setdefault(_job_of(name), []).append(name)

    def _remember(self, name: str, history: bool, reason: str = "unknown_job") -> None:
        """Start listing ``name`` as a directory not followed (``_Unknown``)."""
        if len(self._unknown) >= MAX_UNKNOWN_DIRS:
            self._report("unknown directories", OSError(f"more than {MAX_UNKNOWN_DIRS}"))
            return
        clock = self.monotonic()
        self._unknown[name] = _Unknown(clock, history=history, reason=reason)
        heapq.heappush(self._due, (clock, name))

    @property
    def job_directories(self) -> frozenset[str]:
        """The names of the jobs with a directory in the spool at its last listing (no I/O)."""
        return self._jobs

    def listed(self) -> dict[str, Listed]:
        """Per job, what the last complete listings of its directories found (no I/O); a job
        whose directories were not listed yet is not in it. A node-scope process learns the
        jobs of a shared root from these: an empty directory is a mkdir, not a job, and the
        newest take ``max_jobs`` first."""
        jobs: dict[str, Listed] = {}
        for name, (mtime, spool_files) in self._seen.items():
            job = _job_of(name)
            if not job:
                continue
            before = jobs.get(job)
            if before is not None:
                mtime, spool_files = max(mtime, before.mtime), spool_files or before.spool_files
            jobs[job] = Listed(mtime, spool_files)
        return jobs

    def _subdirectories(self, root: int) -> list[str]:
        with os.scandir(root) as entries:
            return [e.name for e in entries if e.is_dir(follow_symlinks=False)]

    def _known(self) -> Mapping[str, Owners] | None:
        if self.known_jobs is None:
            return None
        known = self.known_jobs()
        return known if isinstance(known, Mapping) else dict.fromkeys(known)

    # --- followed directories: judged every poll, listed on the entries budget ----------------

    def _wanted(self, known: Mapping[str, Owners] | None, current: bool) -> dict[str, str]:
        """Directory name -> job, for the directories of the known jobs: the job's own name and
        the ``<job>@<uid>`` ones listed.

        While the root listing is ``current`` (the root's mtime has not moved since), only the
        jobs of the directories it showed, or followed ones (to see them go or be swapped), are
        looked at: no directory can have appeared without moving the root's mtime, so a job
        without one costs nothing (asking about every known job and opening its name at every
        poll made 1,000 idle jobs cost several times the CPU of 10). Otherwise every known job's
        own name is opened, even before a listing shows it, so a job's first events wait for no
        relisting."""
        jobs: Collection[str] = known if known is not None else self._jobs
        present: Collection[str] = ()
        if current:
            present = self._names | self._dirs.keys()
            jobs = {job for job in map(_job_of, present) if job in jobs}
        plain = [job for job in jobs if _plain_name(job) and "@" not in job]
        wanted = {job: job for job in plain if not current or job in present}
        for job in plain:
            wanted.update(dict.fromkeys(self._aliases.get(job, ()), job))
        return wanted

    def _follow(
        self, root: int, first: bool, known: Mapping[str, Owners] | None, current: bool
    ) -> None:
        wanted = self._wanted(known, current)
        for name in [n for n in self._dirs if n not in wanted]:
            self._forget(name)  # forgotten job: its state goes with it
            if name in self._names and known is not None:
                self._remember(name, history=True)
        by_job: dict[str, dict[str, tuple[int, os.stat_result]]] = {}
        for name, job in wanted.items():
            opened = self._open_dir(root, name)
            if opened is not None:
                by_job.setdefault(job, {})[name] = opened
        squatted: dict[str, int] = {}
        for job, opened in by_job.items():
            owners = {name: info.st_uid for name, (_, info) in opened.items()}
            expected = None if known is None else known.get(job)
            trusted = _trusted(owners, expected, self.own_uid)
            for name, (fd, info) in opened.items():
                if trusted is None or name in trusted.full or name in trusted.drills:
                    drills_only = trusted is not None and name in trusted.drills
                    # The listing takes the descriptor.
                    self._start(name, job, fd, info, first, trusted is None, drills_only)
                else:
                    os.close(fd)
                    self._refuse(name, first)
                    self._report_owner(job, name, owners, expected)
                    squatted[job] = squatted.get(job, 0) + 1
        self.squatted = squatted

    def _open_dir(self, root: int, name: str) -> tuple[int, os.stat_result] | None:
        """The directory ``name`` open (never through a symlink) and its fstat; None, and its
        state forgotten, if it is gone or not a directory."""
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=root)
        except OSError as error:
            self._forget(name)
            if error.errno not in _VANISHED:
                self._report(f"{self.directory}/{name}", error)
            return None
        try:
            return fd, os.fstat(fd)
        except OSError:
            os.close(fd)
            return None

    def _start(
        self, name: str, job: str, fd: int, info: os.stat_result, first: bool, held: bool,
        drills_only: bool,
    ) -> None:  # fmt: skip
        """Follow ``name`` (open as ``fd``, which this takes): a new listing unless one of that
        directory is still going round."""
        directory = self._dirs.get(name)
        if directory is None:
            unknown = self._drop_unknown(name)
            history = first or bool(unknown and unknown.history)
            directory = self._dirs[name] = _Dir(job, history=history)
        directory.held, directory.drills_only = held, drills_only
        listing = directory.listing
        if listing is not None and listing.ident == (info.st_dev, info.st_ino):
            os.close(fd)
            return
        if listing is not None:
            listing.close()  # another directory under this name since: start over
        directory.listing = self._open_listing(name, fd, info)

    def _open_listing(self, name: str, fd: int, info: os.stat_result) -> _Listing | None:
        try:
            return _Listing(fd, info)
        except OSError as error:
            os.close(fd)
            self._report(f"{self.directory}/{name}", error)
            return None

    def _refuse(self, name: str, first: bool) -> None:
        """Not the job's: listed like an unknown job's directory, its growth counted."""
        history = self._forget(name) or first
        unknown = self._unknown.get(name)
        if unknown is None:
            self._remember(name, history, reason="owner")
        else:
            unknown.reason = "owner"

    def _forget(self, name: str) -> bool:
        """Stop following ``name``; whether it was followed."""
        directory = self._dirs.pop(name, None)
        if directory is not None and directory.listing is not None:
            directory.listing.close()
        return directory is not None

    def _report_owner(
        self, job: str, name: str, owners: Mapping[str, int], expected: Owners
    ) -> None:
        """One log line per refused directory and owner."""
        owner = owners[name]
        if (name, owner) in self._reported_owners or len(self._reported_owners) >= 1000:
            return
        self._reported_owners.add((name, owner))
        where = f"{self.directory}/{name}"
        if _claimed(name) not in (None, owner):
            why = "not by the uid its name claims"
        elif expected is not None:
            why = f"not by job {job}'s ({_uids(expected)}: its spool_owner, else its tree's)"
        else:
            others = {uid for uid in owners.values() if uid not in (0, owner)}
            why = (
                f"and job {job}'s other spool directories by {_uids(others)}: its directories "
                "have more than one owner and nothing says which is the job's (set spool_owner)"
            )
        log.warning("spool: %s is owned by uid %d, %s: its events are not read", where, owner, why)

    def _report_not_drill(self, name: str) -> None:
        """One log line per directory of the exporter's uid holding events not a drill's."""
        if name in self._reported_drills or len(self._reported_drills) >= 1000:
            return
        self._reported_drills.add(name)
        log.warning(
            "spool: %s/%s is owned by the exporter's own uid %d, which writes restore drills "
            "only: its other events are not read",
            self.directory, name, self.own_uid,
        )  # fmt: skip

    # --- listings, on the poll's entries budget ---------------------------------------------------

    def _advance(self, root: int, now: float) -> None:
        """Advance the listings in progress within ``poll_entries``, max-min fairly: the ones
        that were small first (they finish within their share and leave the rest to the
        others), then the crowded ones, least recently advanced first."""
        work: list[tuple[str, _Dir | _Unknown]] = [
            (name, d) for name, d in self._dirs.items() if d.listing is not None
        ]
        work += [(name, self._unknown[name]) for name in self._unknown_listing]
        work.sort(key=_listing_order)
        left = self.poll_entries
        for index, (name, state) in enumerate(work):
            listing = state.listing
            assert listing is not None  # the ones with a listing on
            if left <= 0:
                break
            state.advanced = self._polls
            try:
                left -= self._list_some(listing, _share(left, len(work) - index, MIN_SHARE_ENTRIES))
            except OSError as error:
                self._report(f"{self.directory}/{name}", error)
                self._abandon(name, state)  # half a listing is no listing: the next starts over
                continue
            if listing.done:
                state.listing, state.entries = None, listing.count
                try:
                    if isinstance(state, _Dir):
                        self._listed(root, name, state, listing, now)
                    else:
                        self._listed_unknown(root, name, state, listing, now)
                finally:
                    listing.close()

    def _list_some(self, listing: _Listing, budget: int) -> int:
        return listing.advance(budget)

    def _abandon(self, name: str, state: _Dir | _Unknown) -> None:
        if state.listing is not None:
            state.listing.close()
            state.listing = None
        if isinstance(state, _Unknown):
            self._unknown_listing.discard(name)
            self._reschedule(name, state, self.monotonic())

    def _listed(self, root: int, name: str, directory: _Dir, listing: _Listing, now: float) -> None:
        """A followed directory's listing is complete: its files, those of other users
        counted and left, those older than ``retention`` removed, and the directory itself
        when that left it empty and idle (see ``_remove_directory``)."""
        directory.ident, directory.owner = listing.ident, listing.owner
        removed = False
        files: dict[FileKey, _Followed] = {}
        refused: dict[FileKey, int] = {}
        for file_name, st in listing.files:
            key = (st.st_dev, st.st_ino)
            if st.st_uid not in (listing.owner, 0):
                growth = st.st_size - directory.refused.get(key, 0)
                self.dropped_bytes_total["owner"] += max(0, growth)
                refused[key] = st.st_size
                continue
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
                and self._remove(listing.fd, name, file_name, key)
            ):
                del files[key]
                removed = True
        directory.files, directory.refused = files, refused
        directory.listed, directory.history = True, False
        self._saw(name, listing, [f.mtime for f in files.values()], now)
        emptied = not files and not refused and (removed or now - listing.mtime > self.retention)
        if emptied and self._remove_directory(root, name):
            del self._dirs[name]

    def _saw(self, name: str, listing: _Listing, mtimes: list[float], now: float) -> None:
        """What a complete listing of ``name`` found, for ``listed``. The spool is this node's:
        a date ahead of its clock is a tenant's ``touch -d``, which would make a job the newest
        for ever; it counts for nothing (0: oldest, when nothing else dates the directory)."""
        if name in self._names:  # not one gone from the root since
            dates = [t for t in (listing.mtime, *mtimes) if t <= now + FUTURE_SLACK]
            self._seen[name] = (max(dates, default=0.0), bool(mtimes))

    def _remove_directory(self, root: int, name: str) -> bool:
        """Remove a job's spool directory left empty by retention: its job has written nothing
        for ``retention``, and a node-scope process, which knows the jobs on a shared root by
        their spool directories, would otherwise export every job that ever ran here. rmdir
        fails on a directory a job just wrote into again (instrument recreates a removed one)."""
        try:
            os.rmdir(name, dir_fd=root)
        except OSError:
            return False
        self._set_names(self._names - {name})  # gone now, whenever the root is listed again
        return True

    # --- reading, on the poll's budget ---------------------------------------------------------

    def _read(self, root: int, now: float, out: list[Event]) -> None:
        busy = [(name, d) for name, d in self._dirs.items() if d.pending and not d.held]
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
                got, count = self._read_file(
                    fd, name, directory, key, followed, share, line_share, now, out
                )
                used += got
                parsed += count
                followed.served = self._polls
        finally:
            os.close(fd)
        return used, parsed

    def _read_file(
        self, dir_fd: int, name: str, directory: _Dir, key: FileKey, followed: _Followed,
        budget: int, lines: int, now: float, out: list[Event],
    ) -> tuple[int, int]:  # fmt: skip
        try:
            fd = os.open(followed.name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as error:
            if error.errno not in _VANISHED:
                self._report(f"{self.directory}/{name}/{followed.name}", error)
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
            self._report(f"{self.directory}/{name}/{followed.name}", error)
            return 0, 0
        finally:
            os.close(fd)
        return len(data), self._lines(data, name, directory, followed, lines, now, out)

    def _lines(
        self, data: bytes, name: str, directory: _Dir, followed: _Followed, lines: int,
        now: float, out: list[Event],
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
            self._parse(data[pos:newline], name, directory, history, now, out)
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

    def _parse(
        self, line: bytes, name: str, directory: _Dir, history: bool, now: float,
        out: list[Event],
    ) -> None:  # fmt: skip
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
        event = parse(record, directory.job, history)
        if isinstance(event, str):
            self.invalid_total[event] += 1
            return
        if directory.drills_only and not event.drill:
            self.dropped_total["not_drill"] += 1
            self._report_not_drill(name)
            return
        if event.ts > now + FUTURE_SLACK:
            self.dropped_total["future"] += 1
            return
        if event.ts < now - MAX_EVENT_AGE:
            self.dropped_total["past"] += 1
            return
        self.events_total[event.event] += 1
        out.append(event)

    # --- directories not followed: listed rarely, never read ---------------------------------

    def _visit_unknown(self, root: int, known: Mapping[str, Owners] | None) -> None:
        """Start the listings of the unknown (and refused) directories that are due, at most
        ``unknown_per_poll`` going at once."""
        clock = self.monotonic()
        while (
            self._due
            and self._due[0][0] <= clock
            and len(self._unknown_listing) < self.unknown_per_poll
        ):
            due, name = heapq.heappop(self._due)
            unknown = self._unknown.get(name)
            if unknown is None or unknown.due != due:
                continue  # stale heap entry
            known_job = known is None or _job_of(name) in known
            if unknown.reason != "owner" and known_job:
                del self._unknown[name]  # its job is known now: followed, held or refused
                continue
            if not known_job:
                unknown.reason = "unknown_job"  # a refused directory of a job forgotten since
            opened = self._open_dir(root, name)
            if opened is None:
                del self._unknown[name]  # gone, or not a directory: the root listing tells
                continue
            unknown.listing = self._open_listing(name, *opened)
            if unknown.listing is None:
                self._reschedule(name, unknown, clock)
            else:
                self._unknown_listing.add(name)

    def _listed_unknown(
        self, root: int, name: str, unknown: _Unknown, listing: _Listing, now: float
    ) -> None:
        """Its growth counted, its old files removed, the directory too once that empties it."""
        self._unknown_listing.discard(name)
        total, removed = 0, False
        left: list[float] = []  # the mtimes of the spool files left
        for file_name, st in listing.files:
            old = now - st.st_mtime > self.retention
            if old and self._remove(listing.fd, name, file_name, (st.st_dev, st.st_ino)):
                removed = True
                continue
            total += st.st_size
            left.append(st.st_mtime)
        self._saw(name, listing, left, now)
        idle = now - listing.mtime > self.retention
        if not left and (removed or idle) and self._remove_directory(root, name):
            del self._unknown[name]
            return
        # A refused directory's bytes count from the first sight: they are not the job's.
        if unknown.size is not None or not unknown.history or unknown.reason == "owner":
            self.dropped_bytes_total[unknown.reason] += max(0, total - (unknown.size or 0))
        unknown.size, unknown.history = total, True
        self._reschedule(name, unknown, self.monotonic())

    def _reschedule(self, name: str, unknown: _Unknown, clock: float) -> None:
        unknown.due = clock + self.unknown_relist
        heapq.heappush(self._due, (unknown.due, name))

    def _drop_unknown(self, name: str) -> _Unknown | None:
        unknown = self._unknown.pop(name, None)
        if unknown is not None and unknown.listing is not None:
            unknown.listing.close()
            self._unknown_listing.discard(name)
        return unknown

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


def _listing_order(item: tuple[str, _Dir | _Unknown]) -> tuple[bool, int, str]:
    name, state = item
    size = max(state.entries, state.listing.count if state.listing else 0)
    return size > MIN_SHARE_ENTRIES, state.advanced, name


def _job_of(name: str) -> str:
    """The job a spool directory is for: ``<job>``, or ``<job>@<uid>[.<any>]``."""
    return name.partition("@")[0]


def _claimed(name: str) -> int | None:
    """The uid a ``<job>@<uid>[.<any>]`` directory's name claims (-1: none that parses); None
    for the job's own ``<job>``."""
    _, at, rest = name.partition("@")
    if not at:
        return None
    uid = rest.partition(".")[0]
    return int(uid) if uid.isascii() and uid.isdigit() and len(uid) <= 10 else -1


@dataclass(frozen=True, slots=True)
class _Trusted:
    full: set[str]  # the job's: every event read
    drills: set[str]  # the exporter's own uid's: its drill events read


def _trusted(owners: Mapping[str, int], expected: Owners, own_uid: int) -> _Trusted | None:
    """Which of one job's directories (name: owner uid) are the job's; None while its owner is
    not known yet (HOLD). Root's are; a ``<job>@<uid>`` one only if that uid owns it; the others
    if their owner is ``expected``, or where nothing is expected, if one user alone owns them.
    The exporter's own uid's are trusted for drills (unless that uid is the job's: expected, or
    where nothing is expected, the only user writing for it): they are not the job's, and are
    no contest either."""
    if expected is not None and not expected:
        return None
    honest = {n: uid for n, uid in owners.items() if uid == 0 or _claimed(n) in (None, uid)}
    if expected is None:
        # Nothing says whose the job is: the exporter's uid is the job's where no other user
        # writes for it (one user running both; drills-only refused every save of theirs).
        others = {uid for uid in honest.values() if uid not in (0, own_uid)}
        theirs = others or {own_uid}
    else:
        theirs = expected
    drills = {n for n, uid in honest.items() if uid == own_uid != 0 and uid not in theirs}
    jobs = {n: uid for n, uid in honest.items() if n not in drills}
    if expected is not None:
        return _Trusted({n for n, uid in jobs.items() if uid == 0 or uid in expected}, drills)
    users = {uid for uid in jobs.values() if uid != 0}
    full = set(jobs) if len(users) <= 1 else {n for n, uid in jobs.items() if uid == 0}
    return _Trusted(full, drills)


def _uids(uids: Collection[int]) -> str:
    return ("uid " if len(uids) == 1 else "uids ") + ", ".join(map(str, sorted(uids)))


def _plain_name(name: object) -> bool:
    return (
        isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
        and "\0" not in name
    )  # fmt: skip
