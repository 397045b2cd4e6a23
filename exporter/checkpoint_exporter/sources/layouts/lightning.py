"""PyTorch Lightning ``ModelCheckpoint``: ``epoch=E-step=S.ckpt`` files and ``last.ckpt``.

Protocol of Lightning 2.6.6 with fsspec 2026.2.0 (read in ``lightning/pytorch/callbacks/
model_checkpoint.py``, ``lightning/fabric/plugins/io/torch_io.py``, ``lightning/fabric/utilities/
cloud_io.py`` and ``fsspec/implementations/local.py``, and run by tests/writers/test_lightning.py):

- A trigger (``on_train_batch_end`` every ``every_n_train_steps``, an epoch end, validation end)
  runs ``_save_topk_checkpoint``, then ``_save_last_checkpoint``. Top-k writes
  ``epoch=E-step=S.ckpt`` (template ``{epoch}-{step}``; ``-v1``, ``-v2`` when the name exists)
  only when the monitored value ranks, then deletes the file it pushed out of the top k
  (``_remove_checkpoint``: ``fs.rm``, after the new file is in place). ``save_last=True``
  rewrites ``last.ckpt`` with a FULL save at every batch-end trigger, even when top-k kept
  nothing new (at an epoch end only after a top-k save); ``save_last="link"`` makes ``last.ckpt``
  a relative symlink to the newest top-k file (``_link_checkpoint``: ``os.remove``, then
  ``os.symlink``; a copy where symlinks fail). ``last-v1.ckpt`` when a ``last.ckpt`` of another
  run is already there.
- Every full save is ``TorchCheckpointIO.save_checkpoint`` -> ``_atomic_save``: ``torch.save``
  into memory, then ``fs.open(path, "wb")`` inside ``fs.transaction``. The local fsspec file
  writes a ``tempfile.mkstemp()`` file: in ``$TMPDIR`` (``/tmp``), NOT next to the checkpoint.
  The transaction's commit is ``shutil.move(temp, path)``: a rename when ``$TMPDIR`` shares the
  checkpoint's filesystem (the ``.ckpt`` appears whole, or replaces ``last.ckpt`` whole); else a
  copy (``copy2``: ``copyfile`` opens the final name, truncating an old ``last.ckpt``, and grows
  it; then ``copystat`` sets the temporary file's mtime). A job killed mid-write leaves nothing
  here (a stray temporary file in ``$TMPDIR``) or, mid-copy, a ``.ckpt`` cut short under its
  final name. A file's appearance therefore proves nothing: every ``.ckpt`` file settles, and
  its zip end-record check aborts a half copy.
- The step: ``step=S`` in the name when the template has ``{step}``; else (``last.ckpt``, a
  template without ``{step}``) only inside the file: the checkpoint dict's ``global_step`` in the
  zip's ``*/data.pkl``, read by the ``ZIP_STEP`` check without unpickling (``ckpt_step``) and
  handed back as ``Verdict.step``. Until then, or if it cannot be read, the step is unknown: an
  older step is never reported for the newest state.
- Sharded checkpoints (``FSDPStrategy``/``ModelParallelStrategy``, ``state_dict_type="sharded"``)
  are ``.ckpt`` directories: ``_distributed_checkpoint_save`` (DCP: shards, then ``.metadata``
  renamed into place), then rank 0's plain ``torch.save(checkpoint, path / "meta.pt")``, written
  in place (no temporary file). ``meta.pt`` is the last write but grows where it lands, so a
  sharded generation settles once ``.metadata`` and ``meta.pt`` are there, checked by DCP and by
  ``ZIP_STEP`` on ``meta.pt`` (which holds ``global_step``). A sharded ``last.ckpt`` saved again
  is written into its existing directory. (A CPU Trainer refuses FSDP; the strategy's own
  ``save_checkpoint`` is run by tests/writers/test_lightning.py.)

Counting. A full-file ``last.ckpt`` is a generation of its own, never an alias: it is its own
``torch.save``, restorable when the top-k file with the same step is deleted, and its bytes are
on disk. So ``retained_generations`` counts it and ``retained_bytes`` counts its bytes, even
when a top-k file holds the same step, and each rewrite is one more committed save. The newest
state is whichever generation committed last: ``last.ckpt``, written after the top-k file. A
symlink (``save_last="link"``, or a user's own link) is another name for a listed file: it is no
generation and adds neither a generation nor bytes.
"""

from __future__ import annotations

import re

import checkpoint_exporter.sources.layouts.dcp as dcp
from checkpoint_exporter.sources.layouts.base import (
    DCP,
    WRITING,
    ZIP,
    ZIP_STEP,
    Check,
    Found,
    Layout,
    Options,
    file_generation,
    generation,
    join,
    settling_generation,
)
from checkpoint_exporter.sources.listing import FILE, Dir
from checkpoint_exporter.sources.untrusted import step_digits

NAME = "lightning"
SUFFIX = ".ckpt"
META = "meta.pt"  # a sharded checkpoint's non-tensor state, written after the DCP save
_STEP = re.compile(r"(?<!\w)step=(\d+)")  # `epoch=3-step=1000`, not `global_step=`


def _step(name: str) -> int | None:
    match = _STEP.search(name)
    return step_digits(match.group(1)) if match else None


def _file_checks(path: str, step: int | None) -> tuple[Check, ...]:
    # The name's step is the one Lightning formatted from the same global_step; without one,
    # the step is read inside the file.
    return (Check(ZIP, path),) if step is not None else (Check(ZIP_STEP, path),)


def detect(root: Dir) -> int:
    return 80 if any(name.endswith(SUFFIX) for name in root.names) else 0


def parse(root: Dir, options: Options) -> list[Found]:
    found = []
    # Symlinks (save_last="link") are skipped: the file they name is listed on its own.
    for name, _, size, mtime in root.entries(FILE):
        if name.endswith(SUFFIX):
            step = _step(name)
            found.append(file_generation(name, size, mtime, step, _file_checks(name, step)))
    for name, child in root.dirs():
        if name.endswith(SUFFIX):
            found.append(_sharded(name, child))
    return found


def _sharded(name: str, child: Dir) -> Found:
    """A ``.ckpt`` directory: the DCP save, then ``meta.pt`` written in place."""
    step = _step(name)
    if child.file(META) is None or dcp.commit_time(child) is None:
        return generation(name, child, step, WRITING)
    meta = join(name, META)
    checks = (Check(DCP, name, child), *_file_checks(meta, step))
    return settling_generation(name, child, step, checks=checks)


LAYOUT = Layout(NAME, detect, parse)
