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
import sys
from pathlib import Path

import lightning as L
import torch
from common import say
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning_run import Gate, Tiny, install, temporary_directory

ROOT = Path(sys.argv[1])
parser = argparse.ArgumentParser()
parser.add_argument("--save-last", choices=("true", "link", "none"), default="true")
parser.add_argument("--top-k", type=int, default=2)
parser.add_argument("--monitor", choices=("improving", "never", "none"), default="improving")
parser.add_argument("--every", type=int, default=3)
parser.add_argument("--tmpdir", default=None)
args = parser.parse_args(sys.argv[2:])

TMPDIR, SAME_FILESYSTEM = temporary_directory(args.tmpdir, ROOT)
install(SAME_FILESYSTEM)

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
    callbacks=[Gate(args.every), checkpoint],
)
say("ready", tmpdir=TMPDIR, same_filesystem=SAME_FILESYSTEM)
trainer.fit(Tiny(lambda step: -float(step) if args.monitor == "improving" else 0.0))
say("bye")
