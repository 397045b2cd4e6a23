"""Megatron-LM's save (megatron-core 0.16.1 torch_dist, CPU, gloo) under a live exporter.

``iter_%07d/`` commits when rank 0 rewrites ``latest_checkpointed_iteration.txt`` in place after
the data, ``.metadata`` and ``metadata.json``; the killed save leaves shards without them.
"""

from __future__ import annotations

import pytest

from tests.writers.harness import POLL_EVERY_CHANGE, Scenario, watching

pytestmark = pytest.mark.writers


@pytest.mark.parametrize("watch", POLL_EVERY_CHANGE)
def test_megatron_iterations_and_tracker(tmp_path, watch: str) -> None:
    with watching(tmp_path, "megatron", "torch", watch=watch) as (root, driver, watched):
        reported = Scenario(driver, watched, layout="megatron").run()
    assert [line["step"] for line in reported] == [5, 10, 15, 20, 25]
    tracker = (root / "latest_checkpointed_iteration.txt").read_text()
    assert tracker == "20"  # the killed save never reached the tracker
