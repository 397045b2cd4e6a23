"""Finished saves held until their window's telemetry is known, then diagnosed
(core/diagnosis.py); the symptoms counted once per save."""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from checkpoint_exporter.config import DiagnosisThresholds
from checkpoint_exporter.core.base import JobBase
from checkpoint_exporter.core.clocks import SaveKey, Timeline
from checkpoint_exporter.core.diagnosis import PastSave, SaveFacts, diagnose, overlaps, stall
from checkpoint_exporter.core.ledger import COUNTED_KEYS
from checkpoint_exporter.model import (
    STAGING,
    SYMPTOMS,
    WRITING,
    SaveRecord,
    WindowTelemetry,
)

# A save whose ranks started here and never all reported is taken as holding the storage path
# (for the neighbours' contention diagnosis, and as in flight for the backlog one) for this many
# of its deadlines, or as long as its ranks still report: not the hour it is followed.
OPEN_SAVE_DEADLINES = 2.0
Spans = Callable[[str], list[tuple[float, float]]]  # other jobs' save spans, by job name


@dataclass
class _Pending:
    """A finished save waiting for its window's telemetry before it is diagnosed."""

    record: SaveRecord
    key: SaveKey | None
    live: bool
    facts: SaveFacts
    due: float  # local clock: diagnosed without telemetry from then on


@dataclass(eq=False)
class Diagnosing(JobBase):
    """The newest save's diagnosis, and the symptom counters."""

    # The thresholds and the other jobs' save spans come from the Tracker; alone (a test, a
    # tool) a job sees no neighbours.
    thresholds: DiagnosisThresholds = field(default_factory=DiagnosisThresholds)
    telemetry_grace: float | None = None  # None: thresholds.telemetry_grace
    neighbours: Spans | None = None
    last_save_symptoms: tuple[str, ...] = ()
    symptom_counts: Counter[str] = field(default_factory=Counter)
    _pending: _Pending | None = None
    # Per save (or restored generation) key, the symptoms already counted: a save accounted
    # twice (the disk's commit first, its ranks' events later) counts each symptom once.
    _counted: OrderedDict[object, set[str]] = field(default_factory=OrderedDict)

    def set_window_telemetry(
        self, telemetry: WindowTelemetry, stall_network_bytes: float | None = None
    ) -> None:
        """What this node's devices did during the newest save; ``stall_network_bytes``: the
        network bytes sent while training was held before its payload moved (``stall_window``)."""
        self.window_telemetry = telemetry
        self._touch()
        pending = self._pending
        if pending is not None and (telemetry.start, telemetry.end) == (
            pending.facts.start,
            pending.facts.end,
        ):
            self._diagnose(telemetry, stall_network_bytes)

    def stall_window(self) -> tuple[float, float] | None:
        """The part of the save awaiting diagnosis during which training was held before its
        payload moved (the shorter of its pause and staging phases); None when not known."""
        pending = self._pending
        held = stall(pending.facts) if pending is not None else None
        if pending is None or held is None:
            return None
        return pending.facts.start, pending.facts.start + held

    def busy_spans(self) -> list[tuple[float, float]]:
        """When this job's saves held the storage path: finished saves, and saves in progress
        (open-ended), on the local clock. A save followed from its ranks' events whose ranks
        stopped reporting holds it only for a while (``_open_span``)."""
        spans = [(record.start, record.end) for record in self.recent_saves]
        for timeline in self.clocks.saves.values():
            span = self._open_span(timeline)
            if span is not None:
                spans.append(span)
        for gen in self._gens.values():
            if gen.state == WRITING and not gen.history:
                spans.append((self.local_time(gen.start_time), math.inf))
        return spans

    def _await_diagnosis(
        self, record: SaveRecord, key: SaveKey | None, live: bool, phases: dict[str, float],
        timeline: Timeline | None, window: tuple[float, float],
    ) -> None:  # fmt: skip
        """Hold the save until its window's telemetry is known (or the grace passed)."""
        if self._pending is not None and self._pending.key != key:
            self._diagnose(None)  # a newer save took the window: its telemetry will not come
        commit_tail = None
        if timeline is not None:
            written = [e["written"] for e in timeline.ranks.values() if "written" in e]
            committed = [e["committed"] for e in timeline.ranks.values() if "committed" in e]
            if written and committed:
                commit_tail = max(0.0, max(committed) - max(written))
        facts = SaveFacts(
            start=window[0], end=window[1], phases=dict(phases),
            deadline=self.policy.deadline,
            write_spread=timeline.write_spread() if timeline is not None else None,
            commit_tail=commit_tail, in_flight=self._in_flight(key, window[1]),
            synchronous=timeline is not None and _synchronous(timeline),
        )  # fmt: skip
        grace = (
            self.thresholds.telemetry_grace
            if self.telemetry_grace is None
            else self.telemetry_grace
        )
        self._pending = _Pending(record, key, live, facts, window[1] + grace)
        telemetry = self.window_telemetry
        if telemetry is not None and (telemetry.start, telemetry.end) == window:
            self._diagnose(telemetry)  # accounted again: its telemetry is already in

    def _open_span(self, timeline: Timeline) -> tuple[float, float] | None:
        """A save in progress from its ranks' events: from its first start to its deadline x
        ``OPEN_SAVE_DEADLINES`` later, or to its newest event if a rank still reports after
        that. One whose ranks were killed mid-save is followed for an hour before it is given
        up; open-ended all that time, every other job's slow save would read as contention."""
        starts = [e["save_start"] for e in timeline.ranks.values() if "save_start" in e]
        if not starts:
            return None
        start = min(starts)
        newest = max(ts for events in timeline.ranks.values() for ts in events.values())
        return start, max(start + OPEN_SAVE_DEADLINES * self.policy.deadline, newest)

    def _in_flight(self, key: SaveKey | None, at: float) -> int:
        """Other generations of the job still in flight at ``at``: being written on either
        tier, or committed on staging and not yet drained to the durable tier. The latter only
        where both tiers are read here: a process reading staging alone (the durable tier
        shared) sees every retained staged generation and none of their durable copies."""
        ids = set()
        for gen in self._gens.values():
            if key is not None and self._save_key(gen) == key:
                continue
            if gen.state == WRITING and not gen.history:
                ids.add(gen.found.id)
        if self._two_tier():
            drained = self.drain.drained or {}
            for gen_id in self.drain.staged or {}:
                gen = self._gens.get((STAGING, gen_id))
                if gen_id in drained or gen is None:
                    continue
                if key is None or self._save_key(gen) != key:
                    ids.add(gen_id)
        others = 0
        for other, timeline in self.clocks.saves.items():
            span = self._open_span(timeline)
            others += other != key and span is not None and span[1] >= at
        return max(len(ids), others)

    def _diagnose(
        self, telemetry: WindowTelemetry | None, stall_network_bytes: float | None = None
    ) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        spans = self.neighbours(self.name) if self.neighbours is not None else []
        facts = pending.facts
        history, seen = [], {facts.start}
        for record in self.recent_saves:
            total = dict(record.phases).get("total")
            if record is pending.record or record.start in seen or total is None:
                continue  # itself, a save accounted twice, or an aborted one
            if record.start < facts.start:
                seen.add(record.start)
                # As judged when it was diagnosed: the neighbours' records of then are gone.
                history.append(PastSave(total, record.overlapped))
        overlapped = overlaps(facts.start, facts.end, spans)
        facts = replace(
            facts, window=telemetry, stall_network_bytes=stall_network_bytes,
            overlapped=overlapped, history=tuple(history),
        )  # fmt: skip
        symptoms = diagnose(facts, self.thresholds)
        record = pending.record
        if record.overlapped != overlapped:
            record = replace(record, overlapped=overlapped)
            self._replace_record(pending.record, record)
        self._mark(record, symptoms, pending.key, pending.live)

    def _mark(
        self, record: SaveRecord | None, symptoms: tuple[str, ...], key: object, live: bool
    ) -> None:
        """Add ``symptoms`` to a save's record (and to the newest save's verdict when it is that
        one), counting each once per save."""
        self._touch()
        if record is not None:
            merged = tuple(s for s in SYMPTOMS if s in symptoms or s in record.symptoms)
            self._replace_record(record, replace(record, symptoms=merged))
        if not live:
            return  # history sets the record, never a counter
        counted = self._counted.setdefault(key, set())
        self._counted.move_to_end(key)
        while len(self._counted) > COUNTED_KEYS:
            self._counted.popitem(last=False)
        for symptom in symptoms:
            if symptom not in counted:
                counted.add(symptom)
                self.symptom_counts[symptom] += 1


def _synchronous(timeline: Timeline) -> bool:
    """Every local rank that reported both resumed training only once its payload was written
    (dcp.save and instrument.save; ``saving`` with resume() called after written())."""
    both = [e for e in timeline.ranks.values() if "resume" in e and "written" in e]
    return bool(both) and all(e["resume"] >= e["written"] for e in both)
