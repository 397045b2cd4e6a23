"""The bottleneck diagnosis of each finished save (seed article section 7): the classifier, its
thresholds and their config, and the tracker that settles it once per save into the metrics."""

from __future__ import annotations

import itertools
import sys
import time
import types
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest

from checkpoint_exporter import instrument
from checkpoint_exporter.config import (
    Config,
    ConfigError,
    DiagnosisThresholds,
    Policy,
    config_to_dict,
    parse_config,
)
from checkpoint_exporter.core.diagnosis import PastSave, SaveFacts, diagnose
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.exposition.collectors import REGISTRY, enabled_collectors
from checkpoint_exporter.exposition.renderer import Renderer
from checkpoint_exporter.model import (
    COMMITTED,
    DURABLE,
    STAGING,
    SYMPTOMS,
    WRITING,
    DaemonState,
    JobState,
    Snapshot,
    WatchedPath,
    WindowTelemetry,
)
from checkpoint_exporter.sources.layouts.base import Found
from checkpoint_exporter.sources.spool import Event, SpoolReader
from tests.conftest import sample

T = 1_800_000_000.0
D = DiagnosisThresholds()
CLEAN_PHASES = {"pause": 0.4, "staging": 0.5, "write": 3.0, "commit": 0.2, "total": 4.0}


def clean(**changes: object) -> SaveFacts:
    """A clean 4 s save against a 10 s deadline: balanced ranks, a quick commit, a busy GPU."""
    facts = SaveFacts(
        start=T, end=T + 4, phases=CLEAN_PHASES, deadline=10.0, write_spread=0.2,
        commit_tail=0.2,
        window=WindowTelemetry(T, T + 4, 4e9, 0.6, 4e9, 0.85, 0.9),
        stall_network_bytes=1e6,
        history=(PastSave(4.1, False), PastSave(3.9, True), PastSave(4.0, False)),
    )  # fmt: skip
    return replace(facts, **changes)


def phases(**changes: float) -> dict[str, float]:
    return {**CLEAN_PHASES, **changes}


def test_a_clean_save_has_no_symptom() -> None:
    assert diagnose(clean(), D) == ()
    # Nothing measured is nothing diagnosed: a disk-only total, no telemetry, no neighbours.
    assert diagnose(SaveFacts(T, T + 50, {"total": 50.0}, 10.0), D) == ()


def test_staging_bound() -> None:
    held = phases(pause=3.0, staging=3.2, write=0.6, total=4.0)
    assert diagnose(clean(phases=held), D) == ("staging_bound",)
    # The network was busy while training was held: the pause was spent sending, not staging.
    busy = clean(phases=held, stall_network_bytes=2e9)
    assert diagnose(busy, D) == ()
    # Boundaries: the stall must exceed both half the total and one second.
    at_share = phases(pause=2.0, staging=2.0, total=4.0)
    assert diagnose(clean(phases=at_share), D) == ()
    assert diagnose(clean(phases=phases(pause=2.01, staging=2.01, total=4.0)), D) == (
        "staging_bound",
    )
    short = phases(pause=0.9, staging=0.9, write=0.1, total=1.0)
    assert diagnose(clean(phases=short), D) == ()
    # A synchronous save resumes after its write: its staging phase is the stall.
    sync = phases(pause=4.0, staging=0.5, write=3.3, total=4.0)
    assert diagnose(clean(phases=sync), D) == ()


def test_straggler() -> None:
    assert diagnose(clean(write_spread=2.0), D) == ("straggler",)
    assert diagnose(clean(write_spread=1.0), D) == ()  # at 25 % of 4 s: not over it
    assert diagnose(clean(write_spread=1.01), D) == ("straggler",)
    # A spread of 1 s in a long save is noise: over 1 s, but 10 % of a 10 s total.
    assert diagnose(clean(write_spread=1.0 + 1e-6, phases=phases(total=10.0)), D) == ()
    assert diagnose(clean(write_spread=None), D) == ()  # one rank: no spread


def test_commit_bound() -> None:
    slow = phases(write=0.5, commit=3.0, total=4.0)
    assert diagnose(clean(phases=slow, commit_tail=3.0), D) == ("commit_bound",)
    assert diagnose(clean(phases=slow, commit_tail=2.0), D) == ()  # half: not over it
    # A rank's commit phase that is the wait for a straggler's payload is no slow commit.
    straggled = clean(phases=slow, commit_tail=0.1, write_spread=2.9)
    assert diagnose(straggled, D) == ("straggler",)
    quick = phases(write=0.1, commit=0.9, total=1.0)
    assert diagnose(clean(phases=quick, commit_tail=0.9), D) == ()  # under a second


def test_contention() -> None:
    slow = phases(write=8.0, total=8.5)
    assert diagnose(clean(phases=slow, overlapped=True), D) == ("contention",)
    assert diagnose(clean(phases=slow, overlapped=False), D) == ()  # slow alone: not contention
    # 80 % of the 10 s deadline is the line.
    assert diagnose(clean(phases=phases(total=8.0), overlapped=True), D) == ()
    # The job is slow on its own too (its saves without a neighbour): not the neighbours.
    alone_slow = (PastSave(9.0, False), PastSave(4.0, True), PastSave(9.5, False))
    assert diagnose(clean(phases=slow, overlapped=True, history=alone_slow), D) == ()
    # Never seen alone: no evidence either way.
    together = (PastSave(4.0, True),)
    assert diagnose(clean(phases=slow, overlapped=True, history=together), D) == ()
    # A local cause explains the slowness first.
    straggling = clean(phases=slow, overlapped=True, write_spread=4.0)
    assert diagnose(straggling, D) == ("straggler",)


def test_backlog() -> None:
    rising = (PastSave(4.0, False), PastSave(5.0, False))
    slower = clean(phases=phases(total=6.0), history=rising, in_flight=1)
    assert diagnose(slower, D) == ("backlog",)
    assert diagnose(replace(slower, in_flight=0), D) == ()  # nothing piling up behind it
    # 1.5 times the oldest of the three is the line.
    assert diagnose(replace(slower, phases=phases(total=5.9)), D) == ()
    flat = (PastSave(4.0, False), PastSave(6.5, False))
    assert diagnose(replace(slower, history=flat), D) == ()  # not progressively slower
    assert diagnose(replace(slower, history=rising[1:]), D) == ()  # too few saves to tell


def test_training_disturbed() -> None:
    window = WindowTelemetry(T, T + 4, 4e9, 0.6, 4e9, 0.3, 0.9)
    assert diagnose(clean(window=window), D) == ("training_disturbed",)
    assert diagnose(clean(window=replace(window, gpu_utilization=0.45)), D) == ()  # half
    # An idle GPU (baseline under 20 %) cannot be disturbed.
    idle = WindowTelemetry(T, T + 4, 4e9, 0.6, 4e9, 0.01, 0.15)
    assert diagnose(clean(window=idle), D) == ()
    assert diagnose(clean(window=replace(window, gpu_baseline_utilization=None)), D) == ()


def test_several_symptoms_come_in_matrix_order() -> None:
    facts = clean(
        phases=phases(write=0.5, commit=3.0, total=4.0), commit_tail=3.0, write_spread=1.5,
        window=WindowTelemetry(T, T + 4, None, None, None, 0.1, 0.9),
    )  # fmt: skip
    assert diagnose(facts, D) == ("straggler", "commit_bound", "training_disturbed")
    assert list(diagnose(facts, D)) == [s for s in SYMPTOMS if s in diagnose(facts, D)]


def test_thresholds_are_configurable() -> None:
    loose = DiagnosisThresholds(straggler_share=0.6, straggler_seconds=3.0)
    assert diagnose(clean(write_spread=2.0), loose) == ()


# --- config -----------------------------------------------------------------------------------


def test_the_diagnosis_section_parses_and_prints() -> None:
    config = parse_config(
        "diagnosis: {straggler_share: 0.4, commit_seconds: 2s, backlog_saves: 4,"
        " backlog_growth: 2, telemetry_grace: 30s}\n"
    )
    assert config.diagnosis == replace(
        DiagnosisThresholds(), straggler_share=0.4, commit_seconds=2.0, backlog_saves=4,
        backlog_growth=2.0, telemetry_grace=30.0,
    )  # fmt: skip
    assert parse_config("").diagnosis == DiagnosisThresholds()
    shown = config_to_dict(config)["diagnosis"]
    assert shown["straggler_share"] == 0.4 and shown["commit_seconds"] == "2s"
    assert shown["telemetry_grace"] == "30s" and shown["backlog_saves"] == 4
    assert set(shown) == set(DiagnosisThresholds.__dataclass_fields__)


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("straggler_share: 1.5", "diagnosis.straggler_share", "above 0 and at most 1"),
        ("gpu_share: 0", "diagnosis.gpu_share", "above 0 and at most 1"),
        ("commit_share: yes", "diagnosis.commit_share", "expected a number"),
        ("commit_seconds: -1s", "diagnosis.commit_seconds", ""),
        ("backlog_saves: 1", "diagnosis.backlog_saves", "at least 2"),
        ("backlog_growth: 0.5", "diagnosis.backlog_growth", "at least 1"),
        ("stragler_share: 0.3", "diagnosis.stragler_share", "did you mean 'straggler_share'"),
    ],
)
def test_bad_diagnosis_values_are_named(text: str, key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(f"diagnosis:\n  {text}\n", "exporter.yaml")
    [problem] = raised.value.problems
    assert problem.key == key and reason in problem.reason and problem.line == 2


# --- the tracker: settled once per save, into JobState and the metrics ------------------------


def ev(event: str, ts: float, rank: int, step: int = 100, **kw: object) -> Event:
    return Event(ts, event, "j", step, rank, 2, "n1", kw.get("path"), None, kw.get("error"))


def straggling_save(step: int, start: float) -> list[Event]:
    """Two ranks; rank 1 ends its write 3 s after rank 0: a straggler."""
    events = []
    for rank, written in ((0, start + 1.0), (1, start + 4.0)):
        events += [
            ev("save_start", start, rank, step), ev("resume", start + 0.3, rank, step),
            ev("staged", start + 0.4, rank, step), ev("written", written, rank, step),
            ev("committed", start + 4.2, rank, step),
        ]  # fmt: skip
    return events


def job(thresholds: DiagnosisThresholds = D) -> JobTracker:
    tracker = Tracker(replace(Config(), diagnosis=thresholds))
    job = JobTracker("j", (WatchedPath(DURABLE, "/ckpt/j"),), Policy(deadline=10))
    tracker.add(job)
    job.observe(DURABLE, [], T)
    return job


def render(state: JobState) -> str:
    snapshot = Snapshot((state,), DaemonState(ready=True))
    return Renderer(lambda: snapshot, enabled_collectors({})).render(generate_latest).decode()


def counts(state: JobState) -> dict[str, int]:
    return dict(state.save_symptoms)


def test_a_save_waits_for_its_telemetry_then_is_diagnosed_once() -> None:
    tracker = job()
    before = tracker.state()
    assert counts(before) == dict.fromkeys(SYMPTOMS, 0)  # every symptom, from the start
    text = render(before)
    assert (
        sample(text, "checkpoint_save_symptoms_total", training_job="j", symptom="straggler") == 0
    )
    assert "checkpoint_last_save_symptom_info{" not in text

    tracker.apply_events(straggling_save(100, T), T + 4.3)
    tracker.tick(T + 5)  # the ranks settled: accounted, its diagnosis waits for telemetry
    assert tracker.state().last_phases and counts(tracker.state())["straggler"] == 0
    assert tracker.next_due(T + 5) is not None  # the grace is a timer, not a poll
    version = tracker.state().version
    tracker.set_window_telemetry(WindowTelemetry(T, T + 4.2, 0.0, 0.0, 1e8, 0.8, 0.8))
    state = tracker.state()
    assert state.version != version
    assert state.last_save_symptoms == ("straggler",)
    assert counts(state)["straggler"] == 1 and sum(counts(state).values()) == 1
    assert state.recent_saves[-1].symptoms == ("straggler",)
    text = render(state)
    assert (
        sample(text, "checkpoint_last_save_symptom_info", training_job="j", symptom="straggler")
        == 1
    )
    assert (
        sample(text, "checkpoint_save_symptoms_total", training_job="j", symptom="straggler") == 1
    )
    assert (
        sample(text, "checkpoint_last_save_symptom_info", training_job="j", symptom="backlog")
        is None
    )

    # The disk shows the commit later: accounted again, the save is not counted again.
    found = Found("step-100", 100, COMMITTED, T, T + 4.1, T + 4.2, 10**6, 3)
    tracker.observe(DURABLE, [found], T + 6)
    tracker.tick(T + 30)
    tracker.set_window_telemetry(WindowTelemetry(T, T + 4.2, 0.0, 0.0, 1e8, 0.8, 0.8))
    assert counts(tracker.state())["straggler"] == 1

    # A clean save next: the newest verdict is empty, the counter stays.
    clean_events = []
    for rank in (0, 1):
        clean_events += [
            ev("save_start", T + 60, rank, 200), ev("resume", T + 60.3, rank, 200),
            ev("staged", T + 60.4, rank, 200), ev("written", T + 62 + 0.1 * rank, rank, 200),
            ev("committed", T + 62.3, rank, 200),
        ]  # fmt: skip
    tracker.apply_events(clean_events, T + 62.5)
    tracker.tick(T + 63)
    tracker.tick(T + 62.3 + D.telemetry_grace + 0.1)  # no telemetry came: diagnosed without
    state = tracker.state()
    assert state.last_save_symptoms == () and counts(state)["straggler"] == 1
    assert tracker.next_due(T + 80) is None  # nothing left pending
    assert "checkpoint_last_save_symptom_info{" not in render(state)


def test_a_failed_restore_marks_its_save_unrestorable_once() -> None:
    tracker = job()
    tracker.apply_events(straggling_save(100, T), T + 4.3)
    tracker.tick(T + 20)
    for attempt in range(2):  # the drill fails twice on the same generation: counted once
        at = T + 30 + 10 * attempt
        tracker.apply_events(
            [ev("restore_start", at, 0, 100), ev("restore_failed", at + 1, 0, 100, error="x")],
            at + 1,
        )
    state = tracker.state()
    assert state.restore_failures == 2
    assert counts(state)["unrestorable"] == 1 and counts(state)["straggler"] == 1
    assert state.recent_saves[-1].symptoms == ("straggler", "unrestorable")
    assert state.last_save_symptoms == ("straggler", "unrestorable")
    text = render(state)
    assert (
        sample(text, "checkpoint_save_symptoms_total", training_job="j", symptom="unrestorable")
        == 1
    )


def test_contention_needs_a_neighbour_saving_at_once() -> None:
    jobs, save = _neighbours()

    save("a", 1, T, 1.0)  # alone and fast
    save("a", 2, T + 20, 1.2)
    save("b", 1, T + 40, 6.0)  # b saves from 40 to 46
    save("a", 3, T + 41, 4.5)  # a overlaps it, and is slow only then
    assert jobs["a"].state().last_save_symptoms == ("contention",)
    assert jobs["b"].state().last_save_symptoms == ()  # b is never seen fast alone
    save("a", 4, T + 60, 4.5)  # as slow, alone: the job itself is slow now, not contention
    assert jobs["a"].state().last_save_symptoms == ()
    assert dict(jobs["a"].state().save_symptoms)["contention"] == 1


def test_the_collector_is_on_by_default() -> None:
    assert REGISTRY["symptoms"].enabled_by_default


# --- what a review found: false and missed symptoms --------------------------------------------


def instrument_save_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: float, seconds: float, step: int = 1
) -> list[Event]:
    """What instrument.save really writes for a healthy synchronous save of ``seconds`` on two
    ranks (dcp.save replaced by one that takes that long on a fake clock), read back through
    the spool reader the daemon uses."""
    clock = [start]
    fake_time = types.SimpleNamespace(time=lambda: clock[0])
    monkeypatch.setattr(instrument, "time", fake_time)

    def dcp_save(state_dict: object, *, checkpoint_id: object, **kwargs: object) -> None:
        clock[0] += seconds

    dcp = types.ModuleType("torch.distributed.checkpoint")
    dcp.save = dcp_save  # type: ignore[attr-defined]
    distributed = types.ModuleType("torch.distributed")
    distributed.checkpoint = dcp  # type: ignore[attr-defined]
    torch = types.ModuleType("torch")
    torch.distributed = distributed  # type: ignore[attr-defined]
    for name, module in (
        ("torch", torch), ("torch.distributed", distributed),
        ("torch.distributed.checkpoint", dcp),
    ):  # fmt: skip
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("WORLD_SIZE", "2")
    hours = itertools.count(0, 3600)  # each poll lists the spool afresh
    reader = SpoolReader(tmp_path, monotonic=lambda: float(next(hours)))
    reader.poll(start)  # before the save: what it writes is live, not history
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        clock[0] = start
        instrument.save({}, checkpoint_id=f"/ckpt/j/step-{step}", training_job="j", step=step,
                        spool=str(tmp_path))  # fmt: skip
    events = reader.poll(start + seconds + 1)
    assert [e.event for e in events if e.rank == 0] == [
        "save_start",
        "staged",
        "written",
        "committed",
        "resume",
    ]  # the order instrument.save writes
    return events


def synchronous_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobTracker:
    start = time.time() - 100  # the spool reader refuses events from the future
    tracker = job(replace(D, telemetry_grace=5.0))
    tracker.apply_events(instrument_save_events(tmp_path, monkeypatch, start, 5.0), start + 6)
    tracker.tick(start + 7)  # settled, waiting for its telemetry
    assert tracker.state().last_phases
    return tracker


def test_a_healthy_synchronous_save_has_no_symptom_without_telemetry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracker = synchronous_save(tmp_path, monkeypatch)
    phases = dict(tracker.state().last_phases)
    assert phases["pause"] >= 5.0 and phases["staging"] >= 5.0  # the whole save, by design
    tracker.tick(tracker.state().recent_saves[-1].end + 6)  # no telemetry came
    state = tracker.state()
    assert state.last_save_symptoms == () and sum(counts(state).values()) == 0


@pytest.mark.parametrize(
    ("network", "stalled"),
    [
        (0.0, 0.0),  # a local disk: no network evidence either way
        (5e9, 5e9),  # NFS: the network busy all through the pause
    ],
)
def test_a_healthy_synchronous_save_is_neither_staging_bound_nor_disturbing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, network: float, stalled: float
) -> None:
    tracker = synchronous_save(tmp_path, monkeypatch)
    start, end = tracker._pending.facts.start, tracker._pending.facts.end
    # The GPUs idle while training waits for the write, as a synchronous save means them to.
    telemetry = WindowTelemetry(start, end, network, 0.6 if network else 0.0, 5e9, 0.02, 0.9)
    tracker.set_window_telemetry(telemetry, stalled)
    state = tracker.state()
    assert state.last_save_symptoms == () and sum(counts(state).values()) == 0


def test_a_synchronous_save_is_staging_bound_only_on_network_evidence() -> None:
    # A writer that marks ``staged`` after a 3 s copy to host memory, then writes over the
    # network for 1 s and resumes: the network was quiet while it staged.
    sync = phases(pause=4.2, staging=3.0, write=1.0, commit=0.2, total=4.2)
    facts = clean(phases=sync, synchronous=True, stall_network_bytes=1e6, write_spread=None)
    assert diagnose(facts, D) == ("staging_bound",)
    # The same phases without network telemetry: nothing says when bytes moved.
    assert diagnose(replace(facts, window=None, stall_network_bytes=None), D) == ()
    # instrument.save: staged with written, at the end; the network busy through the "stall".
    marked_late = phases(pause=4.2, staging=4.1, write=0.0, commit=0.0, total=4.2)
    assert diagnose(replace(facts, phases=marked_late, stall_network_bytes=4e9), D) == ()


def test_training_disturbed_discounts_the_pause() -> None:
    # A 2 s pause of a 4 s window with the GPUs idle in it: 45 % mean utilisation is 90 % after
    # the resume, undisturbed.
    window = WindowTelemetry(T, T + 4, 4e9, 0.6, 4e9, 0.4, 0.9)
    held = phases(pause=1.9, staging=0.5)
    assert diagnose(clean(window=window, phases=held), D) == ()
    # Even the best case (idle while held) leaves the rest under half the baseline: disturbed.
    low = replace(window, gpu_utilization=0.2)
    assert diagnose(clean(window=low, phases=held), D) == ("training_disturbed",)
    # The pause covers most of the window: what came after it is too short to judge.
    mostly = phases(pause=3.0, staging=0.5)
    assert diagnose(clean(window=replace(window, gpu_utilization=0.01), phases=mostly), D) == ()


def disk_first_straggler(tracker: JobTracker, grace_first: bool) -> JobState:
    tracker.observe(DURABLE, [Found("step-100", 100, WRITING, T, T + 1, None, 10**6, 3)], T + 1)
    found = Found("step-100", 100, COMMITTED, T, T + 4.1, T + 4.2, 10**6, 3)
    tracker.observe(DURABLE, [found], T + 4.3)  # the disk's commit, before any event is read
    if grace_first:
        tracker.tick(T + 30)  # the disk-only account is diagnosed (nothing) before the events
    tracker.apply_events(straggling_save(100, T), T + 31)
    tracker.tick(T + 33)
    tracker.tick(T + 60)
    return tracker.state()


@pytest.mark.parametrize("grace_first", [False, True])
def test_the_disk_first_then_the_ranks_counts_their_symptoms_once(grace_first: bool) -> None:
    state = disk_first_straggler(job(), grace_first)
    assert state.saves_committed == 1 and state.deadline_misses + state.saves_within_deadline == 1
    assert state.last_save_symptoms == ("straggler",)
    assert counts(state)["straggler"] == 1 and sum(counts(state).values()) == 1
    # One record for one save: the ranks' account replaced the disk's.
    assert [(r.step, r.symptoms) for r in state.recent_saves] == [(100, ("straggler",))]
    assert dict(state.recent_saves[-1].phases)["pause"] == pytest.approx(0.3)


def test_retained_staged_generations_read_without_their_durable_tier_are_no_backlog() -> None:
    """The cluster shape: staging read here, the durable tier shared and read elsewhere, three
    committed generations retained on staging. Slightly slower saves are no backlog."""
    tracker = Tracker(Config())
    paths = (WatchedPath(STAGING, "/local/j"), WatchedPath(DURABLE, "/ckpt/j", scanned=False))
    job_ = JobTracker("j", paths, Policy(deadline=60))
    tracker.add(job_)

    def gen(step: int, start: float, seconds: float) -> Found:
        return Found(f"step-{step}", step, COMMITTED, start, start + seconds, start + seconds,
                     10**6, 3)  # fmt: skip

    gens = [gen(s, T - 1000 + s, 1.0) for s in (1, 2, 3)]
    job_.observe(STAGING, list(gens), T)
    # Each save slower than the one before by over a second: only what is in flight tells.
    for i, (step, secs) in enumerate(((4, 4.0), (5, 5.5), (6, 7.0))):
        start = T + 100 * (i + 1)
        events = [
            Event(start + offset, point, "j", step, 0, 1, "n1", None, None, None)
            for offset, point in zip(
                (0, 0.05, 0.1, secs - 0.01, secs),
                ("save_start", "resume", "staged", "written", "committed"), strict=True,
            )
        ]  # fmt: skip
        job_.apply_events(events, start + secs + 0.1)
        gens = [*gens[1:], gen(step, start, secs)]  # retention keeps 3
        job_.observe(STAGING, list(gens), start + secs + 0.2)
        job_.tick(start + secs + 1)
        job_.tick(start + 30)
    state = job_.state()
    assert [dict(r.phases)["total"] for r in state.recent_saves] == pytest.approx([4, 5.5, 7])
    assert sum(counts(state).values()) == 0 and state.last_save_symptoms == ()


def test_backlog_needs_the_saves_to_grow_by_more_than_its_floor() -> None:
    rising = (PastSave(0.4, False), PastSave(0.5, False))
    small = clean(phases=phases(total=0.65), history=rising, in_flight=2)
    assert diagnose(small, D) == ()  # 1.6 times slower, by a quarter of a second
    assert diagnose(small, replace(D, backlog_seconds=0.2)) == ("backlog",)


def test_the_diagnosis_section_has_a_backlog_floor() -> None:
    assert parse_config("diagnosis: {backlog_seconds: 5s}\n").diagnosis.backlog_seconds == 5.0
    assert config_to_dict(parse_config(""))["diagnosis"]["backlog_seconds"] == "1s"


def restore(tracker: JobTracker, at: float, step: int, ok: bool) -> None:
    end = (
        ev("restore_done", at + 1, 0, step)
        if ok
        else ev("restore_failed", at + 1, 0, step, error="torn")
    )
    tracker.apply_events([ev("restore_start", at, 0, step), end], at + 1)


def test_a_failed_restore_of_an_older_generation_marks_no_other_save() -> None:
    tracker = job()
    tracker.apply_events(straggling_save(500, T), T + 4.3)
    tracker.tick(T + 20)
    assert tracker.state().last_save_symptoms == ("straggler",)
    restore(tracker, T + 40, 10, ok=False)  # step 10: not among the remembered saves
    state = tracker.state()
    assert state.last_save_symptoms == ("straggler",)
    assert state.recent_saves[-1].symptoms == ("straggler",)
    assert counts(state)["unrestorable"] == 1  # the failure is counted all the same
    restore(tracker, T + 60, 10, ok=False)
    assert counts(tracker.state())["unrestorable"] == 1  # once per generation


def test_a_later_successful_restore_clears_unrestorable() -> None:
    tracker = job()
    tracker.apply_events(straggling_save(500, T), T + 4.3)
    tracker.tick(T + 20)
    restore(tracker, T + 40, 500, ok=False)
    assert tracker.state().last_save_symptoms == ("straggler", "unrestorable")
    restore(tracker, T + 60, 500, ok=True)  # the drill passes now (a transient read error)
    state = tracker.state()
    assert state.last_save_symptoms == ("straggler",)
    assert state.recent_saves[-1].symptoms == ("straggler",)
    assert counts(state)["unrestorable"] == 1  # a counter never goes back


def _neighbours() -> tuple[dict[str, JobTracker], Callable[[str, int, float, float], None]]:
    """Two jobs a and b (deadline 5 s) in one Tracker, and ``save(job, step, start, seconds)``:
    one rank's asynchronous save, its telemetry grace passed."""
    tracker = Tracker(replace(Config(), diagnosis=replace(D, telemetry_grace=1.0)))
    jobs = {}
    for name in ("a", "b"):
        jobs[name] = JobTracker(name, (WatchedPath(DURABLE, f"/ckpt/{name}"),), Policy(deadline=5))
        tracker.add(jobs[name])
        jobs[name].observe(DURABLE, [], T)

    def save(name: str, step: int, start: float, seconds: float) -> None:
        events = [
            Event(start + offset, point, name, step, 0, 1, "n1", None, None, None)
            for offset, point in zip(
                (0, 0.1, 0.2, seconds - 0.1, seconds),
                ("save_start", "resume", "staged", "written", "committed"), strict=True,
            )
        ]  # fmt: skip
        jobs[name].apply_events(events, start + seconds)
        jobs[name].tick(start + seconds + 5)

    return jobs, save


def test_a_save_whose_ranks_never_ended_stops_reading_as_contention() -> None:
    jobs, save = _neighbours()

    save("a", 1, T, 1.0)
    save("a", 2, T + 20, 1.2)
    # b starts a save whose ranks never report again (killed): open for up to an hour.
    jobs["b"].apply_events([Event(T + 30, "save_start", "b", 1, 0, 1, "n1", None, None, None)],
                           T + 30)  # fmt: skip
    save("a", 3, T + 35, 4.5)  # within b's deadline x 2: b may still be saving
    assert jobs["a"].state().last_save_symptoms == ("contention",)
    save("a", 4, T + 300, 4.5)  # minutes later: b's silent save is no neighbour any more
    assert jobs["a"].state().last_save_symptoms == ()
    assert dict(jobs["a"].state().save_symptoms)["contention"] == 1


def test_a_past_save_keeps_the_overlap_it_had_when_diagnosed() -> None:
    """Whether an earlier save overlapped a neighbour is judged once, when it is diagnosed: the
    neighbour's own records of those saves are gone a dozen saves later."""
    jobs, save = _neighbours()

    save("a", 1, T, 1.0)  # alone and fast
    for step, at in ((2, T + 20), (3, T + 40)):
        save("b", step, at, 6.0)
        save("a", step, at + 1, 4.5)  # slow only beside b
        assert jobs["a"].state().last_save_symptoms == ("contention",)
    for step in range(4, 4 + 12):  # b saves alone a dozen times: its records of 2 and 3 go
        save("b", step, T + 100 + 20 * step, 1.0)
    assert [r.overlapped for r in jobs["a"].state().recent_saves] == [False, True, True]
    save("b", 99, T + 500, 6.0)
    save("a", 4, T + 501, 4.5)
    assert jobs["a"].state().last_save_symptoms == ("contention",)  # alone, a is fast


def test_a_job_is_known_to_time_saves_here_once_its_spool_shows_one() -> None:
    tracker = JobTracker("j", (WatchedPath(DURABLE, "/ckpt/j", scanned=False),), Policy())
    assert not tracker.state().saves_timed  # known from the config only: no symptom series
    tracker.apply_events([ev("restore_start", T, 0)], T)
    assert not tracker.state().saves_timed
    tracker.apply_events([ev("save_start", T, 0)], T)  # its first save here, still under way
    assert tracker.state().saves_timed
