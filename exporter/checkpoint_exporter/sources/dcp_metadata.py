"""Reads PyTorch DCP ``.metadata`` without torch and without trusting it.

``.metadata`` is a pickle, and a pickle is a program: anyone who can write into a checkpoint
tree could make a naive reader run code. This reader's ``find_class`` maps the handful of names
a real DCP metadata file references to inert stand-ins defined here, and refuses every other
global, so nothing from the file is ever imported or called. The file is read whole under a size
cap before parsing, which bounds time (the pickle machine is linear in its input).

It does not bound memory: one byte of pickle can make one object (``}`` is an empty dict of 64
bytes, ``\x8f`` an empty set of 216), so a few megabytes of opcodes can ask for gigabytes, and
no hook of the C unpickler sees objects being made. The daemon therefore parses in
``IsolatedParser``: a worker process of its own under an address-space limit (RLIMIT_AS), fed
the file as a descriptor the daemon opened, answering with the few facts validation needs. A
bomb makes the worker fail with MemoryError (the verdict is ``bad_metadata``) and is restarted;
the daemon's own memory never sees it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import pickle
import posixpath
import resource
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkpoint_exporter.sources import fsread
from checkpoint_exporter.sources.untrusted import INT64_MAX

DEFAULT_SIZE_LIMIT = 256 * 1024 * 1024
# Address space of the parsing worker in all (scan.metadata_memory_bytes): the interpreter
# (~40 MiB mapped) plus what a real metadata file needs, up to about 16 times its size.
DEFAULT_MEMORY_LIMIT = 768 * 1024 * 1024
DEFAULT_PARSE_TIMEOUT = 120.0
# A killed worker in an uninterruptible wait (a read on a hung mount) exits only when the read
# returns: it is waited for this long, then left to be reaped later (or by init).
REAP_WAIT = 0.2
CLOSE_WAIT = 0.3  # the most close() waits for a parse under way to let go of the worker

log = logging.getLogger(__name__)


class MetadataError(ValueError):
    """The file is not a DCP metadata pickle we can trust."""


class MetadataTooLarge(MetadataError):
    """Parsing it needs more memory than the parser may use (an allocation bomb)."""


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
    except MemoryError:
        raise MetadataTooLarge("parsing it needs more memory than allowed") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, OverflowError, RecursionError) as error:  # fmt: skip
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
        if not (0 <= offset <= INT64_MAX and 0 <= length <= INT64_MAX):
            # Negative, or past any file: a length of 2**20000 made the worker's JSON reply
            # and every message naming it fail (no int of over 4,300 digits becomes text).
            raise MetadataError(f"offset or length out of range for {relative!r}")
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


class IsolatedParser:
    """Parses metadata in a worker process whose memory is capped by the kernel.

    One worker, started on first use and again after it died or hit its limit; requests are
    one at a time: one that waits longer than ``timeout`` for another's parse gives up, so a
    read hung on one mount holds the others back for a bounded time only. The worker exits
    when the daemon does: it reads requests from a socket whose other end closes with the
    daemon. Nothing here waits long for a worker to exit: one that does not die when killed
    (stuck in the kernel) is abandoned, and reaped when it does.

    Two limits, told apart in the answer: each request may grow the worker by
    ``AMPLIFICATION`` times the file's size (a real file needs up to about 16; a bomb of
    one-byte objects 70 and more): past it, the file is a bomb, ``MetadataTooLarge``. And the
    worker never exceeds ``memory_limit`` in all: a real file too large to check within it is
    the operator's limit, not the checkpoint's fault, ``ParserUnavailable``. So are a worker
    that cannot start, dies or times out: never a verdict on the checkpoint."""

    AMPLIFICATION = 24

    def __init__(
        self, memory_limit: int = DEFAULT_MEMORY_LIMIT, timeout: float = DEFAULT_PARSE_TIMEOUT
    ):
        self.memory_limit = memory_limit
        self.timeout = timeout
        self._lock = threading.Lock()
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
            f"_worker({theirs.fileno()}, {self.memory_limit}, {self.AMPLIFICATION})"
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
        request = [json.dumps({"limit": size_limit}).encode()]
        if not self._lock.acquire(timeout=self.timeout):
            raise ParserUnavailable(
                f"the metadata parser was busy with another file for {self.timeout:g} s"
            )
        try:
            return self._parse(request, fd)
        finally:
            self._lock.release()

    def _parse(self, request: list[bytes], fd: int) -> DcpMetadata:
        """One request to the worker; under the lock."""
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
                reply = _receive(connection)
            except TimeoutError:
                self._stop()
                raise ParserUnavailable(f"parsing took longer than {self.timeout:g} s") from None
            except (OSError, ValueError):
                self._stop()
                raise ParserUnavailable("the metadata parser stopped while parsing") from None
            break
        if "error" in reply:
            if reply.get("memory"):
                self._stop()  # its heap may stay large: start clean
            if reply.get("kind") == "bomb":
                raise MetadataTooLarge(str(reply["error"]))
            if reply.get("kind") == "cap":
                raise ParserUnavailable(str(reply["error"]))
            raise MetadataError(str(reply["error"]))
        return DcpMetadata(reply["version"], reply["save_id"], dict(reply["shards"]))


def _receive(connection: socket.socket) -> dict[str, Any]:
    header = _exactly(connection, 8)
    return json.loads(_exactly(connection, int.from_bytes(header, "big")))


def _exactly(connection: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = connection.recv(min(count - len(data), 1 << 20))
        if not chunk:
            raise ConnectionError("metadata parser closed the connection")
        data += chunk
    return bytes(data)


class _OutOfMemory(Exception):
    """An allocation refused by the address-space limit, met as an OSError (ENOMEM)."""


def _mapped_bytes() -> int:
    pages = Path("/proc/self/statm").read_text(encoding="ascii").split()[0]
    return int(pages) * os.sysconf("SC_PAGE_SIZE")


def _worker(descriptor: int, memory_limit: int, amplification: int) -> None:
    """The worker's loop: a request (size limit) and a file descriptor in, facts out."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    connection = socket.socket(fileno=descriptor)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(connection, 4096, 1)
        except OSError:
            return
        if not message:
            return  # the daemon is gone
        reply: dict[str, Any]
        bound = memory_limit
        try:
            if len(fds) != 1:
                raise MetadataError("no file descriptor with the request")
            limit = int(json.loads(message)["limit"])
            try:
                with contextlib.suppress(OSError):  # the whole file, wherever it was left
                    os.lseek(fds[0], 0, os.SEEK_SET)
                size = os.fstat(fds[0]).st_size
                # What this file may make the worker grow by: far more than any real metadata
                # needs, far less than what a bomb of one-byte objects asks for.
                bound = min(memory_limit, _mapped_bytes() + (64 << 20) + amplification * size)
                resource.setrlimit(resource.RLIMIT_AS, (bound, memory_limit))
                try:
                    data = fsread.read_open(fds[0], limit, "metadata")
                except ValueError as error:
                    raise MetadataError(str(error)) from None
                except OSError as error:
                    if error.errno == errno.ENOMEM:  # the read buffer itself over the limit
                        raise _OutOfMemory from None
                    raise
                parsed = loads(data)
            finally:
                os.close(fds[0])
                resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
            reply = {"version": parsed.version, "save_id": parsed.save_id,
                     "shards": parsed.shards}  # fmt: skip
        except (MemoryError, MetadataTooLarge, _OutOfMemory):
            if bound < memory_limit:
                reply = {"error": f"parsing needs more than {amplification} times its size "
                         "(an allocation bomb)", "memory": True, "kind": "bomb"}  # fmt: skip
            else:
                reply = {"error": f"too large to check within the parser's "
                         f"{memory_limit >> 20} MiB (scan.metadata_memory_bytes)",
                         "memory": True, "kind": "cap"}  # fmt: skip
        except MetadataError as error:
            reply = {"error": str(error)}
        except Exception as error:  # never let one file end the worker silently
            reply = {"error": f"unreadable metadata: {type(error).__name__}: {error}"}
        try:
            payload = json.dumps(reply).encode()
        except MemoryError:
            payload = json.dumps({"error": "reply too large", "memory": True, "kind": "cap"})
            payload = payload.encode()
        connection.sendall(len(payload).to_bytes(8, "big") + payload)
