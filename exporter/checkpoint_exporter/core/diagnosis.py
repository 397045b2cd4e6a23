"""Which bottleneck of the seed article's matrix (section 7) one finished save shows.

Pure: the tracker gathers the facts of a save (``SaveFacts``: its clocks, its ranks' write ends,
what this node's devices did in its window, the neighbours' saves overlapping it, the job's own
recent saves) and ``diagnose`` answers with the symptoms, in ``SYMPTOMS`` order. The thresholds
are ``DiagnosisThresholds`` (the exporter config's ``diagnosis:`` section), argued there and in
docs/runbooks.md. ``unrestorable`` is not decided here: it is known only when a restore of the
committed generation fails, after the save (the tracker marks that save).

Each symptom needs evidence measured for that save; a fact nobody measured (no spool events,
no telemetry) never yields a symptom.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from checkpoint_exporter.config import DiagnosisThresholds
from checkpoint_exporter.model import SYMPTOMS, WindowTelemetry

__all__ = ["DiagnosisThresholds", "PastSave", "SaveFacts", "diagnose", "overlaps"]

# Network traffic under this many bytes in a window is no evidence of when traffic rose.
MIN_NETWORK_BYTES = 1e6


@dataclass(frozen=True)
class PastSave:
    """One of the job's earlier finished saves, as the backlog and contention rules need it."""

    total: float
    overlapped: bool  # another job's save overlapped it


@dataclass(frozen=True)
class SaveFacts:
    start: float  # local clock: the first rank's save_start (or the disk's start)
    end: float  # its commit (durable commit for a two-tier save)
    phases: Mapping[str, float]  # pause, staging, write, commit, total (slowest local rank)
    deadline: float
    write_spread: float | None = None  # last minus first local rank's end of writing
    # From the last rank's end of writing to the last rank's commit: the final completion.
    # The per-rank commit phase also holds the wait for a slower rank's payload, so it is not
    # used for commit_bound (a straggler would read as a slow commit).
    commit_tail: float | None = None
    window: WindowTelemetry | None = None  # this node's devices over [start, end]
    # Network bytes this node sent while training was held before the payload moved.
    stall_network_bytes: float | None = None
    overlapped: bool = False  # another job's save (finished or in progress) overlapped it
    history: tuple[PastSave, ...] = ()  # the job's previous saves, oldest first
    in_flight: int = 0  # other generations of the job still in flight when it ended


def overlaps(start: float, end: float, spans: Iterable[tuple[float, float]]) -> bool:
    """Whether [start, end] shares any time with one of ``spans``."""
    return any(s < end and start < e for s, e in spans)


def _stall(phases: Mapping[str, float]) -> float | None:
    """How long training was held before the payload moved: the shorter of the pause and the
    staging phase (an async save resumes once staged; a synchronous one resumes after the write,
    so its staging phase is what came before the payload)."""
    known = [phases[p] for p in ("pause", "staging") if p in phases]
    return min(known) if known else None


def staging_bound(facts: SaveFacts, t: DiagnosisThresholds) -> bool:
    total, stall = facts.phases.get("total"), _stall(facts.phases)
    if not total or stall is None:
        return False
    if stall <= t.staging_seconds or stall <= t.staging_share * total:
        return False
    window = facts.window
    sent = window.network_transmit_bytes if window is not None else None
    if sent is not None and sent >= MIN_NETWORK_BYTES and facts.stall_network_bytes is not None:
        # The network was busy while training was held: that pause was spent sending, which is
        # a slow write path, not staging.
        return facts.stall_network_bytes <= t.staging_network_share * sent
    return True


def straggler(facts: SaveFacts, t: DiagnosisThresholds) -> bool:
    total, spread = facts.phases.get("total"), facts.write_spread
    if not total or spread is None:
        return False
    return spread > t.straggler_seconds and spread > t.straggler_share * total


def commit_bound(facts: SaveFacts, t: DiagnosisThresholds) -> bool:
    total, tail = facts.phases.get("total"), facts.commit_tail
    if not total or tail is None:
        return False
    return tail > t.commit_seconds and tail > t.commit_share * total


def contention(facts: SaveFacts, t: DiagnosisThresholds, explained: bool) -> bool:
    total = facts.phases.get("total")
    limit = t.contention_deadline_share * facts.deadline
    if explained or not facts.overlapped or total is None or total <= limit:
        return False
    alone = [save.total for save in facts.history if not save.overlapped]
    # The job is fast on its own: without such saves, nothing says the neighbours made it slow.
    return bool(alone) and statistics.median(alone) <= limit


def backlog(facts: SaveFacts, t: DiagnosisThresholds) -> bool:
    total = facts.phases.get("total")
    if total is None or facts.in_flight < t.backlog_in_flight:
        return False
    totals = [save.total for save in facts.history[-(t.backlog_saves - 1) :]] + [total]
    if len(totals) < t.backlog_saves:
        return False
    rising = all(later > earlier for earlier, later in itertools.pairwise(totals))
    return rising and totals[-1] >= t.backlog_growth * totals[0] > 0


def training_disturbed(facts: SaveFacts, t: DiagnosisThresholds) -> bool:
    window = facts.window
    if window is None or window.gpu_utilization is None:
        return False
    baseline = window.gpu_baseline_utilization
    if baseline is None or baseline < t.gpu_baseline:
        return False
    return window.gpu_utilization < t.gpu_share * baseline


def diagnose(facts: SaveFacts, thresholds: DiagnosisThresholds) -> tuple[str, ...]:
    """The symptoms of one finished save, in ``SYMPTOMS`` order; () for a clean save."""
    found = {
        "staging_bound": staging_bound(facts, thresholds),
        "straggler": straggler(facts, thresholds),
        "commit_bound": commit_bound(facts, thresholds),
        "backlog": backlog(facts, thresholds),
        "training_disturbed": training_disturbed(facts, thresholds),
    }
    # Contention is a diagnosis of exclusion: a save slowed by its own straggler, commit or
    # staging is slow for that reason, whoever else was saving.
    local = found["staging_bound"] or found["straggler"] or found["commit_bound"]
    found["contention"] = contention(facts, thresholds, local)
    return tuple(symptom for symptom in SYMPTOMS if found.get(symptom))
