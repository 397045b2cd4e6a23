"""A cluster on one machine, in the shape DESIGN "Scopes and sharding" deploys: a node-scope
exporter per node (its own spool, staging directory and port), shared-scope replicas over one
shared root, a training job spanning the nodes that saves to that root, and a real Prometheus
(the mixin's rules) routing to a real Alertmanager.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from checkpoint_exporter import instrument
from checkpoint_exporter.mixin import rules
from checkpoint_exporter.mixin.config import MixinConfig
from tests.conftest import write_config
from tests.helpers.alerting import stop
from tests.helpers.trees import dcp_metadata_bytes

SHARD_BYTES = 4096


@dataclass(frozen=True)
class Objectives:
    """The job's config values, as YAML durations."""

    interval: str
    deadline: str


def node_config(node: Path, job: str, shared_root: Path, objectives: Objectives) -> Path:
    """A node's config: its spool and staging tier, and the job's durable tier declared
    ``scope: shared``, which a ``--scope=node`` process never reads. The staging tier is polled
    every second: an inotify tier is confirmed current only every 30 s, and the test's
    ``stale_after`` is shorter."""
    (node / "spool").mkdir(parents=True)
    (node / "staging" / job).mkdir(parents=True)
    return write_config(node, f"""
spool: {node / "spool"}
telemetry: {{sample_interval: 5s, infiniband: false, gpu: "off"}}
defaults: {{interval: {objectives.interval}, deadline: {objectives.deadline}, layout: dcp,
           watch: poll, poll_interval: 1s}}
jobs:
  - {{name: {job}, path: {shared_root / job}, staging: {node / "staging" / job}, scope: shared}}
""")  # fmt: skip


def shared_config(replica: Path, job: str, shared_root: Path, objectives: Objectives) -> Path:
    """A shared scanner's config: the durable tier polled, as a network filesystem is."""
    (replica / "spool").mkdir(parents=True)
    return write_config(replica, f"""
spool: {replica / "spool"}
telemetry: {{sample_interval: 5s, infiniband: false, gpu: "off"}}
defaults: {{interval: {objectives.interval}, deadline: {objectives.deadline}, layout: dcp,
           watch: poll, poll_interval: 1s}}
jobs:
  - {{name: {job}, path: {shared_root / job}, scope: shared}}
""")  # fmt: skip


@dataclass
class Training:
    """An instrumented DCP job, ``ranks_per_node`` ranks on each node (one spool per node),
    saving every ``period`` seconds on a thread: every rank writes its shard into the shared
    root and its clocks into its node's spool; rank 0 commits by renaming ``.metadata`` into
    place once every rank has written. ``straggler``/``lag``: that node's ranks finish writing
    ``lag`` seconds after the others."""

    name: str
    root: Path  # the job's durable tier on the shared root
    spools: list[Path]  # one per node
    period: float
    ranks_per_node: int = 2
    keep: int = 3  # generations left on disk, as the trainer's own cleanup leaves them
    straggler: int | None = None
    lag: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def world_size(self) -> int:
        return len(self.spools) * self.ranks_per_node

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop saving (after the save in flight commits)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        metadata = dcp_metadata_bytes(self.world_size, SHARD_BYTES)
        step = 0
        while not self._stop.is_set():
            step += 1
            started = time.monotonic()
            self._save(step, metadata)
            stale = self.root / f"step-{step - self.keep}"
            if stale.exists():
                shutil.rmtree(stale)
            self._stop.wait(max(0.0, self.period - (time.monotonic() - started)))

    def _save(self, step: int, metadata: bytes) -> None:
        generation = self.root / f"step-{step}"
        generation.mkdir()
        with contextlib.ExitStack() as ranks:
            saves: dict[tuple[int, int], instrument.Save] = {}
            for node, spool in enumerate(self.spools):
                for rank in range(self.ranks_per_node):
                    saves[node, rank] = ranks.enter_context(instrument.saving(
                        training_job=self.name, step=step, path=generation, spool=str(spool),
                        rank=node * self.ranks_per_node + rank, world_size=self.world_size,
                    ))  # fmt: skip
            for save in saves.values():
                save.resume()
                save.staged()
            late = [key for key in saves if key[0] == self.straggler]
            for key in [key for key in saves if key not in late]:
                self._write(generation, *key, saves[key])
            if late:
                time.sleep(self.lag)
            for key in late:
                self._write(generation, *key, saves[key])
            (generation / ".metadata.tmp").write_bytes(metadata)
            os.rename(generation / ".metadata.tmp", generation / ".metadata")
        # Leaving the stack writes every rank's `committed`.

    def _write(self, generation: Path, node: int, rank: int, save: instrument.Save) -> None:
        index = node * self.ranks_per_node + rank
        (generation / f"__{index}_0.distcp").write_bytes(b"\0" * SHARD_BYTES)
        save.written()


@dataclass
class Monitoring:
    """Prometheus with the mixin's rules, scraping ``targets`` every second, and Alertmanager
    routing every alert to ``webhook_url``. ``close`` stops both."""

    directory: Path
    prometheus_bin: str
    alertmanager_bin: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    def start(
        self,
        mixin: MixinConfig,
        targets: list[str],
        webhook_url: str,
        ports: tuple[int, int],
        cluster: str,
    ) -> str:
        """Start both; returns Prometheus' base URL."""
        am_port, prom_port = ports
        rule_paths = []
        for name, document in rules.rule_files(mixin).items():
            rule_paths.append(str(write_config(self.directory, yaml.safe_dump(document), name)))
        receiver = {"name": "test", "webhook_configs": [{"url": webhook_url}]}
        route = {
            "receiver": "test", "group_by": ["alertname", "training_job", "instance"],
            "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h",
        }  # fmt: skip
        am_config = write_config(
            self.directory, yaml.safe_dump({"route": route, "receivers": [receiver]}), "am.yaml"
        )
        self._spawn(
            self.alertmanager_bin, f"--config.file={am_config}",
            f"--storage.path={self.directory / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=",
        )  # fmt: skip
        scrape = {"targets": targets, "labels": {mixin.cluster_label: cluster}}
        alertmanager = {"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}
        prom_config = write_config(self.directory, yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": rule_paths,
            "alerting": {"alertmanagers": [alertmanager]},
            "scrape_configs": [{"job_name": "checkpoint-exporter", "static_configs": [scrape]}],
        }), "prometheus.yaml")  # fmt: skip
        self._spawn(
            self.prometheus_bin, f"--config.file={prom_config}",
            f"--storage.tsdb.path={self.directory / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        )  # fmt: skip
        return f"http://127.0.0.1:{prom_port}"

    def _spawn(self, *argv: str) -> None:
        self.processes.append(
            subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )

    def close(self) -> None:
        for process in self.processes:
            stop(process)
