"""End to end: exporter -> real Prometheus (generated rules) -> real Alertmanager -> a webhook.

The exporter watches a live workload on a fixture node (counters advancing, a fake NVML): an
instrumented job saving every second, a two-tier job draining, a job that stops saving, a job
whose newest generation is truncated. Prometheus scrapes every second and evaluates the
generated rules with every `for` set to 0s through the mixin config; Alertmanager routes to a
webhook this test serves. Every dashboard panel's query must return data; a stopped job and a
job that never saves page, a save over its deadline and a failed restore drill open tickets,
and a finished job whose checkpoint is as old as the stopped one's never fires.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from checkpoint_exporter import instrument
from checkpoint_exporter.mixin import dashboards
from checkpoint_exporter.mixin.config import ALERTS
from tests.conftest import CLI, REPO, Exporter, require_tool, wait_for, write_config
from tests.helpers.alerting import Webhook, free_port, query, stop
from tests.helpers.node import FakeNode
from tests.helpers.trees import dcp_generation

pytestmark = [pytest.mark.prometheus, pytest.mark.daemon]

MB = 1e6


class Workload:
    """Jobs doing what real ones do, on threads, until stopped."""

    def __init__(self, root: Path, spool: Path):
        self.root, self.spool = root, spool
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.overrun = threading.Event()  # the next save of `live` takes longer than its deadline

    def start(self, target) -> None:  # type: ignore[no-untyped-def]
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self.threads.append(thread)

    def publish(self, tier: Path, step: int, shards: int = 4) -> None:
        scratch = self.root / "scratch" / f"{tier.name}-{step}"
        dcp_generation(scratch, shards=shards, shard_bytes=256 * 1024)
        os.rename(scratch, tier / f"step-{step}")

    def live(self) -> None:
        step = 0
        while not self.stop.is_set():
            step += 1
            with instrument.saving(training_job="live", step=step, spool=str(self.spool)) as save:
                time.sleep(0.2)
                save.resume()
                save.staged()
                if self.overrun.is_set():
                    self.overrun.clear()
                    time.sleep(4.0)  # the deadline is 3 s
                self.publish(self.root / "live", step)
                save.written()
            self.stop.wait(1.0)

    def two_tier(self) -> None:
        step = 0
        while not self.stop.is_set():
            step += 1
            self.publish(self.root / "nvme", step)
            self.stop.wait(0.5)
            shutil.copytree(self.root / "nvme" / f"step-{step}", self.root / "scratch" / f"d{step}")
            os.rename(self.root / "scratch" / f"d{step}", self.root / "filer" / f"step-{step}")
            self.stop.wait(1.0)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


def resolve_variables(expr: str) -> str:
    return (
        expr.replace("$cluster", ".*").replace("$training_job", ".*")
        .replace("$__rate_interval", "1m").replace("$__range", "5m")
    )  # fmt: skip


@pytest.fixture
def stack(tmp_path: Path):
    processes: list[subprocess.Popen] = []
    closers = []
    try:
        yield tmp_path, processes, closers
    finally:
        for close in reversed(closers):
            close()
        for process in processes:
            stop(process)


def test_pages_reach_the_webhook_and_every_panel_has_data(stack) -> None:
    tmp_path, processes, closers = stack
    prometheus_bin, alertmanager_bin = (
        require_tool("prometheus"),
        require_tool("prometheus-alertmanager"),
    )

    # The node, its jobs, and the exporter.
    data = tmp_path / "data"
    data.mkdir()
    node = FakeNode(tmp_path / "node", data).build()
    node.rates = {"bond0": 100 * MB, "mlx5_0": 150 * MB, "dm-0": 40 * MB}
    node.run(step=0.02)
    closers.append(node.stop)
    for name in ("live", "nvme", "filer", "stalled", "broken", "done", "scratch"):
        (data / name).mkdir()
    spool = tmp_path / "spool"
    workload = Workload(data, spool)
    workload.publish(data / "stalled", 1)
    workload.publish(data / "broken", 1)
    workload.publish(data / "done", 1)
    instrument.finished(training_job="done", spool=str(spool))  # trained to the end
    # Saves somewhere the exporter does not watch: it runs (heartbeats), nothing commits here.
    instrument.start(training_job="wrongpath", spool=str(spool), interval=1.0)
    closers.append(lambda: instrument.finished(training_job="wrongpath", spool=str(spool)))
    nvml = tmp_path / "nvml.json"
    nvml.write_text(
        json.dumps({"init": "ok", "gpus": [{"util": 60, "memory_used": 1, "pcie": [1, 2]}]})
    )
    config = write_config(
        tmp_path,
        f"spool: {spool}\n"
        "telemetry: {sample_interval: 500ms, network_devices: '^(eth|ib|bond)'}\n"
        "defaults: {interval: 10s, deadline: 3s, layout: dcp, restore_drill_max_age: 1h}\n"
        "jobs:\n"
        f"  - {{name: live, path: {data / 'live'}}}\n"
        f"  - {{name: drained, path: {data / 'filer'}, staging: {data / 'nvme'}}}\n"
        f"  - {{name: stalled, path: {data / 'stalled'}, interval: 3s, deadline: 1s}}\n"
        f"  - {{name: broken, path: {data / 'broken'}}}\n"
        f"  - {{name: done, path: {data / 'done'}, interval: 3s, deadline: 1s}}\n"
        f"  - {{name: wrongpath, path: {data / 'wrong'}, interval: 3s, deadline: 1s}}\n",
    )
    fake_gpu = {"PYTHONPATH": str(REPO / "tests" / "fakes"), "FAKE_NVML_STATE": str(nvml)}
    exporter = Exporter(
        "--config.file", str(config), "--path.procfs", str(node.procfs),
        "--path.sysfs", str(node.sysfs), env=fake_gpu,
    )  # fmt: skip
    closers.append(exporter.close)
    workload.start(workload.live)
    workload.start(workload.two_tier)
    closers.append(workload.close)

    # Rules with every `for` at 0s, Prometheus and Alertmanager on loopback.
    mixin = write_config(
        tmp_path,
        yaml.safe_dump({"event_window": "1m", "for": {name: "0s" for name in ALERTS}}),
        "mixin.yaml",
    )
    generated = subprocess.run(
        [*CLI, "rules", "--config.file", str(mixin), "--output-dir", str(tmp_path / "rules"),
         "--kubernetes-dir", str(tmp_path / "k8s")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert generated.returncode == 0, generated.stderr
    webhook = Webhook()
    closers.append(webhook.close)
    am_port, prom_port = free_port(), free_port()
    receiver = {"name": "test", "webhook_configs": [{"url": webhook.url, "send_resolved": False}]}
    (tmp_path / "am.yaml").write_text(yaml.safe_dump({
        "route": {"receiver": "test", "group_by": ["alertname", "training_job"],
                  "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [receiver],
    }))  # fmt: skip
    processes.append(subprocess.Popen(
        [alertmanager_bin, f"--config.file={tmp_path / 'am.yaml'}",
         f"--storage.path={tmp_path / 'am-data'}", f"--web.listen-address=127.0.0.1:{am_port}",
         "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    ))  # fmt: skip
    target = exporter.base.removeprefix("http://")
    scrape = {"targets": [target], "labels": {"cluster": "e2e"}}
    alertmanager = {"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}
    (tmp_path / "prometheus.yaml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules" / "checkpoint-exporter.rules.yaml")],
        "alerting": {"alertmanagers": [alertmanager]},
        "scrape_configs": [{"job_name": "checkpoint-exporter", "static_configs": [scrape]}],
    }))  # fmt: skip
    processes.append(subprocess.Popen(
        [prometheus_bin, f"--config.file={tmp_path / 'prometheus.yaml'}",
         f"--storage.tsdb.path={tmp_path / 'prom-data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    ))  # fmt: skip
    prometheus = f"http://127.0.0.1:{prom_port}"

    def scraping() -> bool:
        try:
            return bool(query(prometheus, 'up{job="checkpoint-exporter"} == 1'))
        except OSError:
            return False  # still starting

    wait_for(scraping, timeout=30, interval=0.5)

    # A restore drill that succeeds, so the restore panels have data.
    drill = subprocess.run(
        [*CLI, "restore-drill", "--config.file", str(config), "--job", "live"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert drill.returncode == 0, drill.stderr

    # Every dashboard panel's query returns data while the workload runs.
    def missing_panels() -> list[str]:
        return [
            f"{uid} / {title}: {expr}"
            for uid, title, expr in dashboards.queries()
            if not query(prometheus, resolve_variables(expr))
        ]

    try:
        wait_for(lambda: not missing_panels(), timeout=60, interval=1)
    except AssertionError:
        raise AssertionError("panels without data:\n" + "\n".join(missing_panels())) from None

    # The deadline SLO from two series per job: the exporter's count of saves within the
    # deadline and the histogram's total count, recorded for the live job.
    within = 'checkpoint_saves_within_deadline_total{training_job="live"} > 0'
    ratio = 'training_job:checkpoint_deadline_slo_errors:ratio_rate2h{training_job="live"}'
    wait_for(lambda: query(prometheus, within) and query(prometheus, ratio), timeout=30, interval=1)

    # Two pages and two tickets.
    workload.overrun.set()
    truncated = data / "broken" / "step-1" / "__0_0.distcp"
    os.truncate(truncated, 100)
    failed = subprocess.run(
        [*CLI, "restore-drill", "--config.file", str(config), "--job", "broken"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert failed.returncode == 1

    def pages() -> dict[str, set[str]]:
        firing = webhook.firing()
        names = (
            "CheckpointDeadlineMissed", "CheckpointTooOld", "CheckpointRestoreDrillFailed",
            "CheckpointNeverCommitted",
        )  # fmt: skip
        return {name: firing.get(name, set()) for name in names}

    try:
        wait_for(
            lambda: "live" in pages()["CheckpointDeadlineMissed"]
            and "stalled" in pages()["CheckpointTooOld"]
            and "broken" in pages()["CheckpointRestoreDrillFailed"]
            and "wrongpath" in pages()["CheckpointNeverCommitted"],
            timeout=90, interval=0.5,
        )  # fmt: skip
    except AssertionError:
        raise AssertionError(f"pages so far: {webhook.firing()}") from None

    def severity(alertname: str, job: str) -> str:
        return next(
            alert["labels"]["severity"]
            for message in webhook.received
            for alert in message["alerts"]
            if alert["labels"]["alertname"] == alertname
            and alert["labels"].get("training_job") == job
        )

    assert severity("CheckpointTooOld", "stalled") == "critical"
    assert severity("CheckpointNeverCommitted", "wrongpath") == "critical"
    assert severity("CheckpointDeadlineMissed", "live") == "warning"  # one slow save: a ticket
    assert severity("CheckpointRestoreDrillFailed", "broken") == "warning"  # a drill: a ticket
    notification = next(
        alert
        for message in webhook.received
        for alert in message["alerts"]
        if alert["labels"]["alertname"] == "CheckpointDeadlineMissed"
    )
    assert notification["annotations"]["runbook_url"].endswith("#checkpointdeadlinemissed")
    firing = webhook.firing()
    assert "CheckpointExporterDown" not in firing
    assert "broken" not in firing.get("CheckpointRestoreFailed", set())  # no training restore
    assert "done" not in firing.get("CheckpointTooOld", set())  # finished: never pages
