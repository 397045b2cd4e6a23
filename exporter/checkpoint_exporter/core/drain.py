"""Staging tier -> durable tier: which staged generations have reached durable storage.

A staged generation is drained once the durable tier holds a committed generation of the same id
with at least as many bytes. Until then it is backlog; deleted from staging before that, it is a
lost generation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from checkpoint_exporter.model import COMMITTED, Generation


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
