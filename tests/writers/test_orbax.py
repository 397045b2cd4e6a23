"""Orbax 0.12.8 on JAX 0.10.2 (CPU): ``CheckpointManager`` with ``max_to_keep=3`` under a live
exporter, with asynchronous and synchronous saves, watched by inotify and by polling.

A commit is the rename of ``N.orbax-checkpoint-tmp`` to ``N``; the killed save leaves its tmp
directory with the item's data written and nothing committed.
"""

from __future__ import annotations

import pytest

from tests.writers.harness import NIGHTLY, Scenario, watching

pytestmark = pytest.mark.writers


@pytest.mark.parametrize(
    ("mode", "watch"),
    [
        ("async", "inotify"),
        pytest.param("sync", "inotify", marks=NIGHTLY),
        pytest.param("async", "poll", marks=NIGHTLY),
        pytest.param("sync", "poll", marks=NIGHTLY),
    ],
)
def test_orbax_checkpoint_manager(tmp_path, mode: str, watch: str) -> None:
    with watching(tmp_path, "orbax", "jax", mode, watch=watch) as (_root, driver, watched):
        Scenario(driver, watched, layout="orbax").run()
