"""The metric reference, and a prometheus_client registry for the few places that need one.

A metric's spec lives beside the collector that fills it (``collectors/<name>.py``, one module
per ``--collector.<name>``); the shared machinery is in ``collectors/base.py`` and the list of
every spec is ``collectors.ALL_SPECS``. Scrapes are rendered by ``exposition.Renderer``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client.registry import CollectorRegistry

from checkpoint_exporter.errors import NoDataError
from checkpoint_exporter.exposition.collectors import REGISTRY
from checkpoint_exporter.exposition.collectors.base import RENDERER_SPECS, SnapshotCollector
from checkpoint_exporter.exposition.renderer import Renderer, runtime_registry
from checkpoint_exporter.model import Snapshot

__all__ = ["NoDataError", "build_registry", "reference_table"]


def build_registry(
    snapshot: Callable[[], Snapshot],
    collectors: Sequence[SnapshotCollector],
    runtime_metrics: bool = False,
) -> CollectorRegistry:
    """The renderer's families in a fresh registry, for prometheus_client's own
    ``generate_latest`` (the rules benchmark, the scrape benchmark's every-series baseline)."""
    registry = CollectorRegistry()
    registry.register(
        Renderer(snapshot, collectors, runtime_registry() if runtime_metrics else None)
    )
    return registry


def reference_table() -> str:
    """The Markdown table of every metric, for docs/metrics.md: each with the collector that
    fills it and the file where its spec and its value are written."""
    owners = [("always", "exposition/renderer.py", RENDERER_SPECS)] + [
        (f"`{name}`", _source(entry.factory), entry.factory.specs)
        for name, entry in REGISTRY.items()
    ]
    rows = ["| name | type | labels | collector | meaning |", "|---|---|---|---|---|"]
    for collector, source, specs in owners:
        for spec in specs:
            labels = ", ".join(f"`{label}`" for label in spec.labels) or "—"
            rows.append(
                f"| `{spec.name}` | {spec.kind} | {labels} | {collector} ({source}) | {spec.help} |"
            )
    return "\n".join(rows) + "\n"


def _source(collector: type[SnapshotCollector]) -> str:
    """The collector's module as a path below the package: exposition/collectors/jobs.py."""
    return collector.__module__.removeprefix("checkpoint_exporter.").replace(".", "/") + ".py"
