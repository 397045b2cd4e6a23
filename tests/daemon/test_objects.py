"""An object-store tier in the daemon, turn by turn against moto's S3 server: placed on its
store's worker (no mount, no statvfs), polled every 30 s by default, its generations read as a
directory's are, and its requests and open uploads published per job."""

from __future__ import annotations

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
from checkpoint_exporter.model import COMMITTED, WRITING, JobState
from checkpoint_exporter.sources.objects import check_listing
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
    """The validator's object-store branch (the listing's checks), run at submit: a turn-by-turn
    test has no validator thread."""
    for validator in scanner._validators.values():
        validator.submit = lambda request, root, follow, tree=None, v=validator: v._put(  # type: ignore[method-assign]
            request, check_listing(request.found.checks, tree)
        )


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


def test_a_lightning_ckpt_still_uploading_is_a_save_in_progress_then_aborted(
    tmp_path: Path, server: MotoServer
) -> None:
    """Lightning on S3 writes a ``.ckpt`` with ``fs.pipe``: one PUT, or a multipart upload past
    100 MiB. An object there is whole (S3 shows it only once complete); an open upload at a
    ``.ckpt`` key is a save in progress however long its size stays still, never a file that
    settled: a killed one is one abort, the newest committed state the file before it."""
    client = server.client()
    client.create_bucket(Bucket="light")
    client.put_object(Bucket="light", Key="run/epoch=0-step=3.ckpt", Body=b"z" * 1000)
    scanner, tracker, clocks = _scanner(
        tmp_path,
        "defaults: {settle: 2s, abort_after: 30s}\n"
        "jobs:\n  - {name: light, path: 's3://light/run', layout: lightning}\n",
    )
    _validate_inline(scanner)
    scanner.turn()
    key = "run/epoch=0-step=6.ckpt"
    upload = client.create_multipart_upload(Bucket="light", Key=key)
    client.upload_part(
        Bucket="light", Key=key, UploadId=upload["UploadId"], PartNumber=1,
        Body=b"y" * 5 * 1024 * 1024,
    )  # fmt: skip
    for _ in range(8):  # well past settle, the upload's size still
        clocks.advance(1)
        scanner.turn()
    state = _state(tracker, "light")
    generations = {g.id: g for g in state.generations}
    assert generations["epoch=0-step=3.ckpt"].state == COMMITTED
    assert generations["epoch=0-step=6.ckpt"].state == WRITING
    assert state.newest_committed is not None and state.newest_committed.step == 3
    assert (state.saves_committed, state.saves_aborted) == (1, 0)
    for _ in range(4):  # past abort_after with nothing moved
        clocks.advance(10)
        scanner.turn()
    state = _state(tracker, "light")
    assert (state.saves_committed, state.saves_aborted) == (1, 1)
    assert state.newest_committed is not None and state.newest_committed.step == 3
