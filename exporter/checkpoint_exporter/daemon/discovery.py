"""Discovering jobs under a root: listed on its mount's worker, the newest within max_jobs
watched, idle ones making room for newer ones, gone ones forgotten after forget_after."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time

from checkpoint_exporter.config import NODE, SHARED, DiscoverConfig
from checkpoint_exporter.daemon.messages import (
    Candidate,
    Listed,
)
from checkpoint_exporter.daemon.state import (
    STUCK_SECONDS,
    Discovery,
)
from checkpoint_exporter.daemon.timers import (
    DiscoverDue,
    StuckCheck,
)
from checkpoint_exporter.model import DURABLE, WatchedPath
from checkpoint_exporter.sources import fsread, stores
from checkpoint_exporter.sources.listing import OpsBudget
from checkpoint_exporter.sources.object_store import ObjectStore, RequestCounter, StoreError
from checkpoint_exporter.storage_url import ObjectURL, is_object_url, parse_object_url

log = logging.getLogger(__name__)

_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class Discovering:
    """The discover roots' listings applied: a part of ``Scanner``
    (daemon/scanner.py), on the core thread, sharing its state."""

    def _discover(self, index: int, now: float) -> None:
        if index >= len(self._discoveries):
            return
        discovery = self._discoveries[index]
        if not self._lists(discovery.entry):
            return
        self._timers.at(DiscoverDue(index), now + discovery.entry.policy.poll_interval)
        if discovery.listing:
            return
        root = str(discovery.entry.root)
        shared = discovery.entry.policy.scope == SHARED or is_object_url(root)  # a bucket is shared
        if shared and SHARED not in self.serving.scopes:
            # A node-scope process never touches a shared root, not even to list it: the jobs
            # whose ranks run here are the ones writing into this node's spool. Any user may
            # make a directory there: one with no spool file is a mkdir, no job (it takes no
            # max_jobs slot), and the jobs are dated by their last write, newest first.
            found = [
                Candidate(job, listed.mtime, not listed.spool_files)
                for job, listed in sorted(self.spool.listed().items())
            ]
            self._listed(Listed(discovery, found))
            return
        worker = self._worker(self._root_worker(discovery.entry))
        if worker.stuck:
            return
        discovery.listing = True
        known = frozenset(n for n, src in self._sources.items() if src.discovered_from == root)
        budget, clock = self._network_budget, self.clock
        displaced = tuple(discovery.displaced)  # read on the worker: a copy
        worker.submit(
            (lambda: _list_object_jobs(discovery, budget, clock(), known, displaced))
            if is_object_url(root)
            else (lambda: _list_jobs(discovery, root, known)),
            name=f"list discover root {root}",
            fallback=lambda _: Listed(discovery, None),  # listed again at its next poll
        )
        self._timers.soon(StuckCheck(worker.mountpoint), now + STUCK_SECONDS)

    def _root_worker(self, entry: DiscoverConfig) -> str:
        """The worker a root is listed on: its mount's, or its store's (endpoint and bucket)."""
        root = str(entry.root)
        if is_object_url(root):
            return stores.store_key(parse_object_url(root), dict(entry.storage_options))
        return self._lexical_mount(root)

    def _lists(self, entry: DiscoverConfig) -> bool:
        """Whether this process discovers jobs under the root: a root of node scope is left to
        the node-scope processes; a node-scope process learns the names under a shared root from
        its spool, under an auto one by listing it."""
        return entry.policy.scope != NODE or NODE in self.serving.scopes

    def _listed(self, listed: Listed) -> None:
        discovery = listed.discovery
        self._unstick(self._root_worker(discovery.entry))  # its worker answered
        discovery.listing = False
        if not discovery.listed:
            discovery.listed = True
            self._health = None
        if discovery not in self._discoveries:
            return
        entry = discovery.entry
        root = str(entry.root)
        if listed.missing != discovery.missing:
            discovery.missing, self._republish = listed.missing, True
            log.warning("discover root %s %s", root, "does not exist: watched from when it appears"
                        if listed.missing else "exists now")  # fmt: skip
        if listed.found is None:
            return
        configured = {job.name for job in self.config.jobs}
        present = {
            c.name: c
            for c in listed.found
            if _JOB_NAME.fullmatch(c.name)
            and c.name not in configured
            and self.serving.tracks(c.name)
        }
        wall = self.clock()
        tracked = [n for n, src in self._sources.items() if src.discovered_from == root]
        for name in tracked:
            source = self._sources[name]
            if name in present:
                source.missing_since = None
                continue
            # Gone: kept (its last state visible) until forget_after, then dropped.
            source.missing_since = source.missing_since or wall
            if wall - source.missing_since >= entry.forget_after:
                log.info("forgetting job=%s: gone from %s", name, root)
                self._remove(name)
        tracked = [n for n in tracked if n in self._sources]
        # Not watched yet (a name found under another root stays there), newest first; an
        # empty directory is no job yet and takes no slot, so a tenant's mkdirs cannot fill them.
        displaced = discovery.displaced
        for name in [n for n in displaced if n not in present or present[n].mtime > displaced[n]]:
            del displaced[name]  # gone, or written since: a candidate like any other
        candidates = sorted(
            (c for n, c in present.items() if n not in self._sources and not c.empty),
            key=lambda c: (c.name in displaced, -c.mtime, c.name),
        )
        slots = max(0, entry.max_jobs - len(tracked))
        waiting = [c for c in candidates[slots:] if c.name not in displaced]
        slots += self._make_room(discovery, tracked, waiting, present)
        for candidate in candidates[:slots]:
            path = (
                f"{root}/{candidate.name}"
                if is_object_url(root)
                else os.path.join(root, candidate.name)
            )
            self._add(
                candidate.name, (WatchedPath(DURABLE, path),), entry.policy, root,
                storage_options=entry.storage_options,
            )  # fmt: skip
        excess = len(candidates) - min(slots, len(candidates))
        if excess != discovery.excess:
            discovery.excess = excess
            self._republish = True
        for candidate in candidates[slots:]:
            if candidate.name not in discovery.reported:
                discovery.reported.add(candidate.name)
                log.warning(
                    "discover root %s: job %s is over max_jobs=%d and is not watched",
                    root, candidate.name, entry.max_jobs,
                )  # fmt: skip

    def _make_room(
        self,
        discovery: Discovery,
        tracked: list[str],
        waiting: list[Candidate],
        present: dict[str, Candidate],
    ) -> int:
        """Over max_jobs, the oldest idle jobs (finished, or silent since before their next save
        was due, no save in progress) give their slots to newer jobs, the newest first: a root
        full of finished runs still watches the run started today. Returns the slots freed."""
        entry = discovery.entry
        idle = sorted(
            (self._last_activity(name), name) for name in tracked if self._idle(name, entry)
        )
        freed = 0
        for candidate in waiting:
            if not idle or idle[0][0] >= candidate.mtime:
                break
            since, name = idle.pop(0)
            log.warning(
                "discover root %s: over max_jobs=%d, job %s (idle since %s) makes room for %s",
                entry.root, entry.max_jobs, name, time.strftime("%Y-%m-%dT%H:%M:%SZ",
                time.gmtime(since)), candidate.name,
            )  # fmt: skip
            if name in present:  # not a run gone from the root, kept until forget_after
                discovery.displaced[name] = present[name].mtime
            self._remove(name)
            freed += 1
        return freed

    def _last_activity(self, name: str) -> float:
        state = self.tracker.state(name)  # the published view: no tracker field read
        assert state is not None  # asked of the jobs it watches
        return state.alive_at if state.alive_at is not None else state.first_seen

    def _idle(self, name: str, entry: DiscoverConfig) -> bool:
        effects = self._effects.get(name)
        if effects is not None and effects.saves_in_progress:
            return False
        silent = self.clock() - self._last_activity(name)
        state = self.tracker.state(name)
        finished = state is not None and state.finished
        return finished or silent > entry.policy.interval + entry.policy.deadline


def _list_jobs(discovery: Discovery, root: str, known: frozenset[str]) -> Listed:
    """The subdirectories of a discover root (never following a symlink), each with its mtime;
    the ones not watched yet are looked into, to tell an empty directory from a job."""
    try:
        fd = fsread.open_directory(root, follow_symlink=True)  # the operator's root
    except FileNotFoundError:
        return Listed(discovery, None, missing=True)
    except OSError as error:
        log.warning("cannot list discover root %s: %s", root, error.strerror)
        return Listed(discovery, None)
    found = []
    try:
        with os.scandir(fd) as listing:
            entries = [e for e in listing if e.is_dir(follow_symlinks=False)]
        for entry in entries:
            with contextlib.suppress(OSError):  # gone or swapped since listed: next time
                mtime = entry.stat(follow_symlinks=False).st_mtime
                empty = entry.name not in known and _empty(fd, entry.name)
                found.append(Candidate(entry.name, mtime, empty))
    except OSError as error:
        log.warning("cannot list discover root %s: %s", root, error.strerror)
        return Listed(discovery, None)
    finally:
        os.close(fd)
    return Listed(discovery, found)


def _empty(root_fd: int, name: str) -> bool:
    child = fsread.open_directory(name, dir_fd=root_fd)  # O_NOFOLLOW: a symlink raises
    try:
        with os.scandir(child) as listing:
            return next(iter(listing), None) is None
    finally:
        os.close(child)


# Pages of a delimited listing one discovery reads: 10,000 runs under a root.
MAX_ROOT_PAGES = 10
# Displaced runs looked into per listing, to date them again when a generation came or went.
MAX_REDATED = 10
_ROOT_GONE = frozenset({"NoSuchBucket", "ContainerNotFound", "notFound"})


def _list_object_jobs(
    discovery: Discovery,
    budget: OpsBudget,
    now: float,
    known: frozenset[str],
    displaced: tuple[str, ...],
) -> Listed:
    """The prefixes under an object-store root, one per run, dated when first listed: a prefix
    has no mtime, and asking each run's newest object would cost a listing per run per poll.
    A run that appears after the first listing is newer than the runs already there, so the
    newest still come first, and an idle run keeps its date (no two take turns); a run that
    gave its slot away is dated again when its generations change (a resumed run saving)."""
    entry = discovery.entry
    url = parse_object_url(str(entry.root))
    if discovery.store is None:
        discovery.store = stores.open_reader(
            url, dict(entry.storage_options), budget, RequestCounter(), content_names=()
        )
    store = discovery.store.store
    names: list[str] = []
    token: str | None = None
    try:
        for _ in range(MAX_ROOT_PAGES):
            page = store.list_page(url.prefix, "/", token)
            names += [prefix[len(url.prefix) :].rstrip("/") for prefix in page.prefixes]
            if (token := page.token) is None:
                break
        else:
            # Past the pages one listing reads: the runs already watched are kept, not forgotten.
            log.warning("discover root %s: more than %d runs; only the first are listed",
                        url, len(names))  # fmt: skip
            names += sorted(known - set(names))
        _redate(discovery, store, url, displaced, now)
    except StoreError as error:
        log.warning("cannot list discover root %s: %s: %s", url, error.code, error.reason)
        return Listed(discovery, None, missing=error.code in _ROOT_GONE)
    dates = discovery.first_listed
    for gone in set(dates) - set(names):
        del dates[gone]
    return Listed(
        discovery, [Candidate(name, dates.setdefault(name, now), False) for name in names]
    )


def _redate(
    discovery: Discovery, store: ObjectStore, url: ObjectURL, displaced: tuple[str, ...], now: float
) -> None:
    """Look into the displaced runs looked into longest ago (MAX_REDATED of them): one with a
    generation new since is dated now, newer than the idle runs that kept their slots."""
    looked = discovery.looked_into
    for name in [n for n in looked if n not in displaced]:
        del looked[name]
    for name in sorted(displaced, key=lambda n: looked.get(n, (0.0, frozenset()))[0])[:MAX_REDATED]:
        try:
            page = store.list_page(f"{url.prefix}{name}/", "/", None)
        except StoreError as error:  # this run's alone: the root's listing stands
            log.warning("discover root %s: cannot look into %s: %s", url, name, error.code)
            continue
        generations = frozenset(page.prefixes) | frozenset(o.key for o in page.objects)
        before = looked.get(name)
        # A new generation, not one gone: a lifecycle rule expiring an abandoned run's
        # generations one by one must not make it newer than the runs that kept their slots.
        if before is not None and generations - before[1]:
            discovery.first_listed[name] = now
        looked[name] = (now, generations)
