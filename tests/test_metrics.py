"""The collector wrapper: one broken or empty source never fails the scrape."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from checkpoint_exporter import metrics
from checkpoint_exporter.collectors import REGISTRY, enabled_collectors
from checkpoint_exporter.config import parse_config
from checkpoint_exporter.model import Snapshot
from checkpoint_exporter.tracker import Tracker


class Broken(metrics.SnapshotCollector):
    name = "broken"

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        yield GaugeMetricFamily("checkpoint_partial", "half-built", value=1)
        raise RuntimeError("device vanished")


class Empty(metrics.SnapshotCollector):
    name = "gpu"

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        raise metrics.NoDataError("NVML library not found")


def render(collectors: list[metrics.SnapshotCollector], snapshot: Snapshot) -> str:
    return generate_latest(metrics.build_registry(lambda: snapshot, collectors)).decode()


def test_failures_and_no_data_are_isolated(tmp_path: Path, caplog) -> None:
    (tmp_path / "a").mkdir()
    tracker = Tracker(parse_config("jobs: [{name: a, path: a}]\n", "t.yaml", tmp_path))
    text = render([Broken(), Empty(), *enabled_collectors({})], tracker.publish())
    assert 'checkpoint_exporter_scrape_collector_success{collector="broken"} 0.0' in text
    assert 'checkpoint_exporter_scrape_collector_success{collector="gpu"} 0.0' in text
    assert 'checkpoint_exporter_scrape_collector_success{collector="jobs"} 1.0' in text
    assert 'checkpoint_deadline_seconds{training_job="a"} 60.0' in text
    assert "checkpoint_partial" not in text  # a failed collector's half-built output is dropped
    for name in ("broken", "gpu", "jobs"):
        assert re.search(
            rf'checkpoint_exporter_scrape_collector_duration_seconds{{collector="{name}"}} \d', text
        )
    assert "device vanished" in caplog.text  # a failure is logged at error level ...
    assert "NVML library not found" not in caplog.text  # ... no data only at debug level


def test_collectors_can_be_switched_off() -> None:
    assert [c.name for c in enabled_collectors({})] == [
        name for name, entry in sorted(REGISTRY.items()) if entry.enabled_by_default
    ]
    assert "jobs" not in [c.name for c in enabled_collectors({"jobs": False})]


def test_each_spec_is_spelled_once_and_named_by_convention() -> None:
    names = [spec.name for spec in metrics.ALL]
    assert len(names) == len(set(names))
    for spec in metrics.ALL:
        assert re.fullmatch(r"checkpoint_[a-z0-9_]+", spec.name)
        assert "job" not in spec.labels  # Prometheus' target label is never ours to set
        if spec.kind == "counter":
            assert spec.name.endswith("_total")
        assert spec.help.endswith(".")
    assert "`checkpoint_deadline_seconds`" in metrics.reference_table()


def test_scrape_does_no_io(tmp_path: Path) -> None:
    """The scrape renders the snapshot only: removing the watched directory changes nothing."""
    (tmp_path / "a").mkdir()
    tracker = Tracker(parse_config("jobs: [{name: a, path: a}]\n", "t.yaml", tmp_path))
    snapshot = tracker.publish()
    before = render(enabled_collectors({}), snapshot)
    (tmp_path / "a").rmdir()
    after = render(enabled_collectors({}), snapshot)
    strip = re.compile(r"^checkpoint_exporter_scrape_collector_duration_seconds.*$", re.M)
    assert strip.sub("", before) == strip.sub("", after)


def test_an_unchanged_snapshot_is_rendered_once(tmp_path: Path) -> None:
    from prometheus_client.exposition import generate_latest

    from checkpoint_exporter.config import WebConfig
    from checkpoint_exporter.model import DURABLE
    from checkpoint_exporter.server import MetricsServer

    (tmp_path / "a").mkdir()
    tracker = Tracker(parse_config("jobs: [{name: a, path: a}]\n", "t.yaml", tmp_path))
    first = tracker.publish()
    assert tracker.publish() is first  # nothing changed: the same snapshot
    registry = metrics.build_registry(lambda: tracker.snapshot, enabled_collectors({}))
    server = MetricsServer(WebConfig("127.0.0.1:0"), registry, lambda: tracker.snapshot)
    try:
        body = server.render(generate_latest, "text/plain")
        assert server.render(generate_latest, "text/plain") is body
        tracker.jobs["a"].observe(DURABLE, [], 0.0)  # a scan: the job's state is rebuilt
        assert tracker.publish() is not first
        assert server.render(generate_latest, "text/plain") is not body
    finally:
        server.stop()


def _without_durations(body: bytes) -> bytes:
    """Scrape durations differ between any two renders; everything else must not."""
    return b"\n".join(
        line
        for line in body.split(b"\n")
        if not line.startswith(b"checkpoint_exporter_scrape_collector_duration_seconds{")
    )


def test_incremental_rendering_is_byte_identical_to_prometheus_client() -> None:
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

    from checkpoint_exporter.exposition import Renderer
    from checkpoint_exporter.model import DURABLE
    from tests.helpers.synthetic import generations, synthetic_tracker

    names = ['quote"job', "back\\slash", "new\nline", "plain", "carriage\rreturn"]
    tracker = synthetic_tracker(6, 4, names)
    collectors = [Broken(), *enabled_collectors({})]
    registry = metrics.build_registry(lambda: tracker.snapshot, collectors)
    renderer = Renderer(lambda: tracker.snapshot, collectors)
    per_job = sum(1 for c in collectors if c.per_job)

    def same() -> None:
        for encoder in (generate_latest, openmetrics):
            assert _without_durations(renderer.render(encoder)) == _without_durations(
                encoder(registry)
            ), encoder.__module__

    same()
    rendered = renderer.jobs_rendered
    assert rendered == 2 * 6 * per_job  # every job once per encoder
    same()
    assert renderer.jobs_rendered == rendered  # nothing changed: nothing rendered again

    # One job commits a new generation: only that job is rendered again.
    job = tracker.jobs["plain"]
    job.observe(DURABLE, generations(5, 2e9), 2e9)
    tracker.publish()
    same()
    assert renderer.jobs_rendered == rendered + 2 * per_job
    # Telemetry going away changes what the window collectors say for every job.
    tracker.publish(telemetry=(("disk", False), ("gpu", True), ("network", True)))
    same()
    tracker.forget("plain")
    tracker.publish()
    same()
    assert b'training_job="plain"' not in renderer.render(generate_latest)
