"""Deployment artifacts: systemd units that systemd itself accepts, Kubernetes manifests that
kustomize renders and real validators accept, whose spool training pods can write and whose
labels both Prometheus Operator flavours select. The image is built and run by test_image.py."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from checkpoint_exporter.cli import build_parser
from checkpoint_exporter.config import (
    NODE,
    SHARED,
    ConfigError,
    Serving,
    parse_config,
    parse_serving,
)
from checkpoint_exporter.mixin import generate
from checkpoint_exporter.mixin.config import SPLIT, MixinConfig, load_mixin
from tests.conftest import REPO, as_user, as_user_env, require_tool

pytestmark = [pytest.mark.kubectl]

SYSTEMD = REPO / "deploy" / "systemd"
KUBERNETES = REPO / "deploy" / "kubernetes"
BASE = KUBERNETES / "base"
# Where the units run the command: the package's own virtualenv (docs/install-package.md).
INSTALLED = "/opt/checkpoint-exporter/bin/checkpoint-exporter"
GUIDE = REPO / "docs" / "kubernetes.md"
# The instance each template is verified as: a job for the drill, shard 0 of 2 for the scanner.
INSTANCES = {"checkpoint-exporter-restore-drill@": "llama70b", "checkpoint-exporter-shared@": "0-2"}


@pytest.fixture
def units(tmp_path: Path) -> Path:
    """The units with ExecStart pointing at this checkout's command (verify checks it exists),
    and the templates instantiated (a template itself cannot be verified). The units as shipped,
    on a node where the package is installed where they say, are verified by
    tests/install/test_package.py."""
    command = str(Path(sys.executable).parent / "checkpoint-exporter")
    for unit in SYSTEMD.glob("checkpoint-exporter*"):
        text = unit.read_text()
        if unit.suffix == ".service":
            assert INSTALLED in text, f"{unit.name}: ExecStart does not run {INSTALLED}"
        text = text.replace(INSTALLED, command)
        name = unit.name
        for template, instance in INSTANCES.items():
            name = name.replace(f"{template}.", f"{template}{instance}.")
        (tmp_path / name).write_text(text)
    return tmp_path


def test_systemd_accepts_the_units(units: Path) -> None:
    analyze = require_tool("systemd-analyze")
    files = [str(units / name) for name in (
        "checkpoint-exporter.service", "checkpoint-exporter-restore-drill@llama70b.service",
        "checkpoint-exporter-restore-drill@llama70b.timer",
        "checkpoint-exporter-shared@0-2.service",
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
    assert _exposure(units / "checkpoint-exporter.service") <= 3.0


def _exposure(unit: Path) -> float:
    """systemd's 0-10 exposure rating of a unit ("OK" is below 4)."""
    result = subprocess.run(
        [require_tool("systemd-analyze"), "security", "--offline=yes", str(unit)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    found = re.search(r"Overall exposure level for \S+: ([\d.]+)", result.stdout)
    assert found, result.stdout[-2000:] + result.stderr
    return float(found.group(1))


def _serving(argv: list[str]) -> Serving:
    """What a command line serves, read by the real CLI parser (a misspelt flag fails)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"the CLI rejects {argv}")
    return parse_serving(args.scope, args.shard)


def test_the_shared_scanner_unit_serves_its_shard_and_writes_nothing(units: Path) -> None:
    """checkpoint-exporter-shared@0-2.service runs --scope=shared --shard=0/2: the instance is
    the shard escaped as systemd escapes a path, and %I unescapes it."""
    template = (SYSTEMD / "checkpoint-exporter-shared@.service").read_text()
    exec_start = shlex.split(re.search(r"^ExecStart=(.*)$", template, re.M).group(1))
    instance = subprocess.run(
        [require_tool("systemd-escape"), "--unescape", "--instance",
         "checkpoint-exporter-shared@0-2.service"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    argv = [arg.replace("%I", instance) for arg in exec_start[1:]]
    assert _serving(argv) == Serving(frozenset({SHARED}), shard=0, shards=2)
    for setting in ("ProtectSystem=strict", "NoNewPrivileges=yes", "CapabilityBoundingSet=\n",
                    "PrivateDevices=yes", "Restart=on-failure",
                    "User=checkpoint-exporter"):  # fmt: skip
        assert setting in template, setting
    # Nothing is writable: no spool (the node exporters own it), no state directory.
    assert "ReadWritePaths" not in template and "StateDirectory" not in template
    assert _exposure(units / "checkpoint-exporter-shared@0-2.service") <= 2.5


def _render(shape: Path) -> list[dict]:
    result = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(shape)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    """The node shape: deploy/kubernetes/node."""
    return _render(KUBERNETES / "node")


@pytest.fixture(scope="module")
def cluster() -> list[dict]:
    """The cluster shape: deploy/kubernetes, the default."""
    return _render(KUBERNETES)


@pytest.fixture(scope="module", params=["node", "cluster"])
def shape(request: pytest.FixtureRequest) -> list[dict]:
    return request.getfixturevalue("rendered" if request.param == "node" else "cluster")


def test_kustomize_renders_every_object(rendered: list[dict]) -> None:
    kinds = sorted(doc["kind"] for doc in rendered)
    assert kinds == sorted([
        "ServiceAccount", "ConfigMap", "ConfigMap", "Service", "CronJob", "DaemonSet",
        "PrometheusRule", "ServiceMonitor", "NetworkPolicy",
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


def test_the_in_cluster_runbook_recipe_names_a_service_the_manifests_create(
    cluster: list[dict], tmp_path: Path
) -> None:
    """docs/kubernetes.md's runbook_url for readers inside the cluster: the shared scanners'
    Service (a few addresses, each serving /runbooks from the start), accepted only with the
    opt-in; the default links open anywhere."""
    recipe = yaml.safe_load(_guide_block("# mixin.yaml: runbooks inside the cluster"))
    url = urllib.parse.urlsplit(recipe["runbook_url"])
    name, namespace, svc = url.hostname.split(".")
    service = _one(cluster, "Service", name)
    assert (svc, namespace) == ("svc", service["metadata"]["namespace"])
    assert url.port in {port["port"] for port in service["spec"]["ports"]}
    assert url.path == "/runbooks" and service["spec"]["publishNotReadyAddresses"] is True
    mixin = tmp_path / "mixin.yaml"
    mixin.write_text(yaml.safe_dump(recipe))
    assert load_mixin(str(mixin)).runbook("CheckpointTooOld").endswith("/runbooks#checkpointtooold")
    mixin.write_text(yaml.safe_dump({"runbook_url": recipe["runbook_url"]}))
    with pytest.raises(ConfigError, match=r"runbook_url: .* runbook_url_internal: true"):
        load_mixin(str(mixin))
    assert MixinConfig().runbook_url.startswith("https://github.com/")


def test_core_objects_pass_the_kubernetes_schemas(shape: list[dict], tmp_path: Path) -> None:
    core = [copy.deepcopy(d) for d in shape if not d["apiVersion"].startswith("monitoring.coreos")]
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
    custom = [copy.deepcopy(d) for d in rendered if d["apiVersion"].startswith("monitoring.coreos")]
    custom.append(yaml.safe_load((BASE / "podmonitor.yaml").read_text()))
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
        "namespace": "monitoring", "resources": [str(base / "node")],
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
    # The one Prometheus of a default install loads both (the same as the single file); a
    # ThanosRuler selects the per-job ones by their scope.
    for scope, rule in (("node", node), ("job", job)):
        labels = rule["metadata"]["labels"]
        assert labels.items() >= MixinConfig().rule_labels.items(), scope
        assert labels["checkpoint-exporter/rules"] == scope
    assert node["metadata"]["namespace"] == job["metadata"]["namespace"] == "monitoring"
    single = yaml.safe_load((BASE / "prometheusrule.yaml").read_text())
    assert node["spec"]["groups"] + job["spec"]["groups"] == single["spec"]["groups"]
    script = REPO / "tests" / "k8s" / "validate.mjs"
    checked = subprocess.run([require_tool("node"), str(script)], text=True, capture_output=True,
                             input=yaml.safe_dump_all([node, job]), timeout=120)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


# --- the cluster shape ---------------------------------------------------------------------


def _one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, [d["metadata"]["name"] for d in found]
    return found[0]


def _kubelet_expand(text: str, env: dict[str, str]) -> str:
    """What the kubelet does to command and args: $(VAR) becomes the variable's value, $$ a
    literal $, an unknown $(NAME) stays as written."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


def _pod_argv(container: dict, env: dict[str, str], tmp_path: Path) -> list[str]:
    """The exporter's argv in a pod: the container's args, or what its shell wrapper execs,
    run by a real shell with a stand-in checkpoint-exporter that prints its arguments."""
    args = [_kubelet_expand(arg, env) for arg in container.get("args", [])]
    command = [_kubelet_expand(arg, env) for arg in container.get("command", [])]
    if not command:
        return args
    stand_in = tmp_path / "bin" / "checkpoint-exporter"
    stand_in.parent.mkdir(exist_ok=True)
    stand_in.write_text("#!/bin/sh\nprintf '%s\\0' \"$@\"\n")
    stand_in.chmod(0o755)
    shell = [require_tool(Path(command[0]).name), *command[1:]]
    result = subprocess.run([*shell, *args], capture_output=True, text=True, timeout=30,
                            env={"PATH": f"{stand_in.parent}:/usr/bin:/bin", **env})  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\0")[:-1]


def _pod_env(container: dict, pod_labels: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet sets it: values, and labels by fieldRef."""
    env = {}
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
            continue
        path = variable["valueFrom"]["fieldRef"]["fieldPath"]
        label = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
        assert label, f"{variable['name']}: only labels are resolved here, not {path}"
        env[variable["name"]] = pod_labels[label.group(1)]
    return env


def _workloads(docs: list[dict]) -> list[tuple[dict, dict]]:
    """(workload, pod template) for every object that runs containers."""
    found = []
    for doc in docs:
        if doc["kind"] in ("DaemonSet", "StatefulSet", "Deployment"):
            found.append((doc, doc["spec"]["template"]))
        elif doc["kind"] == "CronJob":
            found.append((doc, doc["spec"]["jobTemplate"]["spec"]["template"]))
    return found


def test_every_container_runs_a_command_line_the_cli_accepts(
    shape: list[dict], tmp_path: Path
) -> None:
    """Each container's arguments, through the kubelet's expansion and any shell wrapper, parse
    with the real CLI parser: a misspelt flag or a bad --shard fails here, not in the cluster."""
    workloads = _workloads(shape)
    assert {doc["kind"] for doc, _ in workloads} >= {"DaemonSet", "CronJob"}
    for doc, template in workloads:
        replicas = doc["spec"].get("replicas", 1)
        for container in template["spec"]["containers"]:
            for index in range(replicas):
                labels = {**template.get("metadata", {}).get("labels", {}),
                          "apps.kubernetes.io/pod-index": str(index)}  # fmt: skip
                argv = _pod_argv(container, _pod_env(container, labels), tmp_path)
                if argv[0] == "serve":
                    _serving(argv)
                else:
                    try:
                        build_parser().parse_args(argv)
                    except SystemExit:
                        pytest.fail(f"{doc['metadata']['name']}: the CLI rejects {argv}")


def test_the_node_shape_serves_both_scopes_on_every_node(rendered: list[dict]) -> None:
    daemonset = _one(rendered, "DaemonSet")
    assert _serving(daemonset["spec"]["template"]["spec"]["containers"][0]["args"]) == Serving()
    assert not [d for d in rendered if d["kind"] in ("StatefulSet", "Deployment")]


def _config(docs: list[dict]) -> dict:
    config = next(d for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d["data"])
    return yaml.safe_load(config["data"]["config.yaml"])


def test_each_shape_marks_the_shared_roots_shared(shape: list[dict]) -> None:
    """Set, not guessed from the mount: a node-scope pod then never stats below the root."""
    config = _config(shape)
    assert config["discover"] and all(root["scope"] == SHARED for root in config["discover"])


def test_the_shipped_config_pages_for_no_guessed_objectives(shape: list[dict]) -> None:
    """No interval or deadline stated for the discovered runs: they are watched and open
    tickets until someone states their real objectives (docs/kubernetes.md says how)."""
    text = next(d for d in shape if d["kind"] == "ConfigMap" and "config.yaml" in d["data"])
    config = parse_config(text["data"]["config.yaml"], "config.yaml", Path("/"))
    assert config.discover and not any(root.policy.page for root in config.discover)


def _mounts(template: dict) -> dict[str, dict]:
    """mountPath -> the volume behind it, with the mount's readOnly."""
    pod = template["spec"]
    volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
    return {
        mount["mountPath"]: {**volumes[mount["name"]], "readOnly": mount.get("readOnly", False)}
        for mount in pod["containers"][0]["volumeMounts"]
    }


def test_the_cluster_daemonset_reads_only_this_node(cluster: list[dict]) -> None:
    """--scope=node, and nothing of the shared filesystem mounted: the names of the jobs under
    a shared discover root come from the spool (config: scope: shared)."""
    template = _one(cluster, "DaemonSet")["spec"]["template"]
    argv = template["spec"]["containers"][0]["args"]
    assert _serving(argv) == Serving(frozenset({NODE}))
    assert all(root.get("scope") == "shared" for root in _config(cluster)["discover"])
    mounts = _mounts(template)
    assert set(mounts) == {"/etc/checkpoint-exporter", "/host/proc", "/host/sys",
                           "/var/lib/checkpoint-exporter/spool"}  # fmt: skip
    assert "checkpoints" not in {v["name"] for v in template["spec"]["volumes"]}


def _shards(docs: list[dict], tmp_path: Path) -> int:
    """N, after checking that the scanner pods run --scope=shared and serve every shard of N
    twice, each pod's command line as the kubelet and the shell make it."""
    scanners = _one(docs, "StatefulSet")
    template = scanners["spec"]["template"]
    container = template["spec"]["containers"][0]
    servings = []
    for index in range(scanners["spec"]["replicas"]):
        labels = {**template["metadata"]["labels"], "apps.kubernetes.io/pod-index": str(index)}
        servings.append(_serving(_pod_argv(container, _pod_env(container, labels), tmp_path)))
    shards = servings[0].shards
    assert all(s.scopes == {SHARED} and s.shards == shards for s in servings)
    assert sorted(s.shard for s in servings) == sorted(list(range(shards)) * 2)
    return shards


def test_the_shared_scanners_run_two_replicas_of_every_shard_on_separate_nodes(
    cluster: list[dict], tmp_path: Path
) -> None:
    shards = _shards(cluster, tmp_path)
    assert shards >= 2  # the shipped shape shards, so the wrapper's arithmetic is exercised
    template = _one(cluster, "StatefulSet")["spec"]["template"]
    container = template["spec"]["containers"][0]
    # Every scanner on its own node, so a shard's two replicas never share one.
    (term,) = template["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    budget = _one(cluster, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert (
        budget["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    )
    # The shared roots, read-only, and nothing of the node: no spool, no host /proc or network.
    mounts = _mounts(template)
    roots = {root["root"] for root in _config(cluster)["discover"]}
    assert set(mounts) == {"/etc/checkpoint-exporter", *roots}
    assert all(mount["readOnly"] for mount in mounts.values())
    assert not template["spec"].get("hostNetwork")
    # The same probes as the DaemonSet: only readiness waits for the first pass.
    node = _one(cluster, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe] == node[probe], probe
    assert container["securityContext"] == node["securityContext"]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_the_readme_overlay_changes_the_number_of_shards(tmp_path: Path) -> None:
    """docs/kubernetes.md's own overlay, on the cluster shape as shipped: four shards, two pods
    each."""
    guide = (REPO / "docs" / "kubernetes.md").read_text()
    block = re.search(r"```yaml\n(# kustomization.yaml of your overlay\n.*?)```", guide, re.S)
    assert block, "docs/kubernetes.md: the overlay example is gone"
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    default = os.path.relpath(KUBERNETES, overlay)  # the cluster shape
    text = block.group(1).replace("<path to>/deploy/kubernetes", default)
    (overlay / "kustomization.yaml").write_text(text)
    assert _shards(_render(overlay), tmp_path) == 4


def test_the_guides_overlay_changes_the_number_of_shards(tmp_path: Path) -> None:
    """docs/kubernetes.md's overlay, on the default shape: four shards, two pods each."""
    block = _guide_block("# kustomization.yaml of your overlay")
    assert _shards(_render(_overlay(tmp_path, {"kustomization.yaml": block})), tmp_path) == 4


def test_both_processes_are_scraped_once_under_the_rules_job(cluster: list[dict]) -> None:
    """Each workload's pods behind exactly one Service and each Service scraped by exactly one
    ServiceMonitor, whose job label is the one the rules select: the per-job rules' max by
    (training_job) sees the node exporters and both replicas of every shard."""
    services = [d for d in cluster if d["kind"] == "Service"]
    monitors = [d for d in cluster if d["kind"] == "ServiceMonitor"]
    for workload, template in _workloads(cluster):
        if workload["kind"] == "CronJob":
            continue
        pods = template["metadata"]["labels"]
        (service,) = [s for s in services if _selects(s["spec"]["selector"], pods)]
        labels = service["metadata"]["labels"]
        (monitor,) = [m for m in monitors if _selects(m["spec"]["selector"]["matchLabels"], labels)]
        assert f'job="{labels[monitor["spec"]["jobLabel"]]}"' == MixinConfig().selector
        assert {"port": "metrics"}.items() <= monitor["spec"]["endpoints"][0].items()
    assert _one(cluster, "StatefulSet")["spec"]["serviceName"] in {
        s["metadata"]["name"] for s in services
    }


def test_every_exporter_scrape_names_its_node(shape: list[dict]) -> None:
    """The node name the dashboards meet node_exporter and dcgm-exporter by, on the exporters'
    series as the mixin's first exporter_node_labels: from the pod's node, on every monitor."""
    podmonitor = yaml.safe_load((BASE / "podmonitor.yaml").read_text())
    monitors = [d for d in shape if d["kind"] == "ServiceMonitor"] + [podmonitor]
    assert len(monitors) == (3 if _has(shape, "StatefulSet") else 2)
    node = {"sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": MixinConfig().exporter_node_labels[0]}  # fmt: skip
    for monitor in monitors:
        spec = monitor["spec"]
        for endpoint in spec.get("endpoints", []) + spec.get("podMetricsEndpoints", []):
            assert node in endpoint["relabelings"], monitor["metadata"]["name"]


def test_the_cluster_shape_takes_the_split_rules(cluster: list[dict]) -> None:
    rules = sorted(d["metadata"]["name"] for d in cluster if d["kind"] == "PrometheusRule")
    assert rules == ["checkpoint-exporter-job", "checkpoint-exporter-node"]
    assert {d["metadata"]["namespace"] for d in cluster} == {"monitoring"}


def test_cluster_operator_objects_pass_the_operator_schemas(cluster: list[dict]) -> None:
    script = REPO / "tests" / "k8s" / "validate.mjs"
    custom = [d for d in cluster if d["apiVersion"].startswith("monitoring.coreos.com")]
    result = subprocess.run([require_tool("node"), str(script)], input=yaml.safe_dump_all(custom),
                            text=True, capture_output=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("VALID") == len(custom) == 4


# --- the default shape, paths, the spool -------------------------------------------------------


def _guide_block(first_line: str) -> str:
    """The fenced block of docs/kubernetes.md that starts with ``first_line``."""
    found = re.findall(rf"```(?:yaml)?\n({re.escape(first_line)}\n.*?)```", GUIDE.read_text(), re.S)
    assert len(found) == 1, f"docs/kubernetes.md: no single block starting {first_line!r}"
    return found[0]


def _overlay(tmp_path: Path, files: dict[str, str]) -> Path:
    """An overlay directory with ``files``, their `<path to>/deploy/...` made relative to it."""
    overlay = Path(tempfile.mkdtemp(dir=tmp_path))
    repo = os.path.relpath(REPO, overlay)
    for name, text in files.items():
        (overlay / name).write_text(text.replace("<path to>", repo))
    return overlay


def test_the_default_is_the_cluster_shape(cluster: list[dict], rendered: list[dict]) -> None:
    """`kubectl apply -k deploy/kubernetes` is the shape that scales; its former path renders
    the same, and the node shape is its own overlay."""
    assert _render(KUBERNETES / "cluster") == cluster
    assert _serving(_one(cluster, "DaemonSet")["spec"]["template"]["spec"]["containers"][0][
        "args"]) == Serving(frozenset({NODE}))  # fmt: skip
    assert _one(cluster, "StatefulSet") and not [d for d in rendered if d["kind"] == "StatefulSet"]


def _pod_specs(docs: list[dict]) -> Iterator[tuple[str, dict]]:
    for workload, template in _workloads(docs):
        yield workload["metadata"]["name"], template["spec"]


def _host_mounts(pod: dict) -> Iterator[tuple[str, str, str]]:
    """(container, mountPath, hostPath.path) of every hostPath mount of every container."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for container in (*pod.get("initContainers", []), *pod["containers"]):
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "hostPath" in volume:
                yield container["name"], mount["mountPath"], volume["hostPath"]["path"]


# The host's /proc and /sys: read through --path.procfs / --path.sysfs, never named in a metric.
TELEMETRY_MOUNTS = {("/host/proc", "/proc"), ("/host/sys", "/sys")}


def _config_paths(docs: list[dict]) -> list[str]:
    config = _config(docs)
    return [root["root"] for root in config.get("discover", [])] + [
        job[key] for job in config.get("jobs", []) for key in ("path", "staging") if key in job
    ]


def _readers(docs: list[dict]) -> list[tuple[str, dict]]:
    """The pods that read the shared checkpoint roots: the scanners where there are (else the
    DaemonSet) and the restore drills."""
    kinds = {"StatefulSet", "CronJob"} if _has(docs, "StatefulSet") else {"DaemonSet", "CronJob"}
    return [(d["metadata"]["name"], t["spec"]) for d, t in _workloads(docs) if d["kind"] in kinds]


def _has(docs: list[dict], kind: str) -> bool:
    return any(d["kind"] == kind for d in docs)


def _assert_paths_are_the_hosts(docs: list[dict]) -> None:
    """Every hostPath is mounted at its own path (the telemetry mounts aside), and every root
    the config names is inside such a mount in every pod that reads the roots."""
    for name, pod in _pod_specs(docs):
        for container, mount, host in _host_mounts(pod):
            if (mount, host) not in TELEMETRY_MOUNTS:
                assert mount == host, f"{name}/{container}: {host} mounted at {mount}"
    for name, pod in _readers(docs):
        mounted = [mount for _, mount, _ in _host_mounts(pod)]
        for path in _config_paths(docs):
            assert any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounted), (
                f"{name} does not mount {path}"
            )


def test_every_path_inside_is_the_nodes_own(shape: list[dict]) -> None:
    """checkpoint_job_info{path}, logs and runbook commands name paths that exist on the node."""
    _assert_paths_are_the_hosts(shape)
    spool = _config(shape)["spool"]
    daemonset = _one(shape, "DaemonSet")["spec"]["template"]["spec"]
    assert ("exporter", spool, spool) in set(_host_mounts(daemonset))


def test_a_second_filesystem_is_one_patch_file(tmp_path: Path, cluster: list[dict]) -> None:
    """docs/kubernetes.md's recipe: a config line and one patch mount it, at its own path, in
    every pod that reads the roots."""
    names = ("kustomization.yaml", "config.yaml", "second-filesystem.yaml")
    files = {
        name: _guide_block(f"# {name}" + (": a second filesystem" if name != names[2] else ""))
        for name in names
    }
    docs = _render(_overlay(tmp_path, files))
    assert "/lustre/ckpt" in _config_paths(docs) and "/lustre/ckpt" not in _config_paths(cluster)
    _assert_paths_are_the_hosts(docs)
    with pytest.raises(AssertionError, match="does not mount /lustre/ckpt"):
        files["second-filesystem.yaml"] = files["second-filesystem.yaml"].split("---")[0]
        _assert_paths_are_the_hosts(_render(_overlay(tmp_path, files)))  # the drill's half


def _spool_init(pod: dict, spool: str) -> dict:
    (init,) = [
        c for c in pod.get("initContainers", [])
        if any(m["mountPath"] == spool for m in c.get("volumeMounts", []))
    ]  # fmt: skip
    return init


def _run_as(
    uid: int, gid: int, argv: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess:
    env = as_user_env({"PATH": "/usr/bin:/bin", "HOME": "/tmp", **env})
    return subprocess.run([*as_user(uid, gid), *argv], capture_output=True, text=True, timeout=60,
                          env=env)  # fmt: skip


def _run_init(init: dict, spool: Path, spool_path: str) -> subprocess.CompletedProcess:
    """The init container's command as the kubelet starts it: its user, and only the
    capabilities its securityContext adds (root without them is an ordinary user to the
    kernel's permission checks), with the host directory for the mount."""
    security = init["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"] and not security["allowPrivilegeEscalation"]
    caps = ",".join(f"+{c.lower()}" for c in security["capabilities"].get("add", []))
    argv = [arg.replace(spool_path, str(spool)) for arg in init["command"] + init.get("args", [])]
    setpriv = [require_tool("setpriv"), f"--reuid={security['runAsUser']}",
               f"--bounding-set=-all{',' + caps if caps else ''}", "--clear-groups"]  # fmt: skip
    return subprocess.run([*setpriv, *argv], capture_output=True, text=True, timeout=60)


TRAINING_CLOCKS = """
import warnings
from checkpoint_exporter import instrument
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with instrument.saving(training_job="llama70b", step=7, path="/mnt/ckpt/llama70b/step-7"):
        pass
print("\\n".join(str(w.message) for w in caught))
"""
EXPORTER_READS = """
import json, sys
from pathlib import Path
from checkpoint_exporter.sources.spool import SpoolReader
events = SpoolReader(Path(sys.argv[1])).poll()
print(json.dumps([[e.event, e.training_job, e.step] for e in events]))
"""


@pytest.fixture
def host_spool() -> Iterator[Path]:
    """A spool directory as the kubelet makes a missing hostPath (root's, 0755), in a directory
    every user may enter."""
    parent = Path(tempfile.mkdtemp(prefix="ckpt-exporter-node-"))
    try:
        parent.chmod(0o755)
        spool = parent / "spool"
        spool.mkdir(mode=0o755)
        yield spool
    finally:
        shutil.rmtree(parent)


def _training_pod() -> dict:
    return yaml.safe_load(
        _guide_block(
            "# A training Job that reports its save clocks to the node's checkpoint-exporter"
        )
    )


def _clocks_written(pod_security: dict, spool: Path) -> str:
    """What a training pod's instrument warns (nothing: its events reached the spool)."""
    env = {"CHECKPOINT_EXPORTER_SPOOL": str(spool)}
    uid, gid = pod_security["runAsUser"], pod_security["runAsGroup"]
    result = _run_as(uid, gid, [sys.executable, "-c", TRAINING_CLOCKS], env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.root
def test_each_shape_gives_training_pods_a_spool_they_can_write(
    shape: list[dict], host_spool: Path
) -> None:
    """The DaemonSet's init container, run as its securityContext allows (twice: every pod start
    runs it), makes the spool the training pod of docs/kubernetes.md can make its job's
    directory in and write its clocks to, and the exporter (its runAsUser) reads them."""
    pod = _one(shape, "DaemonSet")["spec"]["template"]["spec"]
    spool_path = _config(shape)["spool"]
    training = _training_pod()["spec"]["template"]["spec"]["securityContext"]
    assert "spool unavailable" in _clocks_written(training, host_spool)  # as the kubelet made it
    init = _spool_init(pod, spool_path)
    for _ in range(2):
        result = _run_init(init, host_spool, spool_path)
        assert result.returncode == 0, result.stderr
    mode = host_spool.stat()
    exporter = pod["securityContext"]
    assert stat.S_IMODE(mode.st_mode) == 0o1733
    assert (mode.st_uid, mode.st_gid) == (exporter["runAsUser"], exporter["runAsGroup"])
    assert _clocks_written(training, host_spool) == ""
    env: dict[str, str] = {}
    read = _run_as(exporter["runAsUser"], exporter["runAsGroup"],
                   [sys.executable, "-c", EXPORTER_READS, str(host_spool)], env)  # fmt: skip
    assert read.returncode == 0, read.stderr
    assert ["committed", "llama70b", 7] in json.loads(read.stdout)
    # Another user cannot list the spool, so cannot learn the other jobs' names.
    other = _run_as(2000, 2000, ["/bin/ls", str(host_spool)], {})
    assert other.returncode != 0 and "Permission denied" in other.stderr


def _image_user() -> tuple[int, int]:
    match = re.search(r"^USER (\d+):(\d+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert match, "the Dockerfile names no USER uid:gid"
    return int(match.group(1)), int(match.group(2))


def test_every_exporter_pod_and_the_spool_are_the_images_own_user(shape: list[dict]) -> None:
    """One uid of the exporter's own, the image's: the DaemonSet, the shared scanners, the drill
    (which must run as the exporter for its spool directory to be trusted with drills), and the
    spool root the init container makes. It was 65534: `nobody` is a common training-image
    default, and the owner of a sticky directory may rename and delete every entry in it."""
    user = _image_user()
    assert user[0] not in (0, 65534)
    for name, pod in _pod_specs(shape):
        security = pod["securityContext"]
        assert (security["runAsUser"], security["runAsGroup"]) == user, name
    init = _spool_init(
        _one(shape, "DaemonSet")["spec"]["template"]["spec"], _config(shape)["spool"]
    )
    (chown,) = re.findall(r"chown (\d+):(\d+) ", " ".join(init["command"]))
    assert tuple(map(int, chown)) == user


@pytest.mark.root
def test_a_training_pod_of_the_common_default_user_cannot_move_another_jobs_directory(
    shape: list[dict], host_spool: Path
) -> None:
    """A training image run as 65534 (`nobody`, a common default) mounts the spool: while the
    spool root was 65534's, it could rename or delete the directory of any other job (its events
    lost, or a squatter's directory put in its place). Now it may only make its own."""
    pod = _one(shape, "DaemonSet")["spec"]["template"]["spec"]
    spool_path = _config(shape)["spool"]
    result = _run_init(_spool_init(pod, spool_path), host_spool, spool_path)
    assert result.returncode == 0, result.stderr
    training = _training_pod()["spec"]["template"]["spec"]["securityContext"]
    assert _clocks_written(training, host_spool) == ""
    victim = host_spool / "llama70b"
    moved = _run_as(65534, 65534, ["/bin/mv", str(victim), str(host_spool / "moved")], {})
    removed = _run_as(65534, 65534, ["/bin/rm", "-rf", str(victim)], {})
    assert moved.returncode != 0 and "Operation not permitted" in moved.stderr, moved.stderr
    assert removed.returncode != 0
    assert victim.stat().st_uid == training["runAsUser"] and any(victim.iterdir())
    own = _run_as(65534, 65534, ["/bin/mkdir", str(host_spool / "its-own-job")], {})
    assert own.returncode == 0, own.stderr


@pytest.mark.root
def test_the_node_bootstrap_line_makes_the_same_spool(shape: list[dict], tmp_path: Path) -> None:
    """docs/kubernetes.md's tmpfiles.d line, for clusters where no pod runs as root."""
    block = _guide_block("# /etc/tmpfiles.d/checkpoint-exporter.conf")
    conf = tmp_path / "checkpoint-exporter.conf"
    conf.write_text(block)
    root = tmp_path / "node"
    result = subprocess.run([require_tool("systemd-tmpfiles"), "--create", f"--root={root}",
                             str(conf)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    spool = _config(shape)["spool"]
    made = (root / spool.lstrip("/")).stat()
    exporter = _one(shape, "DaemonSet")["spec"]["template"]["spec"]["securityContext"]
    assert stat.S_IMODE(made.st_mode) == 0o1733
    assert (made.st_uid, made.st_gid) == (exporter["runAsUser"], exporter["runAsGroup"])


def test_the_training_pod_recipe_mounts_the_spool_the_exporter_reads(
    cluster: list[dict], tmp_path: Path
) -> None:
    """Schema-valid; the same host directory at the same path, named in
    CHECKPOINT_EXPORTER_SPOOL, on the nodes the DaemonSet runs on, as a user of its own."""
    job = _training_pod()
    manifest = tmp_path / "training.yaml"
    manifest.write_text(yaml.safe_dump(job))
    validator = str(Path(sys.executable).parent / "kubernetes-validate")
    result = subprocess.run([validator, "--strict", str(manifest)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0 and "passed" in result.stdout, result.stdout + result.stderr
    pod = job["spec"]["template"]["spec"]
    daemonset = _one(cluster, "DaemonSet")["spec"]["template"]["spec"]
    spool = _config(cluster)["spool"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CHECKPOINT_EXPORTER_SPOOL"] == spool
    assert ("trainer", spool, spool) in set(_host_mounts(pod))
    assert ("exporter", spool, spool) in set(_host_mounts(daemonset))
    assert pod["nodeSelector"].items() >= daemonset["nodeSelector"].items()
    assert all(t in pod["tolerations"] for t in daemonset["tolerations"])
    assert pod["securityContext"]["runAsUser"] not in (0, daemonset["securityContext"]["runAsUser"])


# --- Prometheus Operator flavours ---------------------------------------------------------------

# The default selectors of each flavour, from the projects themselves. kube-prometheus-stack
# (charts/kube-prometheus-stack, templates/prometheus/prometheus.yaml, with values.yaml's
# *SelectorNilUsesHelmValues: true): each selector `release: <release>`, each namespace selector
# {} (all). kube-prometheus (manifests/prometheus-prometheus.yaml, since v0.10): every selector
# {}, every namespace selector {}, but RBAC (prometheus-roleBindingSpecificNamespaces.yaml) only
# in default, kube-system and monitoring; up to v0.9 its ruleSelector was
# {matchLabels: {prometheus: k8s, role: alert-rules}}.
SELECTS = {"ServiceMonitor": "serviceMonitorSelector", "PodMonitor": "podMonitorSelector",
           "PrometheusRule": "ruleSelector"}  # fmt: skip


def kube_prometheus_stack(release: str = "prometheus") -> dict:
    selector = {"matchLabels": {"release": release}}
    return {"selectors": dict.fromkeys(SELECTS.values(), selector), "namespaces": None}


def kube_prometheus(pinned_rules: bool = False) -> dict:
    selectors: dict = {name: {} for name in SELECTS.values()}
    if pinned_rules:
        selectors["ruleSelector"] = {"matchLabels": {"prometheus": "k8s", "role": "alert-rules"}}
    return {"selectors": selectors, "namespaces": {"default", "kube-system", "monitoring"}}


FLAVOURS = {
    "kube-prometheus-stack": kube_prometheus_stack(),
    "kube-prometheus": kube_prometheus(),
    "kube-prometheus v0.9": kube_prometheus(pinned_rules=True),
}


def _matches(selector: dict, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector ({} matches everything)."""
    if selector.get("matchLabels", {}).items() - labels.items():
        return False
    for term in selector.get("matchExpressions", []):
        key, operator, values = term["key"], term["operator"], term.get("values", [])
        present = key in labels
        if not {"In": present and labels.get(key) in values,
                "NotIn": not present or labels[key] not in values,
                "Exists": present, "DoesNotExist": not present}[operator]:  # fmt: skip
            return False
    return True


def _unselected(docs: list[dict], flavour: dict) -> list[str]:
    """The Operator objects of ``docs`` that the flavour's Prometheus would not load."""
    missed = []
    for doc in docs:
        if doc["kind"] not in SELECTS:
            continue
        selector = flavour["selectors"][SELECTS[doc["kind"]]]
        namespace = doc["metadata"].get("namespace", "monitoring")
        watched = flavour["namespaces"] is None or namespace in flavour["namespaces"]
        if not (watched and _matches(selector, doc["metadata"].get("labels", {}))):
            missed.append(f"{doc['kind']}/{doc['metadata']['name']}")
    return missed


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_each_operator_flavour_loads_every_monitor_and_rule(
    shape: list[dict], flavour: str
) -> None:
    """Every ServiceMonitor, the PodMonitor alternative and every PrometheusRule (both of the
    split rules) of each shape, by each flavour's default selectors."""
    podmonitor = {**yaml.safe_load((BASE / "podmonitor.yaml").read_text())}
    podmonitor["metadata"]["namespace"] = "monitoring"
    docs = [*shape, podmonitor]
    assert {d["kind"] for d in docs} >= set(SELECTS)
    assert _unselected(docs, FLAVOURS[flavour]) == []
    # The rules' labels before: kube-prometheus-stack loaded them nowhere.
    labels = {"prometheus": "k8s", "role": "alert-rules"}
    old = {"kind": "PrometheusRule", "metadata": {"name": "old", "labels": labels}}
    assert _unselected([old], FLAVOURS["kube-prometheus-stack"]) == ["PrometheusRule/old"]


def test_a_helm_release_of_another_name_is_one_label(tmp_path: Path) -> None:
    """docs/kubernetes.md: kube-prometheus-stack installed as `kps`."""
    block = _guide_block('# kustomization.yaml: kube-prometheus-stack installed as release "kps"')
    docs = _render(_overlay(tmp_path, {"kustomization.yaml": block}))
    assert {d["kind"] for d in docs} >= {"ServiceMonitor", "PrometheusRule"}
    assert _unselected(docs, kube_prometheus_stack("kps")) == []
    assert _unselected(docs, kube_prometheus_stack()) != []  # the default release is not it


@pytest.mark.parametrize(
    ("recipe", "flavours"),
    [
        ("kube-prometheus-stack (Helm)", [kube_prometheus_stack("kps")]),
        ("kube-prometheus (jsonnet)", [kube_prometheus(), kube_prometheus(pinned_rules=True)]),
    ],
)
def test_the_mixin_recipes_label_what_each_flavour_loads(
    tmp_path: Path, recipe: str, flavours: list[dict]
) -> None:
    """docs/kubernetes.md's mixin configs: the objects the generator writes from them, both rule
    layouts, are loaded by that flavour; the other flavour's recipe is not enough for it."""
    mixin = tmp_path / "mixin.yaml"
    mixin.write_text(_guide_block(f"# mixin.yaml: {recipe}"))
    config = load_mixin(str(mixin))
    docs = []
    for layout in (config, MixinConfig(**{**config.__dict__, "rule_layout": SPLIT})):
        built = generate.outputs(layout)
        docs += [yaml.safe_load(text) for kind in ("prometheusrule", "monitors", "scanner-monitors")
                 for text in built[kind].values()]  # fmt: skip
    assert sorted({d["kind"] for d in docs}) == sorted(SELECTS)
    for flavour in flavours:
        assert _unselected(docs, flavour) == []
    if "Helm" in recipe:
        assert _unselected(docs, kube_prometheus_stack()) != []


# --- NetworkPolicy, runtime class ---------------------------------------------------------------

# A Prometheus pod as the operator labels it (both flavours: kube-prometheus adds its own
# podMetadata labels on top), and the namespace's automatic name label.
PROMETHEUS_POD = {
    "app.kubernetes.io/name": "prometheus", "app.kubernetes.io/instance": "k8s",
    "app.kubernetes.io/managed-by": "prometheus-operator", "prometheus": "k8s",
    "operator.prometheus.io/name": "k8s", "operator.prometheus.io/shard": "0",
}  # fmt: skip


def _admitted(policy: dict, namespace: str, pod: dict[str, str]) -> bool:
    """Whether the policy's ingress admits a pod with these labels from this namespace."""
    namespace_labels = {"kubernetes.io/metadata.name": namespace}
    own = policy["metadata"]["namespace"]
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            in_namespace = (
                _matches(peer["namespaceSelector"], namespace_labels)
                if "namespaceSelector" in peer else namespace == own
            )  # fmt: skip
            if in_namespace and _matches(peer.get("podSelector", {}), pod):
                return True
    return False


def test_only_prometheus_may_open_the_metrics_port(shape: list[dict], tmp_path: Path) -> None:
    policy = _one(shape, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    pods = policy["spec"]["podSelector"]
    selected = [
        d for d, t in _workloads(shape)
        if d["kind"] != "CronJob" and _matches(pods, t["metadata"]["labels"])
    ]  # fmt: skip
    assert {d["kind"] for d in selected} == (
        {"DaemonSet", "StatefulSet"} if _has(shape, "StatefulSet") else {"DaemonSet"}
    )
    (rule,) = policy["spec"]["ingress"]
    for doc in selected:
        ports = {p["name"] for p in _pod_specs_of(doc)["containers"][0]["ports"]}
        assert {p["port"] for p in rule["ports"]} <= ports  # the named port exists on each
    assert _admitted(policy, "monitoring", PROMETHEUS_POD)
    assert not _admitted(policy, "monitoring", {"app.kubernetes.io/name": "grafana"})
    assert not _admitted(policy, "default", PROMETHEUS_POD)
    # The guide's one patch for a Prometheus elsewhere.
    block = _guide_block('# kustomization.yaml: Prometheus in namespace "observability"')
    moved = _one(_render(_overlay(tmp_path, {"kustomization.yaml": block})), "NetworkPolicy")
    assert _admitted(moved, "observability", PROMETHEUS_POD)
    assert not _admitted(moved, "monitoring", PROMETHEUS_POD)


def _pod_specs_of(doc: dict) -> dict:
    return _workloads([doc])[0][1]["spec"]


def test_the_nvidia_runtime_is_one_component(tmp_path: Path) -> None:
    block = _guide_block("# kustomization.yaml: the NVIDIA runtime")
    docs = _render(_overlay(tmp_path, {"kustomization.yaml": block}))
    runtimes = {d["kind"]: t["spec"].get("runtimeClassName") for d, t in _workloads(docs)}
    assert runtimes == {"DaemonSet": "nvidia", "StatefulSet": None, "CronJob": None}
