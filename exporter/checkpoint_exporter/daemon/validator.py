"""Structural checks of committed generations, off the core thread: one ``Validator`` per
filesystem, each reading a generation through descriptors reached from its tier root one
component at a time, never through a symlink."""

from __future__ import annotations

import errno
import logging
import os
import queue
import stat
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

from checkpoint_exporter.core.tracker import ValidationRequest
from checkpoint_exporter.sources import fsread
from checkpoint_exporter.sources.layouts.base import Check
from checkpoint_exporter.sources.validate import Limits, Verdict, validate

log = logging.getLogger(__name__)

# A generation whose checks could not run (I/O trouble, the metadata parser unavailable) is
# checked again after this long, not on every pass.
RETRY_UNCHECKED_SECONDS = 30.0


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
        self._requests: queue.Queue[tuple[ValidationRequest, str, bool] | None] = queue.Queue()
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
        self._requests.put(None)
        if self.limits.metadata_parser is not None:
            self.limits.metadata_parser.close()
        self._thread.join(timeout=timeout)

    def submit(self, request: ValidationRequest, root: str, follow_root: bool = True) -> None:
        """``follow_root``: whether ``root`` itself may be a symlink (a configured root)."""
        self._requests.put((request, root, follow_root))

    def _run(self) -> None:
        while (item := self._requests.get()) is not None and not self._stopping.is_set():
            request, root, follow_root = item
            target = os.path.join(root, request.generation)
            before = _identity(target)
            try:
                verdict = _validate_beneath(root, follow_root, request.found.checks, self.limits)
            except Exception as error:  # our bug, not the checkpoint's: no verdict, asked later
                log.exception("validation of %s/%s failed", root, request.generation)
                verdict = Verdict(False, None, f"not checked: {error!r}", unchecked=True)
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
    root: str, follow_root: bool, checks: Sequence[Check], limits: Limits
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
            verdict = validate(base, [replace(check, path=_strip(check.path, reached))], limits)
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
