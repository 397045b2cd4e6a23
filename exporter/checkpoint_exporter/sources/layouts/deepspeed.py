"""DeepSpeed: ``engine.save_checkpoint(save_dir, tag)``, checked against DeepSpeed 0.19.8
(``deepspeed/runtime/engine.py``: ``save_checkpoint``, ``_save_checkpoint``,
``_save_zero_checkpoint``, ``_copy_recovery_script``, ``_commit_decoupled_checkpoint``;
``runtime/checkpoint_engine/torch_checkpoint_engine.py`` and ``decoupled_checkpoint_engine.py``).

The protocol, in the order of the writes:

1. The tag defaults to ``global_step{global_steps}``; ``save_dir/<tag>/`` is made with
   ``makedirs(exist_ok=True)``. Saving a tag that exists overwrites its files in place.
2. Each rank's state files are written straight to their final names, no temporary name and no
   rename: ``mp_rank_00_model_states.pt`` (data-parallel rank 0; ``zero_pp_rank_R_...`` under
   ZeRO-3, ``layer_*``/``expert_*`` files with MoE or pipelines), then under ZeRO 1-3 each rank's
   ``[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt``. Stage 0 writes the model states only
   (the optimizer rides inside them). ``TorchCheckpointEngine.save`` is a plain ``torch.save``,
   a zip unless ``checkpoint.checkpoint_serialization`` is false, so a file cut short lacks its
   end-of-central-directory record. ``exclude_frozen_parameters`` only shrinks the files.
3. Under ZeRO 1-3, rank 0 copies ``zero_to_fp32.py`` and ``zero_to_torch.py`` into ``save_dir``.
4. Unless ``save_latest=False``, rank 0 writes ``save_dir/latest`` with ``open(path, "w")`` (in
   place: truncated, then the tag, no newline). There is no barrier before it: another rank may
   still be writing its own states file of the tag ``latest`` already names. With the decoupled
   engine (``checkpoint.writer.decoupled``) ``latest`` is written at the next ``step()`` that
   ends a gradient-accumulation boundary, once the writer process finished. ``save_latest=False``
   writes no ``latest`` at all. ``load_checkpoint(tag=None)`` reads ``latest``.
5. DeepSpeed deletes nothing: retention is the user's own.

So ``latest`` is the commit pointer where it exists:

- the tag it names is committed (at ``latest``'s mtime, or later if a rank's file is later);
- every other tag whose files are older than ``latest`` was written before that pointer and
  stays committed (its files are zip-checked); one without any states file never got that far
  and stays writing, for the deadline to abort;
- a tag with a file as new as ``latest`` or newer is a save the pointer has not reached:
  writing. Timestamps are coarse (a tick; a second on some filesystems), so "older" is strict.
  Comparing mtimes, not steps, keeps a run resumed from an older tag correct (its stale newer
  tags are not saves in progress) and needs no step in the tag's name.
- ``latest`` naming a tag not listed: the same mtime rule. ``latest`` caught empty (between
  the truncation and the write) or unreadable: the same rule, a tag of ``latest``'s own tick
  counting as older, which commits what the rewrite is about to name and keeps what was
  committed (a layout saying "writing" for a committed tag would start it over).

Without ``latest`` (``save_latest=False``, or a job's first save before ``latest`` is written),
a tag has no commit marker: a tag with state files ``settles`` (writing while it changes, then
judged by zip checks of its ``.pt`` files, so one cut short aborts); one without any state file
stays writing (and is aborted after the deadline). If ``latest`` then appears, it commits.
"""

from __future__ import annotations

import re

from checkpoint_exporter.sources.layouts.base import (
    COMMITTED,
    WRITING,
    Found,
    Layout,
    Options,
    generation,
    settling_generation,
    trailing_step,
    zip_checks,
)
from checkpoint_exporter.sources.listing import Dir

NAME = "deepspeed"
LATEST = "latest"
_STATES = re.compile(r".*(model|optim)_states\.pt")
_GLOBAL_STEP = re.compile(r"global_step\d+")


def _has_states(listing: Dir) -> bool:
    return any(_STATES.fullmatch(name) for name in listing.names)


def latest_tag(root: Dir) -> str | None:
    """The tag ``latest`` names, or None when it is absent, unread or empty."""
    content = root.contents.get(LATEST)
    if content is None:
        return None
    return content.decode("utf-8", "replace").strip() or None


def _last_write(listing: Dir) -> float:
    """When the tag's files were last written. File mtimes only (nested directories' too): a
    user deleting an old tag's optimizer states to save space touches the directory's mtime,
    not the remaining files', and must not make an old tag look newer than ``latest``."""
    totals = listing.totals()
    return totals.max_mtime if totals.files else listing.mtime


def _is_tag(name: str, listing: Dir) -> bool:
    return bool(_GLOBAL_STEP.fullmatch(name)) or _has_states(listing)


def detect(root: Dir) -> int:
    tag = latest_tag(root)
    if tag is not None and tag in root.subdirs:
        return 90
    if any(_is_tag(n, c) for n, c in root.dirs()):
        return 85
    return 0


def _checks(name: str, listing: Dir) -> dict[str, object]:
    return {"checks": zip_checks(listing, name, (".pt",))}


def _committed(name: str, listing: Dir, step: int | None, at: float) -> Found:
    return generation(name, listing, step, COMMITTED, at, **_checks(name, listing))


def _named(name: str, listing: Dir, step: int | None, latest_mtime: float) -> Found:
    """The tag ``latest`` names: committed by the pointer."""
    at = max(latest_mtime, _last_write(listing))  # another rank may finish after `latest`
    if _has_states(listing):
        return _committed(name, listing, step, at)
    # The pointer commits a tag a load cannot read: committed, and broken.
    broken = {"invalid": True, "reason": "no_states"}
    return generation(name, listing, step, COMMITTED, at, **broken, **_checks(name, listing))


def _other(name: str, listing: Dir, step: int | None, latest_mtime: float, empty: bool) -> Found:
    """A tag ``latest`` does not name: written before the pointer's last write, or after it.

    Timestamps are coarse (a kernel tick, a second on some parallel filesystems): a save that
    starts in the tick ``latest`` was written in must not pass for an older one, so a tag is
    older only when strictly so. While ``latest`` is empty it is being rewritten this instant,
    after everything on disk: then a tag of the same tick is older too (the one it will name).
    """
    last = _last_write(listing)
    older = last <= latest_mtime if empty else last < latest_mtime
    if older and _has_states(listing):
        return _committed(name, listing, step, last)
    # A save `latest` has not reached yet, or one that never wrote a states file (that one
    # stays writing until the deadline aborts it).
    return generation(name, listing, step, WRITING)


def _unpointed(name: str, listing: Dir, step: int | None) -> Found:
    """No ``latest`` at all: nothing marks the commit, so a tag with states settles."""
    if _has_states(listing):
        return settling_generation(name, listing, step, **_checks(name, listing))
    return generation(name, listing, step, WRITING)  # only the directory so far


def parse(root: Dir, options: Options) -> list[Found]:
    latest_file = root.file(LATEST)
    tag = latest_tag(root) if latest_file is not None else None
    named = tag if tag in root.subdirs else None
    empty = tag is None  # truncated by the rewrite, not written yet (or unreadable)
    found = []
    for name, child in root.dirs():
        if not _is_tag(name, child):
            continue
        step = trailing_step(name)
        if latest_file is None:
            found.append(_unpointed(name, child, step))
        elif name == named:
            found.append(_named(name, child, step, latest_file[1]))
        else:
            found.append(_other(name, child, step, latest_file[1], empty))
    return found


LAYOUT = Layout(NAME, detect, parse, frozenset({LATEST}))
