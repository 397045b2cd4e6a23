"""The bottleneck diagnosis of each finished save (seed article section 7): the classifier, its
thresholds and their config, and the tracker that settles it once per save into the metrics."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client.exposition import generate_latest

from checkpoint_exporter.config import (
    Config,
    ConfigError,
    DiagnosisThresholds,
    Policy,
    config_to_dict,
    parse_config,
)
from checkpoint_exporter.core.diagnosis import PastSave, SaveFacts, diagnose
from checkpoint_exporter.core.tracker import JobTracker, Tracker
from checkpoint_exporter.exposition.collectors import REGISTRY, enabled_collectors
from checkpoint_exporter.exposition.renderer import Renderer
from checkpoint_exporter.model import (
    COMMITTED,
    DURABLE,
    SYMPTOMS,
    DaemonState,
    JobState,
    Snapshot,
    WatchedPath,
    WindowTelemetry,
)
from checkpoint_exporter.sources.layouts.base import Found
from checkpoint_exporter.sources.spool import Event
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
    snapshot = Snapshot(T, (state,), DaemonState(ready=True))
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
    thresholds = replace(D, telemetry_grace=1.0)
    tracker = Tracker(replace(Config(), diagnosis=thresholds))
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
                ("save_start", "resume", "staged", "written", "committed"),
                strict=True,
            )
        ]
        jobs[name].apply_events(events, start + seconds)
        jobs[name].tick(start + seconds + 5)

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
