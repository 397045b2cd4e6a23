"""The Alertmanager route that ships (deploy/alertmanager/alertmanager.yml): amtool accepts it and
routes by severity; a real Alertmanager running it sends 200 stale jobs of one cluster as one
page, two jobs' CheckpointTooOld as two pages (two incidents), and mutes the slow budget burn's
ticket of a job whose fast burn pages; the AlertmanagerConfig of
deploy/kubernetes/components/alertmanager-route is the same route and passes the operator's
schema."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, require_tool, wait_for
from tests.helpers.alerting import Webhook, free_port, stop

ROUTE_FILE = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
COMPONENT = REPO / "deploy" / "kubernetes" / "components" / "alertmanager-route"
PAGER, TICKETS = "checkpoint-pager", "checkpoint-tickets"


def shipped() -> dict:
    return yaml.safe_load(ROUTE_FILE.read_text())


def checkpoint_route(config: dict) -> dict:
    """The subtree that routes checkpoint-exporter's alerts (the rest stands in for yours)."""
    ours = ['alertname=~"Checkpoint.+"']
    (route,) = (r for r in config["route"]["routes"] if r["matchers"] == ours)
    return route


@pytest.mark.prometheus
def test_amtool_accepts_the_route_and_sends_pages_and_tickets_apart(tmp_path: Path) -> None:
    amtool = require_tool("amtool")
    check = subprocess.run([amtool, "check-config", str(ROUTE_FILE)], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "1 inhibit rules" in check.stdout and "3 receivers" in check.stdout
    broken = tmp_path / "broken.yml"
    broken.write_text(ROUTE_FILE.read_text().replace("group_wait:", "group_wayt:"))
    assert subprocess.run([amtool, "check-config", str(broken)], capture_output=True).returncode
    for labels, receiver in (
        (["alertname=CheckpointTooOld", "severity=critical"], PAGER),
        (["alertname=CheckpointTooOld", "severity=warning"], TICKETS),
        (["alertname=CheckpointSaveAborted", "severity=info"], TICKETS),  # a mixin override
        (["alertname=NodeDown", "severity=critical"], "default"),  # not ours
    ):
        routed = subprocess.run(
            [amtool, "config", "routes", "test", "--config.file", str(ROUTE_FILE), *labels],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert routed.stdout.split() == [receiver], (labels, routed.stdout, routed.stderr)
    route = checkpoint_route(shipped())
    assert route["group_by"] == ["cluster", "alertname"]
    assert route["repeat_interval"] == "24h" and route["routes"][0]["repeat_interval"] == "4h"


# --- a real Alertmanager -------------------------------------------------------------------


class Alertmanager:
    """The shipped route on loopback, each receiver a webhook of the test's."""

    def __init__(self, tmp_path: Path, pager: Webhook, tickets: Webhook) -> None:
        config = shipped()
        for receiver in config["receivers"]:
            url = {PAGER: pager.url, TICKETS: tickets.url}.get(receiver["name"])
            receiver.pop("pagerduty_configs", None)
            receiver.pop("webhook_configs", None)
            if url:
                receiver["webhook_configs"] = [{"url": url, "send_resolved": False}]
        # Only the first wait is shortened, so the test does not wait a minute: group_by, the
        # later intervals, the routes and the inhibit rule run as shipped.
        checkpoint_route(config)["group_wait"] = "1s"
        (tmp_path / "am.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [require_tool("prometheus-alertmanager"), f"--config.file={tmp_path / 'am.yml'}",
             f"--storage.path={tmp_path / 'am-data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--cluster.listen-address="],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(self.ready, timeout=30, interval=0.2)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False  # still starting

    def post(self, alerts: list[dict[str, str]]) -> None:
        now = datetime.now(timezone.utc)
        body = [
            {"labels": labels, "annotations": {"summary": labels["alertname"]},
             "startsAt": now.isoformat(), "endsAt": (now + timedelta(hours=1)).isoformat()}
            for labels in alerts
        ]  # fmt: skip
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts", json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200

    def alerts(self, **labels: str) -> list[dict]:
        matchers = [f'{name}="{value}"' for name, value in labels.items()]
        query = urllib.parse.urlencode([("filter", m) for m in matchers])
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts?{query}", timeout=10) as reply:
            return json.load(reply)

    def close(self) -> None:
        stop(self.process)


def notifications(webhook: Webhook, alertname: str) -> list[dict]:
    return [m for m in webhook.received if m["groupLabels"].get("alertname") == alertname]


def jobs_in(message: dict) -> set[str]:
    return {alert["labels"]["training_job"] for alert in message["alerts"]}


@pytest.fixture
def alertmanager(tmp_path: Path):
    pager, tickets = Webhook(), Webhook()
    manager = None
    try:
        manager = Alertmanager(tmp_path, pager, tickets)
        yield manager, pager, tickets
    finally:
        if manager is not None:
            manager.close()
        pager.close()
        tickets.close()


@pytest.mark.prometheus
def test_a_hung_mount_is_one_page_a_jobs_page_its_own_and_a_page_mutes_its_ticket(
    alertmanager,
) -> None:
    manager, pager, tickets = alertmanager
    stale = [
        {"alertname": "CheckpointDataStale", "severity": "critical", "cluster": "gpu-a",
         "training_job": f"run-{n:03}", "tier": "durable"}
        for n in range(200)
    ]  # fmt: skip
    manager.post(stale)
    wait_for(lambda: notifications(pager, "CheckpointDataStale"), timeout=30, interval=0.1)

    # A job's own page is an incident of its own: run-b's CheckpointTooOld, coming while
    # run-a's is open (and perhaps acknowledged), must page rather than update run-a's.
    too_old = {"alertname": "CheckpointTooOld", "severity": "critical", "cluster": "gpu-a"}
    manager.post([{**too_old, "training_job": "run-a"}])
    wait_for(lambda: notifications(pager, "CheckpointTooOld"), timeout=30, interval=0.1)
    manager.post([{**too_old, "training_job": "run-b"}])
    wait_for(lambda: len(notifications(pager, "CheckpointTooOld")) == 2, timeout=30,
             interval=0.1)  # fmt: skip
    pages = notifications(pager, "CheckpointTooOld")
    assert [jobs_in(page) for page in pages] == [{"run-a"}, {"run-b"}]
    assert {page["groupKey"] for page in pages} != {pages[0]["groupKey"]}

    # The fast budget burn pages for run-a; its slow burn's ticket is muted while it does, and
    # run-b's slow burn (no page beside it) opens a ticket. The warnings go in one request, so
    # they are in one group: the notification that names run-b would name run-a as well.
    burn = {"alertname": "CheckpointDeadlineBudgetBurn", "cluster": "gpu-a"}
    fast = {**burn, "severity": "critical", "training_job": "run-a", "long": "6h", "short": "2h"}
    manager.post([fast])
    wait_for(lambda: notifications(pager, burn["alertname"]), timeout=30, interval=0.1)
    slow = {**burn, "severity": "warning", "long": "1d", "short": "2h"}
    manager.post([{**slow, "training_job": "run-a"}, {**slow, "training_job": "run-b"}])
    (ticket,) = wait_for(lambda: notifications(tickets, burn["alertname"]), timeout=30,
                         interval=0.1)  # fmt: skip
    assert jobs_in(ticket) == {"run-b"}
    (muted,) = manager.alerts(**burn, severity="warning", training_job="run-a")
    assert muted["status"]["state"] == "suppressed" and muted["status"]["inhibitedBy"]
    (kept,) = manager.alerts(**burn, severity="warning", training_job="run-b")
    assert kept["status"]["state"] == "active"
    (page,) = notifications(pager, burn["alertname"])
    assert page["receiver"] == PAGER and jobs_in(page) == {"run-a"}

    # One notification, to the pager, naming all 200 jobs; nothing of it went to tickets. A
    # second one could only come after group_interval (5m, as shipped) with a new member.
    (message,) = notifications(pager, "CheckpointDataStale")
    assert message["receiver"] == PAGER
    assert message["groupLabels"] == {"cluster": "gpu-a", "alertname": "CheckpointDataStale"}
    assert jobs_in(message) == {labels["training_job"] for labels in stale}
    assert not notifications(tickets, "CheckpointDataStale")


# --- the AlertmanagerConfig ----------------------------------------------------------------


def _matchers(found: list[dict]) -> list[str]:
    """An AlertmanagerConfig's matchers as alertmanager.yml spells them."""
    return [f'{m["name"]}{m.get("matchType", "=")}"{m["value"]}"' for m in found]


def _as_alertmanager_yml(route: dict) -> dict:
    """An AlertmanagerConfig route (camelCase, matcher objects) in alertmanager.yml's terms."""
    names = {"groupBy": "group_by", "groupWait": "group_wait", "groupInterval": "group_interval",
             "repeatInterval": "repeat_interval", "receiver": "receiver"}  # fmt: skip
    out: dict = {names[key]: value for key, value in route.items() if key in names}
    out["matchers"] = _matchers(route["matchers"])
    if "routes" in route:
        out["routes"] = [_as_alertmanager_yml(child) for child in route["routes"]]
    assert set(route) <= {*names, "matchers", "routes"}, route
    return out


@pytest.mark.kubectl
def test_the_alertmanagerconfig_is_the_same_route_and_passes_the_operator_schema(
    tmp_path: Path,
) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = Path(os.path.relpath(REPO / "deploy" / "kubernetes", overlay))
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "namespace": "monitoring", "resources": [str(base)],
        "components": [str(base / "components" / COMPONENT.name)],
    }))  # fmt: skip
    rendered = subprocess.run([require_tool("kubectl"), "kustomize", str(overlay)],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    (config,) = (d for d in docs if d["kind"] == "AlertmanagerConfig")
    assert config["metadata"]["namespace"] == "monitoring"
    spec = config["spec"]
    assert _as_alertmanager_yml(spec["route"]) == checkpoint_route(shipped())
    (rule,) = spec["inhibitRules"]
    (expected,) = shipped()["inhibit_rules"]
    assert {
        "source_matchers": _matchers(rule["sourceMatch"]),
        "target_matchers": _matchers(rule["targetMatch"]),
        "equal": rule["equal"],
    } == expected
    receivers = {r["name"]: r for r in spec["receivers"]}
    shipped_receivers = {r["name"]: r for r in shipped()["receivers"]}
    assert set(receivers) == {PAGER, TICKETS}
    assert "pagerdutyConfigs" in receivers[PAGER]
    assert "pagerduty_configs" in shipped_receivers[PAGER]
    ticket_url = shipped_receivers[TICKETS]["webhook_configs"][0]["url"]
    assert receivers[TICKETS]["webhookConfigs"][0]["url"] == ticket_url
    script = REPO / "tests" / "k8s" / "validate.mjs"
    checked = subprocess.run([require_tool("node"), str(script)], text=True, capture_output=True,
                             input=yaml.safe_dump(config), timeout=120)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.split() == ["VALID", "AlertmanagerConfig/checkpoint-exporter"]
    config["spec"]["route"]["groupWait"] = "soon"  # the schema does reject a wrong one
    checked = subprocess.run([require_tool("node"), str(script)], text=True, capture_output=True,
                             input=yaml.safe_dump(config), timeout=120)  # fmt: skip
    assert checked.returncode == 1 and "INVALID AlertmanagerConfig" in checked.stdout
