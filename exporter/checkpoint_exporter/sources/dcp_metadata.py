"""Reads PyTorch DCP ``.metadata`` without torch and without trusting it.

``.metadata`` is a pickle, and a pickle is a program: anyone who can write into a checkpoint
tree could make a naive reader run code. This reader's ``find_class`` maps the handful of names
a real DCP metadata file references to inert stand-ins defined here, and refuses every other
global, so nothing from the file is ever imported or called. The file is read whole under a size
cap before parsing, which bounds time (the pickle machine is linear in its input).

It does not bound memory: one byte of pickle can make one object (``}`` is an empty dict of 64
bytes, ``\x8f`` an empty set of 216), so a few megabytes of opcodes can ask for gigabytes, and
no hook of the C unpickler sees objects being made. Nor does the size cap bound time where the
allowlist calls back (``torch.Size`` of one memoized list of a million items, a million times).
The daemon therefore parses in ``IsolatedParser``: a worker process of its own under an
address-space limit (RLIMIT_AS) and a CPU-time limit scaled to the file's size (RLIMIT_CPU), fed
the file as a descriptor the daemon opened, answering with the few facts validation needs in a
reply of bounded size. A bomb of either kind ends the parse (the verdict is ``bad_metadata``,
kept for that file) and the worker is restarted; the daemon's own memory and CPU never see it.
The worker also runs the opcode scan of ``.ckpt`` files (``ckpt_step``) for the daemon, under
the same limits: a second kind of request.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import json
import logging
import math
import os
import pickle
import posixpath
import resource
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkpoint_exporter.sources import ckpt_step, fsread
from checkpoint_exporter.sources.untrusted import INT64_MAX, excerpt

DEFAULT_SIZE_LIMIT = 256 * 1024 * 1024
# Address space of the parsing worker in all (scan.metadata_memory_bytes): the interpreter
# (~40 MiB mapped) plus what a real metadata file needs, up to about 16 times its size.
DEFAULT_MEMORY_LIMIT = 768 * 1024 * 1024
DEFAULT_PARSE_TIMEOUT = 120.0
# CPU time one file may cost the worker (RLIMIT_CPU, rounded up to whole seconds): real metadata
# parses at about 10 MB/s here (0.1 s of CPU per MiB, torch-written files of 18 and 20 MiB), so
# this is ten times that plus a start, and never more than a minute (the largest file checked
# within the default memory cap, about 40 MiB, gets 42 s). Past it the file is judged, once:
# bad_metadata.
CPU_SECONDS = 2.0
CPU_SECONDS_PER_MIB = 1.0
CPU_SECONDS_MAX = 60.0
# The most the daemon reads of one answer. 8 MiB holds some 200,000 shard names; a real save
# writes one file per rank (and writer thread). The worker never sends more.
REPLY_BYTES = 8 << 20
PATH_CHARS = 4096  # PATH_MAX: a longer shard path names no file
TEXT_CHARS = 256  # version and save_id are carried only when this short
# What a step request may read of a .ckpt: its end record, directory and data.pkl.
STEP_BYTES = ckpt_step.TAIL_BYTES + ckpt_step.DIRECTORY_BYTES + ckpt_step.PICKLE_BYTES
LARGEST_STEP = 2**53  # JSON (and a float) carries integers exactly up to here
MiB = 1 << 20
# A killed worker in an uninterruptible wait (a read on a hung mount) exits only when the read
# returns: it is waited for this long, then left to be reaped later (or by init).
REAP_WAIT = 0.2
CLOSE_WAIT = 0.3  # the most close() waits for a parse under way to let go of the worker

log = logging.getLogger(__name__)


class MetadataError(ValueError):
    """The file is not a DCP metadata pickle we can trust."""


class MetadataTooLarge(MetadataError):
    """Parsing it needs more memory than the parser may use (an allocation bomb)."""


class MetadataTooCostly(MetadataError):
    """Parsing it needs more CPU time than a file of its size may take."""


class ParserUnavailable(RuntimeError):
    """The worker process cannot be started: the exporter's fault, never the checkpoint's."""


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
        # Made by NEWOBJ without a BUILD, it has no state at all: __init__ never ran.
        return vars(self).get("state", {}).get(key, default)


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
            raise MetadataError(
                f"refused to load {excerpt(module)}.{excerpt(name)} from checkpoint metadata"
            )
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


class _Input:
    """The pickle as a file the C unpickler reads ahead of (``peek``): it comes back for more
    once per 128 KiB, so ``consumed`` tells how far it got when memory ran out. A FRAME is read
    whole, and its objects are made from it later: its bytes count as consumed only once the
    parser reads past it, so a bomb inside one frame still shows as one."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._position = 0
        self.consumed = 0

    def peek(self, size: int = 1) -> bytes:
        return self._data[self._position : self._position + max(size, 1)]

    def read(self, size: int = -1) -> bytes:
        start = self._position
        self._position = len(self._data) if size < 0 else min(len(self._data), start + size)
        self.consumed = start if self._is_frame(start, self._position - start) else self._position
        return self._data[start : self._position]

    def readline(self) -> bytes:
        start = self._position
        end = self._data.find(b"\n", start)
        self._position = self.consumed = len(self._data) if end < 0 else end + 1
        return self._data[start : self._position]

    def _is_frame(self, start: int, size: int) -> bool:
        """Whether the read at ``start`` is the body of a FRAME opcode (0x95, 8-byte length)."""
        if start < 9 or self._data[start - 9] != 0x95:
            return False
        return int.from_bytes(self._data[start - 8 : start], "little") == size


def loads(data: bytes) -> DcpMetadata:
    """Parse metadata bytes; raises MetadataError for anything untrusted or malformed."""
    return _loads(_Input(data))


def _loads(source: _Input) -> DcpMetadata:
    try:
        root = _AllowlistUnpickler(source).load()
    except MetadataError:
        raise
    except MemoryError:
        raise MetadataTooLarge("parsing it needs more memory than allowed") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, OverflowError, RecursionError) as error:  # fmt: skip
        raise MetadataError(f"not a readable metadata pickle: {excerpt(str(error))}") from None
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
        if not (0 <= offset <= INT64_MAX and 0 <= length <= INT64_MAX):
            # Negative, or past any file: a length of 2**20000 made the worker's JSON reply
            # and every message naming it fail (no int of over 4,300 digits becomes text).
            raise MetadataError(f"offset or length out of range for '{excerpt(relative)}'")
        key = _inside(relative)
        shards[key] = max(shards.get(key, 0), offset + length)
    storage_meta = root.get("storage_meta")
    save_id = storage_meta.get("save_id") if isinstance(storage_meta, StorageMeta) else None
    version = root.get("version")
    return DcpMetadata(_short(version), _short(save_id), shards)


def _short(value: object) -> str | None:
    """A string kept for what it says, or None: nothing of the file travels at length."""
    return value if isinstance(value, str) and len(value) <= TEXT_CHARS else None


def _inside(relative: str) -> str:
    """The shard's path, refusing one that would leave the checkpoint directory or that no
    filesystem could hold."""
    if len(relative) > PATH_CHARS:
        raise MetadataError(
            f"shard path '{excerpt(relative)}' is longer than a path can be ({PATH_CHARS})"
        )
    normalized = posixpath.normpath(relative)
    if (
        not relative
        or relative.startswith(("/", "\\"))
        or normalized == ".."
        or normalized.startswith("../")
        or "\x00" in relative
    ):
        raise MetadataError(f"shard path '{excerpt(relative)}' leaves the checkpoint directory")
    return normalized


def read(
    path: str, size_limit: int = DEFAULT_SIZE_LIMIT, parser: IsolatedParser | None = None
) -> DcpMetadata:
    """Read and parse a ``.metadata`` file (a regular file, never through a symlink); in the
    worker process of ``parser`` when one is given (the daemon), else here (tools, tests)."""
    if parser is not None:
        fd = fsread.open_regular(path)
        try:
            return parser.parse(fd, size_limit)
        finally:
            os.close(fd)
    try:
        data = fsread.read_bytes(path, size_limit)
    except ValueError as error:
        raise MetadataError(str(error)) from None
    return loads(data)


class _Turns:
    """A lock granted in the order it was asked for. threading.Lock favours the thread that just
    released it: one mount's validator could take the parser back for its next file while
    another mount's waited, up to its timeout. Each validator asks for one file at a time, so
    in turn means each mount waits for at most one file of every other mount."""

    def __init__(self) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._waiting: collections.deque[object] = collections.deque()
        self._held = False

    def acquire(self, timeout: float) -> bool:
        turn = object()
        with self._condition:
            self._waiting.append(turn)
            granted = self._condition.wait_for(
                lambda: not self._held and self._waiting[0] is turn, timeout
            )
            self._waiting.remove(turn)
            self._held = self._held or granted
            self._condition.notify_all()  # the next in line, when this one gave up
            return granted

    def release(self) -> None:
        with self._condition:
            self._held = False
            self._condition.notify_all()


class _OverBudget(Exception):
    """The worker was stopped by its CPU-time limit (SIGXCPU) while on this file."""


class IsolatedParser:
    """Parses metadata (and scans .ckpt pickles for their step) in a worker process whose
    memory and CPU time are capped by the kernel.

    One worker, started on first use and again after it died or hit a limit; requests are one
    at a time, served in the order they came: one that waits longer than ``timeout`` for
    others gives up, so a read hung on one mount holds the others back for a bounded time
    only. The worker exits when the daemon does: it reads requests from a socket whose other end
    closes with the daemon. Nothing here waits long for a worker to exit: one that does not die
    when killed (stuck in the kernel) is abandoned, and reaped when it does.

    Memory: each request may grow the worker by ``AMPLIFICATION`` times the file's size (a
    real file needs up to about 16; a bomb of one-byte objects 70 and more), and by as much
    for what it has read when it runs out: past either, the file is a bomb,
    ``MetadataTooLarge``. The worker never exceeds ``memory_limit`` in all: a real file too
    large to check within it is the operator's limit, not the checkpoint's fault,
    ``ParserUnavailable``. CPU: a file may cost ``cpu_seconds`` plus ``cpu_seconds_per_mib``
    per MiB read; past that the kernel stops the worker (SIGXCPU, even inside C code) and the
    file is ``MetadataTooCostly`` (a step scan: step unknown). A worker that cannot start,
    dies otherwise or times out is never a verdict on the checkpoint. Answers are read up to
    ``REPLY_BYTES``."""

    AMPLIFICATION = 24

    def __init__(
        self,
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        timeout: float = DEFAULT_PARSE_TIMEOUT,
        cpu_seconds: float = CPU_SECONDS,
        cpu_seconds_per_mib: float = CPU_SECONDS_PER_MIB,
    ):
        self.memory_limit = memory_limit
        self.timeout = timeout
        self.cpu = (cpu_seconds, cpu_seconds_per_mib)
        self._lock = _Turns()
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._closed = False
        self._abandoned: list[subprocess.Popen[bytes]] = []  # killed, not yet exited

    def _start(self) -> socket.socket:
        self._reap()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # The daemon's own import path, handed over: the worker runs this very module.
        code = (
            f"import sys; sys.path[:0] = {sys.path!r}; "
            "from checkpoint_exporter.sources.dcp_metadata import _worker; "
            f"_worker({theirs.fileno()}, {self.memory_limit}, {self.AMPLIFICATION}, "
            f"{self.cpu!r})"
        )
        try:
            # /proc/self/exe: the interpreter running now, even where its path is not
            # reachable to the daemon's user (a virtualenv in an admin's home, as in CI).
            for executable in (sys.executable, "/proc/self/exe"):
                try:
                    self._process = subprocess.Popen(
                        [executable, "-c", code], pass_fds=(theirs.fileno(),),
                        stdin=subprocess.DEVNULL, close_fds=True,
                    )  # fmt: skip
                    break
                except PermissionError:
                    continue
            else:
                raise ParserUnavailable("cannot start the metadata parser: permission denied")
        except OSError as error:
            ours.close()
            raise ParserUnavailable(f"cannot start the metadata parser: {error}") from None
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._socket = ours
        return ours

    def close(self) -> None:
        """Stop the worker now, even during a parse (which then fails as unavailable), within
        CLOSE_WAIT + REAP_WAIT: the daemon's shutdown waits neither for a slow file nor for a
        worker stuck in the kernel. Called again (each validator closes the parser it shares),
        it waits for nothing."""
        wait = 0.0 if self._closed else CLOSE_WAIT
        self._closed = True
        connection = self._socket
        if connection is not None:
            with contextlib.suppress(OSError):  # closed meanwhile by the parse under way
                connection.shutdown(socket.SHUT_RDWR)  # wakes a parse waiting for its answer
        if self._lock.acquire(timeout=wait):
            try:
                self._stop()
                self._reap()
            finally:
                self._lock.release()

    def _stop(self) -> None:
        """Drop the connection and end the worker; under the lock."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        process, self._process = self._process, None
        if process is None:
            return
        process.kill()
        try:
            process.wait(REAP_WAIT)
        except subprocess.TimeoutExpired:
            log.warning("metadata parser %d does not exit when killed; left behind", process.pid)
            self._abandoned.append(process)

    def _reap(self) -> None:
        self._abandoned = [process for process in self._abandoned if process.poll() is None]

    def _connection(self) -> socket.socket:
        if self._closed:
            raise ParserUnavailable("the metadata parser is shut down")
        if self._process is not None and self._process.poll() is not None:
            self._stop()  # died while idle (killed, OOM): a fresh one, not a false verdict
        return self._socket or self._start()

    def parse(self, fd: int, size_limit: int = DEFAULT_SIZE_LIMIT) -> DcpMetadata:
        try:
            reply = self._request("metadata", size_limit, fd)
        except _OverBudget:
            seconds, per_mib = self.cpu
            raise MetadataTooCostly(
                f"parsing needs more CPU time than a file of its size may take "
                f"({seconds:g} s + {per_mib:g} s per MiB, at most {CPU_SECONDS_MAX:g} s)"
            ) from None
        if "error" in reply:
            if reply.get("kind") == "bomb":
                raise MetadataTooLarge(reply["error"])
            if reply.get("kind") == "cap":
                raise ParserUnavailable(reply["error"])
            raise MetadataError(reply["error"])
        return DcpMetadata(reply["version"], reply["save_id"], dict(reply["shards"]))

    def step(self, fd: int) -> int | None:
        """The ``global_step`` inside the torch.save zip open as ``fd`` (``ckpt_step``), read
        by the worker; None when unknown, or when finding it costs more than its budget."""
        try:
            reply = self._request("step", STEP_BYTES, fd)
        except _OverBudget:
            return None
        step = reply.get("step")
        return step if isinstance(step, int) and 0 <= step <= LARGEST_STEP else None

    def _request(self, kind: str, limit: int, fd: int) -> dict[str, Any]:
        request = [json.dumps({"kind": kind, "limit": limit}).encode()]
        if not self._lock.acquire(timeout=self.timeout):
            raise ParserUnavailable(
                f"the metadata parser was busy with other files for {self.timeout:g} s"
            )
        try:
            reply = self._exchange(request, fd)
            if reply.get("memory"):
                self._stop()  # its heap may stay large: start clean
        finally:
            self._lock.release()
        if "error" in reply:
            reply["error"] = excerpt(str(reply["error"]), 1000)
        return reply

    def _exchange(self, request: list[bytes], fd: int) -> dict[str, Any]:
        """One request to the worker and its answer; under the lock."""
        for attempt in (1, 2):
            connection = self._connection()
            try:
                connection.settimeout(self.timeout)
                socket.send_fds(connection, request, [fd])
            except OSError:
                self._stop()  # the worker went between the check and the send
                if attempt == 2:
                    raise ParserUnavailable("the metadata parser is not answering") from None
                continue
            try:
                return _receive(connection)
            except TimeoutError:
                self._stop()
                raise ParserUnavailable(f"parsing took longer than {self.timeout:g} s") from None
            except _ReplyTooLarge as error:
                self._stop()
                raise ParserUnavailable(str(error)) from None
            except (OSError, ValueError):
                over_budget = self._ended_by(signal.SIGXCPU)
                self._stop()
                if over_budget:
                    raise _OverBudget from None
                raise ParserUnavailable("the metadata parser stopped while parsing") from None
        raise AssertionError("unreachable")

    def _ended_by(self, signum: int) -> bool:
        """Whether the worker has exited, killed by ``signum``; waits REAP_WAIT at most."""
        process = self._process
        if process is None:
            return False
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(REAP_WAIT)
        return process.returncode == -signum


class _ReplyTooLarge(ValueError):
    """The worker claims an answer longer than the daemon reads."""


def _receive(connection: socket.socket) -> dict[str, Any]:
    length = int.from_bytes(_exactly(connection, 8), "big")
    if length > REPLY_BYTES:
        raise _ReplyTooLarge(
            f"the metadata parser answered {length:,} bytes, more than {REPLY_BYTES:,}"
        )
    return json.loads(_exactly(connection, length))


def _exactly(connection: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = connection.recv(min(count - len(data), 1 << 20))
        if not chunk:
            raise ConnectionError("metadata parser closed the connection")
        data += chunk
    return bytes(data)


# --- the worker process ---------------------------------------------------------------------

_PR_SET_DUMPABLE = 4
_SLACK = 64 << 20  # what any parse may grow the worker by, whatever its size


def _mapped_bytes() -> int:
    pages = Path("/proc/self/statm").read_text(encoding="ascii").split()[0]
    return int(pages) * os.sysconf("SC_PAGE_SIZE")


def _worker(
    descriptor: int, memory_limit: int, amplification: int, cpu: tuple[float, float]
) -> None:
    """The worker's loop: a request (kind, size limit) and a file descriptor in, facts out."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    _no_core_dumps()
    connection = socket.socket(fileno=descriptor)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(connection, 4096, 1)
        except OSError:
            return
        if not message:
            return  # the daemon is gone
        reply = _answer(message, fds, memory_limit, amplification, cpu)
        payload = _payload(reply)
        connection.sendall(len(payload).to_bytes(8, "big") + payload)


def _no_core_dumps() -> None:
    """SIGXCPU (the CPU budget) dumps core by default: a worker it stops writes no core of up
    to its whole address space, neither as a file nor to a core_pattern pipe."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def _answer(
    message: bytes, fds: list[int], memory_limit: int, amplification: int,
    cpu: tuple[float, float],
) -> dict[str, Any]:  # fmt: skip
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return {"error": "no file descriptor with the request"}
    fd = fds[0]
    try:
        request = json.loads(message)
        kind, limit = request["kind"], int(request["limit"])
        with contextlib.suppress(OSError):  # the whole file, wherever it was left
            os.lseek(fd, 0, os.SEEK_SET)
        size = os.fstat(fd).st_size
        seconds, per_mib = cpu
        with _cpu_limit(min(CPU_SECONDS_MAX, seconds + per_mib * min(size, limit) / MiB)):
            if kind == "step":
                return _step_reply(fd, size)
            return _metadata_reply(fd, limit, size, memory_limit, amplification)
    except MetadataError as error:
        return {"error": str(error)}
    except Exception as error:  # never let one file end the worker silently
        return {"error": f"unreadable metadata: {type(error).__name__}: {excerpt(str(error))}"}
    finally:
        os.close(fd)


@contextlib.contextmanager
def _cpu_limit(seconds: float) -> Iterator[None]:
    """The kernel stops this process (SIGXCPU) once it has used ``seconds`` more CPU time,
    rounded up to the whole second: C code that never returns to Python is stopped too."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + seconds)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))


def _step_reply(fd: int, size: int) -> dict[str, Any]:
    try:
        step = ckpt_step.step_in(fd, size)
    except MemoryError:
        return {"step": None, "memory": True}
    return {"step": step if step is None or step <= LARGEST_STEP else None}


def _metadata_reply(
    fd: int, limit: int, size: int, memory_limit: int, amplification: int
) -> dict[str, Any]:
    base = _mapped_bytes()
    # What this file may make the worker grow by: far more than any real metadata needs, far
    # less than what a bomb of one-byte objects asks for.
    bound = min(memory_limit, base + _SLACK + amplification * size)
    resource.setrlimit(resource.RLIMIT_AS, (bound, memory_limit))
    source = _Input(b"")
    try:
        try:
            source = _Input(fsread.read_open(fd, limit, "metadata"))
        except ValueError as error:
            raise MetadataError(str(error)) from None
        except MemoryError:
            return _too_large(memory_limit)  # the file itself does not fit
        except OSError as error:
            if error.errno == errno.ENOMEM:  # the read buffer refused by the address-space limit
                return _too_large(memory_limit)
            raise
        parsed = _loads(source)
    except (MemoryError, MetadataTooLarge):
        # Asked for more than it may have: by its size, or (at the cap) by what it had read.
        allowed = base + _SLACK + size + amplification * source.consumed
        if bound < memory_limit or memory_limit > allowed:
            return {"error": f"parsing needs more than {amplification} times its size "
                    "(an allocation bomb)", "memory": True, "kind": "bomb"}  # fmt: skip
        return _too_large(memory_limit)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    return {"version": parsed.version, "save_id": parsed.save_id, "shards": parsed.shards}


def _too_large(memory_limit: int) -> dict[str, Any]:
    return {"error": f"too large to check within the parser's {memory_limit >> 20} MiB "
            "(scan.metadata_memory_bytes)", "memory": True, "kind": "cap"}  # fmt: skip


def _payload(reply: dict[str, Any]) -> bytes:
    """The answer as sent: never more than REPLY_BYTES (only a list of shards could be)."""
    try:
        payload = json.dumps(reply).encode()
    except MemoryError:
        payload = b""
    if payload and len(payload) <= REPLY_BYTES:
        return payload
    shards = len(reply.get("shards", ()))
    error = f"names {shards:,} shard files, more than one answer holds ({REPLY_BYTES >> 20} MiB)"
    return json.dumps({"error": error, "memory": True}).encode()
