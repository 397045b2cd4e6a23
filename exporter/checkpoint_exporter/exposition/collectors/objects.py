"""``--collector.objects``: object storage behind watched paths -- the requests each job's
reads make (object stores bill by request), the ones that failed by the store's error code, and
the multipart uploads left open under its prefix (they cost storage until a lifecycle rule
aborts them)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from checkpoint_exporter.exposition.collectors.base import MetricSpec, SnapshotCollector
from checkpoint_exporter.model import Snapshot

OBJECT_STORE_REQUESTS = MetricSpec(
    "checkpoint_object_store_requests_total",
    "counter",
    "Requests made to the object store to read a job's checkpoints, by operation (list, get, "
    "head, list_uploads, list_parts), retries included.",
    ("training_job", "operation"),
)
OBJECT_STORE_REQUEST_ERRORS = MetricSpec(
    "checkpoint_object_store_request_errors_total",
    "counter",
    "Object-store requests that failed, by operation and the store's error code "
    "(NoSuchBucket, AccessDenied, SlowDown, unreachable, ...).",
    ("training_job", "operation", "code"),
)
OBJECT_STORE_INCOMPLETE_UPLOADS = MetricSpec(
    "checkpoint_object_store_incomplete_uploads",
    "gauge",
    "Multipart uploads open under the job's prefix: saves in progress, or interrupted ones "
    "that keep costing storage until a lifecycle rule aborts them.",
    ("training_job",),
)
OBJECT_STORE_INCOMPLETE_UPLOAD_BYTES = MetricSpec(
    "checkpoint_object_store_incomplete_upload_bytes",
    "gauge",
    "Bytes of the parts uploaded to the open multipart uploads, where the store tells.",
    ("training_job",),
)
OBJECT_STORE_OLDEST_INCOMPLETE_UPLOAD = MetricSpec(
    "checkpoint_object_store_oldest_incomplete_upload_timestamp_seconds",
    "gauge",
    "When the oldest open multipart upload was first seen, or last grew (the exporter's clock: "
    "stores report fixed or drifting start times).",
    ("training_job",),
)


class ObjectsCollector(SnapshotCollector):
    name = "objects"
    specs = (
        OBJECT_STORE_REQUESTS, OBJECT_STORE_REQUEST_ERRORS, OBJECT_STORE_INCOMPLETE_UPLOADS,
        OBJECT_STORE_INCOMPLETE_UPLOAD_BYTES, OBJECT_STORE_OLDEST_INCOMPLETE_UPLOAD,
    )  # fmt: skip

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        stores = snapshot.daemon.object_stores
        if not stores:
            return []  # no job keeps its checkpoints in object storage
        requests, errors, uploads, upload_bytes, oldest = (spec.family() for spec in self.specs)
        for job, usage in stores:
            for operation, count in usage.requests:
                requests.add_metric([job, operation], count)
            for operation, code, count in usage.errors:
                errors.add_metric([job, operation, code], count)
            uploads.add_metric([job], usage.incomplete_uploads)
            if usage.incomplete_upload_bytes is not None:
                upload_bytes.add_metric([job], usage.incomplete_upload_bytes)
            if usage.oldest_incomplete_upload is not None:
                oldest.add_metric([job], usage.oldest_incomplete_upload)
        return [requests, errors, uploads, upload_bytes, oldest]
