"""Structural validation of a committed generation, cheap and without loading tensors.

Each ``Check`` a layout attaches is run here: DCP metadata against its shards, the zip trailer of
torch.save files, safetensors headers and indexes, and (opt-in) Megatron's sha256 manifest.
Everything is read through ``fsread`` (read-only, no symlinks, no FIFOs).
"""

from __future__ import annotations

import errno
import hashlib
import os
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import checkpoint_exporter.sources.layouts.dcp as dcp_layout
from checkpoint_exporter.model import (  # noqa: F401 - REASONS and the reasons re-exported
    BAD_METADATA,
    BAD_ZIP,
    CHECKSUM,
    DCP,
    INTEGRITY,
    MISSING_SHARD,
    REASONS,
    SAFETENSORS,
    SAFETENSORS_INDEX,
    TRUNCATED_SHARD,
    VALID,
    ZIP,
    ZIP_STEP,
    Check,
    Verdict,
)
from checkpoint_exporter.sources import ckpt_step, dcp_metadata, fsread
from checkpoint_exporter.sources.listing import Dir
from checkpoint_exporter.sources.untrusted import INT64_MAX, bounded_int, excerpt, json_value

_EOCD = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP_TAIL = 22 + 65535  # the end record plus the longest comment
_JSON_LIMIT = 64 * 1024 * 1024


@dataclass
class Limits:
    metadata_bytes: int = dcp_metadata.DEFAULT_SIZE_LIMIT
    checksum_bytes_per_second: float = 200e6  # 0 = unlimited
    # The daemon parses metadata in a memory-capped worker; None parses here (tools, tests).
    metadata_parser: dcp_metadata.IsolatedParser | None = None


class _Invalid(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.verdict = Verdict(False, reason, detail)


class _Unchecked(Exception):
    """The check could not run: not the checkpoint's fault, no verdict."""


# The file cannot be what the checkpoint names (a directory or a symlink in its way, a name
# too long): as good as missing.
_NOT_THERE = frozenset({errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG})


def _failed(error: OSError | UnicodeError, label: str, reason: str) -> Exception:
    """What an error met while checking ``label`` says, and about whom."""
    if isinstance(error, UnicodeError):
        return _Invalid(BAD_METADATA, f"names a path no filesystem can hold: {label!r}")
    if isinstance(error, PermissionError):
        return error  # the exporter's user may not read it: skipped and said (validate)
    if isinstance(error, fsread.NotBeneath):  # never followed, wherever it points
        detail = error.strerror if error.component == label else f"{label}: {error.strerror}"
        return _Invalid(MISSING_SHARD, detail)
    if isinstance(error, FileNotFoundError) or error.errno in _NOT_THERE:
        return _Invalid(MISSING_SHARD, f"{label} is missing ({error.strerror or error})")
    if isinstance(error, fsread.NotRegularFile):
        return _Invalid(MISSING_SHARD, f"{label} is not a regular file")
    # EIO, ESTALE, a timeout: the storage's trouble, or ours, not proof about the checkpoint.
    return _Unchecked(f"{label}: {error.strerror or error}")


def validate(
    root: str, checks: Sequence[Check], limits: Limits | None = None, tree: Dir | None = None
) -> Verdict:
    """The first failing check's verdict, or VALID. ``root`` is the tier root directory;
    ``tree``, its latest listing where the caller has one (sizes are then taken from it, and
    looked at again only when they look too small)."""
    limits = limits or Limits()
    runners = {
        DCP: _dcp,
        ZIP: _zip,
        SAFETENSORS: _safetensors,
        SAFETENSORS_INDEX: _safetensors_index,
        INTEGRITY: _integrity,
        ZIP_STEP: _zip_step,
    }
    step = None  # the first step a check read inside the generation
    unreadable: list[str] = []
    try:
        for check in checks:
            try:
                listing = tree.directory_of(check.path) if tree is not None else None
                read = runners[check.kind](os.path.join(root, check.path), check, limits, listing)
            except PermissionError:
                # The exporter's own user may not read it (writers such as safetensors create
                # mode 0600 files): not the checkpoint's fault, so the check is skipped and said.
                unreadable.append(check.path)
                continue
            step = read if step is None and isinstance(read, int) else step
    except _Invalid as invalid:
        return invalid.verdict
    except _Unchecked as unchecked:
        return Verdict(False, None, f"not checked: {unchecked}", unchecked=True)
    if unreadable:
        detail = "not readable by the exporter, not checked: " + ", ".join(unreadable[:5])
        return Verdict(True, detail=detail, step=step)
    return VALID if step is None else Verdict(True, step=step)


def _listed_sizes(listing: Dir | None) -> dict[str, int]:
    """Size by relative path of every regular file below the listed directory: the listing
    lstat-ed each and entered no symlink."""
    return {relative: size for relative, size, _ in listing.walk()} if listing is not None else {}


def _size(path: str, relative: str, listed: dict[str, int]) -> int:
    """The size of the regular file ``relative`` names below the directory ``path`` (a name
    read inside the checkpoint): the listing's, else an lstat beneath ``path`` that follows no
    symlink, when it looks too small or is not listed."""
    if relative in listed:
        return listed[relative]
    try:
        with _directory(path) as directory:
            return fsread.stat_regular_beneath(relative, directory).st_size
    except (OSError, UnicodeError) as error:
        raise _failed(error, relative, MISSING_SHARD) from None


@contextmanager
def _directory(path: str) -> Iterator[int]:
    """A descriptor of ``path``, the directory a check was handed (reached safely by its caller:
    the scanner hands /proc/self/fd/N of a descriptor it opened beneath the tier root)."""
    fd = fsread.open_directory(path, follow_symlink=True)
    try:
        yield fd
    finally:
        os.close(fd)


def _dcp(path: str, check: Check, limits: Limits, listing: Dir | None) -> None:
    names = dcp_layout.metadata_files(listing) if listing is not None else [dcp_layout.METADATA]
    for name in names or [dcp_layout.METADATA]:
        try:
            metadata = dcp_metadata.read(
                os.path.join(path, name), limits.metadata_bytes, limits.metadata_parser
            )
        except dcp_metadata.ParserUnavailable as error:
            raise _Unchecked(f"{name}: {error}") from None
        except dcp_metadata.MetadataError as error:
            raise _Invalid(BAD_METADATA, f"{name}: {error}") from None
        except (OSError, UnicodeError) as error:
            raise _failed(error, name, BAD_METADATA) from None
        listed = _listed_sizes(listing)
        for relative, needed in sorted(metadata.shards.items()):
            size = _size(path, relative, listed)
            if size < needed:
                # The listing may predate the last write: look again before calling it truncated.
                size = _size(path, relative, {})
            if size < needed:
                raise _Invalid(
                    TRUNCATED_SHARD,
                    f"{excerpt(relative)} is {size} bytes, metadata needs {needed}",
                )


def _zip(path: str, check: Check, limits: Limits, listing: Dir | None) -> None:
    _whole_zip(path, check)


def _zip_step(path: str, check: Check, limits: Limits, listing: Dir | None) -> int | None:
    """The zip check, then the ``global_step`` inside (``ckpt_step``, never unpickled), both
    on one descriptor: a file renamed over meanwhile cannot lend its step to the checked one.
    The daemon's scan runs in the parser's worker, under its CPU budget: up to seconds of CPU
    per file, never on the daemon's own threads."""
    parser = limits.metadata_parser
    if parser is None:
        return _whole_zip(path, check, ckpt_step.step_in)
    try:
        return _whole_zip(path, check, lambda fd, size: parser.step(fd))
    except dcp_metadata.ParserUnavailable as error:
        raise _Unchecked(f"{check.path}: {error}") from None


def _whole_zip(
    path: str, check: Check, then: Callable[[int, int], int | None] | None = None
) -> int | None:
    """A torch.save zip must end in its end record; ``then(fd, size)`` reads on from there."""
    try:
        fd = fsread.open_regular(path)
    except OSError as error:
        raise _failed(error, check.path, BAD_ZIP) from None
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - _ZIP_TAIL)
        if _end_record(os.pread(fd, size - start, start), size) is None:
            raise _Invalid(BAD_ZIP, f"{check.path} has no zip end-of-central-directory record")
        return then(fd, size) if then is not None else None
    except OSError as error:
        raise _failed(error, check.path, BAD_ZIP) from None
    finally:
        os.close(fd)


def _end_record(tail: bytes, size: int) -> tuple[int, int] | None:
    """(central directory offset, size) of the zip's end record, when it is intact."""
    position = tail.rfind(_EOCD)
    while position >= 0:
        if len(tail) - position >= 22:
            directory_size, directory_offset, comment_length = struct.unpack_from(
                "<IIH", tail, position + 12
            )
            if position + 22 + comment_length == len(tail):
                start = size - len(tail)
                if directory_offset == 0xFFFFFFFF or directory_size == 0xFFFFFFFF:
                    # ZIP64: a locator must sit right before the end record.
                    if position >= 20 and tail[position - 20 : position - 16] == _ZIP64_LOCATOR:
                        return directory_offset, directory_size
                elif directory_offset + directory_size <= start + position:
                    return directory_offset, directory_size
        position = tail.rfind(_EOCD, 0, position)
    return None


def _safetensors(path: str, check: Check, limits: Limits, listing: Dir | None) -> None:
    try:
        fd = fsread.open_regular(path)
    except OSError as error:
        raise _failed(error, check.path, MISSING_SHARD) from None
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            raise _Invalid(TRUNCATED_SHARD, f"{check.path} is shorter than its header")
        (header_length,) = struct.unpack("<Q", head)
        if header_length > min(_JSON_LIMIT, size):
            raise _Invalid(TRUNCATED_SHARD, f"{check.path}: header of {header_length} bytes")
        try:
            header = json_value(os.pread(fd, header_length, 8))
            ends = [
                entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"
            ]
            if not all(bounded_int(end, INT64_MAX) is not None for end in ends):
                raise ValueError("data_offsets are not integers from 0 to 2**63 - 1")
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as error:
            raise _Invalid(BAD_METADATA, f"{check.path}: unreadable header ({error})") from None
        needed = 8 + header_length + max(ends, default=0)
        if size < needed:
            raise _Invalid(TRUNCATED_SHARD, f"{check.path} is {size} bytes, header needs {needed}")
    finally:
        os.close(fd)


def _json(path: str, label: str) -> object:
    try:
        data = fsread.read_bytes(path, _JSON_LIMIT)
    except OSError as error:
        raise _failed(error, label, BAD_METADATA) from None
    except ValueError as error:  # over the size limit
        raise _Invalid(BAD_METADATA, f"{label}: {error}") from None
    try:
        return json_value(data)
    except ValueError as error:
        raise _Invalid(BAD_METADATA, f"{label}: {error}") from None


def _outside(name: str) -> bool:
    """A path named inside a checkpoint's own files that would lead out of it."""
    return os.path.isabs(name) or ".." in name.split("/") or "\0" in name


def _safetensors_index(path: str, check: Check, limits: Limits, listing: Dir | None) -> None:
    index = _json(path, check.path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise _Invalid(BAD_METADATA, f"{check.path} has no weight_map")
    directory, listed = os.path.dirname(path), _listed_sizes(listing)
    for shard in sorted({str(name) for name in weight_map.values()}):
        if _outside(shard):
            raise _Invalid(BAD_METADATA, f"{check.path} names {shard!r}, outside the checkpoint")
        _size(directory, shard, listed)


def _integrity(path: str, check: Check, limits: Limits, listing: Dir | None) -> None:
    manifest = _json(os.path.join(path, "integrity.json"), f"{check.path}/integrity.json")
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or manifest.get("algorithm", "sha256") != "sha256":
        raise _Invalid(BAD_METADATA, f"{check.path}/integrity.json is not a sha256 manifest")
    try:
        with _directory(path) as directory:
            for name, expected in sorted(files.items()):
                _compare_sha256(name, expected, directory, limits)
    except (OSError, UnicodeError) as error:  # the generation's own directory
        raise _failed(error, check.path, MISSING_SHARD) from None


def _compare_sha256(name: object, expected: object, directory: int, limits: Limits) -> None:
    """One manifest entry: ``name`` read beneath ``directory``, its digest against ``expected``."""
    if not isinstance(name, str) or _outside(name):
        raise _Invalid(BAD_METADATA, f"integrity.json names {name!r}, outside the checkpoint")
    try:
        actual = _sha256(name, directory, limits.checksum_bytes_per_second)
    except (OSError, UnicodeError) as error:
        raise _failed(error, name, MISSING_SHARD) from None
    if actual != str(expected).lower():
        raise _Invalid(CHECKSUM, f"{name}: sha256 {actual} does not match the manifest")


def _sha256(relative: str, dir_fd: int, bytes_per_second: float) -> str:
    """The sha256 of the file ``relative`` names beneath ``dir_fd`` (never through a symlink),
    reading no faster than ``bytes_per_second`` (0: unlimited)."""
    digest = hashlib.sha256()
    fd = fsread.open_regular_beneath(relative, dir_fd)
    started, done = time.monotonic(), 0
    try:
        while chunk := os.read(fd, 4 << 20):
            digest.update(chunk)
            done += len(chunk)
            if bytes_per_second > 0:
                ahead = done / bytes_per_second - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
    finally:
        os.close(fd)
    return digest.hexdigest()
