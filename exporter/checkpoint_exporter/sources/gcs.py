"""Google Cloud Storage through its JSON API: the ``ObjectStore`` the object reader lists.

Requests are made with urllib3 (one pool per bucket, timeouts, no redirects) and signed with
google-auth's credentials as every Google tool finds them (GOOGLE_APPLICATION_CREDENTIALS,
workload identity, the metadata server, gcloud's application default), with the read-only
scope: the exporter never needs more. ``STORAGE_EMULATOR_HOST`` points it at an emulator as it
points Google's SDKs and gcsfs: no credentials are sent then, and plain HTTP is accepted (an
emulator speaks nothing else, and no token can leak from a request that carries none). A
``storage_options.endpoint_url`` (a private endpoint) is sent credentials, so plain HTTP is
refused there unless ``allow_http`` says otherwise.

Every HTTP attempt is counted by operation (retries are billed too); a call that failed is
counted once by GCS's reason code (notFound, forbidden, rateLimitExceeded) or ``unreachable``.
Throttling (429) and transient errors (408, 5xx, connection errors) are tried again, at most
``MAX_ATTEMPTS`` times, after a pause of full jitter doubling from ``BACKOFF_BASE_SECONDS``, as
botocore's standard retry mode does for S3.

A save in progress on GCS is its objects without the commit marker, nothing more: an object
appears only once its upload is finalized, and resumable upload sessions (gcsfs sends every
file larger than its block size as one) cannot be listed by any API. So ``list_uploads``
returns nothing and makes no request, and a save killed mid-upload shows the objects it had
finished (none at all if it was killed before it finished a file), and its session expires
unseen after a week.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import urllib.parse
from calendar import timegm
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from checkpoint_exporter.sources.object_store import (
    GET,
    LIST,
    ObjectInfo,
    Page,
    RequestCounter,
    StoreError,
    Upload,
)

READ_ONLY_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 30.0
MAX_ATTEMPTS = 3
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 20.0
PAGE_KEYS = 1000
# A listing page of 1,000 names is a few hundred KiB; a store answering more is not read.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
MAX_REASON_CHARS = 300
ERROR_ANSWER_BYTES = 64 * 1024
RETRIED_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
LIST_FIELDS = "items(name,size,updated,generation),prefixes,nextPageToken"
# GCS's reason codes by status, for an answer without a JSON error (emulators, proxies).
_REASONS = {
    400: "badRequest",
    401: "authError",
    403: "forbidden",
    404: "notFound",
    408: "requestTimeout",
    429: "rateLimitExceeded",
    500: "backendError",
    502: "backendError",
    503: "backendError",
    504: "backendError",
}


def emulator_host(environ: Mapping[str, str] = os.environ) -> str | None:
    """STORAGE_EMULATOR_HOST as Google's SDKs read it: ``host:port`` means plain HTTP."""
    host = environ.get("STORAGE_EMULATOR_HOST", "").strip().rstrip("/")
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


def endpoint_of(options: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> str:
    """The job's own endpoint first, then the emulator, then Google's."""
    return str(options.get("endpoint_url") or emulator_host(environ) or DEFAULT_ENDPOINT).rstrip(
        "/"
    )


def store_key(bucket: str, options: Mapping[str, Any]) -> str:
    """What one worker thread serves: one endpoint and bucket (a slow store holds up only the
    jobs kept in it)."""
    return f"gs://{endpoint_of(options)}/{bucket}"


def parse_time(value: str) -> float:
    """An RFC 3339 time as GCS writes it (``2026-01-02T03:04:05.678Z``) in seconds; 0 if it is
    not one (a hostile or broken store: the object is still listed)."""
    found = re.fullmatch(
        r"(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(\.\d+)?([Zz]|[+-]\d\d:\d\d)", value or ""
    )
    if found is None:
        return 0.0
    year, month, day, hour, minute, second = (int(part) for part in found.groups()[:6])
    fraction, zone = found.group(7), found.group(8)
    try:
        seconds = timegm((year, month, day, hour, minute, second, 0, 0, 0))
    except (ValueError, OverflowError):
        return 0.0
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return seconds + (float(fraction) if fraction else 0.0)


class GCSStore:
    """One bucket, one urllib3 pool (used from one worker thread)."""

    lists_uploads = False  # resumable upload sessions are not listable: none is asked for

    def __init__(
        self,
        bucket: str,
        options: Mapping[str, Any],
        counter: RequestCounter,
        environ: Mapping[str, str] = os.environ,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        import urllib3

        self.endpoint = endpoint_of(options, environ)
        # Only the emulator named by the environment is spoken to without credentials.
        self.anonymous = not options.get("endpoint_url") and emulator_host(environ) is not None
        plain = self.endpoint.lower().startswith("http://")
        if plain and not self.anonymous and not options.get("allow_http"):
            raise StoreError(
                LIST, "http_refused",
                f"{self.endpoint} is plain HTTP and would be sent credentials: set "
                "allow_http: true in storage_options to allow it",
            )  # fmt: skip
        self.bucket = bucket
        self.counter = counter
        self._sleep = sleep
        self._pool = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT_SECONDS, read=READ_TIMEOUT_SECONDS),
            retries=False,  # each attempt is counted and backed off here
            headers={"User-Agent": "checkpoint-exporter"},
        )
        self._credentials: Any = None
        self._auth_request: Any = None

    # --- the ObjectStore protocol ---------------------------------------------------------------

    def list_page(self, prefix: str, delimiter: str | None, token: str | None) -> Page:
        query = {"prefix": prefix, "maxResults": str(PAGE_KEYS), "fields": LIST_FIELDS}
        if delimiter:
            query["delimiter"] = delimiter
        if token:
            query["pageToken"] = token
        path = f"/storage/v1/b/{_quote(self.bucket)}/o?{urllib.parse.urlencode(query)}"
        body = self._call(LIST, path, {}, MAX_ANSWER_BYTES, whole=True)
        try:
            answer = json.loads(body)
            objects = tuple(_object_info(item) for item in answer.get("items") or ())
            prefixes = tuple(str(item) for item in answer.get("prefixes") or ())
            following = answer.get("nextPageToken") or None
        except (ValueError, TypeError, AttributeError, KeyError):
            self.counter.error(LIST, "bad_answer")
            raise StoreError(LIST, "bad_answer", f"not a listing (bucket {self.bucket})") from None
        return Page(objects, prefixes, str(following) if following else None)

    def get_range(self, key: str, length: int) -> bytes:
        path = f"/storage/v1/b/{_quote(self.bucket)}/o/{_quote(key)}?alt=media"
        return self._call(GET, path, {"Range": f"bytes=0-{max(length, 1) - 1}"}, length)

    def list_uploads(
        self, prefix: str, marker: tuple[str, str] | None
    ) -> tuple[tuple[Upload, ...], tuple[str, str] | None]:
        """None, and no request: GCS lists no resumable upload session (module docstring)."""
        return (), None

    def uploaded_bytes(self, upload: Upload) -> int | None:
        return None

    # --- requests ----------------------------------------------------------------------------

    def _call(
        self, operation: str, path: str, headers: dict[str, str], limit: int, whole: bool = False
    ) -> bytes:
        """One call: at most ``MAX_ATTEMPTS`` requests, each counted; the answer's first
        ``limit`` bytes (``whole``: an answer longer than that is an error), or a StoreError
        counted by its code."""
        url = f"{self.endpoint}{path}"
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                signed = self._signed(operation, url, headers)
            except StoreError as error:
                self.counter.error(operation, error.code)
                raise
            self.counter.request(operation)
            answer = self._attempt(url, signed, limit, whole)
            if answer.failure is None and answer.status < 300:
                return answer.body
            code, reason = answer.failure or _error_of(answer.status, answer.body)
            if not answer.retried or attempt == MAX_ATTEMPTS:
                self.counter.error(operation, code)
                raise StoreError(operation, code, f"{self._scrub(reason)} (bucket {self.bucket})")
            ceiling = min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (attempt - 1))
            self._sleep(random.uniform(0, ceiling))
        raise AssertionError("unreachable")  # pragma: no cover

    def _attempt(self, url: str, headers: dict[str, str], limit: int, whole: bool) -> _Answer:
        import urllib3

        try:
            response = self._pool.request(
                "GET", url, headers=headers, preload_content=False, redirect=False
            )
        except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError):
            return _Answer.failed("unreachable", f"cannot connect to {self.endpoint}")
        except urllib3.exceptions.HTTPError as error:  # read timeouts, resets, TLS
            return _Answer.failed(_failure_code(error), f"{type(error).__name__}: {self.endpoint}")
        ok = response.status < 300
        # Never more than asked (one byte more to tell an answer too long); errors are read
        # only for their reason.
        wanted = (limit + 1 if whole else limit) if ok else ERROR_ANSWER_BYTES
        try:
            body = bytes(response.read(wanted))
            if len(body) < wanted or response.length_remaining == 0:
                response.drain_conn()  # at its end: the connection goes back to the pool
                response.release_conn()
            else:
                response.close()  # more than asked is never read: the connection is dropped
        except urllib3.exceptions.HTTPError as error:
            response.close()
            return _Answer.failed(_failure_code(error), f"{type(error).__name__}: {self.endpoint}")
        if ok and whole and len(body) > limit:
            return _Answer.failed("too_large", f"an answer over {limit} bytes", retried=False)
        return _Answer(response.status, body, None, response.status in RETRIED_STATUSES)

    def _signed(self, operation: str, url: str, headers: dict[str, str]) -> dict[str, str]:
        """``headers`` with the bearer token (refreshed when due); the emulator gets none."""
        if self.anonymous:
            return headers
        import google.auth
        import google.auth.exceptions
        from google.auth.transport.urllib3 import Request

        try:
            if self._credentials is None:  # found on the first request, then kept
                self._credentials, _ = google.auth.default(scopes=[READ_ONLY_SCOPE])
                self._auth_request = Request(self._pool)
            signed = dict(headers)
            self._credentials.before_request(self._auth_request, "GET", url, signed)
        except google.auth.exceptions.DefaultCredentialsError:
            raise StoreError(
                operation, "no_credentials",
                "no Google credentials found (GOOGLE_APPLICATION_CREDENTIALS, workload "
                "identity or the metadata server)",
            ) from None  # fmt: skip
        except google.auth.exceptions.GoogleAuthError as error:
            # A refresh refused or not answered: its message is the token endpoint's, not ours.
            raise StoreError(
                operation, "unauthenticated", f"credentials not refreshed: {type(error).__name__}"
            ) from None
        return signed

    def _scrub(self, text: str) -> str:
        """A store's words, bounded, and never the token (a hostile endpoint may echo it)."""
        token = getattr(self._credentials, "token", None)
        if token:
            text = text.replace(str(token), "[token]")
        return text[:MAX_REASON_CHARS]


@dataclass(frozen=True)
class _Answer:
    """What one attempt got: a status and body, or a failure (code, reason) with no answer."""

    status: int
    body: bytes
    failure: tuple[str, str] | None
    retried: bool  # worth another attempt

    @staticmethod
    def failed(code: str, reason: str, retried: bool = True) -> _Answer:
        return _Answer(0, b"", (code, reason), retried)


def _failure_code(error: Exception) -> str:
    return "timeout" if "timeout" in type(error).__name__.lower() else "unreachable"


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _object_info(item: Mapping[str, Any]) -> ObjectInfo:
    # The generation changes with every write of a name: it versions a marker's contents.
    return ObjectInfo(
        str(item["name"]),
        int(item.get("size") or 0),
        parse_time(str(item.get("updated") or "")),
        str(item.get("generation") or ""),
    )


def _error_of(status: int, body: bytes) -> tuple[str, str]:
    """GCS's reason code and message of an error answer (``{"error": {"errors": [{"reason"}],
    "message"}}``), or the reason its status stands for."""
    code = _REASONS.get(status, f"http_{status}")
    message = f"HTTP {status}"
    try:
        error = json.loads(body)["error"]
        message = str(error.get("message") or message)
        code = str(error["errors"][0]["reason"]) or code
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        pass
    return code, message
