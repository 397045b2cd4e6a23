"""The scanner's side of the spool: polled on its timer and before disk results, the events
handed to their jobs, the owners each job's spool directories may have, whether training
jobs can write the spool at all."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Collection, Iterator, Mapping

from checkpoint_exporter.core.inputs import SpoolEvents
from checkpoint_exporter.events import Event
from checkpoint_exporter.sources.spool import HOLD

log = logging.getLogger(__name__)

SPOOL_CHECK_SECONDS = 2.0  # whether training jobs can write the spool, checked this often (a stat)


class SpoolSide:
    """The spool read and its events applied: a part of ``Scanner``
    (daemon/scanner.py), on the core thread, sharing its state."""

    def _check_spool(self) -> None:
        """Whether training jobs can write the spool: it exists, and any user (or its group) may
        make a directory in it. The kubelet makes a missing hostPath root 0755, and then every
        non-root job's events are lost after one warning in its own log."""
        try:
            mode = os.stat(self.config.spool).st_mode
        except OSError as error:
            writable, why = False, error.strerror or str(error)
        else:
            others = mode & (stat.S_IWOTH | stat.S_IXOTH) == stat.S_IWOTH | stat.S_IXOTH
            group = mode & (stat.S_IWGRP | stat.S_IXGRP) == stat.S_IWGRP | stat.S_IXGRP
            writable = stat.S_ISDIR(mode) and (others or group)
            why = f"mode {stat.filemode(mode)}; make it 1733 (chmod 1733)"
        if writable != self._spool_writable:
            self._spool_writable, self._republish = writable, True
            if not writable:
                log.warning("spool %s cannot be written by training jobs (%s): their save "
                            "clocks are lost", self.config.spool, why)  # fmt: skip

    def _spool_owners(self) -> Mapping[str, frozenset[int] | None]:
        """The jobs tracked here, each with the uids its spool directories may belong to (see
        ``_spool_owner``), worked out per job when the spool asks about it."""
        return _SpoolOwners(self)

    def _spool_owner(self, name: str, stuck: Collection[str]) -> frozenset[int] | None:
        """A job's ``spool_owner``, else the owners of its trees read here (root's tells nothing:
        it makes directories for anyone); None where neither says; HOLD until such a tree is
        first read (unless its mount is ``stuck``), so no squatter's history slips in at
        start-up."""
        source = self._sources.get(name)
        if source is None:
            return None
        tiers = [t for t in source.tiers if not self._outside(t)]
        if source.policy.spool_owner:
            return frozenset(source.policy.spool_owner)
        if any(not t.first_done and t.worker not in stuck for t in tiers):
            return HOLD
        uids = {t.reader.root_owner for t in tiers if t.reader is not None}
        return frozenset(uid for uid in uids if uid) or None

    def _read_spool(self) -> None:
        now = self.monotonic()
        if now >= self._spool_checked + SPOOL_CHECK_SECONDS:
            self._spool_checked = now
            self._check_spool()
        before = self.spool.poll_seconds_total
        by_job: dict[str, list[Event]] = {}
        for event in self.spool.poll(self.clock()):
            by_job.setdefault(event.training_job, []).append(event)
        if self.spool.poll_seconds_total != before:
            self._republish = True
        wall = self.clock()
        for name, events in by_job.items():
            self._apply(name, SpoolEvents(events, wall))


class _SpoolOwners(Mapping[str, "frozenset[int] | None"]):
    """The spool's view of the jobs tracked here, at one poll: membership and iteration are the
    tracker's jobs, an owner is worked out only for the job asked about. The spool asks about
    the directories it sees, five times a second; a mapping built for every job at every poll
    made 1,000 idle jobs cost eight times the CPU of 10."""

    def __init__(self, scanner: SpoolSide) -> None:
        self._scanner = scanner
        self._stuck: frozenset[str] | None = None

    def __getitem__(self, name: str) -> frozenset[int] | None:
        if name not in self._scanner.tracker:
            raise KeyError(name)
        if self._stuck is None:
            workers = self._scanner._workers.items()
            self._stuck = frozenset(mountpoint for mountpoint, w in workers if w.stuck)
        return self._scanner._spool_owner(name, self._stuck)

    def __contains__(self, name: object) -> bool:
        return name in self._scanner.tracker

    def __iter__(self) -> Iterator[str]:
        return iter(self._scanner.tracker.names())

    def __len__(self) -> int:
        return len(self._scanner.tracker.names())
