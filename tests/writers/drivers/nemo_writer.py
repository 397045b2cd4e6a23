"""NeMo 3.0.0's checkpoint callback (``NeMoModelCheckpoint``) under a Lightning 2.4.0 ``Trainer``
(CPU, one process), set up by NeMo's own ``exp_manager`` as a NeMo training script does.

One ``fit`` runs for the driver's whole life; a ``Gate`` callback holds training at every save
boundary until the next command, so each ``save`` is ``--every`` more optimizer steps and then
exactly one checkpoint trigger (``every_n_train_steps``): ``NeMoModelCheckpoint._save_checkpoint``
touches ``<name>-unfinished``, Lightning's ``TorchCheckpointIO`` writes ``<name>.ckpt`` (a
temporary file in ``$TMPDIR`` moved into place), the finalize callback unlinks the marker; then
the file pushed out of the top k goes through ``NeMoModelCheckpoint._remove_checkpoint`` (touch
the marker, remove, unlink the marker).

Options: ``--top-k K``, ``--save-last true|false`` (exp_manager's ``<template>-last.ckpt``, a
full save at every trigger, the previous one removed), ``--ema`` (exp_manager's EMA callback: a
second file ``<name>-EMA.ckpt`` under the same marker), ``--every N`` steps per save,
``--tmpdir DIR`` (where fsspec's transaction writes its temporary file; on another filesystem
than ROOT the move is a copy that grows the ``.ckpt`` under its final name) and ``--log-dir``
(exp_manager's own files, kept out of the watched ROOT).

Each ``saved`` line carries ``step`` (``trainer.global_step``), ``path`` (the last file the save
wrote), ``written`` (every file it wrote) and ``writes`` (files written since start), counted
around ``TorchCheckpointIO.save_checkpoint``, and ``markers``: NeMo's markers left under ROOT (none
once a save returned).

``hang`` stops the next save half-way through its first file's bytes, the marker already
touched and its unlink never reached: inside fsspec's ``LocalFileOpener.write`` of the temporary
file when TMPDIR is on ROOT's filesystem (under ROOT only the marker), else inside
``shutil._fastcopy_sendfile`` of the move's copy (the marker and half a ``.ckpt`` under its final
name).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch
from common import hang_here, say
from fsspec.implementations.local import LocalFileOpener
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback
from nemo.utils.callbacks.nemo_model_checkpoint import NeMoModelCheckpoint
from nemo.utils.exp_manager import exp_manager

ROOT = Path(sys.argv[1])
parser = argparse.ArgumentParser()
parser.add_argument("--top-k", type=int, default=2)
parser.add_argument("--save-last", choices=("true", "false"), default="false")
parser.add_argument("--ema", action="store_true")
parser.add_argument("--every", type=int, default=3)
parser.add_argument("--tmpdir", default=None)
parser.add_argument("--log-dir", default=None)
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

# --- hang half-way through the bytes, the marker touched and never unlinked ------------------

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


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)
        )

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch).pow(2).mean()
        # An improving score: every trigger ranks, so the top k pushes one file out per save.
        self.log("score", -float(self.global_step), on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.randn(4096, 64), batch_size=4)


def markers() -> list[str]:
    """NeMo's markers under ROOT: none may be left once a save returned."""
    suffix = NeMoModelCheckpoint.UNFINISHED_CHECKPOINT_SUFFIX
    return sorted(name for name in os.listdir(ROOT) if name.endswith(suffix))


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
                markers=markers(),
            )
        verb = sys.stdin.readline().strip()
        if verb == "hang":
            hanging.update(step=step + args.every)
        elif verb != "save":  # quit, or stdin closed: leave before any end-of-training save
            say("bye")
            sys.stdout.flush()
            os._exit(0)


torch.manual_seed(0)
trainer = pl.Trainer(
    accelerator="cpu",
    devices=1,
    max_epochs=1000,
    logger=False,
    enable_checkpointing=False,  # exp_manager adds NeMo's own
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[Gate()],
)
exp_manager(
    trainer,
    {
        "explicit_log_dir": args.log_dir or tempfile.mkdtemp(prefix="nemo-log-"),
        "name": "tiny",
        "create_tensorboard_logger": False,
        "create_checkpoint_callback": True,
        "create_preemption_callback": False,
        "log_tflops_per_sec_per_gpu": False,
        "ema": {"enable": args.ema},
        "checkpoint_callback_params": {
            "dirpath": str(ROOT),
            "monitor": "score",
            "mode": "min",
            "save_top_k": args.top_k,
            "save_last": args.save_last == "true",
            "every_n_epochs": None,
            "every_n_train_steps": args.every,
        },
    },
)
callback = next(c for c in trainer.callbacks if isinstance(c, NeMoModelCheckpoint))
say("ready", tmpdir=TMPDIR, same_filesystem=SAME_FILESYSTEM, filename=callback.filename)
trainer.fit(Tiny())
say("bye")
