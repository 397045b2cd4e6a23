"""What every driver shares: the stdin command loop and the way a save is stopped half-way.

Runs inside the writers' virtualenv, next to the library under test (never the exporter's).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable


def say(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def hang_here(step: int | None, path: str, what: str) -> None:
    """The save stops here for good: bytes are on disk, the library's commit is not reached.
    The test SIGKILLs the process group, as the scheduler would on a node failure.

    Written with one os.write, not print: this may run in a writer process forked from a
    threaded parent (megatron-core's), where a lock held at the fork would block print."""
    line = json.dumps({"event": "hanging", "step": step, "path": path, "what": what}) + "\n"
    os.write(1, line.encode())
    while True:
        time.sleep(3600)


def serve(save: Callable[[bool], tuple[int | None, str]]) -> None:
    """Run ``save(hang)`` for each ``save`` / ``hang`` command; ``save`` returns (step, path)."""
    for line in sys.stdin:
        verb = line.strip()
        if verb == "quit":
            break
        if verb in ("save", "hang"):
            step, path = save(verb == "hang")
            say("saved", step=step, path=os.fspath(path))
    say("bye")
