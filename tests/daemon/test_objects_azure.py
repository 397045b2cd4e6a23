"""An ``az://`` tier in the daemon, turn by turn against Azurite: placed on its store's worker
(no mount, no statvfs), polled, its generations read as a directory's are, a blob of
uncommitted blocks a save in progress, and its requests and uploads published per job."""

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
from tests.helpers.azurite import Azurite, azurite
from tests.helpers.clocks import Clocks

pytestmark = pytest.mark.azurite


@pytest.fixture(scope="module")
def server() -> Iterator[Azurite]:
    with azurite() as running, mock.patch.dict(os.environ, running.env()):
        yield running


def _scanner(tmp_path: Path, text: str) -> tuple[Scanner, Tracker, Clocks]:
    config = parse_config(text, base_dir=tmp_path)
    config = Config(**{**config.__dict__, "spool": tmp_path / "spool"})
    tracker, clocks = Tracker(config), Clocks(time.time())
    scanner = Scanner(
        config, tracker, watcher_factory=None, clock=lambda: clocks.wall,
        monotonic=lambda: clocks.mono, worker_factory=InlineWorker,
    )  # fmt: skip
    return scanner, tracker, clocks


def _state(tracker: Tracker, name: str) -> JobState:
    (state,) = [s for s in tracker.snapshot.jobs if s.name == name]
    return state


def test_an_azure_tier_is_read_polled_and_counted(tmp_path: Path, server: Azurite) -> None:
    container = server.service().create_container("ckpt")
    container.upload_blob("run/step-10/__0_0.distcp", b"x" * 100)
    container.upload_blob("run/step-10/.metadata", b"m")
    container.get_blob_client("run/step-20/__0_0.distcp").stage_block("block-0000", b"y" * 64)
    scanner, tracker, clocks = _scanner(
        tmp_path,
        "jobs:\n  - {name: azjob, path: 'az://ckpt/run', layout: dcp}\n"
        "  - {name: nocontainer, path: 'az://missing/run', layout: dcp}\n",
    )
    scanner.turn()
    scanner.turn()
    state = _state(tracker, "azjob")
    generations = {g.id: g for g in state.generations}
    assert generations["step-10"].state == COMMITTED
    assert generations["step-10"].bytes == 101
    assert generations["step-20"].state == WRITING  # uncommitted blocks: a save in progress
    assert generations["step-20"].bytes == 64
    (watched,) = state.paths
    assert (watched.mode, watched.mountpoint) == ("poll", "")
    usage = dict(tracker.snapshot.daemon.object_stores)
    assert (usage["azjob"].incomplete_uploads, usage["azjob"].incomplete_upload_bytes) == (1, 64)
    requests = dict(usage["azjob"].requests)
    # The root, step-10 (step-20 has no committed blob), the uncommitted blobs, step-20's blocks.
    assert (requests["list"], requests["list_uploads"], requests["list_parts"]) == (2, 1, 1)
    # The missing container is that job's error alone, with Azure's code.
    assert ("list_uploads", "ContainerNotFound", 1) in usage["nocontainer"].errors
    assert _state(tracker, "nocontainer").paths[0].unreadable == 1
    assert not scanner._probes  # no statvfs of anything
    assert scanner._sources["azjob"].policy.poll_interval == 30.0

    # Committed: the reads made every 5 s while a save is in progress see the blob.
    container.get_blob_client("run/step-20/__0_0.distcp").commit_block_list(["block-0000"])
    container.upload_blob("run/step-20/.metadata", b"m")
    clocks.advance(5.1)
    for _ in range(2):  # a read asked for, then its answer applied
        scanner.turn()
    state = _state(tracker, "azjob")
    assert {g.id: g.state for g in state.generations}["step-20"] == COMMITTED
    assert dict(tracker.snapshot.daemon.object_stores)["azjob"].incomplete_uploads == 0
