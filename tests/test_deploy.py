"""Deployment artifacts: systemd units that systemd itself accepts, Kubernetes manifests that
kustomize renders and real validators accept. The image is built and run by test_image.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from checkpoint_exporter.cli import build_parser
from checkpoint_exporter.config import NODE, SHARED, Serving, parse_serving
from checkpoint_exporter.mixin.config import MixinConfig
from tests.conftest import REPO, require_tool

pytestmark = [pytest.mark.kubectl]

SYSTEMD = REPO / "deploy" / "systemd"
KUBERNETES = REPO / "deploy" / "kubernetes"
BASE = KUBERNETES / "base"
# Where the units run the command: the package's own virtualenv (docs/install-package.md).
INSTALLED = "/opt/checkpoint-exporter/bin/checkpoint-exporter"
# The instance each template is verified as: a job for the drill, shard 0 of 2 for the scanner.
INSTANCES = {"checkpoint-exporter-restore-drill@": "llama70b", "checkpoint-exporter-shared@": "0-2"}


@pytest.fixture
def units(tmp_path: Path) -> Path:
    """The units with ExecStart pointing at this checkout's command (verify checks it exists),
    and the templates instantiated (a template itself cannot be verified). The units as shipped,
    on a node where the package is installed where they say, are verified by
    tests/test_package.py."""
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
    """The node shape: deploy/kubernetes."""
    return _render(KUBERNETES)


@pytest.fixture(scope="module")
def cluster() -> list[dict]:
    """The cluster shape: deploy/kubernetes/cluster."""
    return _render(KUBERNETES / "cluster")


@pytest.fixture(scope="module", params=["node", "cluster"])
def shape(request: pytest.FixtureRequest) -> list[dict]:
    return request.getfixturevalue("rendered" if request.param == "node" else "cluster")


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


def test_core_objects_pass_the_kubernetes_schemas(shape: list[dict], tmp_path: Path) -> None:
    core = [doc for doc in shape if not doc["apiVersion"].startswith("monitoring.coreos.com")]
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
    """The README's own overlay, on the cluster shape as shipped: four shards, two pods each."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```yaml\n(# kustomization.yaml of your overlay\n.*?)```", readme, re.S)
    assert block, "README: the overlay example is gone"
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    cluster_shape = os.path.relpath(KUBERNETES / "cluster", overlay)
    text = block.group(1).replace("<path to>/deploy/kubernetes/cluster", cluster_shape)
    (overlay / "kustomization.yaml").write_text(text)
    assert _shards(_render(overlay), tmp_path) == 4


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
