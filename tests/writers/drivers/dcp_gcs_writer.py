"""PyTorch DCP saving to GCS through fsspec (gcsfs): ``FsspecWriter("gs://BUCKET/JOB/step-N")``,
keeping the newest three as a user's own retention would (``fs.rm(recursive=True)`` of the
oldest). The endpoint comes from STORAGE_EMULATOR_HOST (gcp-storage-emulator in the test), as
gcsfs reads it; no credentials (``token="anon"``: the emulator asks none).

What the writer does on GCS, as read in torch's ``_fsspec_filesystem.py`` and gcsfs's
``GCSFile``: each shard file is one ``fs.open(..., "wb")``. A file under ``block_size`` is one
upload at close; a larger one opens a resumable upload session once its buffer passes the block
and sends a chunk each time it does, the object appearing only when the last chunk finalizes
it. Then ``.metadata.tmp`` is uploaded and renamed to ``.metadata`` (gcsfs: a rewrite, then a
delete). ``.metadata`` is DCP's commit.

Two IO threads (``thread_count=2``), as two ranks would, each write one shard of about 6.3 MiB
(the model's weights and AdamW's two moments, split by size): with a 5 MiB block each is a
resumable upload of two chunks.

``hang`` stops one shard's upload once its first chunk is in its session, and only after the
other shard's object is finalized: what a save killed mid-upload leaves on GCS is that finished
shard alone, no ``.metadata``. The session itself is in no listing (GCS lists none: a save
killed before any file was finalized leaves nothing a reader can see).
"""

from __future__ import annotations

import sys
import threading

import gcsfs
import torch
import torch.distributed.checkpoint as dcp
from common import hang_here, serve
from fsspec.core import url_to_fs
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

ROOT = sys.argv[1].rstrip("/")  # gs://bucket/job
if not ROOT.startswith("gs://") or sys.argv[2:]:
    sys.exit(f"usage: {sys.argv[0]} gs://BUCKET/PREFIX")
KEEP = 3
THREADS = 2
BLOCK_SIZE = 5 * 2**20  # gcsfs's default: a file past it is a resumable upload
STORAGE_OPTIONS = {"default_block_size": BLOCK_SIZE, "token": "anon"}

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)
)  # about 4.2 MiB of weights: 12.6 MiB with AdamW's moments
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
fs, _ = url_to_fs(ROOT, **STORAGE_OPTIONS)
step = 0
saved: list[str] = []
hanging: dict[str, object] = {}
_lock = threading.Lock()
_finalized = threading.Event()  # a shard of the hanging save is an object

_upload_chunk = gcsfs.core.GCSFile._upload_chunk


def _upload_chunk_then_maybe_hang(self, final=False):
    sent = _upload_chunk(self, final)
    if not hanging or not self.path.endswith(".distcp"):
        return sent
    if final:
        _finalized.set()
    elif sent and self.location:  # a chunk is in an open session: the object not there yet
        with _lock:  # the first shard to get here hangs, the other goes on
            first = hanging.setdefault("thread", threading.get_ident()) == threading.get_ident()
        if first:
            _finalized.wait()  # the other shard finishes first, as a faster rank's would
            hang_here(hanging["step"], str(hanging["path"]), "dcp shard: resumable upload open")
    return sent


gcsfs.core.GCSFile._upload_chunk = _upload_chunk_then_maybe_hang


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
    writer = FsspecWriter(path, thread_count=THREADS, **STORAGE_OPTIONS)
    dcp.save(state, storage_writer=writer)
    saved.append(path)
    while len(saved) > KEEP:
        fs.rm(saved.pop(0), recursive=True)
    return step, path


serve(save)
