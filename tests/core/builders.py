"""Builders for the core's unit tests: a job, a generation as a layout reads it, a spool event."""

from __future__ import annotations

from checkpoint_exporter.config import Policy
from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.events import Event
from checkpoint_exporter.model import DCP, DURABLE, STAGING, Check, Found, WatchedPath

T = 1_800_000_000.0
CHECK = (Check(DCP, "x/.metadata"),)


def job(two_tier: bool = False, **policy: object) -> JobTracker:
    paths = [WatchedPath(DURABLE, "/ckpt/j")]
    if two_tier:
        paths.append(WatchedPath(STAGING, "/nvme/j"))
    return JobTracker("j", tuple(paths), Policy(**policy), first_seen=T)  # type: ignore[arg-type]


def found(gen_id: str, state: str, start: float, commit: float | None = None, **kw) -> Found:
    last = kw.pop("last", commit if commit is not None else start)
    return Found(
        gen_id, kw.pop("step", None), state, start, last, commit, kw.pop("size", 10),
        kw.pop("files", 1), kw.pop("checks", CHECK), **kw,
    )  # fmt: skip


def ev(event: str, ts: float, step: int | None = 10, rank: int = 0, **kw) -> Event:
    return Event(
        ts, event, "j", step, rank, kw.pop("world_size", 1), kw.pop("host", "n1"),
        kw.pop("path", None), None, kw.pop("error", None), drill=kw.pop("drill", False),
    )  # fmt: skip
