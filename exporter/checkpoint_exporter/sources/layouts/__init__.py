"""One module per checkpoint writer, and the auto-detection that picks among them.

Every layout is a pure function from a listing to generations (``base.Found``); ``identify``
asks each writer how sure it is that a tree is its own and takes the surest among those that find
a checkpoint there that lasts.
"""

from __future__ import annotations

from checkpoint_exporter.sources.layouts import (
    accelerate,
    dcp,
    deepspeed,
    hf,
    lightning,
    megatron,
    nemo,
    orbax,
    ray,
    torchsave,
    torchtitan,
)
from checkpoint_exporter.sources.layouts.base import COMMITTED, Found, Layout, Options
from checkpoint_exporter.sources.listing import Dir

REGISTRY: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        torchtitan.LAYOUT,
        megatron.LAYOUT,
        nemo.LAYOUT,
        deepspeed.LAYOUT,
        accelerate.LAYOUT,
        hf.LAYOUT,
        ray.LAYOUT,
        lightning.LAYOUT,
        torchsave.LAYOUT,
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
        # Accelerate's main process rewrites it at every save_state into a directory that
        # exists, where ``torch.save`` truncates files in place (no new name, no mtime of the
        # directory moved): the one file of such a rewrite a poll is sure to see.
        "random_states_0.pkl",
    }
)
# Markers a writer creates when a save starts, not when it commits: in object storage they do
# not seal a generation (objects.ObjectTreeReader's opening_markers), since a killed save keeps
# them and a resumed job writes the same name again (Orbax on gs://, commit-file mode).
OPENING_MARKERS = frozenset({orbax.METADATA})
# Single-file checkpoints, overwritten in place; NeMo's ``-unfinished`` markers, whose mtime
# against the file's tells a save from a removal (lightning.py), touched again where they stand.
MARKER_SUFFIXES = (".ckpt", ".safetensors", lightning.UNFINISHED)
# Markers in a tier's root only: torch.save files written in place under their final name, and
# their temporary names (``.pt`` at any depth would make every rank's states file a marker).
ROOT_MARKER = torchsave.is_root_marker


def identify(root: Dir, options: Options) -> tuple[str | None, list[Found]]:
    """The layout whose writer most surely produced ``root``, and the generations it finds there;
    (None, []) while nothing tells.

    A writer's score says how specific its signs are, and the surest decides. But a sign may be
    a file that lives only while a save runs (a temporary directory, a marker of a save in
    progress), and the surest layout may then find no generation that lasts (committed, or
    judged by stillness) where another finds some it does not see at all: it would hide them.
    Then the surest among the layouts that find such a generation wins instead, so a save in
    progress cannot flip a job's layout and hide its checkpoints. A generation the surest
    layout sees too, as a save in progress, is no such evidence: that is a less strict reading
    of the same save (DCP's ``.metadata`` in Lightning's sharded ``.ckpt`` before its
    ``meta.pt``, in Megatron's ``iter_N`` before its tracker file, in Ray's upload before the
    snapshot names it), and taking it would count the save twice, once when the generic layout
    commits it and again when the writer's own layout takes the tree back. Ties go to the
    earlier, more specific writer."""
    scores = ((layout.detect(root), name) for name, layout in REGISTRY.items())
    ranked = [(score, name) for score, name in scores if score > 0]
    if not ranked:
        return None, []
    ranked.sort(key=lambda candidate: -candidate[0])  # stable: registry order among ties
    name = ranked[0][1]
    found = REGISTRY[name].parse(root, options)
    if any(_lasts(item) for item in found):
        return name, found  # the common case: one parse
    seen = {item.id for item in found}
    for _, other in ranked[1:]:
        other_found = REGISTRY[other].parse(root, options)
        if any(_lasts(item) and item.id not in seen for item in other_found):
            return other, other_found
    return name, found


def _lasts(found: Found) -> bool:
    return found.state == COMMITTED or found.settles


def detect(root: Dir) -> str | None:
    """The layout ``identify`` picks for ``root``."""
    return identify(root, Options())[0]


__all__ = [
    "ALL_CONTENT_FILES",
    "MARKER_NAMES",
    "MARKER_SUFFIXES",
    "REGISTRY",
    "ROOT_MARKER",
    "Found",
    "Layout",
    "Options",
    "detect",
    "identify",
]
