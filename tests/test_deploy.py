"""Deployment artifacts: systemd units that systemd itself accepts, Kubernetes manifests that
kustomize renders and real validators accept, and a container image build where Docker runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from checkpoint_exporter.mixin.config import MixinConfig
from tests.conftest import REPO, require_tool

pytestmark = [pytest.mark.kubectl]

SYSTEMD = REPO / "deploy" / "systemd"
KUBERNETES = REPO / "deploy" / "kubernetes"


@pytest.fixture
def units(tmp_path: Path) -> Path:
    """The units with ExecStart pointing at this checkout's command (verify checks it exists),
    and the drill template instantiated (a template itself cannot be verified)."""
    command = str(Path(sys.executable).parent / "checkpoint-exporter")
    for unit in SYSTEMD.glob("checkpoint-exporter*"):
        text = unit.read_text().replace("/usr/bin/checkpoint-exporter", command)
        (tmp_path / unit.name.replace("@.", "@llama70b.")).write_text(text)
    return tmp_path


def test_systemd_accepts_the_units(units: Path) -> None:
    analyze = require_tool("systemd-analyze")
    files = [str(units / name) for name in (
        "checkpoint-exporter.service", "checkpoint-exporter-restore-drill@llama70b.service",
        "checkpoint-exporter-restore-drill@llama70b.timer",
    )]  # fmt: skip
    result = subprocess.run([analyze, "verify", *files], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stderr
    broken = units / "broken.service"
    broken.write_text((units / "checkpoint-exporter.service").read_text().replace(
        "ProtectSystem=", "ProtectSystm="))  # fmt: skip
    result = subprocess.run([analyze, "verify", str(broken)], capture_output=True, text=True)
    assert "Unknown key 'ProtectSystm'" in result.stderr  # verify does notice mistakes


def test_the_service_is_locked_down(units: Path) -> None:
    unit = (SYSTEMD / "checkpoint-exporter.service").read_text()
    for setting in ("ProtectSystem=strict", "NoNewPrivileges=yes", "CapabilityBoundingSet=\n",
                    "Restart=on-failure", "User=checkpoint-exporter",
                    "StateDirectory=checkpoint-exporter", "ReadOnlyPaths="):  # fmt: skip
        assert setting in unit, setting
    assert "ReadWritePaths" not in unit  # only its state directory is writable
    result = subprocess.run(
        [require_tool("systemd-analyze"), "security", "--offline=yes",
         str(units / "checkpoint-exporter.service")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    exposure = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", result.stdout).group(1))
    assert exposure <= 3.0, result.stdout[-2000:]  # systemd rates 0-10; "OK" is below 4


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    result = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(KUBERNETES)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_kustomize_renders_every_object(rendered: list[dict]) -> None:
    kinds = sorted(doc["kind"] for doc in rendered)
    assert kinds == sorted([
        "ServiceAccount", "ConfigMap", "ConfigMap", "Service", "CronJob", "DaemonSet",
        "PrometheusRule", "ServiceMonitor",
    ])  # fmt: skip
    daemonset = next(doc for doc in rendered if doc["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }  # fmt: skip
    assert container["resources"]["requests"] and container["resources"]["limits"]
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}
    assert mounts["/host/proc"] and mounts["/host/sys"] and mounts["/mnt/ckpt"]
    assert not mounts["/var/lib/checkpoint-exporter/spool"]  # the one thing it writes
    assert pod["tolerations"] and pod["nodeSelector"]
    # The generated ConfigMap's name (with its hash) is what the pods mount.
    config = next(d for d in rendered if d["kind"] == "ConfigMap" and "config.yaml" in d["data"])
    assert {"name": "config", "configMap": {"name": config["metadata"]["name"]}} in pod["volumes"]
    dashboards = next(d for d in rendered if d["metadata"]["name"].endswith("-dashboards"))
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert len(dashboards["data"]) == 4


def test_probes_wait_for_the_port_and_never_for_the_first_pass(rendered: list[dict]) -> None:
    """The port opens at once, the first pass may take minutes: only readiness waits for it."""
    daemonset = next(doc for doc in rendered if doc["kind"] == "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    startup, readiness, liveness = (
        container[probe] for probe in ("startupProbe", "readinessProbe", "livenessProbe")
    )
    assert startup["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert readiness["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert liveness["httpGet"] == {"path": "/healthz", "port": "metrics"}

    def patience(probe: dict) -> int:  # seconds of failures before the kubelet acts
        return probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)

    assert patience(startup) >= 60  # interpreter, imports and NVML before the port opens
    assert patience(liveness) >= 60  # a wedged core, not a slow scrape
    assert {"name": "metrics", "containerPort": 25780, "protocol": "TCP"} in container["ports"]


def test_the_default_runbook_url_is_the_service(rendered: list[dict]) -> None:
    """Alerts link to /runbooks on the exporters, through the Service these manifests create."""
    service = next(doc for doc in rendered if doc["kind"] == "Service")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "metrics")
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    assert MixinConfig().runbook_url == f"http://{name}.{namespace}.svc:{port}/runbooks"
    # Its name resolves to exporters still on their first pass too: they serve /runbooks.
    assert service["spec"]["publishNotReadyAddresses"] is True


def test_core_objects_pass_the_kubernetes_schemas(rendered: list[dict], tmp_path: Path) -> None:
    core = [doc for doc in rendered if not doc["apiVersion"].startswith("monitoring.coreos.com")]
    manifest = tmp_path / "core.yaml"
    manifest.write_text(yaml.safe_dump_all(core))
    validator = str(Path(sys.executable).parent / "kubernetes-validate")
    result = subprocess.run([validator, "--strict", str(manifest)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed") == len(core)
    core[0]["spec"] = {"bogus": 1}  # the validator does reject a wrong object
    manifest.write_text(yaml.safe_dump_all(core))
    assert (
        subprocess.run([validator, "--strict", str(manifest)], capture_output=True).returncode != 0
    )


def test_operator_objects_pass_the_operator_schemas(rendered: list[dict]) -> None:
    node = require_tool("node")
    script = REPO / "tests" / "k8s" / "validate.mjs"
    if not (REPO / "tests" / "k8s" / "node_modules").is_dir():
        pytest.fail(
            "tests/k8s/node_modules is missing: run `make test` (npm ci --prefix tests/k8s)"
        )
    custom = [d for d in rendered if d["apiVersion"].startswith("monitoring.coreos.com")]
    custom.append(yaml.safe_load((KUBERNETES / "podmonitor.yaml").read_text()))
    result = subprocess.run([node, str(script)], input=yaml.safe_dump_all(custom), text=True,
                            capture_output=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(result.stdout.split()) == sorted(
        ["VALID", "PodMonitor/checkpoint-exporter", "VALID", "PrometheusRule/checkpoint-exporter",
         "VALID", "ServiceMonitor/checkpoint-exporter"]
    )  # fmt: skip
    custom[0]["spec"]["groups"][0]["rules"][0]["expr"] = ["not", "a", "string"]
    result = subprocess.run([node, str(script)], input=yaml.safe_dump_all(custom), text=True,
                            capture_output=True, timeout=120)  # fmt: skip
    assert result.returncode == 1 and "INVALID PrometheusRule" in result.stdout


def test_the_split_rules_component_replaces_the_single_prometheusrule(tmp_path: Path) -> None:
    """The cluster shape's overlay: the per-node rules for every Prometheus shard, the per-job
    rules for a ThanosRuler, the same groups as the single PrometheusRule, and the operator's
    schema accepts both."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = Path(os.path.relpath(KUBERNETES, overlay))  # kustomize refuses absolute paths
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "namespace": "monitoring", "resources": [str(base)],
        "components": [str(base / "components" / "split-rules")],
    }))  # fmt: skip
    result = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(overlay)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rules = {
        doc["metadata"]["name"]: doc
        for doc in yaml.safe_load_all(result.stdout)
        if doc and doc["kind"] == "PrometheusRule"
    }
    assert sorted(rules) == ["checkpoint-exporter-job", "checkpoint-exporter-node"]
    node, job = rules["checkpoint-exporter-node"], rules["checkpoint-exporter-job"]
    assert node["metadata"]["labels"]["prometheus"] == "k8s"  # every shard's ruleSelector
    assert "prometheus" not in job["metadata"]["labels"]  # a shard must not evaluate these
    assert job["metadata"]["labels"]["checkpoint-exporter/rules"] == "job"
    assert node["metadata"]["namespace"] == job["metadata"]["namespace"] == "monitoring"
    single = yaml.safe_load((KUBERNETES / "prometheusrule.yaml").read_text())
    assert node["spec"]["groups"] + job["spec"]["groups"] == single["spec"]["groups"]
    script = REPO / "tests" / "k8s" / "validate.mjs"
    checked = subprocess.run([require_tool("node"), str(script)], text=True, capture_output=True,
                             input=yaml.safe_dump_all([node, job]), timeout=120)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_container_image_builds() -> None:
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "info"], capture_output=True).returncode != 0:
        pytest.skip("no Docker engine answers on this machine: the image build runs where one does")
    result = subprocess.run(
        [docker, "build", "-t", "checkpoint-exporter:test", str(REPO)],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    version = subprocess.run(
        [docker, "run", "--rm", "checkpoint-exporter:test", "--version"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert version.stdout.startswith("checkpoint-exporter ")
    user = subprocess.run(
        [docker, "run", "--rm", "--entrypoint", "id", "checkpoint-exporter:test", "-u"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert user.stdout.strip() != "0"
