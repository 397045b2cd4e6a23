"""Orbax 0.12.8 on JAX 0.10.2 (CPU): ``CheckpointManager`` with ``max_to_keep=3`` under a live
exporter, with asynchronous and synchronous saves, watched by inotify and by polling.

A commit is the rename of ``N.orbax-checkpoint-tmp`` to ``N``; the killed save leaves its tmp
directory with the item's data written and nothing committed.
"""

from __future__ import annotations

import pytest

from tests.writers.harness import Driver, Scenario, Watched

pytestmark = pytest.mark.writers


@pytest.mark.parametrize(
    ("mode", "watch"),
    [("async", "inotify"), ("sync", "inotify"), ("async", "poll"), ("sync", "poll")],
)
def test_orbax_checkpoint_manager(tmp_path, mode: str, watch: str) -> None:
    root = tmp_path / "job"
    root.mkdir()
    watched = Watched(root, tmp_path, watch=watch)
    driver = Driver("orbax", "jax", root, mode)
    try:
        Scenario(driver, watched, layout="orbax").run()
    finally:
        driver.close()
        watched.close()
