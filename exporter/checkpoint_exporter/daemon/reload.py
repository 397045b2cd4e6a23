"""A reloaded configuration applied: jobs added, removed or changed take effect, unchanged jobs
keep their state, discover roots whose entry changed find their jobs again."""

from __future__ import annotations

import logging
from dataclasses import fields, replace

from checkpoint_exporter.config import Config
from checkpoint_exporter.core.jobs import job_paths
from checkpoint_exporter.daemon.state import Discovery
from checkpoint_exporter.daemon.timers import DiscoverDue
from checkpoint_exporter.sources.watch import read_mounts

log = logging.getLogger(__name__)


class Reloading:
    """Configuration reloads: a part of ``Scanner``
    (daemon/scanner.py), on the core thread, sharing its state."""

    def _apply_config(self, config: Config) -> None:
        """Jobs added, removed or changed take effect; an unchanged job keeps its state."""
        not_applied = _restart_only_changes(self.config, config)
        if not_applied:
            log.warning("configuration reloaded without %s: changed there, applied at the next "
                        "restart", ", ".join(not_applied))  # fmt: skip
        # Mounts made since the start (autofs, a new NFS export) decide where new jobs live.
        self._mounts = read_mounts(self.config.paths.procfs)
        wanted = {job.name: job for job in config.jobs if self.serving.tracks(job.name)}
        added, removed, changed = [], [], []
        for name, source in list(self._sources.items()):
            if source.discovered_from is None and name not in wanted:
                removed.append(name)
                self._remove(name)
        for name, job in wanted.items():
            source = self._sources.get(name)
            if source is not None and source.config == job:
                continue
            earlier = self.tracker.life(name) if source is not None else None
            if source is not None:
                changed.append(name)
                self._remove(name)
            else:
                added.append(name)
            if earlier is not None:  # taken over by the new tracker before its first input
                self._lives[name] = earlier
            self._add(name, job_paths(job), job.policy, None, job)
        roots = {str(d.entry.root): d for d in self._discoveries}
        # A root whose entry changed (its policy, max_jobs): its jobs are found again under it.
        changed_roots = {
            str(entry.root)
            for entry in config.discover
            if str(entry.root) in roots and roots[str(entry.root)].entry != entry
        }
        self._discoveries = [
            d if d.entry == entry else Discovery(entry)
            for entry in config.discover
            for d in [roots.get(str(entry.root), Discovery(entry))]
        ]
        kept_roots = {str(d.entry.root) for d in self._discoveries}
        for name, source in list(self._sources.items()):
            if source.discovered_from is not None and (
                source.discovered_from not in kept_roots
                or source.discovered_from in changed_roots
                or name in wanted
            ):
                life = self.tracker.life(name) if source.discovered_from in changed_roots else None
                if life is not None:
                    self._lives[name] = life  # found again under its root
                self._remove(name)
        now = self.monotonic()
        for index in range(len(self._discoveries)):
            self._timers.soon(DiscoverDue(index), now)
        self.config = replace(self.config, jobs=config.jobs, discover=config.discover)
        self._reload = (True, self.clock())
        self._republish = True
        log.info("configuration reloaded: jobs added=%s removed=%s changed=%s",
                 ",".join(added) or "none", ",".join(removed) or "none",
                 ",".join(changed) or "none")  # fmt: skip


def _restart_only_changes(old: Config, new: Config) -> list[str]:
    """The top-level config sections a reload changed but does not apply (all but the jobs and
    the discover roots: the listener, the spool, scan budgets and telemetry are set up once)."""
    return [
        name
        for name in (f.name for f in fields(Config))
        if name not in ("jobs", "discover", "defaults", "source")
        and getattr(old, name) != getattr(new, name)
    ]
