"""The checkpoint window on the dashboards, proven against a real Prometheus.

A loopback HTTP server plays three targets: the checkpoint exporters of two training nodes (a
scripted timeline of saves: one of a few seconds, one shorter than a scrape, one abandoned), and
the nodes' node_exporter and dcgm-exporter, which are stand-ins exposing only the metric names
the dashboards read (the real ones are not installed here, and their series are theirs, not
ours). A third host exports node and GPU series but runs no training job: its series must not
appear. Prometheus scrapes them every 500 ms and evaluates the generated rules.

Two more clusters are the same nodes on Kubernetes, as each Prometheus Operator flavour labels
them: the exporters with the `node` their ServiceMonitor adds and their host-network address as
instance, a shared scanner on the idle node; node_exporter as kube-prometheus scrapes it (its
instance relabelled to the node name) and as kube-prometheus-stack does (the node's IP and port);
dcgm-exporter as the GPU Operator runs it (a pod address, the node name as Hostname).

Every dashboard query must parse; the window, symptom and interval panels must return series; and
the save-window annotation, run as Grafana runs it (a range query at the panel's step, then
Grafana's merging of samples into regions, ported below), must draw each committed save exactly
from its start to its durable commit.
"""

from __future__ import annotations

import json
import math
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from checkpoint_exporter.mixin import dashboards
from checkpoint_exporter.mixin.config import MixinConfig, load_mixin
from checkpoint_exporter.mixin.generate import KUBERNETES
from tests.conftest import REPO, require_tool, wait_for
from tests.helpers.alerting import free_port, query, stop

pytestmark = [pytest.mark.prometheus]

RULES = REPO / "alerts" / "checkpoint-exporter.rules.yaml"
JOB = "llama"
JOB_NODES = ("gpu1", "gpu2")  # run the job: their exporters know it
IDLE_NODE = "idle9"  # node_exporter and dcgm-exporter only
STATIC = "w"  # the cluster of static targets: instance is host:port everywhere
KUBE_PROMETHEUS, KUBE_PROMETHEUS_STACK = "kube-prometheus", "kube-prometheus-stack"
STACKS = (KUBE_PROMETHEUS, KUBE_PROMETHEUS_STACK)
NODE_IPS = {"gpu1": "10.0.0.1", "gpu2": "10.0.0.2", IDLE_NODE: "10.0.0.9"}
# Container ends that repeat the node's bytes (and lo): the NIC panel leaves them out.
VIRTUAL_DEVICES = ("lo", "veth3f2a91c", "cali9b1c0d2e", "docker0", "cni0", "flannel.1")


@dataclass(frozen=True)
class Save:
    start: float  # seconds after the timeline's origin
    end: float
    committed: bool = True


# Far enough apart to be told apart (a region is drawn two query steps after the fact, so saves
# less than two steps apart can merge); the second falls between two scrapes, so it is never seen
# in progress.
SAVES = (Save(2.25, 6.5), Save(13.4, 13.6), Save(17.0, 19.0, committed=False))
TIMELINE_END = 23.0

# The panels added for the checkpoint window, the symptoms and the live interval: each must
# return series here. The other panels' queries need an exporter's full set of series; the
# end-to-end test (test_e2e_alerting.py) proves them against a real one.
NEW_PANELS = {
    "Saves in progress per job and node",
    "Network sent per node (node_exporter)",
    "InfiniBand sent per node (node_exporter)",
    "Disk written per node (node_exporter)",
    "GPU utilisation per node (dcgm-exporter)",
    "Saves diagnosed per symptom",
    "The newest save's symptoms",
    "Configured against recommended interval",
    "Time lost to saves and rework: configured against optimal interval",
}


class Targets:
    """The fake targets' expositions at wall time ``now``, from a timeline starting at ``t0``
    (set once Prometheus scrapes them all; until then no save has started)."""

    def __init__(self) -> None:
        self.t0 = math.inf
        self.origin = time.time()
        self.old_commit = self.origin - 100  # the history found at start-up

    def exporter(self, now: float) -> str:
        w = now - self.t0
        started = [s for s in SAVES if s.start <= w]
        committed = [s for s in started if s.committed and s.end <= w]
        running = [s for s in started if w < s.end]
        pauses = 5 + len(committed)  # saves timed so far: the save cost's histogram
        lines = [
            "# TYPE checkpoint_exporter_build_info gauge",
            'checkpoint_exporter_build_info{version="test"} 1',
        ]
        for node in JOB_NODES:
            job = f'training_job="{JOB}",instance="{node}:25780"'
            lines += [
                # Every process that knows a job exports this; checkpoint_job_info only where it
                # reads a tier of it (not a node-scope process for a job on a shared tree).
                f"checkpoint_restores_total{{{job}}} 0",
                f"checkpoint_interval_seconds{{{job}}} 600",
                f"checkpoint_deadline_seconds{{{job}}} 60",
                f"checkpoint_mtbf_seconds{{{job}}} 86400",
                f"checkpoint_local_saves_in_progress{{{job}}} {len(running)}",
                f"checkpoint_deadline_misses_total{{{job}}} 0",
                f"checkpoint_saves_aborted_total{{{job}}} {1 if w > SAVES[-1].end else 0}",
                f'checkpoint_save_duration_seconds_sum{{{job},phase="pause"}} {2.0 * pauses}',
                f'checkpoint_save_duration_seconds_count{{{job},phase="pause"}} {pauses}',
                f'checkpoint_save_duration_seconds_sum{{{job},phase="total"}} {30.0 * pauses}',
                f'checkpoint_save_duration_seconds_count{{{job},phase="total"}} {pauses}',
                f'checkpoint_save_symptoms_total{{{job},symptom="straggler"}} {len(committed)}',
                f'checkpoint_last_save_symptom_info{{{job},symptom="straggler"}} 1',
            ]
            if started:
                start = self.t0 + max(s.start for s in started)
                lines.append(f"checkpoint_last_save_start_timestamp_seconds{{{job}}} {start}")
            commit = max((self.t0 + s.end for s in committed), default=self.old_commit)
            lines.append(f"checkpoint_last_committed_timestamp_seconds{{{job}}} {commit}")
        # The shared scanner reading the durable tier (the cluster shape): its view of the
        # saves in progress, one row for the whole job.
        shared = f'training_job="{JOB}",instance="scanner:25780"'
        lines.append(f"checkpoint_saves_in_progress{{{shared}}} {len(running)}")
        return "\n".join(lines) + "\n"

    def node_exporter(self, now: float, stack: str = STATIC) -> str:
        """A stand-in for node_exporter: counters growing at a steady rate, the instance as
        ``stack`` labels it."""
        w = now - self.origin + 100
        lines = []
        for node in (*JOB_NODES, IDLE_NODE):
            at = {
                STATIC: f'instance="{node}:9100"',
                # kube-prometheus' node-exporter ServiceMonitor: instance from the pod's node.
                KUBE_PROMETHEUS: f'instance="{node}",pod="node-exporter-{node}"',
                # kube-prometheus-stack's: the endpoint's address (host network: the node's IP).
                KUBE_PROMETHEUS_STACK: f'instance="{NODE_IPS[node]}:9100",'
                f'pod="kps-prometheus-node-exporter-{node}"',
            }[stack]
            lines += [
                f'node_network_transmit_bytes_total{{{at},device="eth0"}} {1e6 * w}',
                *(f'node_network_transmit_bytes_total{{{at},device="{device}"}} {3e6 * w}'
                  for device in VIRTUAL_DEVICES),
                f'node_infiniband_port_data_transmitted_bytes_total{{{at},device="mlx5_0",'
                f'port="1"}} {5e6 * w}',
                f'node_disk_written_bytes_total{{{at},device="nvme0n1"}} {2e6 * w}',
            ]  # fmt: skip
        return "\n".join(lines) + "\n"

    def dcgm_exporter(self, now: float, stack: str = STATIC) -> str:
        """A stand-in for dcgm-exporter: on a host its address as instance; as the GPU Operator
        runs it, a pod address, and the node as Hostname everywhere."""
        return "".join(
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-{i}",Hostname="{node}",'
            f'instance="{node if stack == STATIC else f"10.244.{i}.5"}:9400"}} {40 + i}\n'
            for i, node in enumerate((*JOB_NODES, IDLE_NODE))
        )

    def kubernetes_exporters(self, now: float) -> str:
        """The exporters as a ServiceMonitor scrapes them on Kubernetes: the node-scope
        DaemonSet (host network: the node's IP) with the `node` the relabeling adds, and a
        shared scanner on the idle node that reads the job's tree for every node."""
        lines = []
        for node in JOB_NODES:
            at = f'training_job="{JOB}",instance="{NODE_IPS[node]}:25780",node="{node}"'
            lines += [
                f"checkpoint_restores_total{{{at}}} 0",
                f'checkpoint_exporter_shard_info{{instance="{NODE_IPS[node]}:25780",'
                f'node="{node}",shard="0",shards="1",scope="node"}} 1',
            ]
        scanner = f'instance="10.244.7.3:25780",node="{IDLE_NODE}"'
        lines += [
            f'checkpoint_restores_total{{training_job="{JOB}",{scanner}}} 0',
            f'checkpoint_exporter_shard_info{{{scanner},shard="0",shards="2",scope="shared"}} 1',
        ]
        return "\n".join(lines) + "\n"


def serve(targets: Targets) -> ThreadingHTTPServer:
    pages = {
        "/exporter": targets.exporter,
        "/node": targets.node_exporter,
        "/dcgm": targets.dcgm_exporter,
    }
    for stack in STACKS:
        pages[f"/exporter/{stack}"] = targets.kubernetes_exporters
        pages[f"/node/{stack}"] = lambda now, stack=stack: targets.node_exporter(now, stack)
        pages[f"/dcgm/{stack}"] = lambda now, stack=stack: targets.dcgm_exporter(now, stack)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages[self.path](time.time()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass
class Stack:
    url: str
    t0: float


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus_bin = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("window")
    targets = Targets()
    server = serve(targets)
    address = f"127.0.0.1:{server.server_address[1]}"

    def job(name: str, path: str, cluster: str = STATIC) -> dict:
        # honor_labels: each fake page names its own instances, as many targets would.
        return {
            "job_name": name if cluster == STATIC else f"{name}@{cluster}", "metrics_path": path,
            "honor_labels": True,
            "static_configs": [{"targets": [address], "labels": {"cluster": cluster}}],
        }  # fmt: skip

    def kubernetes(stack: str) -> list[dict]:
        """The stack's three targets, each with the job name it gives that exporter."""
        scrapes = [
            job("checkpoint-exporter", f"/exporter/{stack}", stack),
            job("node-exporter", f"/node/{stack}", stack),
            job("nvidia-dcgm-exporter", f"/dcgm/{stack}", stack),
        ]
        for scrape in scrapes:
            name = scrape["job_name"].partition("@")[0]
            scrape["static_configs"][0]["labels"]["job"] = name
        return scrapes

    port = free_port()
    (tmp / "prometheus.yaml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "500ms", "evaluation_interval": "500ms"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            job("checkpoint-exporter", "/exporter"),
            job("node", "/node"),
            job("dcgm-exporter", "/dcgm"),
            *(scrape for stack in STACKS for scrape in kubernetes(stack)),
        ],
    }))  # fmt: skip
    process = subprocess.Popen(
        [prometheus_bin, f"--config.file={tmp / 'prometheus.yaml'}",
         f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def scraping() -> bool:
            try:
                return len(query(url, "up == 1")) == 3 + 3 * len(STACKS)
            except OSError:
                return False

        wait_for(scraping, timeout=30, interval=0.2)
        targets.t0 = t0 = time.time() + 1.0
        time.sleep(max(0.0, t0 + TIMELINE_END - time.time()))
        yield Stack(url, t0)
    finally:
        stop(process)
        server.shutdown()
        server.server_close()


def resolve(
    expr: str, step_ms: int = 1000, rate_interval: str = "1m", cluster: str = STATIC
) -> str:
    """The dashboard variables as Grafana's backend fills them in: one cluster, every job."""
    return (
        expr.replace("$cluster", cluster).replace("$training_job", ".*")
        .replace("$__rate_interval", rate_interval).replace("$__range", "5m")
        .replace("$__interval_ms", str(step_ms))
    )  # fmt: skip


def query_range(url: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    params = {"query": expr, "start": start, "end": end, "step": step}
    with urllib.request.urlopen(
        f"{url}/api/v1/query_range?{urllib.parse.urlencode(params)}", timeout=10
    ) as reply:
        answer = json.load(reply)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def grafana_regions(series: list[dict], step_ms: int) -> list[tuple[int, int]]:
    """Grafana's Prometheus annotation processing with "series value as timestamp" (the
    datasource's processAnnotationResponse): each value, floored, is an event time in ms; a time
    no more than one step past the open region's end extends it, any other starts a new one."""
    regions: list[tuple[int, int]] = []
    for one in series:
        times = [int(float(value)) for _, value in one["values"]]
        current: list[int] | None = None
        for t in times:
            if current is not None and current[1] + step_ms >= t:
                current[1] = t
                continue
            if current is not None:
                regions.append((current[0], current[1]))
            current = [t, t]
        if current is not None:
            regions.append((current[0], current[1]))
    return regions


def test_every_save_is_one_region_from_its_start_to_its_durable_commit(stack: Stack) -> None:
    (uid, name, expr), *more = dashboards.annotation_queries()
    assert {u for u, _, _ in [(uid, name, expr), *more]} == set(dashboards.ANNOTATED)
    step = 1.0
    result = query_range(
        stack.url, resolve(expr, int(step * 1000)), stack.t0 - 5, stack.t0 + TIMELINE_END, step
    )
    assert [one["metric"] for one in result] == [{"cluster": "w", "training_job": JOB}]
    regions = grafana_regions(result, int(step * 1000))
    committed = [
        (int((stack.t0 + s.start) * 1000), int((stack.t0 + s.end) * 1000))
        for s in SAVES
        if s.committed
    ]
    for start, end in committed:
        assert any(abs(a - start) <= 1 and abs(b - end) <= 1 for a, b in regions), (
            f"no region {start}..{end} in {regions}"
        )
    # The abandoned save: drawn from its start while seen writing, never to a commit.
    abandoned = next(s for s in SAVES if not s.committed)
    begin = int((stack.t0 + abandoned.start) * 1000)
    tail = [(a, b) for a, b in regions if a >= committed[-1][1] + 1]
    assert tail and abs(tail[0][0] - begin) <= 1 and tail[0][1] < (stack.t0 + abandoned.end) * 1000
    # Nothing else: the history before the first save is one point at the old commit, outside.
    inside = [(a, b) for a, b in regions if a >= stack.t0 * 1000]
    assert len(inside) == len(SAVES)


def test_the_region_does_not_depend_on_the_step(stack: Stack) -> None:
    """At a coarser step (a longer time range) the same save is still one exact region."""
    (_, _, expr), *_ = dashboards.annotation_queries()
    first = SAVES[0]
    for step in (2.0,):
        result = query_range(
            stack.url, resolve(expr, int(step * 1000)), stack.t0 - 5, stack.t0 + 13, step
        )
        regions = grafana_regions(result, int(step * 1000))
        start, end = int((stack.t0 + first.start) * 1000), int((stack.t0 + first.end) * 1000)
        assert any(abs(a - start) <= 1 and abs(b - end) <= 1 for a, b in regions), (step, regions)


def test_every_dashboard_query_parses_and_the_new_panels_have_data(stack: Stack) -> None:
    everything = dashboards.queries(provided=dashboards.REQUIREMENTS)
    titles = {title for _, title, _ in everything}
    assert titles >= NEW_PANELS
    missing = []
    for uid, title, expr in everything:
        series = query(stack.url, resolve(expr))  # fails unless Prometheus accepts it
        if title in NEW_PANELS and not series:
            missing.append(f"{uid} / {title}: {expr}")
    assert not missing, "panels without data:\n" + "\n".join(missing)


def nodes_of(url: str, expr: str, cluster: str = STATIC) -> set[str]:
    return {one["metric"]["node"] for one in query(url, resolve(expr, cluster=cluster))}


def node_panels(config: MixinConfig) -> dict[str, str]:
    return {
        title: expr
        for _, title, expr in dashboards.queries(config, provided=dashboards.REQUIREMENTS)
        if "(node_exporter)" in title or "(dcgm-exporter)" in title
    }


def test_node_series_are_the_job_nodes_own(stack: Stack) -> None:
    panels = node_panels(MixinConfig())
    assert len(panels) == 4
    for title, expr in panels.items():
        assert nodes_of(stack.url, expr) == set(JOB_NODES), title
    nic_expr = panels["Network sent per node (node_exporter)"]
    nic = query(stack.url, resolve(nic_expr, rate_interval="10s"))
    assert {one["metric"]["device"] for one in nic} == {"eth0"}  # not lo, veth*, cali*, docker*
    for one in nic:
        assert float(one["value"][1]) == pytest.approx(1e6, rel=0.05)  # the counter's own rate


def shipped_node_panels() -> dict[str, str]:
    """The node panels of the job dashboard as deploy/kubernetes ships it (the ConfigMap)."""
    configmap = yaml.safe_load((REPO / "deploy/kubernetes/base/dashboards.yaml").read_text())
    board = json.loads(configmap["data"]["checkpoint-job.json"])
    return {
        panel["title"]: panel["targets"][0]["expr"]
        for panel in board["panels"]
        if "(node_exporter)" in panel["title"] or "(dcgm-exporter)" in panel["title"]
    }


@pytest.mark.parametrize("flavour", STACKS)
def test_the_shipped_dashboards_meet_node_exporter_and_dcgm_on_both_operator_stacks(
    stack: Stack, flavour: str
) -> None:
    """Without a setting: kube-prometheus names node_exporter's instance after the node, which
    the exporters carry as `node`; kube-prometheus-stack keeps the node's IP and port, as the
    exporters' own instance on the host network; dcgm-exporter's Hostname is the node name.
    The shared scanner, on the idle node, is none of the job's nodes."""
    panels = shipped_node_panels()
    assert panels == node_panels(KUBERNETES)  # the ConfigMap is the generator's
    names = set(JOB_NODES)
    keys = names if flavour == KUBE_PROMETHEUS else {NODE_IPS[node] for node in JOB_NODES}
    for title, expr in panels.items():
        expected = names if "(dcgm-exporter)" in title else keys
        assert nodes_of(stack.url, expr, flavour) == expected, title
    nic = query(stack.url, resolve(panels["Network sent per node (node_exporter)"],
                                   cluster=flavour))  # fmt: skip
    assert {one["metric"]["device"] for one in nic} == {"eth0"}


def test_one_label_for_both_sides_misses_kube_prometheus(stack: Stack) -> None:
    """The single node_label of before: the exporters' instance (an IP) never meets
    kube-prometheus' node-exporter (the node name), so the window's node rows were empty."""
    nic = node_panels(MixinConfig(node_label="instance"))["Network sent per node (node_exporter)"]
    assert query(stack.url, resolve(nic, cluster=KUBE_PROMETHEUS)) == []
    assert nodes_of(stack.url, nic, KUBE_PROMETHEUS_STACK) == {NODE_IPS[n] for n in JOB_NODES}


def test_the_saves_in_progress_are_the_training_nodes_own(stack: Stack) -> None:
    """The state timeline has a row per node that runs the job (its spool's saves), not one per
    process reading the durable tier."""
    (expr,) = [
        expr for _, title, expr in dashboards.queries(provided=dashboards.REQUIREMENTS)
        if title == "Saves in progress per job and node"
    ][:1]  # fmt: skip
    rows = query(stack.url, resolve(expr))
    assert {one["metric"]["instance"].partition(":")[0] for one in rows} == set(JOB_NODES)


def test_the_node_matching_is_configurable(stack: Stack, tmp_path: Path) -> None:
    """dcgm-exporter without host network: its instance is a pod's, its Hostname the node."""
    path = tmp_path / "mixin.yaml"
    path.write_text('dcgm_node_label: Hostname\ndcgm_selector: job="dcgm-exporter"\n')
    config = load_mixin(str(path))
    gpu = node_panels(config)["GPU utilisation per node (dcgm-exporter)"]
    assert '"Hostname"' in gpu and 'job="dcgm-exporter"' in gpu
    assert nodes_of(stack.url, gpu) == set(JOB_NODES)
    # A selector that finds no node_exporter draws nothing, rather than another job's series.
    path.write_text('node_exporter_selector: job="elsewhere"\n')
    nic = node_panels(load_mixin(str(path)))["Network sent per node (node_exporter)"]
    assert query(stack.url, resolve(nic)) == []
    # Each side's labels and regex: kube-prometheus' node names meet only the exporters' node.
    path.write_text(
        "exporter_node_labels: [node]\nnode_exporter_node_label: instance\n"
        'node_exporter_node_regex: "(.+)"\nnetwork_device_exclude: "lo"\n'
    )
    nic = node_panels(load_mixin(str(path)))["Network sent per node (node_exporter)"]
    assert nodes_of(stack.url, nic, KUBE_PROMETHEUS) == set(JOB_NODES)
    assert nodes_of(stack.url, nic, KUBE_PROMETHEUS_STACK) == set()  # no node names there
    devices = {
        one["metric"]["device"] for one in query(stack.url, resolve(nic, cluster=KUBE_PROMETHEUS))
    }
    assert devices == {"eth0", *VIRTUAL_DEVICES} - {"lo"}


def test_the_generated_dashboards_carry_the_window() -> None:
    job = json.loads((REPO / "dashboards" / "checkpoint-job.json").read_text())
    overview = json.loads((REPO / "dashboards" / "checkpoint-overview.json").read_text())
    for board in (job, overview):
        (annotation,) = board["annotations"]["list"]
        assert annotation["useValueForTime"] is True and annotation["enable"] is True
        assert annotation["datasource"] == "${datasource}"
        assert "$__interval_ms" in annotation["expr"]
    storage = json.loads((REPO / "dashboards" / "checkpoint-storage.json").read_text())
    assert storage["annotations"]["list"] == []
    kinds = {p["title"]: p["type"] for p in job["panels"]}
    assert kinds["Saves in progress per job and node"] == "state-timeline"
    assert kinds["The newest save's symptoms"] == "state-timeline"
    timeline = next(p for p in job["panels"] if p["title"] == "Saves in progress per job and node")
    assert timeline["gridPos"]["w"] == 24  # the shared time axis over the node panels
    # No two panels overlap on the grid.
    cells = set()
    for panel in job["panels"]:
        g = panel["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, panel["title"]
                cells.add((x, y))


def test_the_overview_lists_every_job_and_links_each_to_its_dashboard(stack: Stack) -> None:
    """The overview (a fleet view) shows every job by default, one row each in its table, whose
    job names open the job dashboard; a detail dashboard asks for one job."""
    boards = {
        uid: json.loads((REPO / "dashboards" / f"{uid}.json").read_text())
        for uid in dashboards.DASHBOARDS
    }
    for uid, board in boards.items():
        (variable,) = [v for v in board["templating"]["list"] if v["name"] == "training_job"]
        every = uid == dashboards.OVERVIEW
        assert (variable["multi"], variable["includeAll"]) == (every, every), uid
    (table,) = [p for p in boards[dashboards.OVERVIEW]["panels"] if p["type"] == "table"]
    (override,) = table["fieldConfig"]["overrides"]
    assert override["matcher"] == {"id": "byName", "options": "training_job"}
    (link,) = override["properties"][0]["value"]
    target = urllib.parse.urlsplit(link["url"])
    assert target.path == f"/d/{dashboards.JOB_DASHBOARD}" and dashboards.JOB_DASHBOARD in boards
    assert "var-training_job=${__value.raw}" in target.query
    assert "var-cluster=${__data.fields.cluster}" in target.query
    # Grafana's merge: one row per job, a column per query, each with the job's value.
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for t in table["targets"]:
        assert t["instant"] and t["format"] == "table"
        for one in query(stack.url, resolve(t["expr"])):
            key = (one["metric"]["cluster"], one["metric"]["training_job"])
            rows.setdefault(key, {})[t["legendFormat"]] = one["value"][1]
    assert list(rows) == [(STATIC, JOB)]
    assert set(rows[STATIC, JOB]) == {t["legendFormat"] for t in table["targets"]}
    assert float(rows[STATIC, JOB]["Interval + deadline"]) == 660


def test_queries_leave_out_what_a_plain_exporter_cannot_answer() -> None:
    """The end-to-end test asks every query it gets for data from a real exporter alone: the
    node_exporter, dcgm-exporter, MTBF and symptom queries come only when asked for."""
    plain = dashboards.queries()
    everything = dashboards.queries(provided=dashboards.REQUIREMENTS)
    assert set(plain) < set(everything)
    foreign = {title for _, title, _ in set(everything) - set(plain)}
    assert "Network sent per node (node_exporter)" in foreign
    assert "Saves in progress per job and node" not in foreign
    assert not any("node_" in q or "DCGM" in q or "symptom" in q for _, _, q in plain)
