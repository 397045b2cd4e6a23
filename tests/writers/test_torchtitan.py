"""torchtitan 0.3.0 (torch 2.13, CPU): its DCP ``CheckpointManager`` with ``keep_latest_k=3``
saving ``<dump>/checkpoint/step-N`` under a live exporter watching the dump folder.

``checkpoint/step-N`` is torchtitan's own folder: auto-detection must say ``torchtitan``. The
killed save leaves a half-written shard and no ``.metadata``.
"""

from __future__ import annotations

import pytest

from tests.writers.harness import NIGHTLY, Scenario, watching

pytestmark = pytest.mark.writers


@pytest.mark.parametrize(
    ("async_mode", "watch"),
    [
        pytest.param("disabled", "inotify", marks=NIGHTLY),
        ("async", "inotify"),
        pytest.param("disabled", "poll", marks=NIGHTLY),
    ],
)
def test_torchtitan_checkpoint_manager(tmp_path, async_mode: str, watch: str) -> None:
    with watching(tmp_path, "torchtitan", "torch", async_mode, job="outputs", watch=watch) as (
        _dump,
        driver,
        watched,
    ):
        Scenario(driver, watched, layout="torchtitan").run()
