"""Reads PyTorch DCP ``.metadata`` without torch and without trusting it.

``.metadata`` is a pickle, and a pickle is a program: anyone who can write into a checkpoint
tree could make a naive reader run code. This reader's ``find_class`` maps the handful of names
a real DCP metadata file references to inert stand-ins defined here, and refuses every other
global, so nothing from the file is ever imported or called. The file is read whole under a size
cap before parsing, which bounds memory and time (the pickle machine is linear in its input).
"""

from __future__ import annotations

import io
import pickle
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checkpoint_exporter import fsread

DEFAULT_SIZE_LIMIT = 256 * 1024 * 1024


class MetadataError(ValueError):
    """The file is not a DCP metadata pickle we can trust."""


class _Record:
    """An inert object: pickle BUILD stores the state as plain data and calls nothing."""

    def __init__(self, *args: object) -> None:
        self.args = args
        self.state: dict[str, Any] = {}

    def __setstate__(self, state: object) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots) of a slotted class
            merged: dict[Any, Any] = {}
            for part in state:
                if isinstance(part, dict):
                    merged.update(part)
            state = merged
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise MetadataError("unexpected object state in metadata")
        self.state = dict(state)

    def get(self, key: str, default: object = None) -> Any:
        return self.state.get(key, default)


# One stand-in class per real class, so a misplaced object is recognisable by type.
class Metadata(_Record): ...


class StorageInfo(_Record): ...


class MetadataIndex(_Record): ...


class StorageMeta(_Record): ...


class _Opaque(_Record):
    """Tensor and chunk descriptions: kept as plain data, never interpreted."""

    def __setstate__(self, state: object) -> None:
        self.raw_state = state  # TensorProperties pickles a tuple of its own


# Megatron-core's torch_dist writer (dist_checkpointing/strategies/state_dict_saver.py,
# ``save_state_dict_async_plan``) stores every rank's local save plan in the metadata
# (``global_metadata.all_local_plans``, to reuse it on the next save): a list of ``SavePlan`` of
# ``WriteItem`` (``type`` a ``WriteItemType`` enum, ``tensor_data`` a ``TensorWriteData``).
# Read megatron-core 0.16.1 with torch 2.13. Kept as plain data, never interpreted.
class SavePlan(_Opaque): ...


class WriteItem(_Opaque): ...


class TensorWriteData(_Opaque): ...


def _path(*parts: object) -> str:
    if not all(isinstance(part, str) for part in parts):
        raise MetadataError("a path in metadata is not made of strings")
    return "/".join(str(part) for part in parts)


def _plain(value: object = None) -> object:
    """Stand-in for enum and layout constructors: returns its argument, unchanged."""
    return value


def _size(values: object = ()) -> tuple[object, ...]:
    if not isinstance(values, (list, tuple)):
        raise MetadataError("torch.Size of something that is not a sequence")
    return tuple(values)


_METADATA_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed._shard.sharded_tensor.metadata",  # TensorProperties in older releases
    "torch.distributed._shard.metadata",
)
_CLASSES: dict[str, Callable[..., object]] = {
    "Metadata": Metadata,
    "MetadataIndex": MetadataIndex,
    "StorageMeta": StorageMeta,
    "TensorStorageMetadata": _Opaque,
    "ChunkStorageMetadata": _Opaque,
    "BytesStorageMetadata": _Opaque,
    "TensorProperties": _Opaque,
    "_MEM_FORMAT_ENCODING": _plain,
    "MEM_FORMAT_ENCODING": _plain,
}
_DTYPES = frozenset(
    f"{prefix}{bits}"
    for prefix, sizes in (
        ("float", (8, 16, 32, 64)),
        ("int", (8, 16, 32, 64)),
        ("uint", (8, 16, 32, 64)),
        ("complex", (32, 64, 128)),
    )
    for bits in sizes
) | {
    "bfloat16", "bool", "half", "double", "long", "int", "short", "cfloat", "cdouble",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
    "qint8", "quint8", "qint32", "quint4x2",
}  # fmt: skip
_ALLOWED: dict[tuple[str, str], Callable[..., object]] = {
    **{(module, name): cls for module in _METADATA_MODULES for name, cls in _CLASSES.items()},
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): StorageInfo,
    # Exactly the planner classes a real megatron-core save references, nothing more of that
    # module (no LoadPlan, ReadItem, planners).
    ("torch.distributed.checkpoint.planner", "SavePlan"): SavePlan,
    ("torch.distributed.checkpoint.planner", "WriteItem"): WriteItem,
    ("torch.distributed.checkpoint.planner", "WriteItemType"): _plain,  # an enum: its value
    ("torch.distributed.checkpoint.planner", "TensorWriteData"): TensorWriteData,
    ("torch.serialization", "_get_layout"): _plain,
    ("torch", "Size"): _size,
    ("pathlib", "PosixPath"): _path,
    ("pathlib", "PurePosixPath"): _path,
    ("collections", "OrderedDict"): dict,
}


class _AllowlistUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in _DTYPES:
            return f"torch.{name}"  # a dtype is a value, referenced by name only
        stand_in = _ALLOWED.get((module, name))
        if stand_in is None:
            raise MetadataError(f"refused to load {module}.{name} from checkpoint metadata")
        return stand_in

    def persistent_load(self, pid: object) -> Any:
        raise MetadataError("persistent references are not allowed in checkpoint metadata")


@dataclass(frozen=True)
class ShardExtent:
    relative_path: str
    end: int  # offset + length: the file must be at least this long


@dataclass(frozen=True)
class DcpMetadata:
    version: str | None
    save_id: str | None
    shards: dict[str, int]  # relative path -> minimum size in bytes


def loads(data: bytes) -> DcpMetadata:
    """Parse metadata bytes; raises MetadataError for anything untrusted or malformed."""
    try:
        root = _AllowlistUnpickler(io.BytesIO(data)).load()
    except MetadataError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, OverflowError, MemoryError, RecursionError) as error:  # fmt: skip
        raise MetadataError(f"not a readable metadata pickle: {error}") from None
    if not isinstance(root, Metadata):
        raise MetadataError(f"top-level object is {type(root).__name__}, not DCP Metadata")
    storage = root.get("storage_data")
    if not isinstance(storage, dict):
        raise MetadataError("metadata has no storage_data mapping")
    shards: dict[str, int] = {}
    for info in storage.values():
        if not isinstance(info, StorageInfo):
            raise MetadataError("storage_data holds something other than storage records")
        relative, offset, length = (info.get(k) for k in ("relative_path", "offset", "length"))
        if (
            not isinstance(relative, str)
            or not isinstance(offset, int)
            or not isinstance(length, int)
        ):
            raise MetadataError("a storage record lacks relative_path, offset or length")
        if offset < 0 or length < 0:
            raise MetadataError(f"negative offset or length for {relative!r}")
        key = _inside(relative)
        shards[key] = max(shards.get(key, 0), offset + length)
    storage_meta = root.get("storage_meta")
    save_id = storage_meta.get("save_id") if isinstance(storage_meta, StorageMeta) else None
    version = root.get("version")
    return DcpMetadata(
        version if isinstance(version, str) else None,
        save_id if isinstance(save_id, str) else None,
        shards,
    )


def _inside(relative: str) -> str:
    """The shard's path, refusing one that would leave the checkpoint directory."""
    normalized = posixpath.normpath(relative)
    if (
        not relative
        or relative.startswith(("/", "\\"))
        or normalized == ".."
        or normalized.startswith("../")
        or "\x00" in relative
    ):
        raise MetadataError(f"shard path {relative!r} leaves the checkpoint directory")
    return normalized


def read(path: str, size_limit: int = DEFAULT_SIZE_LIMIT) -> DcpMetadata:
    """Read and parse a ``.metadata`` file (a regular file, never through a symlink)."""
    try:
        data = fsread.read_bytes(path, size_limit)
    except ValueError as error:
        raise MetadataError(str(error)) from None
    return loads(data)
