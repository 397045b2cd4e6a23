"""An object-store tier in the daemon, turn by turn against moto's S3 server: placed on its
store's worker (no mount, no statvfs), polled every 30 s by default, its generations read as a
directory's are, and its requests and open uploads published per job."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest

from checkpoint_exporter.config import Config, parse_config
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.daemon.scanner import Scanner
from checkpoint_exporter.daemon.workers import InlineWorker
from checkpoint_exporter.model import ABORTED, COMMITTED, WRITING, JobState
from checkpoint_exporter.sources.validate_objects import validate_listing
from tests.helpers.moto_s3 import MotoServer, moto_server


@pytest.fixture(scope="module")
def server() -> Iterator[MotoServer]:
    with moto_server() as running, mock.patch.dict(os.environ, running.env()):
        yield running


class Clocks:
    def __init__(self) -> None:
        self.wall, self.mono = time.time(), 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def _scanner(tmp_path: Path, text: str) -> tuple[Scanner, Tracker, Clocks]:
    config = parse_config(text, base_dir=tmp_path)
    config = Config(**{**config.__dict__, "spool": tmp_path / "spool"})
    tracker, clocks = Tracker(config), Clocks()
    scanner = Scanner(
        config, tracker, watcher_factory=None, clock=lambda: clocks.wall,
        monotonic=lambda: clocks.mono, worker_factory=InlineWorker,
    )  # fmt: skip
    return scanner, tracker, clocks


def _validate_inline(scanner: Scanner) -> None:
    """The validator's object-store branch, run at submit: a turn-by-turn test has no validator
    thread."""
    for validator in scanner._validators.values():
        validator.submit = lambda request, root, follow, tree=None, fetch=None, v=validator: v._put(  # type: ignore[method-assign]
            request, validate_listing(request.found.checks, tree, fetch)
        )


def _state(tracker: Tracker, name: str) -> JobState:
    (state,) = [s for s in tracker.snapshot.jobs if s.name == name]
    return state


def _requests(tracker: Tracker, name: str) -> dict[str, int]:
    return dict(dict(tracker.snapshot.daemon.object_stores)[name].requests)


def test_an_s3_tier_is_read_polled_and_counted(tmp_path: Path, server: MotoServer) -> None:
    client = server.client()
    client.create_bucket(Bucket="ckpt")
    client.put_object(Bucket="ckpt", Key="run/step-10/__0_0.distcp", Body=b"x" * 100)
    client.put_object(Bucket="ckpt", Key="run/step-10/.metadata", Body=b"m")
    client.create_multipart_upload(Bucket="ckpt", Key="run/step-20/__0_0.distcp")
    scanner, tracker, clocks = _scanner(
        tmp_path,
        "jobs:\n  - {name: s3job, path: 's3://ckpt/run', layout: dcp}\n"
        "  - {name: nobucket, path: 's3://missing-bucket/run', layout: dcp}\n",
    )
    scanner.turn()
    scanner.turn()
    state = _state(tracker, "s3job")
    generations = {g.id: g for g in state.generations}
    assert generations["step-10"].state == COMMITTED
    assert generations["step-10"].bytes == 101
    assert generations["step-20"].state == WRITING  # the open upload: a save in progress
    (watched,) = state.paths
    assert (watched.mode, watched.mountpoint) == ("poll", "")
    usage = dict(tracker.snapshot.daemon.object_stores)
    assert usage["s3job"].incomplete_uploads == 1
    assert dict(usage["s3job"].requests)["list"] == 2  # the root, step-10 (step-20: no object)
    # The missing bucket is that job's error alone, with its code.
    assert ("list_uploads", "NoSuchBucket", 1) in usage["nobucket"].errors
    assert _state(tracker, "nobucket").paths[0].unreadable == 1
    assert not scanner._probes  # no statvfs of anything

    # Polled every 30 s (object URLs' default), not the filesystem's 5 s.
    assert scanner._sources["s3job"].policy.poll_interval == 30.0
    requests = dict(usage["s3job"].requests)
    # A save in progress is read again every 5 s, not each second as on a filesystem: every
    # read is billed.
    clocks.advance(1.5)
    scanner.turn()
    scanner.turn()  # a read's result is taken in on the turn after it was asked
    assert _requests(tracker, "s3job") == requests
    clocks.advance(3.6)
    scanner.turn()
    scanner.turn()
    again = _requests(tracker, "s3job")
    # The root, and step-10 once more: two listings that agree seal it.
    assert (again["list"], again["list_uploads"]) == (
        requests["list"] + 2,
        requests["list_uploads"] + 1,
    )
    clocks.advance(5.1)
    scanner.turn()
    scanner.turn()
    sealed = _requests(tracker, "s3job")
    # The root alone: the sealed step-10 is not listed again.
    assert (sealed["list"], sealed["list_uploads"]) == (
        again["list"] + 1,
        again["list_uploads"] + 1,
    )


def test_request_counts_go_on_across_a_reload_that_places_the_tier_again(
    tmp_path: Path, server: MotoServer
) -> None:
    client = server.client()
    client.create_bucket(Bucket="again")
    client.put_object(Bucket="again", Key="run/step-1/.metadata", Body=b"m")
    scanner, tracker, clocks = _scanner(
        tmp_path, "jobs:\n  - {name: j, path: 's3://again/run', layout: dcp}\n"
    )
    scanner.turn()
    scanner.turn()
    before = _requests(tracker, "j")
    assert before["list"] >= 1
    # The job's policy changes: it is removed and added again, its tier placed again with a new
    # reader. Its counters are the job's, not the reader's: they go on from where they were.
    changed = parse_config(
        "jobs:\n  - {name: j, path: 's3://again/run', layout: dcp, poll_interval: 45s}\n",
        base_dir=tmp_path,
    )
    scanner.reload(Config(**{**changed.__dict__, "spool": tmp_path / "spool"}))
    clocks.advance(1)
    for _ in range(3):
        scanner.turn()
    after = _requests(tracker, "j")
    assert after["list"] >= before["list"] + 1  # read again, counted on top
    assert after["list_uploads"] == before["list_uploads"] + 1
    # A job removed takes its counts with it.
    scanner.reload(replace(scanner.config, jobs=()))
    scanner.turn()
    assert "j" not in dict(tracker.snapshot.daemon.object_stores)
    assert scanner._request_counters == {}


def _local_generation(root: Path, name: str, size: int) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__0_0.distcp").write_bytes(b"x" * size)
    (root / name / ".metadata").write_bytes(b"m")


def test_local_staging_draining_to_s3_gives_backlog_drained_and_lost(
    tmp_path: Path, server: MotoServer
) -> None:
    """The articles' "local disks, then upload in the background": an NVMe staging directory
    and an s3:// durable tier are matched generation by generation, as two directories are."""
    client = server.client()
    client.create_bucket(Bucket="drain")
    nvme = tmp_path / "nvme"
    for name in ("step-10", "step-20"):
        _local_generation(nvme, name, 100)
    client.put_object(Bucket="drain", Key="run/step-10/__0_0.distcp", Body=b"x" * 100)
    client.put_object(Bucket="drain", Key="run/step-10/.metadata", Body=b"m")
    scanner, tracker, clocks = _scanner(
        tmp_path,
        f"jobs:\n  - {{name: two, path: 's3://drain/run', staging: '{nvme}', layout: dcp,"
        " watch: poll}\n",  # no watcher in a turn-by-turn test: the NVMe is polled too
    )

    def settle(seconds: float) -> JobState:
        clocks.advance(seconds)
        for _ in range(3):
            scanner.turn()
        return _state(tracker, "two")

    state = settle(0)
    assert (state.drain_backlog_generations, state.drain_backlog_bytes) == (1, 101)  # step-20
    # The upload finishes: drained, nothing waits.
    client.put_object(Bucket="drain", Key="run/step-20/__0_0.distcp", Body=b"x" * 100)
    client.put_object(Bucket="drain", Key="run/step-20/.metadata", Body=b"m")
    state = settle(31)
    assert (state.drain_backlog_generations, state.drained_bytes) == (0, 101)
    assert state.lost_generations == 0
    # step-30 is staged, then removed from the NVMe before it ever reached the bucket: lost.
    _local_generation(nvme, "step-30", 100)
    state = settle(31)
    assert state.drain_backlog_generations == 1
    for path in sorted((nvme / "step-30").iterdir()):
        path.unlink()
    (nvme / "step-30").rmdir()
    state = settle(31)
    assert (state.drain_backlog_generations, state.lost_generations) == (0, 1)


def test_runs_under_an_object_discover_root_are_jobs_read_with_its_connection(
    tmp_path: Path, server: MotoServer
) -> None:
    client = server.client()
    client.create_bucket(Bucket="runs")
    for run in ("llama-a", "llama-b"):
        client.put_object(Bucket="runs", Key=f"team/{run}/step-5/__0_0.distcp", Body=b"x" * 10)
        client.put_object(Bucket="runs", Key=f"team/{run}/step-5/.metadata", Body=b"m")
    scanner, tracker, clocks = _scanner(
        tmp_path,
        "discover:\n  - {root: 's3://runs/team', layout: dcp, max_jobs: 1,"
        f" storage_options: {{endpoint_url: '{server.endpoint}', allow_http: true}}}}\n",
    )
    for _ in range(4):
        scanner.turn()
    # Both runs dated by the same first listing: the first by name is watched, the other over
    # max_jobs; the job reads its prefix with the root's storage_options.
    (state,) = [s for s in tracker.snapshot.jobs]
    assert state.name == "llama-a"
    assert [p.path for p in state.paths] == ["s3://runs/team/llama-a"]
    assert {g.id: g.bytes for g in state.generations} == {"step-5": 11}
    assert dict(scanner._sources["llama-a"].tiers[0].storage_options)["allow_http"] is True
    assert scanner._discoveries[0].excess == 1
    # A run that appears later is newer: once llama-a has been idle past its interval and
    # deadline, it makes room for it.
    clocks.advance(20 * 60)
    client.put_object(Bucket="runs", Key="team/llama-c/step-1/.metadata", Body=b"m")
    for _ in range(4):
        scanner.turn()
    assert [s.name for s in tracker.snapshot.jobs] == ["llama-c"]
    # llama-a gave its slot away. Looked into (its generations noted), then resumed: a new
    # generation dates it again, and once llama-c is idle in turn, it is watched again.
    clocks.advance(30)
    for _ in range(4):
        scanner.turn()
    assert "llama-a" in scanner._discoveries[0].looked_into
    client.put_object(Bucket="runs", Key="team/llama-a/step-9/.metadata", Body=b"m")
    clocks.advance(20 * 60)
    for _ in range(4):
        scanner.turn()
    assert [s.name for s in tracker.snapshot.jobs] == ["llama-a"]


@pytest.mark.parametrize(
    ("layout", "committed", "uploading"),
    [("lightning", "epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt"),
     ("torchsave", "step-3.pt", "step-6.pt")],
)  # fmt: skip
def test_a_file_still_uploading_is_a_save_in_progress_then_aborted(
    tmp_path: Path, server: MotoServer, layout: str, committed: str, uploading: str
) -> None:
    """A file written at its final key, no temporary name: Lightning's ``.ckpt`` through
    ``fs.pipe`` (a multipart upload past 100 MiB), ``torch.save`` through the S3 connector's
    ``S3Checkpoint.writer`` (always a multipart upload). An object there is whole (S3 shows it
    only once complete); an open upload at the key is a save in progress however long its size
    stays still, never a file that settled: a killed one is one abort, the newest committed
    state the file before it."""
    client = server.client()
    bucket = f"uploading-{layout}"
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key=f"run/{committed}", Body=b"z" * 1000)
    scanner, tracker, clocks = _scanner(
        tmp_path,
        "defaults: {settle: 2s, abort_after: 30s}\n"
        f"jobs:\n  - {{name: job, path: 's3://{bucket}/run', layout: {layout}}}\n",
    )
    _validate_inline(scanner)
    scanner.turn()
    upload = client.create_multipart_upload(Bucket=bucket, Key=f"run/{uploading}")
    client.upload_part(
        Bucket=bucket, Key=f"run/{uploading}", UploadId=upload["UploadId"], PartNumber=1,
        Body=b"y" * 5 * 1024 * 1024,
    )  # fmt: skip
    for _ in range(8):  # well past settle, the upload's size still
        clocks.advance(1)
        scanner.turn()
    state = _state(tracker, "job")
    generations = {g.id: g for g in state.generations}
    assert generations[committed].state == COMMITTED
    assert generations[uploading].state == WRITING
    assert state.newest_committed is not None and state.newest_committed.step == 3
    assert (state.saves_committed, state.saves_aborted) == (1, 0)
    for _ in range(4):  # past abort_after with nothing moved
        clocks.advance(10)
        scanner.turn()
    state = _state(tracker, "job")
    assert (state.saves_committed, state.saves_aborted) == (1, 1)
    assert state.newest_committed is not None and state.newest_committed.step == 3


def _orbax_metadata(commit_ns: int | None) -> bytes:
    return json.dumps({"init_timestamp_nsecs": 1, "commit_timestamp_nsecs": commit_ns}).encode()


def test_an_aborted_orbax_step_saved_again_under_its_name_commits(
    tmp_path: Path, server: MotoServer
) -> None:
    """Orbax on an object store commits by a file under the step's final name: a killed save
    leaves ``N/_CHECKPOINT_METADATA`` (not committed) and data, aborted once nothing moves; the
    resumed job saves step N again under the same name, and no poll need fall between its
    delete and its rewrite. The placed reader lists that step again: a second commit."""
    client = server.client()
    client.create_bucket(Bucket="orbax")

    def put(key: str, body: bytes) -> None:
        client.put_object(Bucket="orbax", Key=f"run/{key}", Body=body)

    put("20/_CHECKPOINT_METADATA", _orbax_metadata(2))
    put("20/default/d/a", b"x" * 1000)
    put("20/commit_success.txt", b"ok")
    scanner, tracker, clocks = _scanner(
        tmp_path,
        "defaults: {deadline: 10s, abort_after: 10s, settle: 2s, poll_interval: 1s}\n"
        "jobs:\n  - {name: orbax, path: 's3://orbax/run', layout: orbax}\n",
    )
    scanner.turn()
    put("25/_CHECKPOINT_METADATA", _orbax_metadata(None))
    put("25/default/d/a", b"x" * 400)  # the save killed here
    for _ in range(40):  # past abort_after, then idle polls: every listing alike
        scanner.turn()
        clocks.advance(1)
    state = _state(tracker, "orbax")
    assert {g.id: g.state for g in state.generations} == {"20": COMMITTED, "25": ABORTED}
    assert (state.saves_committed, state.saves_aborted) == (0, 1)

    client.delete_object(Bucket="orbax", Key="run/25/default/d/a")
    put("25/_CHECKPOINT_METADATA", _orbax_metadata(3))
    put("25/default/d/b", b"x" * 1000)
    put("25/commit_success.txt", b"ok")
    for _ in range(5):
        scanner.turn()
        clocks.advance(1)
    state = _state(tracker, "orbax")
    generations = {g.id: g for g in state.generations}
    assert generations["25"].state == COMMITTED
    assert generations["25"].bytes == generations["20"].bytes
    assert generations["25"].step == 25
    assert (state.saves_committed, state.saves_aborted) == (1, 1)


def test_a_node_scope_process_never_lists_an_object_discover_root(
    tmp_path: Path, server: MotoServer
) -> None:
    """A bucket is shared storage: on every node of a DaemonSet, a node-scope process listing it
    every 30 s would be thousands of LISTs a minute for nothing (none of them reads its jobs);
    it learns the names from its spool, as under a shared directory root."""
    from checkpoint_exporter.config import NODE, Serving

    client = server.client()
    client.create_bucket(Bucket="nodes")
    client.put_object(Bucket="nodes", Key="team/run-1/step-1/.metadata", Body=b"m")
    config = parse_config("discover:\n  - {root: 's3://nodes/team', layout: dcp}\n",
                          base_dir=tmp_path)  # fmt: skip
    config = Config(**{**config.__dict__, "spool": tmp_path / "spool",
                       "serving": Serving(frozenset({NODE}))})  # fmt: skip
    tracker, clocks = Tracker(config), Clocks()
    scanner = Scanner(
        config, tracker, watcher_factory=None, clock=lambda: clocks.wall,
        monotonic=lambda: clocks.mono, worker_factory=InlineWorker,
    )  # fmt: skip
    for _ in range(4):
        scanner.turn()
    assert scanner._discoveries[0].store is None  # no store made, nothing listed
    assert tracker.snapshot.jobs == ()


def test_a_lifecycle_rule_expiring_every_generation_is_deletions_never_aborts(
    tmp_path: Path, server: MotoServer
) -> None:
    """A bucket's expiration rule removes objects by age, whatever the writer keeps: each
    generation gone is a deletion, and when the last one goes, none is left to restore from
    (what CheckpointNoRecoverableGeneration pages on), with no abort counted."""
    client = server.client()
    client.create_bucket(Bucket="expiring")
    for step in (10, 20):
        client.put_object(Bucket="expiring", Key=f"run/step-{step}/__0_0.distcp", Body=b"x" * 10)
        client.put_object(Bucket="expiring", Key=f"run/step-{step}/.metadata", Body=b"m")
    scanner, tracker, clocks = _scanner(
        tmp_path, "jobs:\n  - {name: life, path: 's3://expiring/run', layout: dcp}\n"
    )
    for _ in range(3):
        scanner.turn()
    state = _state(tracker, "life")
    assert sorted(g.id for g in state.generations if g.state == COMMITTED) == ["step-10", "step-20"]
    # Expired in the store's own order (a bulk delete, or key by key, markers among them).
    for key in ("run/step-10/.metadata", "run/step-10/__0_0.distcp", "run/step-20/__0_0.distcp",
                "run/step-20/.metadata"):  # fmt: skip
        client.delete_object(Bucket="expiring", Key=key)
        clocks.advance(31)
        for _ in range(3):
            scanner.turn()
    state = _state(tracker, "life")
    assert [g for g in state.generations if g.state == COMMITTED] == []
    assert state.saves_aborted == 0
    assert state.saves_committed == 0  # what was there at the start was history, not saves
