"""Hugging Face transformers: ``Trainer`` checkpoints and ``save_pretrained`` output.

Checked against transformers 5.24.0 with safetensors 0.8.0 and accelerate 1.15.0, by reading
``trainer.py`` (``Trainer._save_checkpoint``, ``save_model``, ``_save``,
``_save_optimizer_and_scheduler``, ``_save_rng_state``), ``trainer_utils.py``
(``rotate_checkpoints``, ``sort_checkpoints``), ``trainer_jit_checkpoint.py``,
``trainer_pt_utils.py`` (``save_metrics``, ``save_state``), ``modeling_utils.py``
(``PreTrainedModel.save_pretrained``, the loader's choice of weights file) and by tracing the
system calls of real saves (tests/writers/drivers/hf_writer.py).

**safetensors 0.8 ``save_file``** (every weights file below) writes a hidden temporary file in
the target directory, ``.tmp`` plus six letters or digits (the Rust ``tempfile`` crate),
``O_EXCL``, mode 0600, ``ftruncate``s it to the final size, writes it, and renames it onto the
target name: a weights file appears whole (and keeps mode 0600: an exporter running as another
user cannot read it). A kill leaves the ``.tmpXXXXXX`` file, full-sized (sparse), next to the
old or missing target. No ``fsync`` anywhere. (Older safetensors wrote the target in place.)

**``save_pretrained(dir)``**, also what ``Trainer.save_model`` calls, in order: ``makedirs``;
``config.json`` and ``generation_config.json`` rewritten in place (``open(path, "w")``); the
deletion of ``model-NNNNN-of-NNNNN.safetensors`` shards a previous save left that this save
does not name (a stale ``model.safetensors`` or index is *not* deleted when the number of
shards changes); one ``model.safetensors``, or shards ``model-0000i-of-0000n.safetensors`` one
after another then ``model.safetensors.index.json`` (in place) last. ``Trainer.save_model``
then adds ``training_args.bin`` (``torch.save``: a zip). Nothing marks the save finished, and
saving into the same directory again rewrites it in place. The loader takes
``model.safetensors`` before the index when both exist.

**``Trainer._save_checkpoint``** writes ``output_dir/checkpoint-{global_step}/`` in place, no
staging directory and no rename: ``save_model`` (above), ``optimizer.pt``, ``scheduler.pt``
(``scaler.pt``), ``rng_state.pth`` (``rng_state_{rank}.pth`` on every rank, with no barrier
before rank 0's next write), then rank 0's ``trainer_state.json`` (``open(path, "w")``): the
last write, so it is the commit marker. Then ``rotate_checkpoints(save_total_limit)`` deletes
the oldest ``checkpoint-*`` directories (by directory mtime, by step when mtimes are within a
second), keeping the newest and the best. The SIGTERM save (``enable_jit_checkpoint``) writes
``checkpoint-N/checkpoint-is-incomplete.txt`` first and removes it after ``trainer_state.json``.
``tmp-checkpoint-N`` staging directories renamed onto ``checkpoint-N`` existed in 4.36-4.38 and
early 2025 only; they are still read as saves in progress.

So:

- ``checkpoint-N`` with ``trainer_state.json`` (and no ``checkpoint-is-incomplete.txt``) is
  committed at that file's mtime; without it, in a tree where any ``checkpoint-N`` has one, or
  holding the Trainer's own files (optimizer, scheduler, rng state; FSDP's and DeepSpeed's
  states), it is writing, and the deadline aborts it when it stops.
- Any other directory holding a saved model (``config.json`` and weights), ``checkpoint-N``
  without Trainer files included, and the tier root itself (generation ``.``, its own files
  only) has no marker: it ``settles``, judged by safetensors header checks of every weights
  file, zip checks of ``.bin``/``.pt``/``.pth`` and the index check (when no single
  ``model.safetensors`` overrides it). A rewrite in place makes it write and settle again.
  It stays writing, never settling, while the save visibly is not done: a ``.tmpXXXXXX`` file
  newest in the directory (a weights write in flight, or killed), a shard set with a shard or
  its index missing, or no weights yet. A ``.tmpXXXXXX`` older than the directory's other files
  is a leftover of an earlier kill that a later save superseded.
- Only ``checkpoint-N`` names carry a step; the root and other directories have none.

Detection: any ``checkpoint-N`` (or ``tmp-checkpoint-*``) directory is the Trainer's (90). A
root or subdirectory holding ``config.json`` with weights scores low (30), so that any other
writer that recognises its tree wins.
"""

from __future__ import annotations

import re
from array import array

from checkpoint_exporter.sources.layouts.base import (
    COMMITTED,
    SAFETENSORS,
    SAFETENSORS_INDEX,
    WRITING,
    ZIP,
    Check,
    Found,
    Layout,
    Options,
    generation,
    join,
    settling_generation,
)
from checkpoint_exporter.sources.listing import FILE, Dir
from checkpoint_exporter.sources.untrusted import step_digits

NAME = "hf"
STATE = "trainer_state.json"
INCOMPLETE = "checkpoint-is-incomplete.txt"
CONFIGS = ("config.json", "adapter_config.json")
ROOT_ID = "."
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_STAGING = re.compile(r"tmp-checkpoint-(.+)")
_TEMPORARY = re.compile(r"\.tmp[A-Za-z0-9]{6}")  # safetensors' save_file, before its rename
_SHARD = re.compile(r"(.+)-(\d{5})-of-(\d{5})\.safetensors")
_TORCH_SAVE = (".pt", ".pth", ".bin")
# Written only by Trainer._save_checkpoint, never by save_pretrained or save_model: optimizer.pt,
# scheduler.pt, scaler.pt, rng_state[_R].pth; FSDP's pytorch_model_fsdp*, optimizer*.bin or
# optimizer_N/ (accelerate's save_fsdp_model/optimizer); DeepSpeed's global_stepN/.
_TRAINER_PREFIXES = (
    "optimizer",
    "scheduler.pt",
    "scaler.pt",
    "rng_state",
    "pytorch_model_fsdp",
    "global_step",
)
# Written into a Trainer's output_dir next to a final save_model, but not by it (save_state,
# save_metrics): not part of the root's saved model.
_NOT_MODEL = re.compile(r"trainer_state\.json|\w+_results\.json")
TRAINER_SCORE, MODEL_SCORE = 90, 30


def detect(root: Dir) -> int:
    if any(_CHECKPOINT.fullmatch(n) or _STAGING.fullmatch(n) for n in root.subdirs):
        return TRAINER_SCORE
    if holds_model(root) or any(holds_model(child) for _, child in root.dirs()):
        return MODEL_SCORE
    return 0


def parse(root: Dir, options: Options) -> list[Found]:
    trainer_tree = any(
        child.has_file(STATE) for name, child in root.dirs() if _CHECKPOINT.fullmatch(name)
    )
    found = []
    for name, child in root.dirs():
        if staging := _STAGING.fullmatch(name):
            step = step_digits(staging.group(1))
            found.append(generation(name, child, step, WRITING))
        elif match := _CHECKPOINT.fullmatch(name):
            found.append(checkpoint(name, child, step_digits(match.group(1)), trainer_tree))
        elif holds_model(child):
            found.append(saved_model(name, child, None))
    if holds_model(root):
        found.append(saved_model(ROOT_ID, _model_files(root), None, prefix=""))
    return found


def checkpoint(name: str, listing: Dir, step: int | None, trainer_tree: bool) -> Found:
    """A ``checkpoint-N`` directory: the Trainer's (marker) or save_pretrained's (settles)."""
    state = listing.file(STATE)
    if state is not None and not listing.has_file(INCOMPLETE):
        return generation(name, listing, step, COMMITTED, state[1], checks=checks(listing, name))
    if state is not None or trainer_tree or listing.has_file(INCOMPLETE) or _trainer_files(listing):
        return generation(name, listing, step, WRITING)  # the marker is still to come
    return saved_model(name, listing, step)


def saved_model(id: str, listing: Dir, step: int | None, prefix: str | None = None) -> Found:
    """save_pretrained output: no marker, so it settles once its weights look whole.
    ``prefix`` is the listing's path below the tier root (``id`` unless that is the root)."""
    if write_in_flight(listing) or not weights_complete(listing):
        return generation(id, listing, step, WRITING)
    return settling_generation(
        id, listing, step, checks=checks(listing, id if prefix is None else prefix)
    )


def holds_model(listing: Dir) -> bool:
    """``config.json`` (or a PEFT adapter's) with weights, or with a weights write under way."""
    if not any(listing.has_file(name) for name in CONFIGS):
        return False
    return any(
        _is_weights(name) or _is_index(name) or _TEMPORARY.fullmatch(name)
        for name, _, _, _ in listing.entries(FILE)
    )


def write_in_flight(listing: Dir) -> bool:
    """A safetensors temporary file as new as anything here: the write now (or when killed).

    One older than another file is a leftover a later save went past (its rename never came,
    and nothing deletes it)."""
    temporary = [mtime for name, _, _, mtime in listing.entries(FILE) if _TEMPORARY.fullmatch(name)]
    if not temporary:
        return False
    others = [
        mtime for name, _, _, mtime in listing.entries(FILE) if not _TEMPORARY.fullmatch(name)
    ]
    return max(temporary) >= max(others, default=0.0)


def weights_complete(listing: Dir) -> bool:
    """Weights present, and every shard set whole with its index (written after the shards)."""
    names = {name for name, _, _, _ in listing.entries(FILE)}
    sets: dict[tuple[str, int], set[int]] = {}
    for name in names:
        if shard := _SHARD.fullmatch(name):
            key = (shard.group(1), int(shard.group(3)))
            sets.setdefault(key, set()).add(int(shard.group(2)))
    for (_, total), present in sets.items():
        if present != set(range(1, total + 1)) or not any(_is_index(name) for name in names):
            return False
    return bool(sets) or any(_is_weights(name) for name in names)


def checks(listing: Dir, prefix: str) -> tuple[Check, ...]:
    """Header checks of every weights file below, zip checks of torch.save files, and each
    index a loader would read (one beside a ``model.safetensors`` is ignored by loaders)."""
    found: list[Check] = []
    _collect(listing, prefix, found)
    return tuple(found)


def _collect(listing: Dir, prefix: str, found: list[Check]) -> None:
    names = {name for name, _, _, _ in listing.entries(FILE)}
    for name in sorted(names):
        path = join(prefix, name)
        if name.endswith(".safetensors"):
            found.append(Check(SAFETENSORS, path))
        elif name.endswith(_TORCH_SAVE):
            found.append(Check(ZIP, path))
        elif _is_index(name) and name.removesuffix(".index.json") not in names:
            found.append(Check(SAFETENSORS_INDEX, path))
    for name, child in listing.dirs():
        _collect(child, join(prefix, name), found)


def _is_index(name: str) -> bool:
    """``model.safetensors.index.json``, or a variant's ``model.safetensors.index.fp16.json``."""
    return ".safetensors.index." in name and name.endswith(".json")


def _is_weights(name: str) -> bool:
    return name.endswith(".safetensors") or (
        name.startswith("pytorch_model") and name.endswith(".bin")
    )


def _trainer_files(listing: Dir) -> bool:
    return any(name.startswith(_TRAINER_PREFIXES) for name in listing.names)


def _model_files(root: Dir) -> Dir:
    """The root's own files as a listing of their own: the checkpoints below it, the results
    and state a Trainer writes beside a final save_model, and the directory's mtime (moved by
    every checkpoint made or rotated) are no part of the saved model."""
    keep = [
        i
        for i, name in enumerate(root.names)
        if root.kinds[i] == FILE and not _NOT_MODEL.fullmatch(name)
    ]
    mtimes = array("d", (root.mtimes[i] for i in keep))
    newest = max(mtimes, default=root.mtime)
    return Dir(
        mtime_ns=int(newest * 1e9),
        names=tuple(root.names[i] for i in keep),
        kinds=FILE * len(keep),
        sizes=array("q", (root.sizes[i] for i in keep)),
        mtimes=mtimes,
    )


LAYOUT = Layout(NAME, detect, parse)
