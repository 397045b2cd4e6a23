"""Azure Blob Storage through azure-storage-blob: the ``ObjectStore`` the object reader lists.

``az://container/prefix``. The account is ``account_name`` in the job's ``storage_options``, else
AZURE_STORAGE_ACCOUNT_NAME, else the connection string's AccountName. The endpoint is
``endpoint_url`` in ``storage_options``, else the connection string's BlobEndpoint (or its
protocol, account and EndpointSuffix), else ``https://ACCOUNT.blob.core.windows.net``.
Credentials come from the environment only, the first found of:
AZURE_STORAGE_CONNECTION_STRING (AccountKey or SharedAccessSignature), AZURE_STORAGE_KEY or
AZURE_STORAGE_ACCOUNT_KEY (with the account), AZURE_STORAGE_SAS_TOKEN, else azure-identity's
DefaultAzureCredential (workload identity, managed identity, az login).

Plain HTTP is refused unless ``allow_http: true`` is in ``storage_options`` or the connection
string itself names an http endpoint (Azurite's): the connection string is the secret and who
wrote it chose its transport, while an ``endpoint_url`` from a shared config file could be a
typo that would send a SAS token (a query parameter) in the clear.

A save in progress on Azure is *uncommitted blocks*: a blob staged with Put Block and not yet
made by Put Block List is invisible to a plain listing. ``list_uploads`` lists the prefix with
``include=uncommittedblobs`` and keeps the blobs that are uncommitted: the service lists those with
Content-Length 0 and no Content-Type, where every committed blob has a Content-Type (Put Blob and
Put Block List default it to application/octet-stream), as Azurite does after the service.
``uploaded_bytes`` is the sum of its uncommitted blocks (Get Block List). A blob being rewritten
over a committed one has both, and the listing shows only the committed blob: that rewrite is not
seen (finding it would cost a Get Block List per listed blob per read); checkpoint writers save
each generation under a new name. The service drops uncommitted blocks after a week by itself.

Every HTTP attempt (retries included: each is billed) is counted by operation from the request
itself, in a hook the SDK calls per attempt; an answer that is an error is counted by Azure's
error code. Nothing here logs or exports a key or a SAS token, and the loggers of the SDK and of
urllib3 (which print every request's URL, SAS included, and headers at INFO and DEBUG) are held
at WARNING.
"""

from __future__ import annotations

import logging
import os
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

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

CONNECT_TIMEOUT_SECONDS = 5
READ_TIMEOUT_SECONDS = 30
MAX_ATTEMPTS = 3  # the first and two retries (the SDK's default is 11, 15 s apart and more)
# The retries' pauses: the first's seconds, the base of the growth (1 s, then 1 + 2 s), jitter.
RETRY_BACKOFF = (1.0, 2, 1.0)
PAGE_KEYS = 1000
PUBLIC_SUFFIX = "core.windows.net"

T = TypeVar("T")


def connection_settings(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """AZURE_STORAGE_CONNECTION_STRING as its ``Key=value`` settings (keys upper-cased)."""
    text = environ.get("AZURE_STORAGE_CONNECTION_STRING", "").strip().rstrip(";")
    settings: dict[str, str] = {}
    for part in filter(None, text.split(";")):
        key, separator, value = part.partition("=")
        if not separator:
            # Never echo the string: it holds the key.
            raise StoreError(LIST, "bad_connection_string", "AZURE_STORAGE_CONNECTION_STRING "
                             "is not a list of Key=value settings")  # fmt: skip
        settings[key.strip().upper()] = value.strip()
    return settings


def account_name(options: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> str:
    return str(
        options.get("account_name")
        or environ.get("AZURE_STORAGE_ACCOUNT_NAME")
        or _settings_or_empty(environ).get("ACCOUNTNAME")
        or ""
    )


def endpoint_url(options: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> str:
    """The account's blob endpoint, without any query (a SAS never rides in it); "" when no
    account is named anywhere."""
    settings = _settings_or_empty(environ)
    account = account_name(options, environ)
    endpoint = options.get("endpoint_url") or settings.get("BLOBENDPOINT")
    if not endpoint and account:
        protocol = settings.get("DEFAULTENDPOINTSPROTOCOL", "https")
        suffix = settings.get("ENDPOINTSUFFIX", PUBLIC_SUFFIX)
        endpoint = f"{protocol}://{account}.blob.{suffix}"
    if not endpoint:
        return ""
    parts = urllib.parse.urlsplit(str(endpoint))
    host = parts.netloc.rpartition("@")[2]  # no user:password either
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


def allows_http(options: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> bool:
    """Plain HTTP: asked for in ``storage_options``, or named by the connection string itself."""
    if "allow_http" in options:
        return bool(options["allow_http"])
    if options.get("endpoint_url"):
        return False  # the config file's endpoint: only its own allow_http allows http
    settings = _settings_or_empty(environ)
    return settings.get("BLOBENDPOINT", "").lower().startswith("http://") or (
        not settings.get("BLOBENDPOINT") and settings.get("DEFAULTENDPOINTSPROTOCOL") == "http"
    )


def store_key(
    bucket: str, options: Mapping[str, Any], environ: Mapping[str, str] = os.environ
) -> str:
    """What one worker thread serves: one endpoint (the account) and container."""
    return f"az://{endpoint_url(options, environ) or 'azure'}/{bucket}"


def _settings_or_empty(environ: Mapping[str, str]) -> dict[str, str]:
    try:
        return connection_settings(environ)
    except StoreError:
        return {}  # reported when the store is made


@dataclass(frozen=True)
class Connection:
    endpoint: str
    credential: Any = field(repr=False)  # a key or a token: never printed
    source: str  # which environment variable it came from, for the log


def connect(options: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Connection:
    """Where and as whom to connect; StoreError says what is missing (never a secret)."""
    from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

    settings = connection_settings(environ)
    account = account_name(options, environ)
    endpoint = endpoint_url(options, environ)
    if not endpoint:
        raise StoreError(LIST, "no_account", "no storage account: set account_name in "
                         "storage_options, AZURE_STORAGE_ACCOUNT_NAME or "
                         "AZURE_STORAGE_CONNECTION_STRING")  # fmt: skip
    if endpoint.lower().startswith("http://") and not allows_http(options, environ):
        raise StoreError(LIST, "http_refused", f"{endpoint} is plain HTTP: set allow_http: true "
                         "in storage_options to allow it")  # fmt: skip
    credential: Any
    if settings.get("ACCOUNTKEY") and (settings.get("ACCOUNTNAME") or account):
        name = settings.get("ACCOUNTNAME") or account
        credential = AzureNamedKeyCredential(name, settings["ACCOUNTKEY"])
        source = "AZURE_STORAGE_CONNECTION_STRING"
    elif settings.get("SHAREDACCESSSIGNATURE"):
        credential = AzureSasCredential(settings["SHAREDACCESSSIGNATURE"].lstrip("?"))
        source = "AZURE_STORAGE_CONNECTION_STRING"
    elif _account_key(environ) and account:
        source = "AZURE_STORAGE_KEY" if environ.get("AZURE_STORAGE_KEY") else (
            "AZURE_STORAGE_ACCOUNT_KEY")  # fmt: skip
        credential = AzureNamedKeyCredential(account, _account_key(environ))
    elif environ.get("AZURE_STORAGE_SAS_TOKEN"):
        credential = AzureSasCredential(environ["AZURE_STORAGE_SAS_TOKEN"].lstrip("?"))
        source = "AZURE_STORAGE_SAS_TOKEN"
    else:
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError:
            raise StoreError(LIST, "no_credentials", "no AZURE_STORAGE_* credentials and "
                             "azure-identity is not installed") from None  # fmt: skip
        credential = DefaultAzureCredential()
        source = "DefaultAzureCredential"
    return Connection(endpoint, credential, source)


def _account_key(environ: Mapping[str, str]) -> str:
    """The account key: AZURE_STORAGE_KEY as the az CLI names it, or AZURE_STORAGE_ACCOUNT_KEY
    as adlfs and obstore do."""
    return environ.get("AZURE_STORAGE_KEY") or environ.get("AZURE_STORAGE_ACCOUNT_KEY") or ""


# A URL's query (where a SAS token rides) or a key=value secret, wherever a message repeats one.
_SECRETS = re.compile(r"\?[^\s'\"]*|(AccountKey|SharedAccessSignature|sig)=[^;&\s'\"]*", re.I)


def redact(text: str) -> str:
    return _SECRETS.sub(lambda m: "?..." if m.group(0).startswith("?") else f"{m.group(1)}=...",
                        text)  # fmt: skip


def operation_of(method: str, url: str) -> str:
    """The metric's operation label of one HTTP request to the Blob service."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    comp = query.get("comp", [""])[0]
    if comp == "list":
        include = ",".join(query.get("include", [])).lower()
        return LIST_UPLOADS if "uncommittedblobs" in include else LIST
    if comp == "blocklist":
        return LIST_PARTS
    if method == "GET" and not comp:
        return GET
    if method == "HEAD":
        return HEAD
    return method.lower()


def _quiet_sdk_loggers() -> None:
    """azure-core logs every request's URL and headers at INFO, the storage SDK at DEBUG, and
    urllib3 each request line at DEBUG: a SAS token is the URL's query, which urllib3 prints as
    it is. None of those lines is the exporter's to print, at any --log.level."""
    for name in ("azure", "urllib3"):
        logger = logging.getLogger(name)
        if logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


def _uncommitted(item: Any) -> bool:
    """A blob of uncommitted blocks only, as ``include=uncommittedblobs`` lists it."""
    settings = getattr(item, "content_settings", None)
    return not item.size and not getattr(settings, "content_type", None)


class AzureStore:
    """One container, one ContainerClient (used from one worker thread)."""

    def __init__(
        self,
        container: str,
        options: Mapping[str, Any],
        counter: RequestCounter,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        from azure.storage.blob import ContainerClient, ExponentialRetry

        _quiet_sdk_loggers()
        connection = connect(options, environ)
        self.container = container
        self.counter = counter
        self._client = ContainerClient(
            connection.endpoint,
            container,
            credential=connection.credential,
            connection_timeout=CONNECT_TIMEOUT_SECONDS,
            read_timeout=READ_TIMEOUT_SECONDS,
            retry_policy=ExponentialRetry(
                initial_backoff=RETRY_BACKOFF[0], increment_base=RETRY_BACKOFF[1],
                random_jitter_range=RETRY_BACKOFF[2], retry_total=MAX_ATTEMPTS - 1,
            ),
            raw_request_hook=self._count,
        )  # fmt: skip

    def _count(self, pipeline_request: Any) -> None:
        request = pipeline_request.http_request
        self.counter.request(operation_of(request.method, request.url))

    def _call(self, operation: str, request: Callable[[], T]) -> T:
        from azure.core.exceptions import (
            AzureError,
            ClientAuthenticationError,
            HttpResponseError,
            ServiceRequestError,
            ServiceResponseError,
        )

        try:
            return request()
        except HttpResponseError as error:
            if error.response is None:  # no answer: a credential that could not get a token
                code = "no_credentials" if isinstance(error, ClientAuthenticationError) else (
                    type(error).__name__)  # fmt: skip
            else:
                code = error.error_code or error.status_code or "error"
                code = str(getattr(code, "value", code))  # the SDK's enum of Azure's codes
            reason = str(error.message or code).strip().splitlines()[0] if error.message else code
        except ServiceRequestError as error:  # refused, unresolvable, connect timeout
            code, reason = "unreachable", str(error)
        except ServiceResponseError as error:  # no answer in time, or a connection cut
            code, reason = "timeout", str(error)
        except AzureError as error:
            code, reason = type(error).__name__, str(error)
        self.counter.error(operation, code)
        raise StoreError(operation, code, f"{redact(reason)} (container {self.container})")

    def list_page(self, prefix: str, delimiter: str | None, token: str | None) -> Page:
        if delimiter:
            listing = self._client.walk_blobs(
                name_starts_with=prefix or None, delimiter=delimiter, results_per_page=PAGE_KEYS
            )
        else:
            listing = self._client.list_blobs(
                name_starts_with=prefix or None, results_per_page=PAGE_KEYS
            )
        pages = listing.by_page(continuation_token=token)
        items = self._call(LIST, lambda: list(next(pages)))
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        for item in items:
            if not hasattr(item, "size"):  # a BlobPrefix: one "directory" below the delimiter
                prefixes.append(str(item.name))
                continue
            modified = item.last_modified.timestamp() if item.last_modified else 0.0
            objects.append(ObjectInfo(item.name, int(item.size or 0), modified, str(item.etag)))
        return Page(tuple(objects), tuple(prefixes), pages.continuation_token or None)

    def get_range(self, key: str, length: int) -> bytes:
        def download() -> bytes:
            stream = self._client.download_blob(
                key, offset=0, length=max(length, 1), max_concurrency=1
            )
            return bytes(stream.readall())

        try:
            return self._call(GET, download)[:length]  # never more than asked
        except StoreError as error:
            if error.code == "InvalidRange":  # an empty blob has no byte 0
                return b""
            raise

    def list_uploads(
        self, prefix: str, marker: tuple[str, str] | None
    ) -> tuple[tuple[Upload, ...], tuple[str, str] | None]:
        """The uncommitted blobs under ``prefix``: one page; the marker is (token, "")."""
        pages = self._client.list_blobs(
            name_starts_with=prefix or None, include=["uncommittedblobs"],
            results_per_page=PAGE_KEYS,
        ).by_page(continuation_token=marker[0] if marker else None)  # fmt: skip
        items = self._call(LIST_UPLOADS, lambda: list(next(pages)))
        uploads = tuple(Upload(item.name, "") for item in items if _uncommitted(item))
        token = pages.continuation_token
        return uploads, ((token, "") if token else None)

    def uploaded_bytes(self, upload: Upload) -> int | None:
        """Bytes of the blob's uncommitted blocks; None when it has none any more (committed or
        deleted since it was listed)."""
        blob = self._client.get_blob_client(upload.key)
        try:
            _, uncommitted = self._call(LIST_PARTS, lambda: blob.get_block_list("uncommitted"))
        except StoreError as error:
            if error.code == "BlobNotFound":
                return None
            raise
        if not uncommitted:
            return None
        return sum(int(block.size or 0) for block in uncommitted)
