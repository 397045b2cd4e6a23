"""PyTorch Lightning 2.6.6 ``ModelCheckpoint(dirpath="s3://ckpt/job")`` saving through s3fs under a
live exporter that reads the same prefix, both against moto's S3 server on 127.0.0.1.

Lightning writes each ``.ckpt`` at its final key with ``fs.pipe`` (no temporary name, no rename;
tests/writers/drivers/lightning_s3_writer.py): a multipart upload here, which S3 shows as an
object only once complete. So a kept ``.ckpt`` object is a whole save, and a save killed
mid-upload is an open multipart upload at its key and no object: a save in progress, then one
abort, never a committed file. The truth is what the store holds, read with the test's own
client (tests/writers/objects.py). Object storage has one watch mode (polled), so the test runs
once.
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
    PREFIX,
    S3Bucket,
    expect_one_abort,
    four_saves,
    s3_bucket,
    watching_store,
)

pytestmark = pytest.mark.writers


@pytest.fixture
def bucket() -> Iterator[S3Bucket]:
    with s3_bucket() as bucket:
        yield bucket


def test_lightning_saves_to_s3_through_fsspec(tmp_path: Path, bucket: S3Bucket) -> None:
    root = bucket.url(PREFIX)  # each save is one object under it: a URL names one key
    with watching_store(bucket, tmp_path, "lightning_s3", "torch", "--top-k", "3") as (
        driver,
        watched,
    ):
        driver.wait_for("ready", timeout=120)
        scenario = Scenario(driver, watched, layout="lightning")
        # The oldest deleted by ModelCheckpoint's top-3 (an improving score).
        reported, settled = four_saves(scenario, bucket, extra={INCOMPLETE: 0})
        assert all(line["written"] == [line["path"]] for line in reported)  # one file a save
        objects = bucket.objects(root)
        assert set(objects) == {bucket.key(line["path"]) for line in reported[1:]}
        for item in objects.values():
            # A completed multipart upload's ETag ends in "-<parts>": 12 MiB in 5 MiB parts.
            assert item.etag.strip('"').endswith("-3"), item

        # A save SIGKILLed with its first part uploaded: an open upload at the .ckpt's own
        # key, no object there, nothing else changed.
        hung = driver.hang()
        key = bucket.key(hung["path"])
        uploads = bucket.uploads(root)
        assert list(uploads) == [key] and uploads[key] == 5 * 2**20, uploads
        assert not bucket.exists(hung["path"])
        driver.kill()
        assert bucket.objects(root) == objects
        # In progress, however still its size stands (never settled into a committed file),
        # then one abort: its open upload and the bytes of its part exported throughout (it
        # stands until a lifecycle rule or someone aborts it).
        open_upload = {INCOMPLETE: 1, INCOMPLETE_BYTES: uploads[key]}
        aborted = expect_one_abort(
            scenario, settled, open_upload, hold_in_flight=scenario.settle + 2
        )

        # The upload aborted (as a lifecycle rule would): no longer exported, no second abort.
        assert bucket.abort_uploads(bucket.url()) == [key]
        watched.expect(replace(aborted, extra={INCOMPLETE: 0}), hold=3)
