"""Pickles a tenant can plant in a checkpoint tree, written opcode by opcode (no torch needed):
files that repeat themselves in a refusal, cost CPU rather than memory, or ask for memory far
beyond their size."""

from __future__ import annotations

import struct

METADATA = "torch.distributed.checkpoint.metadata"
FILESYSTEM = "torch.distributed.checkpoint.filesystem"


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _text(value: str) -> bytes:
    data = value.encode()
    return b"\x8d" + struct.pack("<Q", len(data)) + data  # BINUNICODE8


def _int(value: int) -> bytes:
    return b"J" + struct.pack("<i", value)  # BININT


def _record(module: str, name: str, state: dict[str, bytes]) -> bytes:
    """GLOBAL, EMPTY_TUPLE, NEWOBJ, then BUILD with the state dict: how a dataclass pickles."""
    items = b"".join(_text(key) + value for key, value in state.items())
    return _global(module, name) + b")\x81}(" + items + b"ub"


def metadata_naming(relative_path: str, length: int = 1) -> bytes:
    """DCP metadata (allowlisted classes only) whose one shard is ``relative_path``."""
    info = _record(
        FILESYSTEM,
        "_StorageInfo",
        {"relative_path": _text(relative_path), "offset": _int(0), "length": _int(length)},
    )
    storage = b"}(" + _int(0) + info + b"u"
    return b"\x80\x04" + _record(METADATA, "Metadata", {"storage_data": storage}) + b"."


def refused_global(module: str) -> bytes:
    """A global the allowlist refuses, by a module name of the tenant's choosing."""
    return b"\x80\x04" + _global(module, "Size") + b"."


def size_over_memoized_list(items: int, rebuilds: int) -> bytes:
    """torch.Size (allowlisted) over one memoized list of ``items`` ints, ``rebuilds`` times:
    each call copies the list and each result is dropped, so it costs CPU, not memory."""
    head = b"\x80\x04" + _global("torch", "Size") + b"q\x00" + b"0"  # BINPUT 0, POP
    listed = b"]q\x01(" + b"\x88" * items + b"e0"  # EMPTY_LIST, BINPUT 1, MARK, NEWTRUE..., APPENDS
    rebuild = b"h\x00h\x01\x85R0"  # BINGET 0, BINGET 1, TUPLE1, REDUCE, POP
    return head + listed + rebuild * rebuilds + b"N."


def allocation_bomb(size: int, framed: bool = False) -> bytes:
    """``size`` empty dicts (73 times their bytes in memory), optionally in one FRAME: a frame is
    read whole, so how far the parser got inside it cannot be seen."""
    body = b"}" * size + b"."
    if framed:
        return b"\x80\x04\x95" + struct.pack("<Q", len(body)) + body
    return b"\x80\x04" + body


def costly_step_pickle(pairs: int, step: int = 5) -> bytes:
    """A Lightning-like data.pkl whose ``global_step`` comes after ``2 * pairs`` cheap opcodes:
    as costly as the opcode scan accepts when ``pairs`` is near 1.5 million."""
    tail = b"X\x0b\x00\x00\x00global_stepK" + bytes([step]) + b"u."
    return b"\x80\x02}q\x00(" + b"N0" * pairs + tail
