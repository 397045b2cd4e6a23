"""The restore drill: prove the newest committed generation can be restored, not just listed.

``checkpoint-exporter restore-drill --config.file F --job NAME [--generation ID] [--full]`` picks
the generation a restart would pick, runs the scanner's structural checks on it and, with
``--full``, loads it with torch.distributed.checkpoint into CPU memory in a separate process.
The result goes to the spool (``restore_start``, then ``restore_done`` or ``restore_failed``)
where the exporter turns it into the restore metrics. Exit status 0 only on success.

torch unpickles DCP ``.metadata`` on load; the full load runs only after the allowlisted reader
accepted that file, so what torch unpickles can only name the classes a real checkpoint uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from checkpoint_exporter import instrument
from checkpoint_exporter.config import Config
from checkpoint_exporter.model import COMMITTED, restore_preference
from checkpoint_exporter.sources import layouts
from checkpoint_exporter.sources.layouts.base import DCP, ZIP, Found, Options
from checkpoint_exporter.sources.listing import OpsBudget, TreeReader
from checkpoint_exporter.sources.validate import Limits, validate

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_NO_TORCH = 3  # the worker's exit status when torch cannot be imported


class DrillFailed(Exception):
    """The restore did not succeed; the message is the reason reported."""


@dataclass(frozen=True)
class Target:
    job: str
    root: Path  # the durable tier root
    layout: str
    generation: Found


def find_job(config: Config, name: str) -> tuple[Path, str]:
    """(durable path, layout setting) of a configured or discovered job."""
    for job in config.jobs:
        if job.name == name:
            return job.path, job.policy.layout
    for entry in config.discover:
        candidate = Path(entry.root) / name
        if candidate.is_dir() and not candidate.is_symlink():
            return candidate, entry.policy.layout
    raise LookupError(f"no job named {name!r} in the config or under its discover roots")


def pick(config: Config, job: str, generation: str | None) -> Target:
    """The generation to restore: the one named, or the newest committed one."""
    root, layout_setting = find_job(config, job)
    tree, _ = TreeReader(root, OpsBudget(), layouts.ALL_CONTENT_FILES).read()
    if tree is None:
        raise DrillFailed(f"{root} cannot be read")
    layout = layout_setting if layout_setting != "auto" else layouts.detect(tree)
    if layout is None:
        raise DrillFailed(f"{root}: no checkpoint layout recognised")
    found = layouts.REGISTRY[layout].parse(tree, Options(verify_checksums=True))
    if generation is not None:
        match = [f for f in found if f.id == generation]
        if not match:
            raise DrillFailed(f"{root}: no generation {generation!r}")
        if match[0].state != COMMITTED:
            raise DrillFailed(f"generation {generation!r} is {match[0].state}, not committed")
        return Target(job, root, layout, match[0])
    committed = [f for f in found if f.state == COMMITTED and not f.alias]
    if not committed:
        raise DrillFailed(f"{root}: no committed generation to restore")
    newest = max(committed, key=restore_preference)
    return Target(job, root, layout, newest)


def _load_in_worker(target: Target, say: Callable[[str], None]) -> int:
    """Load every DCP directory or torch.save file of the generation in a child process."""
    checks = target.generation.checks
    loads = [(c.kind, str(target.root / c.path)) for c in checks if c.kind in (DCP, ZIP)]
    if not loads:
        raise DrillFailed(
            f"a full restore of a {target.layout} generation is not supported: nothing loadable "
            "with torch.distributed.checkpoint or torch.load"
        )
    command = [sys.executable, "-m", "checkpoint_exporter.restore", "--load", json.dumps(loads)]
    started = time.monotonic()
    worker = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()

    def progress() -> None:
        while not stop.wait(2.0):
            read = _bytes_read(worker.pid)
            shown = f", {read / 1e9:.2f} GB read" if read is not None else ""
            say(f"  loading ... {time.monotonic() - started:.0f} s{shown}")

    threading.Thread(target=progress, daemon=True).start()
    out, err = worker.communicate()
    stop.set()
    if worker.returncode == _NO_TORCH:
        raise DrillFailed("--full needs torch, which is not importable here: " + err.strip())
    if worker.returncode != 0:
        raise DrillFailed("loading failed: " + (err.strip().splitlines() or ["no output"])[-1])
    result = json.loads(out.strip().splitlines()[-1])
    say(f"  loaded {result['tensors']} tensors, {result['bytes'] / 1e9:.3f} GB into CPU memory")
    return int(result["bytes"])


def _bytes_read(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _drill(target: Target, full: bool, say: Callable[[str], None]) -> None:
    found = target.generation
    say(
        f"restore drill: job={target.job} generation={found.id} step={found.step} "
        f"layout={target.layout} ({found.files} files, {found.bytes / 1e9:.3f} GB)"
    )
    verdict = validate(str(target.root), found.checks, Limits())
    if not verdict.valid:
        raise DrillFailed(f"structural check failed: {verdict.reason}: {verdict.detail}")
    say(f"  structural check passed ({len(found.checks)} checks)")
    if full:
        _load_in_worker(target, say)


def run_drill(
    config: Config, job: str, generation: str | None, full: bool, err: TextIO = sys.stderr
) -> int:
    def say(message: str) -> None:
        print(message, file=err, flush=True)

    target: Target | None = None
    unpickable: DrillFailed | None = None
    try:
        target = pick(config, job, generation)
    except LookupError as error:
        say(f"restore-drill: {error}")
        return EXIT_USAGE
    except DrillFailed as error:
        unpickable = error  # nothing to restore is a failed restore, and reported as one
    step = target.generation.step if target else None
    path = str(target.root / target.generation.id) if target else None
    started = time.monotonic()
    try:
        with instrument.restoring(training_job=job, step=step, path=path, spool=str(config.spool)):
            if target is None:
                raise unpickable or DrillFailed("nothing to restore")
            _drill(target, full, say)
    except DrillFailed as error:
        say(f"restore drill FAILED after {time.monotonic() - started:.1f} s: {error}")
        return EXIT_FAILED
    say(f"restore drill succeeded in {time.monotonic() - started:.1f} s")
    return EXIT_OK


# --- the worker process: the only place torch is imported -------------------------------------


def _worker(loads: list[tuple[str, str]]) -> int:
    try:
        import torch
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
    except ImportError as error:
        print(f"{error}", file=sys.stderr)
        return _NO_TORCH
    tensors = total = 0

    def count(value: object) -> None:
        nonlocal tensors, total
        if isinstance(value, torch.Tensor):
            tensors += 1
            total += value.numel() * value.element_size()
        elif isinstance(value, dict):
            for item in value.values():
                count(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                count(item)

    for kind, path in loads:
        if kind == DCP:
            count(_load_state_dict_from_keys(checkpoint_id=path))
        else:
            count(torch.load(path, map_location="cpu", weights_only=True))
    print(json.dumps({"tensors": tensors, "bytes": total}))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--load":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        sys.exit(_worker([tuple(item) for item in json.loads(sys.argv[2])]))
    print("usage: python -m checkpoint_exporter.restore --load JSON", file=sys.stderr)
    sys.exit(EXIT_USAGE)
