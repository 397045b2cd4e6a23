"""Reading a checkpoint tree kept in object storage: a listing of keys becomes the ``Dir`` records
every layout parses (sources/listing.py), so a writer's commit rules hold whatever the storage.

One read lists the prefix with a delimiter (the root's own objects and one prefix per
generation), then each generation's keys in full (paginated), except a generation already
*sealed* (a commit marker among its own objects, and its last listing the same as the one
before), not hot and not asked for: that one is the same ``Dir`` as before, so an idle poll
costs one LIST plus one ListMultipartUploads, however many generations are kept. A marker alone
does not seal: a writer's commit may go on after its marker appears (DCP through s3fs renames
``.metadata.tmp`` as S3 can, a COPY then a DELETE), so the generation is listed until two
listings agree, which costs one LIST per save. Nor does a marker written when a save starts
(``opening_markers``: Orbax's ``_CHECKPOINT_METADATA``): what a killed save left is listed at
every read, one LIST each, so a save written again under its name is seen. Every request is
spent from the ``OpsBudget`` shared storage gets, and one read makes at most ``max_requests`` of
them: a bucket holding millions of keys under the prefix is an error of that job, not a daemon
busy for an hour.

A save in progress is what the store shows of it: an open multipart upload is a file being
written, at its key, sized by the parts uploaded so far. Its time is the store's clock in no
way: an upload is dated when a listing first saw it, and again whenever its size moved (moto
reports 2010 for every upload; a storage clock drifts). Marker contents (``latest``,
``trainer_state.json``) are ranged GETs of at most ``content_limit`` bytes.

The store behind it is an ``ObjectStore`` (sources/object_store.py): sources/s3.py (S3 and
S3-compatible stores), sources/gcs.py or sources/azure.py, chosen by scheme in sources/stores.py.
"""

from __future__ import annotations

import logging
import time
import zlib
from array import array
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from checkpoint_exporter.model import (
    ObjectStoreUsage,
)
from checkpoint_exporter.sources.listing import DIR, FILE, Dir, OpsBudget, ScanStats
from checkpoint_exporter.sources.object_store import (
    DENIED_CODES,
    GET,
    OBJECT_GONE_CODES,
    STORE_GONE_CODES,
    ObjectInfo,
    ObjectStore,
    RequestCounter,
    StoreError,
    Upload,
)
from checkpoint_exporter.storage_url import ObjectURL

log = logging.getLogger(__name__)

# Requests one read may make: 1,000 pages of 1,000 keys. Past it the read fails for this job.
MAX_REQUESTS_PER_READ = 1000
# Open uploads whose parts are listed (for their size and progress) per read.
MAX_UPLOADS_SIZED = 100
# An upload whose size has not moved for this long (a killed save's, left open) has its parts
# listed again only this often: the slots go to the uploads that move.
STALE_UPLOAD_SECONDS = 600.0
# After a read the store refused (throttled, denied, missing) or that ran over its request
# budget, the next ones make no request for a pause that doubles while they keep failing: a
# store is billed and throttled per request, and a read asked every second while a save is
# in progress would otherwise repeat the failure every second.
BACKOFF_SECONDS = (5.0, 300.0)  # the first pause, the longest

UPLOADS = "(uploads in flight)"  # how the uploads' listing is named where it failed


class OverBudget(Exception):
    pass


@dataclass
class _Seen:
    """An open upload as the reader follows it: its size and when that last moved."""

    upload: Upload
    size: int
    moved_at: float  # wall time
    sized_at: float = 0.0  # wall time its parts were last listed


@dataclass
class _ReadState:
    """What one read was asked to do and has spent."""

    relist: frozenset[str]  # first components of hot or forced paths
    force: bool
    stats: ScanStats
    requests: int = 0
    uploads_by_generation: dict[str, list[_Seen]] = field(default_factory=dict)


class ObjectTreeReader:
    """Keeps the listing of one object prefix current across reads; the same interface as
    ``TreeReader`` (``read``, ``tree``, ``entries_read``), so the daemon reads it alike."""

    follow_root_symlink = False  # no symlinks in object storage
    root_owner: int | None = None  # no owner uid: the spool is matched by the job's name

    def __init__(
        self,
        url: ObjectURL,
        store: ObjectStore,
        counter: RequestCounter,
        budget: OpsBudget,
        content_names: Collection[str] = (),
        marker_names: Collection[str] = (),
        opening_markers: Collection[str] = (),
        max_depth: int = 8,
        content_limit: int = 64 * 1024,
        max_requests: int = MAX_REQUESTS_PER_READ,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.root = str(url)
        self.store = store
        self.counter = counter
        self.budget = budget
        self.content_names = frozenset(content_names)
        self.marker_names = self.content_names.union(marker_names)
        # A marker a writer creates when its save starts seals nothing: a killed save keeps it,
        # and a save written again under that name (Orbax on gs:// resuming at the killed step)
        # would stay unlisted until a full read.
        self.seal_names = self.marker_names.difference(opening_markers)
        self.max_depth = max_depth
        self.content_limit = content_limit
        self.max_requests = max_requests
        self.clock = clock
        self.tree: Dir | None = None
        self.entries_read = 0
        # Requests made, answered or not: what the stuck-worker check counts as progress, since a
        # read may be a hundred ListParts and ranged GETs with no new entry listed.
        self.requests_made = 0
        # Every open upload, by (key, upload id), in the store's order: by key, then the oldest
        # first (S3 lists several uploads of one key by initiation).
        self._uploads: dict[tuple[str, str], _Seen] = {}
        self._contents: dict[tuple[str, str, int], bytes] = {}  # (key, etag, size) -> bytes
        self._reported: set[str] = set()
        self._settled: set[str] = set()  # generations whose last listing repeated the one before
        self._failures = 0  # reads failed in a row
        self._quiet_until = float("-inf")  # (clock) no request before this, after a failure
        self._last_errors: list[tuple[str, str]] = []

    # --- the reader's interface ---------------------------------------------------------------

    def read(
        self,
        hot: Collection[str] = (),
        force: bool = False,
        force_paths: Collection[str] = (),
        touched: Collection[str] = (),
    ) -> tuple[Dir | None, ScanStats]:
        """List the prefix again. ``hot`` and ``force_paths`` name relative paths whose
        generation is listed in full even when sealed; ``force`` lists every one. ``touched``
        means nothing here (no watcher sees object storage)."""
        relist = frozenset(path.split("/", 1)[0] for path in (*hot, *force_paths) if path)
        state = _ReadState(relist, force, ScanStats())
        now = self.clock()
        # Backing off: what the failed read said, no request (a clock set back is no longer pause).
        if now < self._quiet_until <= now + BACKOFF_SECONDS[1]:
            state.stats.errors.extend(self._last_errors)
            return self.tree, state.stats
        try:
            self.tree = self._read(state)
        except StoreError as error:
            self._failed(state.stats, f"{error.code}: {error.reason}")
            if error.code in STORE_GONE_CODES:
                self.tree = None  # nothing known any more: every generation is unknown
        except OverBudget:
            self._failed(
                state.stats,
                f"the listing needs more than {self.max_requests} requests: "
                "a narrower prefix, or a larger request budget",
            )
        failed = any(not path for path, _ in state.stats.errors)  # the read itself failed
        self._failures = self._failures + 1 if failed else 0
        if failed:
            first, longest = BACKOFF_SECONDS
            self._quiet_until = now + min(longest, first * 2 ** (self._failures - 1))
            self._last_errors = list(state.stats.errors)
        return self.tree, state.stats

    def fetch(self, relative: str, limit: int) -> bytes:
        """The first ``limit`` bytes of one object below the prefix: one ranged GET, counted
        (the content checks of a generation: DCP's metadata); none while the reads back off."""
        if self.clock() < self._quiet_until:
            raise StoreError(GET, "backing_off", "the store refused the last read: asked later")
        self.requests_made += 1
        return self.store.get_range(self.url.prefix + relative, limit)

    def usage(self) -> ObjectStoreUsage:
        requests, errors = self.counter.totals()
        uploads = list(self._uploads.values())
        sizes_known = all(seen.size >= 0 for seen in uploads)
        return ObjectStoreUsage(
            requests,
            errors,
            len(uploads),
            sum(seen.size for seen in uploads) if sizes_known else None,
            min((seen.moved_at for seen in uploads), default=None),
        )

    # --- one read ------------------------------------------------------------------------------

    def _read(self, state: _ReadState) -> Dir:
        now = self.clock()
        prefix = self.url.prefix
        self._follow_uploads(state, now)
        objects, generations = self._list(state, prefix, "/")
        old = self.tree
        subdirs: dict[str, Dir] = {}
        settled: set[str] = set()
        for generation_prefix in generations:
            name = generation_prefix[len(prefix) :].rstrip("/")
            if not name:
                continue
            previous = old.subdirs.get(name) if old is not None else None
            uploads = state.uploads_by_generation.pop(name, [])
            if previous is not None and not uploads and self._sealed(name, previous, state):
                subdirs[name] = previous
                settled.add(name)
                continue
            keys, _ = self._list(state, generation_prefix, None)
            listed = self._build(generation_prefix, keys, uploads, state, depth=1)
            if previous is not None and _keep_unchanged(previous, listed) is previous:
                settled.add(name)
            subdirs[name] = listed
        # Uploads under a generation that has no object yet (the first shard still uploading).
        for name, uploads in state.uploads_by_generation.items():
            if name:
                subdirs[name] = self._build(f"{prefix}{name}/", [], uploads, state, depth=1)
        root_uploads = state.uploads_by_generation.get("", [])
        root = self._build(prefix, objects, root_uploads, state, depth=0)
        self._settled = settled
        # Marker contents of generations no longer listed (deleted by retention) are let go.
        self._contents = {
            k: v for k, v in self._contents.items()
            if k[0][len(prefix) :].split("/", 1)[0] in subdirs or "/" not in k[0][len(prefix) :]
        }  # fmt: skip
        return _keep_unchanged(old, _with_subdirs(root, subdirs))

    def _sealed(self, name: str, previous: Dir, state: _ReadState) -> bool:
        """A generation listed before that need not be listed again: committed by a marker
        among its own objects, its last two listings alike, neither hot nor asked for, and no
        full read under way."""
        if state.force or name in state.relist or previous.error or name not in self._settled:
            return False
        return any(previous.has_file(marker) for marker in self.seal_names)

    def _list(
        self, state: _ReadState, prefix: str, delimiter: str | None
    ) -> tuple[list[ObjectInfo], list[str]]:
        """Every page of one listing."""
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        token: str | None = None
        while True:
            self._spend(state)
            page = self.store.list_page(prefix, delimiter, token)
            objects.extend(page.objects)
            prefixes.extend(page.prefixes)
            self.entries_read += len(page.objects) + len(page.prefixes)
            state.stats.listed += 1
            token = page.token
            if token is None:
                return objects, prefixes

    def _follow_uploads(self, state: _ReadState, now: float) -> None:
        """The open multipart uploads under the prefix, each dated by this reader's own eyes:
        first seen now, or moved now when its parts grew."""
        found: dict[tuple[str, str], Upload] = {}
        marker: tuple[str, str] | None = None
        while True:
            if getattr(self.store, "lists_uploads", True):  # GCS lists none: nothing spent
                self._spend(state)
            try:
                uploads, marker = self.store.list_uploads(self.url.prefix, marker)
            except StoreError as error:
                if error.code not in DENIED_CODES:
                    raise
                # A policy without s3:ListBucketMultipartUploads: the objects are still read,
                # only the uploads in flight are not seen, and that is said.
                self._failed(state.stats, _denied(error), self.url.prefix + UPLOADS)
                break
            for upload in uploads:
                found[upload.key, upload.upload_id] = upload
            if marker is None or not any(marker):  # no marker to go on from: the end
                break
        # The newest upload of each key first (a save retried under the same name leaves the
        # killed one's open beside it): its progress is the save's.
        newest_first = sorted(found, key=lambda ident: ident[0])
        newest = {ident[0]: ident for ident in found}  # the last listed of each key
        newest_first.sort(key=lambda ident: newest[ident[0]] != ident)
        following = {
            ident: self._uploads.get(ident) or _Seen(found[ident], -1, now)  # -1: size unknown
            for ident in newest_first
        }
        for ident in self._to_size(newest_first, following, now):
            self._spend(state)
            seen = following[ident]
            try:
                size = self.store.uploaded_bytes(seen.upload)
            except StoreError as error:
                if error.code not in DENIED_CODES:
                    raise
                self._failed(state.stats, _denied(error), self.url.prefix + UPLOADS)
                break  # the next uploads would be refused alike
            size = -1 if size is None else size
            moved = now if size != seen.size else seen.moved_at  # progress, seen now
            following[ident] = _Seen(seen.upload, size, moved, sized_at=now)
        self._uploads = {ident: following[ident] for ident in found}  # the store's order
        for key, ident in newest.items():
            seen = following[ident]
            relative = key[len(self.url.prefix) :]
            generation = relative.split("/", 1)[0] if "/" in relative else ""
            state.uploads_by_generation.setdefault(generation, []).append(seen)

    @staticmethod
    def _to_size(
        idents: list[tuple[str, str]], seen: dict[tuple[str, str], _Seen], now: float
    ) -> list[tuple[str, str]]:
        """The uploads whose parts this read lists, at most MAX_UPLOADS_SIZED: the ones never
        sized first, in the order given, then the moving ones, the longest unsized first; one
        still for STALE_UPLOAD_SECONDS is listed again only that often. A killed 128-rank
        save's uploads, left open without a lifecycle rule, would otherwise take every slot,
        read after read, and leave a live save unsized (its size, and so its progress, unseen:
        aborted while it uploads)."""

        never = [i for i in idents if not seen[i].sized_at]
        # The moving ones in turn, the longest unsized first: a killed save's uploads are
        # "moving" for STALE_UPLOAD_SECONDS, and must not hold the slots meanwhile.
        moving = sorted(
            (i for i in idents if seen[i].sized_at and not _still(seen[i], now)),
            key=lambda i: seen[i].sized_at,
        )
        stale = [
            i for i in idents
            if _still(seen[i], now) and now - seen[i].sized_at >= STALE_UPLOAD_SECONDS
        ]  # fmt: skip
        return (never + moving + stale)[:MAX_UPLOADS_SIZED]

    def _build(
        self,
        prefix: str,
        objects: list[ObjectInfo],
        uploads: list[_Seen],
        state: _ReadState,
        depth: int,
    ) -> Dir:
        """The ``Dir`` of ``prefix`` from its keys (and the open uploads below it) as a tree."""
        files: dict[str, tuple[int, float, str]] = {}
        uploading: set[str] = set()  # files that are an open upload, no object at the key
        nested: dict[str, list[ObjectInfo]] = {}
        nested_uploads: dict[str, list[_Seen]] = {}
        for info in objects:
            relative = info.key[len(prefix) :]
            head, separator, rest = relative.partition("/")
            if not head:
                continue  # "a//b" or a key naming the prefix itself: no name to show
            if separator and rest:
                nested.setdefault(head, []).append(info)
            elif not separator:
                files[head] = (info.size, info.mtime, info.etag)
        for seen in uploads:
            relative = seen.upload.key[len(prefix) :]
            head, separator, rest = relative.partition("/")
            if separator and rest:
                nested_uploads.setdefault(head, []).append(seen)
            elif head and head not in files:  # an object already there stays what is read
                files[head] = (max(seen.size, 0), seen.moved_at, "")
                uploading.add(head)
        subdirs: dict[str, Dir] = {}
        if depth < self.max_depth:
            for name in sorted(nested.keys() | nested_uploads.keys()):
                subdirs[name] = self._build(
                    f"{prefix}{name}/",
                    nested.get(name, []),
                    nested_uploads.get(name, []),
                    state,
                    depth + 1,
                )
        return self._dir(prefix, files, subdirs, state, frozenset(uploading))

    def _dir(
        self,
        prefix: str,
        files: dict[str, tuple[int, float, str]],
        subdirs: dict[str, Dir],
        state: _ReadState,
        uploading: frozenset[str] = frozenset(),
    ) -> Dir:
        names = sorted(files) + [name for name in subdirs if name not in files]
        kinds = "".join(FILE if name in files else DIR for name in names)
        sizes = array("q", [files[name][0] if name in files else 0 for name in names])
        mtimes = array(
            "d", [files[name][1] if name in files else subdirs[name].mtime for name in names]
        )
        stamps = {
            name: (zlib.crc32(files[name][2].encode()), int(files[name][1] * 1e9))
            for name in files
            if name in self.marker_names
        }
        contents = {}
        for name in self.content_names.intersection(files):
            size, _, etag = files[name]
            if size <= self.content_limit:
                content = self._content(prefix + name, etag, size, state)
                if content is not None:
                    contents[name] = content
        # No directory has an mtime in object storage: its newest entry's stands for it.
        newest = max(mtimes, default=0.0)
        return Dir(
            int(newest * 1e9), tuple(names), kinds, sizes, mtimes, subdirs, contents, None,
            time.monotonic(), stamps, uploading,
        )  # fmt: skip

    def _content(self, key: str, etag: str, size: int, state: _ReadState) -> bytes | None:
        """A marker's bytes, one bounded ranged GET per new version of it."""
        cached = self._contents.get((key, etag, size))
        if cached is not None and etag:
            return cached
        self._spend(state)
        try:
            content = self.store.get_range(key, self.content_limit)
        except StoreError as error:
            if error.code not in OBJECT_GONE_CODES:  # deleted since the listing: no error
                self._failed(state.stats, f"{error.code}: {error.reason}", key)
            return None
        self._contents = {k: v for k, v in self._contents.items() if k[0] != key}
        self._contents[key, etag, size] = content
        return content

    def _spend(self, state: _ReadState) -> None:
        if state.requests >= self.max_requests:
            raise OverBudget()
        state.requests += 1
        self.requests_made += 1
        self.budget.spend()

    def _failed(self, stats: ScanStats, reason: str, key: str = "") -> None:
        relative = key[len(self.url.prefix) :] if key else ""
        stats.errors.append((relative, reason))
        if reason not in self._reported:
            self._reported.add(reason)
            log.warning("cannot read %s%s: %s", self.root, f" ({relative})" if key else "", reason)


def _with_subdirs(root: Dir, subdirs: dict[str, Dir]) -> Dir:
    """``root`` (the prefix's own objects) with the generations listed beside them."""
    entries = list(root.entries())
    names = [name for name, _, _, _ in entries]
    extra = [name for name in subdirs if name not in names]
    all_names = tuple(names + extra)
    kinds = root.kinds + DIR * len(extra)
    sizes = array("q", list(root.sizes) + [0] * len(extra))
    mtimes = array("d", list(root.mtimes) + [subdirs[name].mtime for name in extra])
    merged = {**root.subdirs, **subdirs}
    newest = max(mtimes, default=0.0)
    return Dir(
        int(newest * 1e9), all_names, kinds, sizes, mtimes, merged, root.contents, None,
        root.stat_at, root.stamps, root.uploading,
    )  # fmt: skip


def _keep_unchanged(old: Dir | None, new: Dir) -> Dir:
    """``old`` itself where ``new`` lists the same (recursively): an idle poll hands on the very
    same listing, so nothing downstream parses it again (as ``TreeReader`` does)."""
    if old is None:
        return new
    subdirs = {name: _keep_unchanged(old.subdirs.get(name), child) for name, child in new.dirs()}
    same = (
        old.names == new.names
        and old.kinds == new.kinds
        and old.sizes == new.sizes
        and old.mtimes == new.mtimes
        and old.contents == new.contents
        and old.uploading == new.uploading
        and old.subdirs.keys() == subdirs.keys()
        and all(old.subdirs[name] is child for name, child in subdirs.items())
    )
    if same:
        return old
    return Dir(
        new.mtime_ns, new.names, new.kinds, new.sizes, new.mtimes, subdirs, new.contents, None,
        new.stat_at, new.stamps, new.uploading,
    )  # fmt: skip


def _still(upload: _Seen, now: float) -> bool:
    """Sized before, and its size has not moved for STALE_UPLOAD_SECONDS."""
    return bool(upload.sized_at) and now - upload.moved_at >= STALE_UPLOAD_SECONDS


def _denied(error: StoreError) -> str:
    return f"{error.operation}: {error.code}: {error.reason}: saves in progress are not seen"
