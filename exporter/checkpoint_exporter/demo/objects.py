"""The demo's job in object storage: an S3 server on 127.0.0.1 (moto's, when it is installed, as
in a development checkout), a job saving DCP generations into a bucket, and a lifecycle rule.

Each rank uploads its shard as a multipart upload (5 MiB parts, as s3fs and the S3 connector
send a large file), rank 0 puts ``.metadata`` last: DCP's commit, as DCP through s3fs makes it.
Every third save a rank dies after its first part: the save is aborted (its ranks say so), and
its open upload stays in the bucket, counted in checkpoint_object_store_incomplete_uploads, until
the lifecycle rule aborts it a minute later, as a bucket's AbortIncompleteMultipartUpload rule
would (days later, in a real bucket).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from checkpoint_exporter import instrument

BUCKET = "demo-ckpt"
NAME = "llama70b-s3"
RANKS = 2
SHARD_BYTES = 6 << 20  # two parts each: a 5 MiB one and the rest
PART_BYTES = 5 << 20
INTERVAL, DEADLINE = 25.0, 8.0
FAULT_EVERY = 3  # the second save of every three loses a rank mid-upload
KEEP = 3
LIFECYCLE_SECONDS = 60.0  # open uploads older than this are aborted
# Fake credentials for the embedded server only: moto accepts any.
ENV = {
    "AWS_ACCESS_KEY_ID": "demo",
    "AWS_SECRET_ACCESS_KEY": "demo",
    "AWS_REGION": "us-east-1",
}


def available() -> bool:
    """Whether an embedded S3 server can run here (moto's server, and botocore to write)."""
    return all(importlib.util.find_spec(name) for name in ("moto", "flask", "botocore"))


def server_command(port: int) -> list[str]:
    """moto's S3 server on 127.0.0.1:port (the demo's processes start it and log it)."""
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


def wait_for_server(port: int, server: subprocess.Popen, log: Path) -> None:
    """Once this returns, the server answers."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/data.json", timeout=1):
                return
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.2)
    raise RuntimeError(f"the embedded S3 server did not start; see {log}")


def config_line(port: int) -> str:
    return (
        f"  - {{name: {NAME}, path: 's3://{BUCKET}/{NAME}', interval: {INTERVAL:g}s, "
        f"deadline: {DEADLINE:g}s, layout: dcp, poll_interval: 5s, storage_options: "
        f"{{endpoint_url: 'http://127.0.0.1:{port}', allow_http: true}}}}"
    )


class ObjectJob:
    """The job writing to the bucket, and the bucket's lifecycle rule, as two threads."""

    def __init__(self, port: int, spool: Path, stop: threading.Event,
                 metadata: Any) -> None:  # fmt: skip
        import botocore.session

        self.stop, self.spool, self.metadata = stop, spool, metadata
        self.client = botocore.session.get_session().create_client(
            "s3", endpoint_url=f"http://127.0.0.1:{port}", region_name=ENV["AWS_REGION"],
            aws_access_key_id=ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=ENV["AWS_SECRET_ACCESS_KEY"],
        )  # fmt: skip
        self.client.create_bucket(Bucket=BUCKET)
        self.saves = 0

    def start(self) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self._train, daemon=True),
            threading.Thread(target=self._lifecycle, daemon=True),
        ]
        for thread in threads:
            thread.start()
        return threads

    def _train(self) -> None:
        self.stop.wait(6.0)
        instrument.start(training_job=NAME, spool=str(self.spool), interval=10.0)
        step = 0
        while not self.stop.is_set():
            step += 100
            started = time.monotonic()
            self._save(step, killed=self.saves % FAULT_EVERY == 1)
            self.saves += 1
            self._retain()
            self.stop.wait(max(1.0, INTERVAL - (time.monotonic() - started)))

    def _save(self, step: int, killed: bool) -> None:
        prefix = f"{NAME}/step-{step}"
        done = threading.Barrier(RANKS + 1)

        def rank(r: int) -> None:
            with instrument.saving(training_job=NAME, step=step, path=f"s3://{BUCKET}/{prefix}",
                                   spool=str(self.spool), rank=r, world_size=RANKS) as save:  # fmt: skip
                save.resume()
                save.staged()
                died = killed and r == RANKS - 1
                try:
                    self._upload(f"{prefix}/__{r}_0.distcp", died)
                finally:
                    done.wait()
                if died:
                    raise RuntimeError("rank killed mid-upload (injected fault)")
                save.written()

        threads = [threading.Thread(target=_quietly, args=(rank, r)) for r in range(RANKS)]
        for thread in threads:
            thread.start()
        done.wait()
        if not killed:
            shards = {f"__{r}_0.distcp": SHARD_BYTES for r in range(RANKS)}
            self.client.put_object(Bucket=BUCKET, Key=f"{prefix}/.metadata",
                                   Body=self.metadata(shards))  # fmt: skip
        for thread in threads:
            thread.join()

    def _upload(self, key: str, die_after_first_part: bool) -> None:
        upload = self.client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
        parts, sent, number = [], 0, 1
        while sent < SHARD_BYTES:
            size = min(PART_BYTES, SHARD_BYTES - sent)
            answer = self.client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload,
                                             PartNumber=number, Body=b"\x5a" * size)  # fmt: skip
            parts.append({"ETag": answer["ETag"], "PartNumber": number})
            sent, number = sent + size, number + 1
            if die_after_first_part:
                return  # the upload stays open: the lifecycle rule aborts it
        self.client.complete_multipart_upload(
            Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
        )

    def _retain(self) -> None:
        """Keep the newest KEEP committed steps, as DCP's users do: delete the older ones."""
        keys = [item["Key"] for item in self._list(f"{NAME}/")]
        steps = sorted({int(k.split("/")[1].split("-")[1]) for k in keys if "/step-" in f"/{k}"})
        committed = [s for s in steps if f"{NAME}/step-{s}/.metadata" in keys]
        for step in committed[:-KEEP]:
            old = [{"Key": k} for k in keys if k.startswith(f"{NAME}/step-{step}/")]
            self.client.delete_objects(Bucket=BUCKET, Delete={"Objects": old})

    def _list(self, prefix: str) -> list[dict]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return [item for page in pages for item in page.get("Contents", ())]

    def _lifecycle(self) -> None:
        """Abort uploads left open longer than LIFECYCLE_SECONDS, dated by when first seen (the
        server's Initiated date is not to be trusted: moto's is 2010)."""
        seen: dict[str, float] = {}
        while not self.stop.wait(5.0):
            uploads = self.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", ())
            now = time.monotonic()
            for upload in uploads:
                first = seen.setdefault(upload["UploadId"], now)
                if now - first >= LIFECYCLE_SECONDS:
                    self.client.abort_multipart_upload(
                        Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"]
                    )


def _quietly(function: Any, *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # an injected fault
        function(*args)


def environment() -> dict[str, str]:
    """What the exporter and the drills need to reach the embedded server."""
    return {**os.environ, **ENV}
