"""Tails the event spool that instrumented jobs write (``instrument.py``).

Files are followed by inode, not by name, so a rotation (``x.jsonl`` renamed to ``x.jsonl.1``)
mid-read loses nothing; a partial last line waits for its newline; a torn, oversized, unknown or
malformed line is counted and skipped. Everything present at the first poll is history. Files
untouched for ``retention`` are removed once read (the spool is the exporter's own directory,
not a watched checkpoint path).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from checkpoint_exporter import fsread
from checkpoint_exporter.instrument import EVENTS, SCHEMA_VERSION
from checkpoint_exporter.untrusted import finite_number, json_value

log = logging.getLogger(__name__)

MAX_LINE = 64 * 1024
READ_CHUNK = 4 * 1024 * 1024  # per file per poll: a flood is spread over polls, never all at once


@dataclass(frozen=True)
class Event:
    ts: float
    event: str
    training_job: str
    step: int | None
    rank: int
    world_size: int
    host: str
    path: str | None
    bytes: int | None
    error: str | None
    history: bool = False  # already in the spool when the exporter started


@dataclass
class _Followed:
    offset: int = 0
    partial: bytes = b""
    skipping: bool = False  # inside an over-long line: drop until its newline


@dataclass
class SpoolReader:
    directory: Path
    retention: float = 7 * 86400.0
    events_total: Counter[str] = field(default_factory=Counter)
    invalid_total: Counter[str] = field(default_factory=Counter)
    _files: dict[tuple[int, int], _Followed] = field(default_factory=dict)
    _polled: bool = False
    _reported_errors: set[str] = field(default_factory=set)

    def poll(self, now: float | None = None) -> list[Event]:
        """Every complete new line of every spool file, parsed; the bad ones counted."""
        now = time.time() if now is None else now
        history = not self._polled
        self._polled = True
        events: list[Event] = []
        seen: set[tuple[int, int]] = set()
        for job_dir in self._subdirectories():
            for path, info in self._spool_files(job_dir):
                key = (info.st_dev, info.st_ino)
                seen.add(key)
                followed = self._files.setdefault(key, _Followed())
                if info.st_size < followed.offset:  # truncated or replaced in place
                    self._files[key] = followed = _Followed()
                if info.st_size > followed.offset:
                    self._read(path, job_dir.name, followed, history, events)
                elif now - info.st_mtime > self.retention and not followed.partial:
                    self._remove(path)
        for key in list(self._files):
            if key not in seen:
                del self._files[key]
        events.sort(key=lambda e: e.ts)
        return events

    def _subdirectories(self) -> list[Path]:
        try:
            with os.scandir(self.directory) as entries:
                return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return []  # the first instrumented job will create it
        except OSError as error:
            self._report(str(self.directory), error)
            return []

    def _spool_files(self, job_dir: Path) -> list[tuple[Path, os.stat_result]]:
        files = []
        try:
            with os.scandir(job_dir) as entries:
                for entry in entries:
                    if ".jsonl" not in entry.name:
                        continue
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        files.append((Path(entry.path), info))
        except OSError as error:
            self._report(str(job_dir), error)
        return files

    def _read(
        self, path: Path, job: str, followed: _Followed, history: bool, out: list[Event]
    ) -> None:
        try:
            fd = fsread.open_regular(path)
        except FileNotFoundError:
            return
        except OSError as error:
            self._report(str(path), error)
            return
        try:
            data = os.pread(fd, READ_CHUNK, followed.offset)
        finally:
            os.close(fd)
        followed.offset += len(data)
        lines = (followed.partial + data).split(b"\n")
        followed.partial = lines.pop()
        for line in lines:
            if followed.skipping:
                followed.skipping = False  # the rest of an over-long line
                continue
            self._parse(line, job, history, out)
        if len(followed.partial) > MAX_LINE:
            self.invalid_total["too_long"] += 1
            followed.partial, followed.skipping = b"", True

    def _parse(self, line: bytes, job: str, history: bool, out: list[Event]) -> None:
        if not line.strip():
            return
        if len(line) > MAX_LINE:
            self.invalid_total["too_long"] += 1
            return
        try:
            record = json_value(line)
        except ValueError:
            self.invalid_total["not_json"] += 1
            return
        event = _validate(record, job)
        if isinstance(event, str):
            self.invalid_total[event] += 1
            return
        self.events_total[event.event] += 1
        out.append(event if not history else Event(**{**event.__dict__, "history": True}))

    def _remove(self, path: Path) -> None:
        try:
            path.unlink()
            log.debug("removed old spool file %s", path)
        except OSError as error:
            self._report(str(path), error)

    def _report(self, where: str, error: OSError) -> None:
        if where not in self._reported_errors:
            self._reported_errors.add(where)
            log.warning("spool: %s: %s", where, error.strerror or error)


def _validate(record: object, job: str) -> Event | str:
    """An Event, or the reason the record is invalid."""
    if not isinstance(record, dict) or record.get("v") != SCHEMA_VERSION:
        return "schema"
    if record.get("event") not in EVENTS:
        return "unknown_event"
    ts, rank, world = record.get("ts"), record.get("rank", 0), record.get("world_size", 1)
    step, path = record.get("step"), record.get("path")
    size, error = record.get("bytes"), record.get("error")
    checks = (
        finite_number(ts) is not None,
        record.get("training_job") == job,  # a job writes only into its own directory
        _is_int(rank) and rank >= 0 and _is_int(world) and world >= 1,
        step is None or (_is_int(step) and step >= 0),
        path is None or isinstance(path, str),
        size is None or (_is_int(size) and size >= 0),
        error is None or isinstance(error, str),
    )
    if not all(checks):
        return "schema"
    timestamp = finite_number(ts)
    assert timestamp is not None  # checked above
    return Event(
        ts=timestamp,
        event=record["event"],
        training_job=job,
        step=step,
        rank=rank,
        world_size=world,
        host=str(record.get("host", ""))[:256],
        path=path,
        bytes=size,
        error=error[:1000] if error else None,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
