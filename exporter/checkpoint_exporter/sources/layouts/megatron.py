"""Megatron-LM: ``iter_%07d/`` directories and ``latest_checkpointed_iteration.txt``.

Checked against megatron-core 0.16.1 (pip, with torch 2.13) and Megatron-LM at tag
``core_v0.16.1``, ``megatron/training/checkpointing.py`` ``save_checkpoint`` (the same at its
2026-08 ``main``); the writers tier drives that sequence with the real megatron-core
(tests/writers/drivers/megatron_writer.py).

``save_checkpoint`` with the default ``--ckpt-format torch_dist``, on every rank unless noted:

1. rank 0 ``os.makedirs(iter_NNNNNNN)`` (``ensure_directory_exists``);
2. ``dist_checkpointing.save``: rank 0 ``torch.save``s ``common.pt``; every rank's forked
   writers fill ``__{rank}_{n}.distcp`` (``FileSystemWriterAsync``); the coordinator writes
   ``.metadata.tmp`` and renames it to ``.metadata`` (torch's ``FileSystemWriter.finish``);
   rank 0 writes ``metadata.json`` (``{"sharded_backend": "torch_dist", ...}``, plain
   ``open(..., "w")``), then a barrier. megatron-core after 0.16 (2026-04, with
   ``verify_integrity=True``) then writes ``integrity.json`` (sha256 of every file), checked
   when the job opts in;
3. a barrier; rank 0 rewrites ``latest_checkpointed_iteration.txt`` IN PLACE (``open_file(path,
   "w")``, no temporary file) with the iteration, or ``release``;
4. with ``--save-retain-interval`` only, the previous iteration is ``rmtree``d in a thread unless
   a multiple of the interval. By default Megatron-LM deletes nothing.

With ``--async-save`` steps 2's ``.metadata`` and ``metadata.json`` and step 3 are finalize
functions that run when the training loop finalizes the request: a complete iteration newer
than the tracker is normal until then. ``--ckpt-format torch_dcp`` / ``fsdp_dtensor`` write a
plain DCP directory (``.metadata``, no ``metadata.json`` nor ``common.pt``); the legacy ``torch``
format writes ``mp_rank_XX[_YYY][_ZZZ]/`` with ``distrib_optim.pt`` first (distributed
optimizer), then ``model_optim_rng.pt`` (``torch.save``, not atomic). ``release/`` is a converted
checkpoint. Megatron-LM resumes from the tracker's iteration only (``read_metadata``), and a
torch_dist directory without ``metadata.json`` does not load ("not a distributed checkpoint").

So: an iteration is committed once complete and reached by the tracker (its commit time is the
tracker's mtime when the tracker names it); complete but newer than the tracker, it is being
finalized (writing); incomplete at or below the tracker, it will never finish (aborted). Without
a tracker (none yet, or one being rewritten: an empty read), completeness alone decides.
"""

from __future__ import annotations

import re

import checkpoint_exporter.sources.layouts.dcp as dcp
from checkpoint_exporter.sources.layouts.base import (
    ABORTED,
    COMMITTED,
    DCP,
    INTEGRITY,
    WRITING,
    ZIP,
    Check,
    Found,
    Layout,
    Options,
    generation,
    join,
    zip_checks,
)
from checkpoint_exporter.sources.listing import Dir
from checkpoint_exporter.sources.untrusted import step_digits

NAME = "megatron"
TRACKER = "latest_checkpointed_iteration.txt"
CONFIG = "metadata.json"  # megatron-core's CONFIG_FNAME, written after .metadata
COMMON = "common.pt"  # megatron-core's COMMON_STATE_FNAME, torch_dist only
INTEGRITY_FILE = "integrity.json"
LEGACY_FILE = "model_optim_rng.pt"  # the legacy format's last write in each mp_rank directory
RELEASE = "release"
_ITERATION = re.compile(r"iter_(\d{7,})")
_LEGACY_RANK = re.compile(r"mp_rank_\d+.*")

LEGACY, TORCH_DIST, PLAIN_DCP = "torch", "torch_dist", "torch_dcp"


def tracked_iteration(root: Dir) -> int | str | None:
    """The tracker's value: an iteration, ``release``, or None (absent, empty, unreadable, or
    an iteration past 2**53)."""
    content = root.contents.get(TRACKER)
    if content is None:
        return None
    text = content.decode("utf-8", "replace").strip()
    if text == RELEASE:
        return RELEASE
    return step_digits(text)


def _format(listing: Dir, torch_dist_run: bool) -> str:
    """The iteration's ``--ckpt-format`` family, from its own files or its siblings'."""
    if any(_LEGACY_RANK.fullmatch(name) for name, _ in listing.dirs()) and not dcp.is_checkpoint(
        listing
    ):
        return LEGACY
    if torch_dist_run or listing.has_file(CONFIG) or listing.has_file(COMMON):
        return TORCH_DIST
    return PLAIN_DCP


def _completed_at(listing: Dir, kind: str) -> float | None:
    """When the iteration's own last write landed, or None while it is incomplete."""
    if kind == LEGACY:
        ranks = [child for name, child in listing.dirs() if _LEGACY_RANK.fullmatch(name)]
        if all(rank.has_file(LEGACY_FILE) for rank in ranks):
            return listing.totals().max_mtime
        return None
    committed_at = dcp.commit_time(listing)
    if committed_at is None:
        return None
    if kind == PLAIN_DCP:
        return committed_at
    config = listing.file(CONFIG)
    return None if config is None else max(config[1], committed_at)


def detect(root: Dir) -> int:
    if root.has_file(TRACKER):
        return 95
    return 85 if any(_ITERATION.fullmatch(name) for name, _ in root.dirs()) else 0


def parse(root: Dir, options: Options) -> list[Found]:
    tracked = tracked_iteration(root)
    tracker_file = root.file(TRACKER)
    iterations = [
        (name, child, _ITERATION.fullmatch(name))
        for name, child in root.dirs()
        if name == RELEASE or _ITERATION.fullmatch(name)
    ]
    # One run writes one format: an iteration still without metadata.json is torch_dist when
    # its siblings have one (newer megatron-core writes no common.pt).
    torch_dist_run = any(child.has_file(CONFIG) for _, child, _ in iterations)
    found = []
    for name, child, match in iterations:
        step = step_digits(match.group(1)) if match else None
        kind = _format(child, torch_dist_run)
        completed_at = _completed_at(child, kind)
        if match is None:  # release: converted once, before any tracker that names an iteration
            reached = tracked is not None
        else:  # an iteration past 2**53 (step unknown) is beyond any tracker's
            reached = not isinstance(tracked, int) or (step is not None and step <= tracked)
        if completed_at is not None and reached:
            if tracker_file is not None and step is not None and step == tracked:
                completed_at = max(completed_at, tracker_file[1])  # the tracker is last
            checks = _checks(name, child, kind, options)
            found.append(generation(name, child, step, COMMITTED, completed_at, checks=checks))
        elif completed_at is None and reached and tracked is not None:
            reason = f"incomplete, and the tracker moved on to iteration {tracked}"
            found.append(generation(name, child, step, ABORTED, reason=reason))
        else:
            found.append(generation(name, child, step, WRITING))
    return found


def _checks(name: str, listing: Dir, kind: str, options: Options) -> tuple[Check, ...]:
    if kind == LEGACY:
        return zip_checks(listing, name, (".pt",))
    checks = [Check(DCP, name)]
    if listing.has_file(COMMON):
        checks.append(Check(ZIP, join(name, COMMON)))  # loaded first by dist_checkpointing.load
    if options.verify_checksums and listing.has_file(INTEGRITY_FILE):
        checks.append(Check(INTEGRITY, name))
    return tuple(checks)


LAYOUT = Layout(NAME, detect, parse, frozenset({TRACKER}))
