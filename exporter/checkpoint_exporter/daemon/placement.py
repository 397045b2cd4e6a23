"""Placing a job's tiers: on which mount each lies, how it is watched, whether this process
serves it; adding and removing jobs."""

from __future__ import annotations

import logging
import os

from checkpoint_exporter.config import NODE, SHARED, JobConfig, Policy
from checkpoint_exporter.core.inputs import PathsPlaced
from checkpoint_exporter.daemon.messages import Placed, PlaceFailed
from checkpoint_exporter.daemon.state import (
    STUCK_SECONDS,
    Source,
    Tier,
    configured_scope,
)
from checkpoint_exporter.daemon.timers import (
    JobDue,
    StuckCheck,
)
from checkpoint_exporter.daemon.validator import Validator
from checkpoint_exporter.daemon.workers import MountWorker
from checkpoint_exporter.model import WatchedPath
from checkpoint_exporter.sources import layouts, stores
from checkpoint_exporter.sources.listing import TreeReader
from checkpoint_exporter.sources.object_store import RequestCounter
from checkpoint_exporter.sources.watch import (
    INOTIFY,
    POLL,
    choose_mode,
    is_network,
    mount_of,
    mount_of_name,
)
from checkpoint_exporter.storage_url import is_object_url, parse_object_url

log = logging.getLogger(__name__)


class Placement:
    """Jobs added and removed, their tiers placed on their mounts' workers: a part of ``Scanner``
    (daemon/scanner.py), on the core thread, sharing its state."""

    def _add(
        self,
        name: str,
        paths: tuple[WatchedPath, ...],
        policy: Policy,
        discovered_from: str | None,
        job_config: JobConfig | None = None,
        storage_options: tuple[tuple[str, object], ...] = (),
    ) -> None:
        # A discovered job's directory belongs to a tenant: never followed if it is (or
        # becomes) a symlink. A configured root may be one, as the operator chose.
        follow = None if discovered_from is None else False
        # A discovered job's connection is its root's.
        options = job_config.storage_options if job_config is not None else storage_options
        tiers = [
            Tier(
                name,
                watched.tier,
                watched.path,
                follow,
                # An object tier's worker is its store's (endpoint and bucket), not a mount's.
                stores.store_key(parse_object_url(watched.path), dict(options))
                if is_object_url(watched.path)
                else self._lexical_mount(watched.path),
                scope=configured_scope(watched.tier, policy),
                storage_options=options,
                requests=self._request_counters.setdefault((name, watched.tier), RequestCounter())
                if is_object_url(watched.path)
                else None,
            )
            for watched in paths
        ]
        fixed = None if policy.layout == "auto" else policy.layout
        source = Source(name, policy, tiers, fixed, discovered_from, config=job_config)
        self._sources[name] = source
        if name not in self.tracker:
            self.tracker.start(name, paths, policy, self.clock(), self._lives.pop(name, None))
        self._publish_paths(source)
        for tier in tiers:
            if self._outside(tier):
                continue  # not even placed: placing stats the path
            self._submit_place(tier, policy)
        self._health = self._reserves = None

    def _submit_place(self, tier: Tier, policy: Policy) -> None:
        tier.place_failed = False
        self._worker(tier.worker).submit(
            lambda: self._place(tier, policy),
            name=f"place {tier.path}",
            fallback=lambda error: PlaceFailed(tier),
        )
        # Placing stats the path: a mount hung before the start is found stuck here.
        self._timers.soon(StuckCheck(tier.worker), self.monotonic() + STUCK_SECONDS)

    def _place_failed(self, failed: PlaceFailed) -> None:
        """Placed again after a pause that grows while it keeps failing, as a failed read is:
        a tier never placed is never read, and the exporter would never be ready."""
        tier = failed.tier
        tier.place_failed = True
        tier.failures += 1
        tier.retry_at = self.monotonic() + min(60.0, 0.5 * 2**tier.failures)
        self._timers.at(tier.key, tier.retry_at)

    def _remove(self, name: str) -> None:
        source = self._sources.pop(name, None)
        effects = self._effects.pop(name, None)
        if effects is not None:  # what its clocks gave up stays counted (spool_dropped)
            self._dropped_by_forgotten.update(dict(effects.events_dropped))
        self._dropping.discard(name)
        self._object_jobs.discard(name)
        self.tracker.forget(name)
        self._changed_jobs.add(name)
        self._timers.cancel(JobDue(name))
        for tier in source.tiers if source is not None else ():
            self._timers.cancel(tier.key)
        if self.watcher is not None:
            self.watcher.unwatch(name)
        self._health = self._reserves = None

    def _lexical_mount(self, path: str) -> str:
        """The mount ``path`` lies on by its name alone: resolving symlinks would stat it, and
        the core never waits on a filesystem. Its worker then places it for real."""
        mount = mount_of_name(os.path.abspath(path), self._mounts)
        return mount.mountpoint if mount is not None else ""

    def _worker(self, mountpoint: str) -> MountWorker:
        worker = self._workers.get(mountpoint)
        if worker is None:
            worker = self._workers[mountpoint] = self._worker_factory(mountpoint, self._post)
            validator = Validator(
                self._limits, self._verdicts, self._wake.set, name=f"validator {mountpoint}"
            )
            self._validators[mountpoint] = validator
            if self._started and not self._stop.is_set():  # one added while stopping stays idle
                worker.start()
                validator.start()
            self._health = None
        return worker

    def _place(self, tier: Tier, policy: Policy) -> Placed:
        """On the tier's worker: its mount, how it is watched, its reader (all may stat it)."""
        if is_object_url(tier.path):
            return self._place_object(tier)
        mount = mount_of(tier.path, self._mounts)
        # Shared storage gets the budget whether it is polled or (configured so) watched.
        network = mount is not None and is_network(mount.fstype)
        scope = tier.scope or (SHARED if network else NODE)
        if not self.serving.serves(scope, tier.job):
            return Placed(tier, mount, "", "", None, scope)
        mode, reason = choose_mode(policy.watch, mount)
        reader = TreeReader(
            tier.path,
            self._network_budget if network else self._local_budget,
            layouts.ALL_CONTENT_FILES,
            self.config.scan.max_depth,
            marker_names=layouts.MARKER_NAMES,
            marker_suffixes=layouts.MARKER_SUFFIXES,
            follow_root_symlink=tier.follow_root,
            root_marker=layouts.ROOT_MARKER,
        )
        if mode == INOTIFY and self.watcher is not None:
            failure = self.watcher.watch(
                tier.job,
                tier.path,
                max_depth=self.config.scan.max_depth,
                follow_root_symlink=tier.follow_root is not False,  # a tenant's root: never
            )
            if failure is not None:
                mode, reason = POLL, failure
                log.warning("job=%s path=%s: %s; polling instead", tier.job, tier.path, failure)
        return Placed(tier, mount, mode, reason, reader, scope)

    def _place_object(self, tier: Tier) -> Placed:
        """On the store's worker: object storage is shared and polled (no watcher sees it), read
        under the shared storage's budget."""
        scope = tier.scope or SHARED
        if not self.serving.serves(scope, tier.job):
            return Placed(tier, None, "", "", None, scope)
        reader = stores.open_reader(
            parse_object_url(tier.path),
            dict(tier.storage_options),
            self._network_budget,
            tier.requests or RequestCounter(),
            content_names=layouts.ALL_CONTENT_FILES,
            marker_names=layouts.MARKER_NAMES,
            opening_markers=layouts.OPENING_MARKERS,
            max_depth=self.config.scan.max_depth,
        )
        return Placed(tier, None, POLL, "object storage: polled", reader, scope)

    def _placed(self, placed: Placed) -> None:
        tier = placed.tier
        self._unstick(tier.worker)  # its worker answered
        source = self._sources.get(tier.job)
        if source is None and self.watcher is not None:
            self.watcher.unwatch(tier.job)  # removed while placed: the watch it added goes too
        if source is None or tier not in source.tiers:
            return  # removed meanwhile
        tier.scope = placed.scope
        if placed.reader is None:
            log.info("not watching job=%s tier=%s path=%s: scope %s, outside this process's (%s)",
                     tier.job, tier.tier, tier.path, tier.scope,
                     self.serving.scope_label)  # fmt: skip
            self._publish_paths(source)
            self._health = None
            return
        tier.mode, tier.reason, tier.reader = placed.mode, placed.reason, placed.reader
        if placed.mount is not None:
            tier.mountpoint = placed.mount.mountpoint
            if tier.mountpoint != tier.worker:  # reached through a symlink to another mount
                tier.worker = tier.mountpoint
                self._worker(tier.worker)
        if is_object_url(tier.path):  # no disk, no mount to probe: its reads say how it is
            self._object_jobs.add(tier.job)
            log.info("watching job=%s tier=%s path=%s mode=%s (%s)",
                     tier.job, tier.tier, tier.path, tier.mode, tier.reason)  # fmt: skip
            self._publish_paths(source)
            self._timers.soon(tier.key, self.monotonic())
            return
        if self.telemetry is not None:
            placement = self.telemetry.place(tier.path, placed.mount)
            tier.disk = placement.block_device.name if placement.block_device else None
        log.info("watching job=%s tier=%s path=%s mode=%s (%s)",
                 tier.job, tier.tier, tier.path, tier.mode, tier.reason)  # fmt: skip
        self._publish_paths(source)
        self._reserves = None
        self._probe_placed(tier, placed.mount)
        self._timers.soon(tier.key, self.monotonic())

    def _publish_paths(self, source: Source) -> None:
        paths = tuple(
            WatchedPath(
                t.tier, t.path, t.mode, t.mountpoint, scanned=self._read_here(t),
                missing=t.missing, unreadable=t.unreadable,
            )
            for t in source.tiers
        )  # fmt: skip
        self._apply(source.name, PathsPlaced(paths, self.clock()))
        self._changed_jobs.add(source.name)  # a job just added publishes with its first paths

    def _outside(self, tier: Tier) -> bool:
        """The tier's scope is known, and this process does not serve it (for this job)."""
        return bool(tier.scope) and not self.serving.serves(tier.scope, tier.job)

    def _read_here(self, tier: Tier) -> bool:
        """Its series come from this process: its scope is served, or, while ``auto`` waits for
        the tier to be placed, every scope it could turn out to have is."""
        if tier.scope:
            return self.serving.serves(tier.scope, tier.job)
        return all(self.serving.serves(scope, tier.job) for scope in (NODE, SHARED))
