"""What an object store holds, read with the test's own client: the writers tier's truth for jobs
on ``s3://`` (botocore, against moto), ``gs://`` (the JSON API, against gcp-storage-emulator) and
``az://`` (azure-storage-blob, against Azurite), never what the exporter's layouts think.

Every store answers the same four questions of a URL: ``objects`` (what is there: by key, its
size and version), ``bytes_of`` and ``exists`` (the harness's ``Truth``), and ``uploads`` (the
saves still being written that the store lists: by key, the bytes sent so far). A URL names an
object (a Lightning ``.ckpt``) or a folder (a DCP step): it holds the object at its key and every
object under ``key/``. What only one store has (S3's ETag part counts, Azure's block lists, a
GCS object's content) stays on that store's class.
"""

from __future__ import annotations

import contextlib
import json
import urllib.parse
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tests.helpers.azurite import Azurite, azurite
from tests.helpers.gcs_emulator import GCSEmulator, gcs_emulator
from tests.helpers.moto_s3 import MotoServer, moto_server
from tests.writers.harness import JOB, Driver, Expected, Scenario, Truth, Watched

BUCKET = "ckpt"  # the bucket (on Azure, the container) every writers test saves into
PREFIX = "job"  # the job's folder in it
INCOMPLETE = "checkpoint_object_store_incomplete_uploads"
INCOMPLETE_BYTES = "checkpoint_object_store_incomplete_upload_bytes"


@dataclass(frozen=True)
class Stored:
    """One object as the store lists it: a rewrite changes its version (ETag, modification)."""

    size: int
    etag: str
    modified: str


class ObjectStore(ABC):
    """One bucket of one store; what differs between stores is how it is listed."""

    scheme: str

    @abstractmethod
    def env(self) -> dict[str, str]:
        """The environment that points a client (the writer's, the exporter's) at the server."""

    @abstractmethod
    def listing(self, prefix: str) -> dict[str, Stored]:
        """Every object whose key starts with ``prefix`` (all pages)."""

    @abstractmethod
    def uploads(self, url: str) -> dict[str, int]:
        """The unfinished uploads the store lists under ``url``: bytes sent so far, by key."""

    def url(self, *names: str) -> str:
        return "/".join((f"{self.scheme}://{BUCKET}", *names))

    def key(self, url: str, *names: str) -> str:
        """The key ``url`` names in the bucket, or of ``names`` under it."""
        path = url.removeprefix(f"{self.scheme}://{BUCKET}").strip("/")
        return "/".join(part for part in (path, *names) if part)

    def objects(self, url: str) -> dict[str, Stored]:
        key = self.key(url)
        return {name: item for name, item in self.listing(key).items() if within(key, name)}

    def bytes_of(self, url: str) -> int:
        return sum(item.size for item in self.objects(url).values())

    def exists(self, url: str) -> bool:
        return bool(self.objects(url))

    def truth(self) -> Truth:
        return Truth(bytes_of=self.bytes_of, exists=self.exists)


def within(key: str, name: str) -> bool:
    """Whether ``name`` is the object ``key`` or under it (``key/``); the empty key: anything."""
    return not key or name == key or name.startswith(key + "/")


@dataclass(frozen=True)
class S3Bucket(ObjectStore):
    server: MotoServer
    client: Any  # botocore's S3 client
    scheme = "s3"

    def env(self) -> dict[str, str]:
        return self.server.env()

    def listing(self, prefix: str) -> dict[str, Stored]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return {
            item["Key"]: Stored(item["Size"], item["ETag"], item["LastModified"].isoformat())
            for page in pages
            for item in page.get("Contents", ())
        }

    def uploads(self, url: str) -> dict[str, int]:
        """The open multipart uploads: bytes of their parts, by key."""
        return {
            upload["Key"]: sum(part["Size"] for part in self._parts(upload))
            for upload in self._open_uploads(url)
        }

    def abort_uploads(self, url: str) -> list[str]:
        """Abort the open uploads under ``url`` (as a lifecycle rule would); their keys."""
        aborted = []
        for upload in self._open_uploads(url):
            self.client.abort_multipart_upload(
                Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"]
            )
            aborted.append(upload["Key"])
        return aborted

    def _open_uploads(self, url: str) -> list[dict]:
        key = self.key(url)
        answer = self.client.list_multipart_uploads(Bucket=BUCKET, Prefix=key)
        return [upload for upload in answer.get("Uploads", ()) if within(key, upload["Key"])]

    def _parts(self, upload: dict) -> list[dict]:
        answer = self.client.list_parts(
            Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"]
        )
        return list(answer.get("Parts", ()))


@dataclass(frozen=True)
class GCSBucket(ObjectStore):
    server: GCSEmulator
    scheme = "gs"

    def env(self) -> dict[str, str]:
        return self.server.env()

    def listing(self, prefix: str) -> dict[str, Stored]:
        found: dict[str, Stored] = {}
        token = ""
        while True:
            query = {"prefix": prefix, **({"pageToken": token} if token else {})}
            page = json.loads(
                self._get(f"/storage/v1/b/{BUCKET}/o?{urllib.parse.urlencode(query)}")
            )
            for item in page.get("items") or ():
                found[item["name"]] = Stored(int(item["size"]), item["etag"], item["updated"])
            token = page.get("nextPageToken", "")
            if not token:
                return found

    def uploads(self, url: str) -> dict[str, int]:
        """None: a resumable upload session is in no listing (GCS has no API that lists them),
        so an unfinished upload is never seen, only the files a save finished."""
        return {}

    def content(self, key: str) -> bytes:
        return self._get(
            f"/download/storage/v1/b/{BUCKET}/o/{urllib.parse.quote(key, safe='')}?alt=media"
        )

    def delete(self, key: str) -> None:
        self.server.delete(BUCKET, key)

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"{self.server.endpoint}{path}", timeout=10) as answer:
            return bytes(answer.read())


@dataclass(frozen=True)
class AzureContainer(ObjectStore):
    server: Azurite
    client: Any  # azure-storage-blob's ContainerClient
    scheme = "az"

    def env(self) -> dict[str, str]:
        return self.server.env()

    def listing(self, prefix: str) -> dict[str, Stored]:
        """The committed blobs (a blob of uncommitted blocks only is no object yet)."""
        return {
            blob.name: Stored(blob.size, blob.etag, blob.last_modified.isoformat())
            for blob in self.client.list_blobs(prefix)
        }

    def uploads(self, url: str) -> dict[str, int]:
        """The uncommitted blocks (staged, no block list committed): their bytes, by blob."""
        key = self.key(url)
        found = {}
        for blob in self.client.list_blobs(key, include=["uncommittedblobs"]):
            if not within(key, blob.name):
                continue
            _, blocks = self.client.get_blob_client(blob.name).get_block_list("uncommitted")
            if blocks:
                found[blob.name] = sum(block.size for block in blocks)
        return found

    def committed_blocks(self, key: str) -> list[Any]:
        blocks, _ = self.client.get_blob_client(key).get_block_list("committed")
        return list(blocks)

    def delete(self, key: str) -> None:
        self.client.delete_blob(key)


@contextlib.contextmanager
def s3_bucket() -> Iterator[S3Bucket]:
    with moto_server() as server:
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        yield S3Bucket(server, client)


@contextlib.contextmanager
def gcs_bucket() -> Iterator[GCSBucket]:
    with gcs_emulator() as server:
        server.create_bucket(BUCKET)
        yield GCSBucket(server)


@contextlib.contextmanager
def azure_container() -> Iterator[AzureContainer]:
    with azurite() as server:
        yield AzureContainer(server, server.service().create_container(BUCKET))


@contextlib.contextmanager
def watching_store(
    store: ObjectStore,
    tmp_path: Path,
    writer: str,
    venv: str,
    *driver_args: str,
    driver_env: dict[str, str] | None = None,
    **watched: str,
) -> Iterator[tuple[Driver, Watched]]:
    """A real exporter polling ``SCHEME://ckpt/job`` (object storage has no other watch mode)
    with the store as its truth, and the writer's driver saving there; both stopped on the way
    out (the job's URL: ``store.url(PREFIX)``). ``driver_env``: the writer's environment, when it
    needs more than ``store.env()``."""
    root = store.url(PREFIX)
    exporter = Watched(
        root, tmp_path, watch="poll", env=store.env(), truth=store.truth(), **watched
    )
    try:
        driver = Driver(writer, venv, root, *driver_args, env=driver_env or store.env())
        try:
            yield driver, exporter
        finally:
            driver.close()
    finally:
        exporter.close()


def expect_one_abort(
    scenario: Scenario,
    settled: Expected,
    extra: dict[str, float] | None = None,
    hold_in_flight: float = 0.0,
) -> Expected:
    """After the save killed half-way, the exporter's figures (``extra``: the store's upload
    figures meanwhile, else ``settled``'s): a save in progress before abort_after (10 s from
    when the exporter first saw it); then, nothing having moved for abort_after, exactly one
    abort, logged, the newest generation kept. Returns what the exporter says once aborted."""
    watched = scenario.watched
    extra = settled.extra if extra is None else extra
    watched.expect(replace(settled, in_progress=1, extra=extra), timeout=5, hold=hold_in_flight)
    aborted = replace(settled, aborted=1, extra=extra)
    watched.expect(aborted, timeout=scenario.deadline + scenario.settle + 20, hold=3)
    lines = watched.log_lines("aborted")
    assert any(f"job={JOB}" in line for line in lines), lines
    return aborted


def four_saves(
    scenario: Scenario, store: ObjectStore, extra: dict[str, float] | None = None
) -> tuple[list[dict], Expected]:
    """Four saves, the oldest deleted by the writer's retention (keep 3), the figures equal to
    the store's after each, then a quiet spell past the deadline (``Scenario.run``); then the
    exporter settled on the newest: three kept, four commits, ``extra`` (other families). The
    saves as reported, and that settled expectation."""
    reported = scenario.run(kill=False)
    assert [store.exists(line["path"]) for line in reported] == [False, True, True, True]
    newest = reported[-1]
    settled = Expected(
        step=newest["step"], retained=3, newest_path=newest["path"], committed=4,
        layout=scenario.layout, extra=extra or {},
    )  # fmt: skip
    scenario.watched.expect(settled)
    return reported, settled
