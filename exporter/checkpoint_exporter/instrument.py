"""Checkpoint clocks from inside the training job: standard library only.

The exporter sees files; only the job knows when training paused, when the snapshot was staged
and when the write finished. This module writes those moments as JSON lines into a spool
directory that the node's exporter tails::

    from checkpoint_exporter import instrument
    instrument.save(state_dict, checkpoint_id=path, training_job="llama70b", step=n)
    response = instrument.async_save(state_dict, checkpoint_id=path, training_job="j", step=n)
    with instrument.saving(training_job="llama70b", step=n, path=path) as save:
        ...; save.resume(); ...; save.staged(); ...; save.written()   # committed on clean exit
    with instrument.restoring(training_job="llama70b", step=n, path=path):
        ...

The spool is ``spool=`` or ``$CHECKPOINT_EXPORTER_SPOOL``; without either, nothing is written.
Monitoring never fails or slows training: every spool error is swallowed after one warning.

To use it in a training image without installing the exporter, copy this one file in as
``checkpoint_exporter_instrument.py``: it imports nothing outside the standard library, and
torch only when ``save`` or ``async_save`` is called.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

SPOOL_ENV = "CHECKPOINT_EXPORTER_SPOOL"
SCHEMA_VERSION = 1
SAVE_EVENTS = ("save_start", "resume", "staged", "written", "committed", "save_failed")
RESTORE_EVENTS = ("restore_start", "restore_done", "restore_failed")
EVENTS = SAVE_EVENTS + RESTORE_EVENTS
ROTATE_BYTES = 16 * 1024 * 1024  # one rotated file is kept: <host>-<pid>.jsonl.1
_MAX_ERROR = 1000  # characters of an error message kept in an event


class _Spool:
    """Appends event lines to ``<spool>/<training_job>/<host>-<pid>.jsonl``, one write() each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[tuple[str, str, int], int] = {}  # (dir, job, pid) -> fd
        self._warned = False

    def emit(self, directory: str | None, record: dict[str, Any]) -> None:
        if not directory:
            return
        try:
            line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
            with self._lock:
                fd = self._fd(directory, record["training_job"])
                os.write(fd, line)
        except Exception as error:
            self._warn(error)

    def _fd(self, directory: str, job: str) -> int:
        key = (directory, job, os.getpid())  # a forked child writes its own file
        fd = self._files.get(key)
        path = os.path.join(directory, job, f"{socket.gethostname()}-{os.getpid()}.jsonl")
        if fd is not None and os.fstat(fd).st_size >= ROTATE_BYTES:
            os.replace(path, path + ".1")
            os.close(fd)
            fd = None
        if fd is None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            os.makedirs(os.path.join(directory, job), exist_ok=True)
            try:
                fd = os.open(path, flags, 0o644)
            except FileNotFoundError:  # the daemon removed the directory idle for its retention
                os.makedirs(os.path.join(directory, job), exist_ok=True)
                fd = os.open(path, flags, 0o644)
            self._files[key] = fd
        return fd

    def _warn(self, error: BaseException) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"checkpoint_exporter.instrument: spool unavailable, events dropped: {error}",
                RuntimeWarning,
                stacklevel=3,
            )


_SPOOL = _Spool()


def _rank() -> tuple[int, int]:
    """(rank, world size): torch.distributed's when initialised (never importing torch)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


class _Emitter:
    """The fields every event of one save or restore shares."""

    def __init__(
        self,
        training_job: str,
        step: int | None,
        path: Any,
        spool: str | None,
        rank: tuple[int, int] | None = None,
    ):
        self.spool = spool if spool is not None else os.environ.get(SPOOL_ENV)
        rank, world_size = rank if rank is not None else _rank()
        self.base = {
            "v": SCHEMA_VERSION,
            "training_job": str(training_job),
            "step": None if step is None else int(step),
            "rank": rank,
            "world_size": world_size,
            "host": socket.gethostname(),
            "path": None if path is None else os.fspath(path),
        }
        self.sent: set[str] = set()
        self._lock = threading.Lock()

    def once(self, event: str) -> None:
        """Emit ``event`` unless it already was (two callbacks may race to it)."""
        with self._lock:
            if event in self.sent:
                return
            self.sent.add(event)
        self(event)

    def __call__(self, event: str, error: BaseException | str | None = None, **extra: Any) -> None:
        record = {**self.base, "ts": time.time(), "event": event, "bytes": None, "error": None}
        if error is not None:
            text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
            record["error"] = text[:_MAX_ERROR]
        record.update(extra)
        self.sent.add(event)
        _SPOOL.emit(self.spool, record)


class Save:
    """A save in progress; call the methods as the writer passes each point."""

    def __init__(self, emit: _Emitter):
        self._emit = emit

    def resume(self) -> None:
        """Training continues (the end of the training-visible pause)."""
        self._emit("resume")

    def staged(self) -> None:
        """A consistent snapshot exists (e.g. copied to host memory)."""
        self._emit("staged")

    def written(self) -> None:
        """The storage write finished, before the commit marker."""
        self._emit("written")


@contextlib.contextmanager
def saving(
    *,
    training_job: str,
    step: int | None = None,
    path: Any = None,
    spool: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> Iterator[Save]:
    """Clocks for any writer: ``committed`` on clean exit, ``save_failed`` on an exception.

    ``rank``/``world_size`` override what torch.distributed or RANK/WORLD_SIZE say, for
    launchers that run several ranks in one process.
    """
    ranks = (rank, world_size or 1) if rank is not None else None
    emit = _Emitter(training_job, step, path, spool, ranks)
    emit("save_start")
    try:
        yield Save(emit)
    except BaseException as error:
        emit("save_failed", error)
        raise
    emit("committed")


@contextlib.contextmanager
def restoring(
    *, training_job: str, step: int | None = None, path: Any = None, spool: str | None = None
) -> Iterator[None]:
    """Clocks for a load: ``restore_start``, then ``restore_done`` or ``restore_failed``."""
    emit = _Emitter(training_job, step, path, spool)
    emit("restore_start")
    try:
        yield
    except BaseException as error:
        emit("restore_failed", error)
        raise
    emit("restore_done")


def save(
    state_dict: Any,
    *,
    checkpoint_id: Any,
    training_job: str,
    step: int | None = None,
    spool: str | None = None,
    **dcp_kwargs: Any,
) -> Any:
    """``torch.distributed.checkpoint.save`` with its clocks: training waits for all of it."""
    import torch.distributed.checkpoint as dcp

    emit = _Emitter(training_job, step, checkpoint_id, spool)
    emit("save_start")
    try:
        result = dcp.save(state_dict, checkpoint_id=checkpoint_id, **dcp_kwargs)
    except BaseException as error:
        emit("save_failed", error)
        raise
    for event in ("staged", "written", "committed", "resume"):
        emit(event)
    return result


def async_save(
    state_dict: Any,
    *,
    checkpoint_id: Any,
    training_job: str,
    step: int | None = None,
    spool: str | None = None,
    **dcp_kwargs: Any,
) -> Any:
    """``torch.distributed.checkpoint.async_save`` with its clocks; returns what torch returned.

    With an ``AsyncSaveResponse`` (async staging) the staging and upload futures mark
    ``staged`` and ``written``; with a plain Future, staging ends when the call returns.
    """
    import torch.distributed.checkpoint as dcp

    emit = _Emitter(training_job, step, checkpoint_id, spool)
    emit("save_start")
    try:
        result = dcp.async_save(state_dict, checkpoint_id=checkpoint_id, **dcp_kwargs)
    except BaseException as error:
        emit("save_failed", error)
        raise
    emit("resume")
    staging = getattr(result, "staging_completion", None)
    upload = getattr(result, "upload_completion", result)
    if staging is None:
        emit("staged")
    else:
        staging.add_done_callback(lambda future: _staged(emit, future))
    upload.add_done_callback(lambda future: _finished(emit, future))
    return result


def _staged(emit: _Emitter, future: Any) -> None:
    if future.exception() is None:
        emit.once("staged")


def _finished(emit: _Emitter, future: Any) -> None:
    error = future.exception()
    if error is not None:
        emit("save_failed", error)
        return
    emit.once("staged")  # the staging callback can run after this one
    emit("written")
    emit("committed")
