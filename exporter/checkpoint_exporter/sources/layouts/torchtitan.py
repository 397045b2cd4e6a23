"""torchtitan: DCP saves in ``<dump folder>/checkpoint/step-N/``.

Checked against torchtitan 0.3.0 (``components/checkpointer/dcp.py``: ``CheckpointManager``
``_save``, ``_save_last_step``, ``_purge_stale_checkpoints``, ``_find_load_step``; ``base.py``:
``purge_thread``) on torch 2.13 by running it (tests/writers/drivers/torchtitan_writer.py):

- The Trainer builds the manager with ``base_folder`` = its ``dump_folder`` and
  ``checkpoint.folder`` (default ``"checkpoint"``, joined below it); every save goes to
  ``<folder>/step-N`` through ``dcp.save`` (``async_mode="disabled"``) or ``dcp.async_save``
  (``"async"``, ``"async_with_pinned_mem"``), so ``.metadata``, renamed into place after every
  shard was written, is the commit.
- The last step (``last_step=True``) is model-only by default, still DCP; with
  ``last_save_in_hf`` it is Hugging Face safetensors: ``sharded/`` first, then the consolidated
  ``model-*.safetensors``, then ``model.safetensors.index.json``, written last: that index is
  its commit (and what torchtitan's own loader accepts besides ``.metadata``).
- ``keep_latest_k``: after each save but the last, rank 0 lists the folder and queues every
  ``step-N`` beyond the newest k to a purge thread, which ``rmtree``s them in place. In the async
  modes that listing runs right after staging, usually before DCP's thread created the new
  ``step-N``: the folder then holds k finished steps besides the new one until the next save.

So a tree is torchtitan's when it holds a ``checkpoint/`` folder with ``step-N`` directories:
the job's path is the dump folder. ``step-N`` directly in the job's path is plain DCP to
auto-detection (``dcp`` claims it); ``layout: torchtitan`` in the configuration still parses
it, for a job whose path is the checkpoint folder itself (or a renamed ``checkpoint.folder``).
"""

from __future__ import annotations

import re

import checkpoint_exporter.sources.layouts.dcp as dcp
from checkpoint_exporter.sources.layouts.base import (
    COMMITTED,
    SAFETENSORS_INDEX,
    WRITING,
    Check,
    Found,
    Layout,
    Options,
    generation,
    join,
)
from checkpoint_exporter.sources.listing import Dir
from checkpoint_exporter.sources.untrusted import step_digits

NAME = "torchtitan"
FOLDER = "checkpoint"
HF_INDEX = "model.safetensors.index.json"
_STEP = re.compile(r"step-(\d+)")


def _holds_steps(listing: Dir | None) -> bool:
    return listing is not None and any(_STEP.fullmatch(name) for name, _ in listing.dirs())


def _container(root: Dir) -> tuple[str, Dir] | None:
    """The directory holding step-N: ``checkpoint/`` below the dump folder, or the root."""
    folder = root.subdirs.get(FOLDER)
    if folder is not None and _holds_steps(folder):
        return FOLDER, folder
    return ("", root) if _holds_steps(root) else None


def detect(root: Dir) -> int:
    # Only torchtitan's own folder tells it apart: step-N in the root is any DCP user's naming.
    return 90 if _holds_steps(root.subdirs.get(FOLDER)) else 0


def parse(root: Dir, options: Options) -> list[Found]:
    container = _container(root)
    if container is None:
        return []
    prefix, listing = container
    found = []
    for name, child in listing.dirs():
        match = _STEP.fullmatch(name)
        if match is None:
            continue
        gen_id, step = join(prefix, name), step_digits(match.group(1))
        index = child.file(HF_INDEX)
        if dcp.commit_time(child) is None and index is not None:
            check = Check(SAFETENSORS_INDEX, join(gen_id, HF_INDEX))
            found.append(generation(gen_id, child, step, COMMITTED, index[1], checks=(check,)))
        elif dcp.is_checkpoint(child) or index is not None:
            found.append(dcp.checkpoint(gen_id, child, step))
        else:
            found.append(generation(gen_id, child, step, WRITING))  # created, nothing written yet
    return found


LAYOUT = Layout(NAME, detect, parse)
