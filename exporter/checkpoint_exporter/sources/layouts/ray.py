"""Ray Train: the checkpoints ``ray.train.report(metrics, checkpoint=...)`` persists into a run's
directory, ``<RunConfig.storage_path>/<RunConfig.name>/``, which is the job's directory.

Checked against ray 2.60.0, Train V2 (the default since ``RAY_TRAIN_V2_ENABLED`` defaults to
on), with pyarrow 26.0.1, by reading ``ray/train/v2/_internal/execution/``: ``context.py``
(``TrainContext.report``, ``_sync_checkpoint_dir_name_across_ranks``, ``_upload_checkpoint``,
``_wait_then_report``), ``storage.py`` (``StorageContext``, ``persist_current_checkpoint``,
``_pyarrow_fs_copy_files``, ``delete_fs_path``, ``make_default_checkpoint_dir_name``),
``checkpoint/report_handler.py`` and ``checkpoint/checkpoint_manager.py``
(``CheckpointManager.register_checkpoint``, ``_save_state_and_delete_old_checkpoints``,
``_write_state_to_storage``), and by tracing the system calls of real saves on a local storage
path (tests/writers/drivers/ray_writer.py: ``TorchTrainer``, one CPU worker, ``num_to_keep=2``).

1. Every ``StorageContext`` (the controller's, each worker's) makes the run directory and
   writes the empty ``.validate_storage_marker`` in it (``open_output_stream``: in place).
2. Each ``report`` with a checkpoint: rank 0 names it ``checkpoint_<%Y-%m-%d_%H-%M-%S.%f>`` (its
   local time, broadcast to every rank; ``report(checkpoint_dir_name=...)`` names it instead).
   Each rank then ``create_dir``\\ s ``<run>/<name>/`` and copies its local checkpoint directory
   into it with ``pyarrow.fs.copy_files`` (64 MiB chunks, files in parallel on pyarrow's I/O
   threads): every file is opened under its final name with ``O_WRONLY|O_CREAT|O_TRUNC`` and
   written in place, no temporary name, no rename, no fsync. Ranks with the same file names
   overwrite each other's. (``checkpoint_upload_mode=NO_UPLOAD`` reports a directory the user
   already wrote below the run directory; ``ASYNC`` copies on a background thread.)
3. The rank puts its report on a queue; the controller polls the workers (every
   ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s) and, once every rank reported, registers the
   checkpoint: ``register_checkpoint`` appends it and ``_write_state_to_storage`` rewrites
   ``checkpoint_manager_snapshot.json`` in place (``open_output_stream``: ``O_TRUNC``, then one
   ``write`` of the whole JSON): the commit. Nothing else marks the checkpoint finished: a
   directory the snapshot does not name is not a checkpoint Ray will resume from.
4. ``CheckpointConfig(num_to_keep=K)``: in the same call, after the snapshot is written (Ray's
   comment: so that it never names a deleted checkpoint), the checkpoints beyond the best K
   (the newest K without ``checkpoint_score_attribute``), never the latest, are deleted with
   ``delete_dir`` (file by file, then the directory). ``num_to_keep=None``, the default, keeps
   every checkpoint, and the snapshot grows with each.
5. Ranks start the next upload only after the collective that names it, which every rank
   enters once its previous upload finished: in ``SYNC`` mode (the default) one checkpoint's
   files are all written before the next one's directory is made. In ``ASYNC`` mode each rank
   uploads on one background thread (``MAX_CHECKPOINT_UPLOAD_THREADS = 1``), in order, but one
   rank may begin the next checkpoint while another still writes the last. The controller's
   registration of one checkpoint may overlap the upload of the next.

The snapshot (``_CheckpointManagerState``, JSON from pydantic) holds ``checkpoint_results``:
``{"checkpoint_dir_name": ..., "metrics": <rank 0's reported metrics>}`` for each kept
checkpoint, ``latest_checkpoint_result`` (the last registered), and ``ray_version``.

A SIGKILLed worker leaves its checkpoint directory with the files pyarrow had opened: some
whole, one cut short, some missing, and no snapshot naming it. A controller killed between
the snapshot and ``delete_dir`` leaves a checkpoint the snapshot no longer names.

So, for the run directory's subdirectories named ``checkpoint_*`` or named in the snapshot:

- named in ``checkpoint_results``: committed; the latest at the snapshot's mtime (it was
  rewritten for it; a validation result, with ``validation=``, rewrites it again), the others
  at their own last file write (when the snapshot named them is gone). The step is the
  reported metric ``step`` (what Ray's own Lightning and Transformers callbacks report), else
  ``training_iteration`` (Train V1's and Tune's name), else unknown: Ray keeps no step of its
  own. Validated by zip checks of the ``torch.save`` files inside (``.pt``, ``.pth``,
  ``.ckpt``) and header checks of ``.safetensors`` files.
- not named, with every file written before the latest registered checkpoint's upload began
  (strictly, by file mtimes: deleting files moves only the directory's): no save in progress.
  It is either what ``num_to_keep`` dropped, in the instant before ``delete_dir`` (the tracker
  keeps a committed generation committed until it loses files), or an upload that was never
  registered (a killed worker, a run since resumed): aborted.
- not named otherwise: a save in progress, committed when the snapshot names it, aborted by the
  deadline when it stops. Before the first registration there is no snapshot, and every such
  directory is a save in progress.
- the snapshot present but unreadable (caught empty between its truncation and its write,
  over the 64 KiB marker limit after hundreds of checkpoints with ``num_to_keep=None``, not
  JSON, another schema): the commit cannot be read, so every such directory ``settles``
  (judged once still, by the checks above). A committed generation stays committed meanwhile.

With ``ASYNC`` uploads on several ranks, a checkpoint ``num_to_keep`` drops may have files as
new as the next one's first: it then reads as a save in progress for the instant before
``delete_dir`` (never counted: the tracker forgets a generation in progress that disappears).
A name reported with ``checkpoint_dir_name`` is seen only once the snapshot names it (a killed
upload under a custom name is not seen). ``s3://`` and other remote storage paths are not read
here. Detection: the snapshot is Ray's own name (95); the storage marker with a
``checkpoint_*`` directory is a run before its first registration (80).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from checkpoint_exporter.sources.layouts.base import (
    ABORTED,
    COMMITTED,
    SAFETENSORS,
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
from checkpoint_exporter.sources.listing import Dir
from checkpoint_exporter.sources.untrusted import json_value, step

NAME = "ray"
SNAPSHOT = "checkpoint_manager_snapshot.json"  # CHECKPOINT_MANAGER_SNAPSHOT_FILENAME
STORAGE_MARKER = ".validate_storage_marker"  # VALIDATE_STORAGE_MARKER_FILENAME
PREFIX = "checkpoint_"  # make_default_checkpoint_dir_name
STEP_METRICS = ("step", "training_iteration")
_TORCH_SAVE = (".pt", ".pth", ".ckpt")
SNAPSHOT_SCORE, MARKER_SCORE = 95, 80


@dataclass(frozen=True)
class Snapshot:
    """What the checkpoint manager's snapshot says: the registered checkpoints and their steps."""

    steps: dict[str, int | None] = field(default_factory=dict)  # dir name -> reported step
    latest: str | None = None


def read_snapshot(root: Dir) -> Snapshot | None:
    """The snapshot's record; None when it is present but cannot be read (see the docstring)."""
    content = root.contents.get(SNAPSHOT)
    if content is None:
        return None  # over the marker limit, unreadable, or gone since the listing
    try:
        data = json_value(content)
    except ValueError:
        return None  # caught between the truncation and the write, or not JSON
    if not isinstance(data, dict) or not isinstance(data.get("checkpoint_results"), list):
        return None  # another schema: nothing to go by
    steps: dict[str, int | None] = {}
    for result in data["checkpoint_results"]:
        name = _dir_name(result)
        if name is not None:
            steps.setdefault(name, _step(result))
    latest = _dir_name(data.get("latest_checkpoint_result"))
    return Snapshot(steps, latest if latest in steps else None)


def _dir_name(result: object) -> str | None:
    if isinstance(result, dict) and isinstance(name := result.get("checkpoint_dir_name"), str):
        return name
    return None


def _step(result: dict) -> int | None:
    metrics = result.get("metrics")
    if not isinstance(metrics, dict):
        return None
    for key in STEP_METRICS:
        if (value := step(metrics.get(key))) is not None:
            return value
    return None


def detect(root: Dir) -> int:
    if root.has_file(SNAPSHOT):
        return SNAPSHOT_SCORE
    if root.has_file(STORAGE_MARKER) and any(name.startswith(PREFIX) for name in root.subdirs):
        return MARKER_SCORE
    return 0


def parse(root: Dir, options: Options) -> list[Found]:
    present = root.has_file(SNAPSHOT)
    snapshot = read_snapshot(root) if present else Snapshot()
    candidates = [
        (name, child)
        for name, child in root.dirs()
        if name.startswith(PREFIX) or (snapshot is not None and name in snapshot.steps)
    ]
    if snapshot is None:
        # The commit cannot be read: no marker to go by, only stillness and the checks.
        return [
            settling_generation(name, child, None, checks=checks(child, name))
            for name, child in candidates
        ]
    latest = root.subdirs.get(snapshot.latest) if snapshot.latest is not None else None
    snapshot_file = root.file(SNAPSHOT)
    found: list[Found] = []
    for name, child in candidates:
        if name in snapshot.steps:
            at = last_file_write(child)
            if name == snapshot.latest and snapshot_file is not None:
                at = max(at, snapshot_file[1])  # rewritten for it, after its upload
            # The snapshot lies outside the checkpoint and is rewritten for every later one: its
            # mtime is the commit time, never a write of this checkpoint. Left out of the last
            # write, the generation reads the same while the snapshot cannot be read (it then
            # settles), so the tracker never takes the snapshot's rewrite for a rewrite of it.
            committed = generation(
                name, child, snapshot.steps[name], COMMITTED, checks=checks(child, name)
            )
            found.append(replace(committed, commit_time=at))
        elif latest is not None and last_file_write(child) < first_write(latest):
            reason = f"not in Ray's checkpoint manager snapshot, and {snapshot.latest} came after"
            found.append(generation(name, child, None, ABORTED, reason=reason))
        else:
            found.append(generation(name, child, None, WRITING))  # its registration is to come
    return found


def last_file_write(listing: Dir) -> float:
    """When the checkpoint's files were last written: file mtimes only, at any depth. Deleting
    files (``num_to_keep``'s ``delete_dir``) moves the mtime of the directories holding them,
    not of the files left; a directory without files has only its own."""
    return max((mtime for _, _, mtime in listing.walk()), default=listing.mtime)


def first_write(listing: Dir) -> float:
    """A time within the checkpoint's upload, near its start: its earliest file mtime (or the
    directory's, moved by each file created in it, when it holds none). A directory written
    wholly before it was written before that upload began; one begun after that upload ended
    has a file, or its own mtime, after it (the docstring's point 5)."""
    totals = listing.totals()
    return min(totals.min_mtime, listing.mtime) if totals.files else listing.mtime


def checks(listing: Dir, prefix: str) -> tuple[Check, ...]:
    """Zip checks of the ``torch.save`` files below, header checks of the safetensors files."""
    found: list[Check] = []
    for relative, _, _ in listing.walk():
        if relative.endswith(_TORCH_SAVE):
            found.append(Check(ZIP, join(prefix, relative)))
        elif relative.endswith(".safetensors"):
            found.append(Check(SAFETENSORS, join(prefix, relative)))
    return tuple(found)


LAYOUT = Layout(NAME, detect, parse, frozenset({SNAPSHOT}))
