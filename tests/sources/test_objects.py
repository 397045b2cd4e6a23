"""The object tree reader against moto's S3 server: listings become the layouts' ``Dir`` records,
open multipart uploads are files being written, deletions are gone, errors stay the job's."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from checkpoint_exporter.model import COMMITTED, WRITING
from checkpoint_exporter.sources import layouts, s3
from checkpoint_exporter.sources.layouts.base import Options
from checkpoint_exporter.sources.listing import FILE, OpsBudget
from checkpoint_exporter.sources.object_store import RequestCounter, Upload
from checkpoint_exporter.sources.objects import (
    BACKOFF_SECONDS,
    MAX_UPLOADS_SIZED,
    STALE_UPLOAD_SECONDS,
    ObjectTreeReader,
)
from checkpoint_exporter.sources.s3 import S3Store
from checkpoint_exporter.storage_url import parse_object_url
from tests.helpers.moto_s3 import MotoServer, moto_server


@pytest.fixture(scope="module")
def server() -> Iterator[MotoServer]:
    with moto_server() as running, mock.patch.dict(os.environ, running.env()):
        yield running


@pytest.fixture
def bucket(server: MotoServer, request: pytest.FixtureRequest) -> str:
    name = request.node.name.replace("_", "-")[:50].lower()
    server.client().create_bucket(Bucket=name)
    return name


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def reader_of(url: str, clock: Clock | None = None, **kw: object) -> ObjectTreeReader:
    parsed = parse_object_url(url)
    counter = RequestCounter()
    store = S3Store(parsed.bucket, {}, counter)
    return ObjectTreeReader(
        parsed, store, counter, OpsBudget(), layouts.ALL_CONTENT_FILES,
        marker_names=layouts.MARKER_NAMES, opening_markers=layouts.OPENING_MARKERS,
        clock=clock or Clock(), **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def put(server: MotoServer, bucket: str, key: str, size: int) -> None:
    server.client().put_object(Bucket=bucket, Key=key, Body=b"x" * size)


def requests_of(reader: ObjectTreeReader) -> dict[str, int]:
    return dict(reader.usage().requests)


def test_a_listing_becomes_the_dir_records_the_layouts_parse(server: MotoServer, bucket: str):
    for step in (10, 20):
        put(server, bucket, f"job/step-{step}/__0_0.distcp", 100)
        put(server, bucket, f"job/step-{step}/.metadata", 7)
    put(server, bucket, "job/step-30/__0_0.distcp", 50)  # no .metadata: a save in progress
    put(server, bucket, "other/step-1/.metadata", 1)  # another prefix: not this job's
    tree, stats = reader_of(f"s3://{bucket}/job").read()
    assert stats.errors == []
    assert sorted(name for name, _ in tree.dirs()) == ["step-10", "step-20", "step-30"]
    assert tree.subdirs["step-10"].file("__0_0.distcp")[0] == 100
    assert tree.totals().bytes == 2 * 107 + 50
    name, found = layouts.identify(tree, Options())
    assert name == "dcp"
    states = {item.id: item.state for item in found}
    assert states == {"step-10": COMMITTED, "step-20": COMMITTED, "step-30": WRITING}


def test_an_idle_poll_lists_once_and_hands_on_the_same_tree(server: MotoServer, bucket: str):
    for step in range(5):
        put(server, bucket, f"job/step-{step}/__0_0.distcp", 10)
        put(server, bucket, f"job/step-{step}/.metadata", 1)
    reader = reader_of(f"s3://{bucket}/job/")
    first, _ = reader.read()
    assert requests_of(reader) == {"list": 6, "list_uploads": 1}  # the root, then each one
    again, _ = reader.read()
    assert again is first  # each listed once more: the same listing, now sealed
    assert requests_of(reader) == {"list": 12, "list_uploads": 2}
    idle, _ = reader.read()
    assert idle is first  # sealed generations are not listed again
    assert requests_of(reader) == {"list": 13, "list_uploads": 3}
    everything, _ = reader.read(force=True)
    assert requests_of(reader)["list"] == 19  # a full read lists every generation
    assert everything is first  # and finds it unchanged


def test_a_commit_by_copy_and_delete_is_read_once_settled(server: MotoServer, bucket: str):
    """DCP through s3fs renames ``.metadata.tmp`` to ``.metadata`` as S3 can: a COPY, then a
    DELETE. A listing between the two shows both; the generation is listed again until a
    listing repeats the one before, so the temporary object does not stay in the tree."""
    client = server.client()
    put(server, bucket, "job/step-1/__0_0.distcp", 100)
    put(server, bucket, "job/step-1/.metadata.tmp", 7)
    client.copy_object(
        Bucket=bucket, Key="job/step-1/.metadata",
        CopySource={"Bucket": bucket, "Key": "job/step-1/.metadata.tmp"},
    )  # fmt: skip
    reader = reader_of(f"s3://{bucket}/job")
    tree, _ = reader.read()  # between the COPY and the DELETE
    assert tree.subdirs["step-1"].has_file(".metadata.tmp")
    client.delete_object(Bucket=bucket, Key="job/step-1/.metadata.tmp")
    tree, _ = reader.read()
    assert not tree.subdirs["step-1"].has_file(".metadata.tmp")
    assert tree.subdirs["step-1"].totals().bytes == 107
    lists = requests_of(reader)["list"]
    again, _ = reader.read()  # the same listing twice: sealed from here on
    assert again is tree
    reader.read()
    # The root and the generation (its listing repeats the last), then the root alone.
    assert requests_of(reader)["list"] == lists + 3


def test_pages_are_followed_and_the_request_budget_bounds_a_read(
    server: MotoServer, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = server.client()
    for index in range(25):  # three pages of 10 keys
        client.put_object(Bucket=bucket, Key=f"job/step-1/__{index}_0.distcp", Body=b"")
    monkeypatch.setattr(s3, "PAGE_KEYS", 10)
    reader = reader_of(f"s3://{bucket}/job")
    tree, stats = reader.read()
    assert tree.subdirs["step-1"].totals().files == 25
    assert requests_of(reader) == {"list": 4, "list_uploads": 1}
    starved = reader_of(f"s3://{bucket}/job", max_requests=3)
    tree, stats = starved.read()
    assert tree is None
    assert "more than 3 requests" in stats.errors[0][1]


def test_an_open_multipart_upload_is_a_file_being_written(server: MotoServer, bucket: str):
    client = server.client()
    put(server, bucket, "job/step-1/__0_0.distcp", 10)
    put(server, bucket, "job/step-1/.metadata", 1)
    clock = Clock()
    reader = reader_of(f"s3://{bucket}/job", clock)
    reader.read()
    upload = client.create_multipart_upload(Bucket=bucket, Key="job/step-2/__0_0.distcp")
    clock.now += 30
    tree, _ = reader.read()
    shard = tree.subdirs["step-2"].file("__0_0.distcp")
    # Dated when first seen, not by moto's fixed 2010 Initiated date.
    assert shard == (0, clock.now)
    [(_, found)] = [(n, f) for n, f in [layouts.identify(tree, Options())]]
    assert {item.id: item.state for item in found}["step-2"] == WRITING
    usage = reader.usage()
    assert (usage.incomplete_uploads, usage.oldest_incomplete_upload) == (1, clock.now)
    # Every request is progress for the stuck-worker check, ListParts included.
    assert reader.requests_made == sum(dict(usage.requests).values())
    assert dict(usage.requests)["list_parts"] == 1
    first_seen = clock.now
    client.upload_part(
        Bucket=bucket, Key="job/step-2/__0_0.distcp", UploadId=upload["UploadId"],
        PartNumber=1, Body=b"y" * 5 * 1024 * 1024,
    )  # fmt: skip
    clock.now += 30
    tree, _ = reader.read()
    assert tree.subdirs["step-2"].file("__0_0.distcp") == (5 * 1024 * 1024, clock.now)
    assert reader.usage().incomplete_upload_bytes == 5 * 1024 * 1024
    clock.now += 30
    tree, _ = reader.read()  # no progress: its time stays when it last moved
    assert tree.subdirs["step-2"].file("__0_0.distcp")[1] == first_seen + 30
    client.abort_multipart_upload(
        Bucket=bucket, Key="job/step-2/__0_0.distcp", UploadId=upload["UploadId"]
    )
    tree, _ = reader.read()
    assert "step-2" not in tree.subdirs
    assert reader.usage().incomplete_uploads == 0


def test_a_single_file_upload_is_marked_uploading_until_its_object_is_whole(
    server: MotoServer, bucket: str
) -> None:
    """Lightning's ``.ckpt`` through s3fs ``pipe``: a multipart upload at the file's own key,
    no temporary name. While it is open the listing marks the name uploading, so the layout
    keeps it in progress (its size stands still between parts, or for good once killed);
    completed, it is an object like any other and settles."""
    client = server.client()
    put(server, bucket, "job/epoch=0-step=3.ckpt", 10)
    key = "job/epoch=0-step=6.ckpt"
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)
    part = client.upload_part(
        Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"y" * 1000
    )
    reader = reader_of(f"s3://{bucket}/job")
    tree, _ = reader.read()
    assert tree.uploading == {"epoch=0-step=6.ckpt"}
    found = {item.id: item for item in layouts.REGISTRY["lightning"].parse(tree, Options())}
    assert found["epoch=0-step=6.ckpt"].state == WRITING
    assert not found["epoch=0-step=6.ckpt"].settles
    assert found["epoch=0-step=3.ckpt"].settles
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )  # fmt: skip
    tree, _ = reader.read()
    assert tree.uploading == frozenset()
    found = {item.id: item for item in layouts.REGISTRY["lightning"].parse(tree, Options())}
    assert found["epoch=0-step=6.ckpt"].settles
    assert tree.file("epoch=0-step=6.ckpt")[0] == 1000


def orbax_metadata(commit_ns: int | None) -> bytes:
    return json.dumps({"init_timestamp_nsecs": 1, "commit_timestamp_nsecs": commit_ns}).encode()


def test_a_killed_orbax_step_saved_again_under_its_name_is_listed_again(
    server: MotoServer, bucket: str
) -> None:
    """Orbax on gs:// writes a step under its final name, ``_CHECKPOINT_METADATA`` first (its
    commit timestamp null) and ``commit_success.txt`` last. A killed save leaves the metadata;
    the resumed job saves the same step again: it removes those objects and writes new ones,
    and a poll need not fall in between. The metadata seals nothing, so the new save is seen."""
    client = server.client()
    client.put_object(Bucket=bucket, Key="job/20/_CHECKPOINT_METADATA", Body=orbax_metadata(2))
    put(server, bucket, "job/20/commit_success.txt", 50)
    put(server, bucket, "job/20/default/ocdbt.process_0/d/a", 1000)
    client.put_object(Bucket=bucket, Key="job/25/_CHECKPOINT_METADATA", Body=orbax_metadata(None))
    put(server, bucket, "job/25/default/ocdbt.process_0/d/a", 400)  # killed: no commit file
    reader = reader_of(f"s3://{bucket}/job")
    for _ in range(3):  # listings alike: the committed step sealed, the killed one not
        tree, _ = reader.read()
    lists = requests_of(reader)["list"]
    reader.read()
    assert requests_of(reader)["list"] == lists + 2  # the root, and the killed step again
    client.delete_object(Bucket=bucket, Key="job/25/default/ocdbt.process_0/d/a")
    client.put_object(Bucket=bucket, Key="job/25/_CHECKPOINT_METADATA", Body=orbax_metadata(3))
    put(server, bucket, "job/25/default/ocdbt.process_0/d/b", 1000)
    put(server, bucket, "job/25/commit_success.txt", 50)
    tree, _ = reader.read()
    states = {found.id: found.state for found in layouts.orbax.parse(tree, Options())}
    assert states == {"20": COMMITTED, "25": COMMITTED}
    assert tree.subdirs["25"].totals().bytes == tree.subdirs["20"].totals().bytes


def test_a_save_retried_under_the_same_name_is_followed_by_its_own_upload(
    server: MotoServer, bucket: str
) -> None:
    """A killed save's upload stays open beside the retry's on the same key: the file being
    written is the retry's (its progress is the save's), and both are open uploads that cost."""
    client = server.client()
    key = "job/step-1/__0_0.distcp"
    clock = Clock()
    reader = reader_of(f"s3://{bucket}/job", clock)
    reader.read()
    killed = client.create_multipart_upload(Bucket=bucket, Key=key)
    part = b"y" * 5 * 1024 * 1024
    client.upload_part(Bucket=bucket, Key=key, UploadId=killed["UploadId"], PartNumber=1, Body=part)
    clock.now += 30
    reader.read()
    retry = client.create_multipart_upload(Bucket=bucket, Key=key)
    for number in (1, 2):
        client.upload_part(
            Bucket=bucket, Key=key, UploadId=retry["UploadId"], PartNumber=number, Body=part
        )
    clock.now += 30
    tree, _ = reader.read()
    assert tree.subdirs["step-1"].file("__0_0.distcp") == (2 * len(part), clock.now)
    usage = reader.usage()
    assert (usage.incomplete_uploads, usage.incomplete_upload_bytes) == (2, 3 * len(part))
    assert usage.oldest_incomplete_upload == clock.now - 30  # the killed one, when first seen


def test_deleted_objects_are_gone(server: MotoServer, bucket: str) -> None:
    for step in (1, 2):
        put(server, bucket, f"job/step-{step}/__0_0.distcp", 10)
        put(server, bucket, f"job/step-{step}/.metadata", 1)
    reader = reader_of(f"s3://{bucket}/job")
    reader.read()
    client = server.client()
    for key in ("job/step-1/__0_0.distcp", "job/step-1/.metadata"):
        client.delete_object(Bucket=bucket, Key=key)
    tree, _ = reader.read()
    assert sorted(tree.subdirs) == ["step-2"]


def test_a_marker_is_read_by_a_bounded_ranged_get(server: MotoServer, bucket: str) -> None:
    client = server.client()
    client.put_object(Bucket=bucket, Key="job/latest", Body=b"global_step20")
    client.put_object(Bucket=bucket, Key="job/global_step20/mp_rank_00_model_states.pt", Body=b"")
    reader = reader_of(f"s3://{bucket}/job", content_limit=8)
    tree, _ = reader.read()
    assert tree.kind("latest") == FILE
    assert "latest" not in tree.contents  # larger than the limit: never fetched
    assert "get" not in requests_of(reader)
    reader = reader_of(f"s3://{bucket}/job")
    tree, _ = reader.read()
    assert tree.contents["latest"] == b"global_step20"
    gets = requests_of(reader).get("get", 0)
    reader.read()
    assert requests_of(reader).get("get", 0) == gets  # unchanged: not read again


def test_a_missing_bucket_is_this_jobs_error_with_its_reason(server: MotoServer) -> None:
    reader = reader_of("s3://no-such-bucket/job")
    tree, stats = reader.read()
    assert tree is None
    assert stats.errors[0][1].startswith("NoSuchBucket")
    assert ("list_uploads", "NoSuchBucket", 1) in reader.usage().errors


def test_a_store_that_refuses_a_read_is_asked_again_after_a_growing_pause(
    server: MotoServer,
) -> None:
    """Requests are billed and throttled: a read the store refused is not repeated at every
    poll (every second while a save is in progress), and its error stands meanwhile."""
    clock = Clock()
    reader = reader_of("s3://no-such-bucket-yet/job", clock)
    reader.read()
    made = sum(requests_of(reader).values())
    clock.now += BACKOFF_SECONDS[0] - 1
    tree, stats = reader.read()  # within the pause: no request, the same error
    assert sum(requests_of(reader).values()) == made
    assert tree is None and stats.errors[0][1].startswith("NoSuchBucket")
    clock.now += 1
    reader.read()  # the pause is over: asked again, refused again, a longer pause
    again = sum(requests_of(reader).values())
    assert again > made
    clock.now += 2 * BACKOFF_SECONDS[0] - 1
    reader.read()
    assert sum(requests_of(reader).values()) == again
    server.client().create_bucket(Bucket="no-such-bucket-yet")
    clock.now += 1
    tree, stats = reader.read()  # it exists now: read, and no pause after a good read
    assert tree is not None and stats.errors == []
    clock.now += 1
    before = sum(requests_of(reader).values())
    reader.read()
    assert sum(requests_of(reader).values()) > before


def test_an_unreachable_endpoint_is_an_error_not_a_hang(server: MotoServer) -> None:
    with mock.patch.dict(os.environ, {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}):
        reader = reader_of("s3://bucket/job")
    tree, stats = reader.read()
    assert tree is None or tree.names == ()
    assert stats.errors and "unreachable" in stats.errors[0][1]


def test_plain_http_is_refused_without_allow_http(server: MotoServer) -> None:
    from checkpoint_exporter.sources.object_store import StoreError

    with mock.patch.dict(os.environ, {"AWS_ALLOW_HTTP": ""}), pytest.raises(StoreError) as raised:
        S3Store("bucket", {}, RequestCounter())
    assert "AWS_ALLOW_HTTP" in raised.value.reason


def test_stores_on_one_endpoint_share_a_client_and_count_their_own_requests(
    server: MotoServer,
) -> None:
    client = server.client()
    for name in ("shared-a", "shared-b"):
        client.create_bucket(Bucket=name)
    first, second = RequestCounter(), RequestCounter()
    a, b = S3Store("shared-a", {}, first), S3Store("shared-b", {}, second)
    # One botocore client per endpoint (about 12 MiB each), not one per bucket or job.
    assert a._client is b._client
    a.list_page("", "/", None)
    a.list_page("", "/", None)
    b.list_page("", None, None)
    assert dict(first.totals()[0]) == {"list": 2}
    assert dict(second.totals()[0]) == {"list": 1}
    # A store on another endpoint (here: path-style addressing) has its own.
    assert (
        S3Store("shared-a", {"addressing_style": "path"}, RequestCounter())._client is not a._client
    )


@pytest.mark.parametrize(
    ("url", "missing"),
    [("s3://b/p", "botocore missing: install checkpoint-exporter[s3]"),
     ("gs://b/p", "google.auth, urllib3 missing: install checkpoint-exporter[gcs]"),
     ("az://c/p", "azure.storage.blob missing: install checkpoint-exporter[azure]")],
)  # fmt: skip
def test_a_store_whose_extra_is_not_installed_is_that_jobs_error(
    url: str, missing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from checkpoint_exporter.sources import stores

    monkeypatch.setattr(stores, "_installed", lambda module: False)
    counter = RequestCounter()
    reader = stores.open_reader(parse_object_url(url), {}, OpsBudget(), counter, content_names=())
    tree, stats = reader.read()
    assert tree is None
    assert [reason for _, reason in stats.errors] == [f"not_installed: {missing}"]
    assert counter.totals() == ((), ())  # nothing was asked of any store


def test_listed_times_are_the_stores_to_the_millisecond_however_they_are_parsed(
    server: MotoServer, bucket: str
) -> None:
    from checkpoint_exporter.sources.s3 import _timestamp

    put(server, bucket, "job/step-1/.metadata", 1)
    (item,) = server.client().list_objects_v2(Bucket=bucket, Prefix="job/")["Contents"]
    counter = RequestCounter()
    page = S3Store(bucket, {}, counter).list_page("job/step-1/", None, None)
    assert page.objects[0].mtime == item["LastModified"].timestamp()
    assert _timestamp("2026-12-03T11:20:00.000Z").timestamp() == 1796296800.0
    # What is not ISO 8601 with a zone (an HTTP date, in a header) goes to botocore's parser.
    assert _timestamp("Thu, 03 Dec 2026 11:20:00 GMT").timestamp() == 1796296800.0


@pytest.mark.slow  # a hundred uploads made first
def test_uploads_left_open_do_not_take_the_sizing_slots_of_a_live_save(
    server: MotoServer, bucket: str
) -> None:
    """A killed 100-rank save's uploads, never aborted (no lifecycle rule), sort before the next
    save's: they are sized once, then again only every STALE_UPLOAD_SECONDS, and the live upload
    gets its slot (its size moving is what keeps its save from being aborted)."""
    client = server.client()
    for rank in range(MAX_UPLOADS_SIZED):
        client.create_multipart_upload(Bucket=bucket, Key=f"job/step-1/__{rank:03}_0.distcp")
    clock = Clock()
    reader = reader_of(f"s3://{bucket}/job", clock)
    reader.read()
    assert requests_of(reader)["list_parts"] == MAX_UPLOADS_SIZED
    # The run resumes at once (a crash, then a restart): its first upload is never sized, the
    # killed ones were sized 5 s ago and are not stale yet. The new one is sized first.
    resumed = "job/step-1b/__000_0.distcp"
    first = client.create_multipart_upload(Bucket=bucket, Key=resumed)
    client.upload_part(Bucket=bucket, Key=resumed, UploadId=first["UploadId"], PartNumber=1,
                       Body=b"r" * 10)  # fmt: skip
    clock.now += 5
    tree, _ = reader.read()
    assert tree.subdirs["step-1b"].file("__000_0.distcp") == (10, clock.now)
    client.abort_multipart_upload(Bucket=bucket, Key=resumed, UploadId=first["UploadId"])
    reader.read()
    parts = requests_of(reader)["list_parts"]
    clock.now += STALE_UPLOAD_SECONDS  # still since first seen: stale, and due once more
    reader.read()
    assert requests_of(reader)["list_parts"] == parts + MAX_UPLOADS_SIZED
    parts += MAX_UPLOADS_SIZED
    key = "job/step-2/__000_0.distcp"
    live = client.create_multipart_upload(Bucket=bucket, Key=key)
    client.upload_part(Bucket=bucket, Key=key, UploadId=live["UploadId"], PartNumber=1,
                       Body=b"y" * 1000)  # fmt: skip
    clock.now += 10
    tree, _ = reader.read()
    # One ListParts this read: the live upload's, though 100 others sort before it.
    assert requests_of(reader)["list_parts"] == parts + 1
    assert tree.subdirs["step-2"].file("__000_0.distcp") == (1000, clock.now)


@pytest.mark.slow  # a thousand requests to the server first
def test_an_upload_of_more_than_a_thousand_parts_is_sized_in_full(
    server: MotoServer, bucket: str
) -> None:
    """ListParts answers 1,000 parts a page: past the first page the size (and so the progress
    that keeps a save from being aborted) used to stand still."""
    client = server.client()
    key = "job/step-1/__0_0.distcp"
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    for number in range(1, 1003):
        client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=b"p")
    counter = RequestCounter()
    size = S3Store(bucket, {}, counter).uploaded_bytes(Upload(key, upload))
    assert size == 1002
    assert dict(counter.totals()[0]) == {"list_parts": 2}


def test_a_plain_http_endpoint_from_the_aws_config_file_is_refused_too(
    server: MotoServer, tmp_path: Path
) -> None:
    """botocore reads endpoint_url from ~/.aws/config by itself: the refusal looks at the
    endpoint the client will use, whatever named it, in any case."""
    from checkpoint_exporter.sources.object_store import StoreError

    config = tmp_path / "aws-config"
    config.write_text(f"[default]\nendpoint_url = {server.endpoint.upper()}\n")  # HTTP://...
    env = {"AWS_ALLOW_HTTP": "", "AWS_CONFIG_FILE": str(config)}
    with mock.patch.dict(os.environ, env), pytest.raises(StoreError) as raised:
        del os.environ["AWS_ENDPOINT_URL"]  # restored by patch.dict
        S3Store("bucket", {"region": "eu-north-1"}, RequestCounter())
    assert raised.value.code == "http_refused"
    assert "127.0.0.1" in raised.value.reason


def test_a_policy_without_the_uploads_permissions_still_reads_the_objects(
    server: MotoServer, bucket: str
) -> None:
    """s3:ListBucket and s3:GetObject granted, s3:ListBucketMultipartUploads not: the
    generations are read, and the error names what is not seen and why."""
    from checkpoint_exporter.sources.object_store import LIST_UPLOADS, StoreError

    class Denied(S3Store):
        def list_uploads(self, prefix: str, marker: object) -> object:
            raise StoreError(LIST_UPLOADS, "AccessDenied", "Access Denied (bucket b)")

    put(server, bucket, "job/step-1/__0_0.distcp", 10)
    put(server, bucket, "job/step-1/.metadata", 1)
    parsed = parse_object_url(f"s3://{bucket}/job")
    counter = RequestCounter()
    reader = ObjectTreeReader(parsed, Denied(parsed.bucket, {}, counter), counter, OpsBudget(),
                              layouts.ALL_CONTENT_FILES, clock=Clock())  # fmt: skip
    tree, stats = reader.read()
    assert tree is not None and tree.subdirs["step-1"].file("__0_0.distcp")[0] == 10
    assert stats.errors == [(
        "(uploads in flight)",
        "list_uploads: AccessDenied: Access Denied (bucket b): saves in progress are not seen",
    )]  # fmt: skip


def test_error_codes_are_bounded_label_values() -> None:
    counter = RequestCounter()
    counter.error("list", "SlowDown")
    counter.error("list", "<html>503 Service Unavailable</html>")  # what a proxy may answer
    for number in range(40):
        counter.error("get", f"Code{number}")
    codes = {code for _, code, _ in counter.totals()[1]}
    assert "SlowDown" in codes and "other" in codes
    assert len(codes) == 20  # MAX_ERROR_CODES, "other" among them
    assert all(len(code) <= 48 and "<" not in code for code in codes)


def test_the_markers_of_deleted_generations_are_let_go(server: MotoServer, bucket: str) -> None:
    """Orbax's _CHECKPOINT_METADATA is read in every step: a month of saves kept each one's
    bytes (up to 64 KiB) after retention deleted the step."""
    for step in (1, 2):
        put(server, bucket, f"job/{step}/_CHECKPOINT_METADATA", 20)
    reader = reader_of(f"s3://{bucket}/job")
    reader.read()
    assert len(reader._contents) == 2
    server.client().delete_object(Bucket=bucket, Key="job/1/_CHECKPOINT_METADATA")
    reader.read()
    assert [key for key, _, _ in reader._contents] == ["job/2/_CHECKPOINT_METADATA"]
