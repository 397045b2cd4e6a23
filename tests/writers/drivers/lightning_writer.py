"""PyTorch Lightning 2.6.6 ``ModelCheckpoint`` under a real ``Trainer`` (CPU, one process).

One ``fit`` runs for the driver's whole life; a ``Gate`` callback holds training at every save
boundary until the next command, so each ``save`` is ``--every`` more optimizer steps and then
exactly one real ``ModelCheckpoint`` trigger (``every_n_train_steps``): the top-k file when it
ranks, then ``last.ckpt`` (a full save, or a symlink with ``--save-last link``), then the
callback's own deletions. ``every_n_train_steps`` and not epoch ends, because only the batch-end
trigger rewrites ``last.ckpt`` when top-k keeps nothing new (``on_train_epoch_end`` saves it only
after a top-k save).

Options: ``--save-last true|link|none``, ``--top-k K``, ``--monitor improving|never|none``
(``improving``: the score falls at every step, so every trigger ranks; ``never``: a constant,
so after the first K saves top-k keeps nothing new), ``--every N`` steps per save, and
``--tmpdir DIR``: where fsspec's transaction puts its temporary file (``tempfile.mkstemp()``,
so TMPDIR); on another filesystem than ROOT, the commit's ``shutil.move`` is a copy that grows
the ``.ckpt`` in place.

Each ``saved`` line carries ``step`` (``trainer.global_step``), ``path`` (the last file the save
wrote: the newest state), ``written`` (every file it wrote) and ``writes`` (files written since
start), counted around ``TorchCheckpointIO.save_checkpoint``.

``hang`` stops the next save half-way through writing the first file's bytes: inside
fsspec's ``LocalFileOpener.write`` of the temporary file when TMPDIR is on ROOT's filesystem
(nothing under ROOT yet: the rename never happens), else inside ``shutil._fastcopy_sendfile``
of the move's copy (half a ``.ckpt`` under ROOT under its final name).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import lightning as L
import torch
from common import hang_here, say
from fsspec.implementations.local import LocalFileOpener
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

ROOT = Path(sys.argv[1])
parser = argparse.ArgumentParser()
parser.add_argument("--save-last", choices=("true", "link", "none"), default="true")
parser.add_argument("--top-k", type=int, default=2)
parser.add_argument("--monitor", choices=("improving", "never", "none"), default="improving")
parser.add_argument("--every", type=int, default=3)
parser.add_argument("--tmpdir", default=None)
args = parser.parse_args(sys.argv[2:])

if args.tmpdir:
    os.makedirs(args.tmpdir, exist_ok=True)
    tempfile.tempdir = args.tmpdir  # what fsspec's mkstemp() uses, as TMPDIR would set it
TMPDIR = tempfile.gettempdir()
SAME_FILESYSTEM = os.stat(TMPDIR).st_dev == os.stat(ROOT).st_dev

written: list[str] = []
hanging: dict[str, object] = {}

# --- counting what the library writes (behaviour unchanged) ---------------------------------

_save_checkpoint = TorchCheckpointIO.save_checkpoint


def _counted_save_checkpoint(self, checkpoint, path, storage_options=None):
    if hanging:
        hanging["path"] = os.fspath(path)
    _save_checkpoint(self, checkpoint, path, storage_options)
    written.append(os.fspath(path))


TorchCheckpointIO.save_checkpoint = _counted_save_checkpoint

# --- hang half-way through the bytes ----------------------------------------------------------

_write = LocalFileOpener.write


def _write_then_maybe_hang(self, data, *rest, **kwargs):
    if hanging and SAME_FILESYSTEM and "w" in self.mode:
        view = memoryview(data)
        self.f.write(view[: len(view) // 2])
        self.f.flush()
        hang_here(hanging["step"], str(hanging.get("path")), "temporary file half-written")
    return _write(self, data, *rest, **kwargs)


LocalFileOpener.write = _write_then_maybe_hang

_sendfile = shutil._fastcopy_sendfile


def _sendfile_then_maybe_hang(fsrc, fdst):
    if not hanging:
        return _sendfile(fsrc, fdst)
    infd, outfd = fsrc.fileno(), fdst.fileno()
    half, offset = os.fstat(infd).st_size // 2, 0
    while offset < half:
        sent = os.sendfile(outfd, infd, offset, half - offset)
        if sent == 0:
            break
        offset += sent
    fdst.flush()
    hang_here(hanging["step"], str(hanging.get("path")), "cross-filesystem move half-copied")


shutil._fastcopy_sendfile = _sendfile_then_maybe_hang

# --- the model and the training run -----------------------------------------------------------


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)
        )

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch).pow(2).mean()
        score = -float(self.global_step) if args.monitor == "improving" else 0.0
        self.log("score", score, on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.randn(4096, 64), batch_size=4)


class Gate(Callback):
    """At every save boundary: report the save just made, then wait for the next command."""

    def __init__(self) -> None:
        self.reported = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % args.every:
            return
        if step > 0:
            mine = written[self.reported :]
            self.reported = len(written)
            say(
                "saved",
                step=step,
                path=mine[-1] if mine else None,
                written=mine,
                writes=len(written),
            )
        line = sys.stdin.readline()
        verb = line.strip()
        if verb == "hang":
            hanging.update(step=step + args.every)
        elif verb != "save":  # quit, or stdin closed: leave before any end-of-training save
            say("bye")
            sys.stdout.flush()
            os._exit(0)


torch.manual_seed(0)
checkpoint = ModelCheckpoint(
    dirpath=ROOT,
    every_n_train_steps=args.every,
    save_top_k=args.top_k,
    monitor=None if args.monitor == "none" else "score",
    mode="min",
    save_last={"true": True, "link": "link", "none": None}[args.save_last],
)
trainer = L.Trainer(
    accelerator="cpu",
    devices=1,
    max_epochs=1000,
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[Gate(), checkpoint],
)
say("ready", tmpdir=TMPDIR, same_filesystem=SAME_FILESYSTEM)
trainer.fit(Tiny())
say("bye")
