"""The generation state machine, every (state, evidence) pair (core/generations.py).

The table is read off what the tracker did before the machine was pulled out of it
(JobTracker._new, _update, _judged, tick). Pairs the tracker never produces today are marked
UNREACHABLE with the reason; the machine still answers them (it keeps the state).
"""

from __future__ import annotations

import itertools

import pytest

from checkpoint_exporter.core.generations import (
    FirstSight,
    Gen,
    Happened,
    Judged,
    Reread,
    Stalled,
    StillAfterLoss,
    reread,
    step,
)
from checkpoint_exporter.model import ABORTED, COMMITTED, DELETING, WRITING, Found

W, C, D, A = WRITING, COMMITTED, DELETING, ABORTED
N = Happened.NOTHING
STATES = (None, W, C, D, A)

EVIDENCE = {
    # first sight: only ever of an unknown generation (UNREACHABLE for a known one: observe
    # creates a record only for a key it does not have)
    "history writing": FirstSight(W, history=True),
    "history abandoned": FirstSight(W, history=True, abandoned=True),
    "history settling abandoned": FirstSight(W, history=True, settles=True, abandoned=True),
    "history committed": FirstSight(C, history=True),
    "live committed": FirstSight(C),
    "live aborted": FirstSight(A),
    "live writing": FirstSight(W),
    # rereads (UNREACHABLE for None: a reread is of a known generation)
    "marker gone, shrinking": Reread(W, moved=True, shrinking=True, losing_files=True),
    "resaved": Reread(C, moved=True, growing=True, resaved=True),
    "marker stands, losing files": Reread(C, moved=True, losing_files=True),
    "marker back, growing": Reread(C, moved=True, growing=True),
    # lost_for_good is computed only for a deleting generation (UNREACHABLE otherwise)
    "marker stands, lost for good": Reread(C, lost_for_good=True),
    "committed, moved": Reread(C, moved=True),
    "aborted by the writer": Reread(A, moved=True),
    "writing, moved": Reread(W, moved=True),
    "writing, unmoved": Reread(W),
    "writing, growing": Reread(W, moved=True, growing=True),
    "no marker, moved": Reread(W, settles=True, moved=True),
    "no marker, unmoved": Reread(W, settles=True),
    "no marker, losing files": Reread(W, settles=True, moved=True, losing_files=True),
    # tick and the ranks' reports: only ever about a writing generation (UNREACHABLE otherwise)
    "stalled": Stalled("no progress"),
    # tick: only ever about a deleting generation (UNREACHABLE otherwise)
    "still after loss": StillAfterLoss(),
    # verdicts: only a writing generation without a marker is judged (UNREACHABLE otherwise:
    # a verdict on any other records validity and keeps the state)
    "judged whole": Judged(True),
    "judged incomplete": Judged(False),
    "history judged whole": Judged(True, history=True),
}

# Per evidence, the outcome from each of STATES: None, writing, committed, deleting, aborted.
KEEP = ((None, N), (W, N), (C, N), (D, N), (A, N))
TABLE = {
    "history writing": ((W, N), *KEEP[1:]),
    "history abandoned": ((A, N), *KEEP[1:]),
    "history settling abandoned": ((W, N), *KEEP[1:]),
    "history committed": ((C, N), *KEEP[1:]),
    "live committed": ((C, Happened.COMMITTED), *KEEP[1:]),
    "live aborted": ((A, Happened.ABORTED), *KEEP[1:]),
    "live writing": ((W, N), *KEEP[1:]),
    "marker gone, shrinking": (
        (None, N), (W, N), (D, Happened.DELETING), (D, Happened.DELETING), (A, N),
    ),
    "resaved": (
        (None, N), (C, Happened.COMMITTED), (C, Happened.RESAVED), (C, Happened.RESAVED),
        (C, Happened.COMMITTED),
    ),
    "marker stands, losing files": (
        (None, N), (C, Happened.COMMITTED), (D, Happened.DELETING), (D, Happened.DELETING),
        (C, Happened.COMMITTED),
    ),
    "marker back, growing": (
        (None, N), (C, Happened.COMMITTED), (C, N), (C, Happened.JUDGED_AGAIN),
        (C, Happened.COMMITTED),
    ),
    "marker stands, lost for good": (
        (None, N), (C, Happened.COMMITTED), (C, N), (C, Happened.JUDGED_AGAIN),
        (C, Happened.COMMITTED),
    ),
    "committed, moved": (
        (None, N), (C, Happened.COMMITTED), (C, N), (D, N), (C, Happened.COMMITTED),
    ),
    "aborted by the writer": ((None, N), (A, Happened.ABORTED), (C, N), (D, N), (A, N)),
    "writing, moved": ((None, N), (W, N), (W, Happened.REWRITTEN), (D, N), (A, N)),
    # a marker-less read of a generation that had one: its marker went away, moved or not
    "writing, unmoved": ((None, N), (W, N), (W, Happened.REWRITTEN), (D, N), (A, N)),
    "writing, growing": (
        (None, N), (W, N), (W, Happened.REWRITTEN), (W, Happened.REWRITTEN), (A, N),
    ),
    "no marker, moved": (
        (None, N), (W, Happened.LIVE), (W, Happened.REWRITTEN), (D, N), (W, Happened.REWRITTEN),
    ),
    "no marker, unmoved": KEEP,
    "no marker, losing files": (
        (None, N), (W, Happened.LIVE), (D, Happened.DELETING), (D, Happened.DELETING),
        (W, Happened.REWRITTEN),
    ),
    "stalled": ((None, N), (A, Happened.ABORTED), (C, N), (D, N), (A, N)),
    "still after loss": ((None, N), (W, N), (C, N), (C, Happened.JUDGED_AGAIN), (A, N)),
    "judged whole": ((None, N), (C, Happened.COMMITTED), (C, N), (D, N), (A, N)),
    "judged incomplete": ((None, N), (W, Happened.INCOMPLETE), (C, N), (D, N), (A, N)),
    "history judged whole": ((None, N), (C, N), (C, N), (D, N), (A, N)),
}  # fmt: skip

CASES = [
    pytest.param(state, EVIDENCE[name], *TABLE[name][index], id=f"{state}-{name}")
    for name in EVIDENCE
    for index, state in enumerate(STATES)
]


def test_the_table_covers_every_evidence() -> None:
    assert set(TABLE) == set(EVIDENCE)
    assert all(len(row) == len(STATES) for row in TABLE.values())


@pytest.mark.parametrize(("state", "evidence", "expected", "happened"), CASES)
def test_step(state, evidence, expected, happened) -> None:
    assert step(state, evidence) == (expected, happened)


def test_every_reread_lands_in_a_published_state() -> None:
    """Total over every combination of a reread's facts, from every state."""
    flags = ("settles", "moved", "shrinking", "losing_files", "growing", "resaved")
    for found, values in itertools.product((W, C, A), itertools.product((False, True), repeat=6)):
        evidence = Reread(found, **dict(zip(flags, values, strict=True)))
        for state in (W, C, D, A):
            new, happened = step(state, evidence)
            assert new in (W, C, D, A)
            # A new save is counted only when a commit is read: never from a marker-less read.
            if happened in (Happened.COMMITTED, Happened.RESAVED):
                assert found == C


def _found(files: int = 3, size: int = 300, mtime: float = 100.0, **kw) -> Found:
    fields = {"state": C, "commit_time": mtime, "start_time": 90.0, **kw}
    return Found("step_1", 1, last_write_time=mtime, bytes=size, files=files, **fields)


def _gen(found: Found, state: str = C, progress_at: float = 100.0) -> Gen:
    gen = Gen(found, "durable", state, found.start_time, progress_at, history=False)
    gen.committed_at = found.commit_time if state == C else None
    return gen


def test_a_reread_compares_the_new_listing_with_the_last() -> None:
    gen = _gen(_found())
    marker_gone = reread(gen, _found(files=2, size=200, state=W, commit_time=None), 105.0, 30.0)
    assert marker_gone == Reread(W, moved=True, shrinking=True, losing_files=True)
    again = reread(gen, _found(files=3, size=300, mtime=200.0, start_time=150.0), 205.0, 30.0)
    assert again.resaved and again.moved
    # The marker rewritten alone over old files is not a new save.
    touched = reread(gen, _found(mtime=200.0), 205.0, 30.0)
    assert not touched.resaved


def test_a_deleting_generation_is_lost_for_good_once_still_for_the_settle_period() -> None:
    gen = _gen(_found(files=2), state=D, progress_at=100.0)
    assert not reread(gen, _found(files=2), 129.0, 30.0).lost_for_good
    assert reread(gen, _found(files=2), 130.0, 30.0).lost_for_good
    # Moving again restarts the period.
    assert not reread(gen, _found(files=1), 130.0, 30.0).lost_for_good
    assert gen.lost_for_good(130.0, 30.0)


def test_published_times_are_never_later_than_when_seen() -> None:
    gen = _gen(_found(mtime=10_000.0), progress_at=100.0)
    gen.found_at, gen.commit_seen = 100.0, (10_000.0, 100.0)
    public = gen.public()
    assert public.last_write_time == 100.0
    assert public.commit_time == 100.0
    assert public.start_time == 90.0
