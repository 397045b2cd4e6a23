"""Orbax 0.12.8 on JAX 0.10.2 (CPU) saving to ``gs://`` (tensorstore's GCS driver for the arrays,
gcsfs for Orbax's own files: tests/writers/drivers/orbax_gcs_writer.py) under a live exporter
that reads the same prefix, both against gcp-storage-emulator on 127.0.0.1.

On ``gs://`` Orbax commits by a file, not a rename: every step is written under its final name
and ``commit_success.txt`` is the commit, so a save killed half-way leaves a step of objects
whose ``_CHECKPOINT_METADATA`` says not committed (sources/layouts/orbax.py). There are no
multipart uploads to see: GCS's resumable uploads are not listed, and tensorstore writes each
small object in one request.

The truth is what the store holds, read with the test's own requests to the server's JSON API.
Object storage has one watch mode (polled), so the test runs once, on every change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.writers.harness import Driver, Scenario
from tests.writers.objects import (
    PREFIX,
    GCSBucket,
    expect_one_abort,
    four_saves,
    gcs_bucket,
    watching_store,
)

pytestmark = pytest.mark.writers

COMMIT_FILE = "commit_success.txt"
METADATA = "_CHECKPOINT_METADATA"
# Where nothing answers: tensorstore's and google-auth's metadata-server probes fail at once
# (no wait on a DNS lookup of metadata.google.internal), so both fall back to anonymous
# requests, which the emulator accepts.
NO_METADATA_SERVER = "127.0.0.1:1"


@pytest.fixture
def bucket() -> Iterator[GCSBucket]:
    with gcs_bucket() as bucket:
        yield bucket


def writer_env(bucket: GCSBucket) -> dict[str, str]:
    """gcsfs finds the server by STORAGE_EMULATOR_HOST, tensorstore by its own variable."""
    return {
        **bucket.env(),
        "TENSORSTORE_GCS_HTTP_URL": bucket.server.endpoint,
        "GCE_METADATA_ROOT": NO_METADATA_SERVER,  # tensorstore
        "GCE_METADATA_HOST": NO_METADATA_SERVER,  # google-auth, under gcsfs
        "GCE_METADATA_IP": NO_METADATA_SERVER,
    }


def test_orbax_saves_to_gcs_through_tensorstore(tmp_path: Path, bucket: GCSBucket) -> None:
    with watching_store(bucket, tmp_path, "orbax_gcs", "jax", driver_env=writer_env(bucket)) as (
        driver,
        watched,
    ):
        scenario = Scenario(driver, watched, layout="orbax")
        # The oldest deleted by Orbax's max_to_keep=3; no false abort in the quiet spell.
        reported, settled = four_saves(scenario, bucket)
        for line in reported[1:]:
            objects = bucket.objects(line["path"])
            # Committed by its file, under its final name: no temporary name was renamed.
            commits = {bucket.key(line["path"], COMMIT_FILE),
                       bucket.key(line["path"], "default", COMMIT_FILE)}  # fmt: skip
            assert commits <= set(objects)
            metadata = bucket.content(bucket.key(line["path"], METADATA))
            assert json.loads(metadata)["commit_timestamp_nsecs"]

        # A save SIGKILLed with its item's data in the store and nothing committed.
        hung = driver.hang()
        data = bucket.key(hung["path"], "default", "ocdbt.")
        objects = bucket.objects(hung["path"])
        assert any(name.startswith(data) for name in objects), objects
        assert not any(name.endswith(COMMIT_FILE) for name in objects), objects
        metadata = bucket.content(bucket.key(hung["path"], METADATA))
        assert json.loads(metadata)["commit_timestamp_nsecs"] is None
        driver.kill()
        # In progress (the newest committed step still the one reported), then one abort.
        aborted = expect_one_abort(scenario, settled)
        assert bucket.objects(hung["path"]) == objects  # the kill left it as it was
        driver.close()

        # The job restarts from its newest step and saves the killed step again under the same
        # name (Orbax first removes what the killed save left there): a commit of its own, the
        # abort still counted once, the oldest step deleted by Orbax's retention.
        driver = Driver("orbax_gcs", "jax", bucket.url(PREFIX), env=writer_env(bucket))
        try:
            again = driver.save()
            assert (again["step"], again["path"]) == (hung["step"], hung["path"])
            assert not bucket.exists(reported[1]["path"])
            resaved = replace(aborted, step=again["step"], newest_path=again["path"], committed=5)
            watched.expect(resaved, timeout=scenario.settle + 20, hold=3)
        finally:
            driver.close()
