"""PyTorch DCP saving to Azure Blob Storage through adlfs (``FsspecWriter("az://ckpt/job/step-N")``)
under a live exporter that reads the same prefix, both against Azurite on 127.0.0.1.

The truth is what the store holds, read with the test's own client (tests/writers/objects.py):
bytes and generations by listing the committed blobs, a save in progress by its uncommitted
blocks (Get Block List). Object storage has one watch mode (polled), so the test runs once, on
every change.
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
    AzureContainer,
    azure_container,
    expect_one_abort,
    four_saves,
    watching_store,
)

pytestmark = [pytest.mark.writers, pytest.mark.azurite]

# The shard (about 12.6 MiB) past a 4 MiB block: four staged blocks.
DRIVER_ARGS = ("--block-size", str(4 * 2**20))


@pytest.fixture
def container() -> Iterator[AzureContainer]:
    with azure_container() as container:
        yield container


def test_dcp_saves_to_azure_through_adlfs(tmp_path: Path, container: AzureContainer) -> None:
    with watching_store(container, tmp_path, "dcp_fsspec", "torch", *DRIVER_ARGS) as (
        driver,
        watched,
    ):
        scenario = Scenario(driver, watched, layout="dcp")
        reported, settled = four_saves(scenario, container, extra={INCOMPLETE: 0})
        for line in reported[1:]:
            blocks = container.committed_blocks(container.key(line["path"], "__0_0.distcp"))
            assert len(blocks) >= 3, blocks  # each shard was several staged blocks

        # A save SIGKILLed with its shard's first blocks staged: uncommitted blocks, no blob.
        hung = driver.hang()
        shard_key = container.key(hung["path"], "__0_0.distcp")
        uncommitted = container.uploads(hung["path"])
        assert list(uncommitted) == [shard_key] and uncommitted[shard_key] > 0, uncommitted
        assert not container.exists(hung["path"])
        driver.kill()
        # In progress, then one abort: its upload and the bytes of its blocks exported
        # throughout (the blocks stand until the service drops them).
        staged = {INCOMPLETE: 1, INCOMPLETE_BYTES: uncommitted[shard_key]}
        aborted = expect_one_abort(scenario, settled, staged)
        assert container.uploads(hung["path"]) == uncommitted  # the kill left them

        # The blocks cleared (deleting the uncommitted blob, as the service does after a
        # week): no longer exported, no second abort.
        container.delete(shard_key)
        watched.expect(replace(aborted, extra={INCOMPLETE: 0}), hold=3)
