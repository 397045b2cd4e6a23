"""PyTorch Lightning 2.6.6 ``ModelCheckpoint(dirpath="s3://BUCKET/JOB")`` under a real ``Trainer``
(CPU, one process), saving through fsspec (s3fs) to the store the standard AWS environment names
(AWS_ENDPOINT_URL: moto's server in the test).

What Lightning does on S3, as read in ``lightning/fabric/utilities/cloud_io.py`` (``_atomic_save``)
and s3fs's ``S3FileSystem._pipe_file``: ``torch.save`` into memory, then, because the filesystem
is object storage (``_is_object_storage``), ``fs.pipe(path, bytes)`` inside ``fs.transaction``
(which defers nothing here: a transaction holds back only files opened for writing). No
temporary name, no rename (no COPY, no DELETE): the ``.ckpt`` is written at its final key. Under
``2 * chunksize`` bytes that is one PutObject; past it, CreateMultipartUpload, the parts
(``max_concurrency`` at a time), then CompleteMultipartUpload. Either way S3 shows the object
only once whole. Retention is ``TorchCheckpointIO.remove_checkpoint``: ``fs.exists``, then
``fs.rm`` (a DeleteObject), after the new file is in place.

s3fs's pipe ``chunksize`` is 50 MiB, so a Lightning checkpoint is a multipart upload only from
100 MiB on; no storage option changes it. This driver passes 5 MiB (S3's smallest part) as the
default instead, so that its 12 MiB checkpoint (the model's weights and AdamW's two moments)
takes the multipart path in three parts: the same requests a 100 MiB one makes, fewer bytes.

``save`` is ``--every`` optimizer steps and one ``ModelCheckpoint`` trigger (see
lightning_writer.py; ``--top-k`` files ranked by a score that improves at every step, no
``last.ckpt``); each ``saved`` line carries ``step``, ``path`` (the key's URL), ``written`` and
``writes``.

``hang`` stops the next save's upload once its first part is in the store: the other parts are
held before they are sent, and the process stops when the first one's UploadPart has returned. A
multipart upload open with one part, no object at its key; SIGKILL leaves it open (only a
lifecycle rule or an explicit abort removes it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import lightning as L
import lightning_run
import s3fs
import torch
from common import hang_here, say
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning_run import Gate, Tiny

ROOT = sys.argv[1].rstrip("/")  # s3://bucket/job
if not ROOT.startswith("s3://"):
    sys.exit(f"usage: {sys.argv[0]} s3://BUCKET/PREFIX [options]")
parser = argparse.ArgumentParser()
parser.add_argument("--top-k", type=int, default=3)
parser.add_argument("--every", type=int, default=3)
args = parser.parse_args(sys.argv[2:])
CHUNK_SIZE = 5 * 2**20  # S3's smallest part (s3fs's pipe default: 50 MiB)

hanging = lightning_run.hanging  # set by Gate on ``hang``


def count_saves() -> None:
    """Record every file ``TorchCheckpointIO.save_checkpoint`` writes (Gate reports them)."""
    save_checkpoint = TorchCheckpointIO.save_checkpoint

    def counted(self, checkpoint, path, storage_options=None):  # type: ignore[no-untyped-def]
        if hanging:
            hanging["path"] = os.fspath(path)
        save_checkpoint(self, checkpoint, path, storage_options)
        lightning_run.written.append(os.fspath(path))

    TorchCheckpointIO.save_checkpoint = counted


def small_parts() -> None:
    """s3fs's pipe with 5 MiB parts unless told otherwise (Lightning passes no chunksize)."""
    pipe_file = s3fs.S3FileSystem._pipe_file

    async def pipe_in_small_parts(self, path, data, chunksize=CHUNK_SIZE, **kwargs):  # type: ignore[no-untyped-def]
        return await pipe_file(self, path, data, chunksize=chunksize, **kwargs)

    s3fs.S3FileSystem._pipe_file = pipe_in_small_parts


def hang_after_the_first_part() -> None:
    """Once ``hanging`` is set: parts after the first wait before they are sent, and the first
    one's upload stops the process once the store has it."""
    call_s3 = s3fs.S3FileSystem._call_s3

    async def call_then_maybe_hang(self, method, *rest, **kwargs):  # type: ignore[no-untyped-def]
        if not hanging or method != "upload_part":
            return await call_s3(self, method, *rest, **kwargs)
        if kwargs["PartNumber"] > 1:
            await asyncio.Event().wait()  # never set: only the first part reaches the store
        result = await call_s3(self, method, *rest, **kwargs)
        hang_here(hanging["step"], str(hanging.get("path")), "ckpt: multipart upload open")
        return result

    s3fs.S3FileSystem._call_s3 = call_then_maybe_hang


class Wide(Tiny):
    """Tiny with a wider MLP: about 4.2 MiB of weights, 12 MiB with AdamW's moments."""

    def __init__(self, score):  # type: ignore[no-untyped-def]
        super().__init__(score)
        self.layer = torch.nn.Sequential(
            torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)
        )

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.randn(4096, 512), batch_size=4)


count_saves()
small_parts()
hang_after_the_first_part()
torch.manual_seed(0)
checkpoint = ModelCheckpoint(
    dirpath=ROOT,
    every_n_train_steps=args.every,
    save_top_k=args.top_k,
    monitor="score",
    mode="min",
    save_last=None,
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
say("ready")
trainer.fit(Wide(lambda step: -float(step)))
say("bye")
