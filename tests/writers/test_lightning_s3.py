"""PyTorch Lightning 2.6.6 ``ModelCheckpoint(dirpath="s3://ckpt/job")`` saving through s3fs under a
live exporter that reads the same prefix, both against moto's S3 server on 127.0.0.1.

Lightning writes each ``.ckpt`` at its final key with ``fs.pipe`` (no temporary name, no rename;
tests/writers/drivers/lightning_s3_writer.py): a multipart upload here, which S3 shows as an
object only once complete. So a kept ``.ckpt`` object is a whole save, and a save killed
mid-upload is an open multipart upload at its key and no object: a save in progress, then one
abort, never a committed file. The truth is what the store holds, read with the test's own
client. Object storage has one watch mode (polled), so the test runs once.
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
PREFIX = "job"
INCOMPLETE = "checkpoint_object_store_incomplete_uploads"
INCOMPLETE_BYTES = "checkpoint_object_store_incomplete_upload_bytes"


@dataclass(frozen=True)
class Bucket:
    """The ``.ckpt`` objects and open uploads under ``s3://ckpt/job``, read with the test's own
    client. Each save is one object, so a URL names one key."""

    client: Any

    @staticmethod
    def key(url: str) -> str:
        return url.removeprefix(f"s3://{BUCKET}/")

    def objects(self) -> dict[str, dict]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix=PREFIX + "/"
        )
        return {item["Key"]: item for page in pages for item in page.get("Contents", ())}

    def bytes_of(self, url: str) -> int:
        item = self.objects().get(self.key(url))
        return item["Size"] if item else 0

    def exists(self, url: str) -> bool:
        return self.key(url) in self.objects()

    def uploads(self) -> dict[str, int]:
        """The open multipart uploads under the prefix: bytes of their parts, by key."""
        answer = self.client.list_multipart_uploads(Bucket=BUCKET, Prefix=PREFIX + "/")
        return {
            upload["Key"]: sum(
                part["Size"]
                for part in self.client.list_parts(
                    Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"]
                ).get("Parts", ())
            )
            for upload in answer.get("Uploads", ())
        }


@pytest.fixture
def store() -> Iterator[tuple[MotoServer, Bucket]]:
    with moto_server() as server:
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        yield server, Bucket(client)


def test_lightning_saves_to_s3_through_fsspec(
    tmp_path: Path, store: tuple[MotoServer, Bucket]
) -> None:
    server, bucket = store
    root = f"s3://{BUCKET}/{PREFIX}"
    truth = Truth(bytes_of=bucket.bytes_of, exists=bucket.exists)
    watched = Watched(root, tmp_path, watch="poll", env=server.env(), truth=truth)
    try:
        driver = Driver("lightning_s3", "torch", root, "--top-k", "3", env=server.env())
        try:
            driver.wait_for("ready", timeout=120)
            scenario = Scenario(driver, watched, layout="lightning")
            # Four saves, the oldest deleted by ModelCheckpoint's top-3 (an improving score),
            # the figures equal to the store's after each, then a quiet spell past the deadline.
            reported = scenario.run(kill=False)
            assert [bucket.exists(line["path"]) for line in reported] == [False, True, True, True]
            assert all(line["written"] == [line["path"]] for line in reported)  # one file a save
            objects = bucket.objects()
            assert set(objects) == {bucket.key(line["path"]) for line in reported[1:]}
            for item in objects.values():
                # A completed multipart upload's ETag ends in "-<parts>": 12 MiB in 5 MiB parts.
                assert item["ETag"].strip('"').endswith("-3"), item
            newest = reported[-1]
            settled = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                layout="lightning", extra={INCOMPLETE: 0},
            )  # fmt: skip
            watched.expect(settled)

            # A save SIGKILLed with its first part uploaded: an open upload at the .ckpt's own
            # key, no object there, nothing else changed.
            hung = driver.hang()
            key = bucket.key(hung["path"])
            uploads = bucket.uploads()
            assert list(uploads) == [key] and uploads[key] == 5 * 2**20, uploads
            assert not bucket.exists(hung["path"])
            driver.kill()
            assert bucket.objects() == objects
            # Before abort_after (10 s from when the exporter first saw the upload): a save in
            # progress, however still its size stands (never settled into a committed file),
            # its open upload and the bytes of its part exported.
            in_flight = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                in_progress=1, layout="lightning",
                extra={INCOMPLETE: 1, INCOMPLETE_BYTES: uploads[key]},
            )  # fmt: skip
            watched.expect(in_flight, timeout=5, hold=scenario.settle + 2)
            # Nothing moved for abort_after: exactly one abort, the newest file kept, the upload
            # still exported (it stands until a lifecycle rule or someone aborts it).
            aborted = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                aborted=1, layout="lightning",
                extra={INCOMPLETE: 1, INCOMPLETE_BYTES: uploads[key]},
            )  # fmt: skip
            watched.expect(aborted, timeout=scenario.deadline + scenario.settle + 20, hold=3)
            lines = watched.log_lines("aborted")
            assert any(f"job={JOB}" in line for line in lines), lines

            # The upload aborted (as a lifecycle rule would): no longer exported, no second abort.
            (upload,) = bucket.client.list_multipart_uploads(Bucket=BUCKET)["Uploads"]
            bucket.client.abort_multipart_upload(
                Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"]
            )
            gone = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                aborted=1, layout="lightning", extra={INCOMPLETE: 0},
            )  # fmt: skip
            watched.expect(gone, hold=3)
        finally:
            driver.close()
    finally:
        watched.close()
