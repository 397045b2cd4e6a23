"""Hugging Face Trainer: ``checkpoint-N/`` directories.

There is no explicit commit marker: ``trainer_state.json`` is rank 0's last write, so a
checkpoint without it is still being written. ``checkpoint-is-incomplete.txt`` (the SIGTERM save)
and ``tmp-checkpoint-*`` staging directories (some releases) mark saves in progress.
"""

from __future__ import annotations

import re

from checkpoint_exporter.layouts.base import (
    COMMITTED,
    SAFETENSORS,
    WRITING,
    Check,
    Found,
    Layout,
    Options,
    generation,
    join,
    zip_checks,
)
from checkpoint_exporter.listing import Dir

NAME = "hf"
STATE = "trainer_state.json"
INCOMPLETE = "checkpoint-is-incomplete.txt"
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_STAGING = re.compile(r"tmp-checkpoint-(.+)")
_TORCH_SAVE = (".pt", ".pth", ".bin")


def detect(root: Dir) -> int:
    return 90 if any(_CHECKPOINT.fullmatch(n) or _STAGING.fullmatch(n) for n in root.subdirs) else 0


def parse(root: Dir, options: Options) -> list[Found]:
    found = []
    for name, child in root.dirs():
        if staging := _STAGING.fullmatch(name):
            step = int(staging.group(1)) if staging.group(1).isdigit() else None
            found.append(generation(name, child, step, WRITING))
            continue
        match = _CHECKPOINT.fullmatch(name)
        if match is None:
            continue
        step = int(match.group(1))
        state = child.file(STATE)
        if state is None or child.has_file(INCOMPLETE):
            found.append(generation(name, child, step, WRITING))
            continue
        checks = zip_checks(child, name, _TORCH_SAVE) + tuple(
            Check(SAFETENSORS, join(name, relative))
            for relative, _, _ in child.walk()
            if relative.endswith(".safetensors")
        )
        found.append(generation(name, child, step, COMMITTED, state[1], checks=checks))
    return found


LAYOUT = Layout(NAME, detect, parse)
