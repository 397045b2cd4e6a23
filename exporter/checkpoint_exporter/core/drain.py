"""Staging tier -> durable tier: which staged generations have reached durable storage.

A staged generation is drained once the durable tier holds a committed generation of the same id
with at least as many bytes. Until then it is backlog; deleted from staging before that, it is a
lost generation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from checkpoint_exporter.core.base import JobBase
from checkpoint_exporter.model import COMMITTED, DURABLE, STAGING, Generation


@dataclass(frozen=True)
class DrainState:
    backlog_bytes: int = 0
    backlog_generations: int = 0
    oldest_undrained_commit: float = 0.0  # 0 when nothing waits
    staged: dict[str, int] | None = None  # committed staged generation -> bytes
    drained: dict[str, int] | None = None  # drained generation -> durable bytes


def drain_state(staging: Iterable[Generation], durable: Iterable[Generation]) -> DrainState:
    copies = {g.id: g for g in durable if g.state == COMMITTED}
    staged = {g.id: g for g in staging if g.state == COMMITTED}
    drained = {
        gen_id: copies[gen_id].bytes
        for gen_id, gen in staged.items()
        if gen_id in copies and copies[gen_id].bytes >= gen.bytes
    }
    waiting = [gen for gen_id, gen in staged.items() if gen_id not in drained]
    return DrainState(
        backlog_bytes=sum(gen.bytes for gen in waiting),
        backlog_generations=len(waiting),
        oldest_undrained_commit=min((gen.commit_time or 0.0 for gen in waiting), default=0.0),
        staged={gen_id: gen.bytes for gen_id, gen in staged.items()},
        drained=drained,
    )


@dataclass(eq=False)
class Draining(JobBase):
    """The staging tier against the durable one, and what drained or was lost while we ran."""

    drain: DrainState = field(default_factory=DrainState)
    staged_bytes: int = 0
    drained_bytes: int = 0
    lost_generations: int = 0
    _staged_counted: dict[str, int] | None = None  # None until both tiers were scanned once
    _drained_counted: set[str] = field(default_factory=set)

    def _update_drain(self) -> None:
        """Match the staging tier against the durable tier; count what changed while we ran."""
        if not self._two_tier():
            return
        publics = [gen.public() for gen in self._gens.values()]
        state = drain_state(
            (g for g in publics if g.tier == STAGING), (g for g in publics if g.tier == DURABLE)
        )
        staged, drained = state.staged or {}, state.drained or {}
        if self._staged_counted is None:
            if {STAGING, DURABLE} <= self._scanned:  # history: what was already there
                self._staged_counted = dict(staged)
                self._drained_counted = set(drained)
            self.drain = state
            return
        for gen_id, size in staged.items():
            counted = self._staged_counted.get(gen_id, 0)
            if size > counted:  # new, or grown since its final stat
                self.staged_bytes += size - counted
                self._staged_counted[gen_id] = size
        for gen_id, size in drained.items():
            if gen_id not in self._drained_counted:
                self._drained_counted.add(gen_id)
                self.drained_bytes += size
        waiting_before = set(self.drain.staged or {}) - set(self.drain.drained or {})
        for gen_id in waiting_before - set(staged):
            if gen_id not in drained and gen_id not in self._drained_counted:
                self.lost_generations += 1  # deleted from staging before reaching durable
        self.drain = state
