"""The GCS store against gcp-storage-emulator (the GCS JSON API over HTTP): listings become the
layouts' ``Dir`` records, pages are followed, markers are bounded ranged GETs, every attempt is
counted, and a missing bucket, throttling or an unreachable endpoint is the job's error.

Where the emulator does not do what GCS does, the test puts ``front`` (tests/helpers) before it:
it ignores ``maxResults`` and ``pageToken`` (every listing is one page), so paging is tested
through a front that pages as GCS documents it; its errors carry no JSON reason, so the store's
codes are read from the status there (and from GCS's JSON where the front answers one)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from checkpoint_exporter.model import COMMITTED, WRITING
from checkpoint_exporter.sources import gcs, layouts
from checkpoint_exporter.sources.gcs import GCSStore, parse_time
from checkpoint_exporter.sources.layouts.base import Options
from checkpoint_exporter.sources.listing import FILE, OpsBudget
from checkpoint_exporter.sources.object_store import RequestCounter, StoreError
from checkpoint_exporter.sources.objects import ObjectTreeReader
from checkpoint_exporter.storage_url import parse_object_url
from tests.helpers.gcs_emulator import Front, GCSEmulator, front, gcs_emulator


@pytest.fixture(scope="module")
def server() -> Iterator[GCSEmulator]:
    with gcs_emulator() as running, mock.patch.dict(os.environ, running.env()):
        yield running


@pytest.fixture
def bucket(server: GCSEmulator, request: pytest.FixtureRequest) -> str:
    name = request.node.name.replace("_", "-")[:60].lower()
    server.create_bucket(name)
    return name


@pytest.fixture
def paged(server: GCSEmulator) -> Iterator[Front]:
    with front(server) as running:
        yield running


class Pauses:
    """The store's sleep between attempts: kept, never slept."""

    def __init__(self) -> None:
        self.taken: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.taken.append(seconds)


def reader_of(
    url: str,
    environ: dict[str, str] | None = None,
    options: dict[str, object] | None = None,
    sleep: Pauses | None = None,
    **kw: object,
) -> ObjectTreeReader:
    parsed = parse_object_url(url)
    counter = RequestCounter()
    store = GCSStore(
        parsed.bucket, options or {}, counter, environ=os.environ if environ is None else environ,
        sleep=sleep or Pauses(),
    )  # fmt: skip
    return ObjectTreeReader(
        parsed, store, counter, OpsBudget(), layouts.ALL_CONTENT_FILES,
        marker_names=layouts.MARKER_NAMES, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def requests_of(reader: ObjectTreeReader) -> dict[str, int]:
    return dict(reader.usage().requests)


def test_a_listing_becomes_the_dir_records_the_layouts_parse(server: GCSEmulator, bucket: str):
    for step in (10, 20):
        server.put(bucket, f"job/step-{step}/__0_0.distcp", b"x" * 100)
        server.put(bucket, f"job/step-{step}/.metadata", b"m" * 7)
    shard = server.put(bucket, "job/step-30/__0_0.distcp", b"x" * 50)  # no marker: in progress
    server.put(bucket, "other/step-1/.metadata", b"m")  # another prefix: not this job's
    reader = reader_of(f"gs://{bucket}/job")
    tree, stats = reader.read()
    assert stats.errors == []
    assert sorted(name for name, _ in tree.dirs()) == ["step-10", "step-20", "step-30"]
    assert tree.subdirs["step-10"].file("__0_0.distcp")[0] == 100
    # The object's time is its `updated`, as the store wrote it.
    assert tree.subdirs["step-30"].file("__0_0.distcp")[1] == parse_time(str(shard["updated"]))
    assert tree.totals().bytes == 2 * 107 + 50
    name, found = layouts.identify(tree, Options())
    assert name == "dcp"
    states = {item.id: item.state for item in found}
    assert states == {"step-10": COMMITTED, "step-20": COMMITTED, "step-30": WRITING}
    # The root with a delimiter, then each generation; no upload listing (GCS has none).
    assert requests_of(reader) == {"list": 4}


def test_sealed_generations_are_not_listed_again(server: GCSEmulator, bucket: str) -> None:
    for step in range(5):
        server.put(bucket, f"job/step-{step}/__0_0.distcp", b"x" * 10)
        server.put(bucket, f"job/step-{step}/.metadata", b"m")
    reader = reader_of(f"gs://{bucket}/job/")
    first, _ = reader.read()
    assert requests_of(reader) == {"list": 6}
    again, _ = reader.read()
    assert again is first  # each listed once more: the same listing, now sealed
    assert requests_of(reader) == {"list": 12}
    idle, _ = reader.read()
    assert idle is first
    assert requests_of(reader) == {"list": 13}  # an idle poll: the root alone
    server.put(bucket, "job/step-5/__0_0.distcp", b"x" * 10)
    grown, _ = reader.read()
    assert sorted(grown.subdirs) == [f"step-{step}" for step in range(6)]
    assert requests_of(reader) == {"list": 15}  # the root and the new generation


def test_pages_are_followed_with_and_without_a_delimiter(
    server: GCSEmulator, bucket: str, paged: Front, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index in range(25):  # three pages of 10 names
        server.put(bucket, f"job/step-1/__{index}_0.distcp", b"")
    for step in range(2, 13):  # 11 more generations and a marker: two pages at the root
        server.put(bucket, f"job/step-{step}/.metadata", b"m")
    server.put(bucket, "job/latest", b"step-12")
    monkeypatch.setattr(gcs, "PAGE_KEYS", 10)
    reader = reader_of(f"gs://{bucket}/job", environ={"STORAGE_EMULATOR_HOST": paged.endpoint})
    tree, stats = reader.read()
    assert stats.errors == []
    assert tree.subdirs["step-1"].totals().files == 25
    assert len(tree.subdirs) == 12 and tree.kind("latest") == FILE
    # The root in two pages, step-1 in three, the 11 others in one each.
    assert requests_of(reader)["list"] == 2 + 3 + 11
    lists = [path for path, _ in paged.seen if "/o?" in path]
    assert all("maxResults=10" in path for path in lists)
    assert sum("pageToken=" in path for path in lists) == 1 + 2


def test_a_marker_is_read_by_a_bounded_ranged_get(
    server: GCSEmulator, bucket: str, paged: Front
) -> None:
    server.put(bucket, "job/latest", b"global_step20")
    server.put(bucket, "job/global_step20/mp_rank_00_model_states.pt", b"x")
    reader = reader_of(f"gs://{bucket}/job", content_limit=8)
    tree, _ = reader.read()
    assert tree.kind("latest") == FILE
    assert "latest" not in tree.contents  # larger than the limit: never fetched
    assert "get" not in requests_of(reader)
    reader = reader_of(f"gs://{bucket}/job")
    tree, _ = reader.read()
    assert tree.contents["latest"] == b"global_step20"
    gets = requests_of(reader)["get"]
    reader.read()
    assert requests_of(reader)["get"] == gets  # the same generation of it: not read again
    server.put(bucket, "job/latest", b"global_step30")  # rewritten: a new generation
    tree, _ = reader.read()
    assert tree.contents["latest"] == b"global_step30"
    assert requests_of(reader)["get"] == gets + 1
    # A store that ignores Range sends it all: never more than asked is read.
    paged.ignore_range = True
    environ = {"STORAGE_EMULATOR_HOST": paged.endpoint}
    store = GCSStore(bucket, {}, RequestCounter(), environ=environ)
    assert store.get_range("job/latest", 6) == b"global"
    # The rest was not read: that connection was dropped, and the next request gets another.
    assert store.list_page("job/", "/", None).prefixes == ("job/global_step20/",)


def test_a_missing_bucket_is_this_jobs_error_with_its_code(server: GCSEmulator) -> None:
    reader = reader_of("gs://no-such-bucket/job")
    tree, stats = reader.read()
    assert tree is None
    assert stats.errors[0][1].startswith("notFound")
    assert reader.usage().errors == (("list", "notFound", 1),)
    assert requests_of(reader) == {"list": 1}  # not a throttle: asked once


def test_a_gcs_json_error_gives_its_reason_code(paged: Front) -> None:
    answer = {"error": {"code": 403, "message": "no storage.objects.list for you",
                        "errors": [{"reason": "forbidden", "message": "x"}]}}  # fmt: skip
    paged.faults, paged.fault_body = [403], json.dumps(answer).encode()
    reader = reader_of("gs://denied/job", environ={"STORAGE_EMULATOR_HOST": paged.endpoint})
    tree, stats = reader.read()
    assert tree is None
    assert stats.errors[0][1] == "forbidden: no storage.objects.list for you (bucket denied)"


def test_throttling_is_backed_off_and_every_attempt_counted(
    server: GCSEmulator, bucket: str, paged: Front
) -> None:
    server.put(bucket, "job/step-1/.metadata", b"m")
    pauses = Pauses()
    environ = {"STORAGE_EMULATOR_HOST": paged.endpoint}
    reader = reader_of(f"gs://{bucket}/job", environ=environ, sleep=pauses)
    paged.faults = [429, 503]
    tree, stats = reader.read()
    assert stats.errors == [] and sorted(tree.subdirs) == ["step-1"]
    assert requests_of(reader) == {"list": 4}  # the root three times (two refused), step-1
    assert reader.usage().errors == ()  # the call succeeded in the end
    assert len(pauses.taken) == 2
    assert 0 <= pauses.taken[0] <= gcs.BACKOFF_BASE_SECONDS
    assert 0 <= pauses.taken[1] <= 2 * gcs.BACKOFF_BASE_SECONDS
    throttled = reader_of(f"gs://{bucket}/job", environ=environ, sleep=pauses)
    paged.faults = [429] * gcs.MAX_ATTEMPTS
    tree, stats = throttled.read()
    assert stats.errors[0][1].startswith("rateLimitExceeded")
    assert requests_of(throttled) == {"list": gcs.MAX_ATTEMPTS}
    assert throttled.usage().errors == (("list", "rateLimitExceeded", 1),)


def test_an_unreachable_endpoint_is_an_error_not_a_hang() -> None:
    pauses = Pauses()
    reader = reader_of("gs://bucket/job", {"STORAGE_EMULATOR_HOST": "127.0.0.1:9"}, sleep=pauses)
    tree, stats = reader.read()
    assert tree is None
    assert stats.errors[0][1].startswith("unreachable: cannot connect to http://127.0.0.1:9")
    assert requests_of(reader) == {"list": gcs.MAX_ATTEMPTS}  # tried again, each counted
    assert reader.usage().errors == (("list", "unreachable", 1),)


def test_plain_http_with_credentials_is_refused_without_allow_http() -> None:
    with pytest.raises(StoreError) as raised:
        GCSStore("bucket", {"endpoint_url": "http://gcs.internal"}, RequestCounter(), environ={})
    assert raised.value.code == "http_refused"
    assert "allow_http" in raised.value.reason
    # The emulator named by STORAGE_EMULATOR_HOST gets no credentials: plain HTTP is its own.
    store = GCSStore("b", {}, RequestCounter(), environ={"STORAGE_EMULATOR_HOST": "h:1"})
    assert (store.endpoint, store.anonymous) == ("http://h:1", True)
    assert gcs.store_key("b", {}) != gcs.store_key("b", {"endpoint_url": "https://gcs.internal"})


def test_credentials_sign_each_request_and_never_reach_a_message(
    server: GCSEmulator, bucket: str, paged: Front, monkeypatch: pytest.MonkeyPatch
) -> None:
    """google-auth's credentials (a user's, whose token endpoint is the front: google-auth
    takes no token endpoint from a credentials file), asked for the read-only scope: refreshed
    through the store's own pool, sent as a bearer token; an error that echoes the token is
    reported without it."""
    import google.auth
    from google.oauth2.credentials import Credentials

    asked: list[object] = []

    def default(scopes: list[str]) -> tuple[Credentials, None]:
        asked.append(scopes)
        credentials = Credentials(
            None, refresh_token="not-a-token", token_uri=f"{paged.endpoint}/token",
            client_id="id", client_secret="not-a-secret",
        )  # fmt: skip
        return credentials, None

    monkeypatch.setattr(google.auth, "default", default)
    server.put(bucket, "job/step-1/.metadata", b"m")
    options = {"endpoint_url": paged.endpoint, "allow_http": True}
    reader = reader_of(f"gs://{bucket}/job", environ={}, options=options)
    tree, stats = reader.read()
    assert stats.errors == [] and sorted(tree.subdirs) == ["step-1"]
    assert asked == [[gcs.READ_ONLY_SCOPE]]  # found once, kept
    refresh, *requests = paged.seen
    assert refresh[0] == "/token"
    assert {auth for _, auth in requests} == {f"Bearer {paged.token}"}
    paged.faults = [400]
    paged.fault_body = json.dumps({"error": {"message": f"bad {paged.token}"}}).encode()
    _, stats = reader.read(force=True)
    assert stats.errors[0][1] == f"badRequest: bad [token] (bucket {bucket})"


def test_no_credentials_is_the_jobs_error(tmp_path: Path) -> None:
    environ = {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "missing.json")}
    with mock.patch.dict(os.environ, environ):
        reader = reader_of("gs://bucket/job", environ={}, options={"endpoint_url": "https://x"})
        tree, stats = reader.read()
    assert tree is None
    assert stats.errors[0][1].startswith("no_credentials")
    assert requests_of(reader) == {}  # nothing was sent
    assert reader.usage().errors == (("list", "no_credentials", 1),)


def test_times_are_read_as_gcs_writes_them() -> None:
    assert parse_time("2026-01-02T03:04:05.250Z") == 1767323045.25
    assert parse_time("2026-01-02T04:04:05+01:00") == 1767323045.0
    assert parse_time("yesterday") == 0.0
