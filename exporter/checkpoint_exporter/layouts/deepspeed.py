"""DeepSpeed: ``global_stepN/`` (or any tag) holding ``*_model_states.pt`` / ``*_optim_states.pt``.

After every file is written, rank 0 writes ``latest`` (the tag) in the save directory. With the
decoupled writer, ``latest`` is written at a later ``step()``: a tag newer than ``latest`` is a
save in progress until then. Files are torch.save zips, so a truncated one lacks its
end-of-central-directory record.
"""

from __future__ import annotations

import re

from checkpoint_exporter.layouts.base import (
    ABORTED,
    COMMITTED,
    WRITING,
    Found,
    Layout,
    Options,
    generation,
    trailing_step,
    zip_checks,
)
from checkpoint_exporter.listing import Dir

NAME = "deepspeed"
LATEST = "latest"
_STATES = re.compile(r".*(model|optim)_states\.pt")
_GLOBAL_STEP = re.compile(r"global_step\d+")


def _has_states(listing: Dir) -> bool:
    return any(_STATES.fullmatch(name) for name in listing.names)


def latest_tag(root: Dir) -> str | None:
    content = root.contents.get(LATEST)
    if content is None:
        return None
    return content.decode("utf-8", "replace").strip() or None


def detect(root: Dir) -> int:
    tag = latest_tag(root)
    if tag is not None and tag in root.subdirs:
        return 90
    if any(_GLOBAL_STEP.fullmatch(n) or _has_states(c) for n, c in root.dirs()):
        return 85
    return 0


def parse(root: Dir, options: Options) -> list[Found]:
    tag = latest_tag(root)
    latest_file = root.file(LATEST)
    tagged = root.subdirs.get(tag) if tag else None
    latest_step = trailing_step(tag) if tag else None
    found = []
    for name, child in root.dirs():
        if not (_GLOBAL_STEP.fullmatch(name) or _has_states(child)):
            continue
        step = trailing_step(name)
        if name == tag and latest_file is not None:
            committed_at: float | None = max(latest_file[1], child.totals().max_mtime)
        elif tag is None or tagged is None:
            committed_at = child.totals().max_mtime if _has_states(child) else None
        elif step is not None and latest_step is not None and step < latest_step:
            committed_at = child.totals().max_mtime  # committed before the current `latest`
        elif step is None and child.totals().max_mtime <= tagged.totals().max_mtime:
            committed_at = child.totals().max_mtime
        else:
            committed_at = None  # newer than `latest`: written, commit pending
        if committed_at is None:
            found.append(generation(name, child, step, WRITING))
        elif not _has_states(child):
            reason = f"no model or optimizer states, and `latest` points at {tag}"
            found.append(generation(name, child, step, ABORTED, reason=reason))
        else:
            checks = zip_checks(child, name, (".pt",))
            found.append(generation(name, child, step, COMMITTED, committed_at, checks=checks))
    return found


LAYOUT = Layout(NAME, detect, parse, frozenset({LATEST}))
