"""rules: the shipped recording rules and alerts, evaluated by a real Prometheus at cluster scale.

A generator target stands in for NODES exporters that each watch the same JOBS jobs (a discover
root on a shared filesystem: every node reports every job). Each node's exposition is what the
exporter itself renders for JOBS synthetic jobs (tests/helpers/synthetic.py), cut to the metric
families the rules read, with the node's ``instance`` label added; Prometheus scrapes it as
TARGETS targets (``honor_labels``) so its parsing uses both cores. Prometheus evaluates
alerts/checkpoint-exporter.rules.yaml every 15 s. Reported: head series, scrape time, every rule
group's evaluation time (``prometheus_rule_group_last_duration_seconds``) and Prometheus' RSS.
"""

from __future__ import annotations

import http.server
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml
from prometheus_client import generate_latest

from checkpoint_exporter.exposition.collectors import enabled_collectors
from checkpoint_exporter.exposition.metrics import build_registry
from tests.helpers.synthetic import synthetic_tracker

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "alerts" / "checkpoint-exporter.rules.yaml"
_NAME = re.compile(r"checkpoint_[a-z_]+")
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def _families_read_by_rules() -> set[str]:
    return set(_NAME.findall(RULES.read_text()))


def node_exposition(jobs: int) -> list[str]:
    """One node's lines (no comments) for the families the rules read."""
    tracker = synthetic_tracker(jobs, 10)
    text = generate_latest(build_registry(lambda: tracker.snapshot, enabled_collectors({})))
    wanted = _families_read_by_rules()
    lines = []
    for line in text.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        if name in wanted or any(name.endswith(s) and name[: -len(s)] in wanted for s in _SUFFIXES):
            lines.append(line)
    return lines


def _with_instance(lines: list[str], instance: str) -> str:
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


class _Generator(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, bodies: list[bytes]):
        self.bodies = bodies
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Generator

    def do_GET(self) -> None:
        shard = int(urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["shard"][0])
        body = self.server.bodies[shard]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def _free_port() -> int:
    import socket

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
    result = __import__("json").load(reply)["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


def _slowest_rules(url: str, count: int) -> list[tuple[str, float]]:
    """(alert or record name, its last evaluation seconds), slowest first."""
    reply = urllib.request.urlopen(f"{url}/api/v1/rules", timeout=60)
    rules = [rule for group in __import__("json").load(reply)["data"]["groups"]
             for rule in group["rules"]]  # fmt: skip
    timed = [(rule.get("name", "?"), float(rule.get("evaluationTime", 0))) for rule in rules]
    return sorted(timed, key=lambda item: -item[1])[:count]


def bench_rules(nodes: int = 2048, jobs: int = 16, targets: int = 16) -> dict[str, object]:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise RuntimeError("prometheus is not installed (make toolchain installs it)")
    lines = node_exposition(jobs)
    per_target = -(-nodes // targets)
    bodies = [
        "".join(_with_instance(lines, f"node-{n}")
                for n in range(t * per_target, min(nodes, (t + 1) * per_target))).encode()
        for t in range(targets)
    ]  # fmt: skip
    generator = _Generator(bodies)
    threading.Thread(target=generator.serve_forever, daemon=True).start()
    base = Path(tempfile.mkdtemp(prefix="checkpoint-exporter-rules-"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    address = f"127.0.0.1:{generator.server_address[1]}"
    config = {
        "global": {"scrape_interval": "30s", "scrape_timeout": "25s",
                   "evaluation_interval": "15s"},
        "rule_files": [str(RULES)],
        # One target per shard of the nodes: the same address, ?shard= set by __param_shard.
        "scrape_configs": [{
            "job_name": "checkpoint-exporter", "honor_labels": True,
            "static_configs": [{"targets": [address], "labels": {"__param_shard": str(t)}}
                               for t in range(targets)],
        }],
    }  # fmt: skip
    (base / "prometheus.yaml").write_text(yaml.safe_dump(config))
    process = subprocess.Popen(
        [prometheus, f"--config.file={base / 'prometheus.yaml'}",
         f"--storage.tsdb.path={base / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while True:
            time.sleep(5)
            if process.poll() is not None:
                raise RuntimeError("prometheus exited")
            if time.monotonic() > deadline:
                raise TimeoutError("Prometheus did not ingest and evaluate within 600 s")
            try:
                own = _self_metrics(url)
            except OSError:
                continue
            rounds = [v for k, v in own.items()
                      if k.startswith("prometheus_rule_group_iterations_total")]  # fmt: skip
            series = own.get("prometheus_tsdb_head_series", 0)
            if series >= nodes * len(lines) and rounds and min(rounds) >= 3:
                break
        groups = {
            re.search(r'rule_group="[^"]*;([^"]+)"', key).group(1): value
            for key, value in own.items()
            if key.startswith("prometheus_rule_group_last_duration_seconds{")
        }
        scrape = _query(url, 'max(scrape_duration_seconds{job="checkpoint-exporter"})')
        slowest = _slowest_rules(url, 5)
    finally:
        process.terminate()
        process.wait(timeout=60)
        generator.shutdown()
        shutil.rmtree(base, ignore_errors=True)
    return {
        "nodes": nodes, "jobs": jobs, "series_per_node": len(lines),
        "head_series": own["prometheus_tsdb_head_series"],
        "exposition_mb": sum(len(b) for b in bodies) / 1e6,
        "rule_groups_seconds": groups, "rules_seconds_total": sum(groups.values()),
        "prometheus_rss_mb": own["process_resident_memory_bytes"] / 1e6,
        "scrape_seconds_per_target": scrape, "targets": targets, "slowest_rules": slowest,
    }  # fmt: skip
