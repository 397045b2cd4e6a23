"""A ``gs://`` tier in the daemon, turn by turn against gcp-storage-emulator: read on its store's
worker, its generations parsed as a directory's are, and /metrics showing the newest committed
generation and the job's requests, a missing bucket the error of its own job alone."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from prometheus_client.exposition import generate_latest

from checkpoint_exporter.exposition.collectors import enabled_collectors
from checkpoint_exporter.exposition.renderer import Renderer
from checkpoint_exporter.model import COMMITTED, WRITING
from tests.conftest import sample
from tests.daemon.test_objects import _scanner, _state
from tests.helpers.gcs_emulator import GCSEmulator, gcs_emulator


@pytest.fixture(scope="module")
def server() -> Iterator[GCSEmulator]:
    with gcs_emulator() as running, mock.patch.dict(os.environ, running.env()):
        yield running


def test_a_gcs_tier_is_read_and_exported(tmp_path: Path, server: GCSEmulator) -> None:
    server.create_bucket("ckpt")
    for step in (10, 20):
        server.put("ckpt", f"run/step-{step}/__0_0.distcp", b"x" * 100 * step)
        server.put("ckpt", f"run/step-{step}/.metadata", b"m")
    server.put("ckpt", "run/step-30/__0_0.distcp", b"x" * 10)  # no marker yet: a save going on
    scanner, tracker, _ = _scanner(
        tmp_path,
        "jobs:\n  - {name: gcsjob, path: 'gs://ckpt/run', layout: dcp}\n"
        "  - {name: nobucket, path: 'gs://missing-bucket/run', layout: dcp}\n",
    )
    scanner.turn()
    scanner.turn()
    state = _state(tracker, "gcsjob")
    generations = {g.id: g for g in state.generations}
    assert generations["step-20"].state == COMMITTED
    assert generations["step-20"].bytes == 2001
    assert generations["step-30"].state == WRITING
    (watched,) = state.paths
    assert (watched.mode, watched.mountpoint) == ("poll", "")
    assert _state(tracker, "nobucket").paths[0].unreadable == 1

    snapshot = tracker.snapshot
    text = Renderer(lambda: snapshot, enabled_collectors({})).render(generate_latest).decode()
    assert sample(text, "checkpoint_last_committed_step", training_job="gcsjob") == 20
    assert sample(text, "checkpoint_last_committed_size_bytes", training_job="gcsjob") == 2001
    assert sample(text, "checkpoint_saves_in_progress", training_job="gcsjob") == 1
    lists = sample(text, "checkpoint_object_store_requests_total", training_job="gcsjob",
                   operation="list")  # fmt: skip
    assert lists is not None and lists >= 4  # the root and each generation, at least once
    assert sample(
        text, "checkpoint_object_store_requests_total", training_job="gcsjob",
        operation="list_uploads",
    ) in (None, 0)  # fmt: skip
    assert sample(
        text, "checkpoint_object_store_request_errors_total", training_job="nobucket",
        operation="list", code="notFound",
    ) == 1  # fmt: skip
    assert sample(text, "checkpoint_object_store_incomplete_uploads", training_job="gcsjob") == 0
