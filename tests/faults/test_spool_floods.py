"""Tenants against the spool: any user can create a directory in it (mode 1733) and write what
they like there. A flood in one job's own directory, tens of thousands of directories of jobs
nobody configured, a directory swapped for a symlink between the listing and the read, and
timestamps at the edge of what a float holds: none may cost the daemon its memory, its
responsiveness, another job's events, a file outside the spool, or a finite number.

The adversarial run these reproduce, at a smaller but still decisive scale: 473 MB of distinct
steps held 3.6 GB for an hour; 100,000 unknown directories cost 93 % of a core; a swapped
directory had files outside the spool read and deleted; -1e308 and 1e308 made a histogram sum
+Inf for good and the landing page an empty reply.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path

import pytest

from checkpoint_exporter.core.clocks import MAX_OPEN_SAVES, Clocks
from checkpoint_exporter.sources.spool import SpoolReader
from tests.conftest import parse_samples, sample, wait_for, write_config

pytestmark = [pytest.mark.daemon]

LINE = (
    b'{"v":1,"ts":%.3f,"event":"save_start","training_job":"%s","step":%d,"rank":0,'
    b'"world_size":1,"host":"h","path":null,"bytes":null,"error":null}\n'
)
RSS_CEILING_KB = 100 * 1024  # the exporter's peak RSS during a 100 MB flood (measured: ~40 MB)


def flood(job: str, first: int, megabytes: int, ts: float | None = None) -> bytes:
    """Distinct-step save_start events (each one a save that never ends) of ``job``."""
    stamp = time.time() if ts is None else ts
    one = len(LINE % (stamp, job.encode(), first))
    return b"".join(
        LINE % (stamp, job.encode(), step)
        for step in range(first, first + megabytes * 1_000_000 // one)
    )


def save(job: str, step: int, start: float, end: float) -> bytes:
    events = ("save_start", "resume", "staged", "written", "committed")
    stamps = (start, start + 0.1, start + 0.2, end - 0.1, end)
    return b"".join(
        json.dumps(
            {"v": 1, "ts": ts, "event": event, "training_job": job, "step": step, "rank": 0,
             "world_size": 1, "host": "h", "path": None, "bytes": None, "error": None}
        ).encode() + b"\n"
        for event, ts in zip(events, stamps, strict=True)
    )  # fmt: skip


def peak_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_a_flood_in_one_jobs_spool_holds_no_memory_and_starves_no_one(
    tmp_path: Path, exporter
) -> None:
    """50 MB of history and 50 MB more while it runs, all distinct steps, over 20 files of one
    job's own spool directory: the port opens at once, the peak RSS stays under 100 MB, another
    job's save reaches /metrics while the flood is read, SIGTERM stops it. That the flood's polls
    hold no other job back is test_every_poll_is_bounded_during_a_flood's, poll by poll."""
    spool = tmp_path / "spool"
    for job in ("flood", "quiet"):
        (tmp_path / job).mkdir()
        (spool / job).mkdir(parents=True)
    for n in range(10):  # before the start
        (spool / "flood" / f"h-{n}.jsonl").write_bytes(flood("flood", n * 1_000_000, 5))
    config = write_config(
        tmp_path,
        f"spool: {spool}\n"
        f"jobs: [{{name: flood, path: {tmp_path / 'flood'}, layout: dcp}},"
        f" {{name: quiet, path: {tmp_path / 'quiet'}, layout: dcp}}]\n",
    )
    # Listening, or the fixture fails after its wait for the port (it took 141 s after a 473 MB
    # flood when the spool was read before the port opened).
    served = exporter("--config.file", str(config))
    for n in range(10, 20):  # 50 MB more, live
        (spool / "flood" / f"h-{n}.jsonl").write_bytes(flood("flood", n * 1_000_000, 5))
    now = time.time()
    (spool / "quiet" / "h-2.jsonl").write_bytes(save("quiet", 7, now - 2, now))
    written = time.monotonic()

    def quiet_save_timed() -> bool:
        text = served.metrics()
        count = "checkpoint_save_duration_seconds_count"
        return sample(text, count, training_job="quiet", phase="total") == 1

    wait_for(quiet_save_timed, timeout=20)
    latency = time.monotonic() - written
    for _ in range(20):  # let it chew on the flood a little longer
        served.metrics()
        time.sleep(0.1)
    read = sample(served.metrics(), "checkpoint_exporter_spool_events_total", event="save_start")
    assert read is not None and read > 10_000  # it does read the flood, at its own pace
    peak = peak_rss_kb(served.process.pid)
    print(f"MEASURE peak RSS {peak / 1024:.0f} MB, quiet latency {latency:.2f} s")
    assert peak < RSS_CEILING_KB, f"peak RSS {peak / 1024:.0f} MB during a 100 MB flood"
    code, _ = served.stop()  # a hung exit fails in stop(): its wait has a timeout
    assert code == 0


def test_every_poll_is_bounded_during_a_flood(tmp_path: Path) -> None:
    """The reader and the clocks in-process: a 60 MB flood costs each poll at most its budget
    (``poll_bytes`` and ``poll_lines``: no poll parses more lines than they allow; the CPU a
    poll costs is printed, and measured by ``make bench``, not asserted on a shared machine),
    the job's clocks hold at most MAX_OPEN_SAVES saves, and the other job's events come in the
    first poll."""
    for job in ("flood", "quiet"):
        (tmp_path / job).mkdir()
    reader = SpoolReader(tmp_path)
    clocks = Clocks(dropped=reader.dropped_total)
    reader.poll()
    flooding = flood("flood", 0, 60)
    (tmp_path / "flood" / "h-1.jsonl").write_bytes(flooding)
    shortest = min(len(line) + 1 for line in flooding.splitlines() if line)
    most_lines = min(reader.poll_lines, reader.poll_bytes // shortest + 1)
    now = time.time()
    (tmp_path / "quiet" / "h-2.jsonl").write_bytes(save("quiet", 1, now - 1, now))
    worst = 0.0
    first = True
    for _ in range(60):
        cpu = time.process_time()
        events = reader.poll()
        clocks.add([e for e in events if e.training_job == "flood"], time.time())
        worst = max(worst, time.process_time() - cpu)
        assert len(events) <= most_lines + 5, f"{len(events)} lines parsed in one poll"
        if first:
            assert sum(e.training_job == "quiet" for e in events) == 5
            first = False
        assert len(clocks.saves) <= MAX_OPEN_SAVES
    print(f"MEASURE worst poll {worst * 1000:.0f} ms CPU")
    assert reader.dropped_total["open_saves_cap"] > 0  # counted, in the reader's counter
    assert reader.dropped_bytes_total["backlog"] > 0  # 60 MB is more than a file may lag


def test_twenty_thousand_unknown_directories_cost_little(tmp_path: Path) -> None:
    """Directories of jobs the daemon does not know are listed rarely and never read: polls
    stay cheap, the known job's events still come at once, and what they hold is bounded."""
    spool = tmp_path / "spool"
    spool.mkdir()
    line = save("x", 1, time.time() - 1, time.time())[:200]
    for n in range(20_000):
        os.mkdir(spool / f"u{n}")
        with open(spool / f"u{n}" / "h.jsonl", "wb") as out:
            out.write(line)
    (spool / "quiet").mkdir()
    reader = SpoolReader(spool, known_jobs=lambda: {"quiet"})
    cpu = time.process_time()
    reader.poll()
    first = time.process_time() - cpu
    assert first < 2.0, f"the first poll took {first:.2f} s of CPU"
    polls, spent, started = 0, 0.0, time.monotonic()
    while time.monotonic() - started < 4:
        if polls == 10:
            now = time.time()
            (spool / "quiet" / "h.jsonl").write_bytes(save("quiet", 3, now - 1, now))
        cpu = time.process_time()
        events = reader.poll()
        spent += time.process_time() - cpu
        if polls == 10:
            assert [e.step for e in events] == [3] * 5  # at once, not behind 20,000 others
        polls += 1
        time.sleep(0.2)  # the scanner's cadence
    assert polls > 10
    mean = spent / polls
    print(f"MEASURE first poll {first * 1000:.0f} ms, mean {mean * 1000:.1f} ms over {polls}")
    # The old reader listed, stat-ed and read all 20,000 every poll: ~0.5 s of CPU each.
    assert mean < 0.02, f"{mean * 1000:.1f} ms of CPU per poll"
    assert len(reader._unknown) == 20_000 and not any(name.startswith("u") for name in reader._dirs)
    assert len(reader._due) <= 2 * 20_000 + 64


def _outside(tmp_path: Path) -> Path:
    """A directory outside the spool with an old spool-looking file that claims job "j"."""
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "h-1.jsonl"
    now = time.time()
    secret.write_bytes(save("j", 666, now - 1, now))
    os.utime(secret, (now - 90 * 86400,) * 2)
    return secret


def _spool_with_job(tmp_path: Path) -> Path:
    spool = tmp_path / "spool"
    (spool / "j").mkdir(parents=True)
    now = time.time()
    old = spool / "j" / "h-1.jsonl"  # the same name as the file outside
    old.write_bytes(save("j", 1, now - 1, now))
    os.utime(old, (now - 90 * 86400,) * 2)
    # A job still writing: its directory stays once retention has taken the old file.
    (spool / "j" / "h-2.jsonl").write_bytes(save("j", 2, now - 1, now))
    return spool


def _swap_for_symlink(spool: Path, outside: Path) -> None:
    os.rename(spool / "j", spool / "j.real")
    os.symlink(outside, spool / "j")


@pytest.mark.parametrize("when", ["after listing the root", "after listing the directory"])
def test_a_directory_swapped_for_a_symlink_after_the_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """White-box: the swap is injected exactly between the listing and the use. Nothing
    outside the spool is read, and nothing there is removed."""
    secret = _outside(tmp_path)
    spool = _spool_with_job(tmp_path)
    method = "_subdirectories" if when == "after listing the root" else "_list_some"
    original = getattr(SpoolReader, method)
    swapped = []

    def list_then_swap(self, *args):
        listing = original(self, *args)
        if not swapped:
            _swap_for_symlink(spool, secret.parent)
            swapped.append(True)
        return listing

    monkeypatch.setattr(SpoolReader, method, list_then_swap)
    reader = SpoolReader(spool, retention=86400)
    events = reader.poll() + reader.poll() + reader.poll()
    assert swapped
    assert 666 not in {e.step for e in events}
    assert secret.exists(), "a file outside the spool was removed"


def test_a_symlink_flipped_in_and_out_while_the_reader_polls(tmp_path: Path) -> None:
    """Black-box: a tenant swaps its directory for a symlink to somewhere else and back, as
    fast as it can, while the reader polls. Nothing outside the spool is ever read or removed."""
    secret = _outside(tmp_path)
    spool = _spool_with_job(tmp_path)
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            _swap_for_symlink(spool, secret.parent)
            os.unlink(spool / "j")
            os.rename(spool / "j.real", spool / "j")

    flipper = threading.Thread(target=flip)
    flipper.start()
    steps: set[int | None] = set()
    try:
        started = time.monotonic()
        while time.monotonic() - started < 4 and 666 not in steps and secret.exists():
            # A fresh reader each time: every poll is a first listing, the widest window.
            reader = SpoolReader(spool, retention=86400)
            steps |= {e.step for e in reader.poll() + reader.poll()}
    finally:
        stop.set()
        flipper.join()
    assert 666 not in steps, "read a file outside the spool through a swapped symlink"
    assert secret.exists(), "removed a file outside the spool through a swapped symlink"


def test_timestamps_at_the_edge_through_a_real_exporter(tmp_path: Path, exporter) -> None:
    """-1e308 and 1e308 are finite, their difference is not; year 9999 is not "recent".
    Refused and counted: every histogram sum stays finite, the landing page renders, and the
    drill-overdue alert is not masked."""
    spool = tmp_path / "spool"
    (spool / "j").mkdir(parents=True)
    (tmp_path / "ckpt").mkdir()
    config = write_config(
        tmp_path, f"spool: {spool}\njobs: [{{name: j, path: {tmp_path / 'ckpt'}, layout: dcp}}]\n"
    )
    served = exporter("--config.file", str(config))
    now = time.time()

    def event(name: str, step: int, ts: float) -> bytes:
        return json.dumps(
            {"v": 1, "ts": ts, "event": name, "training_job": "j", "step": step, "rank": 0,
             "world_size": 1, "host": "h", "path": None, "bytes": None, "error": None}
        ).encode() + b"\n"  # fmt: skip

    lines = [
        event("save_start", 1, -1e308), event("resume", 1, 1e308), event("committed", 1, 1e308),
        event("save_start", 2, -1e308), event("resume", 2, now), event("committed", 2, now),
        event("restore_start", 3, now - 1), event("restore_done", 3, 253402300799.0),
        event("restore_start", 4, 1e308),
    ]  # fmt: skip
    (spool / "j" / "h-1.jsonl").write_bytes(b"".join(lines) + save("j", 5, now - 3, now))
    count = "checkpoint_save_duration_seconds_count"
    # Every line arrived in one poll: every save whose ranks ended settled at the tick that
    # counted step 5, so what is not counted by now never is (a refused end never ends a save).
    wait_for(lambda: sample(served.metrics(), count, training_job="j", phase="total"), timeout=10)
    samples = parse_samples(served.metrics())
    sums = {
        k: v for k, v in samples.items() if k.startswith("checkpoint_save_duration_seconds_sum")
    }
    assert sums and all(math.isfinite(v) for v in sums.values()), sums
    assert sample(served.metrics(), count, training_job="j", phase="total") == 1  # step 5 only
    success = sample(served.metrics(), "checkpoint_restore_last_success_timestamp_seconds")
    assert success is None or success < now + 300, success  # year 9999 would mask the alert
    page = served.get("/")
    assert page.status == 200 and 'data-job="j"' in page.text and "</html>" in page.text


def _entries(directory: Path, count: int) -> None:
    """``count`` names that are no spool files (hard links: no inode each, quick to make)."""
    source = directory / "x"
    source.touch()
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for n in range(count):
            if n % 60_000 == 59_999:  # a file holds at most 65,000 links on ext4
                source = directory / f"x{n}"
                source.touch()
            os.link(source, f"e{n:07d}", dst_dir_fd=fd)
    finally:
        os.close(fd)


def test_a_crowded_directory_is_listed_on_a_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """50,000 names that are no spool files in one job's directory and 50,000 in an unknown
    job's: no poll looks at more than ``poll_entries`` entries (every poll listed them all: a
    million cost 85 % of a core and delayed another job's commit to 4.2 s), the quiet job's
    events come with the first poll after they are written, and the crowded job's own come once
    its listing has gone round, at its own pace."""
    spool = tmp_path / "spool"
    for job in ("crowded", "quiet", "unknown"):
        (spool / job).mkdir(parents=True)
    for job in ("crowded", "unknown"):
        _entries(spool / job, 50_000)
    reader = SpoolReader(spool, known_jobs=lambda: {"crowded", "quiet"})
    seen = [0]
    scandir = os.scandir

    class Counted:
        def __init__(self, path: object) -> None:
            self.inner = scandir(path)  # type: ignore[call-overload]

        def __enter__(self) -> Counted:
            return self

        def __exit__(self, *exc: object) -> None:
            self.inner.close()

        def __iter__(self) -> Counted:
            return self

        def __next__(self) -> os.DirEntry[str]:
            entry = next(self.inner)
            seen[0] += 1
            return entry

        def close(self) -> None:
            self.inner.close()

    monkeypatch.setattr(os, "scandir", Counted)
    now = time.time()
    (spool / "crowded" / "h-1.jsonl").write_bytes(save("crowded", 1, now - 1, now))
    worst, cpu, crowded_after = 0, [], None
    for poll in range(40):
        if poll == 5:
            now = time.time()
            (spool / "quiet" / "h-2.jsonl").write_bytes(save("quiet", 2, now - 1, now))
        seen[0] = 0
        started = time.process_time()
        events = reader.poll()
        cpu.append(time.process_time() - started)
        worst = max(worst, seen[0])
        quiet = [e.step for e in events if e.training_job == "quiet"]
        assert quiet == ([2] * 5 if poll == 5 else []), poll
        if crowded_after is None and any(e.training_job == "crowded" for e in events):
            crowded_after = poll
    root = 3  # the root's own listing (three subdirectories) is not on this budget
    assert worst <= reader.poll_entries + root, worst
    assert crowded_after is not None  # read, once its listing went round
    print(
        f"MEASURE entries per poll at most {worst}, CPU per poll median "
        f"{sorted(cpu)[len(cpu) // 2] * 1000:.1f} ms, max {max(cpu) * 1000:.1f} ms; the crowded "
        f"job's events after {crowded_after} polls"
    )
