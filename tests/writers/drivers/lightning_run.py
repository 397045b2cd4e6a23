"""What the Lightning and NeMo drivers share: one ``fit`` held at every save boundary, the files
Lightning writes counted, and a save stopped half-way through its bytes.

Runs in a writers' virtualenv with Lightning (2.6.6 in ``torch``, 2.4.0 under NeMo 3 in
``nemo``); both write a checkpoint through ``TorchCheckpointIO.save_checkpoint`` into an fsspec
``LocalFileOpener`` temporary file in ``$TMPDIR``, then ``shutil.move`` it into place.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from common import hang_here, say
from fsspec.implementations.local import LocalFileOpener
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import Callback

written: list[str] = []  # every file a save wrote, in order
hanging: dict[str, object] = {}  # set by ``hang``: the next save stops half-way


def temporary_directory(tmpdir: str | None, root: Path) -> tuple[str, bool]:
    """Where fsspec's ``mkstemp()`` writes (``tmpdir``, as TMPDIR would set it), and whether it
    shares ``root``'s filesystem (the move is then a rename, else a copy)."""
    if tmpdir:
        os.makedirs(tmpdir, exist_ok=True)
        tempfile.tempdir = tmpdir
    chosen = tempfile.gettempdir()
    return chosen, os.stat(chosen).st_dev == os.stat(root).st_dev


def install(same_filesystem: bool) -> None:
    """Count ``TorchCheckpointIO.save_checkpoint``'s files, and once ``hanging`` is set, stop
    the save half-way: inside the temporary file's write on the same filesystem (nothing under
    ROOT yet), else inside the move's copy (half a ``.ckpt`` under its final name)."""
    save_checkpoint = TorchCheckpointIO.save_checkpoint

    def counted(self, checkpoint, path, storage_options=None):  # type: ignore[no-untyped-def]
        if hanging:
            hanging["path"] = os.fspath(path)
        save_checkpoint(self, checkpoint, path, storage_options)
        written.append(os.fspath(path))

    TorchCheckpointIO.save_checkpoint = counted
    write = LocalFileOpener.write

    def write_then_maybe_hang(self, data, *rest, **kwargs):  # type: ignore[no-untyped-def]
        if hanging and same_filesystem and "w" in self.mode:
            view = memoryview(data)
            self.f.write(view[: len(view) // 2])
            self.f.flush()
            hang_here(hanging["step"], str(hanging.get("path")), "temporary file half-written")
        return write(self, data, *rest, **kwargs)

    LocalFileOpener.write = write_then_maybe_hang
    sendfile = shutil._fastcopy_sendfile  # type: ignore[attr-defined]

    def sendfile_then_maybe_hang(fsrc, fdst):  # type: ignore[no-untyped-def]
        if not hanging:
            return sendfile(fsrc, fdst)
        infd, outfd = fsrc.fileno(), fdst.fileno()
        half, offset = os.fstat(infd).st_size // 2, 0
        while offset < half:
            sent = os.sendfile(outfd, infd, offset, half - offset)
            if sent == 0:
                break
            offset += sent
        fdst.flush()
        hang_here(hanging["step"], str(hanging.get("path")), "cross-filesystem move half-copied")

    shutil._fastcopy_sendfile = sendfile_then_maybe_hang  # type: ignore[attr-defined]


class Tiny(LightningModule):
    """A small MLP whose logged ``score`` is ``score(global_step)``."""

    def __init__(self, score: Callable[[int], float]) -> None:
        super().__init__()
        self.score = score
        self.layer = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)
        )

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch).pow(2).mean()
        self.log("score", self.score(self.global_step), on_step=True, on_epoch=False)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.randn(4096, 64), batch_size=4)


class Gate(Callback):
    """At every save boundary (``every`` steps): report the save just made (with ``extra()``'s
    fields), then wait for the next command."""

    def __init__(self, every: int, extra: Callable[[], dict] = dict) -> None:
        self.every = every
        self.extra = extra
        self.reported = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        step = trainer.global_step
        if step % self.every:
            return
        if step > 0:
            mine = written[self.reported :]
            self.reported = len(written)
            path = mine[-1] if mine else None
            say("saved", step=step, path=path, written=mine, writes=len(written), **self.extra())
        verb = sys.stdin.readline().strip()
        if verb == "hang":
            hanging.update(step=step + self.every)
        elif verb != "save":  # quit, or stdin closed: leave before any end-of-training save
            say("bye")
            sys.stdout.flush()
            os._exit(0)
