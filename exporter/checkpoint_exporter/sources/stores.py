"""The object store behind an object URL, by its scheme: each store module (sources/s3.py,
sources/gcs.py, sources/azure.py) says which worker serves a bucket and makes the store of one
tier; the daemon and the restore drill ask here and never name a cloud."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from checkpoint_exporter.sources import azure, gcs, s3
from checkpoint_exporter.sources.listing import OpsBudget
from checkpoint_exporter.sources.object_store import (
    LIST,
    ObjectStore,
    RefusedStore,
    RequestCounter,
    StoreError,
)
from checkpoint_exporter.sources.objects import ObjectTreeReader
from checkpoint_exporter.storage_url import ObjectURL


@dataclass(frozen=True)
class Kind:
    module: ModuleType  # its store_key(bucket, options)
    store: Callable[[str, Mapping[str, Any], RequestCounter], ObjectStore]
    extra: str  # pip install checkpoint-exporter[extra]
    requires: tuple[str, ...]  # what that extra installs, by module name


_BY_SCHEME = {
    "s3": Kind(s3, s3.S3Store, "s3", ("botocore",)),
    "gs": Kind(gcs, gcs.GCSStore, "gcs", ("google.auth", "urllib3")),
    "az": Kind(azure, azure.AzureStore, "azure", ("azure.storage.blob",)),
}


def store_key(url: ObjectURL, options: Mapping[str, Any]) -> str:
    """The worker a tier is read on: one per store endpoint and bucket (or container), so a slow
    store holds up only the jobs kept in it."""
    return str(_BY_SCHEME[url.scheme].module.store_key(url.bucket, options))


def open_reader(
    url: ObjectURL,
    options: Mapping[str, Any],
    budget: OpsBudget,
    counter: RequestCounter,
    **reader: Any,
) -> ObjectTreeReader:
    """The tree reader of one object tier (on its worker: making a client may read files),
    counting its requests in ``counter``, which outlives it. A store that cannot be made (its
    extra not installed, plain HTTP refused) fails every request with the reason, which the job
    reports on every read like any other store error."""
    kind = _BY_SCHEME[url.scheme]
    store: ObjectStore
    missing = [name for name in kind.requires if not _installed(name)]
    if missing:
        reason = f"{', '.join(missing)} missing: install checkpoint-exporter[{kind.extra}]"
        store = RefusedStore(StoreError(LIST, "not_installed", reason))
    else:
        try:
            store = kind.store(url.bucket, options, counter)
        except StoreError as error:
            store = RefusedStore(error)
    return ObjectTreeReader(url, store, counter, budget, **reader)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False
