"""What a layout returns: the generations found in one listing, and helpers shared by layouts.

A layout is a pure function of a ``listing.Dir`` tree (names, sizes, mtimes and the contents of
a few small marker files): no I/O, so every writer's rules are testable from fixture trees.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from checkpoint_exporter.model import (  # noqa: F401 - re-exported for the layouts
    ABORTED,
    COMMITTED,
    DCP,
    INTEGRITY,
    SAFETENSORS,
    SAFETENSORS_INDEX,
    WRITING,
    ZIP,
    ZIP_STEP,
    Check,
    Found,
)
from checkpoint_exporter.sources.listing import Dir
from checkpoint_exporter.sources.untrusted import step_digits


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
    uploading: bool = False,
) -> Found:
    """A generation that is one file. Its appearance proves nothing (a move across filesystems
    is a copy that grows in place), so it settles: judged once its size and mtime stay still.
    One the store reports still uploading (``Dir.uploading``) is a save in progress however
    still it stands: object storage shows a key's object only once whole."""
    return Found(id, step, WRITING, mtime, mtime, None, size, 1, checks, settles=not uploading)


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
