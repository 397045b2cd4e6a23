"""Build checkpoint trees on disk exactly as each writer lays them out, with chosen mtimes."""

from __future__ import annotations

import os
from pathlib import Path

from checkpoint_exporter.layouts import REGISTRY, Options, detect
from checkpoint_exporter.layouts.base import Found
from checkpoint_exporter.listing import OpsBudget, TreeReader

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
    from checkpoint_exporter.layouts import ALL_CONTENT_FILES

    return ALL_CONTENT_FILES
