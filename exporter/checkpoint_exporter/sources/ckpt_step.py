"""The training step recorded inside a ``torch.save`` checkpoint, read without unpickling.

Lightning's ``last.ckpt`` (and any ``.ckpt`` whose file name template has no ``{step}``, and a
sharded checkpoint's ``meta.pt``) records its step only inside the file: the checkpoint dict's
``'global_step'`` in the zip's ``<archive>/data.pkl``. This module finds that record through the
zip's own directory and reads the pickle's opcodes as data (``pickletools.genops``): nothing is
ever unpickled, imported or called.

Everything is bounded: the zip end record and the start of the central directory (tens of KiB),
one local header, a ``data.pkl`` of at most ``PICKLE_BYTES`` and ``OPCODES`` opcodes. Although
Lightning's ``dump_checkpoint`` puts ``global_step`` second in the dict, the pair is only known
to be the top-level dict's own when the SETITEMS that takes it arrives (an int on the stack may
still become a nested tuple's first item), which is after ``state_dict`` and the optimizer
states: the whole of a Lightning ``data.pkl`` is scanned, not the whole checkpoint. Anything
unexpected (not a zip, a compressed or ZIP64-offset ``data.pkl``, a pickle that is not a
protocol 1+ dict, no integer ``global_step`` among its top-level keys, a file changing under the
read) gives None, "unknown": never an exception, never a guess.
"""

from __future__ import annotations

import io
import os
import pickletools
import struct

from checkpoint_exporter.sources import fsread, untrusted

KEY = "global_step"
TAIL_BYTES = 22 + 65535  # the end record plus the longest comment
DIRECTORY_BYTES = 64 * 1024  # torch writes data.pkl first: its entry opens the directory
DIRECTORY_ENTRIES = 256
# data.pkl holds one persistent id per tensor (about 80 bytes, 30 opcodes): a model of 3,000
# parameters with Adam's state is a 1 MB data.pkl, 360,000 opcodes, scanned in about 0.25 s.
# The step is confirmed only where the dict's batch of items ends, after the state dicts.
PICKLE_BYTES = 8 * 1024 * 1024
OPCODES = 3_000_000

_EOCD = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_EOCD = b"PK\x06\x06"
_CENTRAL = b"PK\x01\x02"
_LOCAL = b"PK\x03\x04"
_STORED = 0
_FULL32 = 0xFFFFFFFF
_FULL16 = 0xFFFF


class _Unexpected(Exception):
    """The bytes are not what torch.save writes: the step is unknown."""


def read_step(path: str | os.PathLike[str]) -> int | None:
    """The ``global_step`` inside the torch.save zip at ``path``, or None."""
    try:
        fd = fsread.open_regular(path)
    except OSError:
        return None
    try:
        return step_in(fd, os.fstat(fd).st_size)
    except OSError:
        return None
    finally:
        os.close(fd)


def step_in(fd: int, size: int) -> int | None:
    """The ``global_step`` inside the torch.save zip open as ``fd`` (``size`` bytes), or None.

    The bytes are untrusted: whatever they hold, the answer is an int or None."""
    try:
        directory_offset, directory_size, end = _directory(fd, size)
        name, local_offset, length = _data_pkl(fd, directory_offset, directory_size)
        start = _data_start(fd, local_offset, name)
        if start + length > directory_offset or directory_offset > end:
            raise _Unexpected("data.pkl overlaps the central directory")
        return _scan_pickle(fd, start, length)
    except (_Unexpected, struct.error, ValueError, OverflowError, OSError):
        return None


def _pread(fd: int, count: int, offset: int) -> bytes:
    """Exactly ``count`` bytes at ``offset``, or _Unexpected (the file is shorter)."""
    if count < 0 or offset < 0:
        raise _Unexpected("negative range")
    data = os.pread(fd, count, offset)
    if len(data) != count:
        raise _Unexpected("short read")
    return data


def _directory(fd: int, size: int) -> tuple[int, int, int]:
    """(central directory offset, size, offset of the end record) from the zip's end."""
    start = max(0, size - TAIL_BYTES)
    tail = _pread(fd, size - start, start)
    position = tail.rfind(_EOCD)
    while position >= 0:
        if len(tail) - position >= 22:
            disk, _, _, entries, directory_size, directory_offset, comment = struct.unpack_from(
                "<HHHHIIH", tail, position + 4
            )
            if position + 22 + comment == len(tail):
                end = start + position
                if _FULL32 in (directory_size, directory_offset) or _FULL16 in (disk, entries):
                    return _zip64_directory(fd, tail, position, end)
                return directory_offset, directory_size, end
        position = tail.rfind(_EOCD, 0, position)
    raise _Unexpected("no end record")


def _zip64_directory(fd: int, tail: bytes, position: int, end: int) -> tuple[int, int, int]:
    if position < 20 or tail[position - 20 : position - 16] != _ZIP64_LOCATOR:
        raise _Unexpected("ZIP64 end record without its locator")
    (record_offset,) = struct.unpack_from("<Q", tail, position - 20 + 8)
    record = _pread(fd, 56, record_offset)
    if record[:4] != _ZIP64_EOCD or record_offset + 56 > end:
        raise _Unexpected("no ZIP64 end record where the locator points")
    directory_size, directory_offset = struct.unpack_from("<QQ", record, 40)
    return directory_offset, directory_size, record_offset


def _data_pkl(fd: int, directory_offset: int, directory_size: int) -> tuple[bytes, int, int]:
    """(name, local header offset, length) of ``<archive>/data.pkl`` from the directory."""
    directory = _pread(fd, min(directory_size, DIRECTORY_BYTES), directory_offset)
    position = 0
    for _ in range(DIRECTORY_ENTRIES):
        if len(directory) - position < 46 or directory[position : position + 4] != _CENTRAL:
            break
        fields = struct.unpack_from("<HHHHHHIIIHHHHHII", directory, position + 4)
        method, compressed, uncompressed = fields[3], fields[7], fields[8]
        name_length, extra_length, comment_length, local_offset = (
            fields[9],
            fields[10],
            fields[11],
            fields[15],
        )
        name_end = position + 46 + name_length
        if len(directory) < name_end:
            break
        name = directory[position + 46 : name_end]
        if _is_data_pkl(name):
            if method != _STORED or compressed != uncompressed:
                raise _Unexpected("data.pkl is not stored uncompressed")
            if _FULL32 in (compressed, local_offset):
                raise _Unexpected("data.pkl behind a ZIP64 extra field")  # torch writes it first
            return name, local_offset, compressed
        position = name_end + extra_length + comment_length
    raise _Unexpected("no data.pkl among the first directory entries")


def _is_data_pkl(name: bytes) -> bool:
    """``<archive>/data.pkl``: torch names every record below one top folder."""
    folder, slash, rest = name.partition(b"/")
    return bool(folder) and bool(slash) and rest == b"data.pkl"


def _data_start(fd: int, local_offset: int, name: bytes) -> int:
    header = _pread(fd, 30, local_offset)
    if header[:4] != _LOCAL:
        raise _Unexpected("no local header where the directory points")
    name_length, extra_length = struct.unpack_from("<HH", header, 26)
    if _pread(fd, name_length, local_offset + 30) != name:
        raise _Unexpected("the local header names another record")
    return local_offset + 30 + name_length + extra_length


def _scan_pickle(fd: int, start: int, length: int) -> int | None:
    if length > PICKLE_BYTES:
        return None  # a pickle this big is not worth reading for one number
    return pickle_step(_pread(fd, length, start))


# --- the pickle, as data ------------------------------------------------------------------------


class _Token:
    """A stack slot whose value the scan does not need."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


_MARK = _Token("mark")
_TOP = _Token("top-level dict")
_OTHER = _Token("other")
_STRING_OPS = frozenset(
    {"BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING"}
)
_INT_OPS = frozenset({"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG"})
_MEMO_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"})
_GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PREAMBLE = frozenset({"PROTO", "FRAME"})
_FILLS = frozenset({"SETITEM", "SETITEMS"})
_MEMO_ENTRIES = 65536


def _effect(opcode: pickletools.OpcodeInfo) -> tuple[bool, int, bool, int]:
    """(pops to a mark, objects popped below it (or in all), pushes a mark, objects pushed)."""
    before, after = opcode.stack_before, opcode.stack_after
    to_mark = pickletools.markobject in before
    below = before.index(pickletools.markobject) if to_mark else len(before)
    return to_mark, below, pickletools.markobject in after, len(after)


_EFFECTS = {opcode.name: _effect(opcode) for opcode in pickletools.opcodes}


def pickle_step(data: bytes, key: str = KEY, opcodes: int = OPCODES) -> int | None:
    """The int a pickled top-level dict holds under ``key``, found by reading opcodes only.

    An abstract stack follows each opcode's documented stack effect (``pickletools``), keeping
    values only for strings and ints. The top-level dict is the pickle's first object; a pair
    is its own only when a SETITEMS on the dict's own mark (or a SETITEM right on the dict)
    takes it: until then an int on the stack may still become part of a nested tuple or dict,
    so the scan reads up to the first batch that holds ``key``. None when the pickle is not a
    dict, holds no int under ``key`` (or one no step can be: negative, past 2**53), is cut
    short, or needs more than ``opcodes`` opcodes."""
    try:
        step = _pickle_step(data, key, opcodes)
    except (_Unexpected, ValueError, TypeError, IndexError, KeyError, OverflowError, EOFError):
        return None  # pickletools' readers raise ValueError on cut or malformed arguments
    return untrusted.step(step)  # never negative; a float holds it exactly


def _pickle_step(data: bytes, key: str, limit: int) -> int | None:
    stack: list[object] = []
    marks = 0  # marks on the stack
    memo: dict[object, object] = {}
    memoized = 0  # MEMOIZE's next index (protocol 4)
    for seen, (opcode, arg, _) in enumerate(pickletools.genops(io.BytesIO(data)), 1):
        name = opcode.name
        if seen > limit or name == "STOP":
            return None
        if not stack:
            if name in _PREAMBLE:
                continue
            if name != "EMPTY_DICT":
                raise _Unexpected("the pickle does not open with a dict")
        if name in _MEMO_OPS:
            index = memoized if name == "MEMOIZE" else arg
            memoized += name == "MEMOIZE"
            if len(memo) < _MEMO_ENTRIES:
                top = stack[-1]
                memo[index] = top if isinstance(top, (str, int)) else _OTHER
            continue
        if name in _FILLS:
            pairs = _top_level_pairs(name, stack, marks)
            values = [v for k, v in zip(pairs[::2], pairs[1::2], strict=True) if k == key]
            if values:  # the last one wins, as in the dict
                value = values[-1]
                return value if isinstance(value, int) and not isinstance(value, bool) else None
        pushed = _pushed(name, arg, stack, memo)
        to_mark, below, pushes_mark, pushes = _EFFECTS[name]
        if to_mark or (name == "POP" and stack[-1] is _MARK):
            if marks == 0:
                raise _Unexpected("no mark to pop to")
            while stack.pop() is not _MARK:
                pass
            marks -= 1
            below = below if to_mark else 0
        if below:
            if len(stack) < below or _MARK in stack[-below:]:
                raise _Unexpected("stack underflow, or a mark taken as an object")
            if name in _FILLS and stack[-below] is _TOP:
                pushed = _TOP  # SETITEM(S) return the dict they filled
            del stack[-below:]
        if pushes_mark:
            stack.append(_MARK)
            marks += 1
        elif pushes == 1:
            stack.append(pushed)
        elif pushes:
            stack.extend([_OTHER] * pushes)
        if not stack or stack[0] is not _TOP:
            raise _Unexpected("the top-level dict was consumed")
    return None


def _top_level_pairs(name: str, stack: list[object], marks: int) -> list[object]:
    """The keys and values a SETITEM(S) is about to put into the top-level dict, else []."""
    if name == "SETITEMS" and marks == 1 and len(stack) >= 2 and stack[1] is _MARK:
        pairs = stack[2:]
    elif name == "SETITEM" and marks == 0 and len(stack) == 3:
        pairs = stack[1:]
    else:
        return []
    if stack[0] is not _TOP or len(pairs) % 2:
        raise _Unexpected("a SETITEM(S) without whole pairs")
    return pairs


def _pushed(name: str, arg: object, stack: list[object], memo: dict[object, object]) -> object:
    """What an opcode pushes, as far as the scan cares."""
    if name in _STRING_OPS:
        return arg if isinstance(arg, str) else _decode(arg)
    if name in _INT_OPS and isinstance(arg, int) and not isinstance(arg, bool):
        return arg
    if name in _GET_OPS:
        return memo.get(arg, _OTHER)
    if name == "EMPTY_DICT" and not stack:
        return _TOP
    return _OTHER


def _decode(arg: object) -> object:
    if isinstance(arg, bytes):
        try:
            return arg.decode("utf-8")
        except UnicodeDecodeError:
            return _OTHER
    return _OTHER
