"""Plain PyTorch DCP (torch 2.13, CPU) saving ``step-N`` under a live exporter.

``step-N`` without torchtitan's ``checkpoint/`` parent is plain DCP: auto-detection must say so.
"""

from __future__ import annotations

import pytest

from tests.writers.harness import Scenario, watching

pytestmark = pytest.mark.writers


@pytest.mark.parametrize("watch", ["inotify", "poll"])
def test_dcp_step_directories(tmp_path, watch: str) -> None:
    with watching(tmp_path, "dcp", "torch", watch=watch) as (_root, driver, watched):
        Scenario(driver, watched, layout="dcp").run()
