"""The one config behind the alerts, recording rules and dashboards (monitoring-mixin style).

Thresholds are not here: they come from the objectives each exporter exports per job
(``checkpoint_deadline_seconds`` ...). This holds what differs between Prometheus setups: the
selector that finds the exporters, severities, ``for`` durations, the runbook location, the SLO,
and whether the rules come as one file or split by where they must evaluate.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from checkpoint_exporter.schema import (
    Field,
    Parser,
    choice,
    did_you_mean,
    positive_duration,
    read_mapping_file,
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
    "CheckpointDeadlineBudgetBurn": (CRITICAL, "15m", "Checkpoint deadline misses are burning the SLO's error budget: fast (several saves in hours) pages, slow (over days) opens a ticket."),
    "CheckpointRetentionExceeded": (WARNING, "1h", "More checkpoint generations are retained than the job's limit."),
    "CheckpointNoRecoverableGeneration": (CRITICAL, "5m", "The job has no committed, valid checkpoint generation left."),
    "CheckpointStorageClockSkew": (WARNING, "15m", "Checkpoint file times disagree with the node's clock by more than a minute."),
    # A ticket, not a page: the interval wastes GPU time, it does not lose checkpoints. A day,
    # as the save cost it compares against is a day's mean.
    "CheckpointIntervalOffOptimum": (WARNING, "1d", "The configured checkpoint interval is over twice or under half the recommended one: Young's optimum for the measured save cost and MTBF, at least one save long."),
    "CheckpointJobAbandoned": (WARNING, "1h", "A job has shown no sign of life for its abandon_after and did not say it finished: it no longer pages."),
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


@dataclass(frozen=True)
class MixinConfig:
    selector: str = 'job="checkpoint-exporter"'  # finds the exporters' series
    # The runbooks each exporter serves itself, through the Service of deploy/kubernetes/: a link
    # that resolves wherever the manifests run. Outside the cluster, point this at a wiki.
    runbook_url: str = "http://checkpoint-exporter.monitoring.svc:25780/runbooks"
    cluster_label: str = "cluster"  # the label that tells clusters apart in dashboards
    slo_target: float = 0.99  # share of saves that meet their deadline
    event_window: str = "30m"  # how long a deadline miss, abort or failed restore keeps firing
    # A job's view older than this is stale (an inotify tier is confirmed every ~30 s, a polled
    # one every poll_interval): CheckpointDataStale, and the age-based alerts hold back.
    stale_after: str = "5m"
    straggler_fraction: float = 0.25  # a node this share of the deadline behind the first
    drain_margin: float = 1.1  # arrival above drain by this factor means falling behind
    rule_layout: str = SINGLE  # single | split: see RULE_LAYOUTS
    # The dashboards draw node_exporter's and dcgm-exporter's own series for a job's nodes: these
    # find their targets, and each side's host is the node label's value up to this regex's
    # first group (the instance without its port, by default), so "gpu7:25780" meets "gpu7:9100".
    node_exporter_selector: str = 'job=~"node(-exporter)?"'
    dcgm_selector: str = 'job=~"(nvidia-)?dcgm(-exporter)?"'
    node_label: str = "instance"  # on the exporters' and node_exporter's series
    dcgm_node_label: str = "instance"  # "Hostname" where dcgm-exporter has no host network
    node_regex: str = "(.+?)(:[0-9]+)?"
    # The fast budget burn pages only with at least this many misses in its 6 h window: a job
    # that saves hourly has six saves there, and one miss of six is a 17 % error rate.
    burn_min_misses: int = 3
    # A PromQL expression with one series per running training job (labels training_job and
    # cluster_label): a scheduler's view of which jobs run, joined where jobs are not
    # instrumented. Set, a job pages only while it names the job. Examples in the README.
    job_running: str = ""
    severity: dict[str, str] = field(default_factory=dict)  # alert -> severity override
    for_: dict[str, str] = field(default_factory=dict)  # alert -> `for` override ("for" in YAML)

    def severity_of(self, alert: str) -> str:
        return self.severity.get(alert, ALERTS[alert][0])

    def for_of(self, alert: str) -> str:
        return self.for_.get(alert, ALERTS[alert][1])

    def runbook(self, alert: str) -> str:
        return f"{self.runbook_url}#{alert.lower()}"


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
    Field("runbook_url", text),
    Field("cluster_label", text),
    Field("slo_target", _open_fraction),
    Field("event_window", _duration_string(positive_duration)),
    Field("stale_after", _duration_string(positive_duration)),
    Field("straggler_fraction", _open_fraction),
    Field("drain_margin", _factor),
    Field("rule_layout", choice(RULE_LAYOUTS)),
    Field("node_exporter_selector", text),
    Field("dcgm_selector", text),
    Field("node_label", text),
    Field("dcgm_node_label", text),
    Field("node_regex", text),
    Field("burn_min_misses", _count),
    Field("job_running", text),
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
    return replace(MixinConfig(), **{"for_" if k == "for" else k: v for k, v in values.items()})
