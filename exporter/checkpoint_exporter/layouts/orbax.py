"""Orbax ``CheckpointManager``: step directories ``<prefix_>?N/``.

On POSIX a step is written as ``N.orbax-checkpoint-tmp`` and renamed to ``N`` on commit; on
object stores (and, since late 2026, everywhere) ``commit_success.txt`` marks the commit. A tree
where any step has that file uses commit files, so a step without it is still being written.
``_CHECKPOINT_METADATA`` records the writer's own init and commit timestamps, which are the
start and commit times when present.
"""

from __future__ import annotations

import re
from dataclasses import replace

from checkpoint_exporter.layouts.base import (
    ABORTED,
    COMMITTED,
    WRITING,
    Found,
    Layout,
    Options,
    generation,
)
from checkpoint_exporter.listing import Dir
from checkpoint_exporter.untrusted import finite_number, json_value

NAME = "orbax"
TMP_SUFFIX = ".orbax-checkpoint-tmp"
COMMIT_FILE = "commit_success.txt"
METADATA = "_CHECKPOINT_METADATA"
_STEP_DIR = re.compile(r"(?:.*_)?(\d+)")
_TMP_STEP = re.compile(r".*?_*?(\d+)\.(?:partial_save\.)?orbax-checkpoint-tmp")


def _timestamps(listing: Dir) -> tuple[float | None, float | None, bool]:
    """(init, commit) from _CHECKPOINT_METADATA in seconds, and whether it was unreadable."""
    content = listing.contents.get(METADATA)
    if content is None:
        return None, None, False
    try:
        data = json_value(content)
    except ValueError:
        return None, None, True
    if not isinstance(data, dict):
        return None, None, True
    init = finite_number(data.get("init_timestamp_nsecs"))
    commit = finite_number(data.get("commit_timestamp_nsecs"))
    return (
        init / 1e9 if init is not None else None,
        commit / 1e9 if commit is not None else None,
        False,
    )


def detect(root: Dir) -> int:
    for name, child in root.dirs():
        if TMP_SUFFIX in name:
            return 90
        if _STEP_DIR.fullmatch(name) and (METADATA in child.names or COMMIT_FILE in child.names):
            return 90
    return 0


def parse(root: Dir, options: Options) -> list[Found]:
    steps = {n: c for n, c in root.dirs() if TMP_SUFFIX not in n and _STEP_DIR.fullmatch(n)}
    commit_files = any(child.has_file(COMMIT_FILE) for child in steps.values())
    found: list[Found] = []
    for name, child in steps.items():
        step = int(_STEP_DIR.fullmatch(name).group(1))  # type: ignore[union-attr]
        init, commit, unreadable = _timestamps(child)
        marker = child.file(COMMIT_FILE)
        if commit_files and marker is None:
            found.append(_with_start(generation(name, child, step, WRITING), init))
            continue
        committed_at = commit or (marker[1] if marker else child.totals().max_mtime)
        gen = generation(
            name, child, step, COMMITTED, committed_at,
            invalid=unreadable, reason="bad_metadata" if unreadable else None,
        )  # fmt: skip
        found.append(_with_start(gen, init))
    newest = max((f.step for f in found if f.state == COMMITTED and f.step is not None), default=-1)
    for name, child in root.dirs():
        if TMP_SUFFIX not in name:
            continue
        match = _TMP_STEP.fullmatch(name) or _TMP_STEP.match(name)
        step = int(match.group(1)) if match else None
        init, _, _ = _timestamps(child)
        if step is not None and step <= newest:
            reason = f"left behind: step {newest} committed after it"
            found.append(_with_start(generation(name, child, step, ABORTED, reason=reason), init))
        else:
            found.append(_with_start(generation(name, child, step, WRITING), init))
    return found


def _with_start(found: Found, init: float | None) -> Found:
    return found if init is None else replace(found, start_time=init)


LAYOUT = Layout(NAME, detect, parse, frozenset({METADATA}))
