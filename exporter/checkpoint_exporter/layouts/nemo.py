"""NeMo 2: ``<name>--...-step=N-...`` directories (``weights/`` in Megatron format, ``context/``).

Before a save, rank 0 touches the sibling marker ``<checkpoint>-unfinished``; the finalize
callback removes it after the (possibly asynchronous) write completes. A checkpoint whose marker
is gone is committed. The marker's removal time is not on disk, so the commit time is the last
write inside the checkpoint; the event spool refines it.
"""

from __future__ import annotations

import re

from checkpoint_exporter.layouts import dcp
from checkpoint_exporter.layouts.base import (
    COMMITTED,
    DCP,
    WRITING,
    Check,
    Found,
    Layout,
    Options,
    generation,
)
from checkpoint_exporter.listing import Dir

NAME = "nemo"
UNFINISHED = "-unfinished"
WEIGHTS = "weights"
_STEP = re.compile(r"step=(\d+)")


def _marker_name(checkpoint: str) -> str:
    base = checkpoint.removesuffix(".ckpt").removesuffix("-EMA")
    return base + UNFINISHED


def detect(root: Dir) -> int:
    if any(name.endswith(UNFINISHED) for name in root.names):
        return 95
    if any(_STEP.search(name) and WEIGHTS in child.subdirs for name, child in root.dirs()):
        return 95
    return 0


def parse(root: Dir, options: Options) -> list[Found]:
    markers = {name for name in root.names if name.endswith(UNFINISHED)}
    found = []
    for name, child in root.dirs():
        match = _STEP.search(name)
        if match is None or name in markers:
            continue
        step = int(match.group(1))
        if _marker_name(name) in markers:
            found.append(generation(name, child, step, WRITING))
            continue
        weights = child.subdirs.get(WEIGHTS)
        checks = ()
        if weights is not None and dcp.commit_time(weights) is not None:
            checks = (Check(DCP, f"{name}/{WEIGHTS}", weights),)
        found.append(
            generation(name, child, step, COMMITTED, child.totals().max_mtime, checks=checks)
        )
    return found


LAYOUT = Layout(NAME, detect, parse)
