"""What the fuzzer feeds: every reader of untrusted input, with the outcomes each may have.

A target returns normally or raises the one error type its reader documents; anything else is a
crash. Invariants that matter for safety (no path leaves the checkpoint tree, no event of
another job, no negative sizes) are asserted on whatever comes back.
"""

from __future__ import annotations

import atexit
import base64
import json
import math
import os
import posixpath
import resource
import tempfile
from array import array
from pathlib import Path
from typing import Any

from checkpoint_exporter.config import ConfigError, parse_config
from checkpoint_exporter.core.clocks import (
    MAX_OPEN_RESTORES,
    MAX_OPEN_SAVES,
    MAX_RANKS,
    MAX_SECONDS,
    Clocks,
)
from checkpoint_exporter.instrument import EVENTS
from checkpoint_exporter.sources import dcp_metadata, layouts
from checkpoint_exporter.sources.layouts.base import Options
from checkpoint_exporter.sources.listing import DIR, FILE, LINK, OTHER, Dir
from checkpoint_exporter.sources.spool import FUTURE_SLACK, MAX_EVENT_AGE, MAX_LINE, SpoolReader
from checkpoint_exporter.webconfig import load_web_config

STATES = ("writing", "committed", "aborted")


def _inside(path: str) -> bool:
    return not path.startswith("/") and ".." not in posixpath.normpath(path or ".").split("/")


# A refusal names what it refuses in a short excerpt, never the whole value: what the worker
# answers and the daemon logs stays small whatever the file repeats.
_MESSAGE_CHARS = 1000


def dcp_metadata_target(data: bytes) -> None:
    try:
        result = dcp_metadata.loads(data)
    except dcp_metadata.MetadataError as error:
        assert len(str(error)) < _MESSAGE_CHARS, f"a message of {len(str(error))} characters"
        return
    for relative, size in result.shards.items():
        assert _inside(relative), relative
        assert size >= 0


# One worker for the whole run; every input here is small enough that the per-file bound (24
# times its size) binds before this cap, so a bomb is told from a file too large to check.
_ISOLATED_LIMIT = 256 * 1024 * 1024
_isolated: list[dcp_metadata.IsolatedParser] = []


def dcp_metadata_isolated_target(data: bytes) -> None:
    """What the daemon does with a .metadata: parsed in the capped worker. Whatever the pickle
    asks for (memory, CPU time), the answer is facts or MetadataError with a short message, and
    this process's peak memory does not move by more than the input's own size."""
    if not _isolated:
        _isolated.append(dcp_metadata.IsolatedParser(memory_limit=_ISOLATED_LIMIT))
        atexit.register(_isolated[0].close)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryFile() as handle:
        handle.write(data)
        handle.flush()
        try:
            result = _isolated[0].parse(handle.fileno())
        except dcp_metadata.MetadataError as error:
            assert len(str(error)) < _MESSAGE_CHARS, f"a message of {len(str(error))} characters"
            result = None
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 32 + len(data) / 2**20, f"the daemon's peak RSS grew {grown_mb:.0f} MB"
    if result is not None:
        for relative, size in result.shards.items():
            assert _inside(relative), relative
            assert size >= 0


def build_tree(spec: Any) -> Dir:
    """A listing from a JSON tree spec: ["d", mtime, {name: entry}] with entries
    ["f", size, mtime, base64 content or null], ["d", ...], ["l"] (symlink) or ["o"] (other)."""
    _, mtime, children = spec
    names, kinds = [], []
    sizes, mtimes = array("q"), array("d")
    subdirs: dict[str, Dir] = {}
    contents: dict[str, bytes] = {}
    for name in sorted(children):
        entry = children[name]
        names.append(name)
        kind = entry[0]
        if kind not in (FILE, DIR, LINK, OTHER):
            raise ValueError(f"kind {kind!r}")  # a listing only ever holds these four
        kinds.append(kind)
        if kind == FILE:
            sizes.append(entry[1])
            mtimes.append(entry[2])
            if entry[3] is not None:
                contents[name] = base64.b64decode(entry[3])
        else:
            sizes.append(0)
            mtimes.append(entry[1] if kind == DIR else 0.0)
            if kind == DIR:
                subdirs[name] = build_tree(entry)
    return Dir(int(mtime * 1e9), tuple(names), "".join(kinds), sizes, mtimes, subdirs, contents)


def layouts_target(spec_json: bytes) -> None:
    try:
        tree = build_tree(json.loads(spec_json))
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError):
        return  # a mutation broke the harness's own tree format: not an input to the layouts
    layouts.detect(tree)
    for layout in layouts.REGISTRY.values():
        layout.detect(tree)
        for found in layout.parse(tree, Options(verify_checksums=True)):
            assert _inside(found.id), (layout.name, found.id)
            assert found.state in STATES, found
            assert found.bytes >= 0 and found.files >= 0, found
            for check in found.checks:
                assert _inside(check.path), (layout.name, check.path)


SPOOL_NOW = 1_800_000_000.0  # the reader's clock in the spool target


def spool_target(data: bytes) -> None:
    """The reader on a small budget, polled until nothing is left, then the clocks: whatever
    the bytes, every event is in range, every over-long line is counted exactly once, and the
    clocks hold bounded, finite, non-negative numbers."""
    with tempfile.TemporaryDirectory(prefix="fuzz-spool-") as directory:
        job = Path(directory) / "job"
        job.mkdir()
        # The reader's clock (SPOOL_NOW) is not the files' mtimes: no retention here.
        reader = SpoolReader(
            Path(directory), poll_bytes=32 * 1024, poll_lines=512, retention=100 * 365 * 86400.0
        )
        reader.poll(SPOOL_NOW)  # the file comes after: live, read from its first byte
        (job / "node-1.jsonl").write_bytes(data)
        events = []
        for _ in range(10 + len(data) // 8192 + data.count(b"\n") // 256):
            events += reader.poll(SPOOL_NOW)
            if not reader.backlog_bytes:
                break
        assert not reader.backlog_bytes, "the reader stopped making progress"
        for event in events:
            assert event.training_job == "job" and event.event in EVENTS, event
            assert math.isfinite(event.ts) and event.rank >= 0 and event.world_size >= 1, event
            assert SPOOL_NOW - MAX_EVENT_AGE <= event.ts <= SPOOL_NOW + FUTURE_SLACK, event
        too_long = sum(len(line) > MAX_LINE for line in data.split(b"\n"))
        assert reader.invalid_total["too_long"] == too_long, (reader.invalid_total, too_long)
        clocks = Clocks()
        clocks.add(events, SPOOL_NOW)
        assert len(clocks.saves) <= MAX_OPEN_SAVES and len(clocks.restores) <= MAX_OPEN_RESTORES
        for timeline in clocks.saves.values():
            assert len(timeline.ranks) <= MAX_RANKS
            for seconds in timeline.phases().values():
                assert 0.0 <= seconds <= MAX_SECONDS, timeline
        for run in clocks.restores.values():
            assert 0.0 <= run.duration() <= MAX_SECONDS, run


def config_target(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    with tempfile.TemporaryDirectory(prefix="fuzz-config-") as directory:
        try:
            parse_config(text, "fuzz.yaml", Path(directory))
        except ConfigError as error:
            assert error.problems, "a ConfigError names at least one problem"


def web_config_target(data: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="fuzz-web-") as directory:
        path = os.path.join(directory, "web.yaml")
        with open(path, "wb") as out:
            out.write(data)
        try:
            load_web_config(path)
        except ConfigError as error:
            assert error.problems


TARGETS = {
    "dcp_metadata": dcp_metadata_target,
    "dcp_metadata_isolated": dcp_metadata_isolated_target,
    "layouts": layouts_target,
    "spool": spool_target,
    "config": config_target,
    "web_config": web_config_target,
}
