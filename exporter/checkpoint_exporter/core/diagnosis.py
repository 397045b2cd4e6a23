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

__all__ = ["DiagnosisThresholds", "PastSave", "SaveFacts", "diagnose", "overlaps", "stall"]

# Network traffic under this many bytes in a window is no evidence of when traffic rose.
MIN_NETWORK_BYTES = 1e6
# A pause covering at least this share of the window leaves too little of it after the resume
# to judge the GPUs by (see ``training_disturbed``).
MAX_PAUSE_SHARE = 0.5


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
    # Every local rank resumed training only once its payload was written (resume not before
    # written): dcp.save, instrument.save. Its pause is the whole save by design.
    synchronous: bool = False


def overlaps(start: float, end: float, spans: Iterable[tuple[float, float]]) -> bool:
    """Whether [start, end] shares any time with one of ``spans``."""
    return any(s < end and start < e for s, e in spans)


def stall(facts: SaveFacts) -> float | None:
    """How long training was held before the payload moved, as far as the clocks say: the
    shorter of the pause and the staging phase for an async save (it resumes once staged); the
    staging phase alone for a synchronous one, whose pause is the whole save."""
    names = ("staging",) if facts.synchronous else ("pause", "staging")
    known = [facts.phases[p] for p in names if p in facts.phases]
    return min(known) if known else None


def staging_bound(facts: SaveFacts, t: DiagnosisThresholds) -> bool:
    """Training was held long before any byte moved.

    A synchronous save holds training through its write by design, and its ``staged`` mark
    need not mean anything: instrument.save writes staged, written, committed and resume
    together once dcp.save returns, so its staging phase is the whole save too. Its clocks are
    then no evidence of when the payload moved, and only the network is: such a save is
    staging-bound only when network telemetry saw the traffic and at most
    ``staging_network_share`` of it came during the staging phase. Without that evidence (a
    local disk, no telemetry) it is not diagnosed: a false symptom on every healthy
    synchronous save is worse than a missed one on a few."""
    total, held = facts.phases.get("total"), stall(facts)
    if not total or held is None:
        return False
    if held <= t.staging_seconds or held <= t.staging_share * total:
        return False
    window = facts.window
    sent = window.network_transmit_bytes if window is not None else None
    if sent is not None and sent >= MIN_NETWORK_BYTES and facts.stall_network_bytes is not None:
        # The network was busy while training was held: that pause was spent sending, which is
        # a slow write path, not staging.
        return facts.stall_network_bytes <= t.staging_network_share * sent
    return not facts.synchronous


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
    grown = totals[-1] - totals[0] > t.backlog_seconds
    return rising and grown and totals[-1] >= t.backlog_growth * totals[0] > 0


def training_disturbed(facts: SaveFacts, t: DiagnosisThresholds) -> bool:
    """Training ran slower while the save went on in the background.

    Training is held for the pause (the GPUs idle, by design: that cost is the pause, not a
    disturbance), and only the window's mean utilisation U over [start, end] is measured, not
    the part after the resume. With W the window and p the pause, U * W = p * u_held +
    (W - p) * u_after, and u_held >= 0, so u_after <= U * W / (W - p): the symptom is claimed
    only when even that upper bound is under ``gpu_share`` of the baseline. When the pause
    covers most of the window (``MAX_PAUSE_SHARE``; every synchronous save, whose pause is the
    whole save), what is left after it is too short for a sampler's mean to say anything and
    the bound grows without limit: not diagnosed."""
    window = facts.window
    if window is None or window.gpu_utilization is None:
        return False
    baseline = window.gpu_baseline_utilization
    if baseline is None or baseline < t.gpu_baseline:
        return False
    span, pause = facts.end - facts.start, facts.phases.get("pause", 0.0)
    if facts.synchronous or span <= 0 or pause >= MAX_PAUSE_SHARE * span:
        return False
    after = window.gpu_utilization * span / (span - pause)
    return after < t.gpu_share * baseline


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
