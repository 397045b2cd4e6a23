"""Structural validation of a generation kept in object storage: its listing's sizes, and DCP's
metadata against its shards.

There is no file to open: what a check reads is fetched by a bounded ranged GET (``fetch``: one
request, counted as the job's). DCP's ``.metadata`` is parsed by the same allowlisted reader as on
a filesystem (in the daemon, in its memory-capped worker, handed the bytes in an anonymous
memory file), then every shard it names must be listed and long enough. The checks that need
more of a file's contents (zip trailers, safetensors headers, checksums) are not run here, and
the verdict says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

import checkpoint_exporter.sources.layouts.dcp as dcp_layout
from checkpoint_exporter.model import (
    BAD_METADATA,
    DCP,
    MISSING_SHARD,
    TRUNCATED_SHARD,
    Check,
    Verdict,
)
from checkpoint_exporter.sources import dcp_metadata
from checkpoint_exporter.sources.listing import Dir
from checkpoint_exporter.sources.object_store import StoreError
from checkpoint_exporter.sources.untrusted import excerpt

# fetch(path below the tier's prefix, at most this many bytes) -> the object's first bytes.
Fetch = Callable[[str, int], bytes]


def validate_listing(
    checks: Sequence[Check],
    tree: Dir | None,
    fetch: Fetch | None = None,
    metadata_bytes: int = dcp_metadata.DEFAULT_SIZE_LIMIT,
    parser: dcp_metadata.IsolatedParser | None = None,
) -> Verdict:
    """Each checked path is listed and a checked file is not empty; with ``fetch``, a DCP
    generation's metadata is read and each shard it names is as long as it says."""
    if tree is None:
        return Verdict(False, None, "not checked: no listing", unchecked=True)
    unchecked = set()
    for check in checks:
        parent, _, name = check.path.rpartition("/")
        directory = tree.directory_of(parent) if parent else tree
        is_dir = directory is not None and name in directory.subdirs
        if is_dir and check.kind == DCP and fetch is not None:
            generation = tree.directory_of(check.path)
            assert generation is not None
            verdict = _dcp(check.path, generation, fetch, metadata_bytes, parser)
            if verdict is not None:
                return verdict
            continue
        unchecked.add(check.kind)
        if check.path in ("", ".") or is_dir:
            continue
        listed = directory.file(name) if directory is not None else None
        if listed is None:
            return Verdict(False, MISSING_SHARD, f"{check.path} is not in the listing")
        if listed[0] == 0:
            return Verdict(False, TRUNCATED_SHARD, f"{check.path} is an empty object")
    kinds = ", ".join(sorted(unchecked))
    detail = f"object storage: listed sizes only, content checks not run ({kinds})"
    return Verdict(True, detail=detail if unchecked else "")


def _dcp(
    path: str,
    generation: Dir,
    fetch: Fetch,
    limit: int,
    parser: dcp_metadata.IsolatedParser | None,
) -> Verdict | None:
    """DCP's metadata against the listed shards: None when they agree, else the verdict."""
    for name in dcp_layout.metadata_files(generation) or [dcp_layout.METADATA]:
        try:
            data = fetch(f"{path}/{name}", limit + 1)
            if len(data) > limit:
                raise dcp_metadata.MetadataTooLarge(f"larger than {limit} bytes")
            shards = _parse(data, limit, parser)
        except StoreError as error:
            return Verdict(False, None, f"not checked: {name}: {error}", unchecked=True)
        except dcp_metadata.ParserUnavailable as error:
            return Verdict(False, None, f"not checked: {name}: {error}", unchecked=True)
        except dcp_metadata.MetadataError as error:
            return Verdict(False, BAD_METADATA, f"{name}: {error}")
        for relative, needed in sorted(shards.items()):
            listed = generation.file(relative)
            if listed is None:
                return Verdict(False, MISSING_SHARD, f"{excerpt(relative)} is not in the listing")
            if listed[0] < needed:
                return Verdict(
                    False,
                    TRUNCATED_SHARD,
                    f"{excerpt(relative)} is {listed[0]} bytes, metadata needs {needed}",
                )
    return None


def _parse(
    data: bytes, limit: int, parser: dcp_metadata.IsolatedParser | None
) -> Mapping[str, int]:
    if parser is None:  # a tool (the restore drill): the allowlisted reader, here
        return dcp_metadata.loads(data).shards
    # The worker takes a file descriptor: an anonymous memory file, nothing written to disk.
    fd = os.memfd_create("dcp-metadata", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        return parser.parse(fd, limit).shards
    finally:
        os.close(fd)
