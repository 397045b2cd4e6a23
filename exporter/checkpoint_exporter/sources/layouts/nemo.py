"""NeMo 2: one directory per checkpoint (``weights/`` in Megatron's torch_dist format,
``context/``), and a sibling marker ``<checkpoint>-unfinished`` while it is not whole.

Read from NVIDIA/NeMo 2.5 (``main`` of 2025-09-20): ``nemo/lightning/pytorch/callbacks/
model_checkpoint.py`` (``ModelCheckpoint``), ``nemo/lightning/io/pl.py``
(``MegatronCheckpointIO.save_checkpoint``), ``nemo/lightning/ckpt_utils.py``,
``nemo/lightning/pytorch/strategies/megatron_strategy.py`` and ``nemo/utils/callbacks/
dist_ckpt_io.py`` (``AsyncFinalizableCheckpointIO``, ``AsyncFinalizerCallback``). NeMo itself is
not installed in the writers' virtualenv, so its order of writes is taken from that code;
``weights/`` is what megatron-core 0.16.1's ``dist_checkpointing.save`` writes (see megatron.py),
and the tests build it with the real library.

``ModelCheckpoint._save_checkpoint(trainer, filepath)``, ``filepath`` being ``<dir>/<name>.ckpt``:

1. rank 0 ``touch``es ``<dir>/<name>-unfinished`` (``.ckpt`` and ``-EMA`` stripped), barrier;
2. ``trainer.save_checkpoint`` -> ``MegatronCheckpointIO.save_checkpoint`` writes
   ``<dir>/<name>/weights/`` with ``dist_checkpointing.save`` (``common.pt``, shards,
   ``.metadata``, ``metadata.json``). ``MegatronStrategy(ckpt_async_save=True)`` is the default:
   the shards, ``.metadata`` and ``metadata.json`` are then written in the background;
3. rank 0 writes ``<name>/context/`` (``io.json``, ``model.yaml``, artifacts; ``io_dump``);
4. the finalize callback (at once when synchronous, else at a later batch end, after
   megatron-core's own finalization): barrier, rank 0 unlinks the marker; then, asynchronous
   only, the removals deferred during the save.

A removal (top-k rotation, the previous ``-last``) is ``_remove_checkpoint``: touch the marker,
``rmtree`` the directory (``unlink`` for a ``save_last="link"`` symlink), unlink the marker. At
start-up rank 0 deletes every marked checkpoint (``_remove_unfinished_checkpoints``).

Names come from the Lightning ``filename`` template: the recipes' ``{model_name}--{val_loss:.2f}-
{step}-{consumed_samples}`` gives ``...-step=N-...``; NeMoLogger's fallback for
``MegatronStrategy`` (``{name}--{val_loss:.4f}-{epoch}-{consumed_samples}``) has no step. A
``...-last`` directory is a second full save of the same step.

So: a marker makes its checkpoint WRITING, except one newer than every file inside (a removal
under way, or a name about to be rewritten; ``rmtree`` changes directory mtimes, not files'):
NeMo no longer counts that checkpoint, and neither does this layout. Without a marker the
checkpoint is committed (the unlink is the commit; its time is not on disk, so the commit time
is the last write inside); ``weights/`` is then checked as a DCP directory, and one without
``metadata.json`` is invalid (megatron-core will not load it).

NeMo 3 (nemo-toolkit 3.0.0) no longer has ``nemo/lightning/pytorch/callbacks/`` nor the LLM stack
that wrote these directories: its ``NeMoModelCheckpoint`` (``nemo/utils/callbacks/
nemo_model_checkpoint.py``) brackets Lightning's single ``.ckpt`` files with the same marker,
read in lightning.py, where ``layout: auto`` sends such a tree (the files are Lightning's own
``_atomic_save``; NeMo adds only the marker). ``layout: nemo`` reads them the same way: this
layout parses its directories and hands everything ending in ``.ckpt``, and markers naming no
directory, to lightning.py, so one NeMo job reads alike under either name. A marker claims a
tree for this layout only when it names a directory beside it: a marker beside ``.ckpt`` files
is NeMo 3's, and the save it marks says nothing about who wrote the tree.
"""

from __future__ import annotations

import re

import checkpoint_exporter.sources.layouts.dcp as dcp
import checkpoint_exporter.sources.layouts.lightning as lightning
from checkpoint_exporter.sources.layouts.base import (
    COMMITTED,
    DCP,
    WRITING,
    Check,
    Found,
    Layout,
    Options,
    generation,
    join,
)
from checkpoint_exporter.sources.listing import FILE, Dir
from checkpoint_exporter.sources.untrusted import step_digits

NAME = "nemo"
UNFINISHED = "-unfinished"
WEIGHTS = "weights"
CONTEXT = "context"
CONFIG = "metadata.json"  # megatron-core's torch_dist config, its last write
MISSING = "missing_shard"  # validate.MISSING_SHARD (validate imports the layouts)
_STEP = re.compile(r"step=(\d+)")


def _marker_name(checkpoint: str) -> str:
    """ModelCheckpoint.format_checkpoint_unfinished_marker_path, for a directory name."""
    base = checkpoint.removesuffix(".ckpt").removesuffix("-EMA")
    return base + UNFINISHED


def _is_checkpoint(name: str, listing: Dir, markers: set[str]) -> bool:
    if WEIGHTS in listing.subdirs or CONTEXT in listing.subdirs:
        return True
    return _marker_name(name) in markers or _STEP.search(name) is not None


def _names_a_directory(root: Dir, base: str) -> bool:
    """A NeMo 2 checkpoint directory the marker ``<base>-unfinished`` names (rmtree leaves the
    directory till last, so a removal under way is still one)."""
    return any(
        _marker_name(name) == base + UNFINISHED
        for name in root.subdirs
        if not name.endswith(lightning.SUFFIX)
    )


def _newest_file(listing: Dir) -> float | None:
    """The newest regular file's mtime below ``listing``: a removal changes directory mtimes,
    never a file's."""
    return max((mtime for _, _, mtime in listing.walk()), default=None)


def detect(root: Dir) -> int:
    for name, _, _, _ in root.entries(FILE):
        if name.endswith(UNFINISHED) and _names_a_directory(root, name.removesuffix(UNFINISHED)):
            return 95
    for _, child in root.dirs():
        weights = child.subdirs.get(WEIGHTS)
        if weights is not None and (CONTEXT in child.subdirs or dcp.is_checkpoint(weights)):
            return 90
    return 0


def parse(root: Dir, options: Options) -> list[Found]:
    markers = {name for name, _, _, _ in root.entries(FILE) if name.endswith(UNFINISHED)}
    found = lightning.parse(root, options)  # NeMo 3's .ckpt files (and Lightning's own)
    for name, child in root.dirs():
        if name.endswith(lightning.SUFFIX) or not _is_checkpoint(name, child, markers):
            continue
        match = _STEP.search(name)
        step = step_digits(match.group(1)) if match else None
        marker = root.file(_marker_name(name))
        if marker is not None:
            newest = _newest_file(child)
            if newest is not None and newest < marker[1]:
                continue  # being removed (or about to be rewritten): no longer a checkpoint
            # No file yet: a save between its makedirs and its first write (which may wait
            # on collectives), or the last instant of a removal; the save is the one to see.
            found.append(generation(name, child, step, WRITING))
            continue
        found.append(_committed(name, child, step))
    return found


def _committed(name: str, listing: Dir, step: int | None) -> Found:
    commit_time = _newest_file(listing) or listing.mtime
    weights = listing.subdirs.get(WEIGHTS)
    if weights is None:
        return generation(name, listing, step, COMMITTED, commit_time)
    checks = (Check(DCP, join(name, WEIGHTS)),)
    if dcp.commit_time(weights) is not None and not weights.has_file(CONFIG):
        return generation(
            name, listing, step, COMMITTED, commit_time,
            checks=checks, invalid=True, reason=MISSING,
        )  # fmt: skip
    return generation(name, listing, step, COMMITTED, commit_time, checks=checks)


LAYOUT = Layout(NAME, detect, parse)
