"""Incremental, read-only listing of a checkpoint tree.

A rescan costs what changed, not the size of the tree: a directory whose mtime is unchanged is
not listed again (its subdirectories are still lstat-ed, since a change deep down only touches
the deepest directory's mtime); a file is statted when it first appears and again only while its
directory is *hot* (a generation being written), at most once a second and at most
``HOT_RESTAT_FILES_PER_SECOND`` files a second.

Two kinds of file are exceptions, because a write to them changes no directory's mtime:
*markers* (the files a layout reads or commits by: pointer files rewritten in place, trackers,
``.metadata``, single-file checkpoints; ``markers`` decides) are re-statted on every read, and a
changed one (size, mtime, inode or ctime: a rename over the name is a new file) is read again;
*touched* files, the ones the watcher reported an event on, are re-statted on the read that
follows. The extra cost is O(markers + touched), never O(files). Every stat, listing and read is
spent from an ``OpsBudget`` that caps the load on shared storage.

Nothing is ever written, and symlinks are recorded, never followed. The listing is built of
immutable ``Dir`` objects; an unchanged subtree is the very same object as before, so anything
derived from it (``Dir.totals``) is computed once per change.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from array import array
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field

from checkpoint_exporter.sources import fsread

log = logging.getLogger(__name__)

FILE, DIR, LINK, OTHER = "f", "d", "l", "o"
HOT_RESTAT_SECONDS = 1.0
# A generation being written is re-statted to follow its bytes and liveness, but never faster
# than this many files per second: a 4,096-rank save costs its new files, not files x seconds.
HOT_RESTAT_FILES_PER_SECOND = 1000
# Markers looked up in one directory above which a pass indexes its names once (a dict for the
# pass, dropped after it) instead of searching them linearly for each.
_INDEX_ABOVE = 16


class OpsBudget:
    """A token bucket of metadata operations (stat, listdir, open) per second; 0 = no limit.

    The bucket holds a quarter second of operations, so no second sees much more than the
    budget (a bucket of a whole second would let one second see twice as much). Shared by the
    scan workers of every filesystem it covers: the accounting is under a lock, the wait outside
    it."""

    BURST_SECONDS = 0.25

    def __init__(self, per_second: float = 0, sleep: Callable[[float], None] = time.sleep):
        self.per_second = per_second
        self.total = 0
        self._capacity = per_second * self.BURST_SECONDS
        self._tokens = self._capacity
        self._updated = time.monotonic()
        self._sleep = sleep
        self._lock = threading.Lock()

    def spend(self, count: int = 1) -> None:
        with self._lock:
            self.total += count
            if self.per_second <= 0:
                return
            now = time.monotonic()
            refill = (now - self._updated) * self.per_second
            self._tokens = min(self._capacity, self._tokens + refill)
            self._updated = now
            self._tokens -= count
            if self._tokens >= 0:
                return
            wait = -self._tokens / self.per_second
        self._sleep(wait)
        with self._lock:
            self._tokens = 0
            self._updated = time.monotonic()


@dataclass(frozen=True)
class Totals:
    bytes: int
    files: int
    min_mtime: float  # 0 when there are no files
    max_mtime: float


class Dir:
    """One listed directory: its entries as compact parallel arrays, plus listed subdirectories."""

    __slots__ = (
        "_totals",
        "contents",
        "error",
        "kinds",
        "markers",
        "mtime",
        "mtime_ns",
        "mtimes",
        "names",
        "sizes",
        "stamps",
        "stat_at",
        "subdirs",
        "uploading",
    )

    def __init__(
        self,
        mtime_ns: int,
        names: tuple[str, ...] = (),
        kinds: str = "",
        sizes: array | None = None,
        mtimes: array | None = None,
        subdirs: dict[str, Dir] | None = None,
        contents: dict[str, bytes] | None = None,
        error: str | None = None,
        stat_at: float = 0.0,
        stamps: dict[str, tuple[int, int]] | None = None,
        uploading: frozenset[str] = frozenset(),
    ) -> None:
        self.mtime_ns = mtime_ns
        self.mtime = mtime_ns / 1e9
        self.names = names
        self.kinds = kinds
        self.sizes = sizes if sizes is not None else array("q")
        self.mtimes = mtimes if mtimes is not None else array("d")
        self.subdirs = subdirs or {}
        self.contents = contents or {}
        self.error = error
        self.stat_at = stat_at
        # Marker files only: name -> (inode, ctime ns). What tells a rewrite or a rename over
        # the name from the same file when size and mtime (coarse on some filers) agree.
        self.stamps = stamps or {}
        self.markers = tuple(self.stamps)  # re-statted on every read
        # Files the store says are still being written (object storage: an open multipart
        # upload with no object at its key yet), whatever their size does. Empty on a
        # filesystem, where a file being written looks like any other.
        self.uploading = uploading
        self._totals: Totals | None = None

    def _position(self, name: str) -> int | None:
        # A linear search in C, not a cached name index: an index per directory would cost
        # more memory than the listing itself (about 48 bytes per file), kept for every
        # committed generation. Many look-ups in one directory go through ``file_sizes``.
        try:
            return self.names.index(name)
        except ValueError:
            return None

    def kind(self, name: str) -> str | None:
        position = self._position(name)
        return None if position is None else self.kinds[position]

    def has_file(self, name: str) -> bool:
        return self.kind(name) == FILE

    def file(self, name: str) -> tuple[int, float] | None:
        """(size, mtime) of a regular file, or None."""
        position = self._position(name)
        if position is None or self.kinds[position] != FILE:
            return None
        return self.sizes[position], self.mtimes[position]

    def file_sizes(self) -> dict[str, int]:
        """Name -> size of every regular file here; built per call, for many look-ups."""
        return {name: self.sizes[i] for i, name in enumerate(self.names) if self.kinds[i] == FILE}

    def entries(self, kind: str | None = None) -> Iterator[tuple[str, str, int, float]]:
        """(name, kind, size, mtime) for each entry, optionally of one kind."""
        for i, name in enumerate(self.names):
            if kind is None or self.kinds[i] == kind:
                yield name, self.kinds[i], self.sizes[i], self.mtimes[i]

    def dirs(self) -> Iterator[tuple[str, Dir]]:
        return iter(self.subdirs.items())

    def directory_of(self, path: str) -> Dir | None:
        """The listed directory ``path`` (relative) names, or the one holding the file it names;
        None when it is not in this listing."""
        here, parts = self, [part for part in path.split("/") if part not in ("", ".")]
        for position, part in enumerate(parts):
            child = here.subdirs.get(part)
            if child is None:
                last = position == len(parts) - 1
                return here if last and here.kind(part) == FILE else None
            here = child
        return here

    def totals(self) -> Totals:
        """Bytes, file count and mtime range of every regular file below, computed once."""
        if self._totals is None:
            files = self.kinds.count(FILE)
            if files == len(self.kinds):  # only files, as in a generation's shard directory
                total_bytes = sum(self.sizes)
                low, high = min(self.mtimes, default=float("inf")), max(self.mtimes, default=0.0)
            else:
                total_bytes, low, high = 0, float("inf"), 0.0
                for i, kind in enumerate(self.kinds):
                    if kind == FILE:
                        total_bytes += self.sizes[i]
                        low = min(low, self.mtimes[i])
                        high = max(high, self.mtimes[i])
            for child in self.subdirs.values():
                sub = child.totals()
                total_bytes += sub.bytes
                files += sub.files
                if sub.files:
                    low, high = min(low, sub.min_mtime), max(high, sub.max_mtime)
                high = max(high, child.mtime)
            self._totals = Totals(total_bytes, files, 0.0 if files == 0 else low, high)
        return self._totals

    def walk(self, prefix: str = "") -> Iterator[tuple[str, int, float]]:
        """(relative path, size, mtime) of every regular file below."""
        for name, _, size, mtime in self.entries(FILE):
            yield prefix + name, size, mtime
        for name, child in self.subdirs.items():
            yield from child.walk(f"{prefix}{name}/")


@dataclass
class ScanStats:
    listed: int = 0
    statted: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class _Pass:
    """What one rescan was asked to do."""

    hot: frozenset[str]
    force: bool
    force_paths: frozenset[str]
    touched: dict[str, frozenset[str]]  # directory -> names the watcher reported events on
    now: float
    stats: ScanStats


class TreeReader:
    """Keeps the listing of one root current across rescans."""

    def __init__(
        self,
        root: os.PathLike[str] | str,
        budget: OpsBudget,
        content_names: Collection[str] = (),
        max_depth: int = 8,
        content_limit: int = 64 * 1024,
        marker_names: Collection[str] = (),
        marker_suffixes: tuple[str, ...] = (),
        follow_root_symlink: bool | None = None,
        root_marker: Callable[[str], bool] | None = None,
    ) -> None:
        self.root = os.fspath(root)
        # A configured root may be a symlink (the operator's choice); one that becomes a
        # symlink later, or a discovered job's root (a tenant's directory), is not followed.
        if follow_root_symlink is None:
            follow_root_symlink = os.path.islink(self.root)
        self.follow_root_symlink = follow_root_symlink
        self.budget = budget
        self.content_names = frozenset(content_names)
        # Content files are always markers: their bytes are what a layout decides by.
        self.marker_names = self.content_names.union(marker_names)
        self.marker_suffixes = marker_suffixes
        # Markers in the root directory only (single-file checkpoints that grow in place beside
        # each other, torch.save's ``ckpt_step_N.pt``): a suffix such as ``.pt`` matched at any
        # depth would make every rank's state file inside a generation directory (DeepSpeed,
        # Megatron) a marker, one stat each on every read.
        self.root_marker = root_marker
        self.max_depth = max_depth
        self.content_limit = content_limit
        self.tree: Dir | None = None
        # Entries listed or statted since this reader was made, counted as a read goes: the
        # first pass's progress, and proof that a long read is moving, not hung.
        self.entries_read = 0
        self.root_owner: int | None = None  # the root's uid, as of the last read that opened it
        self._reported: set[tuple[str, str]] = set()

    def read(
        self,
        hot: Collection[str] = (),
        force: bool = False,
        force_paths: Collection[str] = (),
        touched: Collection[str] = (),
    ) -> tuple[Dir | None, ScanStats]:
        """Rescan; ``hot`` holds relative directory paths whose files are re-statted (1/s).

        ``force`` lists and stats everything again (the periodic reconcile); ``force_paths``
        does so below the given relative paths only (a generation's final stat at its commit);
        ``touched`` names relative file paths the watcher saw written, renamed or changed.
        """
        stats = ScanStats()
        now = time.monotonic()
        try:
            self.budget.spend()
            root = fsread.open_directory(self.root, follow_symlink=self.follow_root_symlink)
        except OSError as error:
            self.tree = None
            if error.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(self.root):
                self._error(stats, "", "is a symlink: not followed")
            elif error.errno == errno.ENOTDIR:
                self._error(stats, "", "not a directory")
            elif error.errno != errno.ENOENT:
                self._error(stats, "", _reason(error))
            return None, stats
        by_directory: dict[str, set[str]] = {}
        for path in touched:
            directory, _, name = path.rpartition("/")
            if name:
                by_directory.setdefault(directory, set()).add(name)
        scan = _Pass(
            frozenset(hot),
            force,
            frozenset(force_paths),
            {directory: frozenset(names) for directory, names in by_directory.items()},
            now,
            stats,
        )
        try:
            info = os.fstat(root)
            self.root_owner = info.st_uid
            self.tree = self._read_dir(root, self.root, "", info.st_mtime_ns, self.tree, 0, scan)
        finally:
            os.close(root)
        return self.tree, stats

    def _error(self, stats: ScanStats, relative: str, reason: str) -> None:
        stats.errors.append((relative, reason))
        if (relative, reason) not in self._reported:
            self._reported.add((relative, reason))
            log.warning("cannot read %s: %s", os.path.join(self.root, relative), reason)

    def _read_dir(
        self,
        directory: int,
        path: str,
        relative: str,
        mtime_ns: int,
        old: Dir | None,
        depth: int,
        scan: _Pass,
    ) -> Dir:
        """Read the directory open as ``directory`` (the caller closes it); ``path`` only names
        it in messages: every entry is reached relative to a descriptor, never by path."""
        now, stats = scan.now, scan.stats
        force = scan.force or _is_under(relative, scan.force_paths)
        is_hot = _is_under(relative, scan.hot)
        changed = force or old is None or old.mtime_ns != mtime_ns or old.error is not None
        restat = changed and (force or old is None or old.error is not None)
        if is_hot and old is not None and now - old.stat_at >= _restat_period(len(old.names)):
            restat = True
        recheck = self._recheck_names(old, relative, scan)
        if not changed and not restat and recheck:
            assert old is not None
            rechecked = self._recheck(directory, relative, old, recheck, scan)
            if rechecked is None:
                changed = True  # a marker vanished or changed kind: list the directory again
            elif rechecked is not old:  # same names, fresh stats; then the subdirectories
                subdirs, _ = self._read_subdirs(directory, path, relative, rechecked, depth, scan)
                rechecked.subdirs = subdirs
                return rechecked
        if not changed and not restat:
            assert old is not None
            subdirs, rebuilt = self._read_subdirs(directory, path, relative, old, depth, scan)
            if not rebuilt:
                return old  # the same object: nothing below changed
            return Dir(
                old.mtime_ns, old.names, old.kinds, old.sizes, old.mtimes, subdirs,
                old.contents, None, old.stat_at, old.stamps,
            )  # fmt: skip
        # Everything in this directory is read relative to its descriptor: the kernel resolves
        # the long path once, not once per shard (most of a cold scan), and nothing is reached
        # through a symlink swapped in above it.
        try:
            if changed:
                self.budget.spend()
                if restat:  # every entry is statted anyway: the names are enough
                    listed_names = os.listdir(directory)
                else:
                    with os.scandir(directory) as iterator:
                        listed = [(entry.name, _kind_of(entry)) for entry in iterator]
                stats.listed += 1
            elif restat:
                assert old is not None
                listed_names = list(old.names)
        except OSError as error:
            return self._unreadable(mtime_ns, relative, error, stats)
        if restat:
            names, kinds, sizes, mtimes, subdir_mtimes, stamps = self._stat_all(
                directory, relative, listed_names, stats
            )
        else:  # listed anew; known files keep their stat, but for markers and touched ones
            assert old is not None
            previous = {
                name: (size, mtime)
                for name, _, size, mtime in old.entries(FILE)
                if name not in recheck  # old markers are in it; new ones are statted
            }
            names, kinds, sizes, mtimes, subdir_mtimes, stamps = self._stat_entries(
                directory, relative, listed, previous, stats
            )
        contents: dict[str, bytes] = {}
        for name in self.content_names.intersection(names):
            position = names.index(name)
            if kinds[position] == FILE and sizes[position] <= self.content_limit:
                content = self._content(
                    directory, relative, name, sizes[position], mtimes[position],
                    stamps.get(name), old, stats,
                )  # fmt: skip
                if content is not None:
                    contents[name] = content
        subdirs = {}
        if depth < self.max_depth:
            for name, kind in zip(names, kinds, strict=True):
                if kind != DIR:
                    continue
                child_old = old.subdirs.get(name) if old is not None else None
                child = self._child(
                    directory, path, relative, name, child_old, depth, scan,
                    subdir_mtimes.get(name),
                )  # fmt: skip
                if child is not None:
                    subdirs[name] = child
        return Dir(
            mtime_ns, tuple(names), "".join(kinds), sizes, mtimes, subdirs, contents, None,
            now if restat else (old.stat_at if old is not None else now), stamps,
        )  # fmt: skip

    def is_marker(self, name: str, relative: str | None = None) -> bool:
        """``relative``: the directory holding ``name`` ("" for the root; None: not the root)."""
        if name in self.marker_names or name.endswith(self.marker_suffixes):
            return True
        return relative == "" and self.root_marker is not None and self.root_marker(name)

    def _markers_among(self, names: list[str], relative: str) -> set[str]:
        """The marker names in a listing, at C speed for the common case: a shard directory of
        thousands of files holds none, and a cold scan must stay close to `find`."""
        found = set(self.marker_names.intersection(names))
        if self.marker_suffixes and names:
            joined = "\n".join(names) + "\n"
            if any(suffix + "\n" in joined for suffix in self.marker_suffixes):
                found.update(name for name in names if name.endswith(self.marker_suffixes))
        if relative == "" and self.root_marker is not None:
            found.update(filter(self.root_marker, names))
        return found

    def _recheck_names(self, old: Dir | None, relative: str, scan: _Pass) -> frozenset[str]:
        """Known files to stat again although their directory did not change: every marker,
        and whatever the watcher reported an event on."""
        if old is None:
            return frozenset()
        touched = scan.touched.get(relative)
        if touched is None:
            return frozenset(old.markers)
        return frozenset(old.markers).union(touched)

    def _recheck(
        self, directory: int, relative: str, old: Dir, names: frozenset[str], scan: _Pass
    ) -> Dir | None:
        """``old`` with fresh stats (and contents) for ``names``: the same object when nothing
        changed, None when one vanished or is no longer a regular file (list again)."""
        stats = scan.stats
        updates: dict[int, os.stat_result] = {}
        # Many markers in one directory (a torch.save run keeping every ``ckpt_step_N.pt`` in
        # its root, Lightning's top-k -1): one index for this pass, not a linear search each,
        # which made a root of 20,000 step files cost seconds of CPU on every read.
        index = (
            {name: position for position, name in enumerate(old.names)}
            if len(names) > _INDEX_ABOVE
            else None
        )
        for name in names:
            position = old._position(name) if index is None else index.get(name)
            if position is None:
                continue  # new since the listing: the directory's mtime says so
            if old.kinds[position] != FILE:
                continue
            self.budget.spend()
            try:
                status = os.lstat(name, dir_fd=directory)
            except FileNotFoundError:
                return None
            except OSError as error:
                self._error(stats, _join(relative, name), _reason(error))
                continue
            stats.statted += 1
            if not stat.S_ISREG(status.st_mode):
                return None
            stamp = (status.st_ino, status.st_ctime_ns)
            if (
                status.st_size != old.sizes[position]
                or status.st_mtime != old.mtimes[position]
                or old.stamps.get(name, stamp) != stamp
            ):
                updates[position] = status
        if not updates:
            return old
        sizes, mtimes = array("q", old.sizes), array("d", old.mtimes)
        stamps = dict(old.stamps)
        contents = dict(old.contents)
        for position, status in updates.items():
            name = old.names[position]
            sizes[position], mtimes[position] = status.st_size, status.st_mtime
            if self.is_marker(name, relative):
                stamps[name] = (status.st_ino, status.st_ctime_ns)
            if name in self.content_names:
                contents.pop(name, None)
                if status.st_size <= self.content_limit:
                    content = self._content(
                        directory, relative, name, status.st_size, status.st_mtime,
                        stamps.get(name), None, stats,
                    )  # fmt: skip
                    if content is not None:
                        contents[name] = content
        return Dir(
            old.mtime_ns, old.names, old.kinds, sizes, mtimes, old.subdirs, contents, None,
            old.stat_at, stamps,
        )  # fmt: skip

    def _unreadable(self, mtime_ns: int, relative: str, error: OSError, stats: ScanStats) -> Dir:
        if error.errno == errno.ENOENT:
            return Dir(mtime_ns, error="vanished")
        self._error(stats, relative, _reason(error))
        return Dir(mtime_ns, error=_reason(error))

    def _stat_all(
        self, directory: int, relative: str, listed: list[str], stats: ScanStats
    ) -> tuple[list[str], list[str], array, array, dict[str, int], dict[str, tuple[int, int]]]:
        """Every entry lstat-ed (a first or forced read, or a hot generation's re-stat): the
        cold-scan path, kept to one system call and a few list operations per entry."""
        self.budget.spend(len(listed))
        lstat = os.lstat
        try:
            results = [lstat(name, dir_fd=directory) for name in listed]
            names = listed
        except OSError:  # one entry went or cannot be read: again, one by one
            self.budget.spend(len(listed))
            names, results = [], []
            for name in listed:
                try:
                    results.append(lstat(name, dir_fd=directory))
                except FileNotFoundError:
                    continue  # removed since the listing (retention racing the scan)
                except OSError as error:
                    self._error(stats, _join(relative, name), _reason(error))
                    continue
                names.append(name)
        stats.statted += len(results)
        self.entries_read += len(results)
        is_file = stat.S_ISREG
        kinds = [FILE if is_file(r.st_mode) else _kind_of_mode(r.st_mode) for r in results]
        subdir_mtimes = (
            {n: r.st_mtime_ns for n, k, r in zip(names, kinds, results, strict=True) if k == DIR}
            if DIR in kinds
            else {}
        )
        sizes = array("q", [r.st_size for r in results])
        mtimes = array("d", [r.st_mtime for r in results])
        stamps = {}
        markers = self._markers_among(names, relative)
        positions = (
            (position for position, name in enumerate(names) if name in markers)
            if len(markers) > _INDEX_ABOVE
            else (names.index(name) for name in markers)
        )
        for position in positions:
            name = names[position]
            if kinds[position] == FILE:
                stamps[name] = (results[position].st_ino, results[position].st_ctime_ns)
        return names, kinds, sizes, mtimes, subdir_mtimes, stamps

    def _stat_entries(
        self,
        directory: int,
        relative: str,
        listed: list[tuple[str, str]],
        previous: dict[str, tuple[int, float]],
        stats: ScanStats,
    ) -> tuple[list[str], list[str], array, array, dict[str, int], dict[str, tuple[int, int]]]:
        """Names, kinds, sizes and mtimes of the listed entries; a file known from the last
        listing keeps its stat (``previous``), everything else is lstat-ed once."""
        names: list[str] = []
        kinds: list[str] = []
        sizes, mtimes = array("q"), array("d")
        subdir_mtimes: dict[str, int] = {}
        stamps: dict[str, tuple[int, int]] = {}
        known = (
            sum(1 for name, kind in listed if kind == FILE and name in previous) if previous else 0
        )
        self.budget.spend(len(listed) - known)
        lstat, statted = os.lstat, 0
        for name, kind in listed:
            if kind == FILE and name in previous:
                size, mtime = previous[name]
            else:
                try:
                    entry = lstat(name, dir_fd=directory)
                except FileNotFoundError:
                    continue  # removed since the listing (retention racing the scan)
                except OSError as error:
                    self._error(stats, _join(relative, name), _reason(error))
                    continue
                statted += 1
                mode = entry.st_mode
                kind = FILE if stat.S_ISREG(mode) else _kind_of_mode(mode)
                size, mtime = entry.st_size, entry.st_mtime
                if kind == DIR:
                    subdir_mtimes[name] = entry.st_mtime_ns
                elif kind == FILE and self.is_marker(name, relative):
                    stamps[name] = (entry.st_ino, entry.st_ctime_ns)
            names.append(name)
            kinds.append(kind)
            sizes.append(size)
            mtimes.append(mtime)
        stats.statted += statted
        self.entries_read += len(names)
        return names, kinds, sizes, mtimes, subdir_mtimes, stamps

    def _read_subdirs(
        self, directory: int, path: str, relative: str, old: Dir, depth: int, scan: _Pass
    ) -> tuple[dict[str, Dir], bool]:
        subdirs: dict[str, Dir] = {}
        rebuilt = False
        for name, child_old in old.subdirs.items():
            child = self._child(directory, path, relative, name, child_old, depth, scan)
            if child is not child_old:
                rebuilt = True
            if child is not None:
                subdirs[name] = child
        return subdirs, rebuilt

    def _child(
        self,
        directory: int,
        path: str,
        relative: str,
        name: str,
        old: Dir | None,
        depth: int,
        scan: _Pass,
        mtime_ns: int | None = None,
    ) -> Dir | None:
        """A subdirectory, opened relative to its parent and never through a symlink: one that
        was swapped for a symlink or a file since the parent's listing is left out (the
        parent's next listing says what it became)."""
        stats = scan.stats
        relative_child = _join(relative, name)
        try:
            if mtime_ns is None:
                self.budget.spend()
            child = fsread.open_directory(name, dir_fd=directory)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR):
                return None
            if error.errno in (errno.EACCES, errno.EPERM):
                # Unreadable (mode 000 and the like): kept as an error and retried every read.
                return self._unreadable(mtime_ns or 0, relative_child, error, stats)
            self._error(stats, relative_child, _reason(error))
            return None
        try:
            if mtime_ns is None:
                mtime_ns = os.fstat(child).st_mtime_ns
                stats.statted += 1
            child_path = os.path.join(path, name)
            return self._read_dir(child, child_path, relative_child, mtime_ns, old, depth + 1, scan)
        finally:
            os.close(child)

    def _content(
        self,
        directory: int,
        relative: str,
        name: str,
        size: int,
        mtime: float,
        stamp: tuple[int, int] | None,
        old: Dir | None,
        stats: ScanStats,
    ) -> bytes | None:
        if (
            old is not None
            and name in old.contents
            and old.file(name) == (size, mtime)
            and stamp is not None
            and old.stamps.get(name) == stamp
        ):
            return old.contents[name]
        try:
            self.budget.spend()
            return fsread.read_bytes(name, self.content_limit, dir_fd=directory)
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # grew past the limit since its stat: read as an oversized marker
        except OSError as error:
            self._error(stats, _join(relative, name), _reason(error))
            return None


def _restat_period(entries: int) -> float:
    return max(HOT_RESTAT_SECONDS, entries / HOT_RESTAT_FILES_PER_SECOND)


def _join(relative: str, name: str) -> str:
    return f"{relative}/{name}" if relative else name


def _is_under(relative: str, hot: frozenset[str]) -> bool:
    if not hot:
        return False
    while True:
        if relative in hot:
            return True
        if not relative:
            return False
        relative = relative.rpartition("/")[0]


def _kind_of(entry: os.DirEntry[str]) -> str:
    try:  # most entries are shards: one question answers them
        if entry.is_file(follow_symlinks=False):
            return FILE
        if entry.is_dir(follow_symlinks=False):
            return DIR
        if entry.is_symlink():
            return LINK
    except OSError:
        pass
    return OTHER


def _kind_of_mode(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return LINK
    if stat.S_ISDIR(mode):
        return DIR
    if stat.S_ISREG(mode):
        return FILE
    return OTHER


def _reason(error: OSError) -> str:
    if error.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return error.strerror or str(error)
