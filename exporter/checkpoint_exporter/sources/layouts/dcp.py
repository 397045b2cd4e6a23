"""PyTorch Distributed Checkpoint: a directory of ``__{rank}_{n}.distcp`` shards and ``.metadata``.

Rank 0 writes ``.metadata.tmp`` and renames it to ``.metadata`` only after every rank's writes
succeeded, so ``.metadata`` is the commit marker and its mtime the commit time. With
``use_collectives=False`` each rank writes ``__{rank}.metadata`` instead: the generation is
committed when every rank that wrote shards has its own metadata file.
"""

from __future__ import annotations

import re

from checkpoint_exporter.sources.layouts.base import (
    COMMITTED,
    DCP,
    WRITING,
    Check,
    Found,
    Layout,
    Options,
    generation,
    join,
    trailing_step,
)
from checkpoint_exporter.sources.listing import FILE, Dir

NAME = "dcp"
METADATA = ".metadata"
METADATA_TMP = ".metadata.tmp"
_SHARD = re.compile(r"__(\d+)_\d+\.distcp$")
_RANK_METADATA = re.compile(r"__(\d+)\.metadata$")


def is_checkpoint(listing: Dir) -> bool:
    """Does this directory hold a DCP save, finished or not?"""
    return any(
        name in (METADATA, METADATA_TMP)
        or name.endswith(".distcp")
        or _RANK_METADATA.fullmatch(name) is not None
        for name, _, _, _ in listing.entries(FILE)
    )


def commit_time(listing: Dir) -> float | None:
    """When the save committed, or None while it has not."""
    metadata = listing.file(METADATA)
    if metadata is not None:
        return metadata[1]
    shard_ranks: set[str] = set()
    metadata_times: dict[str, float] = {}
    for name, _, _, mtime in listing.entries(FILE):
        if shard := _SHARD.search(name):
            shard_ranks.add(shard.group(1))
        elif rank := _RANK_METADATA.fullmatch(name):
            metadata_times[rank.group(1)] = mtime
    if metadata_times and shard_ranks <= metadata_times.keys():
        return max(metadata_times.values())
    return None


def metadata_files(listing: Dir) -> list[str]:
    if listing.has_file(METADATA):
        return [METADATA]
    return sorted(n for n, _, _, _ in listing.entries(FILE) if _RANK_METADATA.fullmatch(n))


def checkpoint(id: str, listing: Dir, step: int | None) -> Found:
    """A DCP directory as a generation, with its structural check once committed."""
    committed_at = commit_time(listing)
    if committed_at is None:
        return generation(id, listing, step, WRITING)
    return generation(id, listing, step, COMMITTED, committed_at, checks=(Check(DCP, id),))


def detect(root: Dir) -> int:
    if any(is_checkpoint(child) for _, child in root.dirs()):
        return 50  # generic: writers built on DCP (torchtitan, Megatron) score higher
    return 40 if is_checkpoint(root) else 0


def parse(root: Dir, options: Options, prefix: str = "") -> list[Found]:
    found = [
        checkpoint(join(prefix, name), child, trailing_step(name))
        for name, child in root.dirs()
        if is_checkpoint(child)
    ]
    if not found and is_checkpoint(root):
        found.append(checkpoint(prefix or ".", root, None))  # the root itself is one checkpoint
    return found


LAYOUT = Layout(NAME, detect, parse)
