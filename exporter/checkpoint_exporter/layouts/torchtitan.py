"""torchtitan: DCP saves in ``<dump>/checkpoint/step-N/``.

A step directory counts once it holds ``.metadata`` or, for the final Hugging Face export,
``model.safetensors.index.json`` (the rule torchtitan's own loader applies).
"""

from __future__ import annotations

import re

from checkpoint_exporter.layouts import dcp
from checkpoint_exporter.layouts.base import (
    COMMITTED,
    SAFETENSORS_INDEX,
    WRITING,
    Check,
    Found,
    Layout,
    Options,
    generation,
    join,
)
from checkpoint_exporter.listing import Dir

NAME = "torchtitan"
FOLDER = "checkpoint"
HF_INDEX = "model.safetensors.index.json"
_STEP = re.compile(r"step-(\d+)")


def _container(root: Dir) -> tuple[str, Dir] | None:
    """The directory holding step-N: ``checkpoint/`` below the dump folder, or the root."""
    folder = root.subdirs.get(FOLDER)
    for prefix, candidate in ((FOLDER, folder), ("", root)):
        if candidate is not None and any(_STEP.fullmatch(n) for n, _ in candidate.dirs()):
            return prefix, candidate
    return None


def detect(root: Dir) -> int:
    return 90 if _container(root) else 0


def parse(root: Dir, options: Options) -> list[Found]:
    container = _container(root)
    if container is None:
        return []
    prefix, listing = container
    found = []
    for name, child in listing.dirs():
        match = _STEP.fullmatch(name)
        if match is None:
            continue
        gen_id, step = join(prefix, name), int(match.group(1))
        index = child.file(HF_INDEX)
        if dcp.commit_time(child) is None and index is not None:
            check = Check(SAFETENSORS_INDEX, join(gen_id, HF_INDEX), child)
            found.append(generation(gen_id, child, step, COMMITTED, index[1], checks=(check,)))
        elif dcp.is_checkpoint(child) or index is not None:
            found.append(dcp.checkpoint(gen_id, child, step))
        else:
            found.append(generation(gen_id, child, step, WRITING))  # created, nothing written yet
    return found


LAYOUT = Layout(NAME, detect, parse)
