"""One module per checkpoint writer, and the auto-detection that picks among them.

Every layout is a pure function from a listing to generations (``base.Found``); ``detect`` asks
each writer how sure it is that a tree is its own and takes the surest.
"""

from __future__ import annotations

from checkpoint_exporter.sources.layouts import (
    dcp,
    deepspeed,
    hf,
    lightning,
    megatron,
    nemo,
    orbax,
    ray,
    torchtitan,
)
from checkpoint_exporter.sources.layouts.base import Found, Layout, Options
from checkpoint_exporter.sources.listing import Dir

REGISTRY: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        torchtitan.LAYOUT,
        megatron.LAYOUT,
        nemo.LAYOUT,
        deepspeed.LAYOUT,
        hf.LAYOUT,
        ray.LAYOUT,
        lightning.LAYOUT,
        orbax.LAYOUT,
        dcp.LAYOUT,
    )
}

# Marker files any layout may need to read, so auto-detection can see them all.
ALL_CONTENT_FILES = frozenset().union(*(layout.content_files for layout in REGISTRY.values()))

# Files whose stat decides a commit and that a writer may replace without touching their
# directory's mtime (rewritten in place, or renamed over): re-statted on every read of their
# directory (listing.TreeReader's marker_names and marker_suffixes). Content files are markers
# too. Per-rank state files (DeepSpeed's ``*_states.pt``, Megatron's ``mp_rank_*``) are not: one
# stat per rank per generation on every read would make the cost O(files); a generation being
# written is re-statted while hot, and inotify reports rewrites of any file.
MARKER_NAMES = ALL_CONTENT_FILES | frozenset(
    {
        ".metadata",  # DCP's commit (renamed from .metadata.tmp)
        "metadata.json",  # Megatron torch_dist
        "trainer_state.json",  # Hugging Face Trainer's last write
        "commit_success.txt",  # Orbax on non-atomic filesystems
        "meta.pt",  # Lightning sharded checkpoints
        "model.safetensors.index.json",  # save_pretrained, torchtitan's HF export
    }
)
MARKER_SUFFIXES = (".ckpt", ".safetensors")  # single-file checkpoints, overwritten in place


def detect(root: Dir) -> str | None:
    """The layout whose writer most surely produced ``root``; None while nothing tells."""
    best, best_score = None, 0
    for name, layout in REGISTRY.items():  # ties go to the earlier, more specific writer
        score = layout.detect(root)
        if score > best_score:
            best, best_score = name, score
    return best


__all__ = [
    "ALL_CONTENT_FILES",
    "MARKER_NAMES",
    "MARKER_SUFFIXES",
    "REGISTRY",
    "Found",
    "Layout",
    "Options",
    "detect",
]
