"""Ray Train 2.60 (Train V2 ``TorchTrainer``, CPU, one worker, ``num_to_keep=2``) reporting
checkpoints into the run directory under a live exporter, watched by inotify and by polling.

A checkpoint commits when the controller's ``checkpoint_manager_snapshot.json`` names it; the
killed save is an upload stopped half-way inside the copy Ray makes (``model.pt`` whole,
``optimizer.pt`` cut short), never registered. The kill takes Ray's whole session: the raylet
and GCS in the driver's process group and the worker processes in groups of their own.
"""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest

from tests.writers.harness import INOTIFY_EVERY_CHANGE, Scenario, watching

pytestmark = pytest.mark.writers

# Ray's own start: its processes, the controller actor, the worker group, torch in the worker.
START_TIMEOUT = 300.0


@pytest.mark.parametrize("watch", INOTIFY_EVERY_CHANGE)
def test_ray_train_checkpoints(tmp_path, watch: str) -> None:
    # Ray's temporary directory holds its Unix sockets, whose paths may not pass 107 bytes: a
    # short one under /tmp, not pytest's tmp_path.
    scratch = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    try:
        with watching(tmp_path, "ray", "ray", scratch, watch=watch) as (_root, driver, watched):
            started = time.monotonic()
            driver.wait_for("ready", timeout=START_TIMEOUT)
            print(f"ray: ready after {time.monotonic() - started:.1f} s")
            Scenario(driver, watched, layout="ray").run()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
