"""The job-side writer (instrument) and the daemon-side reader (spool), with real files and
processes: one line per event, rotation, torn lines, garbage, floods and concurrent writers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest

from checkpoint_exporter import instrument
from checkpoint_exporter.sources.spool import MAX_LINE, ROOT_RELIST_MIN, Event, SpoolReader
from tests.conftest import REPO, wait_for


def lines(spool: Path, job: str) -> list[dict]:
    out = []
    for path in sorted((spool / job).glob("*.jsonl*")):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return out


def test_saving_and_restoring_write_one_line_per_event(tmp_path: Path) -> None:
    with instrument.saving(training_job="j", step=7, path="/ckpt/step-7", spool=str(tmp_path)) as s:
        s.resume()
        s.staged()
        s.written()
    with instrument.restoring(training_job="j", step=7, spool=str(tmp_path)):
        pass
    events = lines(tmp_path, "j")
    assert [e["event"] for e in events] == [
        "save_start", "resume", "staged", "written", "committed", "restore_start", "restore_done",
    ]  # fmt: skip
    first = events[0]
    assert set(first) == {
        "v", "ts", "event", "training_job", "step", "rank", "world_size", "host", "path",
        "bytes", "error",
    }  # fmt: skip
    assert (first["v"], first["step"], first["path"], first["rank"]) == (1, 7, "/ckpt/step-7", 0)
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
    (spool_file,) = (tmp_path / "j").iterdir()
    assert spool_file.name == f"{os.uname().nodename}-{os.getpid()}.jsonl"


def test_failures_are_reported_and_reraised(tmp_path: Path) -> None:
    saving = instrument.saving(training_job="j", step=1, spool=str(tmp_path))
    with pytest.raises(ValueError, match="disk on fire"), saving:
        raise ValueError("disk on fire")
    restoring = instrument.restoring(training_job="j", step=1, spool=str(tmp_path))
    with pytest.raises(OSError), restoring:
        raise OSError("missing shard")
    failed = [e for e in lines(tmp_path, "j") if e["event"].endswith("failed")]
    assert [(e["event"], e["error"]) for e in failed] == [
        ("save_failed", "ValueError: disk on fire"),
        ("restore_failed", "OSError: missing shard"),
    ]


def test_environment_rank_and_spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKPOINT_EXPORTER_SPOOL", str(tmp_path))
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    with instrument.saving(training_job="env", step=3):
        pass
    assert {(e["rank"], e["world_size"]) for e in lines(tmp_path, "env")} == {(5, 8)}


def test_no_spool_configured_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CHECKPOINT_EXPORTER_SPOOL", raising=False)
    monkeypatch.chdir(tmp_path)
    with instrument.saving(training_job="j", step=1):
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_broken_spool_warns_once_and_never_fails_training(tmp_path: Path) -> None:
    blocker = tmp_path / "spool"
    blocker.write_text("a file where the spool directory should be")
    fresh = instrument._Spool()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(5):
            fresh.emit(str(blocker), {"training_job": "j", "step": step})
    assert len(caught) == 1 and "spool unavailable" in str(caught[0].message)


def test_rotation_keeps_reading_across_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(instrument, "ROTATE_BYTES", 2000)
    spool = instrument._Spool()
    reader = SpoolReader(tmp_path)
    seen = []
    for step in range(60):
        spool.emit(str(tmp_path), _record(step))
        if step % 7 == 0:
            seen += reader.poll()  # reads interleaved with rotations
    seen += reader.poll()
    assert [e.step for e in seen] == list(range(60))
    assert list((tmp_path / "j").glob("*.jsonl.1"))  # it did rotate


def drain(reader: SpoolReader, polls: int = 100) -> list[Event]:
    """Poll until nothing is left unread (each poll reads within its budget)."""
    events = reader.poll()
    for _ in range(polls):
        if not reader.backlog_bytes:
            return events
        events += reader.poll()
    raise AssertionError(f"still {reader.backlog_bytes} bytes behind after {polls} polls")


def _record(step: int, event: str = "save_start", job: str = "j") -> dict:
    return {
        "v": 1, "ts": time.time(), "event": event, "training_job": job, "step": step,
        "rank": 0, "world_size": 1, "host": "h", "path": None, "bytes": None, "error": None,
    }  # fmt: skip


def test_torn_lines_garbage_and_unknown_events(tmp_path: Path) -> None:
    job = tmp_path / "j"
    job.mkdir()
    spool_file = job / "h-1.jsonl"
    reader = SpoolReader(tmp_path)
    good = json.dumps(_record(1)).encode()
    spool_file.write_bytes(good + b"\n" + good[:20])  # the last line is still being written
    assert [e.step for e in reader.poll()] == [1]
    with open(spool_file, "ab") as out:
        out.write(good[20:] + b"\n")
        out.write(b"\x00\xff garbage\n")
        out.write(b"[1, 2, 3]\n")
        out.write(json.dumps(_record(2, event="exploded")).encode() + b"\n")
        out.write(json.dumps({**_record(3), "rank": -1}).encode() + b"\n")
        out.write(json.dumps({**_record(4), "training_job": "someone-else"}).encode() + b"\n")
        out.write(b"x" * (MAX_LINE + 10) + b"\n")
        out.write(json.dumps(_record(5, event="committed")).encode() + b"\n")
    events = reader.poll()
    assert [(e.step, e.event) for e in events] == [(1, "save_start"), (5, "committed")]
    assert dict(reader.invalid_total) == {
        "not_json": 1, "schema": 3, "unknown_event": 1, "too_long": 1,
    }  # fmt: skip
    assert dict(reader.events_total) == {"save_start": 2, "committed": 1}


def test_history_then_live_and_a_missing_directory(tmp_path: Path) -> None:
    spool = tmp_path / "not-yet"
    reader = SpoolReader(spool)
    assert reader.poll() == []  # the directory does not exist yet
    writer = instrument._Spool()
    writer.emit(str(spool), _record(1))
    other = SpoolReader(spool)
    assert [e.history for e in other.poll()] == [True]  # there before the reader started
    assert [e.history for e in reader.poll()] == [False]


def test_old_spool_files_are_removed_once_read(tmp_path: Path) -> None:
    job = tmp_path / "j"
    job.mkdir()
    old, fresh = job / "dead-1.jsonl", job / "live-2.jsonl"
    for path in (old, fresh):
        path.write_text(json.dumps(_record(1)) + "\n")
    os.utime(old, (time.time() - 8 * 86400,) * 2)
    reader = SpoolReader(tmp_path, retention=7 * 86400)
    assert len(reader.poll()) == 2  # read first ...
    reader.poll()
    assert not old.exists() and fresh.exists()  # ... then removed


def test_a_job_idle_for_the_retention_leaves_the_spool_and_comes_back_when_it_writes(
    tmp_path: Path,
) -> None:
    """A node-scope process knows the jobs on a shared root by their spool directories: a job
    that has written nothing here for the retention goes with its last file, whether followed or
    unknown, instead of being exported by this node forever; a job writing again recreates it."""
    known = {"followed"}
    reader = SpoolReader(tmp_path, retention=3600, known_jobs=lambda: known)
    stale = time.time() - 7200
    for job in ("followed", "unknown", "busy"):
        (tmp_path / job).mkdir()
        (tmp_path / job / "h.jsonl").write_text(json.dumps(_record(1)) + "\n")
    for job in ("followed", "unknown"):
        os.utime(tmp_path / job / "h.jsonl", (stale, stale))
    reader.poll()  # read first ...
    reader.poll()  # ... then removed, and the directories they leave empty
    reader.poll()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["busy"]
    assert reader.job_directories == frozenset({"busy"})

    with instrument.saving(training_job="followed", step=2, spool=str(tmp_path)):
        pass
    assert [e.step for e in reader.poll() if e.training_job == "followed"] == [2, 2]


def _directory_opens(reader: SpoolReader, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names one poll opens below the spool root (``dir_fd`` opens)."""
    opened: list[str] = []
    real = os.open

    def counting(path, flags, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        if dir_fd is not None:
            opened.append(os.fsdecode(path))
        return real(path, flags, mode, dir_fd=dir_fd)

    with monkeypatch.context() as patch:
        patch.setattr(os, "open", counting)
        reader.poll()
    return opened


def test_a_known_job_without_a_directory_costs_no_open_once_the_root_is_still(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every deployment has the spool directory; most jobs never write to it. Opening each
    known job's name at every poll made 1,000 idle jobs cost 3 to 6 times 10 idle jobs."""
    known = {f"job{i}" for i in range(1000)}
    (tmp_path / "job7").mkdir()
    (tmp_path / "job7" / "h.jsonl").write_text(json.dumps(_record(1, job="job7")) + "\n")
    settled = time.time() - 60
    os.utime(tmp_path, (settled, settled))
    reader = SpoolReader(tmp_path, known_jobs=lambda: known)
    reader.poll()
    assert _directory_opens(reader, monkeypatch) == ["job7"]


def test_a_directory_made_in_the_tick_of_the_listing_is_still_opened_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root whose mtime was fresh when listed may change again within the same timestamp
    tick (1 s on NFS) without its mtime moving: its listing is not trusted to be complete."""
    known = {"early", "late"}
    (tmp_path / "early").mkdir()
    reader = SpoolReader(tmp_path, known_jobs=lambda: known)
    reader.poll()
    listed = tmp_path.stat().st_mtime_ns
    (tmp_path / "late").mkdir()
    os.utime(tmp_path, ns=(listed, listed))  # the same tick: the mtime did not move
    assert "late" in _directory_opens(reader, monkeypatch)


def test_a_job_whose_only_directory_names_its_uid_is_followed_while_the_root_is_still(
    tmp_path: Path,
) -> None:
    """``<job>@<uid>`` is where a job's ranks of another user write (instrument's fallback):
    skipping the known jobs without a directory of their own name must not skip it."""
    directory = tmp_path / f"j@{os.geteuid()}"
    directory.mkdir()
    (directory / "h.jsonl").write_text(json.dumps(_record(1)) + "\n")
    settled = time.time() - 60
    os.utime(tmp_path, (settled, settled))
    reader = SpoolReader(tmp_path, known_jobs=lambda: {"j": None})
    assert [e.step for e in reader.poll()] == [1]
    with (directory / "h.jsonl").open("a") as spool:
        spool.write(json.dumps(_record(2)) + "\n")
    assert [e.step for e in reader.poll()] == [2]


WRITER = """
import sys, os
sys.path.insert(0, sys.argv[1])
import checkpoint_exporter_instrument as instrument
for step in range(int(sys.argv[3])):
    with instrument.saving(training_job="flood", step=step, spool=sys.argv[2]) as s:
        s.resume(); s.staged(); s.written()
"""


@pytest.mark.slow
def test_sixty_four_writers_and_ten_thousand_events(tmp_path: Path) -> None:
    """The vendored single file, with the standard library only (python -I -S), 64 processes."""
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    shutil.copy(
        REPO / "exporter" / "checkpoint_exporter" / "instrument.py",
        vendor / "checkpoint_exporter_instrument.py",
    )
    spool = tmp_path / "spool"
    reader = SpoolReader(spool)
    writers = [
        subprocess.Popen([sys.executable, "-I", "-S", "-c", WRITER, str(vendor), str(spool), "40"])
        for _ in range(64)
    ]
    events = []
    while any(w.poll() is None for w in writers):
        events += reader.poll()  # reading while 64 processes append
        time.sleep(0.01)
    assert all(w.returncode == 0 for w in writers)
    events += drain(reader)  # a poll reads at most POLL_LINES: the rest in the next ones
    assert len(events) == 64 * 40 * 5 == 12_800
    assert reader.invalid_total == {}
    assert len(list((spool / "flood").iterdir())) == 64


# --- budgets: what one poll reads, what one job can make the reader hold ----------------------


def _lines_of(job: str, steps: range, ts: float | None = None) -> bytes:
    now = time.time() if ts is None else ts
    return b"".join(
        json.dumps({**_record(step, job=job), "ts": now}).encode() + b"\n" for step in steps
    )


def test_an_over_long_line_is_counted_once(tmp_path: Path) -> None:
    """100 MB without a newline used to count as one too_long per 4 MiB read."""
    (tmp_path / "j").mkdir()
    spool_file = tmp_path / "j" / "h-1.jsonl"
    spool_file.write_bytes(b"")
    reader = SpoolReader(tmp_path, poll_bytes=256 * 1024)
    reader.poll()
    with open(spool_file, "ab") as out:
        for _ in range(20):  # 5 MiB in 256 KiB pieces, polled in between
            out.write(b"x" * 256 * 1024)
            out.flush()
            assert reader.poll() == []
        out.write(b"x\n" + _lines_of("j", range(1, 2)))
    assert [e.step for e in drain(reader)] == [1]
    assert reader.invalid_total == {"too_long": 1}


def test_a_poll_reads_within_its_budget_and_a_quiet_job_first(tmp_path: Path) -> None:
    for job in ("flood", "quiet"):
        (tmp_path / job).mkdir()
    reader = SpoolReader(tmp_path, poll_bytes=128 * 1024, poll_lines=100_000)
    reader.poll()
    flood = _lines_of("flood", range(20_000))  # ~4 MB
    (tmp_path / "flood" / "h-1.jsonl").write_bytes(flood)
    (tmp_path / "quiet" / "h-2.jsonl").write_bytes(_lines_of("quiet", range(7, 8)))
    first = reader.poll()
    assert "quiet" in {e.training_job for e in first}  # not behind the flood
    line = len(flood) / 20_000
    assert len(first) * line <= 128 * 1024 + 64 * 1024 + line  # the budget, plus one line
    rest = drain(reader, polls=200)
    assert sorted(e.step for e in first + rest if e.training_job == "flood") == list(range(20_000))


def test_a_poll_parses_at_most_its_lines(tmp_path: Path) -> None:
    (tmp_path / "j").mkdir()
    reader = SpoolReader(tmp_path, poll_lines=1000)
    reader.poll()
    (tmp_path / "j" / "h-1.jsonl").write_bytes(b"{}\n" * 50_000)  # cheap bytes, costly lines
    reader.poll()
    assert reader.invalid_total == {"schema": 1000}
    drain(reader)
    assert reader.invalid_total == {"schema": 50_000}


def test_the_polls_are_shared_fairly_between_floods(tmp_path: Path) -> None:
    clock = [0.0]
    reader = SpoolReader(
        tmp_path, poll_bytes=256 * 1024, poll_lines=100_000, monotonic=lambda: clock[0]
    )
    reader.poll()
    for job in ("a", "b", "c"):
        (tmp_path / job).mkdir()
        (tmp_path / job / "h.jsonl").write_bytes(_lines_of(job, range(10_000)))
    clock[0] = ROOT_RELIST_MIN  # new directories are seen at the next listing of the root
    got = Counter(e.training_job for _ in range(6) for e in reader.poll())
    assert set(got) == {"a", "b", "c"} and max(got.values()) < 1.3 * min(got.values()), got


def test_a_file_far_behind_skips_ahead_and_counts_it(tmp_path: Path) -> None:
    (tmp_path / "j").mkdir()
    reader = SpoolReader(tmp_path, max_backlog=100_000)
    reader.poll()
    data = _lines_of("j", range(10_000))
    (tmp_path / "j" / "h.jsonl").write_bytes(data)
    events = drain(reader)
    assert reader.dropped_bytes_total["backlog"] == len(data) - 100_000
    line = len(data) / 10_000
    assert events[-1].step == 9_999 and len(events) >= 100_000 / line - 2
    assert reader.invalid_total == {}  # resumed at a line start


def test_history_is_read_from_its_tail(tmp_path: Path) -> None:
    (tmp_path / "j").mkdir()
    data = _lines_of("j", range(5_000))
    (tmp_path / "j" / "h.jsonl").write_bytes(data)
    reader = SpoolReader(tmp_path, history_bytes=20_000)
    events = drain(reader)
    assert events[-1].step == 4_999 and all(e.history for e in events)
    assert 20_000 / 250 < len(events) <= 20_000 / 150 and reader.invalid_total == {}
    assert reader.dropped_bytes_total == {}  # old history is not a loss


def test_timestamps_far_ahead_or_behind_are_refused(tmp_path: Path) -> None:
    (tmp_path / "j").mkdir()
    now = 1_800_000_000.0
    stamps = [now, now + 299, now + 301, 253402300799.0, 1e308, -1e308, now - 400 * 86400]
    lines = b"".join(
        json.dumps({**_record(step), "ts": ts}).encode() + b"\n" for step, ts in enumerate(stamps)
    )
    (tmp_path / "j" / "h.jsonl").write_bytes(lines)
    events = SpoolReader(tmp_path)
    assert [e.step for e in events.poll(now)] == [0, 1]
    assert events.dropped_total == {"future": 3, "past": 2}


def test_unknown_jobs_are_listed_rarely_never_read_and_forgotten(tmp_path: Path) -> None:
    clock = [0.0]
    known = {"mine"}
    reader = SpoolReader(
        tmp_path, retention=3600, known_jobs=lambda: known, monotonic=lambda: clock[0]
    )
    for job in ("mine", "other"):
        (tmp_path / job).mkdir()
        (tmp_path / job / "h.jsonl").write_bytes(_lines_of(job, range(3)))
    assert {e.training_job for e in reader.poll()} == {"mine"}
    assert reader.dropped_bytes_total == {}  # already there: history, not a loss
    grown = _lines_of("other", range(3, 5))
    with open(tmp_path / "other" / "h.jsonl", "ab") as out:
        out.write(grown)
    old = tmp_path / "other" / "old.jsonl"
    old.write_bytes(b"x" * 100)
    os.utime(old, (time.time() - 7200,) * 2)
    clock[0] = 30.0
    assert reader.poll() == [] and reader.dropped_bytes_total == {}  # not due yet
    clock[0] = 61.0
    assert reader.poll() == []
    assert reader.dropped_bytes_total == {"unknown_job": len(grown)}
    assert not old.exists()  # cleaned up like any spool file
    known.add("other")  # discovered: its spool is history, read from now on
    events = reader.poll()
    assert sorted(e.step for e in events if e.training_job == "other") == [0, 1, 2, 3, 4]
    assert all(e.history for e in events)
    known.discard("mine")
    shutil.rmtree(tmp_path / "other")
    (tmp_path / "third").mkdir()
    clock[0] = 200.0
    reader.poll()
    assert set(reader._dirs) == set() and set(reader._unknown) == {"mine", "third"}
    assert reader.poll_seconds_total > 0  # the spool's cost, for the exporter's own metrics


# --- liveness: heartbeats, finished, drills ([pager]) ----------------------------------------


def test_start_heartbeats_until_finished(tmp_path: Path) -> None:
    """start() says the job runs at once and every interval after; finished() says it ended
    and stops the heartbeats of this process."""
    instrument.start(training_job="alive", spool=str(tmp_path), interval=0.05)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if sum(e["event"] == "heartbeat" for e in lines(tmp_path, "alive")) >= 3:
            break
        time.sleep(0.02)
    instrument.finished(training_job="alive", spool=str(tmp_path))
    events = lines(tmp_path, "alive")
    assert [e["event"] for e in events].count("heartbeat") >= 3
    assert events[-1]["event"] == "finished" or events[-2]["event"] == "finished"
    # Another job on the same heartbeat thread: once it has beaten twice more, the thread has
    # been due for "alive" several times over, and would have written for it by then.
    instrument.start(training_job="witness", spool=str(tmp_path), interval=0.05)
    try:
        wait_for(lambda: [e["event"] for e in lines(tmp_path, "witness")].count("heartbeat") >= 3)
    finally:
        instrument.finished(training_job="witness", spool=str(tmp_path))
    after = lines(tmp_path, "alive")
    finished_at = next(i for i, e in enumerate(after) if e["event"] == "finished")
    assert all(e["event"] != "heartbeat" for e in after[finished_at + 1 :])


def test_a_save_starts_heartbeats_at_the_configured_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHECKPOINT_EXPORTER_HEARTBEAT_SECONDS", "0.05")
    with instrument.saving(training_job="beats", step=1, spool=str(tmp_path)):
        pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
        e["event"] == "heartbeat" for e in lines(tmp_path, "beats")
    ):
        time.sleep(0.02)
    instrument.finished(training_job="beats", spool=str(tmp_path))
    events = [e["event"] for e in lines(tmp_path, "beats")]
    assert events[:2] == ["save_start", "committed"] and "heartbeat" in events


def test_drill_restores_say_so_and_the_reader_keeps_it(tmp_path: Path) -> None:
    with instrument.restoring(training_job="d", step=3, spool=str(tmp_path), drill=True):
        pass
    with instrument.restoring(training_job="d", step=3, spool=str(tmp_path)):
        pass
    assert [e.get("drill") for e in lines(tmp_path, "d")] == [True, True, None, None]
    reader = SpoolReader(tmp_path)
    reader.poll(time.time())  # the first poll: what is there is history
    with instrument.restoring(training_job="d", step=4, spool=str(tmp_path), drill=True):
        pass
    events = reader.poll(time.time())
    assert [(e.event, e.drill) for e in events] == [("restore_start", True), ("restore_done", True)]


@pytest.mark.parametrize("bad", [2**53 + 1, 10**400, -1])
def test_a_step_no_float_holds_exactly_is_a_schema_error(tmp_path: Path, bad: int) -> None:
    clock = [1000.0]
    reader = SpoolReader(tmp_path, monotonic=lambda: clock[0])
    reader.poll(time.time())
    (tmp_path / "j").mkdir()
    line = {"v": 1, "ts": time.time(), "event": "save_start", "training_job": "j", "step": bad}
    (tmp_path / "j" / "h-1.jsonl").write_text(json.dumps(line) + "\n")
    clock[0] += ROOT_RELIST_MIN  # the root is listed again: its mtime moved
    assert reader.poll(time.time()) == []
    assert reader.invalid_total["schema"] == 1
