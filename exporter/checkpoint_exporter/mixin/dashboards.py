"""Grafana dashboards, generated with grafanalib from the mixin config.

Four dashboards: a cluster overview, one job's saves in detail, storage, and restores. Each has
the datasource, the cluster and the training job as template variables; queries read the
recording rules where several nodes report one job.

The seed article asks to "keep the checkpoint window visible in the monitoring dashboard rather
than averaging it over the whole training run": the overview and the job dashboard draw every
save as an annotation region from its start to its durable commit (the exporter's own
timestamps, see ``save_windows``), and the job dashboard puts node_exporter's and dcgm-exporter's
own NIC, InfiniBand, disk and GPU series for the job's nodes on the same time axis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from grafanalib._gen import DashboardEncoder
from grafanalib.core import (
    Annotations,
    GridPos,
    RowPanel,
    Stat,
    StateTimeline,
    Table,
    TableSortByField,
    Target,
    Template,
    Templating,
    TimeSeries,
)
from grafanalib.core import Dashboard as GrafanaDashboard

from checkpoint_exporter.mixin import rules
from checkpoint_exporter.mixin.config import MixinConfig

DATASOURCE = "${datasource}"

# What a query needs beyond the series every exporter exports under a plain config: another
# exporter's series, an objective only some configs set, or a diagnosed save. ``queries`` leaves
# out those a test's Prometheus was not given.
NODE_EXPORTER = "node_exporter"
DCGM_EXPORTER = "dcgm-exporter"
MTBF = "mtbf"  # the job's reliability objective (config ``mtbf``): the live interval rules
SYMPTOMS = "symptoms"  # a save diagnosed with a symptom
REQUIREMENTS = (NODE_EXPORTER, DCGM_EXPORTER, MTBF, SYMPTOMS)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    requires: tuple[str, ...] = ()  # from REQUIREMENTS


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat | state-timeline | table
    description: str = ""
    wide: bool = False  # the whole row's width (a timeline shared by the panels below it)
    # A table: one row per job (each query a column named by its legend, joined on the
    # labels), its training_job cells linking here (a Grafana URL with data-link variables).
    job_link: str = ""


@dataclass(frozen=True)
class Annotation:
    """A Prometheus annotation query: Grafana draws every series it returns as events, merging
    samples no more than one query step apart into a region."""

    name: str
    expr: str
    title: str
    text: str
    tags: str = "training_job"  # label names whose values become the events' tags
    color: str = "rgba(255, 152, 48, 0.25)"
    use_value_for_time: bool = False  # the value (milliseconds) is the event's time


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


def save_windows(s: _Selectors) -> str:
    """Each save of a job as one series of event times, in milliseconds, that Grafana's
    Prometheus annotations ("series value as timestamp") merge into a region running exactly
    from the save's start to its durable commit, from the exporter's own timestamps.

    Grafana starts a region at a series' first value and extends it by every later value no
    more than one query step ($__interval_ms, the step the backend runs) past the region's end.
    At evaluation time t the value is the lagged time t - 2 steps clamped into the newest save's
    window [start, commit]: while the save is in progress its commit is not known, and the value
    is max(start, t - 2 steps); once committed, clamp(t - 2 steps, start, commit). The value so
    moves from the start to the commit in steps of one step and then stays at the commit: one
    region per save, its ends the exporter's timestamps, wherever the scrapes and steps fall, as
    long as the save is first seen within two steps of its start. A newest save that was
    abandoned (started after the newest commit, no longer in progress) yields nothing: its region
    ends where the exporter last saw it writing. Saves closer together than two steps can merge.
    """
    start = f"max by ({s.by}) (checkpoint_last_save_start_timestamp_seconds{{{s.job}}})"
    commit = f"max by ({s.by}) (checkpoint_last_committed_timestamp_seconds{{{s.job}}})"
    in_progress = f"max by ({s.by}) (checkpoint_saves_in_progress{{{s.job}}})"
    lagged = "(time() - 2 * $__interval_ms / 1000)"
    upto = f"({commit} < {lagged} or {commit} * 0 + {lagged})"  # min(commit, lagged)
    committed = (
        f"(({start} > {upto}) or {upto})\n"  # max(start, min(commit, lagged))
        f"  and on ({s.by}) ({commit} >= {start})"
    )
    writing = (
        f"(({start} > {lagged}) or {start} * 0 + {lagged})\n"
        f"  and on ({s.by}) ({in_progress} > 0)\n"
        f"  unless on ({s.by}) ({commit} >= {start})"
    )
    return f"1000 * (\n  ({committed})\nor\n  ({writing})\n)"


def _annotations(s: _Selectors) -> tuple[Annotation, ...]:
    return (
        Annotation(
            "Checkpoint saves", save_windows(s), title="{{training_job}}: checkpoint save",
            text="from the save's start to its durable commit (exporter timestamps)",
            use_value_for_time=True,
        ),
    )  # fmt: skip


def _job_nodes(c: MixinConfig, s: _Selectors) -> str:
    """The nodes of the exporters that report the chosen jobs from their node, as a ``node``
    label: a job's training nodes (their node-scope exporters know it from the spool). Read from
    a series every process that knows a job exports (checkpoint_job_info lists only the tiers a
    process reads: none on a node whose job is all on a shared tree); a shared scanner
    (checkpoint_exporter_shard_info scope="shared") reads the job's tree for every node and is
    none of its nodes. Each exporter stands for its value of every exporter_node_labels label,
    so another exporter's series meets it by whichever of them it carries."""
    shared = f'checkpoint_exporter_shard_info{{{s.base},scope="shared"}}'
    return "\nor\n".join(
        f"max by ({c.cluster_label}, node) (label_replace(\n"
        f'  checkpoint_restores_total{{{s.job},{label}!=""}}\n'
        f"    unless on ({c.cluster_label}, instance) {shared},\n"
        f'  "node", "$1", {json.dumps(label)}, {json.dumps(regex)}))'
        for label, regex in c.exporter_nodes()
    )


def _on_job_nodes(
    c: MixinConfig, s: _Selectors, by: str, series: str, node: tuple[str, str]
) -> str:
    """``series`` (another exporter's) for the chosen jobs' nodes, reduced by ``node`` + ``by``;
    ``node`` is the (label, regex) that names that exporter's node."""
    label, regex = node
    return (
        f'max by ({c.cluster_label}, node, {by}) (label_replace({series}, "node", "$1", '
        f"{json.dumps(label)}, {json.dumps(regex)}))\n"
        f"and on ({c.cluster_label}, node) (\n{_job_nodes(c, s)}\n)"
    )


def _window(c: MixinConfig, s: _Selectors) -> list[Section]:
    """The checkpoint window: which saves ran when, on which node, and what the node's own
    exporters saw its NICs, disks and GPUs do meanwhile."""
    rate = "$__rate_interval"
    # The chosen clusters' own series: a node name is unique only within its cluster.
    ne, dcgm = f"{c.node_exporter_selector},{s.cluster}", f"{c.dcgm_selector},{s.cluster}"
    node = (NODE_EXPORTER,)

    local = f"checkpoint_local_saves_in_progress{{{s.job}}}"

    def node_rate(metric: str, by: str, extra: str = "") -> str:
        series = f"rate({metric}{{{ne}{extra}}}[{rate}])"
        return _on_job_nodes(c, s, by, series, c.node_exporter_node())

    # The node's own links, not the loopback or the container ends that repeat their bytes.
    links = f",device!~{json.dumps(c.network_device_exclude)}"

    return [
        Section("The checkpoint window (saves shaded: start to durable commit)", (
            Panel("Saves in progress per job and node", (
                Query(f"max by ({s.by}, instance) ({local})\nor\n"
                      f"max by ({s.by}, instance) (checkpoint_saves_in_progress{{{s.job}}})\n"
                      f"  unless on ({s.by}) max by ({s.by}) ({local})",
                      "{{training_job}} {{instance}}"),
            ), kind="state-timeline", wide=True,
               description="Per training node, the saves its ranks started and have not ended "
                           "(the spool); for a job not instrumented, the view of its durable "
                           "tier from the process that reads it."),
            Panel("Network sent per node (node_exporter)", (
                Query(node_rate("node_network_transmit_bytes_total", "device", links),
                      "{{node}} {{device}}", node),
            ), unit="Bps"),
            Panel("InfiniBand sent per node (node_exporter)", (
                Query(node_rate("node_infiniband_port_data_transmitted_bytes_total",
                                "device, port"),
                      "{{node}} {{device}} port {{port}}", node),
            ), unit="Bps"),
            Panel("Disk written per node (node_exporter)", (
                Query(node_rate("node_disk_written_bytes_total", "device"), "{{node}} {{device}}",
                      node),
            ), unit="Bps"),
            Panel("GPU utilisation per node (dcgm-exporter)", (
                Query(_on_job_nodes(c, s, "gpu", f"DCGM_FI_DEV_GPU_UTIL{{{dcgm}}}", c.dcgm_node()),
                      "{{node}} GPU {{gpu}}", (DCGM_EXPORTER,)),
            ), unit="percent"),
        )),
    ]  # fmt: skip


def _symptoms_and_interval(c: MixinConfig, s: _Selectors) -> list[Section]:
    rate = "$__rate_interval"
    recorded = s.recorded_job
    return [
        Section("Diagnosis: what held each save back", (
            Panel("Saves diagnosed per symptom", (
                Query(f"max by ({s.by}, symptom) (increase("
                      f"checkpoint_save_symptoms_total{{{s.job}}}[{rate}]))",
                      "{{training_job}} {{symptom}}", (SYMPTOMS,)),
            ), description="Each symptom's runbook section (/runbooks#symptom-<name>) says "
                           "what to check first and which test tells the cause apart."),
            Panel("The newest save's symptoms", (
                Query(f"max by ({s.by}, symptom) (checkpoint_last_save_symptom_info{{{s.job}}})",
                      "{{training_job}} {{symptom}}", (SYMPTOMS,)),
            ), kind="state-timeline"),
        )),
        Section("The live interval (Young and Daly on the measured save cost)", (
            Panel("Configured against recommended interval", (
                Query(f"{rules.INTERVAL}{{{recorded}}}", "{{training_job}} configured"),
                Query(f"{rules.YOUNG}{{{recorded}}}", "{{training_job}} Young", (MTBF,)),
                Query(f"{rules.DALY}{{{recorded}}}", "{{training_job}} Daly", (MTBF,)),
                Query(f"{rules.RECOMMENDED}{{{recorded}}}", "{{training_job}} recommended",
                      (MTBF,)),
            ), unit="s", description="Recommended: Young's interval, or the save's own duration "
                                     "when longer. CheckpointIntervalOffOptimum tickets when the "
                                     "configured interval stays over twice or under half the "
                                     "recommended one for a day."),
            Panel("Time lost to saves and rework: configured against optimal interval", (
                Query(f"{rules.WASTE_CONFIGURED}{{{recorded}}}", "{{training_job}} configured",
                      (MTBF,)),
                Query(f"{rules.WASTE_OPTIMAL}{{{recorded}}}", "{{training_job}} at Young's",
                      (MTBF,)),
            ), unit="percentunit"),
        )),
    ]  # fmt: skip


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
        Section("Jobs", (_jobs_table(c, s),)),
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


def _jobs_table(c: MixinConfig, s: _Selectors) -> Panel:
    """One row per job of the chosen clusters: how old its newest checkpoint is against its
    limit, what is saving now, and what went wrong in the time range; the job's name opens its
    own dashboard, with its cluster, the data source and the time range kept."""
    one = f"max by ({s.by})"
    link = (
        f"/d/{JOB_DASHBOARD}?var-datasource=${{datasource}}"
        f"&var-cluster=${{__data.fields.{c.cluster_label}}}&var-training_job=${{__value.raw}}"
        "&${__url_time_range}"
    )
    return Panel("Jobs (click a job for its dashboard)", (
        Query(f"time() - {rules.LAST_COMMITTED}{{{s.recorded_job}}}", "Newest checkpoint age"),
        Query(f"{rules.INTERVAL}{{{s.recorded_job}}} + {rules.DEADLINE}{{{s.recorded_job}}}",
              "Interval + deadline"),
        Query(f"{one} (checkpoint_saves_in_progress{{{s.job}}})", "Saves in progress"),
        Query(f"{one} (increase(checkpoint_deadline_misses_total{{{s.job}}}[$__range]))",
              "Deadline misses"),
        Query(f"{one} (increase(checkpoint_saves_aborted_total{{{s.job}}}[$__range]))",
              "Aborted saves"),
    ), kind="table", wide=True, job_link=link)  # fmt: skip


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
        *_window(c, s),
        *_symptoms_and_interval(c, s),
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
OVERVIEW = "checkpoint-overview"  # the fleet view: every job at once
JOB_DASHBOARD = "checkpoint-job"
# The dashboards whose time axis carries the save windows.
ANNOTATED = ("checkpoint-overview", "checkpoint-job")


def annotations_of(uid: str, c: MixinConfig) -> tuple[Annotation, ...]:
    return _annotations(_Selectors(c)) if uid in ANNOTATED else ()


def _annotation_json(annotation: Annotation) -> dict[str, object]:
    return {
        "datasource": DATASOURCE,
        "enable": True,
        "hide": False,
        "iconColor": annotation.color,
        "name": annotation.name,
        "expr": annotation.expr,
        "step": "",  # Grafana's own step for the range; save_windows adapts to it
        "titleFormat": annotation.title,
        "textFormat": annotation.text,
        "tagKeys": annotation.tags,
        "useValueForTime": annotation.use_value_for_time,
    }


def _templating(c: MixinConfig, every_job: bool) -> Templating:
    """The variables; ``every_job``: the job selector is multi-select, all jobs by default (the
    overview, a fleet view), else it picks one job (a detail dashboard draws one job's lines per
    panel: all of 200 jobs at once is unreadable, and slow)."""
    jobs = (
        {"includeAll": True, "multi": True, "allValue": ".*", "default": "$__all"}
        if every_job
        else {"includeAll": False, "multi": False}
    )
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
                **jobs,
            ),
        ]
    )


_STATE_MAPPINGS = [
    {"type": "value", "options": {"0": {"text": "idle", "color": "transparent", "index": 0}}},
    {"type": "range", "options": {"from": 1, "to": None,
                                  "result": {"text": "saving", "color": "orange", "index": 1}}},
]  # fmt: skip


def _grafana_panels(sections: list[Section]) -> list[object]:
    panels: list[object] = []
    y = 0
    for section in sections:
        panels.append(RowPanel(title=section.title, gridPos=GridPos(h=1, w=24, x=0, y=y)))
        y += 1
        column = 0  # panels so far in the current two-panel row
        for panel in section.panels:
            if panel.wide and column:
                y, column = y + 8, 0
            width = 24 if panel.wide else 12
            position = GridPos(h=8, w=width, x=12 * column, y=y)
            if panel.wide or column:
                y, column = y + 8, 0
            else:
                column = 1
            table = panel.kind == "table"
            targets = [
                Target(
                    expr=q.expr,
                    legendFormat=q.legend,
                    refId=chr(ord("A") + i),
                    datasource=DATASOURCE,
                    instant=table,
                    format="table" if table else "time_series",
                )
                for i, q in enumerate(panel.queries)
            ]
            common = dict(
                title=panel.title, description=panel.description or None, dataSource=DATASOURCE,
                targets=targets, gridPos=position,
            )  # fmt: skip
            if panel.kind == "stat":
                panels.append(Stat(**common, format=panel.unit, reduceCalc="lastNotNull"))
            elif table:
                panels.append(_table(panel, common))
            elif panel.kind == "state-timeline":
                # In-progress counts read as idle / saving; any other value (a symptom's info
                # gauge) as itself.
                mappings = _STATE_MAPPINGS if "saves_in_progress" in targets[0].expr else []
                panels.append(StateTimeline(**common, mappings=mappings))
            else:
                panels.append(TimeSeries(**common, unit=panel.unit))
        y += 8 * column
    return panels


def _table(panel: Panel, common: dict[str, object]) -> Table:
    """Instant queries merged into one row per series labels, each value column named by its
    query's legend, sorted by the first, highest first; the training_job cells link to
    ``job_link``."""
    columns = {f"Value #{chr(ord('A') + i)}": q.legend for i, q in enumerate(panel.queries)}
    overrides = [{
        "matcher": {"id": "byName", "options": "training_job"},
        "properties": [{"id": "links", "value": [{"title": "Open the job's dashboard",
                                                   "url": panel.job_link}]}],
    }] if panel.job_link else []  # fmt: skip
    return Table(
        **common,
        transformations=[
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {"excludeByName": {"Time": True}, "renameByName": columns},
            },
        ],
        overrides=overrides,
        sortBy=[TableSortByField(displayName=panel.queries[0].legend, desc=True)],  # worst first
    )


def dashboard_json(uid: str, config: MixinConfig | None = None) -> str:
    c = config or MixinConfig()
    title, build = DASHBOARDS[uid]
    dashboard = GrafanaDashboard(
        title=title,
        uid=uid,
        tags=["checkpoint-exporter"],
        templating=_templating(c, every_job=uid == OVERVIEW),
        annotations=Annotations(list=[_annotation_json(a) for a in annotations_of(uid, c)]),
        panels=_grafana_panels(build(c, _Selectors(c))),
        timezone="utc",
        refresh="30s",
        schemaVersion=39,
    ).auto_panel_ids()
    return (
        json.dumps(dashboard.to_json_data(), cls=DashboardEncoder, indent=2, sort_keys=True) + "\n"
    )


def queries(
    config: MixinConfig | None = None, provided: tuple[str, ...] | frozenset[str] = ()
) -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, PromQL) for every panel query, with variables unresolved,
    that needs nothing beyond the exporters' own series and what ``provided`` names (from
    REQUIREMENTS: node_exporter's series, a job's MTBF, a diagnosed save)."""
    c = config or MixinConfig()
    out = []
    for uid, (_, build) in DASHBOARDS.items():
        for section in build(c, _Selectors(c)):
            for panel in section.panels:
                out += [
                    (uid, panel.title, query.expr)
                    for query in panel.queries
                    if set(query.requires) <= set(provided)
                ]
    return out


def annotation_queries(config: MixinConfig | None = None) -> list[tuple[str, str, str]]:
    """(dashboard uid, annotation name, PromQL) for every annotation, variables unresolved
    (these use $__interval_ms, the query step, which a panel query never needs)."""
    c = config or MixinConfig()
    return [(uid, a.name, a.expr) for uid in DASHBOARDS for a in annotations_of(uid, c)]
