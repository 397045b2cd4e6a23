"""The object store behind an object URL, by its scheme: each store module (sources/s3.py,
sources/gcs.py, sources/azure.py) says which worker serves a bucket and opens the tree reader of
one tier; the daemon asks here and never names a cloud."""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

from checkpoint_exporter.sources import azure, gcs, s3
from checkpoint_exporter.sources.listing import OpsBudget
from checkpoint_exporter.sources.objects import ObjectTreeReader, RequestCounter
from checkpoint_exporter.storage_url import ObjectURL

_BY_SCHEME: dict[str, ModuleType] = {"s3": s3, "gs": gcs, "az": azure}


def store_key(url: ObjectURL, options: Mapping[str, Any]) -> str:
    """The worker a tier is read on: one per store endpoint and bucket (or container), so a slow
    store holds up only the jobs kept in it."""
    return str(_BY_SCHEME[url.scheme].store_key(url.bucket, options))


def open_reader(
    url: ObjectURL,
    options: Mapping[str, Any],
    budget: OpsBudget,
    counter: RequestCounter,
    **reader: Any,
) -> ObjectTreeReader:
    """The tree reader of one object tier (on its worker: making a client may read files),
    counting its requests in ``counter``, which outlives it."""
    module = _BY_SCHEME[url.scheme]
    opened: ObjectTreeReader = module.open_reader(url, options, budget, counter, **reader)
    return opened
