"""Hugging Face Accelerate: ``Accelerator.save_state()`` directories.

Protocol of accelerate 1.15.0 with safetensors 0.8.0 and torch 2.13 (read in
``accelerate/accelerator.py``: ``Accelerator.save_state``, ``load_state``, ``save_iteration``,
``_do_sync``; ``accelerate/checkpointing.py``: ``save_accelerator_state``, ``save_custom_state``;
``accelerate/utils/other.py``: ``save``; ``accelerate/utils/constants.py``: the file names;
``accelerate/utils/dataclasses.py``: ``ProjectConfiguration``; ``accelerate/utils/fsdp_utils.py``:
``save_fsdp_model``, ``save_fsdp_optimizer``; and run by tests/writers/test_accelerate.py):

- **Where.** With ``ProjectConfiguration(automatic_checkpoint_naming=True)`` every save goes to
  ``<project_dir>/checkpoints/checkpoint_<iteration>/``; otherwise to the ``output_dir`` the
  caller names (accelerate's own examples use ``step_<N>`` and ``epoch_<N>``), made with
  ``makedirs(exist_ok=True)``: saving into a directory that exists rewrites its files in place.
- **The number is no step.** ``<iteration>`` is ``ProjectConfiguration.iteration`` (the
  ``save_iteration`` property): 0 at the first save, incremented after every ``save_state``,
  not restored by ``load_state``. A resumed run that does not set it saves ``checkpoint_0``
  again: without ``total_limit`` that raises ``ValueError`` (the directory exists); with it,
  retention first deletes the lowest-numbered directories, the old ``checkpoint_0`` among them,
  and the new ``checkpoint_0`` is the first deleted after that. It counts saves, not steps, and
  nothing accelerate writes holds the training step: ``random_states_R.pkl``'s ``"step"`` is
  ``Accelerator.step``, the gradient-accumulation counter ``_do_sync`` resets at every
  dataloader end. So an automatically named generation has no step here; an explicitly named
  one has the step its name says (``step_100``, ``step-100``, ``global_step100``), else none
  (``epoch_3``). The newest generation is the one committed last.
- **Retention** (``total_limit``, automatic naming only, main process): at the START of a save,
  before the new directory exists, when ``len(os.listdir(checkpoints)) + 1 > total_limit``,
  the oldest entries by the number in their name are ``shutil.rmtree``d until the new one fits;
  then ``wait_for_everyone()``. While a save is written, ``total_limit - 1`` older generations
  stand; a killed save leaves only those. (``load_state()`` without a directory loads the
  highest-numbered one, finished or not.)
- **What, in order** (``save_accelerator_state``, then the custom objects), straight to the
  final names in the generation directory, no temporary directory, no rename of the directory,
  no ``fsync``, and NO marker written last:

  1. the models: ``model.safetensors`` (``model_1.safetensors``, ... for further models) through
     safetensors' ``save_file``, which writes a hidden ``.tmpXXXXXX`` file and renames it onto
     the name (a kill leaves the ``.tmpXXXXXX``; the file keeps the temporary file's mode 0600,
     unreadable to an exporter running as another user); ``pytorch_model.bin``
     (``pytorch_model_1.bin``) by ``torch.save`` in place with ``safe_serialization=False``.
     FSDP writes
     ``pytorch_model_fsdp_<i>.bin`` or a DCP directory ``pytorch_model_fsdp_<i>/``, DeepSpeed a
     tag directory ``pytorch_model/`` with its own ``latest``, both before anything below;
  2. ``optimizer.bin`` (``optimizer_1.bin``; FSDP: ``optimizer_<i>/`` DCP directories);
  3. ``scheduler.bin`` (``scheduler_1.bin``);
  4. ``sampler.bin`` (only for a dataloader over an ``IterableDatasetShard`` with a
     ``SeedableRandomSampler``), ``dl_state_dict.bin`` for stateful dataloaders;
  5. ``scaler.pt`` with a ``GradScaler`` (on EVERY rank, one name);
  6. ``random_states_<process_index>.pkl`` on EVERY rank;
  7. ``custom_checkpoint_<i>.pkl`` for each ``register_for_checkpointing`` object.

  Models, optimizers, schedulers, samplers and custom objects are written by the main process
  only (``utils.other.save``; the local main of each node with ``save_on_each_node``). Every
  file but the safetensors weights and FSDP's DCP shards is a ``torch.save`` zip written in
  place, ``.pkl`` names included:
  cut short, it lacks its end-of-central-directory record. There is no barrier at the end, so
  another rank's ``random_states_R.pkl`` can land before the main process wrote its models.

So nothing commits a generation: it **settles**. A generation counts as a save in progress while its
files move and is judged once still for the job's ``settle`` period: safetensors header checks of
the weights, zip checks of every ``.bin``/``.pt``/``.pth`` and of accelerate's ``.pkl`` files (never
unpickled), DCP checks of FSDP's sharded subdirectories. It stays writing, never settling, while the
save is visibly unfinished: no ``random_states_R.pkl`` yet (every rank writes one, after its model,
optimizer and scheduler), only ranks' RNG states (another rank's lands while the main process still
gathers its state dict, before any file of its own), a safetensors ``.tmpXXXXXX`` as new as anything
in it (a weights write in flight, or killed), or a DCP subdirectory without its ``.metadata``. A
killed save is therefore either still writing or fails a check once still, and is aborted once
``abort_after`` passes without progress. What the disk cannot tell: a save killed exactly between
two whole files after ``random_states_R.pkl`` (before a custom object's file began), or a rank that
died before writing any file of its own, looks finished.

Detection and job paths. The job's path may be ``<project_dir>`` (its ``checkpoints/``
directory holds the generations, ids ``checkpoints/checkpoint_N``) or
``<project_dir>/checkpoints`` itself (ids ``checkpoint_N``); both are read. Any other
subdirectory holding accelerate's own state files (``random_states_R.pkl``, ``optimizer*.bin``,
``scheduler*.bin``, ``custom_checkpoint_I.pkl``, ...) is an explicitly named generation, and a
job path that holds them itself is one generation, ``.``, rewritten in place at every save. A
directory holding only weights is not taken for a save: a weights file is any writer's (a kill
during the first weights write of an explicitly named save is not seen).

Scores: ``random_states_R.pkl`` anywhere a generation may be (the job path, its subdirectories,
``checkpoint_N`` under ``checkpoints/``) is accelerate's alone: 90. ``checkpoints/checkpoint_N``
without it yet (the first save just begun): 60. ``checkpoint_N`` in the job path itself without
it: 20, since Orbax (``prefix_N`` with its ``_CHECKPOINT_METADATA``) and Ray Train name
directories so too. The Hugging Face Trainer's tree (``checkpoint-N`` with a hyphen,
``rng_state.pth``, ``trainer_state.json``; with FSDP, accelerate's helpers add
``optimizer.bin``, ``optimizer_0/`` and ``pytorch_model_fsdp_0/`` to it) scores 0 here, and the
``hf`` layout scores nothing in accelerate's (30 where a ``save_pretrained`` export lies beside
it): neither writer's tree is taken for the other's.
"""

from __future__ import annotations

import re
from array import array

import checkpoint_exporter.sources.layouts.dcp as dcp
from checkpoint_exporter.sources.layouts.base import (
    DCP,
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
from checkpoint_exporter.sources.layouts.hf import write_in_flight
from checkpoint_exporter.sources.listing import DIR, FILE, Dir
from checkpoint_exporter.sources.untrusted import step_digits

NAME = "accelerate"
CONTAINER = "checkpoints"  # <project_dir>/checkpoints, where automatic naming saves
ROOT_ID = "."
_AUTOMATIC = re.compile(r"checkpoint_(\d+)")
# Written on every rank, after that rank's other files: a save without one is not done.
_RANDOM_STATES = re.compile(r"random_states_\d+\.pkl")
# accelerate's other state files: what tells one of its explicitly named directories from a
# directory of weights.
_STATE_FILE = re.compile(
    r"(optimizer|scheduler|sampler|dl_state_dict)(_\d+)?\.bin|scaler\.pt|custom_checkpoint_\d+\.pkl"
)
# FSDP's sharded state (DCP directories ``optimizer_<i>/``, ``pytorch_model_fsdp_<i>/``) and
# DeepSpeed's tag directories (``pytorch_model/``, ``pytorch_model_<i>/``).
_OPTIMIZER_DIR = re.compile(r"optimizer_\d+")
_STATE_DIR = re.compile(r"optimizer_\d+|pytorch_model(_fsdp)?(_\d+)?")
# The step an explicit name states: `step_100`, `step-100`, `global_step100`; not `mystep100`.
_STEP = re.compile(r"(?:.*[^A-Za-z])?step[_-]?(\d+)")
_TORCH_SAVE = (".bin", ".pt", ".pth")
AUTOMATIC_SCORE, STATES_SCORE, NAMES_SCORE, ROOT_NAMES_SCORE = 90, 90, 60, 20


def detect(root: Dir) -> int:
    container = root.subdirs.get(CONTAINER)
    automatic = [
        child
        for listing in (container, root)
        if listing is not None
        for name, child in listing.dirs()
        if _AUTOMATIC.fullmatch(name)
    ]
    candidates = [root, *automatic, *(child for _, child in root.dirs())]
    if any(_has_random_states(listing) for listing in candidates):
        return STATES_SCORE
    if container is not None and any(_AUTOMATIC.fullmatch(name) for name in container.subdirs):
        return NAMES_SCORE  # accelerate's naming scheme, its first save just begun
    return ROOT_NAMES_SCORE if automatic else 0


def parse(root: Dir, options: Options) -> list[Found]:
    if _holds_state(root):
        return [_saved(ROOT_ID, _own_state(root), None, prefix="")]
    found = []
    container = root.subdirs.get(CONTAINER)
    if container is not None:
        for name, child in container.dirs():
            if _AUTOMATIC.fullmatch(name):
                found.append(_saved(join(CONTAINER, name), child, None))
    for name, child in root.dirs():
        if _AUTOMATIC.fullmatch(name):
            found.append(_saved(name, child, None))
        elif name != CONTAINER and _holds_state(child):
            found.append(_saved(name, child, _explicit_step(name)))
    return found


def _saved(id: str, listing: Dir, step: int | None, prefix: str | None = None) -> Found:
    """One ``save_state`` directory: writing until it looks done, then settling.
    ``prefix`` is the listing's path below the tier root (``id`` unless that is the root)."""
    if not _looks_done(listing):
        return generation(id, listing, step, WRITING)
    return settling_generation(
        id, listing, step, checks=_checks(listing, id if prefix is None else prefix)
    )


def _looks_done(listing: Dir) -> bool:
    """Every rank's last file is its ``random_states_R.pkl``: with one there, something the
    main process wrote before its own (another rank's lands while the main process still turns
    its tensors into bytes, before any file of its own exists), and no weights write nor FSDP
    shard set in flight, what remains to judge is whether the files are whole."""
    if not _has_random_states(listing) or write_in_flight(listing):
        return False
    if not _main_process_wrote(listing):
        return False
    return all(
        dcp.commit_time(child) is not None
        for _, child in listing.dirs()
        if dcp.is_checkpoint(child)
    )


def _checks(listing: Dir, prefix: str) -> tuple[Check, ...]:
    found: list[Check] = []
    for name, _, _, _ in listing.entries(FILE):
        path = join(prefix, name)
        if name.endswith(".safetensors"):
            found.append(Check(SAFETENSORS, path))
        elif name.endswith(_TORCH_SAVE) or _RANDOM_STATES.fullmatch(name) or _is_custom(name):
            found.append(Check(ZIP, path))
    for name, child in listing.dirs():
        path = join(prefix, name)
        if dcp.is_checkpoint(child):
            found.append(Check(DCP, path))
        else:  # DeepSpeed's tag directory: torch.save zips
            found.extend(
                Check(ZIP, join(path, relative))
                for relative, _, _ in child.walk()
                if relative.endswith(_TORCH_SAVE)
            )
    return tuple(found)


def _main_process_wrote(listing: Dir) -> bool:
    """A file besides the ranks' RNG states (weights, optimizer, scheduler, ...; not a hidden
    temporary file) or one of FSDP's or DeepSpeed's state directories."""
    return any(
        not name.startswith(".") and not _RANDOM_STATES.fullmatch(name)
        for name, _, _, _ in listing.entries(FILE)
    ) or any(_STATE_DIR.fullmatch(name) for name in listing.subdirs)


def _has_random_states(listing: Dir) -> bool:
    return any(_RANDOM_STATES.fullmatch(name) for name, _, _, _ in listing.entries(FILE))


def _is_custom(name: str) -> bool:
    return name.startswith("custom_checkpoint_") and name.endswith(".pkl")


def _holds_state(listing: Dir) -> bool:
    """accelerate's own state files (or FSDP's optimizer directories), not weights alone."""
    return any(
        _RANDOM_STATES.fullmatch(name) or _STATE_FILE.fullmatch(name)
        for name, _, _, _ in listing.entries(FILE)
    ) or any(_OPTIMIZER_DIR.fullmatch(name) for name in listing.subdirs)


def _explicit_step(name: str) -> int | None:
    match = _STEP.fullmatch(name)
    return step_digits(match.group(1)) if match else None


def _own_state(root: Dir) -> Dir:
    """The job path as one ``save_state`` directory: its own files and accelerate's FSDP and
    DeepSpeed subdirectories; not other directories beside them (a tracker's logs, whose
    writes would keep the save from ever settling)."""
    keep = [
        i
        for i, name in enumerate(root.names)
        if root.kinds[i] == FILE or (root.kinds[i] == DIR and _STATE_DIR.fullmatch(name))
    ]
    files = [i for i in keep if root.kinds[i] == FILE]
    newest = max((root.mtimes[i] for i in files), default=root.mtime)
    return Dir(
        mtime_ns=int(newest * 1e9),
        names=tuple(root.names[i] for i in keep),
        kinds="".join(root.kinds[i] for i in keep),
        sizes=array("q", (root.sizes[i] for i in keep)),
        mtimes=array("d", (root.mtimes[i] for i in keep)),
        subdirs={name: child for name, child in root.subdirs.items() if _STATE_DIR.fullmatch(name)},
    )


LAYOUT = Layout(NAME, detect, parse)
