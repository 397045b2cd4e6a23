"""Plain PyTorch DCP (torch 2.13, CPU) saving ``step-N`` under a live exporter.

``step-N`` without torchtitan's ``checkpoint/`` parent is plain DCP: auto-detection must say so.
"""

from __future__ import annotations

import pytest

from tests.writers.harness import Driver, Scenario, Watched

pytestmark = pytest.mark.writers


@pytest.mark.parametrize("watch", ["inotify", "poll"])
def test_dcp_step_directories(tmp_path, watch: str) -> None:
    root = tmp_path / "job"
    root.mkdir()
    watched = Watched(root, tmp_path, watch=watch)
    driver = Driver("dcp", "torch", root)
    try:
        Scenario(driver, watched, layout="dcp").run()
    finally:
        driver.close()
        watched.close()
