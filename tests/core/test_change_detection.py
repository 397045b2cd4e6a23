"""Writes that change no directory's mtime, and generations without a commit marker.

The real writers do both: DeepSpeed and Megatron-LM rewrite their pointer file in place,
DCP renames `.metadata` over a name, a move across filesystems is a copy that grows in place, and
a single-file checkpoint has no marker at all. The writers tier (tests/writers/) proves it live;
these pin each rule down.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from checkpoint_exporter.config import Policy
from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.model import (
    ABORTED,
    COMMITTED,
    DURABLE,
    WRITING,
    WatchedPath,
    newest_committed,
)
from checkpoint_exporter.sources.layouts.base import ZIP, Check, Found, file_generation
from checkpoint_exporter.sources.validate import Verdict
from tests.helpers.trees import daemon_reader

T = 1_800_000_000.0


def rewrite_in_place(path: Path, text: str, mtime: float | None = None) -> None:
    with open(path, "w") as handle:  # O_TRUNC on the same inode: the directory is untouched
        handle.write(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


# --- listing -------------------------------------------------------------------------------


def test_a_pointer_rewritten_in_place_is_read_again(tmp_path: Path) -> None:
    (tmp_path / "global_step1").mkdir()
    (tmp_path / "global_step2").mkdir()
    rewrite_in_place(tmp_path / "latest", "global_step1")
    tree_reader = daemon_reader(tmp_path)
    tree, _ = tree_reader.read()
    assert tree.contents["latest"] == b"global_step1"
    root_mtime = os.stat(tmp_path).st_mtime_ns
    rewrite_in_place(tmp_path / "latest", "global_step2")
    assert os.stat(tmp_path).st_mtime_ns == root_mtime  # nothing a directory listing would see
    tree, stats = tree_reader.read()
    assert tree.contents["latest"] == b"global_step2"
    assert stats.listed == 0  # re-statted, not relisted


def test_same_size_same_mtime_rewrite_is_told_by_ctime(tmp_path: Path) -> None:
    """Filers with one-second mtimes: the same length written twice within a second."""
    rewrite_in_place(tmp_path / "latest_checkpointed_iteration.txt", "100", mtime=T)
    tree_reader = daemon_reader(tmp_path)
    tree, _ = tree_reader.read()
    rewrite_in_place(tmp_path / "latest_checkpointed_iteration.txt", "200", mtime=T)
    tree, _ = tree_reader.read()
    assert tree.contents["latest_checkpointed_iteration.txt"] == b"200"


def test_a_rename_over_a_known_name_is_a_new_file(tmp_path: Path) -> None:
    step = tmp_path / "step-1"
    step.mkdir()
    (step / ".metadata").write_bytes(b"x" * 10)
    tree_reader = daemon_reader(tmp_path)
    tree_reader.read()
    (step / ".metadata.tmp").write_bytes(b"y" * 99)
    os.replace(step / ".metadata.tmp", step / ".metadata")
    tree, _ = tree_reader.read()
    assert tree.subdirs["step-1"].file(".metadata")[0] == 99


def test_a_file_that_grows_after_it_appeared_keeps_growing(tmp_path: Path) -> None:
    checkpoint = tmp_path / "epoch=0-step=10.ckpt"
    checkpoint.write_bytes(b"z" * 10)
    tree_reader = daemon_reader(tmp_path)
    tree_reader.read()
    with open(checkpoint, "ab") as handle:  # a copy across filesystems, still going
        handle.write(b"z" * 5000)
    tree, _ = tree_reader.read()
    assert tree.file("epoch=0-step=10.ckpt")[0] == 5010


def test_a_file_the_watcher_named_is_restatted(tmp_path: Path) -> None:
    step = tmp_path / "step-1"
    step.mkdir()
    shard = step / "__0_0.distcp"
    shard.write_bytes(b"a" * 10)
    tree_reader = daemon_reader(tmp_path)
    tree_reader.read()
    rewrite_in_place(shard, "b" * 40)
    tree, _ = tree_reader.read()
    assert tree.subdirs["step-1"].file("__0_0.distcp")[0] == 10  # not a marker: not re-statted
    tree, _ = tree_reader.read(touched=["step-1/__0_0.distcp"])
    assert tree.subdirs["step-1"].file("__0_0.distcp")[0] == 40


def test_markers_cost_one_stat_each_and_unchanged_ones_keep_the_tree(tmp_path: Path) -> None:
    for step in range(3):
        directory = tmp_path / f"step-{step}"
        directory.mkdir()
        for rank in range(50):
            (directory / f"__{rank}_0.distcp").write_bytes(b"s")
        (directory / ".metadata").write_bytes(b"m")
    tree_reader = daemon_reader(tmp_path)
    first, _ = tree_reader.read()
    again, stats = tree_reader.read()
    assert (stats.listed, stats.statted) == (0, 3 + 3)  # three directories, three markers
    assert again is first


# --- tracker -------------------------------------------------------------------------------


def job(deadline: float = 30, settle: float = 5, abort_after: float = 30) -> JobTracker:
    """abort_after as short as the deadline: these tests are about settling, not its default."""
    policy = Policy(deadline=deadline, settle=settle, abort_after=abort_after)
    return JobTracker("j", (WatchedPath(DURABLE, "/x"),), policy)


def single(size: int, mtime: float, name: str = "last.ckpt") -> Found:
    return file_generation(name, size, mtime, None, (Check(ZIP, name),))


def test_a_generation_without_marker_commits_once_still_and_whole() -> None:
    tracker = job()
    tracker.observe(DURABLE, [], T)
    assert tracker.observe(DURABLE, [single(10, T + 1)], T + 1).requests == []
    assert tracker.observe(DURABLE, [single(500, T + 2)], T + 2).requests == []  # still growing
    assert (
        tracker.observe(DURABLE, [single(500, T + 2)], T + 6.9).requests == []
    )  # not still long enough
    assert tracker.state().generations[0].state == WRITING
    (request,) = tracker.observe(DURABLE, [single(500, T + 2)], T + 7).requests
    tracker.submitted(request)
    tracker.apply_verdict(request, Verdict(True, step=42))
    state = tracker.state()
    (generation,) = state.generations
    assert (generation.state, generation.valid, generation.step) == (COMMITTED, True, 42)
    assert generation.commit_time == T + 2  # when its last write ended
    assert (state.saves_committed, state.saves_aborted, state.last_committed_valid) == (1, 0, True)


def test_an_incomplete_one_is_aborted_at_abort_after_not_at_the_settle(caplog) -> None:
    tracker = job(deadline=30, settle=5)
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [single(500, T + 1)], T + 1)
    (request,) = tracker.observe(DURABLE, [single(500, T + 1)], T + 6).requests
    tracker.submitted(request)
    tracker.apply_verdict(request, Verdict(False, "bad_zip", "no end record"))
    tracker.tick(T + 20)  # a writer may pause between two chunks: not yet
    assert tracker.state().generations[0].state == WRITING
    with caplog.at_level(logging.WARNING):
        tracker.tick(T + 31.1)
    state = tracker.state()
    assert (state.generations[0].state, state.saves_aborted) == (ABORTED, 1)
    assert "save aborted: job=j" in caplog.text and "reason=bad_zip" in caplog.text


def test_found_at_start_up_it_is_history_judged_at_once() -> None:
    tracker = job()
    (request,) = tracker.observe(DURABLE, [single(500, T)], T + 3600).requests
    tracker.submitted(request)
    tracker.apply_verdict(request, Verdict(True))
    state = tracker.state()
    assert (state.generations[0].state, state.saves_committed) == (COMMITTED, 0)


def test_rewritten_after_its_verdict_it_is_a_new_save() -> None:
    tracker = job()
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [single(500, T + 1)], T + 1)
    (request,) = tracker.observe(DURABLE, [single(500, T + 1)], T + 7).requests
    tracker.apply_verdict(request, Verdict(True))
    tracker.observe(DURABLE, [single(700, T + 60)], T + 60)  # last.ckpt saved again
    assert tracker.state().generations[0].state == WRITING
    (request,) = tracker.observe(DURABLE, [single(700, T + 60)], T + 66).requests
    tracker.apply_verdict(request, Verdict(True))
    state = tracker.state()
    assert (state.generations[0].state, state.saves_committed) == (COMMITTED, 2)


def test_the_valid_gauge_keeps_its_verdict_while_a_newer_generation_is_validated() -> None:
    tracker = job()
    old = Found("step-1", 1, COMMITTED, T, T + 1, T + 1, 10, 1, (Check(ZIP, "a"),))
    (request,) = tracker.observe(DURABLE, [old], T + 2).requests
    tracker.apply_verdict(request, Verdict(True))
    assert tracker.state().last_committed_valid is True
    new = Found("step-2", 2, COMMITTED, T + 10, T + 11, T + 11, 10, 1, (Check(ZIP, "b"),))
    (request,) = tracker.observe(DURABLE, [old, new], T + 12).requests
    state = tracker.state()
    assert state.last_committed_valid is True  # not absent while step-2 is checked
    tracker.apply_verdict(request, Verdict(False, "bad_zip"))
    assert tracker.state().last_committed_valid is False


def test_a_rewrite_in_place_keeps_the_last_commit_visible_until_judged() -> None:
    """save_pretrained into the same directory: while the new files settle, the last committed
    state is still what a scrape shows (nothing blinks); an aborted rewrite leaves nothing."""
    tracker = job()
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [single(500, T + 1)], T + 1)
    (request,) = tracker.observe(DURABLE, [single(500, T + 1)], T + 7).requests
    tracker.apply_verdict(request, Verdict(True))
    tracker.observe(DURABLE, [single(900, T + 60)], T + 60)
    views = {g.state: g for g in tracker.state().generations}
    assert set(views) == {WRITING, COMMITTED}
    assert (views[COMMITTED].bytes, views[COMMITTED].valid) == (500, True)
    assert newest_committed(tracker.state()).bytes == 500
    assert tracker.state().last_committed_valid is True
    tracker.tick(T + 60 + 31)  # the rewrite was killed: never judged whole
    state = tracker.state()
    assert [g.state for g in state.generations] == [ABORTED]
    assert newest_committed(state) is None


def test_retention_removing_the_marker_first_is_neither_a_save_nor_an_abort() -> None:
    """torchtitan's purge and Orbax's max_to_keep rmtree a step: `.metadata` may go before the
    shards, and a purge killed half-way leaves the rest. No save in progress, no abort."""
    tracker = job(deadline=30)
    full = Found("step-1", 1, COMMITTED, T, T + 1, T + 1, 100, 5, ())
    tracker.observe(DURABLE, [full], T + 2)
    half = Found("step-1", 1, WRITING, T, T + 1, None, 60, 3, ())
    tracker.observe(DURABLE, [half], T + 100)
    tracker.tick(T + 1000)
    state = tracker.state()
    assert [g.state for g in state.generations] == ["deleting"]
    assert (state.saves_aborted, newest_committed(state)) == (0, None)


def test_a_rewrite_that_truncates_first_is_a_save_not_a_deletion() -> None:
    """copyfile over last.ckpt (TMPDIR on another filesystem): the file is truncated, then
    grows. Smaller is not retention for a generation without a marker; the last commit stays
    visible, and a finished rewrite smaller than before is judged and counted."""
    tracker = job()
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [single(500, T + 1)], T + 1)
    (request,) = tracker.observe(DURABLE, [single(500, T + 1)], T + 7).requests
    tracker.apply_verdict(request, Verdict(True))
    tracker.observe(DURABLE, [single(10, T + 60)], T + 60)  # truncated, being copied
    state = tracker.state()
    assert {g.state for g in state.generations} == {WRITING, COMMITTED}
    assert newest_committed(state).bytes == 500
    tracker.observe(DURABLE, [single(499, T + 61)], T + 61)  # the copy done
    (request,) = tracker.observe(DURABLE, [single(499, T + 61)], T + 67).requests
    tracker.apply_verdict(request, Verdict(True))
    state = tracker.state()
    assert ([g.state for g in state.generations], state.saves_committed) == ([COMMITTED], 2)
    assert newest_committed(state).bytes == 499


def test_the_same_name_saved_again_is_a_new_commit() -> None:
    """dcp.save into a fixed checkpoint_id: shards rewritten under the old .metadata, then a
    new .metadata renamed over it. And a generation deleted and saved anew under its name."""
    tracker = job()
    tracker.observe(DURABLE, [], T)
    first = Found("ckpt", None, COMMITTED, T, T + 1, T + 1, 100, 5, ())
    tracker.observe(DURABLE, [first], T + 2)
    rewriting = Found("ckpt", None, COMMITTED, T, T + 50, T + 1, 60, 5, ())
    tracker.observe(DURABLE, [rewriting], T + 50)
    assert tracker.state().saves_committed == 1  # the old marker still stands
    again = Found("ckpt", None, COMMITTED, T + 40, T + 61, T + 61, 100, 5, ())  # all rewritten
    tracker.observe(DURABLE, [again], T + 62)
    assert tracker.state().saves_committed == 2
    going = Found("ckpt", None, WRITING, T, T + 90, None, 40, 2, ())
    tracker.observe(DURABLE, [going], T + 90)
    assert [g.state for g in tracker.state().generations] == ["deleting"]
    anew = Found("ckpt", None, COMMITTED, T + 95, T + 120, T + 120, 100, 5, ())
    tracker.observe(DURABLE, [anew], T + 121)
    assert tracker.state().saves_committed == 3
    marker_alone = Found("ckpt", None, COMMITTED, T + 95, T + 200, T + 200, 100, 5, ())
    tracker.observe(DURABLE, [marker_alone], T + 201)  # a pointer written again, no data
    assert tracker.state().saves_committed == 3


def test_retention_killed_half_way_is_never_a_save_or_an_abort() -> None:
    tracker = job(deadline=30)
    full = Found("step-1", 1, COMMITTED, T, T + 1, T + 1, 100, 5, ())
    tracker.observe(DURABLE, [full], T + 2)
    tracker.observe(DURABLE, [Found("step-1", 1, WRITING, T, T + 1, None, 60, 3, ())], T + 10)
    # rmdir of an emptied subdirectory: only the directory's mtime moves
    tracker.observe(DURABLE, [Found("step-1", 1, WRITING, T, T + 11, None, 60, 3, ())], T + 11)
    tracker.tick(T + 3600)
    state = tracker.state()
    assert ([g.state for g in state.generations], state.saves_aborted) == (["deleting"], 0)


def test_history_is_never_counted_not_even_as_an_abort() -> None:
    """An old truncated last.ckpt found at start-up: aborted on the gauges, not counted (a
    restart must not grow saves_aborted_total)."""
    tracker = job(deadline=30)
    (request,) = tracker.observe(DURABLE, [single(500, T)], T + 3600).requests
    tracker.apply_verdict(request, Verdict(False, "bad_zip"))
    tracker.tick(T + 3600 + 31)
    state = tracker.state()
    assert ([g.state for g in state.generations], state.saves_aborted) == ([ABORTED], 0)


def test_what_could_not_be_read_at_first_is_history_once_readable() -> None:
    tracker = job()
    tracker.observe(DURABLE, [], T, unreadable={"step-1"})
    old = Found("step-1", 1, COMMITTED, T - 86400, T - 86300, T - 86300, 100, 5, ())
    tracker.observe(DURABLE, [old], T + 10)
    state = tracker.state()
    assert (state.saves_committed, state.deadline_misses) == (0, 0)


def test_checks_that_could_not_run_are_asked_again_later_never_judged() -> None:
    """The metadata parser unavailable, EIO: no verdict. Not valid, not invalid, not an
    abort; asked again after the retry pause, then judged."""
    tracker = job(deadline=30)
    tracker.observe(DURABLE, [], T)
    tracker.observe(DURABLE, [single(500, T + 1)], T + 1)
    (request,) = tracker.observe(DURABLE, [single(500, T + 1)], T + 7).requests
    tracker.submitted(request)
    tracker.retry_validation(request, not_before=T + 37)
    assert tracker.observe(DURABLE, [single(500, T + 1)], T + 20).requests == []
    tracker.tick(T + 100)  # past the deadline: still not judged, so not aborted
    assert tracker.state().generations[0].state == WRITING
    assert tracker.validation_retry_due(T + 38)
    (request,) = tracker.observe(DURABLE, [single(500, T + 1)], T + 38).requests
    tracker.apply_verdict(request, Verdict(True))
    assert tracker.state().saves_committed == 1


def test_retention_removing_shards_before_the_marker_is_not_a_broken_checkpoint() -> None:
    """shutil.rmtree lists a DCP step and removes its entries in that order: the shards may go
    while `.metadata` still stands, and a listing in between sees a committed generation short
    of shards. Not judged (it was whole), not restorable, no failure counted; gone next."""
    tracker = job(deadline=30)
    checks = (Check("dcp", "step-1"),)
    full = Found("step-1", 1, COMMITTED, T, T + 1, T + 1, 100, 5, checks)
    (request,) = tracker.observe(DURABLE, [full], T + 2).requests
    tracker.apply_verdict(request, Verdict(True))
    going = Found("step-1", 1, COMMITTED, T, T + 1, T + 1, 60, 3, checks)
    assert tracker.observe(DURABLE, [going], T + 100).requests == []
    state = tracker.state()
    assert [g.state for g in state.generations] == ["deleting"]
    assert newest_committed(state) is None
    tracker.tick(T + 101)
    assert tracker.observe(DURABLE, [], T + 101).requests == []
    assert dict(tracker.state().validation_failures) == {}


def test_a_committed_generation_that_lost_a_file_and_stays_is_judged_again() -> None:
    """A shard deleted by hand from a checkpoint that stays: once it has been still for the
    settle period it is committed again and checked, so the loss is reported."""
    tracker = job(deadline=30)
    checks = (Check("dcp", "step-1"),)
    full = Found("step-1", 1, COMMITTED, T, T + 1, T + 1, 100, 5, checks)
    (request,) = tracker.observe(DURABLE, [full], T + 2).requests
    tracker.apply_verdict(request, Verdict(True))
    short = Found("step-1", 1, COMMITTED, T, T + 1, T + 1, 80, 4, checks)
    tracker.observe(DURABLE, [short], T + 100)
    assert tracker.next_due(T + 100) is not None  # the settle period is kept
    tracker.tick(T + 100 + Policy().settle + 1)
    assert tracker.validation_retry_due(T + 107)  # the scanner reads it again, unprompted
    (request,) = tracker.observe(DURABLE, [short], T + 107).requests
    tracker.apply_verdict(request, Verdict(False, "missing_shard"))
    state = tracker.state()
    assert dict(state.validation_failures) == {"missing_shard": 1}
    assert state.last_committed_valid is False
