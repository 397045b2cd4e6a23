"""PyTorch DCP saving to Azure Blob Storage through adlfs (``FsspecWriter("az://ckpt/job/step-N")``)
under a live exporter that reads the same prefix, both against Azurite on 127.0.0.1.

The truth is what the store holds, read with the test's own client: bytes and generations by
listing the committed blobs, a save in progress by its uncommitted blocks (Get Block List).
Object storage has one watch mode (polled), so the test runs once, on every change.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from azure.storage.blob import ContainerClient

from tests.helpers.azurite import Azurite, azurite
from tests.writers.harness import JOB, Driver, Expected, Scenario, Truth, Watched

pytestmark = [pytest.mark.writers, pytest.mark.azurite]

CONTAINER = "ckpt"
PREFIX = "job"
INCOMPLETE = "checkpoint_object_store_incomplete_uploads"
INCOMPLETE_BYTES = "checkpoint_object_store_incomplete_upload_bytes"


@dataclass(frozen=True)
class Container:
    """What the store holds under an ``az://ckpt/...`` URL, read with the test's own client."""

    client: ContainerClient

    @staticmethod
    def key(url: str) -> str:
        return url.removeprefix(f"az://{CONTAINER}/").rstrip("/") + "/"

    def blobs(self, url: str) -> dict[str, int]:
        """The committed blobs under ``url``: their sizes, by name."""
        return {blob.name: blob.size for blob in self.client.list_blobs(self.key(url))}

    def bytes_of(self, url: str) -> int:
        return sum(self.blobs(url).values())

    def exists(self, url: str) -> bool:
        return bool(self.blobs(url))

    def uncommitted(self, url: str) -> dict[str, int]:
        """The bytes of the uncommitted blocks under ``url``, by blob name."""
        found = {}
        for blob in self.client.list_blobs(self.key(url), include=["uncommittedblobs"]):
            _, blocks = self.client.get_blob_client(blob.name).get_block_list("uncommitted")
            if blocks:
                found[blob.name] = sum(block.size for block in blocks)
        return found


@pytest.fixture
def store() -> Iterator[tuple[Azurite, Container]]:
    with azurite() as server:
        yield server, Container(server.service().create_container(CONTAINER))


def test_dcp_saves_to_azure_through_adlfs(tmp_path, store: tuple[Azurite, Container]) -> None:  # type: ignore[no-untyped-def]
    server, container = store
    root = f"az://{CONTAINER}/{PREFIX}"
    truth = Truth(bytes_of=container.bytes_of, exists=container.exists)
    watched = Watched(root, tmp_path, watch="poll", env=server.env(), truth=truth)
    try:
        driver = Driver("dcp_azure", "torch", root, env=server.env())
        try:
            scenario = Scenario(driver, watched, layout="dcp")
            # Four saves, the oldest deleted by the driver's retention (keep 3), the figures
            # equal to the store's after each, then a quiet spell past the deadline.
            reported = scenario.run(kill=False)
            assert [container.exists(line["path"]) for line in reported] == [
                False,
                True,
                True,
                True,
            ]
            for line in reported[1:]:
                shard = container.key(line["path"]) + "__0_0.distcp"
                blocks, _ = container.client.get_blob_client(shard).get_block_list("committed")
                assert len(blocks) >= 3, blocks  # each shard was several staged blocks
            newest = reported[-1]
            settled = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                layout="dcp", extra={INCOMPLETE: 0},
            )  # fmt: skip
            watched.expect(settled)

            # A save SIGKILLed with its shard's first blocks staged: uncommitted blocks, no blob.
            hung = driver.hang()
            shard_key = container.key(hung["path"]) + "__0_0.distcp"
            uncommitted = container.uncommitted(hung["path"])
            assert list(uncommitted) == [shard_key] and uncommitted[shard_key] > 0, uncommitted
            assert not container.exists(hung["path"])
            driver.kill()
            # Before abort_after: a save in progress, its upload and the bytes of its blocks.
            in_flight = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                in_progress=1, layout="dcp",
                extra={INCOMPLETE: 1, INCOMPLETE_BYTES: uncommitted[shard_key]},
            )  # fmt: skip
            watched.expect(in_flight, timeout=5)
            # Nothing moved for abort_after: exactly one abort, the upload still exported (the
            # blocks stand until the service drops them), the newest generation kept.
            aborted = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                aborted=1, layout="dcp",
                extra={INCOMPLETE: 1, INCOMPLETE_BYTES: uncommitted[shard_key]},
            )  # fmt: skip
            watched.expect(aborted, timeout=scenario.deadline + scenario.settle + 20, hold=3)
            lines = watched.log_lines("aborted")
            assert any(f"job={JOB}" in line for line in lines), lines
            assert container.uncommitted(hung["path"]) == uncommitted  # the kill left them

            # The blocks cleared (deleting the uncommitted blob, as the service does after a
            # week): no longer exported, no second abort.
            container.client.delete_blob(shard_key)
            gone = Expected(
                step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
                aborted=1, layout="dcp", extra={INCOMPLETE: 0},
            )  # fmt: skip
            watched.expect(gone, hold=3)
        finally:
            driver.close()
    finally:
        watched.close()
