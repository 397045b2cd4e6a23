"""torchtitan 0.3.0: its DCP ``CheckpointManager`` saving into ``ROOT/checkpoint/step-N``.

torchtitan's ``Trainer`` needs CUDA, so this drives ``torchtitan.components.checkpoint.
CheckpointManager`` directly, built as the Trainer builds it: a tiny model, torchtitan's
``OptimizersContainer`` and ``LRSchedulersContainer``, a ``train_state`` entry, ``base_folder`` =
the dump folder (ROOT), ``folder="checkpoint"`` (its default), ``interval=1``,
``keep_latest_k=3``, and a one-rank gloo process group (the purge asks ``dist.get_rank()``).

The second argument is torchtitan's ``async_mode``: ``disabled`` (default) or ``async``. ``save``
waits for the background write (``maybe_wait_for_saving``) and for torchtitan's purge thread
to remove what ``_purge_stale_checkpoints`` queued, then reports. In ``async`` mode that purge
lists the folder right after staging, often before DCP's thread created ``step-N``: it then
keeps ``keep_latest_k`` older steps besides the new one until the next save.

``hang`` stops inside DCP's data write (``filesystem._write_item``) once the first item of a
shard is on disk: the shard is partly written and ``.metadata`` is never renamed into place. In
``async`` mode torchtitan purges as soon as staging is done, before the write finishes; the hang
lets that purge finish first, as it would in a real job long before a node died.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from common import hang_here, serve
from torch.distributed.checkpoint import filesystem
from torch.distributed.checkpoint.stateful import Stateful
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
from torchtitan.components.optimizer.optimizer import (
    OptimizersContainer,
    ParamGroupConfig,
)

ROOT = Path(sys.argv[1])
ASYNC_MODE = sys.argv[2] if len(sys.argv) > 2 else "disabled"
KEEP = 3
FOLDER = ROOT / "checkpoint"

dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)


@dataclass
class TrainState(Stateful):
    """The Trainer passes itself as ``train_state``; its state is the step."""

    step: int = 0

    def state_dict(self) -> dict[str, object]:
        return {"step": self.step}

    def load_state_dict(self, state_dict: dict[str, object]) -> None:
        self.step = int(state_dict["step"])  # type: ignore[arg-type]


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
optimizers = OptimizersContainer(
    OptimizersContainer.Config(
        param_groups=[
            ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 1e-3})
        ],
        implementation="for-loop",
    ),
    model_parts=[model],
)
lr_schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(
    optimizers=optimizers, training_steps=1000
)
train_state = TrainState()
manager = CheckpointManager(
    CheckpointManager.Config(
        enable=True, folder="checkpoint", interval=1, keep_latest_k=KEEP, async_mode=ASYNC_MODE
    ),
    dataloader=None,
    model_parts=[model],
    optimizers=optimizers,
    lr_schedulers=lr_schedulers,
    states={"train_state": train_state},
    sd_adapter=None,
    base_folder=str(ROOT),
)
hanging: dict[str, object] = {}
purged: list[str] = []  # what torchtitan's purge decided to delete
save_returned = threading.Event()

_put = manager.purge_queue.put


def _record_purge(path: str | None, *args, **kwargs) -> None:
    if path is not None:
        purged.append(path)
    _put(path, *args, **kwargs)


manager.purge_queue.put = _record_purge  # type: ignore[method-assign]

_write_item = filesystem._write_item


def _wait_for_purge() -> None:
    """Until torchtitan's purge thread removed what ``_purge_stale_checkpoints`` queued."""
    deadline = time.monotonic() + 60
    while any(os.path.lexists(p) for p in purged) and time.monotonic() < deadline:
        time.sleep(0.01)


def _write_item_then_maybe_hang(*args, **kwargs):
    result = _write_item(*args, **kwargs)
    if hanging:
        args[1].flush()
        if ASYNC_MODE != "disabled":  # the write runs in DCP's thread; the purge in the caller's
            save_returned.wait(60)
            _wait_for_purge()
        hang_here(hanging["step"], str(hanging["path"]), "torchtitan dcp shard half-written")
    return result


filesystem._write_item = _write_item_then_maybe_hang


def train(steps: int = 5) -> None:
    for _ in range(steps):
        loss = model(torch.randn(8, 256)).pow(2).mean()
        loss.backward()
        optimizers.step()
        optimizers.zero_grad()
        lr_schedulers.step()
        train_state.step += 1


def save(hang: bool) -> tuple[int, str]:
    train()
    step = train_state.step
    path = FOLDER / f"step-{step}"
    if hang:
        hanging.update(step=step, path=path)
    save_returned.clear()
    manager.save(step)
    save_returned.set()
    manager.maybe_wait_for_saving()
    _wait_for_purge()
    return step, str(path)


serve(save)
