"""Megatron-LM: ``iter_%07d/`` directories and ``latest_checkpointed_iteration.txt``.

The default ``torch_dist`` format is a DCP directory plus ``metadata.json``, written only once
the checkpoint is complete; the legacy format holds ``mp_rank_*/model_optim_rng.pt``. Rank 0
rewrites the tracker file last of all, so an iteration is committed once it is complete and the
tracker has reached it. An incomplete iteration older than the tracker will never finish.
"""

from __future__ import annotations

import re

from checkpoint_exporter.layouts import dcp
from checkpoint_exporter.layouts.base import (
    ABORTED,
    COMMITTED,
    DCP,
    INTEGRITY,
    WRITING,
    Check,
    Found,
    Layout,
    Options,
    generation,
    zip_checks,
)
from checkpoint_exporter.listing import Dir
from checkpoint_exporter.untrusted import decimal

NAME = "megatron"
TRACKER = "latest_checkpointed_iteration.txt"
CONFIG = "metadata.json"
INTEGRITY_FILE = "integrity.json"
RELEASE = "release"
_ITERATION = re.compile(r"iter_(\d{7,})")
_LEGACY_RANK = re.compile(r"mp_rank_\d+.*")


def tracked_iteration(root: Dir) -> int | str | None:
    """The tracker's value: an iteration, ``release``, or None (absent or unreadable)."""
    content = root.contents.get(TRACKER)
    if content is None:
        return None
    text = content.decode("utf-8", "replace").strip()
    if text == RELEASE:
        return RELEASE
    return decimal(text)


def _complete(listing: Dir) -> tuple[bool, float | None, bool]:
    """(complete, completion time, is torch_dist) for one iteration directory."""
    ranks = [child for name, child in listing.dirs() if _LEGACY_RANK.fullmatch(name)]
    if ranks and not dcp.is_checkpoint(listing):
        complete = all(any(n.endswith(".pt") for n, _, _, _ in r.entries()) for r in ranks)
        return complete, listing.totals().max_mtime, False
    config = listing.file(CONFIG)
    committed_at = dcp.commit_time(listing)
    if config is None or committed_at is None:
        return False, None, True
    return True, max(config[1], committed_at), True


def detect(root: Dir) -> int:
    if root.has_file(TRACKER):
        return 95
    return 85 if any(_ITERATION.fullmatch(name) for name, _ in root.dirs()) else 0


def parse(root: Dir, options: Options) -> list[Found]:
    tracked = tracked_iteration(root)
    tracker_file = root.file(TRACKER)
    found = []
    for name, child in root.dirs():
        match = _ITERATION.fullmatch(name)
        if match is None and name != RELEASE:
            continue
        step = int(match.group(1)) if match else None
        complete, completed_at, torch_dist = _complete(child)
        reached = tracked is None or (
            tracked == RELEASE if step is None else isinstance(tracked, int) and step <= tracked
        )
        if complete and reached:
            if tracker_file is not None and step is not None and step == tracked:
                completed_at = max(completed_at or 0.0, tracker_file[1])  # the tracker is last
            checks = _checks(name, child, torch_dist, options)
            found.append(generation(name, child, step, COMMITTED, completed_at, checks=checks))
        elif not complete and reached and tracked is not None:
            reason = f"incomplete, and the tracker moved on to iteration {tracked}"
            found.append(generation(name, child, step, ABORTED, reason=reason))
        else:
            found.append(generation(name, child, step, WRITING))
    return found


def _checks(name: str, listing: Dir, torch_dist: bool, options: Options) -> tuple[Check, ...]:
    if not torch_dist:
        return zip_checks(listing, name, (".pt",))
    checks = [Check(DCP, name, listing)]
    if options.verify_checksums and listing.has_file(INTEGRITY_FILE):
        checks.append(Check(INTEGRITY, name, listing))
    return tuple(checks)


LAYOUT = Layout(NAME, detect, parse, frozenset({TRACKER}))
