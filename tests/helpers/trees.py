"""Build checkpoint trees on disk exactly as each writer lays them out, with chosen mtimes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from checkpoint_exporter.sources.layouts import REGISTRY, Options, detect
from checkpoint_exporter.sources.layouts.base import Found
from checkpoint_exporter.sources.listing import OpsBudget, TreeReader

BASE = 1_800_000_000.0  # a fixed wall-clock origin for mtimes


def build(root: Path, files: dict[str, bytes | int | str], mtime: float | None = None) -> None:
    """Create files below ``root``: bytes are content, an int is a size, a str ending in '/'
    makes a directory, any other str is a symlink target (``"->target"``)."""
    for relative, spec in files.items():
        path = root / relative
        if relative.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(spec, str) and spec.startswith("->"):
            path.symlink_to(spec[2:])
            continue
        data = (
            spec
            if isinstance(spec, bytes)
            else b"\0" * spec
            if isinstance(spec, int)
            else spec.encode()
        )
        path.write_bytes(data)
        if mtime is not None:
            os.utime(path, (mtime, mtime))


def touch(path: Path, mtime: float) -> None:
    os.utime(path, (mtime, mtime), follow_symlinks=False)


def daemon_reader(root: Path) -> TreeReader:
    """A TreeReader with the markers the daemon gives every tier (daemon/scanner.py)."""
    from checkpoint_exporter.sources import layouts

    return TreeReader(
        root,
        OpsBudget(),
        layouts.ALL_CONTENT_FILES,
        marker_names=layouts.MARKER_NAMES,
        marker_suffixes=layouts.MARKER_SUFFIXES,
        root_marker=layouts.ROOT_MARKER,
    )


def scan(
    root: Path, layout: str | None = None, verify_checksums: bool = False
) -> tuple[str, dict[str, Found]]:
    """Read ``root`` as the exporter does and parse it; returns (layout, generations by id)."""
    reader = TreeReader(root, OpsBudget(), _content_files())
    tree, _ = reader.read()
    assert tree is not None
    name = layout or detect(tree)
    assert name is not None, "no layout recognised"
    found = REGISTRY[name].parse(tree, Options(verify_checksums=verify_checksums))
    return name, {item.id: item for item in found}


def _content_files() -> frozenset[str]:
    from checkpoint_exporter.sources.layouts import ALL_CONTENT_FILES

    return ALL_CONTENT_FILES


def dcp_generation(directory: Path, shards: int = 2, shard_bytes: int = 16) -> None:
    """A committed DCP generation whose .metadata (a real torch pickle) names its shards."""
    directory.mkdir(parents=True)
    for index in range(shards):
        (directory / f"__{index}_0.distcp").write_bytes(b"\0" * shard_bytes)
    (directory / ".metadata").write_bytes(dcp_metadata_bytes(shards, shard_bytes))


_METADATA_CACHE: dict[tuple[int, int], bytes] = {}


def dcp_metadata_bytes(shards: int, shard_bytes: int) -> bytes:
    if (shards, shard_bytes) not in _METADATA_CACHE:
        code = f"""
import pickle, sys, warnings
warnings.filterwarnings("ignore")
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, BytesStorageMetadata
from torch.distributed.checkpoint.filesystem import _StorageInfo
items = {{f"item{{i}}": BytesStorageMetadata() for i in range({shards})}}
storage = {{MetadataIndex(f"item{{i}}"): _StorageInfo(f"__{{i}}_0.distcp", 0, {shard_bytes})
            for i in range({shards})}}
sys.stdout.buffer.write(pickle.dumps(Metadata(state_dict_metadata=items, storage_data=storage)))
"""
        _METADATA_CACHE[(shards, shard_bytes)] = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, check=True, timeout=300
        ).stdout
    return _METADATA_CACHE[(shards, shard_bytes)]
