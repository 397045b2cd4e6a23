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
- On object storage (``dirpath="s3://..."``, ``gs://``; Azure keeps ``fs.open``),
  ``_atomic_save`` calls ``fs.pipe(path, bytes)`` instead: no temporary name, no rename, the
  ``.ckpt`` written at its final key, one PutObject or, from twice s3fs's 50 MiB ``chunksize``,
  a multipart upload (its parts ten at a time, then CompleteMultipartUpload). The store shows
  the object only once whole; a save killed mid-upload leaves an open upload at the key and no
  object, which the listing marks ``uploading``: a save in progress however still its size
  stands (never settled into a committed file), aborted once abort_after passes. Retention is
  ``fs.rm``: a DeleteObject. (Run by tests/writers/test_lightning_s3.py against moto.)
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

NeMo 3's checkpoint callback. nemo-toolkit 3.0.0 (on Lightning 2.4.0 and fsspec 2025.12.0, whose
``_atomic_save`` and ``LocalFileOpener`` write as above) saves through ``NeMoModelCheckpoint``
(``nemo/utils/callbacks/nemo_model_checkpoint.py``), a ``ModelCheckpoint`` that ``exp_manager``
(``nemo/utils/exp_manager.py``, ``configure_checkpointing``) adds with the template
``{name}--{monitor:.4f}-{epoch}`` (no step: read inside the file) and ``CHECKPOINT_NAME_LAST`` =
that template + ``-last``. It brackets every write and every removal with a marker file
``<name>-unfinished`` beside the checkpoint (``format_checkpoint_unfinished_marker_path``: the
path less ``.nemo``, ``.ckpt`` and ``-EMA``, plus ``-unfinished``; rank 0 only):

- ``_save_checkpoint``: ``set_checkpoint_unfinished_marker`` (``Path.touch``), then Lightning's
  save of ``<name>.ckpt`` (the temporary file in ``$TMPDIR`` moved into place, so nothing but the
  marker is here until the move), with the EMA callback then a second full save of the EMA
  weights to ``<name>-EMA.ckpt`` under the same marker, then the finalize callback
  (``_get_finalize_save_checkpoint_callback``) unlinks the marker. The unlink is NeMo's commit:
  ``check_resume`` and ``_remove_invalid_entries_from_topk`` skip a checkpoint whose marker
  stands, and ``setup`` (``_remove_unfinished_checkpoints``) deletes it with its marker at the
  next start. With ``async_save`` (a Megatron ``AsyncFinalizableCheckpointIO`` only) the unlink
  waits for a later batch end.
- ``_remove_checkpoint`` (top-k rotation, the previous ``-last``): touch the marker, remove the
  file (and its ``-EMA`` twin), unlink the marker. With ``async_save`` removals wait for the next
  save's finalization.
- A ``.nemo`` file (``save_nemo_on_train_end``, ``always_save_nemo``) is ``ModelPT.save_to``: a
  tar of the weights and config written in place (``SaveRestoreConnector.
  _make_nemo_file_from_folder``), no marker, the previous one renamed to ``-v1`` and removed
  after. It is the model for inference or fine-tuning, not a state training resumes from
  (``check_resume`` looks for ``*last.ckpt`` and ``*end.ckpt``): no generation here.

So a marker stamped no later than the newest file it names is a save in progress: WRITING,
without settling (NeMo has not committed it, whatever its zip says), aborted once abort_after
passes without progress. A marker with nothing under its name yet is the same save before its
move (its id the ``.ckpt`` it names), so a save killed in ``$TMPDIR`` is seen, then aborted; it
never hides the generations beside it. A marker newer than every file it names is a removal
under way (or the name about to be saved over): NeMo no longer counts that checkpoint, nor does
this layout. Once the marker is gone the file settles as any ``.ckpt``. ``<name>-EMA.ckpt`` with
its ``<name>.ckpt`` is one save (one marker; resuming from ``<name>.ckpt`` loads the EMA file
too, ``EMA.on_load_checkpoint``): one generation of two files. A marker naming a directory is
NeMo 2's (nemo.py). Read from the installed code and run by tests/writers/test_nemo.py.
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
UNFINISHED = "-unfinished"  # NeMoModelCheckpoint.UNFINISHED_CHECKPOINT_SUFFIX
EMA = "-EMA"  # NeMo's EMA callback: the EMA weights' own save beside the checkpoint
_STEP = re.compile(r"(?<!\w)step=(\d+)")  # `epoch=3-step=1000`, not `global_step=`


def _step(name: str) -> int | None:
    match = _STEP.search(name)
    return step_digits(match.group(1)) if match else None


def marker_name(checkpoint: str) -> str:
    """NeMoModelCheckpoint.format_checkpoint_unfinished_marker_path, for a name in its directory."""
    return checkpoint.removesuffix(".nemo").removesuffix(SUFFIX).removesuffix(EMA) + UNFINISHED


def _file_checks(path: str, step: int | None) -> tuple[Check, ...]:
    # The name's step is the one Lightning formatted from the same global_step; without one,
    # the step is read inside the file.
    return (Check(ZIP, path),) if step is not None else (Check(ZIP_STEP, path),)


def detect(root: Dir) -> int:
    if any(name.endswith(SUFFIX) for name in root.names):
        return 80
    # Only NeMo's marker of a first save, its file still in $TMPDIR: a save in progress that
    # must be seen (and aborted if killed). NeMo 2's marker names a directory (nemo.py).
    return 30 if _bare_markers(root, _markers(root)) else 0


def parse(root: Dir, options: Options) -> list[Found]:
    markers = _markers(root)
    # Symlinks (save_last="link") are skipped: the file they name is listed on its own.
    files = {
        name: (size, mtime) for name, _, size, mtime in root.entries(FILE) if name.endswith(SUFFIX)
    }
    found = []
    for name in files:
        twin = _ema_twin(name)
        if name.endswith(EMA + SUFFIX) and name.removesuffix(EMA + SUFFIX) + SUFFIX in files:
            continue  # the EMA half of the save named without -EMA, counted there
        parts = (name, twin) if twin in files else (name,)
        uploading = not root.uploading.isdisjoint(parts)
        marker = markers.get(marker_name(name))
        item = _file_save(name, [files[part] for part in parts], marker, uploading)
        if item is not None:
            found.append(item)
    for name, child in root.dirs():
        if name.endswith(SUFFIX):
            item = _sharded(name, child, markers.get(marker_name(name)))
            if item is not None:
                found.append(item)
    for name, mtime in _bare_markers(root, markers).items():
        # The save's marker before its move: nothing under the name yet.
        checkpoint = name.removesuffix(UNFINISHED) + SUFFIX
        found.append(Found(checkpoint, _step(checkpoint), WRITING, mtime, mtime, None, 0, 0))
    return found


def _ema_twin(name: str) -> str:
    return name.removesuffix(SUFFIX) + EMA + SUFFIX


def _markers(root: Dir) -> dict[str, float]:
    """NeMo's ``-unfinished`` markers here: name -> mtime."""
    return {name: mtime for name, _, _, mtime in root.entries(FILE) if name.endswith(UNFINISHED)}


def _bare_markers(root: Dir, markers: dict[str, float]) -> dict[str, float]:
    """NeMo markers naming nothing here: no ``.ckpt`` file or directory, no NeMo 2 directory."""
    if not markers:
        return {}
    named = {marker_name(name) for name in root.names if name.endswith(SUFFIX)}
    named.update(marker_name(name) for name in root.subdirs)
    return {name: mtime for name, mtime in markers.items() if name not in named}


def _file_save(
    name: str, parts: list[tuple[int, float]], marker: float | None, uploading: bool = False
) -> Found | None:
    """One save: ``name`` (with its ``-EMA`` twin when there), under NeMo's marker or none;
    ``uploading``: a part is an open upload in object storage, so the save is in progress."""
    newest = max(mtime for _, mtime in parts)
    if marker is not None and marker > newest:
        return None  # NeMo's removal under way (or the name about to be saved over)
    step = _step(name)
    checks = _file_checks(name, step)
    if len(parts) > 1:
        checks = (*checks, Check(ZIP, _ema_twin(name)))
    if marker is None and len(parts) == 1:
        size, mtime = parts[0]
        return file_generation(name, size, mtime, step, checks, uploading)
    # A save NeMo has not committed (marker), or the two files of an EMA save: one generation.
    start = min(mtime for _, mtime in parts)
    size = sum(size for size, _ in parts)
    settles = marker is None and not uploading
    return Found(
        name, step, WRITING, start, newest, None, size, len(parts), checks, settles=settles
    )


def _sharded(name: str, child: Dir, marker: float | None) -> Found | None:
    """A ``.ckpt`` directory: the DCP save, then ``meta.pt`` written in place."""
    step = _step(name)
    if marker is not None:
        newest = max((mtime for _, _, mtime in child.walk()), default=None)
        if newest is not None and marker > newest:
            return None  # NeMo's removal under way
        return generation(name, child, step, WRITING)  # NeMo has not committed it
    if child.file(META) is None or dcp.commit_time(child) is None:
        return generation(name, child, step, WRITING)
    meta = join(name, META)
    checks = (Check(DCP, name), *_file_checks(meta, step))
    return settling_generation(name, child, step, checks=checks)


LAYOUT = Layout(NAME, detect, parse)
