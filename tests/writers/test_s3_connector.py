"""The S3 connector for PyTorch (s3torchconnector 1.5.0) saving to S3 under a live exporter that
reads the same prefix, both against moto's S3 server on 127.0.0.1: torch DCP through the
connector's ``S3StorageWriter`` (layout dcp), and ``torch.save`` into ``S3Checkpoint.writer``
(layout torchsave).

The connector writes every object as a multipart upload at its final key, even a tiny one
(tests/writers/drivers/s3_connector_writer.py): a save killed mid-write is an open upload and no
object, a save in progress, then exactly one abort. The truth is what the store holds, read with
the test's own client. Object storage has one watch mode (polled), so each test runs once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.moto_s3 import MotoServer, moto_server
from tests.writers.harness import JOB, Driver, Expected, Scenario, Truth, Watched

pytestmark = pytest.mark.writers

BUCKET = "ckpt"
INCOMPLETE = "checkpoint_object_store_incomplete_uploads"
INCOMPLETE_BYTES = "checkpoint_object_store_incomplete_upload_bytes"
PART = 8 * 2**20  # S3ClientConfig's default part_size


@dataclass(frozen=True)
class Bucket:
    """What the store holds under an ``s3://ckpt/...`` URL (a save's prefix, or its one object),
    read with the test's own client."""

    client: Any

    @staticmethod
    def key(url: str) -> str:
        return url.removeprefix(f"s3://{BUCKET}/").rstrip("/")

    def objects(self, url: str) -> dict[str, dict]:
        key = self.key(url)
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=key)
        return {
            item["Key"]: item
            for page in pages
            for item in page.get("Contents", ())
            if item["Key"] == key or item["Key"].startswith(key + "/")
        }

    def bytes_of(self, url: str) -> int:
        return sum(item["Size"] for item in self.objects(url).values())

    def exists(self, url: str) -> bool:
        return bool(self.objects(url))

    def uploads(self) -> dict[str, int]:
        """The bucket's open multipart uploads: bytes of their parts, by key."""
        answer = self.client.list_multipart_uploads(Bucket=BUCKET)
        return {
            upload["Key"]: sum(
                part["Size"]
                for part in self.client.list_parts(
                    Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"]
                ).get("Parts", ())
            )
            for upload in answer.get("Uploads", ())
        }

    def abort_all(self) -> None:
        """What a lifecycle rule's AbortIncompleteMultipartUpload does."""
        for upload in self.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", ()):
            self.client.abort_multipart_upload(
                Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"]
            )


@pytest.fixture
def store() -> Iterator[tuple[MotoServer, Bucket]]:
    with moto_server() as server:
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        yield server, Bucket(client)


def _parts(item: dict) -> str:
    """A completed multipart upload's ETag ends in ``-<parts>``."""
    return item["ETag"].strip('"').rpartition("-")[2]


def _saves_then_one_killed(
    tmp_path: Path, store: tuple[MotoServer, Bucket], prefix: str, mode: str, upload_of: str
) -> list[dict]:
    """Four saves under keep-3 retention, then one killed with a part of ``upload_of`` (a name
    below the killed save's URL, or "" for the URL itself) in the store: in progress, exactly
    one abort, the open upload exported until it is aborted. Returns the four saves' lines."""
    server, bucket = store
    root = f"s3://{BUCKET}/{prefix}"
    truth = Truth(bytes_of=bucket.bytes_of, exists=bucket.exists)
    watched = Watched(root, tmp_path, watch="poll", env=server.env(), truth=truth)
    try:
        driver = Driver("s3_connector", "torch", root, mode, env=server.env())
        try:
            scenario = Scenario(driver, watched, layout=mode if mode == "dcp" else "torchsave")
            # Four saves, the oldest deleted by the driver's retention (keep 3), the figures
            # equal to the store's after each, then a quiet spell past the deadline.
            reported = scenario.run(kill=False)
            assert [bucket.exists(line["path"]) for line in reported] == [False, True, True, True]
            assert bucket.uploads() == {}  # every upload completed
            newest = reported[-1]
            settled = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                layout=scenario.layout, extra={INCOMPLETE: 0},
            )  # fmt: skip
            watched.expect(settled)
            before = {key: item["ETag"] for key, item in bucket.objects(root).items()}

            # A save SIGKILLed with its first part in the store: an open upload, no object.
            hung = driver.hang()
            key = bucket.key(hung["path"] + (f"/{upload_of}" if upload_of else ""))
            uploads = bucket.uploads()
            assert uploads == {key: PART}, uploads
            assert not bucket.exists(hung["path"])
            driver.kill()
            assert {key: item["ETag"] for key, item in bucket.objects(root).items()} == before
            # Before abort_after (10 s from when the exporter first saw the upload): a save in
            # progress however still its size stands, its open upload and part bytes exported.
            in_flight = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                in_progress=1, layout=scenario.layout,
                extra={INCOMPLETE: 1, INCOMPLETE_BYTES: PART},
            )  # fmt: skip
            watched.expect(in_flight, timeout=5, hold=scenario.settle + 2)
            # Nothing moved for abort_after: exactly one abort, the newest generation kept, the
            # upload still exported (it stands until a lifecycle rule or someone aborts it).
            aborted = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                aborted=1, layout=scenario.layout,
                extra={INCOMPLETE: 1, INCOMPLETE_BYTES: PART},
            )  # fmt: skip
            watched.expect(aborted, timeout=scenario.deadline + scenario.settle + 20, hold=3)
            lines = watched.log_lines("aborted")
            assert any(f"job={JOB}" in line for line in lines), lines
            assert bucket.uploads() == uploads  # the kill left it as it was

            # The upload aborted (as a lifecycle rule would): no longer exported, no second abort.
            bucket.abort_all()
            gone = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                aborted=1, layout=scenario.layout, extra={INCOMPLETE: 0},
            )  # fmt: skip
            watched.expect(gone, hold=3)
            return reported
        finally:
            driver.close()
    finally:
        watched.close()


def test_dcp_saves_to_s3_through_the_connectors_storage_writer(
    tmp_path: Path, store: tuple[MotoServer, Bucket]
) -> None:
    """``S3StorageWriter``: the shard and ``.metadata.tmp`` are uploads at their final keys,
    then ``.metadata`` is a CopyObject of ``.metadata.tmp`` and the temporary is deleted: the
    commit the dcp layout reads, as through s3fs."""
    reported = _saves_then_one_killed(tmp_path, store, "job", "dcp", upload_of="__0_0.distcp")
    _, bucket = store
    for line in reported[1:]:
        objects = bucket.objects(line["path"])
        prefix = bucket.key(line["path"]) + "/"
        assert set(objects) == {prefix + "__0_0.distcp", prefix + ".metadata"}, objects
        assert _parts(objects[prefix + "__0_0.distcp"]) == "2"  # 12.6 MiB in 8 MiB parts


def test_torch_save_to_s3_through_the_connectors_checkpoint_writer(
    tmp_path: Path, store: tuple[MotoServer, Bucket]
) -> None:
    """``torch.save(state, S3Checkpoint.writer(url))``: one ``step-N.pt`` object a save, an
    upload at its final key (no temporary name)."""
    reported = _saves_then_one_killed(tmp_path, store, "ts", "torchsave", upload_of="")
    _, bucket = store
    for line in reported[1:]:
        (item,) = bucket.objects(line["path"]).values()
        assert _parts(item) == "2", item  # 12.6 MiB in 8 MiB parts
