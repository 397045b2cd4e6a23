"""One worker thread per filesystem: a hung mount stalls only its own thread.

Every task that touches a watched path (placing a tier, reading its tree, listing a discover
root, probing the mount) runs on the worker of the filesystem it lives on, one task at a time,
and hands back a value: the core applies it, on its own thread. A worker stuck in the kernel is
never joined and never given a second thread: its later tasks wait in its queue, and the core
stops giving it new ones while it is stuck. Workers are daemon threads, so a process with a hung
mount still exits.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

Task = Callable[[], object]
Progress = Callable[[], int]  # a counter that moves while a long task gets somewhere
# What the core gets instead of a task's result when the task raised (worker side: no I/O).
Fallback = Callable[[Exception], object]


@dataclass(frozen=True)
class TaskFailed:
    """A task raised instead of handing back a value (a task returns its own failures, so this
    is a bug in one): delivered to the core like a result, so it is logged and counted there, and
    the core can undo what it set up for the task (``fallback``: the value it gets instead, such
    as the failed reads of a batch, or None)."""

    mountpoint: str
    task: str  # what the task was doing, for the log
    error: Exception
    fallback: object = None


class MountWorker:
    def __init__(self, mountpoint: str, deliver: Callable[[object], None]) -> None:
        self.mountpoint = mountpoint
        self._deliver = deliver
        self._tasks: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._numbers = itertools.count(1)
        # Written by the worker as one tuple: (task number, monotonic start, progress counter).
        self._running: tuple[int, float, Progress | None] | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"scan {mountpoint or '?'}", daemon=True
        )
        # The core's own view (only the core thread reads or writes these).
        self.stuck = False
        self._watched: tuple[int, int | None, float] | None = None  # number, progress, since

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Let the thread end after its current task; never waits for it (it may be hung)."""
        self._tasks.put(None)

    def submit(
        self,
        task: Task,
        progress: Progress | None = None,
        *,
        name: str = "",
        fallback: Fallback | None = None,
    ) -> None:
        """Run ``task`` on the worker; its value, or a ``TaskFailed`` named ``name``, is
        delivered to the core."""
        self._tasks.put(_Item(task, progress, name or _name_of(task), fallback))

    def stalled_for(self, now: float) -> float:
        """Seconds the running task has gone without progress; 0 when idle (core thread)."""
        running = self._running
        if running is None:
            self._watched = None
            return 0.0
        number, started, progress = running
        value = progress() if progress is not None else None
        watched = self._watched
        if watched is None or watched[0] != number:
            self._watched = (number, value, started)
        elif value != watched[1]:
            self._watched = (number, value, now)
        return now - self._watched[2]

    def _run(self) -> None:
        while (item := self._tasks.get()) is not None:
            self._running = (next(self._numbers), time.monotonic(), item.progress)
            try:
                result = run_task(self.mountpoint, item)
            finally:
                self._running = None
            self._deliver(result)


class InlineWorker(MountWorker):
    """A worker that runs each task as it is submitted, on the caller's thread, and delivers
    its value at once: the core's ordering rules become plain sequences of ``turn()`` calls in
    a test. Never stuck (a task that hangs hangs the test)."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def submit(
        self,
        task: Task,
        progress: Progress | None = None,
        *,
        name: str = "",
        fallback: Fallback | None = None,
    ) -> None:
        self._deliver(
            run_task(self.mountpoint, _Item(task, progress, name or _name_of(task), fallback))
        )

    def stalled_for(self, now: float) -> float:
        return 0.0


WorkerFactory = Callable[[str, Callable[[object], None]], MountWorker]


@dataclass(frozen=True)
class _Item:
    task: Task
    progress: Progress | None
    name: str
    fallback: Fallback | None


def run_task(mountpoint: str, item: _Item) -> object:
    """The task's value, or the ``TaskFailed`` that stands for it (logged by the core, once)."""
    try:
        return item.task()
    except Exception as error:  # a task returns its own failures; this is a bug in one
        fallback = item.fallback(error) if item.fallback is not None else None
        return TaskFailed(mountpoint, item.name, error, fallback)


def _name_of(task: Task) -> str:
    return getattr(task, "__qualname__", None) or repr(task)
