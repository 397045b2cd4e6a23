"""The daemon core under faults: a hung filesystem, an inotify overflow during a read, a spool
flood at shutdown. Each must leave every other job updating, be reported in /metrics, and never
hold up SIGTERM."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from checkpoint_exporter.config import Config, JobConfig, Policy
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.daemon.scanner import STUCK_SECONDS, Scanner
from checkpoint_exporter.sources.listing import TreeReader
from tests.conftest import Exporter, sample, wait_for, write_config
from tests.faults.hungfs import hung_mount, tmpfs
from tests.faults.test_spool_floods import flood
from tests.helpers.trees import dcp_generation

pytestmark = [pytest.mark.root, pytest.mark.daemon]


def _commit(staging: Path, job: Path, step: int) -> None:
    dcp_generation(staging / f"step-{step}")
    os.rename(staging / f"step-{step}", job / f"step-{step}")


def test_a_hung_mount_stalls_only_its_own_jobs(tmp_path: Path) -> None:
    """Two jobs, one on a filesystem that stops answering while the exporter runs (a FUSE mount
    nobody serves, stacked over it), one on the local disk: the local job's saves still show
    at their usual latency, the hung mount is reported stuck, /healthz stays ok (a hung mount is
    no wedged core), and SIGTERM still stops it."""
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    staging = tmp_path / "staging"
    with tmpfs(tmp_path / "shared") as shared:
        (shared / "job").mkdir()
        config = write_config(
            tmp_path,
            f"jobs: [{{name: stuck, path: {shared / 'job'}, layout: dcp, watch: poll,"
            f" poll_interval: 1s}}, {{name: healthy, path: {healthy}, layout: dcp}}]\n"
            f"spool: {tmp_path / 'spool'}\n",
        )
        served = Exporter("--config.file", str(config), ready=False)
        try:
            served.wait_ready()
            with hung_mount(shared):
                _hung_mount_stalls_only_its_own_jobs(served, str(shared), healthy, staging)
        finally:
            served.close()


def _hung_mount_stalls_only_its_own_jobs(
    served: Exporter, mountpoint: str, healthy: Path, staging: Path
) -> None:
    def stuck() -> float | None:
        return served.value("checkpoint_exporter_mount_stuck", mountpoint=mountpoint)

    assert stuck() == 0
    _commit(staging, healthy, 1)
    written = time.monotonic()
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="healthy"), 5)
    print(f"MEASURE healthy job's save seen after {time.monotonic() - written:.2f} s")
    hung_at = time.monotonic()
    wait_for(stuck, STUCK_SECONDS + 15)
    print(f"MEASURE stuck reported after {time.monotonic() - hung_at:.1f} s")
    # One detector: the mount's device error is its worker being stuck, its capacity the last
    # statvfs that answered.
    assert served.value("checkpoint_filesystem_device_error", mountpoint=mountpoint) == 1
    assert served.value("checkpoint_filesystem_size_bytes", mountpoint=mountpoint) == 16 << 20
    assert served.get("/healthz").status == 200
    assert served.get("/readyz").status == 200
    confirmed = "checkpoint_exporter_last_scan_timestamp_seconds"
    text = served.metrics()
    assert time.time() - sample(text, confirmed, training_job="stuck") > STUCK_SECONDS
    _commit(staging, healthy, 2)  # still updating while the other mount hangs
    written = time.monotonic()
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="healthy") == 2, 5)
    print(f"MEASURE healthy job's save seen after {time.monotonic() - written:.2f} s, mount hung")
    assert time.time() - served.value(confirmed, training_job="healthy") < STUCK_SECONDS
    code, _ = served.stop()  # a hung exit fails in stop(): its wait has a timeout
    assert code == 0


def test_a_mount_hung_before_start(tmp_path: Path) -> None:
    """A job whose filesystem is already hung when the exporter starts (or reloads): the
    configuration check gives up on it after its budget instead of blocking the start, the port
    opens, the other job updates, the mount is reported stuck; when the filesystem answers
    again the mount is no longer stuck and its job shows its checkpoint."""
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    (tmp_path / "hung" / "job").mkdir(parents=True)
    _commit(tmp_path / "staging", tmp_path / "hung" / "job", 7)  # under the mount, seen after
    config = write_config(
        tmp_path,
        f"jobs: [{{name: stuck, path: {tmp_path / 'hung' / 'job'}, layout: dcp}},"
        f" {{name: healthy, path: {healthy}, layout: dcp}}]\n"
        f"spool: {tmp_path / 'spool'}\n",
    )
    stuck = {"mountpoint": str(tmp_path / "hung")}
    with hung_mount(tmp_path / "hung"):
        served = Exporter("--config.file", str(config), ready=False)
        try:
            assert any("did not answer within" in line for line in served.log)
            _commit(tmp_path / "staging", healthy, 1)
            wait_for(
                lambda: served.value("checkpoint_last_committed_step", training_job="healthy"), 5
            )
            wait_for(
                lambda: served.value("checkpoint_exporter_mount_stuck", **stuck),
                STUCK_SECONDS + 15,
            )
            assert served.get("/healthz").status == 200
        except BaseException:
            served.close()
            raise
    try:  # the filesystem answers again (the hung mount is gone; the directory below is back)
        wait_for(lambda: served.value("checkpoint_exporter_mount_stuck", **stuck) == 0, 10)
        wait_for(lambda: served.value("checkpoint_filesystem_device_error", **stuck) == 0, 10)
        wait_for(
            lambda: served.value("checkpoint_last_committed_step", training_job="stuck") == 7, 10
        )
        code, _ = served.stop()  # a hung exit fails in stop(): its wait has a timeout
        assert code == 0
    finally:
        served.close()


def test_sigterm_during_a_spool_flood(tmp_path: Path) -> None:
    """Hundreds of MB of events arriving while the exporter runs: SIGTERM stops it (a flood
    holds up no exit)."""
    spool = tmp_path / "spool" / "flood"
    spool.mkdir(parents=True)
    (tmp_path / "flood").mkdir()
    config = write_config(
        tmp_path,
        f"spool: {tmp_path / 'spool'}\njobs: [{{name: flood, path: {tmp_path / 'flood'}}}]\n",
    )
    served = Exporter("--config.file", str(config), ready=False)
    try:
        for n in range(6):  # 300 MB, live
            (spool / f"h-{n}.jsonl").write_bytes(flood("flood", n * 10_000_000, 50))
        wait_for(
            lambda: served.value("checkpoint_exporter_spool_events_total", event="save_start"), 10
        )
        code, _ = served.stop()  # a hung exit fails in stop(): its wait has a timeout
        assert code == 0
    finally:
        served.close()


class _Watcher:
    """The Watcher interface, driven by the test: events arrive when the test says."""

    def __init__(self, changed, overflowed, lost) -> None:
        self.changed, self.overflowed, self.lost = changed, overflowed, lost

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def watch(self, key: str, path: str, **_: object) -> str | None:
        return None

    def unwatch(self, key: str) -> None: ...


def test_an_overflow_during_a_read_gets_a_full_read_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inotify queue overflows while a read is under way: events were lost after that read
    began, so it cannot stand for the reconcile; a full read must follow it."""
    job = tmp_path / "job"
    dcp_generation(job / "step-1")
    config = Config(
        spool=tmp_path / "spool",
        jobs=(JobConfig("j", job, None, Policy(watch="inotify", layout="dcp")),),
    )
    watchers: list[_Watcher] = []
    forced: list[bool] = []
    read = TreeReader.read

    def reading(self: TreeReader, hot=(), force=False, force_paths=(), touched=()):  # type: ignore[no-untyped-def]
        forced.append(force)
        if len(forced) == 2:  # the read a change event asked for: the overflow lands in it
            watchers[0].overflowed(None)
        return read(self, hot, force, force_paths, touched)

    def watcher_factory(*callbacks: object) -> _Watcher:
        watchers.append(_Watcher(*callbacks))
        return watchers[0]

    monkeypatch.setattr(TreeReader, "read", reading)
    tracker = Tracker(config)
    scanner = Scanner(config, tracker, watcher_factory=watcher_factory)
    scanner.start()
    try:
        wait_for(lambda: tracker.snapshot.jobs and tracker.snapshot.jobs[0].generations, 5)
        assert forced == [True]  # the first read is a full one
        watchers[0].changed("j", str(job / "step-1" / ".metadata"))
        wait_for(lambda: len(forced) >= 3, 5)
        assert forced[1:3] == [False, True]
    finally:
        scanner.stop()
