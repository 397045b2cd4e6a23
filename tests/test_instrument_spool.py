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
from pathlib import Path

import pytest

from checkpoint_exporter import instrument
from checkpoint_exporter.spool import MAX_LINE, SpoolReader
from tests.conftest import REPO


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


WRITER = """
import sys, os
sys.path.insert(0, sys.argv[1])
import checkpoint_exporter_instrument as instrument
for step in range(int(sys.argv[3])):
    with instrument.saving(training_job="flood", step=step, spool=sys.argv[2]) as s:
        s.resume(); s.staged(); s.written()
"""


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
    events += reader.poll()
    assert len(events) == 64 * 40 * 5 == 12_800
    assert reader.invalid_total == {}
    assert len(list((spool / "flood").iterdir())) == 64
