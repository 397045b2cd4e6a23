"""PyTorch DCP saving to S3 through fsspec (s3fs): ``FsspecWriter("s3://BUCKET/JOB/step-N")``,
keeping the newest three as a user's own retention would (``fs.rm(recursive=True)`` of the
oldest). The endpoint, region and credentials come from the standard AWS environment
(AWS_ENDPOINT_URL: moto's server in the test).

What the writer does on S3, as read in torch's ``_fsspec_filesystem.py`` and s3fs's ``S3File``:
each rank's shard ``__0_0.distcp`` is one ``fs.open(..., "wb")``: s3fs buffers ``block_size``
bytes, then starts a multipart upload and sends a part each time the buffer passes it; at close
it completes the upload (a file under ``block_size`` is one PUT at close instead). Then
``.metadata.tmp`` is PUT and renamed to ``.metadata``: on S3 a COPY then a DELETE. ``.metadata``
is DCP's commit.

The shard is about 12.6 MiB (the model's weights and AdamW's two moments) and the block 5 MiB,
S3's smallest part: every shard is a multipart upload of three parts.

``hang`` stops inside the shard's upload once its first part is uploaded (s3fs's
``S3File._upload_chunk``): a multipart upload open with one part, no object at its key, no
``.metadata``. SIGKILL leaves it open (only a lifecycle rule or an explicit abort removes it).
"""

from __future__ import annotations

import sys

import s3fs
import torch
import torch.distributed.checkpoint as dcp
from common import hang_here, serve
from fsspec.core import url_to_fs
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

ROOT = sys.argv[1].rstrip("/")  # s3://bucket/job
if not ROOT.startswith("s3://") or sys.argv[2:]:
    sys.exit(f"usage: {sys.argv[0]} s3://BUCKET/PREFIX")
KEEP = 3
BLOCK_SIZE = 5 * 2**20  # S3's smallest part: a shard past it is a multipart upload
STORAGE_OPTIONS = {"default_block_size": BLOCK_SIZE}

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)
)  # about 4.2 MiB of weights: 12.6 MiB with AdamW's moments
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
fs, _ = url_to_fs(ROOT, **STORAGE_OPTIONS)
step = 0
saved: list[str] = []
hanging: dict[str, object] = {}

_upload_chunk = s3fs.core.S3File._upload_chunk


def _upload_chunk_then_maybe_hang(self, final=False):
    result = _upload_chunk(self, final)
    if hanging and not final and self.parts:  # a part is in the store, the upload still open
        hang_here(hanging["step"], str(hanging["path"]), "dcp shard: multipart upload open")
    return result


s3fs.core.S3File._upload_chunk = _upload_chunk_then_maybe_hang


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
