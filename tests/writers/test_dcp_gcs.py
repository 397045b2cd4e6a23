"""PyTorch DCP saving to GCS through gcsfs (``FsspecWriter("gs://ckpt/job/step-N")``) under a live
exporter that reads the same prefix, both against gcp-storage-emulator on 127.0.0.1.

The truth is what the store holds, read with the test's own requests (the JSON API's listing).
What a save killed mid-upload leaves on GCS is only the files it finished: gcsfs sends each
shard as a resumable upload, and an upload session is in no listing (GCS has no API that lists
them). So the killed save is the generation with a finished shard and no ``.metadata``: a save
in progress, then exactly one abort; no open upload is ever exported. Polled only (no watcher
sees a bucket): the test runs once, on every change.
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
INCOMPLETE = "checkpoint_object_store_incomplete_uploads"
DEADLINE = 5.0  # short: the whole run stays under a minute


@dataclass(frozen=True)
class Bucket:
    """What the store holds under a ``gs://ckpt/...`` URL, read with the test's own requests."""

    server: GCSEmulator

    @staticmethod
    def key(url: str) -> str:
        return url.removeprefix(f"gs://{BUCKET}/").rstrip("/") + "/"

    def objects(self, url: str) -> dict[str, int]:
        """Sizes by name (the emulator answers a listing in one page)."""
        query = urllib.parse.urlencode({"prefix": self.key(url)})
        listing = f"{self.server.endpoint}/storage/v1/b/{BUCKET}/o?{query}"
        with urllib.request.urlopen(listing, timeout=10) as answer:
            items = json.load(answer).get("items") or ()
        return {item["name"]: int(item["size"]) for item in items}

    def bytes_of(self, url: str) -> int:
        return sum(self.objects(url).values())

    def exists(self, url: str) -> bool:
        return bool(self.objects(url))


@pytest.fixture
def store() -> Iterator[tuple[GCSEmulator, Bucket]]:
    with gcs_emulator() as server:
        server.create_bucket(BUCKET)
        yield server, Bucket(server)


def test_dcp_saves_to_gcs_through_fsspec(tmp_path: Path, store: tuple[GCSEmulator, Bucket]) -> None:
    server, bucket = store
    root = f"gs://{BUCKET}/{PREFIX}"
    truth = Truth(bytes_of=bucket.bytes_of, exists=bucket.exists)
    watched = Watched(
        root, tmp_path, watch="poll", deadline=f"{DEADLINE:g}s", env=server.env(), truth=truth
    )
    try:
        driver = Driver("dcp_gcs", "torch", root, env=server.env())
        try:
            scenario = Scenario(driver, watched, layout="dcp", deadline=DEADLINE)
            # Four saves, the oldest deleted by the driver's retention (keep 3), the figures
            # equal to the store's after each, then a quiet spell past the deadline.
            reported = scenario.run(kill=False)
            assert [bucket.exists(line["path"]) for line in reported] == [False, True, True, True]
            for line in reported[1:]:  # two shards, each a resumable upload, and the commit
                names = sorted(bucket.objects(line["path"]))
                prefix = bucket.key(line["path"])
                assert names == [f"{prefix}.metadata", f"{prefix}__0_0.distcp",
                                 f"{prefix}__0_1.distcp"], names  # fmt: skip
            newest = reported[-1]
            settled = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                layout="dcp", extra={INCOMPLETE: 0},
            )  # fmt: skip
            watched.expect(settled)

            # A save SIGKILLed with one shard finished and the other's upload session open
            # (whichever thread got there first): the finished shard is all the store shows.
            hung = driver.hang()
            prefix = bucket.key(hung["path"])
            left = bucket.objects(hung["path"])
            [(finished, size)] = left.items()
            assert finished in (f"{prefix}__0_0.distcp", f"{prefix}__0_1.distcp") and size > 0
            driver.kill()
            in_flight = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                in_progress=1, layout="dcp", extra={INCOMPLETE: 0},
            )  # fmt: skip
            watched.expect(in_flight, timeout=5)
            # Nothing moved for abort_after: exactly one abort, the newest generation kept, and
            # no open upload exported (GCS lists none).
            aborted = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                aborted=1, layout="dcp", extra={INCOMPLETE: 0},
            )  # fmt: skip
            watched.expect(aborted, timeout=DEADLINE + scenario.settle + 20, hold=3)
            lines = watched.log_lines("aborted")
            assert any(f"job={JOB}" in line for line in lines), lines
            assert bucket.objects(hung["path"]) == left  # the kill left it as it was

            # The orphan shard deleted (as a lifecycle rule would): a deletion, no second abort.
            server.delete(BUCKET, finished)
            watched.expect(aborted, hold=3)
        finally:
            driver.close()
    finally:
        watched.close()
