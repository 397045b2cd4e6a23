"""PyTorch Lightning ``ModelCheckpoint``: ``epoch=E-step=S.ckpt`` files, ``last.ckpt``.

Since Lightning 2.4 a ``.ckpt`` file appears only when complete (written to a temporary file,
then moved into place), so a file is committed when it appears; a move across devices copies,
and the zip check catches a copy caught half-way. ``last.ckpt`` is a copy or a symlink of the
newest checkpoint: an alias, not a save of its own. Sharded (FSDP) checkpoints are ``.ckpt``
directories of DCP shards plus ``meta.pt``, written after the DCP save.
"""

from __future__ import annotations

import re

from checkpoint_exporter.layouts import dcp
from checkpoint_exporter.layouts.base import (
    COMMITTED,
    DCP,
    WRITING,
    ZIP,
    Check,
    Found,
    Layout,
    Options,
    file_generation,
    generation,
)
from checkpoint_exporter.listing import FILE, Dir

NAME = "lightning"
SUFFIX = ".ckpt"
META = "meta.pt"
_STEP = re.compile(r"step=(\d+)")
_LAST = re.compile(r"last(-v\d+)?\.ckpt")


def _step(name: str) -> int | None:
    match = _STEP.search(name)
    return int(match.group(1)) if match else None


def detect(root: Dir) -> int:
    return 80 if any(name.endswith(SUFFIX) for name in root.names) else 0


def parse(root: Dir, options: Options) -> list[Found]:
    found = []
    for name, _, size, mtime in root.entries(FILE):
        if name.endswith(SUFFIX):
            alias = _LAST.fullmatch(name) is not None
            found.append(
                file_generation(name, size, mtime, _step(name), (Check(ZIP, name),), alias)
            )
    for name, child in root.dirs():
        if not name.endswith(SUFFIX):
            continue
        meta = child.file(META)
        committed_at = dcp.commit_time(child)
        if meta is None or committed_at is None:
            found.append(generation(name, child, _step(name), WRITING))
        else:
            check = Check(DCP, name, child)
            found.append(
                generation(
                    name, child, _step(name), COMMITTED, max(meta[1], committed_at), checks=(check,)
                )
            )
    return found


LAYOUT = Layout(NAME, detect, parse)
