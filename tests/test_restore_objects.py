"""The restore drill on a job kept in object storage (moto's S3 server): the generation a
restart would pick, listed through the store as the daemon lists it, checked structurally by
its listed sizes; --full, which reads local files, says it did not run."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from checkpoint_exporter.config import Config, parse_config
from checkpoint_exporter.restore import EXIT_FAILED, EXIT_NOT_FULL, EXIT_OK, run_drill
from tests.helpers.drill import spool_events
from tests.helpers.moto_s3 import MotoServer, moto_server
from tests.helpers.trees import dcp_metadata_bytes

pytestmark = pytest.mark.torch  # the .metadata is a real torch pickle, made in a subprocess

SHARD = 16


@pytest.fixture(scope="module")
def server() -> Iterator[MotoServer]:
    with moto_server() as running, mock.patch.dict(os.environ, running.env()):
        yield running


def _generation(server: MotoServer, bucket: str, name: str, shards: tuple[int, ...]) -> None:
    """A DCP generation whose .metadata names two shards; ``shards`` says which are stored."""
    client = server.client()
    for index in shards:
        client.put_object(Bucket=bucket, Key=f"run/{name}/__{index}_0.distcp", Body=b"\0" * SHARD)
    client.put_object(Bucket=bucket, Key=f"run/{name}/.metadata", Body=dcp_metadata_bytes(2, SHARD))


def _config(tmp_path: Path, path: str) -> Config:
    config = parse_config(
        f"jobs:\n  - {{name: j, path: '{path}', layout: dcp}}\n", base_dir=tmp_path
    )
    (tmp_path / "spool").mkdir(exist_ok=True)
    return Config(**{**config.__dict__, "spool": tmp_path / "spool"})


def _drill(config: Config, **kw: object) -> tuple[int, str]:
    err = io.StringIO()
    status = run_drill(config, "j", kw.pop("generation", None), bool(kw.pop("full", False)),
                       err=err, out=io.StringIO())  # fmt: skip
    return status, err.getvalue()


def test_an_object_generation_is_drilled_by_its_listing(tmp_path: Path, server: MotoServer) -> None:
    server.client().create_bucket(Bucket="drill")
    _generation(server, "drill", "step-10", (0, 1))
    _generation(server, "drill", "step-20", (0,))  # its second shard never made it
    config = _config(tmp_path, "s3://drill/run")

    # The newest committed generation is the one a restart picks: it lacks a shard.
    status, said = _drill(config)
    assert status == EXIT_FAILED, said
    assert "generation=step-20" in said and "__1_0.distcp is not in the listing" in said

    status, said = _drill(config, generation="step-10")
    assert status == EXIT_OK, said
    # Its .metadata read by a ranged GET and parsed: every shard it names is listed, long enough.
    assert "structural check passed (1 checks)\n" in said
    # --full reads local files: the structural drill runs instead, and the exit says so.
    status, said = _drill(config, generation="step-10", full=True)
    assert status == EXIT_NOT_FULL, said
    assert "--full reads local files" in said

    events = spool_events(config.spool, "j")
    done = [e for e in events if e["event"] == "restore_done"]
    failed = [e for e in events if e["event"] == "restore_failed"]
    assert len(failed) == 1 and len(done) == 2
    assert all(e.get("drill") for e in events)
    assert {e["path"] for e in done} == {"s3://drill/run/step-10"}


def test_a_bucket_that_cannot_be_listed_fails_the_drill_with_its_reason(
    tmp_path: Path, server: MotoServer
) -> None:
    status, said = _drill(_config(tmp_path, "s3://no-such-bucket/run"))
    assert status == EXIT_FAILED
    assert "s3://no-such-bucket/run cannot be listed: " in said and "NoSuchBucket" in said


def test_a_run_under_an_object_discover_root_is_drilled_with_the_roots_connection(
    tmp_path: Path, server: MotoServer
) -> None:
    server.client().create_bucket(Bucket="found")
    client = server.client()
    for index in (0, 1):
        client.put_object(Bucket="found", Key=f"runs/r1/step-3/__{index}_0.distcp",
                          Body=b"\0" * SHARD)  # fmt: skip
    client.put_object(
        Bucket="found", Key="runs/r1/step-3/.metadata", Body=dcp_metadata_bytes(2, SHARD)
    )
    options = f"storage_options: {{endpoint_url: '{server.endpoint}', allow_http: true}}"
    config = parse_config(  # the run is under the second root: the first has none of that name
        f"discover:\n  - {{root: 's3://found/elsewhere', layout: dcp, {options}}}\n"
        f"  - {{root: 's3://found/runs', layout: dcp, {options}}}\n",
        base_dir=tmp_path,
    )
    (tmp_path / "spool").mkdir()
    config = Config(**{**config.__dict__, "spool": tmp_path / "spool"})
    err = io.StringIO()
    with mock.patch.dict(os.environ, {"AWS_ALLOW_HTTP": ""}):
        del os.environ["AWS_ENDPOINT_URL"]  # the root's storage_options say where, and http
        status = run_drill(config, "r1", None, False, err=err, out=io.StringIO())
    assert status == EXIT_OK, err.getvalue()
    assert "generation=step-3" in err.getvalue()
