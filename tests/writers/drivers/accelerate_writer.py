"""Hugging Face Accelerate (1.15, CPU, one process): ``Accelerator.save_state()``.

``ROOT --mode automatic`` (the default): ``Accelerator(project_config=ProjectConfiguration(
project_dir=ROOT, automatic_checkpoint_naming=True, total_limit=2))``; every ``save_state()``
writes ``ROOT/checkpoints/checkpoint_<iteration>/`` and accelerate itself deletes the oldest
directory at the start of a save once two stand. The line's ``step`` is the training step,
which is not on disk: the directory's number counts saves.

``ROOT --mode explicit``: ``save_state(ROOT/step_<N>)`` as accelerate's examples name them, the
newest two kept as a user's own retention would (``shutil.rmtree`` after the save).

The model, its AdamW optimizer, a ``StepLR`` scheduler and a shuffled dataloader are prepared,
and one object is registered for checkpointing, so a save writes ``model.safetensors``,
``optimizer.bin``, ``scheduler.bin``, ``random_states_0.pkl``, then ``custom_checkpoint_0.pkl``.

``hang`` stops inside ``torch.save`` as accelerate calls it for the file named by
``--hang-in`` (``optimizer.bin``, the first file after the weights; or ``random_states_0.pkl``,
the rank's last, every file before it whole): torch's own serializer writes into the file
through a stream that, half-way through the bytes, flushes, fsyncs and stops for good.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration
from common import hang_here, serve

parser = argparse.ArgumentParser()
parser.add_argument("root", type=Path)
parser.add_argument("--mode", choices=("automatic", "explicit"), default="automatic")
parser.add_argument("--hang-in", choices=("optimizer.bin", "random_states_0.pkl"))
ARGS = parser.parse_args()
ROOT: Path = ARGS.root
HANG_IN: str = ARGS.hang_in or "optimizer.bin"
TOTAL_LIMIT = 2  # automatic naming: accelerate's own retention
KEEP = 2  # explicit directories: the user's
STEPS_PER_SAVE = 3

torch.manual_seed(0)
automatic = ARGS.mode == "automatic"
accelerator = Accelerator(
    cpu=True,
    project_config=ProjectConfiguration(
        project_dir=str(ROOT),
        automatic_checkpoint_naming=automatic,
        total_limit=TOTAL_LIMIT if automatic else None,
    ),
)


class Progress:
    """A user's own state, registered for checkpointing: ``custom_checkpoint_0.pkl``."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]


model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
data = torch.utils.data.TensorDataset(torch.randn(64, 256))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
progress = Progress()
accelerator.register_for_checkpointing(progress)
batches = iter(loader)
saved: list[Path] = []
hanging: dict[str, object] = {}

_torch_save = torch.save


class _StopsHalfWay(io.RawIOBase):
    """The file torch.save writes, cut off for good once ``limit`` bytes reached the disk."""

    def __init__(self, path: str, limit: int) -> None:
        self.stream = open(path, "wb")  # noqa: SIM115 - left open: the process is killed
        self.limit = limit
        self.written = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        chunk = bytes(data)
        room = self.limit - self.written
        self.stream.write(chunk[:room])
        self.written += min(len(chunk), room)
        if self.written >= self.limit:
            self.stream.flush()
            os.fsync(self.stream.fileno())
            hang_here(hanging["step"], str(hanging["path"]), f"{HANG_IN} half-written")
        return len(chunk)


def _save_then_maybe_hang(obj, f, *args, **kwargs):
    """torch.save, as accelerate's ``save`` and ``save_accelerator_state`` call it; for a
    ``hang`` save and the chosen file, the real serializer writing into a stream that stops."""
    if not (hanging and isinstance(f, (str, os.PathLike)) and os.fspath(f).endswith(HANG_IN)):
        return _torch_save(obj, f, *args, **kwargs)
    measure = io.BytesIO()
    _torch_save(obj, measure, *args, **kwargs)
    half_way = _StopsHalfWay(os.fspath(f), len(measure.getvalue()) // 2)
    return _torch_save(obj, half_way, *args, **kwargs)


torch.save = _save_then_maybe_hang  # looked up at call time by accelerate's save paths


def train() -> None:
    global batches
    for _ in range(STEPS_PER_SAVE):
        try:
            (batch,) = next(batches)
        except StopIteration:
            batches = iter(loader)
            (batch,) = next(batches)
        loss = model(batch).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        progress.step += 1


def save(hang: bool) -> tuple[int, str]:
    train()
    step = progress.step
    if automatic:
        path = ROOT / "checkpoints" / f"checkpoint_{accelerator.save_iteration}"
    else:
        path = ROOT / f"step_{step}"
    if hang:
        hanging.update(step=step, path=path)
    written = accelerator.save_state(None if automatic else str(path))
    assert Path(written) == path, (written, path)
    if not automatic:
        saved.append(path)
        while len(saved) > KEEP:
            shutil.rmtree(saved.pop(0))
    return step, str(path)


serve(save)
