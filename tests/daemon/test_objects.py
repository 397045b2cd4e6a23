"""An object-store tier in the daemon, turn by turn against moto's S3 server: placed on its
store's worker (no mount, no statvfs), polled every 30 s by default, its generations read as a
directory's are, and its requests and open uploads published per job."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from checkpoint_exporter.config import Config, parse_config
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.daemon.scanner import Scanner
from checkpoint_exporter.daemon.workers import InlineWorker
from checkpoint_exporter.model import ABORTED, COMMITTED, WRITING, JobState
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


def _state(tracker: Tracker, name: str) -> JobState:
    (state,) = [s for s in tracker.snapshot.jobs if s.name == name]
    return state


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
    lists = dict(usage["s3job"].requests)["list"]
    clocks.advance(10)
    scanner.turn()
    usage = dict(tracker.snapshot.daemon.object_stores)
    # A save in progress is read again each second; the sealed step-10 is not listed again.
    assert dict(usage["s3job"].requests)["list"] > lists


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
