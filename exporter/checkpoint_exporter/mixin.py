"""The one config behind the alerts, recording rules and dashboards (monitoring-mixin style).

Thresholds are not here: they come from the objectives each exporter exports per job
(``checkpoint_deadline_seconds`` ...). This holds what differs between Prometheus setups: the
selector that finds the exporters, severities, ``for`` durations, the runbook location, the SLO.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from checkpoint_exporter.config import ConfigError, ConfigProblem, did_you_mean, read_yaml_file
from checkpoint_exporter.units import parse_duration

CRITICAL = "critical"  # pages
WARNING = "warning"  # tickets

# Every alert of DESIGN.md: severity, `for`, one-sentence summary.
ALERTS: dict[str, tuple[str, str, str]] = {
    "CheckpointTooOld": (CRITICAL, "5m", "The newest committed checkpoint is older than the interval plus the deadline."),
    "CheckpointDeadlineMissed": (CRITICAL, "0s", "A checkpoint save took longer than its deadline."),
    "CheckpointSaveHung": (CRITICAL, "5m", "A checkpoint save has been in progress for more than twice its deadline."),
    "CheckpointSavesPilingUp": (WARNING, "15m", "More than one checkpoint save is in progress at once."),
    "CheckpointSaveAborted": (WARNING, "0s", "A checkpoint save was abandoned before it committed."),
    "CheckpointInvalid": (CRITICAL, "5m", "The newest committed checkpoint failed structural validation."),
    "CheckpointRestoreFailed": (CRITICAL, "0s", "A checkpoint restore failed."),
    "CheckpointRestoreDrillOverdue": (WARNING, "1h", "No successful restore within the job's restore_drill_max_age."),
    "CheckpointDrainFallingBehind": (WARNING, "30m", "Checkpoints arrive on the staging tier faster than they drain to durable storage."),
    "CheckpointDrainStalled": (CRITICAL, "10m", "A staged checkpoint has not reached durable storage within the interval plus the deadline."),
    "CheckpointCapacityLow": (CRITICAL, "10m", "The next checkpoint generation does not fit in the usable free space."),
    "CheckpointCapacityFillingUp": (WARNING, "1h", "A checkpoint filesystem will reach its reserve within a day at the current rate."),
    "CheckpointStragglerNode": (WARNING, "5m", "One node finished writing its part of a checkpoint much later than the others."),
    "CheckpointExporterDown": (CRITICAL, "5m", "A checkpoint-exporter is down or no longer scraped."),
    "CheckpointCollectorFailing": (WARNING, "15m", "A checkpoint-exporter collector that used to work now fails."),
    "CheckpointDeadlineBudgetBurn": (WARNING, "15m", "Checkpoint deadline misses are burning the SLO's error budget too fast."),
    "CheckpointRetentionExceeded": (WARNING, "1h", "More checkpoint generations are retained than the job's limit."),
    "CheckpointNoRecoverableGeneration": (CRITICAL, "5m", "The job has no committed, valid checkpoint generation left."),
    "CheckpointStorageClockSkew": (WARNING, "15m", "Checkpoint file times disagree with the node's clock by more than a minute."),
}  # fmt: skip


@dataclass(frozen=True)
class MixinConfig:
    selector: str = 'job="checkpoint-exporter"'  # finds the exporters' series
    runbook_url: str = (
        "https://github.com/checkpoint-exporter/checkpoint-exporter/blob/main/docs/runbooks.md"
    )
    cluster_label: str = "cluster"  # the label that tells clusters apart in dashboards
    slo_target: float = 0.99  # share of saves that meet their deadline
    event_window: str = "30m"  # how long a deadline miss, abort or failed restore keeps firing
    straggler_fraction: float = 0.25  # a node this share of the deadline behind the first
    drain_margin: float = 1.1  # arrival above drain by this factor means falling behind
    severity: dict[str, str] = field(default_factory=dict)  # alert -> severity override
    for_: dict[str, str] = field(default_factory=dict)  # alert -> `for` override ("for" in YAML)

    def severity_of(self, alert: str) -> str:
        return self.severity.get(alert, ALERTS[alert][0])

    def for_of(self, alert: str) -> str:
        return self.for_.get(alert, ALERTS[alert][1])

    def runbook(self, alert: str) -> str:
        return f"{self.runbook_url}#{alert.lower()}"


_KEYS = {f.name if f.name != "for_" else "for" for f in fields(MixinConfig)}


def load_mixin(path: str | None) -> MixinConfig:
    """The mixin config from a YAML file (every key optional); defaults without one."""
    if path is None:
        return MixinConfig()
    file = Path(path)
    document = read_yaml_file(file)
    problems = list(document.problems)
    data: Any = document.data or {}
    if not isinstance(data, dict):
        raise ConfigError([*problems, ConfigProblem(str(file), "", "expected a mapping")])
    values: dict[str, Any] = {}
    for key, value in data.items():
        line = document.lines.get((key,))
        if key not in _KEYS:
            hint = did_you_mean(key, _KEYS)
            problems.append(ConfigProblem(str(file), str(key), f"unknown key{hint}", line))
            continue
        reason = _check(key, value)
        if reason:
            problems.append(ConfigProblem(str(file), str(key), reason, line))
        values["for_" if key == "for" else key] = value
    if problems:
        raise ConfigError(problems)
    return replace(MixinConfig(), **values)


def _check(key: str, value: object) -> str | None:
    if key in ("severity", "for"):
        if not isinstance(value, dict):
            return "expected a mapping of alert name to value"
        for alert, setting in value.items():
            if alert not in ALERTS:
                return f"unknown alert {alert!r}" + did_you_mean(alert, ALERTS)
            if key == "severity" and setting not in (CRITICAL, WARNING, "info"):
                return f"{alert}: severity must be critical, warning or info"
            if key == "for":
                try:
                    parse_duration(setting)
                except ValueError as error:
                    return f"{alert}: {error}"
        return None
    if key == "event_window":
        try:
            return None if parse_duration(value) > 0 else "must be greater than zero"
        except ValueError as error:
            return str(error)
    if key in ("slo_target", "straggler_fraction"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1
        return None if ok else "must be a number between 0 and 1"
    if key == "drain_margin":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1
        return None if ok else "must be a number of at least 1"
    return None if isinstance(value, str) and value else "expected a non-empty string"
