"""The one config behind the alerts, recording rules and dashboards (monitoring-mixin style).

Thresholds are not here: they come from the objectives each exporter exports per job
(``checkpoint_deadline_seconds`` ...). This holds what differs between Prometheus setups: the
selector that finds the exporters, severities, ``for`` durations, the runbook location, the SLO,
whether the rules come as one file or split by where they must evaluate, the labels the
Prometheus Operator selects the rules and monitors by, and how the dashboards find a node's
other exporters.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from dataclasses import dataclass, field, replace

from checkpoint_exporter.schema import (
    Field,
    Parser,
    boolean,
    choice,
    did_you_mean,
    positive_duration,
    read_mapping_file,
    regex,
    text,
    type_name,
)
from checkpoint_exporter.units import parse_duration

CRITICAL = "critical"  # pages
WARNING = "warning"  # tickets

# Where the rules go: one file for one Prometheus that scrapes every exporter, or a file of
# per-node groups (any Prometheus shard) and a file of per-job groups (the Prometheus that sees
# all of a job's exporters, or a Thanos / Mimir ruler).
SINGLE = "single"
SPLIT = "split"
RULE_LAYOUTS = (SINGLE, SPLIT)

# Every alert of DESIGN.md: severity, `for`, one-sentence summary. The severity follows the action
# each needs: critical pages someone now (a job is losing, or about to lose, the state it would
# restart from), warning opens a ticket for working hours. A job's critical alerts page only
# while it runs and its objectives were stated (rules.PAGES); otherwise they open tickets.
ALERTS: dict[str, tuple[str, str, str]] = {
    "CheckpointTooOld": (CRITICAL, "5m", "A running job's newest committed checkpoint is older than its interval plus its deadline."),
    "CheckpointNeverCommitted": (CRITICAL, "5m", "A running job has committed no checkpoint since it was first watched, for longer than its interval plus its deadline."),
    "CheckpointDeadlineMissed": (WARNING, "0s", "A checkpoint save took longer than its deadline."),
    "CheckpointSaveHung": (CRITICAL, "5m", "A running job's checkpoint save has been in progress for more than twice its deadline."),
    "CheckpointSavesPilingUp": (WARNING, "15m", "More than one checkpoint save is in progress at once."),
    "CheckpointSaveAborted": (WARNING, "0s", "A checkpoint save was abandoned before it committed."),
    "CheckpointInvalid": (CRITICAL, "5m", "The newest committed checkpoint failed structural validation."),
    "CheckpointRestoreFailed": (CRITICAL, "0s", "A training job failed to restore its checkpoint."),
    "CheckpointRestoreDrillFailed": (WARNING, "0s", "A restore drill failed."),
    "CheckpointRestoreDrillOverdue": (WARNING, "1h", "No successful restore within the job's restore_drill_max_age."),
    "CheckpointDrainFallingBehind": (WARNING, "30m", "Checkpoints arrive on the staging tier faster than they drain to durable storage."),
    "CheckpointDrainStalled": (WARNING, "10m", "A staged checkpoint has not reached durable storage within the interval plus the deadline."),
    "CheckpointDrainLostGeneration": (CRITICAL, "0s", "A staged checkpoint was deleted before its durable copy committed: it is lost."),
    "CheckpointCapacityLow": (CRITICAL, "10m", "The next checkpoint generation of a running job does not fit in the usable free space."),
    "CheckpointCapacityFillingUp": (WARNING, "1h", "A checkpoint filesystem will reach its reserve within a day at the current rate."),
    "CheckpointStragglerNode": (WARNING, "5m", "One node finished writing its part of a checkpoint much later than the others."),
    "CheckpointExporterDown": (WARNING, "5m", "A checkpoint-exporter is down."),
    "CheckpointJobUnmonitored": (CRITICAL, "5m", "No checkpoint-exporter is left that watches a job, or none is scraped at all: its checkpoint alerts cannot fire."),
    "CheckpointShardUnmonitored": (CRITICAL, "5m", "Every replica of a shared-scanner shard is down: the jobs of that shard are not watched."),
    "CheckpointCollectorFailing": (WARNING, "15m", "A checkpoint-exporter collector that used to work now fails."),
    "CheckpointDeadlineBudgetBurn": (CRITICAL, "15m", "Checkpoint deadline misses are burning the SLO's error budget: fast (several saves in hours) pages a job that pages, slow (over days) opens a ticket."),
    "CheckpointRetentionExceeded": (WARNING, "1h", "More checkpoint generations are retained than the job's limit."),
    # A ticket: parts left by interrupted saves cost storage, they lose no checkpoint. The age
    # threshold is the mixin's incomplete_upload_max_age; `for` rides out an evaluation gap.
    "CheckpointIncompleteUploadsPiling": (WARNING, "1h", "Open multipart uploads under a job's object-store prefix were left by interrupted saves and cost storage until aborted."),
    "CheckpointNoRecoverableGeneration": (CRITICAL, "5m", "The job has no committed, valid checkpoint generation left."),
    "CheckpointStorageClockSkew": (WARNING, "15m", "Checkpoint file times disagree with the node's clock by more than a minute."),
    # A ticket, not a page: the interval wastes GPU time, it does not lose checkpoints. A day,
    # as the save cost it compares against is a day's mean.
    "CheckpointIntervalOffOptimum": (WARNING, "1d", "The configured checkpoint interval is over twice or under half the recommended one: Young's optimum for the measured save cost and MTBF, at least one save long."),
    "CheckpointJobAbandoned": (WARNING, "15m", "A job has shown no sign of life for its abandon_after and did not say it finished: it no longer pages."),
    "CheckpointJobPathUnwatched": (WARNING, "1h", "An instrumented job runs, and no exporter watches where it saves its checkpoints."),
    "CheckpointJobsNotWatched": (WARNING, "15m", "Jobs under a discover root are not watched: the root holds more than its max_jobs."),
    "CheckpointTreeUnreadable": (WARNING, "15m", "Part of a watched checkpoint tree cannot be read by the exporter."),
    "CheckpointSpoolSquatted": (WARNING, "15m", "Another user owns a spool directory of a job: its events there are not read."),
    "CheckpointSpoolUnwritable": (WARNING, "10m", "Training jobs cannot write the event spool: the save clocks of instrumented jobs are lost."),
    # The exporter's own view: when it cannot be trusted, the alerts above are blind or wrong.
    "CheckpointDataStale": (CRITICAL, "5m", "No exporter has confirmed its view of a job's checkpoints for longer than stale_after."),
    "CheckpointMountStuck": (WARNING, "5m", "A filesystem operation on a checkpoint mount has not answered within its time budget."),
    "CheckpointExporterBadConfig": (WARNING, "10m", "The checkpoint-exporter configuration could not be reloaded."),
    "CheckpointExporterNotReady": (WARNING, "30m", "A checkpoint-exporter has not finished the first pass of every watched tier."),
}  # fmt: skip


# The runbooks where the project publishes its source (the main branch): a page any browser
# opens, the on-call's phone included. GitHub gives each `## AlertName`
# heading the id `alertname`, which is what runbook() appends.
RUNBOOK_URL = (
    "https://github.com/checkpoint-exporter/checkpoint-exporter/blob/main/docs/runbooks.md"
)

# What kube-prometheus-stack's Prometheus selects by default (`release: <Helm release>`, for its
# monitors and rules alike; `prometheus` is the release name its README installs), and what
# kube-prometheus (jsonnet) gives its own rules, which its Prometheus selected by until v0.9:
# objects with all of these labels load in both flavours' default installs (kube-prometheus
# since v0.10 selects every monitor and rule in the namespaces it watches).
MONITOR_LABELS = {"release": "prometheus"}
RULE_LABELS = {"release": "prometheus", "prometheus": "k8s", "role": "alert-rules"}

# Network devices the NIC panel leaves out: the loopback and the virtual ends of containers
# (veth pairs, Calico, Docker, CNI bridges, Flannel, Cilium, LXC, tunnels), which carry the
# same bytes again and would bury the node's real links.
NETWORK_DEVICE_EXCLUDE = "lo|veth.*|cali.*|docker.*|cni.*|flannel.*|cilium.*|lxc.*|tunl.*|vxlan.*"


@dataclass(frozen=True)
class MixinConfig:
    selector: str = 'job="checkpoint-exporter"'  # finds the exporters' series
    # Where the alerts' runbook links point (each adds #<alert in lower case). It must open in
    # a browser outside the cluster: a name only the cluster resolves (the exporters' own
    # /runbooks through their Service) needs runbook_url_internal: true (check_mixin).
    runbook_url: str = RUNBOOK_URL
    runbook_url_internal: bool = False
    cluster_label: str = "cluster"  # the label that tells clusters apart in dashboards
    slo_target: float = 0.99  # share of saves that meet their deadline
    event_window: str = "30m"  # how long a deadline miss, abort or failed restore keeps firing
    # A job's view older than this is stale (an inotify tier is confirmed every ~30 s, a polled
    # one every poll_interval): CheckpointDataStale, and the age-based alerts hold back.
    stale_after: str = "5m"
    straggler_fraction: float = 0.25  # a node this share of the deadline behind the first
    drain_margin: float = 1.1  # arrival above drain by this factor means falling behind
    rule_layout: str = SINGLE  # single | split: see RULE_LAYOUTS
    # Labels of the generated ServiceMonitors and PodMonitor, and of the PrometheusRules: what
    # the Prometheus resource's serviceMonitorSelector / podMonitorSelector / ruleSelector match.
    monitor_labels: dict[str, str] = field(default_factory=lambda: dict(MONITOR_LABELS))
    rule_labels: dict[str, str] = field(default_factory=lambda: dict(RULE_LABELS))
    # The split layout's per-job PrometheusRule; None: rule_labels, so the one Prometheus of a
    # default install loads it. Set it apart (and select `checkpoint-exporter/rules: job` in a
    # ThanosRuler) where several Prometheus shards each see only some of a job's nodes.
    job_rule_labels: dict[str, str] | None = None
    # The dashboards draw node_exporter's and dcgm-exporter's own series for a job's nodes. An
    # exporter's node is the value of each of exporter_node_labels (up to the regex's first
    # group): `node` (the node name the ServiceMonitor / PodMonitor add on Kubernetes) and its
    # instance without the port. A node_exporter or dcgm-exporter series belongs to the job's
    # nodes when its own label (node_exporter_node_label, dcgm_node_label, through the same kind
    # of regex) equals any of them: so kube-prometheus (node-exporter's instance is the node
    # name), kube-prometheus-stack (the node's IP and port, as the exporter's own instance with
    # host networking) and static configs (host:port) all join without a setting.
    node_exporter_selector: str = 'job=~"node(-exporter)?"'
    dcgm_selector: str = 'job=~"(nvidia-)?dcgm(-exporter)?"'
    exporter_node_labels: tuple[str, ...] = ("node", "instance")
    node_exporter_node_label: str = "instance"
    dcgm_node_label: str = "instance"  # "Hostname" where dcgm-exporter has no host network
    node_regex: str = "(.+?)(:[0-9]+)?"  # the host of host:port, or the whole value
    # Each side's own regex, where its values are spelled differently (a domain to strip);
    # empty: node_regex.
    exporter_node_regex: str = ""
    node_exporter_node_regex: str = ""
    dcgm_node_regex: str = ""
    # The one label for both the exporters and node_exporter, as before there were two
    # (mixin configs that set it keep working); empty: the two settings above.
    node_label: str = ""
    network_device_exclude: str = NETWORK_DEVICE_EXCLUDE  # regex over node_exporter's device
    # The fast budget burn pages only with at least this many misses in its 6 h window: a job
    # that saves hourly has six saves there, and one miss of six is a 17 % error rate.
    burn_min_misses: int = 3
    # A PromQL expression with one series per running training job (labels training_job and
    # cluster_label): a scheduler's view of which jobs run, joined where jobs are not
    # instrumented. Set, a job pages only while it names the job. Examples in the README.
    job_running: str = ""
    # A job that heartbeats runs while its heartbeats come (instrument's default: one a minute):
    # a preempted, queued or crashed job stops paging this long after its last one.
    heartbeat_timeout: str = "10m"
    # A job that said it finished stays finished while no exporter saw it alive later than this
    # after (the other ranks' processes exiting).
    finished_grace: str = "10m"
    # An open multipart upload that has not grown for this long was left by an interrupted save
    # (a running save's upload grows, or completes, within its deadline):
    # CheckpointIncompleteUploadsPiling. Above the two days a lifecycle rule aborting uploads
    # after one day may take (S3 rounds up to the next midnight UTC): a bucket with that rule
    # never opens a ticket.
    incomplete_upload_max_age: str = "2d"
    severity: dict[str, str] = field(default_factory=dict)  # alert -> severity override
    for_: dict[str, str] = field(default_factory=dict)  # alert -> `for` override ("for" in YAML)

    def severity_of(self, alert: str) -> str:
        return self.severity.get(alert, ALERTS[alert][0])

    def for_of(self, alert: str) -> str:
        return self.for_.get(alert, ALERTS[alert][1])

    def runbook(self, alert: str) -> str:
        return f"{self.runbook_url}#{alert.lower()}"

    def job_rules_labels(self) -> dict[str, str]:
        return self.rule_labels if self.job_rule_labels is None else self.job_rule_labels

    def exporter_nodes(self) -> tuple[tuple[str, str], ...]:
        """(label, regex) for each label that names an exporter's node."""
        labels = (self.node_label,) if self.node_label else self.exporter_node_labels
        return tuple((label, self.exporter_node_regex or self.node_regex) for label in labels)

    def node_exporter_node(self) -> tuple[str, str]:
        """(label, regex) that names node_exporter's node."""
        label = self.node_label or self.node_exporter_node_label
        return label, self.node_exporter_node_regex or self.node_regex

    def dcgm_node(self) -> tuple[str, str]:
        return self.dcgm_node_label, self.dcgm_node_regex or self.node_regex


# Host names a browser outside the cluster cannot resolve: Services (`name.namespace.svc`, with or
# without the cluster domain), the cluster domain itself, and this machine.
_CLUSTER_INTERNAL = re.compile(r"(.+\.svc(\..+)?|.+\.cluster\.local|localhost(\..+)?)")


def runbook_url_problem(url: str, internal: bool = False) -> str | None:
    """Why ``url`` cannot be the runbook links' base, or None. Not http(s) is never usable; a
    cluster-internal or single-label name, or a loopback address, only with ``internal``."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s) URL: the alerts' runbook links would not open"
    if parts.query or parts.fragment:
        return f"{url!r} has a query or fragment: each link appends #<alert name>"
    if internal:
        return None
    host = parts.hostname.lower()
    try:
        private = ipaddress.ip_address(host).is_loopback
    except ValueError:
        private = "." not in host or bool(_CLUSTER_INTERNAL.fullmatch(host))
    if private:
        return (
            f"{url!r} names {host}, which only the cluster (or this machine) resolves: the "
            "on-call's browser cannot open the alerts' runbook links; point it at a page they can "
            f"open (the default is {RUNBOOK_URL}), or set runbook_url_internal: true "
            "if every reader is inside"
        )
    return None


def check_mixin(config: MixinConfig) -> None:
    """Refuse a config the generators must not write rules from; ValueError names the key."""
    problem = runbook_url_problem(config.runbook_url, config.runbook_url_internal)
    if problem:
        raise ValueError(f"mixin config: runbook_url: {problem}")
    if config.node_label and (
        config.exporter_node_labels != MixinConfig.exporter_node_labels
        or config.node_exporter_node_label != MixinConfig.node_exporter_node_label
    ):
        raise ValueError(
            "mixin config: node_label: set either node_label (one label on both sides) or "
            "exporter_node_labels / node_exporter_node_label"
        )


def _alert_settings(check: Parser) -> Parser:
    """A mapping of alert name to a setting ``check`` accepts; the first bad entry is the
    problem reported."""

    def parse(value: object) -> object:
        if not isinstance(value, dict):
            raise ValueError("expected a mapping of alert name to value")
        for alert, setting in value.items():
            if alert not in ALERTS:
                raise ValueError(f"unknown alert {alert!r}" + did_you_mean(alert, ALERTS))
            try:
                check(setting)
            except ValueError as error:
                raise ValueError(f"{alert}: {error}") from None
        return value

    return parse


def _severity(value: object) -> object:
    if value not in (CRITICAL, WARNING, "info"):
        raise ValueError("severity must be critical, warning or info")
    return value


def _duration_string(check: Parser) -> Parser:
    """A duration ``check`` accepts, spelled as a string: the rules print it as it stands, and
    Prometheus reads a bare number (90) as no duration at all."""

    def parse(value: object) -> object:
        if not isinstance(value, str):
            raise ValueError(f"expected a duration such as 90s, 15m or 1h, got {type_name(value)}")
        check(value)
        return value

    return parse


def _open_fraction(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError("must be a number between 0 and 1")
    return value


_LABEL_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def _kubernetes_labels(value: object) -> object:
    """A mapping of Kubernetes label keys to values (the API server refuses others)."""
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of label to value, got {type_name(value)}")
    for key, label in value.items():
        if not isinstance(key, str) or not _LABEL_NAME.fullmatch(key) or len(key) > 316:
            raise ValueError(f"{key!r} is not a Kubernetes label key")
        if not isinstance(label, str) or not _LABEL_VALUE.fullmatch(label):
            raise ValueError(f"{key}: {label!r} is not a Kubernetes label value (quote numbers)")
    return value


_PROMETHEUS_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _prometheus_label(value: object) -> object:
    if not isinstance(value, str) or not _PROMETHEUS_LABEL.fullmatch(value):
        raise ValueError(f"{value!r} is not a Prometheus label name")
    return value


def _prometheus_labels(value: object) -> object:
    """One or more Prometheus label names, as a list (a single name is a list of one)."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names:
        raise ValueError(f"expected a list of label names, got {type_name(value)}")
    for name in names:
        _prometheus_label(name)
    return tuple(names)


def _runbook_url(value: object) -> object:
    """An http(s) URL; whether its host is reachable from outside is checked with
    runbook_url_internal, in load_mixin."""
    problem = runbook_url_problem(text(value), internal=True)
    if problem:
        raise ValueError(problem)
    return value


def _count(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
        raise ValueError("must be a whole number from 1 to 1000")
    return value


def _factor(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
        raise ValueError("must be a number of at least 1")
    return value


# Every parser returns the value as written, never float() or seconds: the rules print it, and
# 2 rather than 2.0 (or 30m rather than 1800.0) keeps the generated files as they are.
_FIELDS = (
    Field("selector", text),
    Field("runbook_url", _runbook_url),
    Field("runbook_url_internal", boolean),
    Field("cluster_label", text),
    Field("slo_target", _open_fraction),
    Field("event_window", _duration_string(positive_duration)),
    Field("stale_after", _duration_string(positive_duration)),
    Field("straggler_fraction", _open_fraction),
    Field("drain_margin", _factor),
    Field("rule_layout", choice(RULE_LAYOUTS)),
    Field("monitor_labels", _kubernetes_labels),
    Field("rule_labels", _kubernetes_labels),
    Field("job_rule_labels", _kubernetes_labels),
    Field("node_exporter_selector", text),
    Field("dcgm_selector", text),
    Field("exporter_node_labels", _prometheus_labels),
    Field("node_exporter_node_label", _prometheus_label),
    Field("node_label", _prometheus_label),
    Field("dcgm_node_label", _prometheus_label),
    Field("node_regex", regex),
    Field("exporter_node_regex", regex),
    Field("node_exporter_node_regex", regex),
    Field("dcgm_node_regex", regex),
    Field("network_device_exclude", regex),
    Field("burn_min_misses", _count),
    Field("job_running", text),
    Field("heartbeat_timeout", _duration_string(positive_duration)),
    Field("finished_grace", _duration_string(positive_duration)),
    Field("incomplete_upload_max_age", _duration_string(positive_duration)),
    Field("severity", _alert_settings(_severity)),
    Field("for", _alert_settings(_duration_string(parse_duration))),
)


def load_mixin(path: str | None) -> MixinConfig:
    """The mixin config from a YAML file (every key optional); defaults without one."""
    if path is None:
        return MixinConfig()
    data, problems = read_mapping_file(path)
    values = problems.check({str(k): v for k, v in data.items()}, (), _FIELDS, list_known=False)
    problems.raise_if_any()
    config = replace(MixinConfig(), **{"for_" if k == "for" else k: v for k, v in values.items()})
    try:
        check_mixin(config)
    except ValueError as error:
        key, _, reason = str(error).removeprefix("mixin config: ").partition(": ")
        problems.add((key,), reason)
        problems.raise_if_any()
    return config
