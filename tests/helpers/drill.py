"""Restore drills for the tests: real checkpoints written by torch, the drill run as the CLI
(optionally with torch hidden, or with the peak RSS of its processes measured), its spool read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import CLI

# Writes a DCP generation in one process: {name: elements} float32 tensors, then plain objects
# (and, with a trap, an object whose unpickling would make that directory), spread over `shards`
# files (FileSystemWriter's thread_count: one file per writer thread).
_DCP_WRITER = """
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
spec = json.loads(sys.argv[2])
state = {name: torch.full((n,), float(i + 1)) for i, (name, n) in enumerate(spec["tensors"])}
state.update(spec["objects"])


class Trap:  # an object whose unpickling makes a directory: proof that something ran
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


if spec["trap"]:
    state["trap"] = Trap(spec["trap"])
dcp.save(state, storage_writer=FileSystemWriter(sys.argv[1], thread_count=spec["shards"]),
         no_dist=True)
"""

# Runs a command and prints, as its last line, the largest peak RSS (bytes) of any process of
# the tree below it: Linux folds a reaped child's peak, and its own reaped children's, into
# RUSAGE_CHILDREN, so the drill's worker is included.
_PEAK_RSS = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:]).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, flush=True)
sys.exit(code)
"""


def write_dcp(
    directory: Path,
    tensors: dict[str, int],
    objects: dict[str, object] | None = None,
    shards: int = 1,
    trap: Path | None = None,
) -> int:
    """A committed DCP generation written by torch; returns the tensors' bytes."""
    spec = {"tensors": list(tensors.items()), "objects": objects or {}, "shards": shards,
            "trap": str(trap) if trap else None}  # fmt: skip
    subprocess.run(
        [sys.executable, "-c", _DCP_WRITER, str(directory), json.dumps(spec)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return 4 * sum(tensors.values())


def hidden_torch(directory: Path) -> dict[str, str]:
    """An environment in which `import torch` fails as it does where torch is not installed,
    for the drill and every process it starts (the worktree's own import path kept)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "torch.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
    )
    path = os.pathsep.join(p for p in (str(directory), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def drill(
    config: Path, job: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, "restore-drill", "--config.file", str(config), "--job", job, *args],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


def drill_with_peak_rss(
    config: Path, job: str, *args: str, timeout: float = 600
) -> tuple[subprocess.CompletedProcess, int]:
    """The drill, and the largest peak RSS (bytes) of the drill's processes, its worker too."""
    command = [*CLI, "restore-drill", "--config.file", str(config), "--job", job, *args]
    result = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, *command],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    *lines, peak = result.stdout.splitlines()
    result.stdout = "\n".join(lines)
    return result, int(peak)


def spool_events(spool: Path, job: str) -> list[dict]:
    """Every event line the drill (or anyone) wrote to the job's spool directory, in order."""
    events = []
    for path in sorted((spool / job).glob("*.jsonl")):
        events += [json.loads(line) for line in path.read_text().splitlines() if line]
    return sorted(events, key=lambda event: event["ts"])
