"""What a layout returns: the generations found in one listing, and helpers shared by layouts.

A layout is a pure function of a ``listing.Dir`` tree (names, sizes, mtimes and the contents of
a few small marker files): no I/O, so every writer's rules are testable from fixture trees.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from checkpoint_exporter.model import ABORTED, COMMITTED, WRITING  # noqa: F401 - re-exported
from checkpoint_exporter.sources.listing import Dir
from checkpoint_exporter.sources.untrusted import step_digits

# Check kinds the validator knows (validate.py); each names a path below the tier root.
DCP = "dcp"  # .metadata against the shards it names
ZIP = "zip"  # torch.save zip: end-of-central-directory record present
SAFETENSORS = "safetensors"  # header parses and its data fits in the file
SAFETENSORS_INDEX = "safetensors_index"  # every shard the index names exists
INTEGRITY = "integrity"  # Megatron integrity.json sha256, when the job opts in
# The zip check, and the ``global_step`` read inside the zip (returned as Verdict.step): for a
# file whose name has no step (Lightning's last.ckpt).
ZIP_STEP = "zip_step"


@dataclass(frozen=True, eq=False)
class Check:
    kind: str
    path: str  # relative to the tier root
    listing: Dir | None = None  # the directory holding what is checked, for sizes


@dataclass(frozen=True, eq=False)
class Found:
    """One generation as a layout sees it in one listing."""

    id: str  # path of the generation below the tier root
    step: int | None
    state: str  # writing | committed | aborted
    start_time: float  # earliest mtime seen (or the writer's own record)
    last_write_time: float
    commit_time: float | None
    bytes: int
    files: int
    checks: tuple[Check, ...] = ()
    alias: bool = False  # another name for a listed generation: not counted or restored twice
    reason: str | None = None  # why aborted, or why structurally invalid (e.g. bad_metadata)
    invalid: bool = False  # the layout itself found it structurally broken
    # No commit marker in the writer's protocol (a single-file checkpoint, DeepSpeed without
    # `latest`): the layout says WRITING, and the tracker judges the generation once it stayed
    # unchanged for the job's settle period: committed when its checks pass (or it has none),
    # aborted when they fail (a copy or a write cut short).
    settles: bool = False


@dataclass(frozen=True)
class Options:
    verify_checksums: bool = False


@dataclass(frozen=True)
class Layout:
    name: str
    detect: Callable[[Dir], int]  # confidence 0..100 that the tree is this writer's
    parse: Callable[[Dir, Options], list[Found]]
    content_files: frozenset[str] = field(default_factory=frozenset)  # markers to read


_TRAILING_NUMBER = re.compile(r"(\d+)$")


def trailing_step(name: str) -> int | None:
    """``step-100``, ``global_step100``, ``iter_0000100``, ``100`` -> 100 (None past 2**53)."""
    match = _TRAILING_NUMBER.search(name)
    return step_digits(match.group(1)) if match else None


def join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def generation(
    id: str,
    listing: Dir,
    step: int | None,
    state: str,
    commit_time: float | None = None,
    **extra: object,
) -> Found:
    """A Found for a generation directory, with times and sizes from its whole subtree."""
    totals = listing.totals()
    start = min(totals.min_mtime, listing.mtime) if totals.files else listing.mtime
    last = max(totals.max_mtime, listing.mtime)
    if commit_time is not None:
        last = max(last, commit_time)
    return Found(
        id=id,
        step=step,
        state=state,
        start_time=start,
        last_write_time=last,
        commit_time=commit_time if state == COMMITTED else None,
        bytes=totals.bytes,
        files=totals.files,
        **extra,  # type: ignore[arg-type]
    )


def file_generation(
    id: str,
    size: int,
    mtime: float,
    step: int | None,
    checks: tuple[Check, ...] = (),
    alias: bool = False,
) -> Found:
    """A generation that is one file. Its appearance proves nothing (a move across filesystems
    is a copy that grows in place), so it settles: judged once its size and mtime stay still."""
    return Found(id, step, WRITING, mtime, mtime, None, size, 1, checks, alias, settles=True)


def settling_generation(id: str, listing: Dir, step: int | None, **extra: object) -> Found:
    """A generation directory without a commit marker, judged once still (see ``settles``)."""
    return generation(id, listing, step, WRITING, settles=True, **extra)


def zip_checks(listing: Dir, prefix: str, suffixes: tuple[str, ...]) -> tuple[Check, ...]:
    """One zip check per torch.save file below ``listing`` whose name ends in ``suffixes``."""
    return tuple(
        Check(ZIP, join(prefix, relative))
        for relative, _, _ in listing.walk()
        if relative.endswith(suffixes)
    )
