"""The exporter's own health: stuck mounts, the statvfs probe of each watched filesystem (its
capacity and device error), readiness and the age of each tier's view, node telemetry, and the
DaemonState published with the jobs."""

from __future__ import annotations

import logging
from collections import Counter

from checkpoint_exporter.daemon.messages import Probed
from checkpoint_exporter.daemon.state import (
    PROBE_SECONDS,
    STUCK_SECONDS,
    Probe,
    Tier,
)
from checkpoint_exporter.daemon.timers import (
    HEALTH_REFRESH,
    ProbeDue,
    StuckCheck,
)
from checkpoint_exporter.daemon.workers import TaskFailed
from checkpoint_exporter.model import DaemonState, FilesystemState, ObjectStoreUsage
from checkpoint_exporter.sources.objects import ObjectTreeReader
from checkpoint_exporter.sources.telemetry.filesystem import (
    ProbeState,
    Statvfs,
    Target,
    capacities,
    statvfs_of,
)
from checkpoint_exporter.sources.watch import INOTIFY, Mount

log = logging.getLogger(__name__)

# Each tier's view age is republished at most this often (alerts on stale data work in minutes;
# the first pass's progress, once a second).
HEALTH_REFRESH_SECONDS = 5.0
PROGRESS_REFRESH_SECONDS = 1.0


class Health:
    """Mounts' health, readiness, and what is published: a part of ``Scanner``
    (daemon/scanner.py), on the core thread, sharing its state."""

    def _check_stuck(self, mountpoint: str, now: float) -> None:
        worker = self._workers.get(mountpoint)
        if worker is None:
            return
        stalled = worker.stalled_for(now)
        if stalled == 0.0:
            self._unstick(mountpoint)  # whatever it was stuck on has returned
            if any(t.pending and t.worker == mountpoint for t in self._all_tiers()):
                self._timers.at(StuckCheck(mountpoint), now + STUCK_SECONDS)  # between two tasks
            return
        if stalled >= STUCK_SECONDS:
            if not worker.stuck:
                worker.stuck = True
                log.error("filesystem %s is stuck: no answer for %.0f s; its jobs wait for it",
                          mountpoint or "(unknown mount)", stalled)  # fmt: skip
                self._health = None
                self._refresh_node()  # its device error, in the same publication
            self._timers.at(StuckCheck(mountpoint), now + STUCK_SECONDS)
        else:
            self._timers.at(StuckCheck(mountpoint), now + STUCK_SECONDS - stalled)

    def _unstick(self, mountpoint: str) -> None:
        worker = self._workers.get(mountpoint)
        if worker is None or not worker.stuck:
            return
        worker.stuck = False
        log.warning("filesystem %s answers again", mountpoint or "(unknown mount)")
        self._health = None
        self._refresh_node()
        now = self.monotonic()
        for source in self._sources.values():
            for tier in source.tiers:
                if tier.worker == mountpoint and tier.again and not tier.pending:
                    self._timers.soon(tier.key, now)

    def _all_tiers(self) -> list[Tier]:
        return [tier for source in self._sources.values() for tier in source.tiers]

    def _probe_placed(self, tier: Tier, mount: Mount | None) -> None:
        """Probe the mount a tier was just placed on from now on (at once, the first time): its
        statvfs is the mountpoint's; a mount the table does not name, the tier's path's."""
        probe = self._probes.get(tier.worker)
        if probe is None:
            target = Target(mount.mountpoint, mount.device, mount.fstype) if mount else None
            probe = Probe(ProbeState(target, mount.mountpoint if mount else tier.path))
            self._probes[tier.worker] = probe
            self._timers.soon(ProbeDue(tier.worker), self.monotonic())
        probe.inotify = probe.inotify or tier.mode == INOTIFY

    def _probe(self, mountpoint: str, now: float) -> None:
        """statvfs the mount on its worker: one task per mount per PROBE_SECONDS, whatever the
        number of jobs on it, and none while one is queued or its worker is stuck."""
        probe, worker = self._probes.get(mountpoint), self._workers.get(mountpoint)
        if probe is None or worker is None:
            return
        self._timers.at(ProbeDue(mountpoint), now + PROBE_SECONDS)
        if worker.stuck or probe.in_flight:
            return
        probe.in_flight = True
        path, clock = probe.state.path, self.clock
        worker.submit(
            lambda: Probed(mountpoint, clock(), statvfs_of(path, clock)),
            name=f"statvfs {path}",
            fallback=lambda error: Probed(mountpoint, clock(), Statvfs(failed=repr(error))),
        )
        self._timers.soon(StuckCheck(mountpoint), now + STUCK_SECONDS)

    def _probed(self, probed: Probed) -> None:
        self._unstick(probed.worker)
        probe = self._probes.get(probed.worker)
        if probe is None:
            return
        probe.in_flight = False
        _log_answer(probe.state, probed.answer)
        probe.state.answered(probed.answer)
        self._refresh_node()
        if probe.inotify:  # an answer, even an error, says events would come
            probe.inotify = self._confirm(probed.worker, probed.at)
            self._health_changed()

    def _confirm(self, mountpoint: str, at: float) -> bool:
        """The mount's inotify-watched tiers' views are current as of ``at``; whether it has any."""
        found = False
        for source in self._sources.values():
            for tier in source.tiers:
                if tier.worker != mountpoint or tier.mode != INOTIFY:
                    continue
                found = True
                if tier.first_done and not tier.pending and tier.failures == 0:
                    tier.confirmed = max(tier.confirmed, at)
        return found

    def _task_failed(self, failed: TaskFailed) -> None:
        """A worker task raised (a bug): logged here, once, counted, and what the core set up
        for it undone through its fallback (a read batch's tiers read again, a listing retried)."""
        mountpoint = failed.mountpoint
        self._task_failures[mountpoint] = self._task_failures.get(mountpoint, 0) + 1
        self._republish = True
        log.error("task %r on the worker of %s failed", failed.task,
                  mountpoint or "(unknown mount)", exc_info=failed.error)  # fmt: skip
        self._unstick(mountpoint)  # its worker answered
        if failed.fallback is not None:
            self._receive(failed.fallback)

    def _health_changed(self) -> None:
        """Per-tier view ages moved: republished within HEALTH_REFRESH_SECONDS (not per read)."""
        if self._timers.due_at(HEALTH_REFRESH) is None and self._health is not None:
            self._timers.at(HEALTH_REFRESH, self.monotonic() + HEALTH_REFRESH_SECONDS)

    def _health_state(self) -> tuple[object, ...]:
        if self._health is None:
            tiers = [
                (s.name, t) for s in self._sources.values() for t in s.tiers if not self._outside(t)
            ]
            stuck = {key for key, worker in self._workers.items() if worker.stuck}
            if not self._ready:
                unlisted = sum(
                    1
                    for d in self._discoveries
                    if not d.listed
                    and self._lists(d.entry)
                    and self._lexical_mount(str(d.entry.root)) not in stuck
                )
                done = sum(1 for _, t in tiers if t.first_done or t.worker in stuck)
                roots = f", {unlisted} discover roots not listed yet" if unlisted else ""
                self._not_ready = f"first pass not finished ({done} of {len(tiers)} tiers{roots})"
                self._ready = not unlisted and done == len(tiers)
                if self._ready:
                    log.info("ready: every watched tier has been read once")
            first_scans = tuple(
                sorted((name, t.tier, t.first_done, _entries(t)) for name, t in tiers)
            )
            mounts = tuple(sorted((key, worker.stuck) for key, worker in self._workers.items()))
            success = tuple(sorted((name, t.tier, t.confirmed) for name, t in tiers if t.confirmed))
            self._health = (self._ready, first_scans, mounts, success)
            if not self._ready:  # the first pass's progress moves without telling the core
                self._timers.soon(HEALTH_REFRESH, self.monotonic() + PROGRESS_REFRESH_SECONDS)
            self._republish = True
        return self._health

    def _refresh_node(self) -> None:
        """The filesystems' capacity (from the probes) and which telemetry has data: republished
        when either moved."""
        available = self.telemetry.available() if self.telemetry is not None else None
        node = (self._filesystems(), available)
        if node != self._node:
            self._node = node
            self._republish = True

    def _filesystems(self) -> tuple[FilesystemState, ...]:
        """Probed filesystems by mountpoint, once read or in error (its worker stuck, its latest
        statvfs failed). One that never answered is there with checked_at 0, size and avail 0."""
        if self._reserves is None:
            reserves: dict[str, float] = {}
            for source in self._sources.values():
                for tier in source.tiers:
                    if tier.mountpoint:
                        reserves[tier.mountpoint] = max(
                            reserves.get(tier.mountpoint, 0.0), source.policy.capacity_reserve
                        )
            self._reserves = reserves
        mounts = [(probe.state, self._workers[key].stuck) for key, probe in self._probes.items()]
        return tuple(
            FilesystemState(
                c.mountpoint, c.device, c.fstype, c.size_bytes, c.avail_bytes,
                self._reserves.get(c.mountpoint, 0.0), device_error=c.device_error,
                checked_at=c.checked_at,
            )
            for c in capacities(mounts)
        )  # fmt: skip

    def _events_dropped(self) -> Counter[str]:
        """Events refused, by reason: by the spool reader, and by the jobs' clocks (their caps
        and bounds), the forgotten jobs' included: one counter to the scrape."""
        total = Counter(self.spool.dropped_total)
        total.update(self._dropped_by_forgotten)
        for name in self._dropping:  # the few jobs that refused any: not a walk of every job
            total.update(dict(self._effects[name].events_dropped))
        return total

    def _publish(self) -> None:
        health = self._health_state()
        if not (self._republish or self._changed_jobs):
            return
        ready, first_scans, mounts, success = health
        reload_ok, reload_time = self._reload
        daemon = DaemonState(
            scans=self._scans.state(),
            metadata_operations=self._network_budget.total + self._local_budget.total,
            watch_overflows=self._overflows,
            scan_errors=self._scan_errors,
            spool_events=tuple(sorted(self.spool.events_total.items())),
            spool_invalid=tuple(sorted(self.spool.invalid_total.items())),
            spool_dropped=tuple(sorted(self._events_dropped().items())),
            spool_dropped_bytes=tuple(sorted(self.spool.dropped_bytes_total.items())),
            spool_squatted=tuple(sorted(self.spool.squatted.items())),
            spool_backlog_bytes=self.spool.backlog_bytes,
            spool_poll_seconds=self.spool.poll_seconds_total,
            discover_excess=tuple((str(d.entry.root), d.excess) for d in self._discoveries),
            discover_missing=tuple((str(d.entry.root), int(d.missing)) for d in self._discoveries),
            spool_writable=self._spool_writable,
            ready=bool(ready),
            shard_info=None
            if self.serving.default
            else (self.serving.shard, self.serving.shards, self.serving.scope_label),
            first_scans=first_scans,  # type: ignore[arg-type]
            mounts=mounts,  # type: ignore[arg-type]
            scan_success=success,  # type: ignore[arg-type]
            config_reload_successful=reload_ok,
            config_reload_success_time=reload_time,
            worker_task_failures=tuple(sorted(self._task_failures.items())),
            object_stores=self._object_store_usage(),
        )
        filesystems, available = self._node
        self.tracker.publish(daemon, filesystems, available, changed=self._changed_jobs)
        self._changed_jobs = set()
        self._republish = False

    def _object_store_usage(self) -> tuple[tuple[str, ObjectStoreUsage], ...]:
        """Each job's object-store requests and open uploads, its tiers' together."""
        for key in [key for key in self._request_counters if key[0] not in self._sources]:
            del self._request_counters[key]  # the job is gone: its series go, and its counts
        usage = []
        for name in sorted(self._object_jobs):
            source = self._sources.get(name)
            readers = [
                tier.reader
                for tier in (source.tiers if source is not None else ())
                if isinstance(tier.reader, ObjectTreeReader)
            ]
            if readers:
                usage.append((name, combined([reader.usage() for reader in readers])))
        return tuple(usage)


def combined(usages: list[ObjectStoreUsage]) -> ObjectStoreUsage:
    """One job's usage from its object tiers' (a staging and a durable tier may both be)."""
    if len(usages) == 1:
        return usages[0]
    requests: Counter[str] = Counter()
    errors: Counter[tuple[str, str]] = Counter()
    for usage in usages:
        requests.update(dict(usage.requests))
        errors.update({(op, code): n for op, code, n in usage.errors})
    sizes = [usage.incomplete_upload_bytes for usage in usages]
    oldest = [u.oldest_incomplete_upload for u in usages if u.oldest_incomplete_upload is not None]
    return ObjectStoreUsage(
        tuple(sorted(requests.items())),
        tuple(sorted((op, code, n) for (op, code), n in errors.items())),
        sum(usage.incomplete_uploads for usage in usages),
        None if None in sizes else sum(size or 0 for size in sizes),
        min(oldest, default=None),
    )


def _log_answer(before: ProbeState, answer: Statvfs) -> None:
    """What changed in a mount's statvfs answers, logged once per change."""
    mountpoint = before.path
    if answer.gone != before.gone:
        log.info("mountpoint %s %s", mountpoint, "is gone" if answer.gone else "is back")
    if answer.failed is not None and answer.failed != before.failed:
        log.warning("statvfs of %s failed: %s", mountpoint, answer.failed)
    elif answer.failed is None and before.failed is not None:
        log.info("statvfs of %s answers again", mountpoint)


def _entries(tier: Tier) -> int:
    """Entries the tier's first pass read: so far while it runs."""
    if tier.first_done:
        return tier.first_entries
    return tier.reader.entries_read if tier.reader is not None else 0
