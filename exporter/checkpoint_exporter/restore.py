"""The restore drill: prove the generation a restart would pick can be restored, not just listed.

``checkpoint-exporter restore-drill --config.file F --job NAME [--generation ID] [--full
[--full-max-bytes N]]`` picks the generation a restart would pick (the newest committed one; for
a layout without commit markers, the newest that stayed unchanged for the job's settle period,
as the scanner judges it) and runs the scanner's structural checks on it: every shard its
metadata names is there and long enough, every torch.save zip has its end record, every
safetensors header parses. That structural drill is the default everywhere (the systemd timer,
the CronJob): it needs neither torch nor much memory.

``--full`` also reads the whole generation, in a child process, under a memory bound
(``--full-max-bytes``; the shipped units leave room for the default):
- DCP: the tensors are loaded with torch.distributed.checkpoint in batches of keys (a load into
  a state_dict of only some keys reads only their pieces of the shards), each batch freed before
  the next: peak memory is the worker's own plus about twice a batch, whatever the size of the
  generation. A tensor too large for a batch, and every non-tensor value, is read as bytes but
  not deserialised, so every shard file is still read; stdout says what was loaded and what was
  only read.
- torch.save files: every record is read in pieces and its CRC-32 checked. The pickle that ties
  the records together is not unpickled: it names the training code's classes (Megatron's
  argparse Namespace, Lightning's hyper-parameters, transformers' TrainingArguments), so
  unpickling it would run code from a watched path, and torch.load(weights_only=True) refuses
  those classes, which would fail healthy checkpoints.
- safetensors: tensor by tensor, each one's bytes read and matched against its dtype and shape
  (the format has no checksum).
These need no torch. A generation with none of them (Orbax) has no full drill here.

The result goes to the spool as a drill's (``restore_start``, then ``restore_done`` or
``restore_failed``, each with ``"drill": true``), where the exporter counts it apart from the
restores of training jobs: a failed drill opens a ticket, a training job that cannot restore
pages. Exit status: 0 restored; 1 the restore failed, a verdict on the checkpoint (a missing or
short shard, a bad CRC-32, a load that raised); 2 usage (no such job); 3 ``--full`` could not run
here (a DCP generation and no torch, or nothing ``--full`` can load), so the structural drill ran
in its place and passed.

Why 3 and not 1 for a missing torch: it says nothing about the checkpoint. Reported as a failed
restore it would open a ticket every week against a healthy checkpoint (the shipped drill used to
page so), and teach the on-call to ignore the drill. Refusing to run at all would leave the job
without its weekly check. So the drill says at start whether the full load will run ("full
restore: torch X found", or "torch is not installed here: --full needs it; running the
structural drill"), runs what it can, reports only that in the spool, and exits 3: whoever asked
for ``--full`` sees that it did not happen, apart from a restore that failed.

Nothing from the tree is unpickled except through an allowlist: the worker reads DCP
``.metadata`` through the scanner's allowlist (torch's own reader is a plain ``pickle.load``,
which a file swapped in after the structural check could use to run code), each tensor piece
through ``torch.load(weights_only=True)``, and reads non-tensor values (which DCP would unpickle
with ``weights_only=False``) and torch.save pickles as bytes only.
"""

from __future__ import annotations

import gc
import io
import json
import math
import os
import pickle
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from checkpoint_exporter import instrument
from checkpoint_exporter.config import JOB_NAME, Config, Policy
from checkpoint_exporter.model import COMMITTED, WRITING, restore_preference
from checkpoint_exporter.sources import dcp_metadata, fsread, layouts, stores
from checkpoint_exporter.sources.dcp_metadata import MetadataError
from checkpoint_exporter.sources.layouts.base import (
    DCP,
    SAFETENSORS,
    ZIP,
    ZIP_STEP,
    Found,
    Options,
)
from checkpoint_exporter.sources.listing import Dir, OpsBudget, TreeReader
from checkpoint_exporter.sources.object_store import RequestCounter, StoreError
from checkpoint_exporter.sources.untrusted import json_value
from checkpoint_exporter.sources.validate import Limits, validate
from checkpoint_exporter.sources.validate_objects import Fetch, validate_listing
from checkpoint_exporter.storage_url import ObjectURL, is_object_url, parse_object_url

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FULL = 0, 1, 2, 3
# The shipped units allow the drill 20 GiB (MemoryMax=, the CronJob's limit): the bound, plus
# the drill's own process and the worker's interpreter, with room to spare.
DEFAULT_FULL_MAX_BYTES = 16 << 30
MIN_FULL_MAX_BYTES = 256 << 20  # torch alone takes about 0.3 GB: less leaves nothing to load
_LOADABLE = (DCP, ZIP, ZIP_STEP, SAFETENSORS)
_NO_TORCH = 3  # the worker's exit status when torch cannot be imported
_PROGRESS_EVERY = 10.0
_NOT_INSTALLED = "torch is not installed here"


class DrillFailed(Exception):
    """The restore did not succeed; the message is the reason reported."""


class _Unavailable(Exception):
    """--full cannot run here, which says nothing about the checkpoint; ``detail`` is what the
    worker said."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason)
        self.detail = detail


@dataclass(frozen=True)
class Target:
    job: str
    root: Path | ObjectURL  # the durable tier root: a directory, or a prefix in object storage
    layout: str
    generation: Found
    tree: Dir | None = None  # the listing the generation was found in: sizes for its checks
    fetch: Fetch | None = None  # in object storage: a ranged read below the root

    def path_of(self, relative: str) -> str:
        if isinstance(self.root, ObjectURL):
            return f"{self.root}/{relative}"
        return str(self.root / relative)


def find_job(
    config: Config, name: str
) -> tuple[Path | ObjectURL, Policy, tuple[tuple[str, object], ...]]:
    """(durable path, policy, storage options) of a configured or discovered job."""
    for job in config.jobs:
        if job.name == name:
            path = parse_object_url(str(job.path)) if is_object_url(job.path) else job.path
            return path, job.policy, job.storage_options
    for entry in config.discover:
        if is_object_url(entry.root):  # a run is a prefix: there when something is under it
            if JOB_NAME.fullmatch(name):
                url = parse_object_url(f"{entry.root}/{name}")
                if _listed(url, entry.storage_options):
                    return url, entry.policy, entry.storage_options
            continue
        candidate = Path(entry.root) / name
        if candidate.is_dir() and not candidate.is_symlink():
            return candidate, entry.policy, ()
    raise LookupError(f"no job named {name!r} in the config or under its discover roots")


def _listed(url: ObjectURL, options: tuple[tuple[str, object], ...]) -> bool:
    """Whether anything is kept under ``url`` (one delimited LIST); a store that refuses says
    nothing is (the drill then names the job as not found, and the log says why)."""
    reader = stores.open_reader(url, dict(options), OpsBudget(), RequestCounter(), content_names=())
    try:
        page = reader.store.list_page(url.prefix, "/", None)
    except StoreError as error:
        print(f"restore-drill: cannot list {url}: {error.code}: {error.reason}", file=sys.stderr)
        return False
    return bool(page.objects or page.prefixes)


def _restorable(found: Found, settle: float, now: float) -> Found | None:
    """The generation as committed, if a restart could take it: committed, or (a layout without
    commit markers) unchanged for the settle period, as the scanner judges it."""
    if found.state == COMMITTED:
        return found
    if found.settles and found.state == WRITING and now - found.last_write_time >= settle:
        return replace(found, state=COMMITTED, commit_time=found.last_write_time)
    return None


def pick(config: Config, job: str, generation: str | None) -> Target:
    """The generation to restore: the one named, or the one a restart would pick."""
    root, policy, options = find_job(config, job)
    tree, fetch = _list(root, options)
    if tree is None:
        raise DrillFailed(f"{root} cannot be read")
    layout = policy.layout if policy.layout != "auto" else layouts.detect(tree)
    if layout is None:
        raise DrillFailed(f"{root}: no checkpoint layout recognised")
    found = layouts.REGISTRY[layout].parse(tree, Options(verify_checksums=True))
    now = time.time()
    restorable = {f.id: r for f in found if (r := _restorable(f, policy.settle, now))}
    if generation is not None:
        match = [f for f in found if f.id == generation]
        if not match:
            raise DrillFailed(f"{root}: no generation {generation!r}")
        if generation not in restorable:
            raise DrillFailed(f"generation {generation!r} is {match[0].state}, not committed")
        return Target(job, root, layout, restorable[generation], tree, fetch)
    committed = list(restorable.values())
    if not committed:
        raise DrillFailed(f"{root}: no committed generation to restore")
    return Target(job, root, layout, max(committed, key=restore_preference), tree, fetch)


def _list(
    root: Path | ObjectURL, options: tuple[tuple[str, object], ...]
) -> tuple[Dir | None, Fetch | None]:
    """The job's tree: a directory walked, or a prefix listed (as the daemon reads it, through
    the same store client and request budget; a store's refusal is the drill's failure), with
    its ranged reads."""
    if not isinstance(root, ObjectURL):
        tree, _ = TreeReader(root, OpsBudget(), layouts.ALL_CONTENT_FILES).read()
        return tree, None
    reader = stores.open_reader(
        root, dict(options), OpsBudget(), RequestCounter(),
        content_names=layouts.ALL_CONTENT_FILES, marker_names=layouts.MARKER_NAMES,
    )  # fmt: skip
    tree, stats = reader.read(force=True)
    if stats.errors:
        raise DrillFailed(f"{root} cannot be listed: {stats.errors[0][1]}")
    return tree, reader.fetch


def _introduce(target: Target, say: Callable[[str], None]) -> None:
    found = target.generation
    say(
        f"restore drill: job={target.job} generation={found.id} step={found.step} "
        f"layout={target.layout} ({found.files} files, {found.bytes / 1e9:.3f} GB)"
    )


def _structural(target: Target, say: Callable[[str], None]) -> None:
    found = target.generation
    if found.invalid:
        raise DrillFailed(f"structural check failed: {found.reason}: found by the layout")
    if isinstance(target.root, ObjectURL):
        # What the listing's sizes prove; the verdict says what it leaves unchecked.
        verdict = validate_listing(found.checks, target.tree, target.fetch)
    else:
        verdict = validate(str(target.root), found.checks, Limits(), target.tree)
    if not verdict.valid:
        raise DrillFailed(f"structural check failed: {verdict.reason}: {verdict.detail}")
    say(f"  structural check passed ({len(found.checks)} checks)"
        + (f"; {verdict.detail}" if verdict.detail else ""))  # fmt: skip


# --- the full load, in a child process ----------------------------------------------------------


class _Loader:
    """The worker that reads the generation. Started before the restore is reported, so that a
    missing torch is known (and said) before any event; it loads when told to."""

    def __init__(self, loads: list[tuple[str, str]], max_bytes: int) -> None:
        command = [sys.executable, "-m", "checkpoint_exporter.restore", "--load",
                   json.dumps(loads), str(max_bytes)]  # fmt: skip
        # stderr to a file, not a pipe: nothing the worker says can block it while we wait.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True
        )

    def hello(self) -> str | None:
        """torch's version (None when the generation needs none); _Unavailable if it cannot."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line:
            return json.loads(line)["torch"]
        if self.process.wait() == _NO_TORCH:
            raise _Unavailable(_NOT_INSTALLED, self._last_error())
        raise _Unavailable("the loader could not start", self._last_error())

    def load(self, say: Callable[[str], None]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("go\n")
        self.process.stdin.close()
        started, stop = time.monotonic(), threading.Event()

        def progress() -> None:
            while not stop.wait(_PROGRESS_EVERY):
                read = _bytes_read(self.process.pid)
                shown = f", {read / 1e9:.2f} GB read" if read is not None else ""
                say(f"  loading ... {time.monotonic() - started:.0f} s{shown}")

        threading.Thread(target=progress, daemon=True).start()
        out = self.process.stdout.read()
        code = self.process.wait()
        stop.set()
        if code < 0:
            raise DrillFailed(f"loading failed: the loader was killed by signal {-code}")
        if code != 0:
            raise DrillFailed(f"loading failed: {self._last_error()}")
        return json.loads(out.strip().splitlines()[-1])

    def _last_error(self) -> str:
        self._stderr.seek(0)
        lines = self._stderr.read().strip().splitlines()
        return lines[-1] if lines else "no output"

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self._stderr):
            if stream is not None and not stream.closed:
                stream.close()


def _bytes_read(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _start_loader(
    target: Target, max_bytes: int, say: Callable[[str], None]
) -> tuple[_Loader | None, str | None]:
    """The worker, ready to load, or why --full cannot run here (said at once)."""
    if isinstance(target.root, ObjectURL):
        reason = (
            "--full reads local files: a generation in object storage gets the structural drill"
        )
        say(f"{reason}")
        return None, reason
    checks = target.generation.checks
    loads = [(c.kind, target.path_of(c.path)) for c in checks if c.kind in _LOADABLE]
    if not loads:
        reason = f"nothing in this {target.layout} generation that --full can load"
        say(f"{reason} (DCP, torch.save or safetensors files): running the structural drill")
        return None, reason
    loader = _Loader(loads, max_bytes)
    try:
        version = loader.hello()
    except _Unavailable as error:
        loader.close()
        if str(error) == _NOT_INSTALLED:
            say(f"{_NOT_INSTALLED}: --full needs it; running the structural drill ({error.detail})")
        else:
            say(f"{error} ({error.detail}): running the structural drill")
        return None, str(error)
    found = f"torch {version} found" if version else "torch not needed"
    say(f"full restore: {found}; at most {max_bytes / 2**30:.2f} GiB in memory")
    return loader, None


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "es" if word.endswith("ch") else "s")


def summary(result: dict[str, Any]) -> str:
    """What the full drill read, for stdout."""
    parts = []
    if result["shards"]:
        parts.append(
            f"loaded {_plural(result['tensors'], 'tensor')} ({result['tensor_bytes'] / 1e9:.3f} "
            f"GB) in {_plural(result['batches'], 'batch')} of at most "
            f"{result['batch_budget'] / 1e9:.3f} GB"
        )
        if result["unparsed"]:
            parts.append(
                f"{_plural(result['unparsed'], 'tensor')} too large for a batch read unparsed "
                f"({result['unparsed_bytes'] / 1e9:.3f} GB)"
            )
        if result["objects"]:
            parts.append(
                f"{_plural(result['objects'], 'object')} read, not unpickled "
                f"({result['object_bytes'] / 1e6:.3f} MB)"
            )
        parts.append(f"{result['shards_read']} of {result['shards']} shard files read")
    if result["files"]:
        unchecked = result["unchecked_records"]
        parts.append(
            f"{_plural(result['records'], 'storage record')} ({result['record_bytes'] / 1e9:.3f}"
            f" GB) of {_plural(result['files'], 'torch.save file')} read, CRC-32 checked"
            + (f" ({unchecked} written without a CRC-32: read only)" if unchecked else "")
        )
    if result["safetensors_files"]:
        parts.append(
            f"{_plural(result['safetensors'], 'tensor')} ({result['safetensors_bytes'] / 1e9:.3f}"
            f" GB) of {_plural(result['safetensors_files'], 'safetensors file')} read"
        )
    parts.append(
        f"peak RSS {result['peak_rss'] / 1e9:.3f} GB of {result['max_bytes'] / 1e9:.3f} GB allowed"
    )
    return "full restore: " + "; ".join(parts)


def run_drill(
    config: Config,
    job: str,
    generation: str | None,
    full: bool,
    max_bytes: int = DEFAULT_FULL_MAX_BYTES,
    err: TextIO = sys.stderr,
    out: TextIO = sys.stdout,
) -> int:
    def say(message: str) -> None:
        print(message, file=err, flush=True)

    target: Target | None = None
    unpickable: DrillFailed | None = None
    try:
        target = pick(config, job, generation)
    except LookupError as error:
        say(f"restore-drill: {error}")
        return EXIT_USAGE
    except DrillFailed as error:
        unpickable = error  # nothing to restore is a failed restore, and reported as one
    loader, not_full = None, None
    if target is not None:
        _introduce(target, say)
        if full:
            loader, not_full = _start_loader(target, max_bytes, say)
    step = target.generation.step if target else None
    path = target.path_of(target.generation.id) if target else None
    started = time.monotonic()
    try:
        with instrument.restoring(
            training_job=job, step=step, path=path, spool=str(config.spool), drill=True
        ):
            if target is None:
                raise unpickable or DrillFailed("nothing to restore")
            _structural(target, say)
            if loader is not None:
                print(summary(loader.load(say)), file=out, flush=True)
    except DrillFailed as error:
        say(f"restore drill FAILED after {time.monotonic() - started:.1f} s: {error}")
        return EXIT_FAILED
    finally:
        if loader is not None:
            loader.close()
    elapsed = time.monotonic() - started
    if not_full:
        say(f"structural restore drill succeeded in {elapsed:.1f} s; no full drill: {not_full}")
        return EXIT_NOT_FULL
    say(f"restore drill succeeded in {elapsed:.1f} s")
    return EXIT_OK


# --- the worker process: the only place torch is imported -------------------------------------

_PIECE = 16 << 20  # bytes read at a time where nothing is deserialised
# What the worker keeps beside its batches: allocator slack, the plan, DCP's bookkeeping.
_HEADROOM = 128 << 20
_STORAGE_RECORD = re.compile(r"[^/]+/data/[^/]+")  # torch.save: one record per storage


class LoadError(Exception):
    """The generation cannot be read back: a verdict on the checkpoint."""


@dataclass
class _Tally:
    max_bytes: int
    batch_budget: int = 0
    tensors: int = 0
    tensor_bytes: int = 0
    batches: int = 0
    unparsed: int = 0
    unparsed_bytes: int = 0
    objects: int = 0
    object_bytes: int = 0
    shards: int = 0
    shards_read: int = 0
    files: int = 0
    records: int = 0
    record_bytes: int = 0
    unchecked_records: int = 0
    safetensors_files: int = 0
    safetensors: int = 0
    safetensors_bytes: int = 0
    peak_rss: int = 0


def batch_keys(sizes: list[tuple[str, int]], budget: int) -> tuple[list[list[str]], list[str]]:
    """Keys in their order, packed into batches of at most ``budget`` bytes; and the keys larger
    than a batch may be on their own."""
    batches: list[list[str]] = []
    alone: list[str] = []
    filled = budget
    for key, size in sizes:
        if size > budget:
            alone.append(key)
            continue
        if filled + size > budget:
            batches.append([])
            filled = 0
        batches[-1].append(key)
        filled += size
    return batches, alone


def _status_bytes(field: str) -> int:
    """VmRSS, VmHWM (peak RSS) of this process, from /proc; 0 where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return 0
    return 0


def _give_back_memory() -> None:
    """Return a freed batch to the system: small tensors come from the heap, which glibc keeps
    unless asked."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: its allocator returns what it returns


class _MetadataUnpickler(pickle.Unpickler):
    """The scanner's allowlist (dcp_metadata), with torch's real classes: DCP needs them."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = (module, name) in dcp_metadata._ALLOWED or (
            module == "torch" and name in dcp_metadata._DTYPES
        )
        if not allowed:
            raise MetadataError(f"refused to load {module}.{name} from checkpoint metadata")
        return super().find_class(module, name)

    def persistent_load(self, pid: object) -> Any:
        raise MetadataError("persistent references are not allowed in checkpoint metadata")


def dcp_metadata_for_load(directory: str) -> Any:
    """torch's ``Metadata`` of a DCP directory, read through the allowlist, with every shard
    path inside the directory."""
    from torch.distributed.checkpoint.metadata import Metadata

    data = fsread.read_bytes(os.path.join(directory, ".metadata"), dcp_metadata.DEFAULT_SIZE_LIMIT)
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except MetadataError:
        raise
    except Exception as error:  # a malformed pickle, or a name this torch does not have
        raise MetadataError(f"not a readable metadata pickle: {error}") from None
    if not isinstance(metadata, Metadata):
        raise MetadataError(f"top-level object is {type(metadata).__name__}, not DCP Metadata")
    for info in metadata.storage_data.values():
        dcp_metadata._inside(info.relative_path)
    return metadata


def _reader(directory: str, metadata: Any) -> Any:
    """torch's FileSystemReader, given the metadata read through the allowlist, and opening
    shards only as regular files, never through a symlink."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.filesystem import FileSystem

    class NoFollow(FileSystem):
        @contextmanager
        def create_stream(self, path: Any, mode: str) -> Iterator[io.IOBase]:
            if mode != "rb":
                raise PermissionError(f"{path}: the drill only reads")
            with os.fdopen(fsread.open_regular(path), "rb") as stream:
                yield stream

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            return metadata

    reader = Reader(directory)
    reader.fs = NoFollow()
    return reader


def _load_dcp(directory: str, tally: _Tally) -> None:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = dcp_metadata_for_load(directory)
    entries = metadata.state_dict_metadata
    sizes = {
        key: math.prod(item.size) * item.properties.dtype.itemsize
        for key, item in entries.items()
        if isinstance(item, TensorStorageMetadata)
    }
    # Measured after the metadata is parsed: a large one is part of what the worker holds.
    budget = max(0, (tally.max_bytes - _status_bytes("VmRSS") - _HEADROOM) // 2)
    tally.batch_budget = max(tally.batch_budget, budget)
    batches, alone = batch_keys(list(sizes.items()), budget)
    _load_batches(directory, metadata, batches, tally)
    tally.tensor_bytes += sum(sizes[key] for batch in batches for key in batch)
    tally.unparsed += len(alone)
    tally.objects += len([key for key in entries if key not in sizes])
    _read_the_rest(directory, metadata, {key for batch in batches for key in batch}, sizes, tally)


def _load_batches(directory: str, metadata: Any, batches: list[list[str]], tally: _Tally) -> None:
    """Each batch into tensors of its own, with torch.distributed.checkpoint, then freed."""
    import torch
    import torch.distributed.checkpoint as dcp

    entries, reader = metadata.state_dict_metadata, _reader(directory, metadata)
    for batch in batches:
        state = {key: torch.empty(entries[key].size, dtype=entries[key].properties.dtype)
                 for key in batch}  # fmt: skip
        dcp.load(state, storage_reader=reader, no_dist=True)
        tally.tensors += len(batch)
        tally.batches += 1
        del state
        _give_back_memory()


def _read_the_rest(
    directory: str, metadata: Any, loaded: set[str], sizes: dict[str, int], tally: _Tally
) -> None:
    """Every stored piece not loaded read as bytes (tensors too large for a batch, non-tensor
    values, pieces no key names), so that every shard file is read."""
    storage = metadata.storage_data
    read = {info.relative_path for index, info in storage.items() if index.fqn in loaded}
    for index, info in storage.items():
        if index.fqn in loaded:
            continue
        fd = fsread.open_regular(os.path.join(directory, info.relative_path))
        try:
            _read_range(fd, info.offset, info.length, info.relative_path)
        finally:
            os.close(fd)
        read.add(info.relative_path)
        if index.fqn in sizes:
            tally.unparsed_bytes += info.length
        else:
            tally.object_bytes += info.length
    tally.shards += len({info.relative_path for info in storage.values()})
    tally.shards_read += len(read)


def _read_range(fd: int, start: int, length: int, what: str, crc: int | None = None) -> int:
    """Read ``length`` bytes from ``start`` in pieces; with ``crc``, their CRC-32 from it."""
    position, end = start, start + length
    while position < end:
        piece = os.pread(fd, min(end - position, _PIECE), position)
        if not piece:
            raise LoadError(f"{what} is cut short: {end - position} of its bytes are missing")
        if crc is not None:
            crc = zlib.crc32(piece, crc)
        position += len(piece)
    return crc or 0


def _read_zip(path: str, tally: _Tally) -> None:
    with os.fdopen(fsread.open_regular(path), "rb") as file, zipfile.ZipFile(file) as archive:
        for info in archive.infolist():
            checked = _read_record(file, archive, info)
            tally.unchecked_records += not checked
            if _STORAGE_RECORD.fullmatch(info.filename):
                tally.records += 1
                tally.record_bytes += info.file_size
    tally.files += 1


def _read_record(file: io.BufferedReader, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bool:
    """Read one record in pieces; whether its CRC-32 was checked (torch writes 0 where
    ``set_crc32_options(False)`` turned it off)."""
    if info.compress_type != zipfile.ZIP_STORED:  # not torch's: zipfile checks it as it inflates
        with archive.open(info) as record:
            while record.read(_PIECE):
                pass
        return True
    file.seek(info.header_offset)
    header = file.read(30)
    if len(header) < 30 or header[:4] != b"PK\x03\x04":
        raise LoadError(f"{info.filename}: no record header at offset {info.header_offset}")
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    start = info.header_offset + 30 + name_length + extra_length
    crc = _read_range(file.fileno(), start, info.compress_size, info.filename, crc=0)
    if info.CRC == 0 and crc != 0:
        return False
    if crc != info.CRC:
        raise LoadError(f"{info.filename}: bad CRC-32 (recorded {info.CRC:08x}, read {crc:08x})")
    return True


# Bytes per element of each safetensors dtype; another dtype's tensors are read, not sized.
_SAFETENSORS_DTYPES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
    "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip
_SAFETENSORS_HEADER_LIMIT = 64 << 20  # the structural check's own limit (validate.py)


def _read_safetensors(path: str, tally: _Tally) -> None:
    fd = fsread.open_regular(path)
    try:
        (length,) = struct.unpack("<Q", os.pread(fd, 8, 0).ljust(8, b"\0"))
        if length > _SAFETENSORS_HEADER_LIMIT:
            raise LoadError(f"a header of {length} bytes")
        header = json_value(os.pread(fd, length, 8))
        for name, entry in header.items():
            if name != "__metadata__":
                tally.safetensors_bytes += _read_tensor(fd, 8 + length, name, entry)
                tally.safetensors += 1
    finally:
        os.close(fd)
    tally.safetensors_files += 1


def _read_tensor(fd: int, base: int, name: str, entry: dict[str, Any]) -> int:
    """Read one safetensors tensor; its size in bytes."""
    start, end = entry["data_offsets"]
    width = _SAFETENSORS_DTYPES.get(entry["dtype"])
    if width is not None and math.prod(entry["shape"]) * width != end - start:
        raise LoadError(
            f"{name}: {entry['dtype']} of shape {entry['shape']} is "
            f"{math.prod(entry['shape']) * width} bytes, its data_offsets hold {end - start}"
        )
    _read_range(fd, base + start, end - start, name)
    return end - start


def _worker(loads: list[tuple[str, str]], max_bytes: int) -> int:
    warnings.filterwarnings("ignore")  # DCP warns that it loads without a process group
    version = None
    if any(kind == DCP for kind, _ in loads):
        try:
            import torch
        except ImportError as error:
            print(f"{error}", file=sys.stderr)
            return _NO_TORCH
        version = torch.__version__
    print(json.dumps({"torch": version}), flush=True)
    if sys.stdin.readline().strip() != "go":
        return EXIT_OK  # the drill ended before the load (its structural check failed)
    tally = _Tally(max_bytes)
    for kind, path in loads:
        try:
            if kind == DCP:
                _load_dcp(path, tally)
            elif kind == SAFETENSORS:
                _read_safetensors(path, tally)
            else:
                _read_zip(path, tally)
        except Exception as error:  # whatever the reason, a load that raised is a failed one
            print(f"{path}: {type(error).__name__}: {error}", file=sys.stderr)
            return EXIT_FAILED
    tally.peak_rss = _status_bytes("VmHWM")
    print(json.dumps(asdict(tally)))
    return EXIT_OK


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--load":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        loads = [(kind, path) for kind, path in json.loads(sys.argv[2])]
        sys.exit(_worker(loads, int(sys.argv[3])))
    print("usage: python -m checkpoint_exporter.restore --load JSON MAX_BYTES", file=sys.stderr)
    sys.exit(EXIT_USAGE)
