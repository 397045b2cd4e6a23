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
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.gcs_emulator import GCSEmulator, gcs_emulator
from tests.writers.harness import JOB, Driver, Expected, Scenario, Truth, Watched

pytestmark = pytest.mark.writers

BUCKET = "ckpt"
PREFIX = "job"
COMMIT_FILE = "commit_success.txt"
METADATA = "_CHECKPOINT_METADATA"
# Where nothing answers: tensorstore's and google-auth's metadata-server probes fail at once
# (no wait on a DNS lookup of metadata.google.internal), so both fall back to anonymous
# requests, which the emulator accepts.
NO_METADATA_SERVER = "127.0.0.1:1"


@dataclass(frozen=True)
class Bucket:
    """What the store holds under a ``gs://ckpt/...`` URL, read with the test's own requests."""

    server: GCSEmulator

    @staticmethod
    def key(url: str) -> str:
        return url.removeprefix(f"gs://{BUCKET}/").rstrip("/") + "/"

    def objects(self, url: str) -> dict[str, int]:
        """Every object under ``url`` (all pages): its size, by key."""
        found: dict[str, int] = {}
        token = ""
        while True:
            query = {"prefix": self.key(url), **({"pageToken": token} if token else {})}
            page = json.loads(
                self._get(f"/storage/v1/b/{BUCKET}/o?{urllib.parse.urlencode(query)}")
            )
            found.update({item["name"]: int(item["size"]) for item in page.get("items", ())})
            token = page.get("nextPageToken", "")
            if not token:
                return found

    def content(self, key: str) -> bytes:
        return self._get(
            f"/download/storage/v1/b/{BUCKET}/o/{urllib.parse.quote(key, safe='')}?alt=media"
        )

    def bytes_of(self, url: str) -> int:
        return sum(self.objects(url).values())

    def exists(self, url: str) -> bool:
        return bool(self.objects(url))

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"{self.server.endpoint}{path}", timeout=10) as answer:
            return bytes(answer.read())


@pytest.fixture
def store() -> Iterator[tuple[GCSEmulator, Bucket]]:
    with gcs_emulator() as server:
        server.create_bucket(BUCKET)
        yield server, Bucket(server)


def writer_env(server: GCSEmulator) -> dict[str, str]:
    """gcsfs finds the server by STORAGE_EMULATOR_HOST, tensorstore by its own variable."""
    return {
        **server.env(),
        "TENSORSTORE_GCS_HTTP_URL": server.endpoint,
        "GCE_METADATA_ROOT": NO_METADATA_SERVER,  # tensorstore
        "GCE_METADATA_HOST": NO_METADATA_SERVER,  # google-auth, under gcsfs
        "GCE_METADATA_IP": NO_METADATA_SERVER,
    }


def test_orbax_saves_to_gcs_through_tensorstore(
    tmp_path: Path, store: tuple[GCSEmulator, Bucket]
) -> None:
    server, bucket = store
    root = f"gs://{BUCKET}/{PREFIX}"
    truth = Truth(bytes_of=bucket.bytes_of, exists=bucket.exists)
    watched = Watched(root, tmp_path, watch="poll", env=server.env(), truth=truth)
    try:
        driver = Driver("orbax_gcs", "jax", root, env=writer_env(server))
        try:
            scenario = Scenario(driver, watched, layout="orbax")
            # Four saves, the oldest deleted by Orbax's max_to_keep=3, the figures equal to the
            # store's after each, then a quiet spell past the deadline: no false abort.
            reported = scenario.run(kill=False)
            assert [bucket.exists(line["path"]) for line in reported] == [False, True, True, True]
            for line in reported[1:]:
                key = bucket.key(line["path"])
                objects = bucket.objects(line["path"])
                # Committed by its file, under its final name: no temporary name was renamed.
                assert {key + COMMIT_FILE, key + "default/" + COMMIT_FILE} <= set(objects)
                assert json.loads(bucket.content(key + METADATA))["commit_timestamp_nsecs"]
            newest = reported[-1]
            settled = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                layout="orbax",
            )  # fmt: skip
            watched.expect(settled)

            # A save SIGKILLed with its item's data in the store and nothing committed.
            hung = driver.hang()
            key = bucket.key(hung["path"])
            objects = bucket.objects(hung["path"])
            assert any(name.startswith(key + "default/ocdbt.") for name in objects), objects
            assert not any(name.endswith(COMMIT_FILE) for name in objects), objects
            assert json.loads(bucket.content(key + METADATA))["commit_timestamp_nsecs"] is None
            driver.kill()
            # Before abort_after (10 s from when the exporter last saw it move): a save in
            # progress, the newest committed step still the one reported.
            in_flight = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                in_progress=1, layout="orbax",
            )  # fmt: skip
            watched.expect(in_flight, timeout=5)
            # Nothing moved for abort_after: exactly one abort, the newest generation kept.
            aborted = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                aborted=1, layout="orbax",
            )  # fmt: skip
            watched.expect(aborted, timeout=scenario.deadline + scenario.settle + 20, hold=3)
            lines = watched.log_lines("aborted")
            assert any(f"job={JOB}" in line for line in lines), lines
            assert bucket.objects(hung["path"]) == objects  # the kill left it as it was
        finally:
            driver.close()
        # The job restarts from its newest step and saves the killed step again under the same
        # name (Orbax first removes what the killed save left there): a commit of its own, the
        # abort still counted once, the oldest step deleted by Orbax's retention.
        driver = Driver("orbax_gcs", "jax", root, env=writer_env(server))
        try:
            again = driver.save()
            assert (again["step"], again["path"]) == (hung["step"], hung["path"])
            assert not bucket.exists(reported[1]["path"])
            resaved = Expected(
                step=again["step"], retained=3, newest_path=again["path"], committed=5,
                aborted=1, layout="orbax",
            )  # fmt: skip
            watched.expect(resaved, timeout=scenario.settle + 20, hold=3)
        finally:
            driver.close()
    finally:
        watched.close()
