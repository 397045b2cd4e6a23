"""The vocabulary: plain, immutable dataclasses that flow from the tracker to the scrape."""

from __future__ import annotations

from dataclasses import dataclass

DURABLE = "durable"  # where committed generations must end up
STAGING = "staging"  # a fast tier that must drain to the durable one


@dataclass(frozen=True)
class WatchedPath:
    tier: str
    path: str


@dataclass(frozen=True)
class JobState:
    """What the exporter knows about one training job at one instant."""

    name: str
    layout: str
    paths: tuple[WatchedPath, ...]
    interval_seconds: float
    deadline_seconds: float
    retained_generations_limit: int
    restore_drill_max_age_seconds: float


@dataclass(frozen=True)
class Snapshot:
    """Everything a scrape renders. Built off the scrape path; read without locks or I/O."""

    taken_at: float
    jobs: tuple[JobState, ...] = ()
