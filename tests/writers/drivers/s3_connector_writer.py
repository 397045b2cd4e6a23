"""The S3 connector for PyTorch (s3torchconnector 1.5.0, on the AWS CRT through Mountpoint's Rust
client) saving to the store the standard AWS environment names (AWS_ENDPOINT_URL: moto's server in
the test; plain HTTP, path-style addressing, region us-east-1), in one of two ways:

- ``dcp``: torch DCP through the connector's own storage writer,
  ``dcp.save(state, storage_writer=S3StorageWriter(region, "s3://BUCKET/JOB/step-N",
  s3client_config=S3ClientConfig(force_path_style=True)))``, each save a ``step-N/`` prefix;
- ``torchsave``: ``torch.save(state, S3Checkpoint(region, ...).writer("s3://BUCKET/JOB/step-N.pt"))``,
  each save one ``step-N.pt`` object.

What the connector does on S3, as read in ``s3torchconnector/dcp/s3_file_system.py``,
``s3writer.py``, ``s3checkpoint.py`` and torch's ``distributed/checkpoint/filesystem.py``
(``FileSystemWriter.finish``), and observed against moto:

- Every write is ``S3Client.put_object``: a ``PutObjectStream`` that is ALWAYS a multipart upload
  at the FINAL key, even for a 5 kB file (ETag ``-1``), in 8 MiB parts
  (``S3ClientConfig.part_size``) sent as the bytes arrive; ``close`` completes it. S3 shows the
  object only once whole; a process killed mid-write leaves the upload open at the final key and
  no object there.
- DCP: ``S3StorageWriter`` is torch's ``FileSystemWriter`` over ``S3FileSystem``: each rank's
  shard ``__0_0.distcp`` (``DefaultPrefixStrategy``: ``__<rank>_``) through ``create_stream``,
  then ``finish``: ``.metadata.tmp`` written (its own one-part upload), ``fs.exists(.metadata)``
  (a HeadObject), then ``fs.rename``: CopyObject to ``.metadata``, DeleteObject of
  ``.metadata.tmp``. ``.metadata`` is DCP's commit, at the same key as through s3fs.
- ``torch.save`` into the connector's ``S3Writer`` (a file object): the zip records stream into
  the upload; leaving the ``with`` completes it.

The state is about 12.6 MiB (the model's weights and AdamW's two moments): a shard, or a ``.pt``,
is an upload of two parts.

Retention (keep 3) is the user's own: the oldest save's objects deleted with
``S3FileSystem.rm_file`` (the connector's DeleteObject) after the new save is in place; a DCP
save's keys are the three it wrote.

``hang`` stops inside the next save's first upload once a whole part has been handed to the
client and the store shows it (``S3Writer.write`` past ``part_size``, then the part awaited in
ListParts): a multipart upload open with one part, no object at its key (for DCP, no
``.metadata``). SIGKILL leaves it open (only a lifecycle rule or an explicit abort removes it).
"""

from __future__ import annotations

import os
import sys
import time

import botocore.session
import torch
import torch.distributed.checkpoint as dcp
from common import hang_here, serve
from s3torchconnector import S3Checkpoint, S3ClientConfig, S3Writer
from s3torchconnector.dcp import S3FileSystem, S3StorageWriter

ROOT = sys.argv[1].rstrip("/")  # s3://bucket/job
MODE = sys.argv[2] if len(sys.argv) == 3 else ""
if not ROOT.startswith("s3://") or MODE not in ("dcp", "torchsave"):
    sys.exit(f"usage: {sys.argv[0]} s3://BUCKET/PREFIX dcp|torchsave")
BUCKET = ROOT.removeprefix("s3://").split("/", 1)[0]
REGION = os.environ.get("AWS_REGION", "us-east-1")
CONFIG = S3ClientConfig(force_path_style=True)  # moto on 127.0.0.1: no bucket subdomains
KEEP = 3
DCP_FILES = ("__0_0.distcp", ".metadata")  # what a save left: .metadata.tmp is gone

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)
)  # about 4.2 MiB of weights: 12.6 MiB with AdamW's moments
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
filesystem = S3FileSystem(REGION, s3client_config=CONFIG)
checkpoints = S3Checkpoint(region=REGION, s3client_config=CONFIG)
step = 0
saved: list[str] = []
hanging: dict[str, object] = {}


def _part_in_store(key: str) -> bool:
    """Whether the open upload at ``key`` has a part in the store, read with a client of the
    driver's own (the connector lists no uploads)."""
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL"), region_name=REGION
    )
    for upload in client.list_multipart_uploads(Bucket=BUCKET, Prefix=key).get("Uploads", ()):
        if upload["Key"] == key and client.list_parts(
            Bucket=BUCKET, Key=key, UploadId=upload["UploadId"]
        ).get("Parts"):
            return True
    return False


_write = S3Writer.write


def _write_then_maybe_hang(self: S3Writer, data: bytes | memoryview) -> int:
    written = _write(self, data)
    if hanging and self.tell() > CONFIG.part_size:  # a whole part handed to the client
        key = str(hanging["key"])
        deadline = time.monotonic() + 60
        while not _part_in_store(key) and time.monotonic() < deadline:
            time.sleep(0.05)  # the CRT sends the part in the background
        hang_here(hanging["step"], str(hanging["path"]), f"{MODE}: multipart upload open")
    return written


S3Writer.write = _write_then_maybe_hang  # type: ignore[method-assign]


def train(steps: int = 5) -> None:
    global step
    for _ in range(steps):
        loss = model(torch.randn(8, 512)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1


def _key(url: str) -> str:
    return url.removeprefix(f"s3://{BUCKET}/")


def _remove(path: str) -> None:
    for name in DCP_FILES if MODE == "dcp" else ("",):
        filesystem.rm_file(f"{path}/{name}" if name else path)


def save(hang: bool) -> tuple[int, str]:
    train()
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    if MODE == "dcp":
        path = f"{ROOT}/step-{step}"
        first_upload = f"{path}/__0_0.distcp"
    else:
        path = first_upload = f"{ROOT}/step-{step}.pt"
    if hang:
        hanging.update(step=step, path=path, key=_key(first_upload))
    if MODE == "dcp":
        writer = S3StorageWriter(REGION, path, s3client_config=CONFIG)
        dcp.save(state, storage_writer=writer)
    else:
        with checkpoints.writer(path) as stream:
            torch.save(state, stream)
    saved.append(path)
    while len(saved) > KEEP:
        _remove(saved.pop(0))
    return step, path


serve(save)
