"""``checkpoint-exporter demo``: a small simulated cluster on this machine, watched for real.

The seed article's four jobs, scaled down: intervals of tens of seconds, deadlines of a few
seconds, a few ranks each writing shards of a few MB into real DCP directories with a valid
``.metadata`` (torch's own classes when torch is importable, the same pickle format without it),
clocked through ``instrument``. One job stages on a "local NVMe" tier that a throttled drainer
copies to the durable tier. Faults come at a steady pace, each producing a symptom of the seed
article's bottleneck matrix for real (the exporter diagnoses them: checkpoint_save_symptoms_total):

- llama70b-a: a straggling rank (straggler);
- llama70b-b: a slow final commit after a fast payload write, over the deadline (commit_bound);
- llama70b-c: an aborted save, and a slow copy to host memory before any write (staging_bound);
- llama70b-d: a torn generation, whose restore drill fails (unrestorable).

Every other save is clean and shows no symptom. Where moto is installed (a development checkout),
a fifth job saves into an embedded S3 server, one save in three killed mid-upload (demo/objects.py). Shared-path contention, backlog and disturbed
training need several nodes, an async writer or GPUs: the unit tests drive those.

The real exporter watches it all; with the Prometheus toolchain installed, Prometheus and
Alertmanager run the generated rules. Everything lives in one work directory; Ctrl-C stops
every process started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from checkpoint_exporter import instrument
from checkpoint_exporter.demo import objects
from checkpoint_exporter.mixin.config import ALERTS

MB = 1_000_000
# The exporter's; Prometheus, Alertmanager, node_exporter, the S3 server get +10, +11, +12, +13.
DEFAULT_PORT = 25780


@dataclass(frozen=True)
class DemoJob:
    name: str
    ranks: int
    shard_mb: float
    interval: float
    deadline: float
    fault: str  # none | slow_commit | abort | straggler | torn | staging_bound
    staging: bool = False
    second_fault: str = "none"  # the save after the first fault's, in each cycle


JOBS = (
    DemoJob("llama70b-a", ranks=4, shard_mb=4, interval=20, deadline=6, fault="straggler", staging=True),
    DemoJob("llama70b-b", ranks=4, shard_mb=4, interval=24, deadline=5, fault="slow_commit"),
    DemoJob("llama70b-c", ranks=3, shard_mb=3, interval=28, deadline=4, fault="abort",
            second_fault="staging_bound"),
    DemoJob("llama70b-d", ranks=2, shard_mb=2, interval=30, deadline=4, fault="torn"),
)  # fmt: skip
WRITE_MBPS_PER_RANK = 16.0  # so the write phase is visible
DRAIN_MBPS = 40.0
FAULT_EVERY = 3  # the second save of every three suffers its job's fault, the third its second
# Symptoms (model.SYMPTOMS) each fault makes the exporter diagnose.
SYMPTOMS_OF = {
    "straggler": ("straggler",),
    "slow_commit": ("commit_bound",),
    "staging_bound": ("staging_bound",),
    "torn": ("unrestorable",),  # its restore drill fails
    "abort": (),  # an aborted save is counted as one, not diagnosed
}
# The pages each fault explains (anything else the demo's Alertmanager receives is a false page):
# slow commits, repeated, burn the deadline budget fast, and a slow save may leave the newest
# checkpoint older than interval + deadline for a moment; an aborted save leaves it older for a
# whole interval; a torn generation is the newest, invalid, until the next save.
PAGES_OF = {
    "slow_commit": ("CheckpointDeadlineBudgetBurn", "CheckpointTooOld"),
    "abort": ("CheckpointTooOld",),
    "staging_bound": ("CheckpointTooOld",),
    "torn": ("CheckpointInvalid",),
}
KEEP = 3  # retention, as keep_latest_k
HEARTBEAT = 10.0  # seconds between the simulated jobs' heartbeats


# --- the DCP .metadata pickle, with or without torch --------------------------------------------


def _pickle_value(value: object) -> bytes:
    if value is None:
        return b"N"
    if isinstance(value, bool):
        return b"\x88" if value else b"\x89"
    if isinstance(value, int):
        raw = value.to_bytes((value.bit_length() + 8) // 8 or 1, "little", signed=True)
        return b"\x8a" + bytes([len(raw)]) + raw
    if isinstance(value, str):
        data = value.encode()
        return b"X" + struct.pack("<I", len(data)) + data
    if isinstance(value, dict):
        items = b"".join(_pickle_value(k) + _pickle_value(v) for k, v in value.items())
        return b"}" + (b"(" + items + b"u" if value else b"")
    if isinstance(value, _Obj):
        module, name = value.cls.rsplit(".", 1)
        state = _pickle_value(value.state)
        return b"c" + module.encode() + b"\n" + name.encode() + b"\n)\x81" + state + b"b"
    raise TypeError(type(value))


@dataclass(frozen=True, eq=False)  # hashed by identity: a dict key in storage_data
class _Obj:
    cls: str
    state: dict


def dcp_metadata(shards: dict[str, int]) -> bytes:
    """A DCP ``.metadata`` naming one byte item per shard (its whole length)."""
    try:
        import torch.distributed.checkpoint.filesystem as fs
        import torch.distributed.checkpoint.metadata as md
    except ImportError:
        items = {f"shard.{n}": _Obj(f"{_MD}.BytesStorageMetadata", {}) for n in shards}
        storage = {
            _Obj(f"{_MD}.MetadataIndex", {"fqn": f"shard.{n}", "offset": None, "index": None}):
            _Obj("torch.distributed.checkpoint.filesystem._StorageInfo",
                 {"relative_path": n, "offset": 0, "length": size, "transform_descriptors": None})
            for n, size in shards.items()
        }  # fmt: skip
        state = {"state_dict_metadata": items, "planner_data": None, "storage_data": storage,
                 "storage_meta": None, "version": "1.0.0"}  # fmt: skip
        return b"\x80\x02" + _pickle_value(_Obj(f"{_MD}.Metadata", state)) + b"."
    import pickle

    metadata = md.Metadata(
        state_dict_metadata={f"shard.{n}": md.BytesStorageMetadata() for n in shards},
        storage_data={
            md.MetadataIndex(f"shard.{n}"): fs._StorageInfo(n, 0, size)
            for n, size in shards.items()
        },
    )
    metadata.version = "1.0.0"
    return pickle.dumps(metadata)


_MD = "torch.distributed.checkpoint.metadata"


# --- the simulated jobs -----------------------------------------------------------------------


class Cluster:
    def __init__(self, workdir: Path, stop: threading.Event):
        self.workdir, self.stop = workdir, stop
        self.spool = workdir / "spool"
        self.threads: list[threading.Thread] = []
        self.counts: dict[str, int] = {job.name: 0 for job in JOBS}
        self.torn: list[Path] = []  # generations written with a short shard, for failing drills

    def durable(self, job: DemoJob) -> Path:
        return self.workdir / "ckpt" / job.name

    def first_tier(self, job: DemoJob) -> Path:
        return self.workdir / ("nvme" if job.staging else "ckpt") / job.name

    def start(self) -> None:
        # As deployed: every user's training job may make its directory in the spool.
        self.spool.mkdir(parents=True, exist_ok=True)
        os.chmod(self.spool, 0o1733)
        for job in JOBS:
            self.durable(job).mkdir(parents=True, exist_ok=True)
            self.first_tier(job).mkdir(parents=True, exist_ok=True)
        # Import torch (seconds) before the first save: inside a save's commit it would make
        # that save commit-bound for real.
        dcp_metadata({"warm-up": 1})
        for job in JOBS:
            self._spawn(self._train, job)
            if job.staging:
                self._spawn(self._drain, job)

    def _spawn(self, target, *args) -> None:  # type: ignore[no-untyped-def]
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _train(self, job: DemoJob) -> None:
        step = 0
        self.stop.wait(JOBS.index(job) * 3.0)  # staggered starts, as real jobs would be
        # The job says it runs (checkpoint_job_alive_timestamp_seconds): its pages follow its life.
        instrument.start(training_job=job.name, spool=str(self.spool), interval=HEARTBEAT)
        while not self.stop.is_set():
            step += 100
            started = time.monotonic()
            self._save(job, step)
            self.counts[job.name] += 1
            self._retain(self.first_tier(job))
            self.stop.wait(max(1.0, job.interval - (time.monotonic() - started)))

    def _save(self, job: DemoJob, step: int) -> None:
        slot = self.counts[job.name] % FAULT_EVERY
        fault = {1: job.fault, 2: job.second_fault}.get(slot, "none")
        target = self.first_tier(job) / f"step-{step}"
        target.mkdir(parents=True, exist_ok=True)
        size = int(job.shard_mb * MB)
        done = threading.Barrier(job.ranks + 1)
        committed = threading.Event()  # rank 0 renamed .metadata into place

        def rank(r: int) -> None:
            with instrument.saving(training_job=job.name, step=step, path=str(target),
                                   spool=str(self.spool), rank=r, world_size=job.ranks) as save:  # fmt: skip
                # The training-visible copy to host memory; slow (pinned memory exhausted, a
                # planner stuck) before anything is written for a staging-bound save.
                time.sleep(0.3 + 0.05 * r + (3.0 if fault == "staging_bound" else 0.0))
                save.resume()
                time.sleep(0.2)
                save.staged()
                delay = 3.0 if fault == "straggler" and r == job.ranks - 1 else 0.0
                self._write(target / f"__{r}_0.distcp", size, delay)
                save.written()
                done.wait()  # the commit waits for every rank
                if fault == "abort":
                    raise RuntimeError("rank 0 was killed mid-save (injected fault)")
                committed.wait()
            # `committed` is emitted on the way out, once .metadata is in place

        threads = [threading.Thread(target=self._quietly, args=(rank, r)) for r in range(job.ranks)]
        for thread in threads:
            thread.start()
        done.wait()
        if fault == "slow_commit":  # the payload is on storage; the final commit crawls
            time.sleep(job.deadline + 1.0)
        if fault != "abort":
            shards = {f"__{r}_0.distcp": size for r in range(job.ranks)}
            if fault == "torn":  # a shard short of what the metadata promises
                with open(target / "__0_0.distcp", "r+b") as shard:
                    shard.truncate(size // 2)
                self.torn.append(target)
            tmp = target / ".metadata.tmp"
            tmp.write_bytes(dcp_metadata(shards))
            os.replace(tmp, target / ".metadata")
        committed.set()
        for thread in threads:
            thread.join()

    @staticmethod
    def _quietly(function, *args) -> None:  # type: ignore[no-untyped-def]
        with contextlib.suppress(RuntimeError):  # an injected fault
            function(*args)

    def _write(self, path: Path, size: int, delay: float) -> None:
        chunk = b"\x5a" * (1 << 20)
        seconds_per_chunk = len(chunk) / (WRITE_MBPS_PER_RANK * MB)
        time.sleep(delay)
        with open(path, "wb") as out:
            left = size
            while left > 0 and not self.stop.is_set():
                out.write(chunk[: min(left, len(chunk))])
                left -= len(chunk)
                time.sleep(seconds_per_chunk)

    def _drain(self, job: DemoJob) -> None:
        """Copy committed staged generations to the durable tier, oldest first, .metadata last,
        throttled; each one once (a copy durable retention removed is not made again)."""
        drained: set[str] = set()
        while not self.stop.wait(1.0):
            staged = sorted(self.first_tier(job).glob("step-*"), key=_step)
            drained &= {generation.name for generation in staged}
            for generation in staged:
                copy = self.durable(job) / generation.name
                if generation.name in drained or not (generation / ".metadata").exists():
                    continue
                files = sorted(generation.iterdir(), key=lambda p: p.name == ".metadata")
                if len(files) != job.ranks + 1:
                    # Retention is removing it (shutil.rmtree takes shards before .metadata):
                    # a copy of what is left would be a torn checkpoint, committed.
                    continue
                copy.mkdir(exist_ok=True)
                for file in files:
                    try:
                        shutil.copyfile(file, copy / file.name)
                    except FileNotFoundError:
                        break  # retention removed it meanwhile: .metadata is never copied
                    self.stop.wait(file.stat().st_size / (DRAIN_MBPS * MB) if file.exists() else 0)
                else:
                    drained.add(generation.name)
                self._retain(self.durable(job))

    @staticmethod
    def _retain(tier: Path) -> None:
        generations = sorted(tier.glob("step-*"), key=_step)
        for old in generations[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)


def _step(generation: Path) -> int:
    return int(generation.name.split("-")[1])


# --- processes: exporter, Prometheus, Alertmanager ---------------------------------------------


def _config(workdir: Path, port: int, s3_port: int | None = None) -> str:
    lines = [
        f"spool: {workdir / 'spool'}",
        # No reserve: the demo's checkpoints are a few kilobytes on whatever disk the machine
        # has; with the default 20 % every job paged CheckpointCapacityLow on a disk over 80 %
        # full, a fault the demo does not play. A disk too full for one more generation still
        # pages.
        "defaults: {restore_drill_max_age: 5m, capacity_reserve: 0}",
        f"web: {{listen_address: '127.0.0.1:{port}'}}",
        "jobs:",
    ]
    for job in JOBS:
        staging = f", staging: {workdir / 'nvme' / job.name}" if job.staging else ""
        lines.append(
            f"  - {{name: {job.name}, path: {workdir / 'ckpt' / job.name}{staging}, "
            f"interval: {job.interval:g}s, deadline: {job.deadline:g}s, layout: dcp}}"
        )
    if s3_port is not None:
        lines.append(objects.config_line(s3_port))
    return "\n".join(lines) + "\n"


class Processes:
    def __init__(self) -> None:
        self.running: list[subprocess.Popen] = []

    def start(self, command: list[str], log: Path) -> subprocess.Popen:
        with open(log, "wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        self.running.append(process)
        return process

    def stop(self) -> None:
        for process in self.running:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.running:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _prometheus(workdir: Path, processes: Processes, port: int) -> list[str]:
    """Prometheus and Alertmanager with the generated rules, when installed."""
    prometheus = shutil.which("prometheus")
    alertmanager = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if not (prometheus and alertmanager):
        return ["Prometheus and Alertmanager are not installed (Debian: prometheus, "
                "prometheus-alertmanager): the exporter runs alone."]  # fmt: skip
    import yaml

    from checkpoint_exporter.mixin import rules
    from checkpoint_exporter.mixin.config import MixinConfig

    prometheus_port, alertmanager_port = port + 10, port + 11
    # NotReady is left its own `for`: the demo's first pass is not a fault to show.
    demo_for = {
        name: "0s"
        for name in ALERTS
        if name not in ("CheckpointExporterDown", "CheckpointExporterNotReady")
    }
    # The demo's alerts link to the runbooks this exporter serves.
    mixin = MixinConfig(
        event_window="2m", for_=demo_for, runbook_url=f"http://127.0.0.1:{port}/runbooks"
    )
    rule_file = workdir / "rules.yaml"
    rule_file.write_text(rules.to_yaml(rules.rule_groups(mixin)))
    (workdir / "alertmanager.yaml").write_text(yaml.safe_dump({
        "route": {"receiver": "demo", "group_wait": "2s", "group_interval": "5s"},
        "receivers": [{"name": "demo"}],
    }))  # fmt: skip
    scrapes = [{"job_name": "checkpoint-exporter",
                "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": {"cluster": "demo"}}]}]  # fmt: skip
    # This machine's node_exporter (Debian: prometheus-node-exporter), so the job dashboard's
    # checkpoint-window row (NIC and disk beside each save) has data: it meets the exporter by
    # host, 127.0.0.1. Only the collectors that row reads.
    node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if node_exporter:
        processes.start(
            [node_exporter, f"--web.listen-address=127.0.0.1:{port + 12}",
             "--collector.disable-defaults", "--collector.netdev", "--collector.diskstats",
             "--collector.infiniband"],
            workdir / "node_exporter.log",
        )  # fmt: skip
        scrapes.append({"job_name": "node", "static_configs": [
            {"targets": [f"127.0.0.1:{port + 12}"], "labels": {"cluster": "demo"}}]})  # fmt: skip
    (workdir / "prometheus.yaml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
        "rule_files": [str(rule_file)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]},
        "scrape_configs": scrapes,
    }))  # fmt: skip
    processes.start(
        [alertmanager, f"--config.file={workdir / 'alertmanager.yaml'}",
         f"--storage.path={workdir / 'alertmanager'}",
         f"--web.listen-address=127.0.0.1:{alertmanager_port}", "--cluster.listen-address="],
        workdir / "alertmanager.log",
    )  # fmt: skip
    processes.start(
        [prometheus, f"--config.file={workdir / 'prometheus.yaml'}",
         f"--storage.tsdb.path={workdir / 'prometheus'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}"],
        workdir / "prometheus.log",
    )  # fmt: skip
    return [
        f"Prometheus alerts:   http://127.0.0.1:{prometheus_port}/alerts",
        f"Alertmanager:        http://127.0.0.1:{alertmanager_port}/",
    ]


def _drill(workdir: Path, job: str, generation: str | None = None) -> None:
    command = [sys.executable, "-m", "checkpoint_exporter", "restore-drill",
               "--config.file", str(workdir / "config.yaml"), "--job", job]  # fmt: skip
    if generation:
        command += ["--generation", generation]
    subprocess.run(command, capture_output=True, timeout=120, check=False)


def _drills(workdir: Path, cluster: Cluster, stop: threading.Event) -> None:
    """A drill that passes, and one on the newest torn generation that fails, now and then."""
    stop.wait(15)
    while not stop.is_set():
        _drill(workdir, "llama70b-a")
        torn = [path for path in cluster.torn if (path / ".metadata").exists()]
        if torn:
            _drill(workdir, "llama70b-d", torn[-1].name)
        stop.wait(30)


# --- the status line ----------------------------------------------------------------------------


def _status(base: str) -> str:
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=2) as reply:
            text = reply.read().decode()
    except OSError:
        return "  (exporter not answering yet)"
    values: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("checkpoint_") and 'training_job="' in line:
            name = line.split("{", 1)[0]
            job = line.split('training_job="', 1)[1].split('"', 1)[0]
            if "phase=" in line and 'phase="total"' not in line:
                continue
            values[(name, job)] = float(line.rsplit(" ", 1)[1])
    now, rows = time.time(), []
    shown = [(job.name, job.deadline) for job in JOBS]
    if any(job == objects.NAME for _, job in values):
        shown.append((objects.NAME, objects.DEADLINE))
    for name, deadline in shown:

        def v(metric: str, job: str = name) -> float | None:
            return values.get((f"checkpoint_{metric}", job))

        committed = v("last_committed_timestamp_seconds")
        age = f"{now - committed:5.0f}s" if committed else "  none"
        total = v("last_save_phase_seconds")
        rows.append(
            f"  {name:<11} step {int(v('last_committed_step') or 0):>5}  age {age}  "
            f"last save {total or 0:5.1f}s/{deadline:g}s  saves {int(v('saves_committed_total') or 0):>3}  "
            f"late {int(v('deadline_misses_total') or 0)}  aborted {int(v('saves_aborted_total') or 0)}  "
            f"valid {int(v('last_committed_valid') if v('last_committed_valid') is not None else -1)}"
        )
    return "\n".join(rows)


def run(workdir: Path | None, duration: float | None, port: int = DEFAULT_PORT) -> int:
    own = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="checkpoint-demo-")) if own else workdir
    workdir.mkdir(parents=True, exist_ok=True)
    for sub in ("ckpt", "nvme", "spool"):
        (workdir / sub).mkdir(exist_ok=True)
    stop = threading.Event()
    processes = Processes()
    # A job in object storage, where an S3 server can run here (moto, in a development checkout).
    s3_port = port + 13 if objects.available() else None
    interrupted = []
    signal.signal(signal.SIGINT, lambda *_: (interrupted.append(1), stop.set()))
    signal.signal(signal.SIGTERM, lambda *_: (interrupted.append(1), stop.set()))
    base = f"http://127.0.0.1:{port}"
    try:
        if s3_port is not None:
            log = workdir / "s3.log"
            objects.wait_for_server(
                s3_port, processes.start(objects.server_command(s3_port), log), log
            )
            os.environ.update(objects.ENV)  # the exporter's and the drills' connection
        (workdir / "config.yaml").write_text(_config(workdir, port, s3_port))
        exporter = processes.start(
            [sys.executable, "-m", "checkpoint_exporter", "serve",
             "--config.file", str(workdir / "config.yaml")],
            workdir / "exporter.log",
        )  # fmt: skip
        extra = _prometheus(workdir, processes, port)
        cluster = Cluster(workdir, stop)
        cluster.start()
        if s3_port is not None:
            objects.ObjectJob(s3_port, cluster.spool, stop, dcp_metadata).start()
        threading.Thread(target=_drills, args=(workdir, cluster, stop), daemon=True).start()
        print(f"checkpoint-exporter demo in {workdir}")
        print(f"Landing page:        {base}/   (per-job save timelines)")
        print(f"Metrics:             {base}/metrics")
        for line in extra:
            print(line)
        if s3_port is not None:
            print(f"S3 (moto, embedded): http://127.0.0.1:{s3_port}   "
                  f"job {objects.NAME} in s3://{objects.BUCKET}/{objects.NAME}")  # fmt: skip
        print(f"Jobs: {', '.join(j.name for j in JOBS)}; faults every {FAULT_EVERY} saves. "
              "Ctrl-C stops everything.\n", flush=True)  # fmt: skip
        started = time.monotonic()
        while not stop.wait(5.0):
            if exporter.poll() is not None:
                print(
                    f"the exporter exited ({exporter.returncode}); see {workdir / 'exporter.log'}"
                )
                return 1
            print(time.strftime("%H:%M:%S"), flush=True)
            print(_status(base), flush=True)
            if duration is not None and time.monotonic() - started >= duration:
                break
    finally:
        stop.set()
        processes.stop()
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    print("demo stopped: every process it started is gone.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="checkpoint-exporter demo")
    parser.add_argument(
        "--workdir", type=Path, help="keep files here (default: a temporary directory)"
    )
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    return run(args.workdir, args.duration, args.port)


if __name__ == "__main__":
    sys.exit(main())
