"""What the object tree reader asks of a store, one request a call (``ObjectStore``), and the
vocabulary the stores answer in: listed objects and pages, uploads in flight, a store's refusal
(``StoreError``) by its own code, and the requests counted by operation. sources/s3.py,
sources/gcs.py and sources/azure.py implement it; sources/objects.py reads through it."""

from __future__ import annotations

import re
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

# Error codes that mean the bucket or container (or the right to read it) is gone, so nothing
# listed before stands; and those that mean an object was deleted since it was listed.
STORE_GONE_CODES = frozenset({
    "NoSuchBucket", "AccessDenied", "InvalidAccessKeyId",  # S3
    "notFound", "forbidden",  # GCS
    "ContainerNotFound", "AuthenticationFailed", "AuthorizationFailure",  # Azure
    "AuthorizationPermissionMismatch", "InvalidAuthenticationInfo",
})  # fmt: skip
OBJECT_GONE_CODES = frozenset({"NoSuchKey", "notFound", "BlobNotFound"})
# A request refused for want of a permission: on the uploads in flight (a policy without
# s3:ListBucketMultipartUploads or s3:ListMultipartUploadParts), only they go unseen.
DENIED_CODES = frozenset({"AccessDenied", "AuthorizationPermissionMismatch", "forbidden"})

# Distinct error codes one job's counter labels, each a short word (the rest: "other").
MAX_ERROR_CODES = 20
_ERROR_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_.]{0,47}")

# Operation labels of checkpoint_object_store_requests_total (object stores bill by request).
LIST, GET, HEAD, LIST_UPLOADS, LIST_PARTS = "list", "get", "head", "list_uploads", "list_parts"


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float  # the store's LastModified
    etag: str = ""


@dataclass(frozen=True)
class Page:
    objects: tuple[ObjectInfo, ...]
    prefixes: tuple[str, ...]  # common prefixes (with a delimiter), each ending in "/"
    token: str | None  # the next page's continuation token; None: the last page


@dataclass(frozen=True)
class Upload:
    key: str
    upload_id: str


class StoreError(Exception):
    """A request the store refused or never answered: ``code`` as the store names it
    (NoSuchBucket, AccessDenied, SlowDown) or ``unreachable``; ``reason`` for people."""

    def __init__(self, operation: str, code: str, reason: str) -> None:
        super().__init__(f"{operation}: {code}: {reason}")
        self.operation, self.code, self.reason = operation, code, reason


class ObjectStore(Protocol):
    """What the reader asks of a store: one request per call."""

    def list_page(self, prefix: str, delimiter: str | None, token: str | None) -> Page: ...

    def get_range(self, key: str, length: int) -> bytes: ...

    def list_uploads(
        self, prefix: str, marker: tuple[str, str] | None
    ) -> tuple[tuple[Upload, ...], tuple[str, str] | None]: ...

    def uploaded_bytes(self, upload: Upload) -> int | None: ...


class RefusedStore:
    """A store that could not be made (its extra not installed, plain HTTP refused, no account
    named): every request fails with the reason, so the job reports it on every read like any
    other store error."""

    def __init__(self, error: StoreError) -> None:
        self.error = error

    def list_page(self, prefix: str, delimiter: str | None, token: str | None) -> Page:
        raise self.error

    def get_range(self, key: str, length: int) -> bytes:
        raise self.error

    def list_uploads(
        self, prefix: str, marker: tuple[str, str] | None
    ) -> tuple[tuple[Upload, ...], tuple[str, str] | None]:
        raise self.error

    def uploaded_bytes(self, upload: Upload) -> int | None:
        raise self.error


class RequestCounter:
    """Requests made and failed, by operation (and code): counted by the store's client on the
    worker, read by the core at publish."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[str] = Counter()
        self._errors: Counter[tuple[str, str]] = Counter()

    def request(self, operation: str) -> None:
        with self._lock:
            self._requests[operation] += 1

    def error(self, operation: str, code: str) -> None:
        """The ``code`` label is what a store answered: a hostile or odd endpoint could make a
        series of every answer, so it is a short word, and past MAX_ERROR_CODES codes "other"."""
        with self._lock:
            known = {seen for _, seen in self._errors}
            if not _ERROR_CODE.fullmatch(code) or (
                code not in known and len(known) >= MAX_ERROR_CODES
            ):
                code = "other"
            self._errors[operation, code] += 1

    def totals(self) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, str, int], ...]]:
        with self._lock:
            return (
                tuple(sorted(self._requests.items())),
                tuple(sorted((op, code, n) for (op, code), n in self._errors.items())),
            )
