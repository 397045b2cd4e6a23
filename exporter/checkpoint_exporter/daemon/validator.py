"""Structural checks of committed generations, off the core thread: one ``Validator`` per
filesystem, each reading a generation through descriptors reached from its tier root one
component at a time, never through a symlink.

A validator takes its requests by job, in turn (``_JobQueue``): one job's queue of costly checks
(files that each cost the parser its whole CPU budget) delays another job's verdict by the one
check under way, not by the whole queue. The parser all validators share serves them in the
order they asked (``dcp_metadata``), so a job on another mount waits for at most one file per
mount.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import queue
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from checkpoint_exporter.core.tracker import ValidationRequest
from checkpoint_exporter.model import Check, Verdict
from checkpoint_exporter.sources import fsread
from checkpoint_exporter.sources.listing import Dir
from checkpoint_exporter.sources.validate import Limits, validate
from checkpoint_exporter.sources.validate_objects import Fetch, validate_listing
from checkpoint_exporter.storage_url import is_object_url

log = logging.getLogger(__name__)

# A generation whose checks could not run (I/O trouble, the metadata parser unavailable) is
# checked again after this long, not on every pass.
RETRY_UNCHECKED_SECONDS = 30.0
# What a check is charged at least, so that jobs whose checks cost next to nothing still take
# turns.
MIN_CHARGE_SECONDS = 0.001

# A request, its tier root, may the root be a link, and the tier's listing the request came from.
_Item = tuple[ValidationRequest, str, bool, "Dir | None"]


class _JobQueue:
    """Validation requests, taken by job in turn: start-time fair queueing, each job charged the
    wall time its checks took. The next request is the oldest of the waiting job that has been
    charged least since it last had nothing waiting; a job that starts waiting is charged as
    much as the one taken last (it banks no credit for its idle time), and jobs charged alike
    take turns in the order they began to wait. So every job with work gets an equal share of
    the validator's time, and one job's queue of costly checks delays another's verdict by the
    check under way only. A generation waits once: a request for a newer signature replaces
    the older one (whose verdict the tracker would drop), so a file touched faster than it is
    checked grows no queue."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._waiting: dict[str, collections.deque[_Item]] = {}
        self._charged: dict[str, float] = {}  # each busy job's virtual time
        self._now = 0.0  # the virtual time of the request taken last
        self._closed = False

    def put(self, job: str, item: _Item) -> None:
        with self._condition:
            if job not in self._waiting:
                self._waiting[job] = collections.deque()
                self._charged[job] = max(self._charged.get(job, 0.0), self._now)
            waiting = self._waiting[job]
            key = (item[0].tier, item[0].generation)
            for index, (queued, *_) in enumerate(waiting):
                if (queued.tier, queued.generation) == key:
                    waiting[index] = item
                    return
            waiting.append(item)
            self._condition.notify()

    def get(self) -> _Item | None:
        """The next request (waiting for one), or None once closed."""
        with self._condition:
            self._condition.wait_for(lambda: self._closed or bool(self._waiting))
            if self._closed:
                return None
            job = min(self._waiting, key=self._charged.__getitem__)  # ties: first to wait
            waiting = self._waiting[job]
            item = waiting.popleft()
            if not waiting:
                del self._waiting[job]
            self._now = self._charged[job]
            return item

    def charge(self, job: str, seconds: float) -> None:
        """What the job's request just taken cost."""
        with self._condition:
            self._charged[job] = self._charged.get(job, self._now) + max(
                seconds, MIN_CHARGE_SECONDS
            )
            # A job no longer waiting keeps its charge only while it is ahead of the others'.
            for name in [n for n, v in self._charged.items() if v <= self._now]:
                if name not in self._waiting:
                    del self._charged[name]

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify_all()


def _identity(path: str) -> tuple[int, int] | None:
    try:
        status = os.lstat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


class Validator:
    """Runs structural checks on a worker thread; verdicts are collected by the scanner, one
    validator per filesystem (a read hung on one mount holds up no other mount's checks).

    ``verdicts``: where verdicts go (several validators may share one queue); ``notify`` is
    called after each, to wake whoever collects them."""

    def __init__(
        self,
        limits: Limits,
        verdicts: queue.Queue[tuple[ValidationRequest, Verdict | None]] | None = None,
        notify: Callable[[], None] | None = None,
        name: str = "validator",
    ):
        self.limits = limits
        self._requests = _JobQueue()
        # A None verdict: the generation moved or vanished while read; judge it again later.
        self.verdicts = verdicts if verdicts is not None else queue.Queue()
        self._notify = notify
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopping = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop now: requests still queued are dropped, a parse under way is cut short; waits
        at most ``timeout`` for a read in progress (one hung in the kernel is left behind)."""
        self._stopping.set()
        self._requests.close()
        if self.limits.metadata_parser is not None:
            self.limits.metadata_parser.close()
        self._thread.join(timeout=timeout)

    def submit(
        self,
        request: ValidationRequest,
        root: str,
        follow_root: bool = True,
        tree: Dir | None = None,
        fetch: Fetch | None = None,
    ) -> None:
        """``follow_root``: whether ``root`` itself may be a symlink (a configured root);
        ``tree``: the tier's latest listing, whose sizes the checks start from; ``fetch``: an
        object tier's ranged reads, for the checks that read contents."""
        self._requests.put(request.job, (request, root, follow_root, tree, fetch))

    def _validate_objects(
        self, request: ValidationRequest, tree: Dir | None, fetch: Fetch | None
    ) -> None:
        """No file to open: the listing's sizes, and DCP's metadata by a ranged read."""
        started = time.monotonic()
        try:
            verdict = validate_listing(
                request.found.checks, tree, fetch,
                self.limits.metadata_bytes, self.limits.metadata_parser,
            )  # fmt: skip
        except Exception as error:  # our bug, not the checkpoint's: no verdict, asked later
            log.exception("validation of %s in object storage failed", request.generation)
            verdict = Verdict(False, None, f"not checked: {error!r}", unchecked=True)
        self._requests.charge(request.job, time.monotonic() - started)
        if verdict.unchecked:
            log.warning(
                "checkpoint not checked: job=%s generation=%s %s; trying again in %g s",
                request.job, request.generation, verdict.detail, RETRY_UNCHECKED_SECONDS,
            )  # fmt: skip
        elif not verdict.valid:
            log.warning(
                "invalid checkpoint: job=%s tier=%s generation=%s reason=%s %s",
                request.job, request.tier, request.generation, verdict.reason, verdict.detail,
            )  # fmt: skip
        self._put(request, verdict)

    def _run(self) -> None:
        while (item := self._requests.get()) is not None and not self._stopping.is_set():
            request, root, follow_root, tree, fetch = item
            if is_object_url(root):
                self._validate_objects(request, tree, fetch)
                continue
            target = os.path.join(root, request.generation)
            before = _identity(target)
            started = time.monotonic()
            try:
                verdict = _validate_beneath(
                    root, follow_root, request.found.checks, self.limits, tree
                )
            except Exception as error:  # our bug, not the checkpoint's: no verdict, asked later
                log.exception("validation of %s/%s failed", root, request.generation)
                verdict = Verdict(False, None, f"not checked: {error!r}", unchecked=True)
            self._requests.charge(request.job, time.monotonic() - started)
            if verdict is None:  # gone, or swapped for a symlink since it was listed
                self._put(request, None)
                continue
            if verdict.unchecked:
                log.warning(
                    "checkpoint not checked: job=%s generation=%s %s; trying again in %g s",
                    request.job, request.generation, verdict.detail, RETRY_UNCHECKED_SECONDS,
                )  # fmt: skip
                self._put(request, verdict)
                continue
            if not verdict.valid and (before is None or _identity(target) != before):
                # Renamed, replaced or deleted under the reader (retention, a writer's rename):
                # what was missing is not the checkpoint's fault.
                log.debug("job=%s generation=%s moved while read", request.job, request.generation)
                self._put(request, None)
                continue
            if not verdict.valid:
                log.warning(
                    "invalid checkpoint: job=%s tier=%s generation=%s reason=%s %s",
                    request.job, request.tier, request.generation, verdict.reason, verdict.detail,
                )  # fmt: skip
            elif verdict.detail:
                log.warning(
                    "checkpoint partly checked: job=%s generation=%s %s",
                    request.job, request.generation, verdict.detail,
                )  # fmt: skip
            self._put(request, verdict)

    def _put(self, request: ValidationRequest, verdict: Verdict | None) -> None:
        self.verdicts.put((request, verdict))
        if self._notify is not None:
            self._notify()


def _validate_beneath(
    root: str, follow_root: bool, checks: Sequence[Check], limits: Limits, tree: Dir | None = None
) -> Verdict | None:
    """``validate``, with every check read through a descriptor of the directory holding it,
    reached from the tier root one component at a time without following symlinks: a directory
    swapped for a symlink since the listing leads nowhere (None: no verdict, asked again)."""
    step, details = None, []
    for check in checks:
        try:
            opened = _open_beneath(root, check.path, follow_root)
        except FileNotFoundError:
            return None
        if opened is None:
            return None
        directory, reached = opened
        try:
            base = f"/proc/self/fd/{directory}"
            listed = tree.directory_of(reached) if tree is not None else None
            stripped = replace(check, path=_strip(check.path, reached))
            verdict = validate(base, [stripped], limits, listed)
        finally:
            os.close(directory)
        if not verdict.valid:
            return verdict
        step = verdict.step if step is None else step
        if verdict.detail:
            details.append(verdict.detail)
    return Verdict(True, detail="; ".join(details), step=step)


def _open_beneath(root: str, relative: str, follow_root: bool) -> tuple[int, str] | None:
    """A descriptor of the deepest directory on the way to ``relative`` (itself when it is a
    directory, else the one holding it), opened one component at a time without following
    symlinks, and its path below ``root``; None when a symlink stands where a directory was."""
    directory = fsread.open_directory(root, follow_symlink=follow_root)
    reached: list[str] = []
    try:
        for part in [p for p in relative.split("/") if p not in ("", ".")]:
            try:
                child = fsread.open_directory(part, dir_fd=directory)
            except OSError as error:
                if error.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                if stat.S_ISREG(os.lstat(part, dir_fd=directory).st_mode):
                    break  # a file: the checks read it through its directory's descriptor
                os.close(directory)
                return None
            os.close(directory)
            directory = child
            reached.append(part)
    except BaseException:
        os.close(directory)
        raise
    return directory, "/".join(reached)


def _strip(path: str, prefix: str) -> str:
    if not prefix:
        return path
    return "." if path == prefix else path.removeprefix(prefix + "/")
