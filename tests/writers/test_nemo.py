"""NeMo 3.0.0's ``NeMoModelCheckpoint``, set up by ``exp_manager`` on a Lightning 2.4.0 Trainer
(CPU, one process), saving under a live exporter.

NeMo touches ``<name>-unfinished`` before each save and each removal and unlinks it after: the
marker is a save in progress for the ``.ckpt`` it names, never a reason to lose sight of the
checkpoints beside it (the issue: it flipped ``layout: auto`` to a layout that saw no ``.ckpt``,
counted 2 of 4 saves and, after a killed save, 0 valid generations with two good ones on disk).
Under ``layout: auto`` the tree is Lightning's (NeMo only adds the marker); ``layout: nemo`` must
read it the same way.

The truth is the library's: ``trainer.global_step`` at each save, the files NeMo had Lightning
write (counted around ``TorchCheckpointIO.save_checkpoint``), what its own top-k retention left on
disk, and no marker left once a save returned.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.writers.harness import NIGHTLY, Expected, Scenario, Watched, disk_bytes, watching
from tests.writers.test_lightning import ready, tmpfs  # noqa: F401 - tmpfs is a fixture

pytestmark = pytest.mark.writers

DEADLINE = 10.0
SETTLE = 2.0
UNFINISHED = "-unfinished"
EMA = "-EMA.ckpt"


@pytest.mark.parametrize("layout", ["auto", "nemo"])
def test_top_k_under_exp_manager(tmp_path: Path, layout: str) -> None:
    """save_top_k=2 on an improving score, one ``.ckpt`` per save, NeMo's ``_remove_checkpoint``
    taking the oldest from the third save on; the fifth save killed half-way through its
    temporary file in $TMPDIR (same filesystem): under the watched directory only its marker,
    which must become exactly one aborted save, the two kept checkpoints still valid."""
    args = ("--top-k", "2", "--save-last", "false", "--tmpdir", str(tmp_path / "tmp"))
    args += ("--log-dir", str(tmp_path / "log"))
    with watching(tmp_path, "nemo", "nemo", *args, layout=layout) as (root, driver, watched):
        assert ready(driver)["same_filesystem"]
        scenario = Scenario(driver, watched, layout="lightning" if layout == "auto" else "nemo")
        reported = scenario.run()
        for line in reported[:-1]:
            assert line["markers"] == [], line  # NeMo unlinked each save's marker
        hung = reported[-1]
        assert "temporary file" in hung["what"], hung
        left = sorted(os.listdir(root))
        marker = Path(hung["path"]).name.removesuffix(".ckpt") + UNFINISHED
        assert left == sorted([marker, *(Path(r["path"]).name for r in reported[-3:-1])]), left


def _kept(root: Path, aborted: set[str]) -> list[str]:
    """The saves NeMo kept: ``.ckpt`` files less their ``-EMA`` twins and the killed write."""
    return sorted(
        name
        for name in os.listdir(root)
        if name.endswith(".ckpt") and not name.endswith(EMA) and name not in aborted
    )


def _expected(root: Path, lines: list[dict], aborted: set[str]) -> tuple[Expected, int]:
    """Each save writes ``<top-k>.ckpt``, its ``-EMA`` twin, ``<...>-last.ckpt`` and its twin:
    two NeMo saves (two markers), each one generation of two files. The newest is the last
    save's ``-last.ckpt`` with its twin: the figures, and its bytes (both files)."""
    newest = lines[-1]["written"][-2]
    saves = [path for line in lines for path in line["written"] if not path.endswith(EMA)]
    want = Expected(
        step=lines[-1]["step"],
        retained=len(_kept(root, aborted)),
        committed=len(saves),
        aborted=len(aborted),
        layout="lightning",
    )
    return want, disk_bytes(newest) + disk_bytes(newest.removesuffix(".ckpt") + EMA)


def _expect(
    watched: Watched, want: tuple[Expected, int], timeout: float = 10.0, hold: float = 0.0
) -> None:
    """``Watched.expect``, then the newest generation's bytes: both files of the save."""
    figures, truth = want
    watched.expect(figures, timeout=timeout, hold=hold)
    got = watched.figures()["bytes"]
    assert got is not None and abs(float(got) - truth) <= 0.01 * truth, (got, truth)


@NIGHTLY
def test_last_and_ema_with_tmpdir_on_another_filesystem(tmp_path: Path, tmpfs: Path) -> None:  # noqa: F811
    """exp_manager's defaults where they matter: ``save_last`` (``<template>-last.ckpt`` saved at
    every trigger, the previous one removed under its marker) and the EMA callback (every save
    two files under one marker); $TMPDIR on a tmpfs, so every move is a copy growing the
    ``.ckpt`` under its final name beside its marker. The killed save leaves the marker and half
    a top-k file: one abort, the kept saves committed and valid."""
    args = ("--top-k", "2", "--save-last", "true", "--ema", "--tmpdir", str(tmpfs / "tmp"))
    args += ("--log-dir", str(tmp_path / "log"))
    with watching(tmp_path, "nemo", "nemo", *args) as (root, driver, watched):
        assert not ready(driver)["same_filesystem"]
        lines = []
        for _ in range(4):
            lines.append(driver.save())
            assert lines[-1]["markers"] == [], lines[-1]
            _expect(watched, _expected(root, lines, set()), timeout=SETTLE + 20)
        final = _expected(root, lines, set())
        _expect(watched, final, hold=DEADLINE + SETTLE + 2)
        hung = driver.hang()
        driver.kill()
        assert "half-copied" in hung["what"], hung
        half = Path(hung["path"])
        assert half.stat().st_size > 0 and (root / (half.stem + UNFINISHED)).exists()
        _expect(watched, _expected(root, lines, {half.name}), timeout=DEADLINE + SETTLE + 20)
        aborted = watched.log_lines("aborted")
        assert any("job=w" in line for line in aborted), aborted
