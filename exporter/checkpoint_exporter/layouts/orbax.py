"""Orbax ``CheckpointManager``: step directories ``<prefix_>?N/`` below the job's directory.

Checked against orbax-checkpoint 0.12.8 (``checkpoint_manager.py`` ``save``/``_finalize``,
``_src/path/atomicity.py``, ``atomicity_defaults.py``, ``temporary_paths.py``, ``deleter.py``) by
running it on JAX 0.10.2 (tests/writers/drivers/orbax.py). One save, on a local path:

1. ``_create_tmp_directory`` removes a leftover ``N.orbax-checkpoint-tmp``, creates it and writes
   ``_CHECKPOINT_METADATA`` (JSON) with ``init_timestamp_nsecs`` and a null commit timestamp.
2. Each item (``default`` for a single pytree) is written into ``<item>.orbax-checkpoint-tmp/``
   (tensorstore OCDBT: ``ocdbt.process_0/``, ``manifest.ocdbt``, ``_METADATA``, ...). With
   ``enable_async_checkpointing`` (the default) ``save`` returns here and a ``save_finalize``
   thread does the rest; without it, ``save`` does it inline.
3. Each item gets its own ``commit_success.txt`` and is renamed to ``<item>/``; then the step:
   ``_CHECKPOINT_METADATA`` is rewritten in place with ``commit_timestamp_nsecs``,
   ``commit_success.txt`` is written, and ``N.orbax-checkpoint-tmp`` is renamed to ``N``, the
   commit (``AtomicRenameTemporaryPath.finalize``).
4. Steps beyond ``max_to_keep`` are then deleted in place (``rmtree``, or a parallel per-file
   delete), or moved into ``<todelete_subdir>/N`` when that option is set.

On ``gs://`` paths, or with ``AtomicityMode.COMMIT_FILE``, ``CommitFileTemporaryPath`` writes the
step under its final name and ``commit_success.txt``, written last, is the commit. Since 0.12.5
the rename mode writes that file too, so a tree where any step has it may be a commit-file tree:
there, a step without it is still being written, unless its ``_CHECKPOINT_METADATA`` recorded
the commit (a step renamed by an Orbax before 0.12.5, or a commit-file save in the instant
between its commit timestamp and its marker). Orbax never saves a step at or below its newest
one (``should_save``), so a tmp directory whose step is not above the newest committed step was
abandoned. Tmp names had a ``-<timestamp>`` or counter suffix before 2025-07.

A step being deleted in place can lose both marker files before its data: in a commit-file
tree it then reads as being written, for the moment until it is gone.
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
        if commit_files and marker is None and commit is None:
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
