"""Eight nodes and two shared scanners on this machine, in the cluster shape of DESIGN "Scopes and
sharding": a ``--scope=node`` exporter per node (its own spool, staging directory and port) and
two ``--scope=shared --shard=0/1`` replicas over one shared root, scraped by one real Prometheus
with the mixin's rules and routed to a real Alertmanager. A job spanning the eight nodes saves
every few seconds.

- the shared tree is read by the shared replicas alone, the ranks' clocks by the nodes alone;
- killing one replica loses no per-job series and fires nothing but the killed exporter's own
  alert;
- one node's ranks straggle: CheckpointStragglerNode names that node's instance and no other;
- the job stops saving: CheckpointTooOld fires once for the job, not once per node or replica.

The straggler rule compares each node's newest write end, whichever save it belongs to: for the
second or so in which the nodes' exporters have not all read a save's commit, a node already on
the new save looks a whole period ahead. Its `for` (4 s here, 5 m by default) is what rides that
out, so the period must exceed it by that second: saves every 6 s.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from checkpoint_exporter.mixin import rules
from checkpoint_exporter.mixin.config import SPLIT, MixinConfig
from tests.conftest import Exporter, require_tool, wait_for
from tests.helpers.alerting import Webhook, free_port, query
from tests.helpers.fleet import Monitoring, Objectives, Training, node_config, shared_config

pytestmark = [pytest.mark.prometheus, pytest.mark.daemon]

JOB = "llama-fleet"
CLUSTER = "fleet"
NODES = 8
STRAGGLER = 5
PERIOD = 6.0  # seconds between saves
# Interval plus deadline (12 s) is past the longest gap between commits the shared scanners see
# (a period, the straggler's lag and a poll); a straggler lags past a quarter of the deadline.
OBJECTIVES = Objectives(interval="8s", deadline="4s")
LAG = 2.0
# A node is compared only once it wrote the job's newest save: each save leaves the straggler out
# for its lag (the others wrote the next step first), so its alert holds for a period minus the
# lag at a time, and its `for` must fit in that (2 s of 4).
MIXIN = MixinConfig(
    rule_layout=SPLIT,  # the cluster's files: per-node and per-job, here in the one Prometheus
    stale_after="10s",  # every tier is polled every second
    for_={"CheckpointTooOld": "0s", "CheckpointDataStale": "0s", "CheckpointExporterDown": "0s",
          "CheckpointStragglerNode": "2s"},
)  # fmt: skip


@pytest.fixture
def closers():
    """Everything the test starts, stopped in reverse order however it ends."""
    stack: list = []
    yield stack
    for close in reversed(stack):
        close()


def start_exporters(args: list[tuple[str, ...]]) -> list[Exporter]:
    """Start them side by side: each spends a second or two importing."""
    with ThreadPoolExecutor(len(args)) as pool:
        return list(pool.map(lambda each: Exporter(*each), args))


def becomes(read, expected: object, timeout: float = 10) -> None:
    """Wait until ``read()`` returns ``expected``; fail showing the difference."""
    try:
        wait_for(lambda: read() == expected, timeout, interval=0.5)
    except AssertionError:
        assert read() == expected


def firing_since(prometheus: str, since: float) -> set[tuple[str, str, str]]:
    """(alertname, instance, training_job) of every alert that fired since ``since``."""
    window = max(1, round(time.time() - since))
    found = query(
        prometheus,
        f"group by (alertname, instance, training_job) "
        f'(max_over_time(ALERTS{{alertstate="firing"}}[{window}s]))',
    )
    return {
        (m["metric"]["alertname"], m["metric"].get("instance", ""),
         m["metric"].get("training_job", ""))
        for m in found
    }  # fmt: skip


def notified(webhook: Webhook, alertname: str) -> list[dict[str, str]]:
    """The labels of every notification of ``alertname`` the webhook received."""
    return [
        alert["labels"]
        for message in webhook.received
        for alert in message["alerts"]
        if alert["labels"]["alertname"] == alertname
    ]


def instances(prometheus: str, expr: str) -> set[str]:
    found = query(prometheus, f"group by (instance) ({expr})")
    return {item["metric"]["instance"] for item in found}


def per_job_series(prometheus: str) -> set[tuple[str, ...]]:
    """Every series of the job, raw or recorded (not the alerts' own), by name and labels other
    than instance."""
    found = query(prometheus, f'{{training_job="{JOB}", __name__!~"ALERTS.*"}}')
    return {
        tuple(sorted((k, v) for k, v in item["metric"].items() if k != "instance"))
        for item in found
    }


def test_a_fleet_of_node_exporters_and_shared_replicas(tmp_path: Path, closers: list) -> None:
    monitoring = Monitoring(
        tmp_path, require_tool("prometheus"), require_tool("prometheus-alertmanager")
    )
    closers.append(monitoring.close)
    shared_root = tmp_path / "shared"
    (shared_root / JOB).mkdir(parents=True)

    node_dirs = [tmp_path / f"node-{index}" for index in range(NODES)]
    node_args = [
        ("--config.file", str(node_config(node, JOB, shared_root, OBJECTIVES)), "--scope=node")
        for node in node_dirs
    ]
    replica_args = [
        ("--config.file", str(shared_config(tmp_path / f"shared-{index}", JOB, shared_root,
                                            OBJECTIVES)), "--scope=shared", "--shard=0/1")
        for index in range(2)
    ]  # fmt: skip
    exporters = start_exporters(node_args + replica_args)
    for exporter in exporters:
        closers.append(exporter.close)
    replicas = exporters[NODES:]
    address = [exporter.base.removeprefix("http://") for exporter in exporters]
    node_address, replica_address = address[:NODES], address[NODES:]

    webhook = Webhook()
    closers.append(webhook.close)
    prometheus = monitoring.start(MIXIN, address, webhook.url, (free_port(), free_port()), CLUSTER)

    training = Training(JOB, shared_root / JOB, [node / "spool" for node in node_dirs], PERIOD)
    training.start()
    closers.append(training.stop)

    # Every node reports its ranks' write end; the shared tree is read by the replicas alone.
    write_end = f'checkpoint_last_save_local_write_end_timestamp_seconds{{training_job="{JOB}"}}'
    committed = f'checkpoint_last_committed_timestamp_seconds{{training_job="{JOB}"}}'

    def first_save_recorded() -> bool:
        try:
            return bool(query(prometheus, f'{rules.LAST_COMMITTED}{{training_job="{JOB}"}}'))
        except OSError:
            return False  # Prometheus still starting

    wait_for(first_save_recorded, timeout=60, interval=1)
    becomes(lambda: instances(prometheus, write_end), set(node_address))
    becomes(lambda: instances(prometheus, committed), set(replica_address))
    started = time.time()
    assert instances(prometheus, 'checkpoint_job_info{tier="durable"}') == set(replica_address)
    assert instances(prometheus, 'checkpoint_job_info{tier="staging"}') == set(node_address)

    # One replica killed: the other keeps every per-job series, and nothing fires for the job.
    before = per_job_series(prometheus)
    recorded = {rules.LAST_COMMITTED, rules.LAST_SCAN_SUCCESS, rules.INTERVAL}
    assert recorded <= {dict(series)["__name__"] for series in before}
    killed, survivor = replicas[0], replica_address[1]
    killed.process.send_signal(signal.SIGKILL)
    killed.process.wait(timeout=10)
    killed_at = time.time()
    last = f'{rules.LAST_COMMITTED}{{training_job="{JOB}"}}'

    def newer_commit_seen() -> bool:
        found = query(prometheus, last)
        return bool(found) and float(found[0]["value"][1]) > killed_at

    try:
        wait_for(newer_commit_seen, timeout=4 * PERIOD, interval=1)
    except AssertionError:
        assert not before - per_job_series(prometheus)  # the series that went with the replica
        raise
    time.sleep(PERIOD)  # a whole save more under the survivor alone
    assert not before - per_job_series(prometheus)  # series may only have been added
    assert instances(prometheus, committed) == {survivor}
    down = {("CheckpointExporterDown", replica_address[0], "")}
    assert firing_since(prometheus, started) == down

    # One node's ranks straggle: that node's instance fires, no other.
    training.lag, training.straggler = LAG, STRAGGLER
    straggling_since = time.time()
    straggler = ("CheckpointStragglerNode", node_address[STRAGGLER], JOB)
    wait_for(
        lambda: straggler in firing_since(prometheus, straggling_since), timeout=60, interval=1
    )
    time.sleep(2 * PERIOD)  # two more saves for another node to fire
    assert firing_since(prometheus, started) == down | {straggler}
    assert {labels["instance"] for labels in notified(webhook, straggler[0])} == {straggler[1]}

    # The job stops saving: one CheckpointTooOld for the job, not one per node or replica.
    training.stop()
    stopped = time.time()
    too_old = 'ALERTS{alertname="CheckpointTooOld", alertstate="firing"}'
    wait_for(lambda: query(prometheus, too_old), timeout=60, interval=1)
    time.sleep(3)  # a few more evaluations, for a second instance of it to show
    window = round(time.time() - stopped) + 1
    (alert,) = query(prometheus, f"max_over_time({too_old}[{window}s])")
    labels = alert["metric"]
    assert labels == {"alertname": "CheckpointTooOld", "alertstate": "firing",
                      "cluster": CLUSTER, "training_job": JOB, "severity": "critical"}  # fmt: skip
    pages = wait_for(lambda: notified(webhook, "CheckpointTooOld"), timeout=30, interval=0.5)
    assert all(page == {k: v for k, v in labels.items() if k != "alertstate"} for page in pages)
    assert ("CheckpointDataStale", "", JOB) not in firing_since(prometheus, started)
