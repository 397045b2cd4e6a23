"""PyTorch DCP saving to S3 through s3fs (``FsspecWriter("s3://ckpt/job/step-N")``) under a live
exporter that reads the same prefix, both against moto's S3 server on 127.0.0.1.

The truth is what the store holds, read with the test's own client (tests/writers/objects.py):
bytes and generations by listing, open uploads by ListMultipartUploads. Object storage has one
watch mode (polled: no watcher sees a bucket), so the test runs once, on every change; there is
no nightly variant.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.writers.harness import Scenario
from tests.writers.objects import (
    INCOMPLETE,
    INCOMPLETE_BYTES,
    S3Bucket,
    expect_one_abort,
    four_saves,
    s3_bucket,
    watching_store,
)

pytestmark = pytest.mark.writers

# Each shard (about 12.6 MiB) past s3fs's block, S3's smallest part: a multipart upload.
DRIVER_ARGS = ("--block-size", str(5 * 2**20))


@pytest.fixture
def bucket() -> Iterator[S3Bucket]:
    with s3_bucket() as bucket:
        yield bucket


def test_dcp_saves_to_s3_through_fsspec(tmp_path: Path, bucket: S3Bucket) -> None:
    with watching_store(bucket, tmp_path, "dcp_fsspec", "torch", *DRIVER_ARGS) as (driver, watched):
        scenario = Scenario(driver, watched, layout="dcp")
        reported, settled = four_saves(scenario, bucket, extra={INCOMPLETE: 0})
        for line in reported[1:]:
            shard = bucket.objects(line["path"])[bucket.key(line["path"], "__0_0.distcp")]
            # A completed multipart upload's ETag ends in "-<parts>": each shard was one.
            assert shard.etag.strip('"').rpartition("-")[2] in ("2", "3"), shard

        # A save SIGKILLed with its shard's first part uploaded: an open upload, no object.
        hung = driver.hang()
        shard_key = bucket.key(hung["path"], "__0_0.distcp")
        uploads = bucket.uploads(hung["path"])
        assert list(uploads) == [shard_key] and uploads[shard_key] > 0, uploads
        assert not bucket.exists(hung["path"])
        driver.kill()
        # In progress, then one abort: its open upload and the bytes of its parts exported
        # throughout (it stands until a lifecycle rule or someone aborts it).
        open_upload = {INCOMPLETE: 1, INCOMPLETE_BYTES: uploads[shard_key]}
        aborted = expect_one_abort(scenario, settled, open_upload)
        assert bucket.uploads(hung["path"]) == uploads  # the kill left it as it was

        # The upload aborted (as a lifecycle rule would): no longer exported, no second abort.
        assert bucket.abort_uploads(bucket.url()) == [shard_key]
        watched.expect(replace(aborted, extra={INCOMPLETE: 0}), hold=3)
