"""Hugging Face transformers 5.24 (safetensors 0.8, CPU) saving under a live exporter.

- ``trainer``: the real ``Trainer`` writing ``checkpoint-N/`` with ``save_total_limit=3``;
  ``trainer_state.json`` is the commit marker, the killed save never writes it.
- ``dirs``: ``save_pretrained(ROOT/checkpoint-N)``, three shards and an index, no marker: each
  generation settles; the killed one keeps a ``.tmpXXXXXX`` shard that never got its name.
- ``root``: ``save_pretrained(ROOT)`` again and again, the same directory rewritten in place:
  one generation, ``.``, with no step on disk (the exporter must never show one).
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.writers.harness import (
    INOTIFY_EVERY_CHANGE,
    NIGHTLY,
    Driver,
    Expected,
    Scenario,
    Watched,
    watching,
)

pytestmark = pytest.mark.writers


def _run(tmp_path, mode: str, watch: str = "inotify") -> None:
    with watching(tmp_path, "hf", "torch", "--mode", mode, watch=watch) as (_root, driver, watched):
        Scenario(driver, watched, layout="hf").run()


@pytest.mark.parametrize("watch", INOTIFY_EVERY_CHANGE)
def test_hf_trainer_checkpoints(tmp_path, watch: str) -> None:
    _run(tmp_path, "trainer", watch)


def test_hf_save_pretrained_directories(tmp_path) -> None:
    _run(tmp_path, "dirs")


@NIGHTLY
def test_hf_save_pretrained_into_the_root(tmp_path) -> None:
    # Scenario's own loop would count the one path reported by every save once per save
    # (harness.retained does not deduplicate): the same checks, written out for one generation.
    root = tmp_path / "job"
    root.mkdir()
    watched = Watched(root, tmp_path)
    driver = Driver("hf", "torch", root, "--mode", "root")
    deadline, settle = 15.0, 2.0
    try:
        blinks: list[str] = []
        for count in range(1, 5):
            line = driver.save()
            assert line["path"] == str(root)
            if count > 1:
                blinks += _valid_while_settling(watched, count, settle + 20)
            want = Expected(retained=1, newest_path=str(root), committed=count, layout="hf")
            watched.expect(want, timeout=settle + 20)
            assert watched.figures()["step"] is None, "no step is on disk: none may be exported"
        watched.expect(want, hold=deadline + settle + 2)
        # A kill half-way through rewriting the root leaves a mix (the first shard new, the
        # rest and the index old) and safetensors' temporary file: one aborted save. The one
        # generation there is no longer the committed save, so its size, validity and count
        # are left to the core; the counters and the step are not.
        driver.hang()
        driver.kill()
        killed = Expected(valid=None, committed=4, aborted=1, in_progress=0, layout="hf")
        watched.expect(killed, timeout=deadline + settle + 20)
        assert watched.figures()["step"] is None
        aborted = watched.log_lines("aborted")
        assert any("job=w" in line for line in aborted), aborted
        # While a rewrite settles, the last committed save's validity is still what it was.
        assert not blinks, f"checkpoint_last_committed_valid blinked during rewrites: {blinks}"
    finally:
        driver.close()
        watched.close()


def _valid_while_settling(watched: Watched, count: int, timeout: float) -> list[str]:
    """The valid gauge's values other than 1 from a rewrite's end until its commit."""
    wrong: Counter[object] = Counter()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        figures = watched.figures()
        if figures["valid"] != 1:
            wrong[figures["valid"]] += 1
        if figures["committed"] == count:
            break
        time.sleep(0.1)
    return [f"save {count}: valid={value!r} in {n} samples" for value, n in wrong.items()]
