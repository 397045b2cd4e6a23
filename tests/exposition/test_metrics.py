"""The one render path: isolation of broken collectors, incremental rendering byte-identical to
prometheus_client's encoders, the runtime metrics, specs beside their collectors."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
from prometheus_client.registry import CollectorRegistry

from checkpoint_exporter.config import parse_config
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.exposition import metrics
from checkpoint_exporter.exposition.collectors import ALL_SPECS, REGISTRY, enabled_collectors
from checkpoint_exporter.exposition.collectors.base import NoDataError, SnapshotCollector
from checkpoint_exporter.exposition.renderer import MAX_ENCODERS, Renderer, runtime_registry
from checkpoint_exporter.model import (
    DURABLE,
    DaemonState,
    FilesystemState,
    HistogramState,
    ObjectStoreUsage,
    Snapshot,
)
from tests.conftest import parse_samples
from tests.helpers.synthetic import generations, synthetic_tracker


class Broken(SnapshotCollector):
    name = "broken"

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        yield GaugeMetricFamily("checkpoint_partial", "half-built", value=1)
        raise RuntimeError("device vanished")


class Empty(SnapshotCollector):
    name = "gpu"

    def collect(self, snapshot: Snapshot) -> Iterable[Metric]:
        raise NoDataError("NVML library not found")


def render(collectors: list[SnapshotCollector], snapshot: Snapshot) -> str:
    return Renderer(lambda: snapshot, collectors).render(generate_latest).decode()


def versioned(snapshot: Snapshot, versions: dict[str, int]) -> Snapshot:
    """The snapshot with each job's version set, as the core sets it on every change."""
    jobs = tuple(replace(job, version=versions[job.name]) for job in snapshot.jobs)
    return replace(snapshot, jobs=jobs)


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
    names = [spec.name for spec in ALL_SPECS]
    assert len(names) == len(set(names))
    for spec in ALL_SPECS:
        assert re.fullmatch(r"checkpoint_[a-z0-9_]+", spec.name)
        assert "job" not in spec.labels  # Prometheus' target label is never ours to set
        if spec.kind == "counter":
            assert spec.name.endswith("_total")
        assert spec.help.endswith(".")
    table = metrics.reference_table()
    assert table.count("\n| `checkpoint_") == len(ALL_SPECS)
    assert (
        "| `checkpoint_deadline_seconds` | gauge | `training_job` | "
        "`jobs` (exposition/collectors/jobs.py) |" in table
    )


def test_a_metric_is_born_in_the_module_that_spells_it() -> None:
    """From a metric's name, one hop: the module that defines its spec is the one whose
    collector fills it, and a collector yields only the specs it declares."""
    tracker = synthetic_tracker(3, 2)
    snapshot = replace(
        tracker.snapshot,
        daemon=DaemonState(scans=HistogramState((1.0,), (1, 0), 0.5), ready=True,
                           first_scans=(("job-0", DURABLE, True, 5),), mounts=(("/ckpt", False),),
                           scan_success=(("job-0", DURABLE, 1.0),),
                           config_reload_success_time=1.0, shard_info=(0, 2, "shared"),
                           spool_writable=True,
                           object_stores=(("job-0", ObjectStoreUsage(
                               (("list", 3),), (("list", "SlowDown", 1),), 1, 5, 1.0)),)),
        filesystems=(FilesystemState("/ckpt", "dev", "xfs", 10, 5, 0.2),),
    )  # fmt: skip
    for name, entry in REGISTRY.items():
        module = inspect.getmodule(entry.factory)
        defined = {
            node.targets[0].id
            for node in ast.parse(inspect.getsource(module)).body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", "") == "MetricSpec"
        }  # fmt: skip
        declared = {spec.name for spec in entry.factory.specs}
        assert {getattr(module, variable).name for variable in defined} >= declared, name
        collected = {family.name for family in entry.factory().collect(snapshot)}
        # prometheus_client drops a counter's _total from the family name.
        assert collected == {n.removesuffix("_total") for n in declared}, name


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
    (tmp_path / "a").mkdir()
    tracker = Tracker(parse_config("jobs: [{name: a, path: a}]\n", "t.yaml", tmp_path))
    first = tracker.publish()
    assert tracker.publish() is first  # nothing changed: the same snapshot
    renderer = Renderer(lambda: tracker.snapshot, enabled_collectors({}))
    body = renderer.render(generate_latest)
    assert renderer.render(generate_latest) == body
    assert renderer.bodies_rendered == 1
    tracker.jobs["a"].observe(DURABLE, [], 0.0)  # a scan: the job's state is rebuilt
    assert tracker.publish() is not first
    renderer.render(generate_latest)
    assert renderer.bodies_rendered == 2


def test_every_scrape_s_own_encoder_hits_the_same_caches(tmp_path: Path) -> None:
    """prometheus_client (0.26) answers an OpenMetrics Accept header with a new
    functools.partial on every request: keyed by the object, the renderer's caches grew with
    every scrape (about 240 MB an hour in the demo) and never hit. Equal encoders share one
    entry, and a scraper cycling through Accept variants cannot grow them without bound."""
    (tmp_path / "a").mkdir()
    tracker = Tracker(parse_config("jobs: [{name: a, path: a}]\n", "t.yaml", tmp_path))
    tracker.publish()
    renderer = Renderer(lambda: tracker.snapshot, enabled_collectors({}))
    accept = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    bodies = {renderer.render(choose_encoder(accept)[0]) for _ in range(20)}
    assert len(bodies) == 1 and renderer.bodies_rendered == 1
    for minor in range(50):  # hostile: a new encoder per request, each one different
        variant = f"application/openmetrics-text; version=1.{minor}.0"
        renderer.render(choose_encoder(variant)[0])
    assert renderer.cached_encoders() <= MAX_ENCODERS


def _without_durations(body: bytes) -> bytes:
    """Scrape durations differ between any two renders; everything else must not."""
    return b"\n".join(
        line
        for line in body.split(b"\n")
        if not line.startswith(b"checkpoint_exporter_scrape_collector_duration_seconds{")
    )


def test_incremental_rendering_is_byte_identical_to_prometheus_client() -> None:
    names = ['quote"job', "back\\slash", "new\nline", "plain", "carriage\rreturn"]
    tracker = synthetic_tracker(6, 4, names)
    versions = dict.fromkeys(tracker.jobs, 1)
    current = [versioned(tracker.snapshot, versions)]
    collectors = [Broken(), *enabled_collectors({})]
    renderer = Renderer(lambda: current[0], collectors)
    registry = CollectorRegistry()
    registry.register(Renderer(lambda: current[0], collectors))  # every family, every time
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

    # One job commits a new generation and its version moves: only that job is rendered again.
    tracker.jobs["plain"].observe(DURABLE, generations(5, 2e9), 2e9)
    versions["plain"] += 1
    current[0] = versioned(tracker.publish(), versions)
    same()
    assert renderer.jobs_rendered == rendered + 2 * per_job
    # Telemetry going away changes what the window collectors say for every job.
    current[0] = versioned(
        tracker.publish(telemetry=(("disk", False), ("gpu", True), ("network", True))), versions
    )
    same()
    tracker.forget("plain")
    del versions["plain"]
    current[0] = versioned(tracker.publish(), versions)
    same()
    assert b'training_job="plain"' not in renderer.render(generate_latest)


def test_a_job_is_rendered_again_when_its_version_moves_not_when_its_object_does() -> None:
    tracker = synthetic_tracker(2, 2)
    snapshot = versioned(tracker.snapshot, {"job-0": 7, "job-1": 7})
    current = [snapshot]
    renderer = Renderer(lambda: current[0], enabled_collectors({}))
    renderer.render(generate_latest)
    rendered = renderer.jobs_rendered
    # Equal states rebuilt as new objects (a publish that changed nothing): same version, kept.
    current[0] = replace(snapshot, jobs=tuple(replace(job) for job in snapshot.jobs))
    renderer.render(generate_latest)
    assert renderer.jobs_rendered == rendered
    # The core raised job-1's version: job-1 alone is rendered again, with its new values.
    job = replace(snapshot.jobs[1], version=8, deadline_seconds=123.0)
    current[0] = replace(snapshot, jobs=(snapshot.jobs[0], job))
    text = renderer.render(generate_latest).decode()
    assert renderer.jobs_rendered == rendered + sum(c.per_job for c in enabled_collectors({}))
    assert 'checkpoint_deadline_seconds{training_job="job-1"} 123.0' in text
    # Version 0 is a state nobody versioned: never reused.
    current[0] = versioned(snapshot, {"job-0": 0, "job-1": 0})
    renderer.render(generate_latest)
    again = renderer.jobs_rendered
    current[0] = replace(current[0])  # another snapshot, the same versions
    renderer.render(generate_latest)
    assert renderer.jobs_rendered > again


class _FixedRuntime:
    """A runtime collector with fixed values, so its bytes can be compared."""

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily("process_open_fds", "Number of open file descriptors.", value=7)
        yield GaugeMetricFamily("python_info", "Python platform information", value=1)


def test_runtime_metrics_go_through_the_same_encoders() -> None:
    tracker = synthetic_tracker(2, 2)
    current = [versioned(tracker.snapshot, {"job-0": 1, "job-1": 1})]
    runtime = CollectorRegistry()
    runtime.register(_FixedRuntime())
    collectors = enabled_collectors({})
    renderer = Renderer(lambda: current[0], collectors, runtime)
    # prometheus_client with the exporter and the runtime collectors in one registry.
    registry = CollectorRegistry()
    registry.register(Renderer(lambda: current[0], collectors))
    registry.register(_FixedRuntime())
    for encoder in (generate_latest, openmetrics):
        body = renderer.render(encoder)
        assert _without_durations(body) == _without_durations(encoder(registry))
        assert body.count(b"# EOF") == (encoder is openmetrics)
    # The real ones: process and Python metrics, fresh on each scrape, after the exporter's.
    live = Renderer(lambda: current[0], collectors, runtime_registry())
    text = live.render(generate_latest).decode()
    assert "process_resident_memory_bytes" in text and "python_gc_objects_collected_total" in text
    assert text.index("checkpoint_exporter_scrape_collector_success") < text.index("process_")
    first_cpu = parse_samples(text)["process_cpu_seconds_total"]
    sum(i * i for i in range(300_000))  # burn some CPU
    assert parse_samples(live.render(generate_latest).decode())["process_cpu_seconds_total"] > (
        first_cpu
    )


def test_the_registry_adapter_yields_what_the_renderer_renders() -> None:
    """metrics.build_registry, for what needs a prometheus_client registry (generate_latest in
    the benchmarks), renders the same families."""
    tracker = synthetic_tracker(2, 2)
    snapshot = versioned(tracker.snapshot, {"job-0": 1, "job-1": 1})
    collectors = enabled_collectors({})
    assert _without_durations(
        generate_latest(metrics.build_registry(lambda: snapshot, collectors))
    ) == _without_durations(Renderer(lambda: snapshot, collectors).render(generate_latest))
    with_runtime = generate_latest(metrics.build_registry(lambda: snapshot, collectors, True))
    assert b"process_resident_memory_bytes" in with_runtime


def test_the_daemon_health_series() -> None:
    daemon = DaemonState(
        ready=False,
        first_scans=(("a", "durable", True, 120), ("a", "staging", False, 40)),
        mounts=(("/mnt/nfs", True), ("/local", False)),
        scan_success=(("a", "durable", 1_800_000_000.5),),
        config_reload_successful=False,
        config_reload_success_time=1_799_999_000.0,
    )
    filesystems = (
        FilesystemState("/mnt/nfs", "filer:/x", "nfs4", 100, 40, 0.2, device_error=True),
        FilesystemState("/local", "/dev/nvme0n1", "xfs", 100, 40, 0.2),
    )
    got = parse_samples(render(enabled_collectors({}), Snapshot((), daemon, filesystems)))
    assert got["checkpoint_exporter_ready"] == 0
    assert 'checkpoint_exporter_first_scan_done{tier="durable",training_job="a"}' not in got
    assert got['checkpoint_exporter_first_scan_done{tier="staging",training_job="a"}'] == 0
    assert got['checkpoint_exporter_first_scan_entries{tier="staging",training_job="a"}'] == 40
    assert got['checkpoint_exporter_mount_stuck{mountpoint="/mnt/nfs"}'] == 1
    assert got['checkpoint_exporter_mount_stuck{mountpoint="/local"}'] == 0
    assert (
        got['checkpoint_exporter_last_scan_timestamp_seconds{tier="durable",training_job="a"}']
        == 1_800_000_000.5
    )
    assert got["checkpoint_exporter_config_last_reload_successful"] == 0
    assert got["checkpoint_exporter_config_last_reload_success_timestamp_seconds"] == 1_799_999_000
    fs = 'device="{}",fstype="{}",mountpoint="{}"'
    assert (
        got[f"checkpoint_filesystem_device_error{{{fs.format('filer:/x', 'nfs4', '/mnt/nfs')}}}"]
        == 1
    )
    assert (
        got[f"checkpoint_filesystem_device_error{{{fs.format('/dev/nvme0n1', 'xfs', '/local')}}}"]
        == 0
    )
    ready = replace(daemon, ready=True, config_reload_successful=True)
    got = parse_samples(render(enabled_collectors({}), Snapshot((), ready, filesystems)))
    assert got["checkpoint_exporter_ready"] == 1
    assert got["checkpoint_exporter_config_last_reload_successful"] == 1


def test_a_job_added_again_is_never_served_its_predecessors_lines() -> None:
    """A reload or discovery removes a job and adds it back changed: the new tracker's versions
    must never meet the old one's, or the render cache serves the old job's lines."""
    from checkpoint_exporter.config import Config, Policy
    from checkpoint_exporter.core.tracker import JobTracker
    from checkpoint_exporter.model import DURABLE, WatchedPath

    watched = (WatchedPath(DURABLE, "/ckpt/a"),)
    placed = (WatchedPath(DURABLE, "/ckpt/a", "inotify", "/ckpt"),)
    tracker = Tracker(Config())
    old = JobTracker("a", watched, Policy(deadline=60.0))
    old.set_paths(placed)  # one change, as placing a tier makes
    tracker.add(old)
    tracker.publish()
    renderer = Renderer(lambda: tracker.snapshot, enabled_collectors({}))
    assert (
        'checkpoint_deadline_seconds{training_job="a"} 60.0'
        in renderer.render(generate_latest).decode()
    )
    tracker.forget("a")
    new = JobTracker("a", watched, Policy(deadline=90.0))
    new.set_paths(placed)  # the same history of changes as its predecessor
    tracker.add(new)
    tracker.publish()
    assert new.version != old.version
    assert (
        'checkpoint_deadline_seconds{training_job="a"} 90.0'
        in renderer.render(generate_latest).decode()
    )
