"""PyTorch DCP saving to Azure Blob Storage through fsspec (adlfs):
``FsspecWriter("az://CONTAINER/JOB/step-N")``, keeping the newest three as a user's own retention
would (``fs.rm(recursive=True)`` of the oldest). The account, endpoint and key come from
AZURE_STORAGE_CONNECTION_STRING (Azurite's in the test), which adlfs reads itself.

What the writer does on Azure, as read in torch's ``_fsspec_filesystem.py`` and adlfs's
``AzureBlobFile``: each rank's shard ``__0_0.distcp`` is one ``fs.open(..., "wb")``: adlfs
buffers ``blocksize`` bytes and stages them as a block (Put Block) each time the buffer passes
it; at close it commits the block list (Put Block List), and only then is there a blob at the
key. Every file is written so, however small. Then ``.metadata.tmp`` is written and renamed to
``.metadata`` (a server-side copy, then a delete). ``.metadata`` is DCP's commit.

The shard is about 12.6 MiB (the model's weights and AdamW's two moments) and the block 4 MiB:
every shard is four blocks.

``hang`` stops inside the shard's upload once its first block is staged (adlfs's
``AzureBlobFile._upload_chunk``): uncommitted blocks at the key, no blob, no ``.metadata``.
SIGKILL leaves them so (the service drops uncommitted blocks a week later).
"""

from __future__ import annotations

import sys

import adlfs
import torch
import torch.distributed.checkpoint as dcp
from common import hang_here, serve
from fsspec.core import url_to_fs
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

ROOT = sys.argv[1].rstrip("/")  # az://container/job
if not ROOT.startswith("az://") or sys.argv[2:]:
    sys.exit(f"usage: {sys.argv[0]} az://CONTAINER/PREFIX")
KEEP = 3
BLOCK_SIZE = 4 * 2**20  # a shard past it is several staged blocks
STORAGE_OPTIONS = {"blocksize": BLOCK_SIZE}

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)
)  # about 4.2 MiB of weights: 12.6 MiB with AdamW's moments
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
fs, _ = url_to_fs(ROOT, **STORAGE_OPTIONS)
step = 0
saved: list[str] = []
hanging: dict[str, object] = {}

_upload_chunk = adlfs.spec.AzureBlobFile._upload_chunk


def _upload_chunk_then_maybe_hang(self, final=False, **kwargs):
    result = _upload_chunk(self, final=final, **kwargs)
    if hanging and not final and self._block_list:  # a block staged, no block list committed
        hang_here(hanging["step"], str(hanging["path"]), "dcp shard: blocks staged, uncommitted")
    return result


adlfs.spec.AzureBlobFile._upload_chunk = _upload_chunk_then_maybe_hang


def train(steps: int = 5) -> None:
    global step
    for _ in range(steps):
        loss = model(torch.randn(8, 512)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1


def save(hang: bool) -> tuple[int, str]:
    train()
    path = f"{ROOT}/step-{step}"
    if hang:
        hanging.update(step=step, path=path)
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    dcp.save(state, storage_writer=FsspecWriter(path, **STORAGE_OPTIONS))
    saved.append(path)
    while len(saved) > KEEP:
        fs.rm(saved.pop(0), recursive=True)
    return step, path


serve(save)
