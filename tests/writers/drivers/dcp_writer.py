"""Plain PyTorch DCP, as the README's example: ``dcp.save`` into ``ROOT/step-N`` (no torchtitan),
keeping the newest three as a user's own retention would (``shutil.rmtree`` of the oldest).

A second argument ``slow-delete`` deletes the oldest generation the way a slow ``rm -r`` on a
parallel filesystem does: file by file, ``DELETE_PAUSE`` seconds apart, the shards first and
``.metadata`` last, then the directory (the ``saved`` line follows the deletion). Its saves use
``FileSystemWriter(thread_count=4)``: four shard files per generation, so the deletion passes
through several states, each read by the exporter.

``hang`` stops inside DCP's data write (``filesystem._write_item``) after the first item of a
shard hit the disk: shards partly written, ``.metadata`` never renamed into place.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from common import hang_here, serve
from torch.distributed.checkpoint import filesystem

ROOT = Path(sys.argv[1])
SLOW_DELETE = sys.argv[2:] == ["slow-delete"]
if sys.argv[2:] and not SLOW_DELETE:
    sys.exit(f"unknown option {sys.argv[2:]!r}: slow-delete or none")
KEEP = 3
DELETE_PAUSE = 0.3  # seconds between two files: a slow rm -r on a parallel filesystem

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
step = 0
saved: list[Path] = []
hanging: dict[str, object] = {}

_write_item = filesystem._write_item


def _write_item_then_maybe_hang(*args, **kwargs):
    result = _write_item(*args, **kwargs)
    if hanging:
        stream = args[1]
        stream.flush()
        hang_here(hanging["step"], str(hanging["path"]), "dcp shard half-written")
    return result


filesystem._write_item = _write_item_then_maybe_hang


def train(steps: int = 5) -> None:
    global step
    for _ in range(steps):
        loss = model(torch.randn(8, 256)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1


def save(hang: bool) -> tuple[int, str]:
    train()
    path = ROOT / f"step-{step}"
    if hang:
        hanging.update(step=step, path=path)
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    if SLOW_DELETE:
        dcp.save(state, storage_writer=filesystem.FileSystemWriter(path, thread_count=4))
    else:
        dcp.save(state, checkpoint_id=str(path))
    saved.append(path)
    while len(saved) > KEEP:
        oldest = saved.pop(0)
        delete_slowly(oldest) if SLOW_DELETE else shutil.rmtree(oldest)
    return step, str(path)


def delete_slowly(path: Path) -> None:
    """Shards first, ``.metadata`` last, one file every DELETE_PAUSE seconds, then the
    directory: a generation that loses files while its commit marker stands."""
    files = [*sorted(p for p in path.iterdir() if p.name != ".metadata"), path / ".metadata"]
    for file in files:
        os.remove(file)
        time.sleep(DELETE_PAUSE)
    os.rmdir(path)


serve(save)
