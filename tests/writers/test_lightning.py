"""PyTorch Lightning 2.6.6 ``ModelCheckpoint`` (CPU, one process) saving under a live exporter.

The truth is the disk's and the library's: the step the Trainer saved at, the files Lightning
wrote (``writes``, counted around ``TorchCheckpointIO.save_checkpoint``) and the regular
``.ckpt`` files it kept (symlinks are names, not saves). A full ``last.ckpt`` is a generation of
its own, so it counts in ``retained_generations`` and its bytes in ``retained_bytes``, even next
to a top-k file of the same step; the newest state is the file the save wrote last.

Lightning moves a temporary file from ``$TMPDIR`` into place: on the same filesystem a killed
save leaves nothing under the watched directory (nothing may change); across filesystems (the
temporary directory on a tmpfs) the move is a copy, and a killed copy leaves half a ``.ckpt``
under its final name, which must count as exactly one aborted save.
"""

from __future__ import annotations

import os
import queue
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from checkpoint_exporter.sources.layouts.base import ZIP_STEP
from checkpoint_exporter.sources.validate import Verdict, validate
from tests.conftest import parse_samples
from tests.helpers.trees import scan
from tests.writers.harness import (
    INOTIFY_EVERY_CHANGE,
    JOB,
    NIGHTLY,
    Driver,
    Expected,
    Watched,
    writer_python,
)

pytestmark = pytest.mark.writers

DEADLINE = 10.0
SETTLE = 2.0


def kept(root: Path, aborted: set[str]) -> dict[str, int]:
    """The regular ``.ckpt`` files Lightning kept (name -> bytes), without killed writes."""
    out = {}
    for name in os.listdir(root):
        status = os.lstat(root / name)
        if name.endswith(".ckpt") and stat.S_ISREG(status.st_mode) and name not in aborted:
            out[name] = status.st_size
    return out


def listing(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry's (mode, size, mtime), symlinks not followed."""
    return {
        name: (status.st_mode, status.st_size, status.st_mtime_ns)
        for name in os.listdir(root)
        for status in [os.lstat(root / name)]
    }


def retained_bytes(watched: Watched) -> float | None:
    for key, value in parse_samples(watched.exporter.metrics()).items():
        if key.startswith("checkpoint_retained_bytes{") and f'training_job="{JOB}"' in key:
            return value
    return None


@dataclass
class LightningScenario:
    """``saves`` good saves, figures checked after each; a quiet spell past the deadline; then
    one save killed half-way: nothing visible (same filesystem) or one abort (a copy)."""

    driver: Driver
    watched: Watched
    root: Path
    saves: int = 4
    killed_copy_visible: bool = False
    latencies: list[float] = field(default_factory=list)

    def expected(self, lines: list[dict], aborted: set[str]) -> Expected:
        """The newest state is the last file a save wrote that is still whole on disk (a killed
        copy over ``last.ckpt`` destroys the one before it)."""
        files = kept(self.root, aborted)
        step, path = next(
            (line["step"], written)
            for line in reversed(lines)
            for written in reversed(line["written"])
            if Path(written).name in files
        )
        return Expected(
            step=step,
            retained=len(files),
            newest_path=path,
            committed=lines[-1]["writes"],
            aborted=len(aborted),
            layout="lightning",
        )

    def check_bytes(self, aborted: set[str]) -> None:
        truth = sum(kept(self.root, aborted).values())
        got = retained_bytes(self.watched)
        assert got == truth, (
            f"retained_bytes: exporter {got}, truth {truth} ({os.listdir(self.root)})"
        )

    def run(self) -> list[dict]:
        lines = []
        for _ in range(self.saves):
            line = self.driver.save()
            lines.append(line)
            # A .ckpt settles (no marker: a move may be a copy), then its zip check runs.
            want = self.expected(lines, set())
            self.latencies.append(self.watched.expect(want, timeout=SETTLE + 20))
            self.check_bytes(set())
        final = self.expected(lines, set())
        self.watched.expect(final, hold=DEADLINE + SETTLE + 2)
        before = listing(self.root)
        hung = self.driver.hang()
        self.driver.kill()
        if self.killed_copy_visible:
            half = Path(hung["path"])
            assert half.parent == self.root and half.stat().st_size > 0, hung
            final = self.expected(lines, {half.name})
            self.watched.expect(final, timeout=DEADLINE + SETTLE + 20)
            aborted = self.watched.log_lines("aborted")
            assert aborted, "an aborted save logs a warning"
            assert any(f"job={JOB}" in line for line in aborted), aborted
            self.check_bytes({half.name})
        else:
            # The temporary file was cut short in $TMPDIR: nothing here changed, nothing may.
            assert listing(self.root) == before, hung
            self.watched.expect(final, hold=SETTLE + 3)
            assert not self.watched.log_lines("aborted")
            self.check_bytes(set())
        print(f"lightning: save-to-metrics waits {[round(x, 2) for x in self.latencies]}")
        return [*lines, hung]


def start(tmp_path: Path, *options: str, watch: str = "inotify") -> tuple[Path, Watched, Driver]:
    root = tmp_path / "job"
    root.mkdir()
    watched = Watched(root, tmp_path, watch=watch, deadline=f"{DEADLINE:g}s", settle=f"{SETTLE:g}s")
    options = (
        ("--tmpdir", str(tmp_path / "tmp"), *options) if "--tmpdir" not in options else options
    )
    driver = Driver("lightning", "torch", root, *options)
    return root, watched, driver


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs for $TMPDIR: Lightning's commit then moves across filesystems (tests run as root)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (the writers tier runs as root): {done.stderr}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def ready(driver: Driver, timeout: float = 120) -> dict:
    """The driver's first line: where its temporary files go."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = driver.lines.get(timeout=0.5)
        except queue.Empty:
            continue
        if line.get("event") == "ready":
            return line
    raise AssertionError("lightning driver: no 'ready' line:\n" + "".join(driver.stderr[-60:]))


def run(tmp_path: Path, *options: str, watch: str = "inotify", visible: bool = False) -> None:
    root, watched, driver = start(tmp_path, *options, watch=watch)
    try:
        # The move across filesystems is what makes a killed save visible; on one, a rename.
        assert ready(driver)["same_filesystem"] is not visible
        hung = LightningScenario(driver, watched, root, killed_copy_visible=visible).run()[-1]
        assert ("half-copied" if visible else "temporary file") in hung["what"], hung
    finally:
        driver.close()
        watched.close()


@pytest.mark.parametrize("watch", INOTIFY_EVERY_CHANGE)
def test_top_k_step_files_and_a_full_last_ckpt(tmp_path: Path, watch: str) -> None:
    """(a) save_top_k=2 on an improving score, save_last=True: each save writes
    ``epoch=0-step=S.ckpt`` then a full ``last.ckpt`` (step only inside), then deletes the
    top-k file pushed out."""
    run(tmp_path, "--save-last", "true", "--top-k", "2", "--monitor", "improving", watch=watch)


@NIGHTLY
def test_last_ckpt_as_a_symlink(tmp_path: Path) -> None:
    """(b) save_last="link": ``last.ckpt`` is a relative symlink to the newest top-k file."""
    run(tmp_path, "--save-last", "link", "--top-k", "2", "--monitor", "improving")


@NIGHTLY
def test_top_k_keeps_nothing_new_and_only_last_ckpt_changes(tmp_path: Path) -> None:
    """(c) save_top_k=1 on a score that never improves: after the first save only
    ``last.ckpt`` is rewritten, its newer step readable only inside it."""
    run(tmp_path, "--save-last", "true", "--top-k", "1", "--monitor", "never")


def test_temporary_directory_on_another_filesystem(tmp_path: Path, tmpfs: Path) -> None:
    """(d) $TMPDIR on a tmpfs: every commit is a copy growing the final name in place, and the
    killed save leaves half a ``epoch=0-step=S.ckpt``: one abort, the previous state kept."""
    run(
        tmp_path,
        "--save-last", "true", "--top-k", "2", "--monitor", "improving",
        "--tmpdir", str(tmpfs / "tmp"),
        visible=True,
    )  # fmt: skip


@NIGHTLY
def test_a_killed_copy_over_last_ckpt_leaves_the_older_top_k_file(
    tmp_path: Path, tmpfs: Path
) -> None:
    """(e) As (c), with $TMPDIR on a tmpfs: the killed save copies over ``last.ckpt`` in place
    (``copyfile`` truncates it), so the previous ``last.ckpt`` is gone too: one abort, and the
    newest whole state is the first save's top-k file, with its older step."""
    run(
        tmp_path,
        "--save-last", "true", "--top-k", "1", "--monitor", "never",
        "--tmpdir", str(tmpfs / "tmp"),
        visible=True,
    )  # fmt: skip


SHARDED = r"""
import sys, warnings
warnings.filterwarnings("ignore")
import torch
from lightning.pytorch.strategies import FSDPStrategy

# Lightning refuses FSDP on a CPU Trainer; the strategy's own save_checkpoint runs without one
# (one process, no process group): the DCP save, then rank 0's torch.save of meta.pt.
strategy = FSDPStrategy(state_dict_type="sharded")
for name, step in (("epoch=0-step=5.ckpt", 5), ("last.ckpt", 5), ("last.ckpt", 10)):
    checkpoint = {
        "epoch": 0, "global_step": step, "state_dict": {"w": torch.randn(16, 16)},
        "optimizer_states": [{"state": {}, "param_groups": []}], "loops": {},
    }
    strategy.save_checkpoint(checkpoint, sys.argv[1] + "/" + name)
"""


def test_sharded_checkpoint_directories(tmp_path: Path) -> None:
    """FSDPStrategy(state_dict_type="sharded").save_checkpoint, the real one: ``.ckpt``
    directories of DCP shards, ``.metadata`` and ``meta.pt`` (written last, in place); a
    sharded ``last.ckpt`` saved again into its own directory holds the newer step in
    ``meta.pt``."""
    subprocess.run(
        [writer_python("torch"), "-c", SHARDED, str(tmp_path)],
        check=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    for name in ("epoch=0-step=5.ckpt", "last.ckpt"):
        assert {".metadata", "meta.pt", "__0_0.distcp"} <= set(os.listdir(tmp_path / name))
    layout, found = scan(tmp_path)
    assert layout == "lightning"
    assert set(found) == {"epoch=0-step=5.ckpt", "last.ckpt"}
    assert all(gen.settles for gen in found.values())
    assert [c.kind for c in found["last.ckpt"].checks] == ["dcp", ZIP_STEP]
    verdicts = {gen_id: validate(str(tmp_path), gen.checks) for gen_id, gen in found.items()}
    assert verdicts == {"epoch=0-step=5.ckpt": Verdict(True), "last.ckpt": Verdict(True, step=10)}
