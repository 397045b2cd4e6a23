"""NeMo 3's checkpoint callback: Lightning ``.ckpt`` files bracketed by ``<name>-unfinished``.

The trees are what nemo-toolkit 3.0.0's ``NeMoModelCheckpoint`` (set up by ``exp_manager``,
Lightning 2.4.0) left, captured through tests/writers/drivers/nemo_writer.py under ``strace``:
names (the default template ``{name}--{score:.4f}-{epoch}``, ``-last``, ``-EMA``), kinds and sizes
(206,637 bytes a plain save, 206,701 and 207,149 with the EMA callback), and the order of the
marker's touch and unlink around the moves and removals (see layouts/lightning.py). Where the
tracker judges a file its bytes are a real Lightning checkpoint
(tests/sources/test_layout_lightning.py's ``REAL``), never an imitation. The ``.nemo`` export
is named as ``_format_nemo_checkpoint_name`` names it (``<prefix>.nemo``); the driver's plain
LightningModule has no ``save_to``, so NeMo wrote none and its size here is arbitrary (the
layout reads no ``.nemo``).
"""

from __future__ import annotations

import os
from pathlib import Path

from checkpoint_exporter.config import Policy
from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.model import ABORTED, COMMITTED, DURABLE, WRITING, WatchedPath
from checkpoint_exporter.sources.layouts.base import ZIP, ZIP_STEP
from checkpoint_exporter.sources.validate import validate
from tests.helpers.trees import BASE, build, scan, touch
from tests.sources.test_layout_lightning import REAL

PLAIN = 206_637  # one save without EMA
MODEL, EMA = 206_701, 207_149  # the two files of a save with the EMA callback


def name(score: int, suffix: str = ".ckpt") -> str:
    """exp_manager's default template, ``{name}--{score:.4f}-{epoch}``, with an improving score."""
    return f"tiny--score=-{score}.0000-epoch=0{suffix}"


def both(root: Path) -> dict[str, dict]:
    """What ``layout: auto`` and ``layout: nemo`` find: the same generations, by id."""
    auto, found = scan(root)
    _, nemo = scan(root, "nemo")
    view = {k: (g.state, g.settles, g.bytes, g.files) for k, g in found.items()}
    assert {k: (g.state, g.settles, g.bytes, g.files) for k, g in nemo.items()} == view
    return {"layout": auto, **{k: found[k] for k in found}}


def test_a_save_before_its_move_is_in_progress_and_hides_nothing(tmp_path: Path) -> None:
    """The marker is touched before Lightning writes its temporary file in $TMPDIR: for the
    whole write the marker is all there is of the save. The two kept checkpoints, the ``.nemo``
    export and the marker: detection stays Lightning's, the kept files settle as ever, and the
    marker is a save in progress under the ``.ckpt`` name it will have."""
    build(tmp_path, {name(2): PLAIN}, BASE)
    build(tmp_path, {name(5): PLAIN, "tiny.nemo": 10_240}, BASE + 1)
    build(tmp_path, {name(8, "-unfinished"): 0}, BASE + 2)
    found = both(tmp_path)
    assert found.pop("layout") == "lightning"
    assert set(found) == {name(2), name(5), name(8)}
    for kept in (name(2), name(5)):
        assert (found[kept].state, found[kept].settles, found[kept].bytes) == (
            WRITING, True, PLAIN,
        )  # fmt: skip
        assert [(c.kind, c.path) for c in found[kept].checks] == [(ZIP_STEP, kept)]
    saving = found[name(8)]
    assert (saving.state, saving.settles, saving.bytes, saving.files) == (WRITING, False, 0, 0)
    assert saving.start_time == saving.last_write_time == BASE + 2


def test_a_file_under_its_marker_waits_for_the_unlink(tmp_path: Path) -> None:
    """Moved into place (or growing, a copy across filesystems) while the marker stands, the
    file is NeMo's save in progress, never settled: the unlink is NeMo's commit. Written in the
    same clock tick as the touch, the file is the save's too (only a marker NEWER than the file
    is a removal)."""
    build(tmp_path, {name(5): PLAIN}, BASE)
    build(tmp_path, {name(8, "-unfinished"): 0}, BASE + 2)
    build(tmp_path, {name(8): PLAIN // 2}, BASE + 2.5)  # half a copy
    found = both(tmp_path)
    assert (found[name(8)].state, found[name(8)].settles) == (WRITING, False)
    assert found[name(8)].bytes == PLAIN // 2
    build(tmp_path, {name(8): PLAIN}, BASE + 2)  # whole, dated as the touch
    found = both(tmp_path)
    assert (found[name(8)].state, found[name(8)].settles, found[name(8)].bytes) == (
        WRITING, False, PLAIN,
    )  # fmt: skip
    (tmp_path / name(8, "-unfinished")).unlink()  # the finalize callback
    found = both(tmp_path)
    assert (found[name(8)].state, found[name(8)].settles) == (WRITING, True)
    assert found["layout"] == "lightning"


def test_a_removal_under_way_takes_only_the_checkpoint_it_names(tmp_path: Path) -> None:
    """``_remove_checkpoint``: touch the marker, remove the file and its ``-EMA`` twin, unlink.
    A marker newer than every file it names: that checkpoint is no longer counted (NeMo drops
    it from its top k), the others stay; its last instant (files gone, marker not yet) is a
    marker naming nothing, which vanishes with the unlink."""
    build(tmp_path, {name(2): MODEL, name(2, "-EMA.ckpt"): EMA}, BASE)
    build(tmp_path, {name(5): MODEL, name(5, "-EMA.ckpt"): EMA}, BASE + 1)
    build(tmp_path, {name(8): MODEL, name(8, "-EMA.ckpt"): EMA}, BASE + 2)
    build(tmp_path, {name(2, "-unfinished"): 0}, BASE + 3)
    found = both(tmp_path)
    assert found.pop("layout") == "lightning"
    assert set(found) == {name(5), name(8)}
    (tmp_path / name(2)).unlink()
    assert set(both(tmp_path)) == {"layout", name(5), name(8)}  # the EMA half is going too
    (tmp_path / name(2, "-EMA.ckpt")).unlink()
    (tmp_path / name(2, "-unfinished")).unlink()
    assert set(both(tmp_path)) == {"layout", name(5), name(8)}


def test_an_ema_save_is_one_generation_of_two_files(tmp_path: Path) -> None:
    """With the EMA callback a save is ``<name>.ckpt`` then ``<name>-EMA.ckpt`` under one
    marker (resuming from the first loads the second): one generation, both files' bytes, a
    check of each. ``-last`` saves pair the same way."""
    build(tmp_path, {name(5): MODEL, name(5, "-EMA.ckpt"): EMA}, BASE)
    build(tmp_path, {name(5, "-last.ckpt"): MODEL, name(5, "-last-EMA.ckpt"): EMA}, BASE + 1)
    build(tmp_path, {name(8, "-unfinished"): 0}, BASE + 2)
    build(tmp_path, {name(8): MODEL}, BASE + 2.1)  # the EMA half not written yet
    found = both(tmp_path)
    assert set(found) == {"layout", name(5), name(5, "-last.ckpt"), name(8)}
    pair = found[name(5)]
    assert (pair.state, pair.settles, pair.bytes, pair.files) == (WRITING, True, MODEL + EMA, 2)
    assert [(c.kind, c.path) for c in pair.checks] == [
        (ZIP_STEP, name(5)), (ZIP, name(5, "-EMA.ckpt")),
    ]  # fmt: skip
    assert found[name(5, "-last.ckpt")].bytes == MODEL + EMA
    assert (found[name(8)].settles, found[name(8)].files) == (False, 1)
    build(tmp_path, {name(8, "-EMA.ckpt"): EMA}, BASE + 2.2)
    assert (both(tmp_path)[name(8)].bytes, both(tmp_path)[name(8)].files) == (MODEL + EMA, 2)


def _observe(tracker: JobTracker, root: Path, now: float) -> None:
    """One scan as the daemon does it (nothing while no layout tells), every check it asks for
    run on the real files."""
    layout, found = scan(root) if os.listdir(root) else (None, {})
    observed = tracker.observe(DURABLE, list(found.values()), now, layout=layout)
    for request in observed.requests:
        tracker.submitted(request)
        tracker.apply_verdict(request, validate(str(root), request.found.checks))
    tracker.tick(now)


def _real(root: Path, relative: str, mtime: float) -> None:
    (root / relative).write_bytes(REAL)
    touch(root / relative, mtime)


def test_a_killed_save_is_one_abort_and_the_kept_checkpoints_stay_valid(tmp_path: Path) -> None:
    """The issue's false page: four saves with save_top_k=2, then a save killed before its move,
    its marker left for good. The kept checkpoints stay committed and valid throughout; the
    stale marker is one aborted save once abort_after passes; the next scans change nothing."""
    policy = Policy(deadline=10, abort_after=10, settle=2)
    tracker = JobTracker("j", (WatchedPath(DURABLE, str(tmp_path)),), policy)
    clock = BASE
    _observe(tracker, tmp_path, clock)
    for score in (2, 5, 8, 11):
        clock += 10
        marker = tmp_path / name(score, "-unfinished")
        build(tmp_path, {marker.name: 0}, clock)
        _observe(tracker, tmp_path, clock + 0.001)
        _real(tmp_path, name(score), clock + 0.002)  # moved into place
        _observe(tracker, tmp_path, clock + 0.003)
        marker.unlink()  # the finalize callback
        if score > 5:  # the top k pushes the oldest out: marker, remove, unlink
            gone = name(score - 6)
            build(tmp_path, {name(score - 6, "-unfinished"): 0}, clock + 0.004)
            _observe(tracker, tmp_path, clock + 0.005)
            os.unlink(tmp_path / gone)
            os.unlink(tmp_path / name(score - 6, "-unfinished"))
        for later in (1, 3, 5):  # settles, then its check passes
            _observe(tracker, tmp_path, clock + later)
        state = tracker.state()
        assert (state.layout, state.saves_committed, state.saves_aborted) == (
            "lightning", {2: 1, 5: 2, 8: 3, 11: 4}[score], 0,
        )  # fmt: skip
    kept = {name(8), name(11)}
    build(tmp_path, {name(14, "-unfinished"): 0}, clock + 10)  # the killed save
    for later in (10.5, 15, 20.6, 30, 60, 400):
        _observe(tracker, tmp_path, clock + later)
        state = tracker.state()
        generations = {g.id: (g.state, g.valid) for g in state.generations}
        assert {g: generations[g] for g in kept} == {g: (COMMITTED, True) for g in kept}
        assert state.saves_committed == 4
    assert state.saves_aborted == 1
    assert generations[name(14)][0] == ABORTED
