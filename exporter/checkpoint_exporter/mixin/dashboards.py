"""Grafana dashboards, generated with grafanalib from the mixin config.

Four dashboards: a cluster overview, one job's saves in detail, storage, and restores. Each has
the datasource, the cluster and the training job as template variables; queries read the
recording rules where several nodes report one job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from grafanalib._gen import DashboardEncoder
from grafanalib.core import Dashboard as GrafanaDashboard
from grafanalib.core import (
    GridPos,
    RowPanel,
    Stat,
    Target,
    Template,
    Templating,
    TimeSeries,
)

from checkpoint_exporter.mixin import rules
from checkpoint_exporter.mixin.config import MixinConfig

DATASOURCE = "${datasource}"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat
    description: str = ""


@dataclass(frozen=True)
class Section:
    title: str
    panels: tuple[Panel, ...]


class _Selectors:
    """Label matchers every query carries: the exporters, the cluster, the chosen jobs."""

    def __init__(self, c: MixinConfig):
        self.cluster = f'{c.cluster_label}=~"$cluster"'
        self.base = f"{c.selector},{self.cluster}"
        self.job = f'{self.base},training_job=~"$training_job"'
        self.recorded_job = f'{self.cluster},training_job=~"$training_job"'  # recording rules
        self.by = f"{c.cluster_label}, training_job"


def _overview(c: MixinConfig, s: _Selectors) -> list[Section]:
    age = f"time() - {rules.LAST_COMMITTED}{{{s.recorded_job}}}"
    limit = f"{rules.INTERVAL}{{{s.recorded_job}}} + {rules.DEADLINE}{{{s.recorded_job}}}"
    window = "$__range"
    failures = (
        ("deadline misses", "checkpoint_deadline_misses_total"),
        ("aborted saves", "checkpoint_saves_aborted_total"),
        ("validation failures", "checkpoint_validation_failures_total"),
        ("failed restores", "checkpoint_restore_failures_total"),
    )
    return [
        Section("Checkpoint age", (
            Panel("Age of the newest committed checkpoint against interval + deadline", (
                Query(age, "{{training_job}} age"),
                Query(limit, "{{training_job}} interval + deadline"),
            ), unit="s", description="CheckpointTooOld fires when the age crosses the limit."),
            Panel("Jobs over their limit", (Query(f"count(({age}) > ({limit})) or vector(0)"),),
                  kind="stat"),
        )),
        Section("Saves", (
            Panel("Newest save's phases against its deadline", (
                Query(f"max by ({s.by}, phase) (checkpoint_last_save_phase_seconds{{{s.job}}})",
                      "{{training_job}} {{phase}}"),
                Query(f"{rules.DEADLINE}{{{s.recorded_job}}}", "{{training_job}} deadline"),
            ), unit="s"),
            Panel("Saves in progress", (
                Query(f"max by ({s.by}) (checkpoint_saves_in_progress{{{s.job}}})",
                      "{{training_job}}"),
            )),
            Panel("Failures in the time range", tuple(
                Query(f"sum(max by ({s.by}) (increase({metric}{{{s.job}}}[{window}]))) or vector(0)",
                      label)
                for label, metric in failures
            ), kind="stat"),
        )),
    ]  # fmt: skip


def _job(c: MixinConfig, s: _Selectors) -> list[Section]:
    rate = "$__rate_interval"
    return [
        Section("The four clocks", (
            Panel("Phases of the newest save (slowest rank per node)", (
                Query(f"max by ({s.by}, phase) (checkpoint_last_save_phase_seconds{{{s.job}}})",
                      "{{training_job}} {{phase}}"),
                Query(f"{rules.DEADLINE}{{{s.recorded_job}}}", "{{training_job}} deadline"),
            ), unit="s"),
            Panel("Save duration, 90th percentile per phase", (
                Query(f"histogram_quantile(0.9, max by ({s.by}, phase, le) (rate("
                      f"checkpoint_save_duration_seconds_bucket{{{s.job}}}[{rate}])))",
                      "{{training_job}} {{phase}}"),
            ), unit="s"),
            Panel("Achieved throughput against the plan's target", (
                Query(f"max by ({s.by}) (checkpoint_last_committed_size_bytes{{{s.job}}})"
                      f" / on ({s.by}) max by ({s.by}) "
                      f"(checkpoint_last_save_phase_seconds{{{s.job},phase=\"total\"}})",
                      "{{training_job}} achieved"),
                Query(f"max by ({s.by}) (checkpoint_last_committed_size_bytes{{{s.job}}})"
                      f" / on ({s.by}) {rules.DEADLINE}{{{s.recorded_job}}}",
                      "{{training_job}} needed (size / deadline)"),
            ), unit="Bps", description="`plan`'s payload_per_job_gbps is the same size / deadline."),
            Panel("Straggler spread across nodes (last write end, newest save)", (
                Query(f"{rules.WRITE_END_SPREAD}{{{s.recorded_job}}}", "{{training_job}}"),
            ), unit="s"),
        )),
        Section("What the nodes did during the newest save", (
            Panel("Network sent per node", (
                Query(f"checkpoint_last_save_network_transmit_bytes{{{s.job}}}",
                      "{{training_job}} {{instance}}"),
            ), unit="bytes"),
            Panel("Busiest link's peak utilisation per node", (
                Query(f"checkpoint_last_save_network_peak_utilization_ratio{{{s.job}}}",
                      "{{training_job}} {{instance}}"),
            ), unit="percentunit"),
            Panel("Disk written per node", (
                Query(f"checkpoint_last_save_disk_written_bytes{{{s.job}}}",
                      "{{training_job}} {{instance}}"),
            ), unit="bytes"),
            Panel("GPU utilisation during the save and just before it", (
                Query(f"checkpoint_last_save_gpu_utilization_ratio{{{s.job}}}",
                      "{{training_job}} {{instance}} during"),
                Query(f"checkpoint_last_save_gpu_baseline_utilization_ratio{{{s.job}}}",
                      "{{training_job}} {{instance}} before"),
            ), unit="percentunit"),
        )),
    ]  # fmt: skip


def _storage(c: MixinConfig, s: _Selectors) -> list[Section]:
    fs = s.base
    return [
        Section("Capacity", (
            Panel("Filesystems: size, available, reserve", (
                Query(f"checkpoint_filesystem_size_bytes{{{fs}}}", "{{mountpoint}} size"),
                Query(f"checkpoint_filesystem_avail_bytes{{{fs}}}", "{{mountpoint}} available"),
                Query(f"checkpoint_filesystem_reserve_ratio{{{fs}}}"
                      f" * checkpoint_filesystem_size_bytes{{{fs}}}", "{{mountpoint}} reserve"),
            ), unit="bytes"),
            Panel("Available in 24 h at the current rate", (
                Query(f"{rules.AVAIL_PREDICTED}{{{s.cluster}}}", "{{mountpoint}}"),
            ), unit="bytes"),
            Panel("Peak footprint (retained + next save) against usable", (
                Query(f"{rules.PEAK_FOOTPRINT}{{{s.cluster}}}", "{{mountpoint}}"),
            ), unit="percentunit"),
            Panel("Generations that still fit", (
                Query(f"{rules.GENERATIONS_THAT_FIT}{{{s.recorded_job}}}", "{{training_job}}"),
            )),
        )),
        Section("Retention", (
            Panel("Retained bytes", (
                Query(f"max by ({s.by}) (checkpoint_retained_bytes{{{s.job}}})", "{{training_job}}"),
            ), unit="bytes"),
            Panel("Retained generations against the limit", (
                Query(f"{rules.RETAINED}{{{s.recorded_job}}}", "{{training_job}} retained"),
                Query(f"{rules.RETAINED_LIMIT}{{{s.recorded_job}}}", "{{training_job}} limit"),
            )),
        )),
        Section("Drain (staging to durable)", (
            Panel("Backlog", (
                Query(f"checkpoint_drain_backlog_bytes{{{s.job}}}", "{{training_job}} {{instance}}"),
            ), unit="bytes"),
            Panel("Arrival against drain rate", (
                Query(f"{rules.ARRIVAL}{{{s.job}}}", "{{training_job}} {{instance}} arrival"),
                Query(f"{rules.DRAIN}{{{s.job}}}", "{{training_job}} {{instance}} drain"),
            ), unit="Bps"),
            Panel("Age of the oldest undrained generation", (
                Query(f"time() - (checkpoint_oldest_undrained_commit_timestamp_seconds{{{s.job}}} > 0)"
                      f" or checkpoint_oldest_undrained_commit_timestamp_seconds{{{s.job}}}",
                      "{{training_job}} {{instance}}"),
            ), unit="s"),
        )),
    ]  # fmt: skip


def _restores(c: MixinConfig, s: _Selectors) -> list[Section]:
    return [
        Section("Restores", (
            Panel("Time since the last successful restore against the drill's max age", (
                Query(f"time() - max by ({s.by}) "
                      f"(checkpoint_restore_last_success_timestamp_seconds{{{s.job}}})",
                      "{{training_job}} since success"),
                Query(f"max by ({s.by}) (checkpoint_restore_drill_max_age_seconds{{{s.job}}})",
                      "{{training_job}} max age"),
            ), unit="s"),
            Panel("Duration of the last restore", (
                Query(f"max by ({s.by}) (checkpoint_restore_last_duration_seconds{{{s.job}}})",
                      "{{training_job}}"),
            ), unit="s"),
            Panel("Restores and failures in the time range", (
                Query(f"sum(increase(checkpoint_restores_total{{{s.job}}}[$__range])) or vector(0)",
                      "restores"),
                Query(f"sum(increase(checkpoint_restore_failures_total{{{s.job}}}[$__range]))"
                      " or vector(0)", "failures"),
            ), kind="stat"),
        )),
    ]  # fmt: skip


DASHBOARDS = {
    "checkpoint-overview": ("Checkpoints / Overview", _overview),
    "checkpoint-job": ("Checkpoints / Job", _job),
    "checkpoint-storage": ("Checkpoints / Storage", _storage),
    "checkpoint-restores": ("Checkpoints / Restores", _restores),
}


def _templating(c: MixinConfig) -> Templating:
    return Templating(
        list=[
            Template(name="datasource", label="Data source", query="prometheus", type="datasource"),
            Template(
                name="cluster",
                label="Cluster",
                query=f"label_values(checkpoint_exporter_build_info{{{c.selector}}}, {c.cluster_label})",
                dataSource=DATASOURCE,
                includeAll=True,
                multi=True,
                allValue=".*",
                default="$__all",
            ),
            Template(
                name="training_job",
                label="Training job",
                query=f'label_values(checkpoint_job_info{{{c.selector},{c.cluster_label}=~"$cluster"}}, training_job)',
                dataSource=DATASOURCE,
                includeAll=True,
                multi=True,
                allValue=".*",
                default="$__all",
            ),
        ]
    )


def _grafana_panels(sections: list[Section]) -> list[object]:
    panels: list[object] = []
    y = 0
    for section in sections:
        panels.append(RowPanel(title=section.title, gridPos=GridPos(h=1, w=24, x=0, y=y)))
        y += 1
        for index, panel in enumerate(section.panels):
            position = GridPos(h=8, w=12, x=12 * (index % 2), y=y + 8 * (index // 2))
            targets = [
                Target(
                    expr=q.expr,
                    legendFormat=q.legend,
                    refId=chr(ord("A") + i),
                    datasource=DATASOURCE,
                )
                for i, q in enumerate(panel.queries)
            ]
            common = dict(
                title=panel.title, description=panel.description or None, dataSource=DATASOURCE,
                targets=targets, gridPos=position,
            )  # fmt: skip
            if panel.kind == "stat":
                panels.append(Stat(**common, format=panel.unit, reduceCalc="lastNotNull"))
            else:
                panels.append(TimeSeries(**common, unit=panel.unit))
        y += 8 * ((len(section.panels) + 1) // 2)
    return panels


def dashboard_json(uid: str, config: MixinConfig | None = None) -> str:
    c = config or MixinConfig()
    title, build = DASHBOARDS[uid]
    dashboard = GrafanaDashboard(
        title=title,
        uid=uid,
        tags=["checkpoint-exporter"],
        templating=_templating(c),
        panels=_grafana_panels(build(c, _Selectors(c))),
        timezone="utc",
        refresh="30s",
        schemaVersion=39,
    ).auto_panel_ids()
    return (
        json.dumps(dashboard.to_json_data(), cls=DashboardEncoder, indent=2, sort_keys=True) + "\n"
    )


def queries(config: MixinConfig | None = None) -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, PromQL) for every panel query, with variables unresolved."""
    c = config or MixinConfig()
    out = []
    for uid, (_, build) in DASHBOARDS.items():
        for section in build(c, _Selectors(c)):
            for panel in section.panels:
                out += [(uid, panel.title, query.expr) for query in panel.queries]
    return out
