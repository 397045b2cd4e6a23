"""Plain PyTorch DCP, as the README's example: ``dcp.save`` into ``ROOT/step-N`` (no torchtitan),
keeping the newest three as a user's own retention would (``shutil.rmtree`` of the oldest).

``hang`` stops inside DCP's data write (``filesystem._write_item``) after the first item of a
shard hit the disk: shards partly written, ``.metadata`` never renamed into place.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from common import hang_here, serve
from torch.distributed.checkpoint import filesystem

ROOT = Path(sys.argv[1])
KEEP = 3

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
    dcp.save(state, checkpoint_id=str(path))
    saved.append(path)
    while len(saved) > KEEP:
        shutil.rmtree(saved.pop(0))
    return step, str(path)


serve(save)
