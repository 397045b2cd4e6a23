"""S3 and S3-compatible stores through botocore: the ``ObjectStore`` the object reader lists.

The connection is the standard AWS environment, as every AWS tool reads it (AWS_ENDPOINT_URL,
AWS_REGION, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE, web
identity, instance roles), plus AWS_ALLOW_HTTP: a plain-HTTP endpoint is refused unless it is
set (or ``allow_http`` in the job's ``storage_options``), so a typo never sends signed requests
in the clear. Credentials stay in botocore: nothing here logs or exports them.

Every HTTP request botocore sends (retries included: each is billed) is counted by operation
through its ``request-created`` event; an answer that is an error is counted by its code.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from checkpoint_exporter.sources.object_store import (
    GET,
    HEAD,
    LIST,
    LIST_PARTS,
    LIST_UPLOADS,
    ObjectInfo,
    Page,
    RequestCounter,
    StoreError,
    Upload,
)

# botocore's operation names -> the metric's operation label.
_OPERATIONS = {
    "ListObjectsV2": LIST,
    "GetObject": GET,
    "HeadObject": HEAD,
    "HeadBucket": HEAD,
    "ListMultipartUploads": LIST_UPLOADS,
    "ListParts": LIST_PARTS,
}
CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 30.0
MAX_ATTEMPTS = 3  # botocore's standard retry mode backs off between them (throttling too)
PAGE_KEYS = 1000
MAX_PART_PAGES = 10  # S3's most parts an upload may have, 10,000, at 1,000 a page
# Connections a shared client keeps: one per worker (endpoint and bucket) reading through it.
MAX_POOL_CONNECTIONS = 32


def endpoint_url(options: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> str | None:
    return (
        options.get("endpoint_url")
        or environ.get("AWS_ENDPOINT_URL_S3")
        or environ.get("AWS_ENDPOINT_URL")
    )


def allows_http(options: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> bool:
    if "allow_http" in options:
        return bool(options["allow_http"])
    return environ.get("AWS_ALLOW_HTTP", "").strip().lower() in ("1", "true", "yes")


def store_key(bucket: str, options: Mapping[str, Any]) -> str:
    """What one worker thread serves: one endpoint and bucket (a slow store holds up only the
    jobs kept in it)."""
    return f"s3://{endpoint_url(options) or 'aws'}/{bucket}"


# One botocore client per endpoint, region and addressing style, shared by every bucket and job
# that names them: a client costs about 12 MiB and 0.2 s to make (its own copy of the S3 service
# model), so one per tier was 1.2 GiB at 100 jobs. Clients are thread-safe; the request they send
# is counted for the store whose call is running on that thread (``_calling``).
_clients: dict[tuple[str | None, str | None, str], Any] = {}
_clients_lock = threading.Lock()
_calling = threading.local()


def _client(endpoint: str | None, region: str | None, addressing_style: str) -> Any:
    key = (endpoint, region, addressing_style)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            import botocore.session
            from botocore.config import Config as BotoConfig

            config = BotoConfig(
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                read_timeout=READ_TIMEOUT_SECONDS,
                retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
                s3={"addressing_style": addressing_style},
                max_pool_connections=MAX_POOL_CONNECTIONS,
            )
            session = botocore.session.get_session()
            # Every listed key's LastModified is parsed: dateutil took three quarters of the
            # time botocore spent on a page (docs/performance.md, "Object storage").
            parsers = session.get_component("response_parser_factory")
            parsers.set_parser_defaults(timestamp_parser=_timestamp)
            client = session.create_client(
                "s3", endpoint_url=endpoint, region_name=region, config=config
            )
            client.meta.events.register("request-created.s3", _count)
            _clients[key] = client
        return client


def _timestamp(value: Any) -> datetime:
    """S3's ISO 8601 times (``2026-12-03T11:20:00.000Z``) by the standard library; anything else
    (an HTTP date in a header) by botocore's own parser."""
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed
    from botocore.parsers import DEFAULT_TIMESTAMP_PARSER

    result: datetime = DEFAULT_TIMESTAMP_PARSER(value)
    return result


def _count(operation_name: str = "", **_: Any) -> None:
    counter = getattr(_calling, "counter", None)
    if counter is not None:
        counter.request(_OPERATIONS.get(operation_name, operation_name.lower()))


class S3Store:
    """One bucket, read through the client its endpoint shares (from one worker thread)."""

    def __init__(self, bucket: str, options: Mapping[str, Any], counter: RequestCounter) -> None:
        endpoint = endpoint_url(options)
        self.bucket = bucket
        self.counter = counter
        region = options.get("region") or os.environ.get("AWS_REGION") or None
        self._client = _client(endpoint, region, options.get("addressing_style", "auto"))
        # The endpoint the client will use, wherever it came from (an option, the environment,
        # or ~/.aws/config's endpoint_url, which botocore reads on its own).
        used = str(self._client.meta.endpoint_url)
        if used.lower().startswith("http://") and not allows_http(options):
            raise StoreError(
                LIST, "http_refused",
                f"{used} is plain HTTP: set AWS_ALLOW_HTTP=true (or allow_http: true in "
                "storage_options) to allow it",
            )  # fmt: skip

    def _call(self, operation: str, method: str, **kwargs: Any) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        _calling.counter = self.counter
        try:
            return getattr(self._client, method)(Bucket=self.bucket, **kwargs)
        except ClientError as error:
            details = error.response.get("Error", {})
            code = str(details.get("Code") or error.response.get("ResponseMetadata", {}).get(
                "HTTPStatusCode", "error"))  # fmt: skip
            reason = str(details.get("Message") or code)
            self.counter.error(operation, code)
            raise StoreError(operation, code, f"{reason} (bucket {self.bucket})") from None
        except BotoCoreError as error:
            # Unreachable endpoint, timeouts, no credentials: the message names no secret.
            code = "unreachable" if "connect" in type(error).__name__.lower() else type(
                error).__name__  # fmt: skip
            self.counter.error(operation, code)
            raise StoreError(operation, code, str(error)) from None
        finally:
            _calling.counter = None

    def list_page(self, prefix: str, delimiter: str | None, token: str | None) -> Page:
        kwargs: dict[str, Any] = {"Prefix": prefix, "MaxKeys": PAGE_KEYS}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        if token:
            kwargs["ContinuationToken"] = token
        answer = self._call(LIST, "list_objects_v2", **kwargs)
        objects = tuple(
            ObjectInfo(
                item["Key"],
                int(item.get("Size", 0)),
                item["LastModified"].timestamp(),
                str(item.get("ETag", "")),
            )
            for item in answer.get("Contents", ())
        )
        prefixes = tuple(item["Prefix"] for item in answer.get("CommonPrefixes", ()))
        more = answer.get("IsTruncated") and answer.get("NextContinuationToken")
        return Page(objects, prefixes, answer["NextContinuationToken"] if more else None)

    def get_range(self, key: str, length: int) -> bytes:
        answer = self._call(GET, "get_object", Key=key, Range=f"bytes=0-{max(length, 1) - 1}")
        body = answer["Body"]
        try:
            return bytes(body.read(length))  # never more than asked, whatever the store sends
        finally:
            body.close()

    def list_uploads(
        self, prefix: str, marker: tuple[str, str] | None
    ) -> tuple[tuple[Upload, ...], tuple[str, str] | None]:
        kwargs: dict[str, Any] = {"Prefix": prefix, "MaxUploads": PAGE_KEYS}
        if marker is not None:
            kwargs["KeyMarker"], kwargs["UploadIdMarker"] = marker
        answer = self._call(LIST_UPLOADS, "list_multipart_uploads", **kwargs)
        uploads = tuple(Upload(item["Key"], item["UploadId"]) for item in answer.get("Uploads", ()))
        if answer.get("IsTruncated"):
            following = (answer.get("NextKeyMarker", ""), answer.get("NextUploadIdMarker", ""))
            return uploads, following
        return uploads, None

    def uploaded_bytes(self, upload: Upload) -> int | None:
        """Bytes of the parts uploaded so far: every page of them (an upload has at most 10,000
        parts, 1,000 a page; a 200 GB file in 50 MiB parts has 4,000)."""
        total, marker = 0, 0
        for _ in range(MAX_PART_PAGES):
            try:
                answer = self._call(
                    LIST_PARTS, "list_parts", Key=upload.key, UploadId=upload.upload_id,
                    MaxParts=PAGE_KEYS, PartNumberMarker=marker,
                )  # fmt: skip
            except StoreError as error:
                if error.code == "NoSuchUpload":  # completed or aborted since it was listed
                    return None
                raise
            total += sum(int(part.get("Size", 0)) for part in answer.get("Parts", ()))
            following = int(answer.get("NextPartNumberMarker") or 0)
            if not answer.get("IsTruncated") or following <= marker:
                break
            marker = following
        return total
