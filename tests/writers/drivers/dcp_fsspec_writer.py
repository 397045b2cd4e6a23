"""PyTorch DCP saving to an object store through fsspec: ``FsspecWriter("SCHEME://BUCKET/JOB/step-N")``,
keeping the newest three as a user's own retention would (``fs.rm(recursive=True)`` of the
oldest). The URL's scheme picks the fsspec filesystem: s3fs (``s3://``), gcsfs (``gs://``) or
adlfs (``az://``). Each finds its server as it would in production: the standard AWS
environment (AWS_ENDPOINT_URL), STORAGE_EMULATOR_HOST, AZURE_STORAGE_CONNECTION_STRING.

    dcp_fsspec_writer.py URL --block-size BYTES [--threads N] [--hang first|after-other]
                             [--option KEY=VALUE ...]

What the writer does, as read in torch's ``_fsspec_filesystem.py`` and each library's file
class: each shard ``__0_N.distcp`` is one ``fs.open(..., "wb")`` that buffers ``--block-size``
bytes and sends a part each time the buffer passes it (``_upload_chunk``); the object appears
only when the upload completes at close. Then ``.metadata.tmp`` is written and renamed to
``.metadata`` (a server-side copy, then a delete). ``.metadata`` is DCP's commit.

- S3 (s3fs): a file past the block is a multipart upload, one part a block (5 MiB is S3's
  smallest part); a file under it is one PUT at close. An open upload is listed.
- GCS (gcsfs): a file past the block is a resumable upload session, one chunk a block; the
  session is in no listing (GCS lists none).
- Azure (adlfs): every file, however small, is staged blocks (Put Block) committed at close
  (Put Block List): staged blocks are uncommitted until then.

The state is the model's weights and AdamW's two moments, about 12.6 MiB: one shard with one
IO thread, two of about 6.3 MiB (split by size) with ``--threads 2``, as two ranks would.

``hang`` stops inside a shard's upload once its first part is in the store (sent, the upload
still open): ``first`` at once; ``after-other`` only once another shard of the same save is a
finished object, as when a faster rank finished first (needs ``--threads`` of 2 or more).
SIGKILL leaves the upload open: S3 keeps it until a lifecycle rule or an abort, Azure drops
uncommitted blocks after a week, GCS shows only the finished shards.
"""

from __future__ import annotations

import argparse
import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from common import hang_here, serve
from fsspec.core import url_to_fs
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

KEEP = 3


@dataclass(frozen=True)
class Library:
    """One fsspec filesystem: the file class that sends each part, how it names the block size,
    and whether a file's upload is open with a part in the store (``sent``: what
    ``_upload_chunk`` returned)."""

    module: str
    file_class: str
    block_option: str
    upload_open: Callable[[Any, object], bool]
    what: str

    def file_type(self) -> type:
        return getattr(importlib.import_module(self.module), self.file_class)


LIBRARIES = {
    "s3": Library(
        "s3fs.core", "S3File", "default_block_size",
        lambda file, sent: bool(file.parts), "dcp shard: multipart upload open",
    ),
    "gs": Library(
        "gcsfs.core", "GCSFile", "default_block_size",
        lambda file, sent: bool(sent and file.location), "dcp shard: resumable upload open",
    ),
    "az": Library(
        "adlfs.spec", "AzureBlobFile", "blocksize",
        lambda file, sent: bool(file._block_list), "dcp shard: blocks staged, uncommitted",
    ),
}  # fmt: skip


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", help="SCHEME://BUCKET/PREFIX, SCHEME one of s3, gs, az")
    parser.add_argument("--block-size", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hang", choices=("first", "after-other"), default="first")
    parser.add_argument("--option", action="append", default=[], help="a storage option")
    args = parser.parse_args()
    scheme = args.root.partition("://")[0]
    if scheme not in LIBRARIES:
        parser.error(f"{args.root}: the scheme must be one of {', '.join(LIBRARIES)}")
    return args


ARGS = arguments()
ROOT = ARGS.root.rstrip("/")
LIBRARY = LIBRARIES[ROOT.partition("://")[0]]
STORAGE_OPTIONS = {
    LIBRARY.block_option: ARGS.block_size,
    **dict(option.split("=", 1) for option in ARGS.option),
}

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
_finished = threading.Event()  # a shard of the hanging save is an object


def hang_in_upload(file_type: type) -> None:
    """Wrap ``file_type._upload_chunk`` so that, while a ``hang`` save runs, the first shard
    whose upload is open with a part in the store stops there (the other shards go on)."""
    upload_chunk = file_type._upload_chunk

    def upload_chunk_then_maybe_hang(self, final=False, **kwargs):  # type: ignore[no-untyped-def]
        sent = upload_chunk(self, final=final, **kwargs)
        if not hanging or not self.path.endswith(".distcp"):
            return sent
        if final:
            _finished.set()
        elif LIBRARY.upload_open(self, sent):
            with _lock:  # the first shard to get here hangs
                first = hanging.setdefault("thread", threading.get_ident()) == threading.get_ident()
            if first:
                if ARGS.hang == "after-other":
                    _finished.wait()
                hang_here(hanging["step"], str(hanging["path"]), LIBRARY.what)
        return sent

    file_type._upload_chunk = upload_chunk_then_maybe_hang


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
    writer = FsspecWriter(path, thread_count=ARGS.threads, **STORAGE_OPTIONS)
    dcp.save(state, storage_writer=writer)
    saved.append(path)
    while len(saved) > KEEP:
        fs.rm(saved.pop(0), recursive=True)
    return step, path


hang_in_upload(LIBRARY.file_type())
serve(save)
