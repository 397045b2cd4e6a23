"""Plain PyTorch DCP (torch 2.13, CPU) saving ``step-N`` under a live exporter.

``step-N`` without torchtitan's ``checkpoint/`` parent is plain DCP: auto-detection must say so.
"""

from __future__ import annotations

import os

import pytest

from tests.writers.harness import INOTIFY_EVERY_CHANGE, POLL_EVERY_CHANGE, Scenario, watching

pytestmark = pytest.mark.writers


@pytest.mark.parametrize("watch", INOTIFY_EVERY_CHANGE)
def test_dcp_step_directories(tmp_path, watch: str) -> None:
    with watching(tmp_path, "dcp", "torch", watch=watch) as (_root, driver, watched):
        Scenario(driver, watched, layout="dcp").run()


@pytest.mark.parametrize("watch", POLL_EVERY_CHANGE)
def test_dcp_retention_deleting_file_by_file(tmp_path, watch: str) -> None:
    """Retention as a slow ``rm -r`` on a parallel filesystem: the oldest generation loses its
    four shards one by one, 0.3 s apart, then ``.metadata``, each state read by the exporter. A
    generation being deleted is never a new commit: after six saves (three deletions), the
    commit counter equals the saves, after each one and through the quiet spell after them."""
    with watching(tmp_path, "dcp", "torch", "slow-delete", watch=watch) as (_, driver, watched):
        reported = Scenario(driver, watched, saves=6, layout="dcp").run()
    deleted = [line["path"] for line in reported[:3]]
    assert not any(os.path.lexists(path) for path in deleted), deleted
    # What each deletion took away file by file: four shards, then .metadata.
    assert sorted(os.listdir(reported[3]["path"])) == [
        ".metadata", "__0_0.distcp", "__0_1.distcp", "__0_2.distcp", "__0_3.distcp",
    ]  # fmt: skip
