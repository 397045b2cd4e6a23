"""rules: the shipped rules, split by where they evaluate, over a cluster in the fleet shape.

DESIGN "Scopes and sharding": NODES nodes each run a ``--scope=node`` exporter (knowing, from its
spool, the jobs whose ranks ran on it: JOBS_PER_NODE of them, or every job) and one shard of
``--scope=shared`` scanners, REPLICAS replicas of it, reads the JOBS jobs' shared durable tiers.
Every node's exposition is what the exporter renders for a node-scope process (its spool clocks,
window telemetry and, for every third job, a node-local staging tier; nothing from the shared
trees); each replica's is what a shared-scope process renders (the jobs' generation series, no
spool). The whole exposition is scraped, histogram buckets included (dashboards read them), with
``cluster`` and ``instance`` labels added; ``ingest`` (INGEST) keeps less of the nodes' series. A
generator target serves the nodes as TARGETS targets (``honor_labels``) so Prometheus' parsing
uses both cores, and the replicas as two more. Prometheus evaluates alerts/split/ (the node
groups and the job groups) every 15 s. Reported: head series, bytes per scrape round, each rule
group's evaluation time over five rounds that began with every series in the head (median and
slowest, ``prometheus_rule_group_last_duration_seconds``), the slowest rules and Prometheus' RSS.
"""

from __future__ import annotations

import http.server
import json
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml
from prometheus_client import generate_latest

from checkpoint_exporter.config import Config, Policy
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.exposition.collectors import enabled_collectors
from checkpoint_exporter.exposition.metrics import build_registry
from checkpoint_exporter.model import (
    DURABLE,
    STAGING,
    DaemonState,
    FilesystemState,
    WatchedPath,
    WindowTelemetry,
)
from checkpoint_exporter.sources.spool import Event
from tests.helpers.synthetic import generations

REPO = Path(__file__).resolve().parent.parent
RULE_FILES = (
    REPO / "alerts" / "split" / "checkpoint-exporter-node.rules.yaml",
    REPO / "alerts" / "split" / "checkpoint-exporter-job.rules.yaml",
)
REPLICAS = 2
# What Prometheus keeps of the nodes' series (``metric_relabel_configs`` on the node-scope
# scrape; the shared replicas' series are all kept): everything, or only the families the rules
# read.
INGEST = ("everything", "node series the rules read")
_NAME = re.compile(r"checkpoint_[a-z_]+")
GENERATIONS = 10  # retained per job, as in the scrape bench
_SAVE_EVENTS = ("save_start", "resume", "staged", "written", "committed")
# Where the synthetic tiers live: the staging tier on a node's NVMe, the durable one on a
# parallel filesystem every node mounts.
LOCAL = FilesystemState("/nvme", "/dev/nvme0n1", "xfs", 4 * 10**12, 2 * 10**12, 0.2)
SHARED = FilesystemState("/ckpt", "lustre:/ckpt", "lustre", 10**16, 4 * 10**15, 0.2)


def _paths(name: str, two_tier: bool, scope: str) -> tuple[WatchedPath, ...]:
    """The job's tiers as a process of ``scope`` publishes them: a tier of the other scope is
    listed but never placed (no watch mode, no mountpoint) nor read here."""

    def tier(kind: str, filesystem: FilesystemState, mode: str, its_scope: str) -> WatchedPath:
        path = f"{filesystem.mountpoint}/{name}"
        if its_scope != scope:
            return WatchedPath(kind, path, scanned=False)
        return WatchedPath(kind, path, mode, filesystem.mountpoint)

    paths = [tier(DURABLE, SHARED, "poll", "shared")]
    if two_tier:
        paths.append(tier(STAGING, LOCAL, "inotify", "node"))
    return tuple(paths)


def _job(name: str, two_tier: bool, scope: str, now: float) -> JobTracker:
    """One instrumented job after a live save, seen by a process of ``scope``: a node reads its
    ranks' spool events and staging tier, a shared scanner the durable tier alone."""
    job = JobTracker(name, _paths(name, two_tier, scope), Policy())
    found = generations(GENERATIONS, now)
    if scope == "shared":
        job.observe(DURABLE, found[:-1], now - 1000)
        job.observe(DURABLE, found, now - 5)
    else:
        if two_tier:
            job.observe(STAGING, found[-2:], now - 1000)
        events = [
            Event(now - 40 + offset, event, name, GENERATIONS - 1, 0, 1, "node", None, None, None)
            for offset, event in enumerate(_SAVE_EVENTS)
        ]
        job.apply_events(events, now - 10)
    job.tick(now)
    if scope == "node":  # after the save is accounted, which clears the previous window's
        job.set_window_telemetry(WindowTelemetry(now - 40, now - 36, 1e9, 0.5, 2e9, 0.9, 0.3))
    return job


def exposition(jobs: int, scope: str, first: int = 0) -> list[str]:
    """Every line (no comments) a ``--scope=<scope>`` process exports for ``jobs`` jobs, named
    from ``job-<first>``."""
    now = time.time()
    tracker = Tracker(Config())
    for index in range(first, first + jobs):
        tracker.add(_job(f"job-{index}", index % 3 == 0, scope, now))
    read = [
        (job.name, path.tier, now)
        for job in (tracker.jobs[name].state() for name in tracker.jobs)
        for path in job.paths
        if path.scanned
    ]
    tracker.publish(
        daemon=DaemonState(ready=True, scan_success=tuple(read), shard_info=(0, 1, scope)),
        filesystems=(SHARED,) if scope == "shared" else (LOCAL,),
        telemetry=(("disk", True), ("gpu", True), ("network", True))
        if scope == "node"
        else (("disk", False), ("gpu", False), ("network", False)),
    )
    text = generate_latest(build_registry(lambda: tracker.snapshot, enabled_collectors({})))
    return [line for line in text.decode().splitlines() if line and not line.startswith("#")]


def _name(line: str) -> str:
    return re.split(r"[{ ]", line, maxsplit=1)[0]


def bucket_lines(lines: list[str]) -> int:
    return sum(1 for line in lines if _name(line).endswith("_bucket"))


def kept_names(lines: list[str], ingest: str) -> set[str]:
    """The names of the nodes' series that Prometheus keeps under ``ingest``."""
    names = {_name(line) for line in lines}
    if ingest == "node series the rules read":
        return names & set(_NAME.findall("".join(path.read_text() for path in RULE_FILES)))
    return names


def _relabel(kept: set[str]) -> list[dict[str, object]]:
    """Keep the nodes' series named ``kept`` and every series of the shared replicas."""
    regex = "(?:" + "|".join(sorted(kept)) + ");node-.*|[^;]*;shared-.*"
    return [{"source_labels": ["__name__", "instance"], "regex": regex, "action": "keep"}]


def _labelled(lines: list[str], instance: str) -> str:
    label = f'cluster="sim",instance="{instance}"'
    out = []
    for line in lines:
        name, brace, rest = line.partition("{")
        if brace:
            out.append(f"{name}{{{label},{rest}")
        else:
            metric, _, value = line.partition(" ")
            out.append(f"{metric}{{{label}}} {value}")
    return "\n".join(out) + "\n"


def metadata_walkers(rows: list[dict[str, object]], nodes: int, replicas: int) -> dict[str, float]:
    """Computed, not measured: the metadata bench's polled save on NFS (operations one walker
    spends on a 4,096-rank save, and its rate) times the number of processes that walk a shared
    tree: every node in the old shape, the shard's replicas in the new one."""
    row = next(r for r in rows if "NFS" in str(r["run"]))
    operations, rate = float(row["operations"]), float(row["ops_per_second_during_save"])
    return {
        "operations_per_save_per_walker": operations, "ops_per_second_per_walker": rate,
        "walkers_before": nodes, "walkers_after": replicas,
        "ops_per_second_before": rate * nodes, "ops_per_second_after": rate * replicas,
        "operations_per_save_before": operations * nodes,
        "operations_per_save_after": operations * replicas,
    }  # fmt: skip


class _Generator(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, bodies: list[bytes]):
        self.bodies = bodies
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Generator

    def do_GET(self) -> None:
        target = int(urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["target"][0])
        body = self.server.bodies[target]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def _rules_every_round(base: Path) -> list[Path]:
    """The shipped rule files, with every group evaluated each round: a group with an interval
    of its own (node.daily, every 5 minutes) would otherwise give too few rounds to time; its
    time per evaluation is what it costs, at 1/20th of the rounds of a 15 s group."""
    out = []
    for path in RULE_FILES:
        document = yaml.safe_load(path.read_text())
        for group in document["groups"]:
            group.pop("interval", None)
        (base / path.name).write_text(yaml.safe_dump(document))
        out.append(base / path.name)
    return out


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _self_metrics(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def _query(url: str, expr: str) -> float:
    reply = urllib.request.urlopen(
        f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=60
    )
    result = json.load(reply)["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


def _slowest_rules(url: str, count: int) -> list[tuple[str, float]]:
    """(alert or record name, its last evaluation seconds), slowest first."""
    reply = urllib.request.urlopen(f"{url}/api/v1/rules", timeout=60)
    rules = [rule for group in json.load(reply)["data"]["groups"] for rule in group["rules"]]
    timed = [(rule.get("name", "?"), float(rule.get("evaluationTime", 0))) for rule in rules]
    return sorted(timed, key=lambda item: -item[1])[:count]


def _by_group(own: dict[str, float], metric: str) -> dict[str, float]:
    """One of Prometheus' per-group metrics, keyed by the group's name."""
    return {
        re.search(r'rule_group="[^"]*;([^"]+)"', key).group(1): value  # type: ignore[union-attr]
        for key, value in own.items()
        if key.startswith(metric + "{")
    }


def bench_rules(
    nodes: int = 2048, jobs: int = 16, targets: int = 16, evaluation_interval: float = 15,
    rounds: int = 5, ingest: str = "everything", jobs_per_node: int | None = None,
) -> dict[str, object]:  # fmt: skip
    """``jobs_per_node``: the jobs each node's exporter knows from its spool (the jobs whose
    ranks ran there; node n carries the n-th group of that many), None for every job on every
    node, the worst case."""
    if ingest not in INGEST:
        raise ValueError(f"ingest: one of {', '.join(INGEST)} (got {ingest!r})")
    per_node = jobs if jobs_per_node is None else jobs_per_node
    if not 1 <= per_node <= jobs or jobs % per_node:
        raise ValueError(f"jobs_per_node: a divisor of {jobs} (got {jobs_per_node})")
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise RuntimeError("prometheus is not installed (make toolchain installs it)")
    groups = [exposition(per_node, "node", g * per_node) for g in range(jobs // per_node)]
    node_lines, shared_lines = groups[0], exposition(jobs, "shared")
    kept = kept_names([line for group in groups for line in group], ingest)
    kept_per_node = sum(1 for line in node_lines if _name(line) in kept)
    per_target = -(-nodes // targets)
    bodies = [
        "".join(_labelled(groups[n % len(groups)], f"node-{n}")
                for n in range(t * per_target, min(nodes, (t + 1) * per_target))).encode()
        for t in range(targets)
    ] + [_labelled(shared_lines, f"shared-{r}").encode() for r in range(REPLICAS)]  # fmt: skip
    generator = _Generator(bodies)
    threading.Thread(target=generator.serve_forever, daemon=True).start()
    base = Path(tempfile.mkdtemp(prefix="checkpoint-exporter-rules-"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    address = f"127.0.0.1:{generator.server_address[1]}"
    scrape = 2 * evaluation_interval
    config = {
        # Prometheus durations are whole numbers of a unit: milliseconds here.
        "global": {"scrape_interval": f"{scrape * 1000:.0f}ms",
                   "scrape_timeout": f"{scrape * 800:.0f}ms",
                   "evaluation_interval": f"{evaluation_interval * 1000:.0f}ms"},
        "rule_files": [str(path) for path in _rules_every_round(base)],
        # One target per body: the same address, ?target= set by __param_target; the rules
        # select job="checkpoint-exporter", which node and shared processes share.
        "scrape_configs": [{
            "job_name": "checkpoint-exporter", "honor_labels": True,
            "metric_relabel_configs": [] if ingest == "everything" else _relabel(kept),
            "static_configs": [{"targets": [address], "labels": {"__param_target": str(t)}}
                               for t in range(len(bodies))],
        }],
    }  # fmt: skip
    (base / "prometheus.yaml").write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [prometheus, f"--config.file={base / 'prometheus.yaml'}",
         f"--storage.tsdb.path={base / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(base / "prometheus.log").open("wb"),
    )  # fmt: skip
    expected = sum(
        sum(1 for line in groups[n % len(groups)] if _name(line) in kept) for n in range(nodes)
    ) + REPLICAS * len(shared_lines)
    # Each group's evaluation time in every round that began with every series in the head.
    durations: dict[str, list[float]] = {}
    seen: dict[str, float] | None = None  # each group's iterations when last looked at
    try:
        deadline = time.monotonic() + 900
        while True:
            time.sleep(min(2.0, evaluation_interval / 5))
            if process.poll() is not None:
                log = (base / "prometheus.log").read_text()[-2000:]
                raise RuntimeError(f"prometheus exited:\n{log}")
            if time.monotonic() > deadline:
                raise TimeoutError("Prometheus did not ingest and evaluate within 900 s")
            try:
                own = _self_metrics(url)
            except OSError:
                continue
            iterations = _by_group(own, "prometheus_rule_group_iterations_total")
            if not iterations or own.get("prometheus_tsdb_head_series", 0) < expected:
                continue  # rounds over part of the cluster would flatter the numbers
            if seen is not None:  # a round that ended since the last look began after it
                last = _by_group(own, "prometheus_rule_group_last_duration_seconds")
                for group, count in iterations.items():
                    if count > seen[group]:
                        durations.setdefault(group, []).append(last[group])
            seen = iterations
            if len(durations) == len(iterations) and min(map(len, durations.values())) >= rounds:
                break
        scrape_seconds = _query(url, 'max(scrape_duration_seconds{job="checkpoint-exporter"})')
        slowest = _slowest_rules(url, 5)
    finally:
        process.terminate()
        process.wait(timeout=60)
        generator.shutdown()
        shutil.rmtree(base, ignore_errors=True)
    return {
        "nodes": nodes, "jobs": jobs, "replicas": REPLICAS, "ingest": ingest,
        "jobs_per_node": per_node,
        "series_per_node": len(node_lines), "series_per_replica": len(shared_lines),
        "bucket_series_per_node": bucket_lines(node_lines),
        "series_kept_per_node": kept_per_node,
        "head_series": own["prometheus_tsdb_head_series"],
        "exposition_mb": sum(len(b) for b in bodies) / 1e6,
        "rule_groups_seconds": {g: statistics.median(d) for g, d in sorted(durations.items())},
        "rule_groups_max_seconds": {g: max(d) for g, d in sorted(durations.items())},
        "rule_group_interval_seconds": evaluation_interval,
        "prometheus_rss_mb": own["process_resident_memory_bytes"] / 1e6,
        "scrape_seconds_per_target": scrape_seconds, "targets": targets,
        "slowest_rules": slowest,
    }  # fmt: skip
