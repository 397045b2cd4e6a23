"""PyTorch DCP saving to S3 through s3fs (``FsspecWriter("s3://ckpt/job/step-N")``) under a live
exporter that reads the same prefix, both against moto's S3 server on 127.0.0.1.

The truth is what the store holds, read with the test's own client: bytes and generations by
listing, open uploads by ListMultipartUploads. Object storage has one watch mode (polled: no
watcher sees a bucket), so the test runs once, on every change; there is no nightly variant.
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
    """What the store holds under an ``s3://ckpt/...`` URL, read with the test's own client."""

    client: Any

    @staticmethod
    def key(url: str) -> str:
        return url.removeprefix(f"s3://{BUCKET}/").rstrip("/") + "/"

    def objects(self, url: str) -> dict[str, dict]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix=self.key(url)
        )
        return {item["Key"]: item for page in pages for item in page.get("Contents", ())}

    def bytes_of(self, url: str) -> int:
        return sum(item["Size"] for item in self.objects(url).values())

    def exists(self, url: str) -> bool:
        return bool(self.objects(url))

    def uploads(self, url: str) -> dict[str, int]:
        """The open multipart uploads under ``url``: bytes of their parts, by key."""
        answer = self.client.list_multipart_uploads(Bucket=BUCKET, Prefix=self.key(url))
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


def test_dcp_saves_to_s3_through_fsspec(tmp_path: Path, store: tuple[MotoServer, Bucket]) -> None:
    server, bucket = store
    root = f"s3://{BUCKET}/{PREFIX}"
    truth = Truth(bytes_of=bucket.bytes_of, exists=bucket.exists)
    watched = Watched(root, tmp_path, watch="poll", env=server.env(), truth=truth)
    try:
        driver = Driver("dcp_s3", "torch", root, env=server.env())
        try:
            scenario = Scenario(driver, watched, layout="dcp")
            # Four saves, the oldest deleted by the driver's retention (keep 3), the figures
            # equal to the store's after each, then a quiet spell past the deadline.
            reported = scenario.run(kill=False)
            assert [bucket.exists(line["path"]) for line in reported] == [False, True, True, True]
            for line in reported[1:]:
                shard = bucket.objects(line["path"])[bucket.key(line["path"]) + "__0_0.distcp"]
                # A completed multipart upload's ETag ends in "-<parts>": each shard was one.
                assert shard["ETag"].strip('"').rpartition("-")[2] in ("2", "3"), shard
            newest = reported[-1]
            settled = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                layout="dcp", extra={INCOMPLETE: 0},
            )  # fmt: skip
            watched.expect(settled)

            # A save SIGKILLed with its shard's first part uploaded: an open upload, no object.
            hung = driver.hang()
            shard_key = bucket.key(hung["path"]) + "__0_0.distcp"
            uploads = bucket.uploads(hung["path"])
            assert list(uploads) == [shard_key] and uploads[shard_key] > 0, uploads
            assert not bucket.exists(hung["path"])
            driver.kill()
            # Before abort_after (10 s from when the exporter first saw the upload): a save in
            # progress, its open upload and the bytes of its parts exported.
            in_flight = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                in_progress=1, layout="dcp",
                extra={INCOMPLETE: 1, INCOMPLETE_BYTES: uploads[shard_key]},
            )  # fmt: skip
            watched.expect(in_flight, timeout=5)
            # Nothing moved for abort_after: exactly one abort, the upload still exported (it
            # stands until a lifecycle rule or someone aborts it), the newest generation kept.
            aborted = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                aborted=1, layout="dcp",
                extra={INCOMPLETE: 1, INCOMPLETE_BYTES: uploads[shard_key]},
            )  # fmt: skip
            watched.expect(aborted, timeout=scenario.deadline + scenario.settle + 20, hold=3)
            lines = watched.log_lines("aborted")
            assert any(f"job={JOB}" in line for line in lines), lines
            assert bucket.uploads(hung["path"]) == uploads  # the kill left it as it was

            # The upload aborted (as a lifecycle rule would): no longer exported, no second abort.
            (upload,) = bucket.client.list_multipart_uploads(Bucket=BUCKET)["Uploads"]
            bucket.client.abort_multipart_upload(
                Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"]
            )
            gone = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                aborted=1, layout="dcp", extra={INCOMPLETE: 0},
            )  # fmt: skip
            watched.expect(gone, hold=3)
        finally:
            driver.close()
    finally:
        watched.close()
