"""PyTorch DCP saving to GCS through gcsfs (``FsspecWriter("gs://ckpt/job/step-N")``) under a live
exporter that reads the same prefix, both against gcp-storage-emulator on 127.0.0.1.

The truth is what the store holds, read with the test's own requests (the JSON API's listing:
tests/writers/objects.py). What a save killed mid-upload leaves on GCS is only the files it
finished: gcsfs sends each shard as a resumable upload, and an upload session is in no listing
(GCS has no API that lists them). So the killed save is the generation with a finished shard
and no ``.metadata``: a save in progress, then exactly one abort; no open upload is ever
exported. Polled only (no watcher sees a bucket): the test runs once, on every change.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.writers.harness import Scenario
from tests.writers.objects import (
    INCOMPLETE,
    GCSBucket,
    expect_one_abort,
    four_saves,
    gcs_bucket,
    watching_store,
)

pytestmark = pytest.mark.writers

DEADLINE = 5.0  # short: the whole run stays under a minute
# Two IO threads, as two ranks would, each a shard of about 6.3 MiB: with gcsfs's default 5 MiB
# block, a resumable upload of two chunks. The killed save hangs one shard's upload once the
# other shard is an object. No credentials: the emulator asks none.
DRIVER_ARGS = ("--block-size", str(5 * 2**20), "--threads", "2", "--hang", "after-other",
               "--option", "token=anon")  # fmt: skip


@pytest.fixture
def bucket() -> Iterator[GCSBucket]:
    with gcs_bucket() as bucket:
        yield bucket


def test_dcp_saves_to_gcs_through_fsspec(tmp_path: Path, bucket: GCSBucket) -> None:
    with watching_store(
        bucket, tmp_path, "dcp_fsspec", "torch", *DRIVER_ARGS, deadline=f"{DEADLINE:g}s"
    ) as (driver, watched):
        scenario = Scenario(driver, watched, layout="dcp", deadline=DEADLINE)
        reported, settled = four_saves(scenario, bucket, extra={INCOMPLETE: 0})
        for line in reported[1:]:  # two shards, each a resumable upload, and the commit
            names = sorted(bucket.objects(line["path"]))
            expected = [".metadata", "__0_0.distcp", "__0_1.distcp"]
            assert names == [bucket.key(line["path"], name) for name in expected], names

        # A save SIGKILLed with one shard finished and the other's upload session open
        # (whichever thread got there first): the finished shard is all the store shows.
        hung = driver.hang()
        left = bucket.objects(hung["path"])
        [(finished, stored)] = left.items()
        shards = [bucket.key(hung["path"], name) for name in ("__0_0.distcp", "__0_1.distcp")]
        assert finished in shards and stored.size > 0
        driver.kill()
        # In progress, then one abort; no open upload exported (GCS lists none).
        aborted = expect_one_abort(scenario, settled)
        assert bucket.objects(hung["path"]) == left  # the kill left it as it was

        # The orphan shard deleted (as a lifecycle rule would): a deletion, no second abort.
        bucket.delete(finished)
        watched.expect(aborted, hold=3)
