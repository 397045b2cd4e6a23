"""One module per checkpoint writer, and the auto-detection that picks among them.

Every layout is a pure function from a listing to generations (``base.Found``); ``detect`` asks
each writer how sure it is that a tree is its own and takes the surest.
"""

from __future__ import annotations

from checkpoint_exporter.layouts import (
    dcp,
    deepspeed,
    hf,
    lightning,
    megatron,
    nemo,
    orbax,
    torchtitan,
)
from checkpoint_exporter.layouts.base import Found, Layout, Options
from checkpoint_exporter.listing import Dir

REGISTRY: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        torchtitan.LAYOUT,
        megatron.LAYOUT,
        nemo.LAYOUT,
        deepspeed.LAYOUT,
        hf.LAYOUT,
        lightning.LAYOUT,
        orbax.LAYOUT,
        dcp.LAYOUT,
    )
}

# Marker files any layout may need to read, so auto-detection can see them all.
ALL_CONTENT_FILES = frozenset().union(*(layout.content_files for layout in REGISTRY.values()))


def detect(root: Dir) -> str | None:
    """The layout whose writer most surely produced ``root``; None while nothing tells."""
    best, best_score = None, 0
    for name, layout in REGISTRY.items():  # ties go to the earlier, more specific writer
        score = layout.detect(root)
        if score > best_score:
            best, best_score = name, score
    return best


__all__ = ["ALL_CONTENT_FILES", "REGISTRY", "Found", "Layout", "Options", "detect"]
