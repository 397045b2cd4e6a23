"""PLACEHOLDER until the gcs store lands: every request is refused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from checkpoint_exporter.sources.listing import OpsBudget
from checkpoint_exporter.sources.objects import (
    LIST,
    ObjectTreeReader,
    RefusedStore,
    RequestCounter,
    StoreError,
)
from checkpoint_exporter.storage_url import ObjectURL


def store_key(bucket: str, options: Mapping[str, Any]) -> str:
    return f"gcs://{bucket}"


def open_reader(
    url: ObjectURL,
    options: Mapping[str, Any],
    budget: OpsBudget,
    counter: RequestCounter,
    **reader: Any,
) -> ObjectTreeReader:
    store = RefusedStore(StoreError(LIST, "not_implemented", "gcs:// is not read yet"))
    return ObjectTreeReader(url, store, counter, budget, **reader)
