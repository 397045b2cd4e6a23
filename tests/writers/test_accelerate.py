"""Hugging Face Accelerate 1.15 (CPU, one process) ``save_state()`` under a live exporter.

- automatic naming (``ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=2)``):
  ``checkpoints/checkpoint_<iteration>/``, the oldest deleted by accelerate at the start of the
  next save. Nothing marks a save finished: every generation settles. The directory's number
  counts saves and no training step is on disk: the exporter must show none. The job's path is
  the project directory, or its ``checkpoints/`` directory: both are read.
- explicit directories (``save_state(ROOT/step_<N>)``, the user keeping two): the step is the
  one the name states.

The killed save stops half-way through ``optimizer.bin`` (no ``random_states_0.pkl``: still
writing when it stops) or through ``random_states_0.pkl`` (every other file whole: it settles
and fails its zip check); either is exactly one abort once ``abort_after`` passes.
"""

from __future__ import annotations

import pytest

from tests.writers.harness import NIGHTLY, Driver, Scenario, Watched, watching

pytestmark = pytest.mark.writers


@pytest.mark.parametrize(
    ("watch", "hang_in"),
    [("inotify", "optimizer.bin"), pytest.param("poll", "random_states_0.pkl", marks=NIGHTLY)],
)
def test_accelerate_automatic_checkpoint_naming(tmp_path, watch: str, hang_in: str) -> None:
    args = ("--mode", "automatic", "--hang-in", hang_in)
    with watching(tmp_path, "accelerate", "torch", *args, watch=watch) as (root, driver, watched):
        reported = Scenario(driver, watched, layout="accelerate", steps_known=False).run()
        assert watched.figures()["step"] is None, "no training step is on disk"
    names = sorted(path.name for path in (root / "checkpoints").iterdir())
    # total_limit=2: the kill's save deleted checkpoint_2 before writing checkpoint_4.
    assert names == ["checkpoint_3", "checkpoint_4"], names
    assert [line["path"] for line in reported][-1] == str(root / "checkpoints" / "checkpoint_4")


@NIGHTLY
def test_accelerate_job_path_is_the_checkpoints_directory(tmp_path) -> None:
    project = tmp_path / "project"
    checkpoints = project / "checkpoints"
    checkpoints.mkdir(parents=True)
    watched = Watched(checkpoints, tmp_path)
    driver = Driver("accelerate", "torch", project, "--mode", "automatic")
    try:
        # The kill is read as in the project directory's test: saves and retention suffice.
        Scenario(driver, watched, layout="accelerate", steps_known=False).run(kill=False)
        assert watched.figures()["step"] is None
    finally:
        driver.close()
        watched.close()


@NIGHTLY
def test_accelerate_explicit_directories(tmp_path) -> None:
    args = ("--mode", "explicit", "--hang-in", "random_states_0.pkl")
    with watching(tmp_path, "accelerate", "torch", *args) as (root, driver, watched):
        reported = Scenario(driver, watched, layout="accelerate").run()
    assert [line["step"] for line in reported] == [3, 6, 9, 12, 15]
    assert sorted(path.name for path in root.iterdir()) == ["step_12", "step_15", "step_9"]
