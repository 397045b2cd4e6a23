"""The object tree reader over Azure Blob Storage against Azurite: listings become the layouts'
``Dir`` records, uncommitted blocks are files being written, errors stay the job's with Azure's
codes, every HTTP attempt is counted, and no key or SAS token reaches a message or a log."""

from __future__ import annotations

import http.server
import logging
import os
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from unittest import mock

import pytest
from azure.storage.blob import ContainerClient

from checkpoint_exporter import logs
from checkpoint_exporter.model import COMMITTED, WRITING
from checkpoint_exporter.sources import azure, layouts
from checkpoint_exporter.sources.azure import AzureStore
from checkpoint_exporter.sources.layouts.base import Options
from checkpoint_exporter.sources.listing import OpsBudget
from checkpoint_exporter.sources.object_store import RequestCounter, StoreError
from checkpoint_exporter.sources.objects import ObjectTreeReader
from checkpoint_exporter.storage_url import parse_object_url
from tests.helpers.azurite import ACCOUNT, ACCOUNT_KEY, Azurite, azurite

pytestmark = pytest.mark.azurite


@pytest.fixture(scope="module")
def server() -> Iterator[Azurite]:
    with azurite() as running, mock.patch.dict(os.environ, running.env()):
        yield running


@pytest.fixture
def container(server: Azurite, request: pytest.FixtureRequest) -> ContainerClient:
    name = request.node.name.replace("_", "-")[:60].lower().strip("-")
    return server.service().create_container(name)


@pytest.fixture
def exporter_logging_at_debug() -> Iterator[None]:
    """The exporter's own log setup at --log.level=debug, undone after the test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    logs.setup("debug")
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.fixture
def no_retry_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(azure, "RETRY_BACKOFF", (0.0, 0, 0.0))


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def reader_of(
    url: str, clock: Clock | None = None, options: dict | None = None, **kw: object
) -> ObjectTreeReader:
    parsed = parse_object_url(url)
    counter = RequestCounter()
    store = AzureStore(parsed.bucket, options or {}, counter)
    return ObjectTreeReader(
        parsed, store, counter, OpsBudget(), layouts.ALL_CONTENT_FILES,
        marker_names=layouts.MARKER_NAMES, clock=clock or Clock(), **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def requests_of(reader: ObjectTreeReader) -> dict[str, int]:
    return dict(reader.usage().requests)


def stage(container: ContainerClient, key: str, *sizes: int) -> None:
    """Put Block without Put Block List: the blocks of a save in progress."""
    blob = container.get_blob_client(key)
    for index, size in enumerate(sizes):
        blob.stage_block(f"block-{index:04d}", b"y" * size)


def test_a_listing_becomes_the_dir_records_the_layouts_parse(container: ContainerClient) -> None:
    for step in (10, 20):
        container.upload_blob(f"job/step-{step}/__0_0.distcp", b"x" * 100)
        container.upload_blob(f"job/step-{step}/.metadata", b"m" * 7)
    container.upload_blob("job/step-30/__0_0.distcp", b"x" * 50)  # no .metadata: in progress
    container.upload_blob("other/step-1/.metadata", b"m")  # another prefix: not this job's
    reader = reader_of(f"az://{container.container_name}/job")
    tree, stats = reader.read()
    assert stats.errors == []
    assert sorted(name for name, _ in tree.dirs()) == ["step-10", "step-20", "step-30"]
    assert tree.subdirs["step-10"].file("__0_0.distcp")[0] == 100
    assert tree.totals().bytes == 2 * 107 + 50
    name, found = layouts.identify(tree, Options())
    assert name == "dcp"
    assert {item.id: item.state for item in found} == {
        "step-10": COMMITTED, "step-20": COMMITTED, "step-30": WRITING,
    }  # fmt: skip
    # The root with its delimiter, each generation in full, and one look for uncommitted blobs.
    assert requests_of(reader) == {"list": 4, "list_uploads": 1}


def test_pages_are_followed_and_sealed_generations_not_listed_again(
    container: ContainerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(azure, "PAGE_KEYS", 10)
    for index in range(25):  # three pages of 10 blobs
        container.upload_blob(f"job/step-1/__{index}_0.distcp", b"x")
    container.upload_blob("job/step-1/.metadata", b"m")
    for step in range(2, 14):  # two pages of generations under the delimiter
        container.upload_blob(f"job/step-{step}/.metadata", b"m")
    reader = reader_of(f"az://{container.container_name}/job")
    first, stats = reader.read()
    assert stats.errors == []
    assert first.subdirs["step-1"].totals().files == 26
    assert len(first.subdirs) == 13
    # Two pages of the root, three of step-1, one of each other generation; the uncommitted
    # blobs' listing is paged too (39 blobs: four pages).
    assert requests_of(reader) == {"list": 2 + 3 + 12, "list_uploads": 4}
    again, _ = reader.read()
    assert again is first  # each listed once more: the same listing, now sealed
    idle, _ = reader.read()
    assert idle is first
    assert requests_of(reader) == {"list": 2 * 17 + 2, "list_uploads": 12}
    starved = reader_of(f"az://{container.container_name}/job", max_requests=3)
    tree, stats = starved.read()
    assert tree is None and "more than 3 requests" in stats.errors[0][1]


def test_a_marker_is_read_by_a_bounded_ranged_get(container: ContainerClient) -> None:
    container.upload_blob("job/latest", b"global_step20")
    container.upload_blob("job/global_step20/mp_rank_00_model_states.pt", b"w")
    reader = reader_of(f"az://{container.container_name}/job", content_limit=8)
    tree, _ = reader.read()
    assert "latest" in tree.names and "latest" not in tree.contents  # larger than the limit
    assert "get" not in requests_of(reader)
    reader = reader_of(f"az://{container.container_name}/job")
    tree, _ = reader.read()
    assert tree.contents["latest"] == b"global_step20"
    gets = requests_of(reader)["get"]
    assert gets == 1
    reader.read()
    assert requests_of(reader)["get"] == gets  # unchanged: not read again
    store = reader.store
    assert store.get_range("job/latest", 6) == b"global"  # never more than asked
    container.upload_blob("job/empty", b"")
    assert store.get_range("job/empty", 6) == b""


def test_uncommitted_blocks_are_a_file_being_written_until_committed(
    container: ContainerClient,
) -> None:
    container.upload_blob("job/step-1/__0_0.distcp", b"x" * 10)
    container.upload_blob("job/step-1/.metadata", b"m")
    container.upload_blob("job/step-1/empty", b"")  # committed and empty: no upload
    clock = Clock()
    reader = reader_of(f"az://{container.container_name}/job", clock)
    reader.read()
    assert reader.usage().incomplete_uploads == 0
    key = "job/step-2/__0_0.distcp"
    stage(container, key, 1000, 500)
    clock.now += 30
    tree, _ = reader.read()
    # Invisible to a plain listing, seen as an upload: sized by its blocks, dated when seen.
    assert tree.subdirs["step-2"].file("__0_0.distcp") == (1500, clock.now)
    states = {item.id: item.state for item in layouts.identify(tree, Options())[1]}
    assert states["step-2"] == WRITING
    usage = reader.usage()
    assert (usage.incomplete_uploads, usage.incomplete_upload_bytes) == (1, 1500)
    assert usage.oldest_incomplete_upload == clock.now
    assert requests_of(reader)["list_parts"] == 1  # one Get Block List for its size
    first_seen = clock.now
    clock.now += 30
    tree, _ = reader.read()  # no progress: its time stays when it last moved
    assert tree.subdirs["step-2"].file("__0_0.distcp") == (1500, first_seen)
    container.get_blob_client(key).commit_block_list(["block-0000", "block-0001"])
    container.upload_blob("job/step-2/.metadata", b"m")
    clock.now += 30
    tree, _ = reader.read()
    assert reader.usage().incomplete_uploads == 0
    assert tree.subdirs["step-2"].file("__0_0.distcp")[0] == 1500  # the blob now
    states = {item.id: item.state for item in layouts.identify(tree, Options())[1]}
    assert states["step-2"] == COMMITTED


def test_blocks_staged_over_a_committed_blob_leave_it_as_it_was(container: ContainerClient) -> None:
    """The listing shows the committed blob only: a rewrite in place is not an upload (finding
    one would cost a Get Block List per blob per read), and the committed size stands."""
    container.upload_blob("job/step-1/.metadata", b"m" * 5)
    stage(container, "job/step-1/.metadata", 300)
    reader = reader_of(f"az://{container.container_name}/job")
    tree, _ = reader.read()
    assert tree.subdirs["step-1"].file(".metadata")[0] == 5
    assert reader.usage().incomplete_uploads == 0
    assert "list_parts" not in requests_of(reader)


def test_a_missing_container_is_this_jobs_error_with_its_code(server: Azurite) -> None:
    reader = reader_of("az://no-such-container/job")
    tree, stats = reader.read()
    assert tree is None
    assert stats.errors[0][1].startswith("ContainerNotFound")
    assert ("list_uploads", "ContainerNotFound", 1) in reader.usage().errors


def test_a_wrong_key_is_refused_with_its_code(server: Azurite, container: ContainerClient) -> None:
    wrong = server.connection_string.replace(ACCOUNT_KEY, "d3Jvbmc=")
    with mock.patch.dict(os.environ, {"AZURE_STORAGE_CONNECTION_STRING": wrong}):
        reader = reader_of(f"az://{container.container_name}/job")
    tree, stats = reader.read()
    # The service says AuthenticationFailed, Azurite AuthorizationFailure: either forgets all.
    assert tree is None
    assert stats.errors[0][1].split(":")[0] in ("AuthenticationFailed", "AuthorizationFailure")
    assert "d3Jvbmc" not in stats.errors[0][1]


def test_an_unreachable_endpoint_is_an_error_and_each_attempt_is_counted(
    server: Azurite, no_retry_pause: None
) -> None:
    port = server.endpoint.split("/")[2].split(":")[1]
    down = server.connection_string.replace(f":{port}/", ":9/")
    with mock.patch.dict(os.environ, {"AZURE_STORAGE_CONNECTION_STRING": down}):
        reader = reader_of("az://ckpt/job")
    tree, stats = reader.read()
    assert tree is None
    assert stats.errors[0][1].startswith("unreachable")
    usage = reader.usage()
    # The first attempt and both retries reached the hook: each is billed.
    assert usage.requests == (("list_uploads", azure.MAX_ATTEMPTS),)
    assert usage.errors == (("list_uploads", "unreachable", 1),)


class _Busy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(503)
        self.send_header("x-ms-error-code", "ServerBusy")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_busy_server_is_retried_then_reported_with_its_code(no_retry_pause: None) -> None:
    busy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    thread = threading.Thread(target=busy.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{busy.server_address[1]}/{ACCOUNT}"
        env = {"AZURE_STORAGE_CONNECTION_STRING": "", "AZURE_STORAGE_KEY": ACCOUNT_KEY}
        options = {"endpoint_url": endpoint, "account_name": ACCOUNT, "allow_http": True}
        with mock.patch.dict(os.environ, env):
            reader = reader_of("az://ckpt/job", options=options)
        _, stats = reader.read()
    finally:
        busy.shutdown()
        busy.server_close()
    assert stats.errors[0][1].startswith("ServerBusy")
    assert reader.usage().requests == (("list_uploads", azure.MAX_ATTEMPTS),)
    assert reader.usage().errors == (("list_uploads", "ServerBusy", 1),)


def test_a_sas_token_reaches_no_message_and_no_log(
    server: Azurite, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
    no_retry_pause: None, exporter_logging_at_debug: None,
) -> None:  # fmt: skip
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    server.service().create_container("sas")
    server.service().get_container_client("sas").upload_blob("job/step-1/.metadata", b"m")
    token = generate_container_sas(
        ACCOUNT, "sas", account_key=ACCOUNT_KEY,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.now(timezone.utc) + timedelta(hours=1),
    )  # fmt: skip
    signature = dict(part.split("=", 1) for part in token.split("&"))["sig"]
    env = {"AZURE_STORAGE_CONNECTION_STRING": "", "AZURE_STORAGE_SAS_TOKEN": token}
    options = {"endpoint_url": server.endpoint, "account_name": ACCOUNT, "allow_http": True}
    caplog.set_level(logging.DEBUG)
    with mock.patch.dict(os.environ, env):
        good = reader_of("az://sas/job", options=options)
        denied = reader_of("az://ckpt/job", options=options)  # another container: refused
        down = reader_of(
            "az://sas/job", options={**options, "endpoint_url": "http://127.0.0.1:9/x"}
        )
    tree, stats = good.read()
    assert stats.errors == [] and "step-1" in tree.subdirs  # the token works
    _, refused = denied.read()
    _, unreachable = down.read()
    assert refused.errors and unreachable.errors
    said = " ".join(
        [str(refused.errors), str(unreachable.errors), caplog.text, *capsys.readouterr()]
    )
    assert "AuthorizationFailure" in said or "AuthenticationFailed" in said
    assert signature not in said and urlquoted(signature) not in said
    assert not [r for r in caplog.records if r.name.startswith(("azure", "urllib3"))]


def urlquoted(text: str) -> str:
    import urllib.parse

    return urllib.parse.quote(urllib.parse.unquote(text), safe="")


def test_plain_http_needs_allow_http_unless_the_connection_string_names_it() -> None:
    env = {"AZURE_STORAGE_KEY": ACCOUNT_KEY, "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT}
    options = {"endpoint_url": "http://127.0.0.1:10000/devstoreaccount1"}
    with pytest.raises(StoreError) as raised:
        azure.connect(options, env)
    assert raised.value.code == "http_refused" and "allow_http" in raised.value.reason
    assert azure.connect({**options, "allow_http": True}, env).endpoint == options["endpoint_url"]
    azurite_env = Azurite(options["endpoint_url"]).env()
    assert azure.connect({}, azurite_env).endpoint == options["endpoint_url"]


def test_the_account_endpoint_and_credential_come_from_the_environment() -> None:
    from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

    key_env = {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_KEY": "c2VjcmV0"}
    connection = azure.connect({}, key_env)
    assert connection.endpoint == "https://acct.blob.core.windows.net"
    assert isinstance(connection.credential, AzureNamedKeyCredential)
    assert "c2VjcmV0" not in repr(connection)
    adlfs_env = {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "c2VjcmV0"}
    assert azure.connect({}, adlfs_env).source == "AZURE_STORAGE_ACCOUNT_KEY"
    sas = azure.connect({"account_name": "other"}, {"AZURE_STORAGE_SAS_TOKEN": "?sv=1&sig=abc"})
    assert sas.endpoint == "https://other.blob.core.windows.net"
    assert isinstance(sas.credential, AzureSasCredential)
    assert sas.source == "AZURE_STORAGE_SAS_TOKEN"
    suffixed = "AccountName=acct;AccountKey=a2V5;EndpointSuffix=core.chinacloudapi.cn"
    china = azure.connect({}, {"AZURE_STORAGE_CONNECTION_STRING": suffixed})
    assert china.endpoint == "https://acct.blob.core.chinacloudapi.cn"
    identity = azure.connect({"account_name": "acct"}, {})
    assert identity.source == "DefaultAzureCredential"
    with pytest.raises(StoreError) as raised:
        azure.connect({}, {})
    assert raised.value.code == "no_account"
    with pytest.raises(StoreError) as raised:
        azure.connect({}, {"AZURE_STORAGE_CONNECTION_STRING": "AccountKey"})
    assert raised.value.code == "bad_connection_string" and "AccountKey" not in raised.value.reason
    # A worker per account endpoint and container; no query (a SAS) in its name.
    with_sas = {"AZURE_STORAGE_CONNECTION_STRING": "BlobEndpoint=https://h.example/?sig=abc"}
    assert azure.store_key("ckpt", {}, with_sas) == "az://https://h.example/ckpt"
    assert azure.store_key("ckpt", {"account_name": "acct"}, {}) == (
        "az://https://acct.blob.core.windows.net/ckpt"
    )


def test_each_request_has_its_operation_label() -> None:
    base = "https://acct.blob.core.windows.net/ckpt"
    assert azure.operation_of("GET", f"{base}?restype=container&comp=list&prefix=a") == "list"
    assert azure.operation_of(
        "GET", f"{base}?restype=container&comp=list&include=uncommittedblobs"
    ) == "list_uploads"  # fmt: skip
    assert azure.operation_of("GET", f"{base}/a/b?comp=blocklist&blocklisttype=uncommitted") == (
        "list_parts"
    )
    assert azure.operation_of("GET", f"{base}/a/b") == "get"
    assert azure.operation_of("HEAD", f"{base}/a/b") == "head"
    redacted = azure.redact("x?sv=1&sig=abc y AccountKey=k2; sig=zz")
    assert redacted == "x?... y AccountKey=...; sig=..."
