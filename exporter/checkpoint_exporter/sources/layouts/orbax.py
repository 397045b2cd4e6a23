"""Orbax ``CheckpointManager``: step directories ``<prefix_>?N/`` below the job's directory.

Checked against orbax-checkpoint 0.12.8 (``checkpoint_manager.py`` ``save``/``_finalize``,
``_src/path/atomicity.py``, ``atomicity_defaults.py``, ``temporary_paths.py``, ``deleter.py``) by
running it on JAX 0.10.2 (tests/writers/drivers/orbax_writer.py). One save, on a local path:

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
step under its final name (``_CHECKPOINT_METADATA`` right after its ``mkdir``, its commit
timestamp null) and ``commit_success.txt``, written last, is the commit. Orbax 0.12.8 writes that
file in rename mode too (a change made after 0.12.4). Run on ``gs://`` (gcp-storage-emulator,
tensorstore 0.1.86 and gcsfs: tests/writers/drivers/orbax_gcs_writer.py), each item is written
under its final name too, ``N/default/`` with its own ``commit_success.txt``, before the step's
metadata gets its commit timestamp and the step its ``commit_success.txt``; retention deletes a
step's objects one by one, in no set order; a killed save's ``N/`` stays as it was, and the
resumed job saving step N again deletes it and writes it anew under the same name (which is why
``_CHECKPOINT_METADATA`` seals no generation in object storage: layouts.OPENING_MARKERS). A step
under its final name is judged:

- ``commit_success.txt``, or a commit timestamp in ``_CHECKPOINT_METADATA``: committed (the
  timestamp is written just before the marker and the rename, after every item's data);
- a ``_CHECKPOINT_METADATA`` whose commit timestamp is null, or that does not parse (it is
  written in place): a commit-file save being written;
- in a tree where some step has ``commit_success.txt``, a step with content but no metadata at
  all is being deleted (``rmtree`` can take both markers before the data): still committed;
- otherwise (no commit file anywhere, an Orbax that recorded no commit timestamp): the name
  is the commit, as Orbax's own reader (``temporary_paths.is_path_finalized``) has it on a
  local path.

An empty step directory is no generation: a deleted step in its last instant, or a commit-file
step between its ``mkdir`` and its metadata. Orbax never saves a step at or below its newest
(``should_save``), and it serializes saves (``wait_until_finished``), so a tmp directory or an
uncommitted step below the newest committed step was abandoned. Older releases suffixed tmp
names with ``-<timestamp>`` or a counter (checkpoint-layouts.md): the suffix is matched loosely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from checkpoint_exporter.sources.layouts.base import (
    ABORTED,
    COMMITTED,
    WRITING,
    Found,
    Layout,
    Options,
    generation,
)
from checkpoint_exporter.sources.listing import Dir
from checkpoint_exporter.sources.untrusted import INT64_MAX, finite_number, json_value, step_digits

NAME = "orbax"
TMP_SUFFIX = ".orbax-checkpoint-tmp"
COMMIT_FILE = "commit_success.txt"
METADATA = "_CHECKPOINT_METADATA"
_STEP_DIR = re.compile(r"(?:.*_)?(\d+)")
_TMP_STEP = re.compile(r".*?_*?(\d+)\.(?:partial_save\.)?orbax-checkpoint-tmp")


@dataclass(frozen=True)
class _Metadata:
    """What ``_CHECKPOINT_METADATA`` says, in seconds."""

    present: bool = False
    unreadable: bool = False
    init: float | None = None
    commit: float | None = None
    commit_pending: bool = False  # the writer records commits and has not recorded this one


def _metadata(listing: Dir) -> _Metadata:
    content = listing.contents.get(METADATA)
    if content is None:
        # Too large to read, or absent.
        return _Metadata(present=listing.has_file(METADATA))
    try:
        data = json_value(content)
    except ValueError:
        return _Metadata(present=True, unreadable=True)
    if not isinstance(data, dict):
        return _Metadata(present=True, unreadable=True)
    init = _seconds(data.get("init_timestamp_nsecs"))
    commit = _seconds(data.get("commit_timestamp_nsecs"))
    return _Metadata(
        present=True,
        init=init,
        commit=commit,
        commit_pending="commit_timestamp_nsecs" in data and data["commit_timestamp_nsecs"] is None,
    )


def _seconds(nanoseconds: object) -> float | None:
    """A timestamp Orbax wrote (``time.time_ns()``): int64 nanoseconds from 0, else none."""
    number = finite_number(nanoseconds)
    return number / 1e9 if number is not None and 0 <= number <= INT64_MAX else None


def _committed(child: Dir, metadata: _Metadata, commit_files: bool) -> bool:
    """Is a step directory under its final name committed? (The module's docstring.)"""
    if child.has_file(COMMIT_FILE) or metadata.commit is not None:
        return True
    if metadata.commit_pending or metadata.unreadable:
        return False  # the metadata says so, or is being written in place
    if commit_files:
        return not metadata.present  # no metadata but content: being deleted
    return True


def detect(root: Dir) -> int:
    for name, child in root.dirs():
        if TMP_SUFFIX in name:
            return 90
        if _STEP_DIR.fullmatch(name) and (METADATA in child.names or COMMIT_FILE in child.names):
            return 90
    return 0


def parse(root: Dir, options: Options) -> list[Found]:
    steps = {
        name: child
        for name, child in root.dirs()
        if TMP_SUFFIX not in name and _STEP_DIR.fullmatch(name) and child.names
    }
    commit_files = any(child.has_file(COMMIT_FILE) for child in steps.values())
    committed: list[Found] = []
    uncommitted: list[tuple[str, Dir, int | None, float | None]] = []
    for name, child in steps.items():
        step = step_digits(_STEP_DIR.fullmatch(name).group(1))  # type: ignore[union-attr]
        metadata = _metadata(child)
        if not _committed(child, metadata, commit_files):
            uncommitted.append((name, child, step, metadata.init))
            continue
        marker = child.file(COMMIT_FILE)
        committed_at = metadata.commit or (marker[1] if marker else child.totals().max_mtime)
        # Committed by its marker: its metadata is never rewritten again, so one that does not
        # parse is broken.
        broken = metadata.unreadable
        gen = generation(
            name, child, step, COMMITTED, committed_at,
            invalid=broken, reason="bad_metadata" if broken else None,
        )  # fmt: skip
        committed.append(_with_start(gen, metadata.init))
    for name, child in root.dirs():
        if TMP_SUFFIX in name:
            match = _TMP_STEP.fullmatch(name) or _TMP_STEP.match(name)
            step = step_digits(match.group(1)) if match else None
            uncommitted.append((name, child, step, _metadata(child).init))
    newest = max((f.step for f in committed if f.step is not None), default=-1)
    found = committed
    for name, child, step, init in uncommitted:
        if step is not None and step <= newest:
            reason = f"left behind: step {newest} committed after it"
            found.append(_with_start(generation(name, child, step, ABORTED, reason=reason), init))
        else:
            found.append(_with_start(generation(name, child, step, WRITING), init))
    return found


def _with_start(found: Found, init: float | None) -> Found:
    return found if init is None else replace(found, start_time=init)


LAYOUT = Layout(NAME, detect, parse, frozenset({METADATA}))
