"""Plain ``torch.save(state, path)``: one file per save, the step in its name, in the job's root.

``ckpt_step_50.pt``, ``step-50.pt``, ``checkpoint_50.pth``, ``model_000050.pt``, ``iter_50.pt``,
``epoch=3-step=50.pt``: the training script's own loop, no framework. Protocol of torch 2.13.0
(read in ``torch/serialization.py``: ``save``, ``_save``, ``_legacy_save``,
``_open_zipfile_writer``, ``_open_zipfile_writer_file``; ``caffe2/serialize/inline_container.h``,
``PyTorchStreamWriter``), and run by tests/writers/test_torchsave.py:

- ``save(obj, path)`` takes a path (``os.fspath``) and, with the default
  ``_use_new_zipfile_serialization=True``, enters ``_open_zipfile_writer(path)`` ->
  ``_open_zipfile_writer_file``: ``torch._C.PyTorchFileWriter(name, ...)``, the C++
  ``PyTorchStreamWriter``, opens the FINAL name itself (an ``std::ofstream``: created, or an old
  file truncated, before anything is pickled). No temporary name, no rename: the file grows
  where it lands. (A name that is not ASCII is opened by Python, ``open(name, "wb")``, then
  handed to the same writer.)
- ``_save`` pickles ``obj`` into memory (``io.BytesIO``; tensors become persistent ids), then
  writes zip records in this order (``write_record``): ``<archive>/data.pkl``,
  ``.format_version``, ``.storage_alignment``, ``byteorder``, then ``data/0``, ``data/1``, ... one
  record per storage, the bulk of the file (each a local header and the raw bytes, aligned).
- Leaving the ``with``, ``__exit__`` calls ``write_end_of_file()``: the ``version`` and
  ``.data/serialization_id`` records, then the zip central directory and its
  end-of-central-directory record, the file's last bytes. So a file without that end record was
  cut short (``validate``'s ``ZIP`` check). Observed on a real save with ``zipfile``: the entries
  lie in that order, the central directory last.
- ``_use_new_zipfile_serialization=False`` (the pre-1.6 format, ``_legacy_save`` into
  ``open(name, "wb")``): pickles (magic number, protocol, sys_info, the object, the storage
  keys), then each storage's raw bytes, and nothing after them: no index, no end record. Whole
  and cut short look alike unless the file is unpickled, which the exporter never does. Such a
  file fails the zip check once still, so each of its saves is reported aborted after
  ``abort_after`` (reason: no end record); the zip format has been the default since torch 1.6.
- Retention is the script's own: ``os.remove`` of the oldest file (keep the newest N). A file
  vanishing is a deletion, never an abort; no marker exists to go first.

Written via a temporary name: the script's own ``torch.save(state, tmp)`` then
``os.replace(tmp, final)`` (torch has no such option). The rename keeps the file's size and
mtime. Temporary names recognised, each naming the final name it becomes (which must be a
checkpoint name below):

- a suffix after the final name: ``x.pt.tmp``, ``x.pt.temp``, ``x.pt.partial``, ``x.pt.part``,
  ``x.pt.incomplete``, with an optional ``.<pid>``/``-<random>`` (``x.pt.tmp.4711``), or ``x.pt~``;
- the word before the suffix: ``x.tmp.pt``, ``x_tmp.pt`` (the suffix kept, for tools that
  dispatch on it);
- a prefix: ``tmp_x.pt``, ``tmp-x.pt``, ``partial.x.pt``;
- a hidden name: ``.x.pt``, ``.x.pt.partial``, and rsync's ``.x.pt.<random>``;
- ``tempfile.mkstemp(dir=root, suffix=".pt")``'s ``tmpXXXXXXXX.pt``: a save of an unknown step.

A temporary file is a save in progress of the step it names: WRITING, with no checks, never
settling (its name alone says it is not the checkpoint yet). It takes the final name as its
generation id when that name is not on disk, so the rename continues the same generation (its
start is the temporary file's first sighting: the save's duration is the whole write), which
then settles like any final file. When the final name exists already (a step saved again) the
temporary file keeps its own name as id. A temporary file left by a kill never becomes a
generation: it makes no progress and is aborted after ``abort_after``; its step's previous
files stay committed.

So every final file ``settles`` (as Lightning's ``.ckpt``: ``base.file_generation``): a save in
progress while its size or mtime moves, judged once still for ``settle`` by its ``ZIP`` check:
the end record present means committed (at its last write), absent means it stays in progress
and is aborted after ``abort_after`` (a killed in-place save: half a zip under the final name).
In object storage (``torch.save(state, writer)`` into the S3 connector for PyTorch's
``S3Checkpoint.writer(url)``: always a multipart upload at the final key, even a tiny file) the
object appears only once whole; an open upload at a ``.pt`` key, no object yet, is listed as a
file marked ``uploading`` (``Dir.uploading``): a save in progress however still its size stands,
never settled (the zip check reads no object contents there), aborted after ``abort_after``.
A file whose name carries no step (``last.pt``, ``best.pth``, ``model.pt``) is no generation:
its step would have to be read from its pickle, and a ``latest.pt`` rewritten beside step files
would report no step for the newest state. Suffixes: ``.pt`` and ``.pth`` (torch's own docs and
torchvision), and ``.pth.tar`` (the PyTorch ImageNet example's ``checkpoint.pth.tar``, still
common); not ``.ckpt`` (Lightning's layout reads it, its step in ``step=N``), not ``.bin`` nor
a bare ``.tar`` (any binary or archive: a zip check on them would abort files that are not
torch.save's).

Only files in the job's root are read: DeepSpeed (``global_stepN/*.pt``), Megatron's legacy
format (``iter_N/mp_rank_*/model_optim_rng.pt``), the HF Trainer (``checkpoint-N/optimizer.pt``)
and torchtitan keep their ``.pt`` files inside generation directories, never in the root. The
root's checkpoint and temporary files are markers (``ROOT_MARKER``): re-statted on every read,
since a file growing in place changes no directory's mtime and a poll would not see it grow.
"""

from __future__ import annotations

import re

from checkpoint_exporter.sources.layouts.base import (
    WRITING,
    ZIP,
    Check,
    Found,
    Layout,
    Options,
    file_generation,
)
from checkpoint_exporter.sources.listing import FILE, Dir
from checkpoint_exporter.sources.untrusted import step_digits

NAME = "torchsave"
SUFFIXES = (".pth.tar", ".pt", ".pth")  # the longest first: it is stripped as one suffix
# Below lightning (80, its .ckpt), dcp (50: DCP step directories beside a stray .pt are a DCP
# run) and torchtitan, megatron, deepspeed, nemo, orbax and the HF Trainer (85 and more); above
# a saved HF model (30). Temporary files alone (a job's first save) score lower still.
SCORE, TEMPORARY_SCORE = 45, 25

# The step: after the word ``step`` (``ckpt_step_50``, ``global_step50``, ``epoch=3-step=50``),
# else after ``iter``/``iteration``, else the name's trailing number after a separator
# (``checkpoint_50``, ``model_000050``, ``50``), never digits glued to a word (``resnet50``).
_STEP_WORD = re.compile(r"(?<![a-z])step[_=-]?(\d+)", re.IGNORECASE)
_ITER_WORD = re.compile(r"(?<![a-z])iter(?:ation)?[_=-]?(\d+)", re.IGNORECASE)
_TRAILING = re.compile(r"(?:^|[_=.-])(\d+)$")

_TEMP_WORD = r"(?:tmp|temp|partial|part|incomplete)"
_TEMP_TAIL = re.compile(rf"(?:[._-]{_TEMP_WORD}(?:[._-][a-z0-9]{{1,32}})?|~)$", re.IGNORECASE)
_TEMP_INFIX = re.compile(rf"[._-]{_TEMP_WORD}(?=(?:\.pth\.tar|\.pth|\.pt)$)", re.IGNORECASE)
# Not ``part_``: ``part_1.pt`` may be a model's first part, not a save in progress.
_TEMP_PREFIX = re.compile(r"(?:tmp|temp|partial)[._-]", re.IGNORECASE)
_RANDOM_TAIL = re.compile(r"\.[a-z0-9]{1,32}$", re.IGNORECASE)  # rsync's .<name>.<random>
_MKSTEMP = re.compile(r"tmp[a-z0-9_]{8}(?:\.pth\.tar|\.pth|\.pt)")

FINAL, TEMPORARY = "final", "temporary"


def _suffix(name: str) -> str | None:
    return next((suffix for suffix in SUFFIXES if name.endswith(suffix)), None)


def _step_digits(name: str) -> str | None:
    """The digits of the step a checkpoint file's name carries, or None."""
    suffix = _suffix(name)
    if suffix is None:
        return None
    stem = name[: -len(suffix)]
    match = _STEP_WORD.search(stem) or _ITER_WORD.search(stem) or _TRAILING.search(stem)
    return match.group(1) if match else None


def step_of(name: str) -> int | None:
    """The step a checkpoint file's name carries, or None (none, or past 2**53: unknown)."""
    digits = _step_digits(name)
    return step_digits(digits) if digits is not None else None


def _final(name: str) -> bool:
    """A checkpoint's own name: a torch suffix and a step, not hidden."""
    return not name.startswith(".") and _step_digits(name) is not None


def classify(name: str) -> tuple[str, str | None] | None:
    """(FINAL, name) for a checkpoint file, (TEMPORARY, the final name it becomes, or None for
    an unknown one) for a temporary file, None for anything else."""
    if name.startswith("."):  # hidden: .x.pt, .x.pt.partial, rsync's .x.pt.Ab12Cd
        body = name[1:]
        if _final(body):
            return TEMPORARY, body
        for pattern in (_TEMP_TAIL, _RANDOM_TAIL):
            match = pattern.search(body)
            if match and _final(body[: match.start()]):
                return TEMPORARY, body[: match.start()]
        return None
    if match := _TEMP_INFIX.search(name):  # x.tmp.pt, x_tmp.pt
        final = name[: match.start()] + name[match.end() :]
        return (TEMPORARY, final) if _final(final) else None
    if match := _TEMP_PREFIX.match(name):  # tmp_x.pt, tmp-x.pt
        final = name[match.end() :]
        if _final(final):
            return TEMPORARY, final
    if match := _TEMP_TAIL.search(name):  # x.pt.tmp, x.pt.tmp.4711, x.pt~
        final = name[: match.start()]
        return (TEMPORARY, final) if _final(final) else None
    if _final(name):
        return FINAL, name
    if _MKSTEMP.fullmatch(name):
        return TEMPORARY, None
    return None


def is_root_marker(name: str) -> bool:
    """A root file this layout decides by (re-statted on every read: it grows in place). Every
    name ``classify`` knows holds ``.pt`` (``.pth``, ``.pth.tar`` too): a substring test skips
    the regular expressions for the rest of a large root (a DCP run's step directories)."""
    return ".pt" in name and classify(name) is not None


def detect(root: Dir) -> int:
    score = 0
    for name, _, _, _ in root.entries(FILE):
        kind = classify(name)
        if kind is None:
            continue
        if kind[0] == FINAL:
            return SCORE
        if kind[1] is not None:
            score = TEMPORARY_SCORE
    return score


def parse(root: Dir, options: Options) -> list[Found]:
    found = []
    finals: set[str] = set()
    temporaries: list[tuple[str, str | None, int, float]] = []
    # Symlinks are skipped: the file they name is listed on its own (or is elsewhere).
    for name, _, size, mtime in root.entries(FILE):
        kind = classify(name)
        if kind is None:
            continue
        if kind[0] == FINAL:
            finals.add(name)
            # An open upload at the key (no object yet) is a save in progress: never settles.
            uploading = name in root.uploading
            checks = (Check(ZIP, name),)
            found.append(file_generation(name, size, mtime, step_of(name), checks, uploading))
        else:
            temporaries.append((name, kind[1], size, mtime))
    claimed: set[str] = set()
    for name, final, size, mtime in sorted(temporaries):
        # The rename continues the same generation: the final name is its id while that name
        # is free (one temporary file per final name; a second keeps its own).
        if final is not None and final not in finals and final not in claimed:
            claimed.add(final)
            gen_id = final
        else:
            gen_id = name
        step = step_of(final) if final is not None else None
        found.append(Found(gen_id, step, WRITING, mtime, mtime, None, size, 1))
    return found


LAYOUT = Layout(NAME, detect, parse)
