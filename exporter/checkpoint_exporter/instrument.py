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
    instrument.start(training_job="llama70b")      # heartbeats while the process runs
    instrument.finished(training_job="llama70b")   # the job ended cleanly: nothing pages for it

The exporter pages when a running job stops checkpointing, and must not page for one that
finished: the heartbeat says the process runs (a daemon thread, every ``HEARTBEAT_SECONDS``,
started by ``start`` and by every ``saving``, ``save`` and ``async_save``), and ``finished``
says it ended on purpose. A job killed without ``finished`` stops heartbeating; the exporter
keeps paging for it until the job's ``abandon_after`` passes without any sign of life.

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
import secrets
import socket
import stat
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from time import monotonic as _monotonic  # the heartbeat's own clock, whatever patches `time`
from typing import Any

SPOOL_ENV = "CHECKPOINT_EXPORTER_SPOOL"
# Seconds between the heartbeats that saves start (0: none; ``start`` takes its own interval).
HEARTBEAT_ENV = "CHECKPOINT_EXPORTER_HEARTBEAT_SECONDS"
SCHEMA_VERSION = 1
SAVE_EVENTS = ("save_start", "resume", "staged", "written", "committed", "save_failed")
RESTORE_EVENTS = ("restore_start", "restore_done", "restore_failed")
LIFE_EVENTS = ("heartbeat", "finished")  # the training process runs; it ended cleanly
EVENTS = SAVE_EVENTS + RESTORE_EVENTS + LIFE_EVENTS
HEARTBEAT_SECONDS = 60.0
ROTATE_BYTES = 16 * 1024 * 1024  # one rotated file is kept: <host>-<pid>.jsonl.1
_MAX_ERROR = 1000  # characters of an error message kept in an event


class _Spool:
    """Appends event lines to ``<spool>/<training_job>/<host>-<pid>.jsonl``, one write() each.

    Any user can make a directory in the spool, so ``<training_job>`` may be another user's,
    made first: the exporter does not read it for this job, and this process could not write
    into it. Lines then go to ``<training_job>@<uid>`` (this process's uid), or, if another user
    made that too, to a ``<training_job>@<uid>.<random>`` of its own: the exporter reads each by
    its owner."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[tuple[str, str, int], tuple[int, str]] = {}  # (dir, job, pid) -> fd, path
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
        fd, path = self._files.get(key, (None, ""))
        if fd is not None and os.fstat(fd).st_size >= ROTATE_BYTES:
            os.replace(path, path + ".1")
            os.close(fd)
            fd = None
        if fd is None:
            name = f"{socket.gethostname()}-{os.getpid()}.jsonl"
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            try:
                path = os.path.join(_own_directory(directory, job), name)
                fd = os.open(path, flags, 0o644)
            except FileNotFoundError:  # the daemon removed the directory idle for its retention
                path = os.path.join(_own_directory(directory, job), name)
                fd = os.open(path, flags, 0o644)
            self._files[key] = (fd, path)
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


def _own_directory(spool: str, job: str) -> str:
    """The first of the job's directory names that is a directory of this process's user (made
    if missing; the random one is one nobody can have made in advance)."""
    os.makedirs(spool, exist_ok=True)
    uid = os.geteuid()
    for name in (job, f"{job}@{uid}", f"{job}@{uid}.{secrets.token_hex(4)}"):
        path = os.path.join(spool, name)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755)
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == uid:
            return path
    raise PermissionError(f"{spool}/{job}: another user's, and so is each name tried beside it")


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
    _alive(emit)
    try:
        yield Save(emit)
    except BaseException as error:
        emit("save_failed", error)
        raise
    emit("committed")


@contextlib.contextmanager
def restoring(
    *,
    training_job: str,
    step: int | None = None,
    path: Any = None,
    spool: str | None = None,
    drill: bool = False,
) -> Iterator[None]:
    """Clocks for a load: ``restore_start``, then ``restore_done`` or ``restore_failed``.

    ``drill``: a restore drill (``checkpoint-exporter restore-drill``), not a training job
    restarting: its failure opens a ticket where a training job's pages, and it is no sign that
    the job runs."""
    emit = _Emitter(training_job, step, path, spool)
    extra = {"drill": True} if drill else {}
    emit("restore_start", **extra)
    try:
        yield
    except BaseException as error:
        emit("restore_failed", error, **extra)
        raise
    emit("restore_done", **extra)


class _Heartbeats:
    """One daemon thread per process that emits ``heartbeat`` for every job started in it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str | None], tuple[_Emitter, float]] = {}
        self._due: dict[tuple[str, str | None], float] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def start(self, emit: _Emitter, interval: float, now: bool) -> None:
        if not emit.spool:
            return  # no spool: nothing would be written
        key = (emit.base["training_job"], emit.spool)
        with self._lock:
            if os.getpid() != self._pid:  # forked: the parent's thread did not come along
                self._jobs, self._due, self._thread = {}, {}, None
                self._pid = os.getpid()
            known = key in self._jobs
            self._jobs[key] = (emit, interval)
            if not known:
                self._due[key] = _monotonic() + (0.0 if now else interval)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="checkpoint-exporter heartbeat", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def stop(self, training_job: str, spool: str | None) -> None:
        with self._lock:
            self._jobs.pop((training_job, spool), None)
            self._due.pop((training_job, spool), None)

    def _run(self) -> None:
        while True:
            with self._lock:
                now = _monotonic()
                due = [key for key, at in self._due.items() if at <= now]
                for key in due:
                    self._due[key] = now + self._jobs[key][1]
                emitters = [self._jobs[key][0] for key in due]
                wait = min(self._due.values(), default=now + HEARTBEAT_SECONDS) - now
            for emit in emitters:
                emit("heartbeat")
            self._wake.wait(timeout=max(0.05, wait))
            self._wake.clear()


_HEARTBEATS = _Heartbeats()


def start(
    *, training_job: str, spool: str | None = None, interval: float = HEARTBEAT_SECONDS
) -> None:
    """Tell the exporter this job runs: a ``heartbeat`` now and every ``interval`` seconds while
    this process lives (a daemon thread; calling it again changes nothing but the interval)."""
    _HEARTBEATS.start(_Emitter(training_job, None, None, spool), interval, now=True)


def finished(*, training_job: str, spool: str | None = None) -> None:
    """The job ended cleanly: its checkpoint alerts stop. Call it once at the end of training
    (from every rank, or rank 0 alone). A job that saves or heartbeats again later runs again."""
    emit = _Emitter(training_job, None, None, spool)
    _HEARTBEATS.stop(emit.base["training_job"], emit.spool)
    emit("finished")


def _alive(emit: _Emitter) -> None:
    """A save: the process runs; heartbeats follow from the next interval on."""
    try:
        interval = float(os.environ.get(HEARTBEAT_ENV, HEARTBEAT_SECONDS))
    except ValueError:
        interval = HEARTBEAT_SECONDS
    if interval > 0:
        heartbeat = _Emitter(emit.base["training_job"], None, None, emit.spool)
        _HEARTBEATS.start(heartbeat, interval, now=False)


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
    _alive(emit)
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
    _alive(emit)
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
