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
import sys
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch
from common import say
from lightning_run import Gate, Tiny, install, temporary_directory
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

TMPDIR, SAME_FILESYSTEM = temporary_directory(args.tmpdir, ROOT)
install(SAME_FILESYSTEM)


def markers() -> list[str]:
    """NeMo's markers under ROOT: none may be left once a save returned."""
    suffix = NeMoModelCheckpoint.UNFINISHED_CHECKPOINT_SUFFIX
    return sorted(name for name in os.listdir(ROOT) if name.endswith(suffix))


torch.manual_seed(0)
trainer = pl.Trainer(
    accelerator="cpu",
    devices=1,
    max_epochs=1000,
    logger=False,
    enable_checkpointing=False,  # exp_manager adds NeMo's own
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[Gate(args.every, lambda: {"markers": markers()})],
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
trainer.fit(Tiny(lambda step: -float(step)))  # improving: every trigger ranks, top k rotates
say("bye")
