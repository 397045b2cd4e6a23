"""A DCP generation kept in object storage, checked as the daemon checks it: its .metadata read by
a bounded ranged GET and parsed by the allowlisted reader (in the daemon's memory-capped worker,
handed the bytes in a memory file), each shard it names listed and long enough."""

from __future__ import annotations

import os
from collections.abc import Iterator
from unittest import mock

import pytest

from checkpoint_exporter.model import BAD_METADATA, MISSING_SHARD, TRUNCATED_SHARD
from checkpoint_exporter.sources import dcp_metadata, layouts
from checkpoint_exporter.sources.listing import OpsBudget
from checkpoint_exporter.sources.object_store import RequestCounter
from checkpoint_exporter.sources.objects import ObjectTreeReader
from checkpoint_exporter.sources.s3 import S3Store
from checkpoint_exporter.sources.validate_objects import validate_listing
from checkpoint_exporter.storage_url import parse_object_url
from tests.helpers.moto_s3 import MotoServer, moto_server
from tests.helpers.trees import dcp_metadata_bytes

pytestmark = pytest.mark.torch  # the .metadata is a real torch pickle, made in a subprocess

SHARD = 16


@pytest.fixture(scope="module")
def server() -> Iterator[MotoServer]:
    with moto_server() as running, mock.patch.dict(os.environ, running.env()):
        running.client().create_bucket(Bucket="checks")
        yield running


@pytest.fixture(scope="module")
def parser() -> Iterator[dcp_metadata.IsolatedParser]:
    isolated = dcp_metadata.IsolatedParser()
    yield isolated
    isolated.close()


def _reader(server: MotoServer, prefix: str, shards: dict[str, int], metadata: bytes):
    client = server.client()
    for name, size in shards.items():
        client.put_object(Bucket="checks", Key=f"{prefix}/step-1/{name}", Body=b"\0" * size)
    client.put_object(Bucket="checks", Key=f"{prefix}/step-1/.metadata", Body=metadata)
    url = parse_object_url(f"s3://checks/{prefix}")
    counter = RequestCounter()
    reader = ObjectTreeReader(
        url, S3Store("checks", {}, counter), counter, OpsBudget(), layouts.ALL_CONTENT_FILES,
        marker_names=layouts.MARKER_NAMES,
    )  # fmt: skip
    tree, _ = reader.read()
    assert tree is not None
    (found,) = layouts.REGISTRY["dcp"].parse(tree, layouts.base.Options())
    return reader, tree, found


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated-worker"])
def test_metadata_is_read_and_every_shard_it_names_checked(
    server: MotoServer, parser: dcp_metadata.IsolatedParser, isolated: bool
) -> None:
    use = parser if isolated else None
    good = dcp_metadata_bytes(2, SHARD)
    shards = {"__0_0.distcp": SHARD, "__1_0.distcp": SHARD}
    prefix = f"good-{isolated}"
    reader, tree, found = _reader(server, prefix, shards, good)
    verdict = validate_listing(found.checks, tree, reader.fetch, parser=use)
    assert (verdict.valid, verdict.detail) == (True, "")
    assert dict(reader.usage().requests)["get"] == 1  # one ranged GET of .metadata

    reader, tree, found = _reader(server, f"short-{isolated}", {**shards, "__1_0.distcp": 5}, good)
    verdict = validate_listing(found.checks, tree, reader.fetch, parser=use)
    assert (verdict.valid, verdict.reason) == (False, TRUNCATED_SHARD)
    assert verdict.detail == "__1_0.distcp is 5 bytes, metadata needs 16"

    reader, tree, found = _reader(server, f"lost-{isolated}", {"__0_0.distcp": SHARD}, good)
    verdict = validate_listing(found.checks, tree, reader.fetch, parser=use)
    assert (verdict.valid, verdict.reason) == (False, MISSING_SHARD)

    reader, tree, found = _reader(server, f"bad-{isolated}", shards, b"not a pickle")
    verdict = validate_listing(found.checks, tree, reader.fetch, parser=use)
    assert (verdict.valid, verdict.reason) == (False, BAD_METADATA)


def test_a_metadata_over_the_limit_is_bad_and_a_failed_get_is_unchecked(
    server: MotoServer,
) -> None:
    good = dcp_metadata_bytes(2, SHARD)
    shards = {"__0_0.distcp": SHARD, "__1_0.distcp": SHARD}
    reader, tree, found = _reader(server, "limits", shards, good)
    verdict = validate_listing(found.checks, tree, reader.fetch, metadata_bytes=len(good) - 1)
    assert (verdict.valid, verdict.reason) == (False, BAD_METADATA)
    server.client().delete_object(Bucket="checks", Key="limits/step-1/.metadata")
    verdict = validate_listing(found.checks, tree, reader.fetch)  # deleted since it was listed
    assert (verdict.valid, verdict.unchecked) == (False, True)
    assert verdict.detail.startswith("not checked: .metadata: get: NoSuchKey")
    # Without ranged reads (no fetch): the listing's sizes, and the verdict says so.
    verdict = validate_listing(found.checks, tree)
    assert verdict.valid
    assert verdict.detail == "object storage: listed sizes only, content checks not run (dcp)"
    assert validate_listing(found.checks, None).unchecked


def test_the_validator_thread_survives_a_failing_object_check(server: MotoServer) -> None:
    """A bug of ours while checking an object generation (here: a fetch that raises what no
    store raises) is no verdict, asked again later, and the validator goes on to the next."""
    from checkpoint_exporter.core.tracker import ValidationRequest
    from checkpoint_exporter.daemon.validator import Validator
    from checkpoint_exporter.sources.validate import Limits

    shards = {"__0_0.distcp": SHARD, "__1_0.distcp": SHARD}
    reader, tree, found = _reader(server, "threads", shards, dcp_metadata_bytes(2, SHARD))

    def broken(path: str, limit: int) -> bytes:
        raise RuntimeError("a bug")

    request = ValidationRequest("j", "durable", found.id, (found.bytes, found.files, 0.0), found)
    validator = Validator(Limits())
    validator.start()
    try:
        validator.submit(request, "s3://checks/threads", tree=tree, fetch=broken)
        first = validator.verdicts.get(timeout=10)[1]
        validator.submit(request, "s3://checks/threads", tree=tree, fetch=reader.fetch)
        second = validator.verdicts.get(timeout=10)[1]
    finally:
        validator.stop()
    assert first is not None and first.unchecked
    assert "RuntimeError('a bug')" in first.detail
    assert second is not None and second.valid
