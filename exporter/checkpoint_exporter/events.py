"""The event spool's schema as the exporter reads it: one parsed ``Event`` per valid line, and
the bounds on its dates. Standard library only.

The names a job may write (``SCHEMA_VERSION``, ``EVENTS`` and its parts) are declared once, in
``instrument.py``, the writer's side, which must stay one file that imports nothing but the
standard library (it is copied into training images). The spool reader (sources/spool.py) parses
with ``parse``; the core reasons over ``Event`` and the same bounds, without any source module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from checkpoint_exporter.instrument import (  # noqa: F401 - the schema's names, re-exported
    EVENTS,
    LIFE_EVENTS,
    RESTORE_EVENTS,
    SAVE_EVENTS,
    SCHEMA_VERSION,
)

FUTURE_SLACK = 300.0  # an event dated further ahead of this node's clock is refused
MAX_EVENT_AGE = 366 * 86400.0  # an event dated further back is refused
# Steps, ranks and sizes become float samples: past 2**53 a float no longer holds every integer
# (and 10**400 overflows it), so a larger one is a schema error, never a number exported.
MAX_INT = 2**53
MAX_HOST = 256  # characters of ``host`` kept
MAX_PATH = 4096  # characters of ``path`` kept
MAX_ERROR = 1000  # characters of ``error`` kept


@dataclass(frozen=True, slots=True)
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
    drill: bool = False  # a restore drill's event, not the training job's own


def parse(record: object, job: str, history: bool = False) -> Event | str:
    """An Event from one decoded JSON line of ``job``'s spool directory, or the reason it is
    refused: ``schema`` (a field missing, of the wrong type or out of range) or
    ``unknown_event``. Dates are judged by the reader, against its clock (``FUTURE_SLACK``,
    ``MAX_EVENT_AGE``)."""
    if not isinstance(record, dict) or record.get("v") != SCHEMA_VERSION:
        return "schema"
    if record.get("event") not in EVENTS:
        return "unknown_event"
    ts, rank, world = record.get("ts"), record.get("rank", 0), record.get("world_size", 1)
    step, path = record.get("step"), record.get("path")
    size, error = record.get("bytes"), record.get("error")
    drill = record.get("drill", False)
    timestamp = finite_number(ts)
    checks = (
        timestamp is not None,
        record.get("training_job") == job,  # a job writes only into its own directory
        _is_int(rank) and 0 <= rank <= MAX_INT and _is_int(world) and 1 <= world <= MAX_INT,
        step is None or (_is_int(step) and 0 <= step <= MAX_INT),
        path is None or isinstance(path, str),
        size is None or (_is_int(size) and 0 <= size <= MAX_INT),
        error is None or isinstance(error, str),
        isinstance(drill, bool),
    )
    if not all(checks):
        return "schema"
    assert timestamp is not None  # checked above
    return Event(
        ts=timestamp,
        event=record["event"],
        training_job=job,
        step=step,
        rank=rank,
        world_size=world,
        host=str(record.get("host", ""))[:MAX_HOST],
        path=path[:MAX_PATH] if path else path,
        bytes=size,
        error=error[:MAX_ERROR] if error else None,
        history=history,
        drill=drill,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def finite_number(value: object) -> float | None:
    """A JSON number as a finite float; None for booleans, NaN, infinities, out-of-range ints
    and anything that is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
