"""Alerts and recording rules, generated from the mixin config.

Every threshold is one of the objectives the exporters export per job (interval, deadline,
retention limit, restore drill age), so one rule fits every job. Several nodes that watch one
shared filesystem export the same job: recording rules reduce them with ``max by
(training_job)``; what differs per node (straggler write ends, local drain) keeps its instance.

Series that stop moving because an exporter cannot see a job (a hung mount) hold their last
values: the alerts on the age of a timestamp would then fire on a job that may be saving fine, so
they hold back while the job's view is stale, and CheckpointDataStale fires instead (a page for a
job that pages, a ticket otherwise).

The groups are split by where they can evaluate: per-node groups read one exporter's series and
keep its instance (any Prometheus shard), per-job groups reduce every exporter's view of a job
(the Prometheus that sees them all, or a global ruler). The mixin config's ``rule_layout`` puts
them in one file or in one file per scope.

Pages follow a job's life, not only its files. A job is active (``ACTIVE``) while it has not
finished (no exporter saw it alive after it said so) and it runs: a job that heartbeats, while
its heartbeats come (``heartbeat_timeout``); one that does not, while it shows a sign of life
(a spool event, a write in its tree; its first sighting until the first) within its
abandon_after; or, with the mixin's ``job_running``, while the scheduler says it runs. The
alerts on a running job's saves (TooOld, NeverCommitted, SaveHung) fire only for active jobs; a
job's critical alerts page only while it is active and its objectives were stated (``PAGES``),
and open a ticket otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from checkpoint_exporter.mixin.config import ALERTS, CRITICAL, SINGLE, WARNING, MixinConfig
from checkpoint_exporter.units import parse_duration

# Recording rules: level:metric:operation.
LAST_COMMITTED = "training_job:checkpoint_last_committed_timestamp_seconds:max"
INTERVAL = "training_job:checkpoint_interval_seconds:max"
DEADLINE = "training_job:checkpoint_deadline_seconds:max"
RETAINED = "training_job:checkpoint_retained_generations:max"
RETAINED_LIMIT = "training_job:checkpoint_retained_generations_limit:max"
VALID_GENERATIONS = "training_job:checkpoint_retained_valid_generations:max"
WRITE_END_SPREAD = "training_job:checkpoint_last_save_local_write_end_timestamp_seconds:spread"
ARRIVAL = "instance:checkpoint_staged_bytes:rate30m"
DRAIN = "instance:checkpoint_drained_bytes:rate30m"
GENERATIONS_THAT_FIT = "training_job:checkpoint_generations_that_fit:count"
PEAK_FOOTPRINT = "mountpoint:checkpoint_peak_footprint:ratio"
AVAIL_PREDICTED = "mountpoint:checkpoint_filesystem_avail_bytes:predict_linear24h"
# Whether each collector had data at all over the last day (a node without GPUs never has).
COLLECTOR_WORKED = "instance_collector:checkpoint_exporter_scrape_collector_success:max1d"
# A day's window over every collector of every node is the costliest read of the node rules
# (2,048 nodes x 10 collectors x a day of samples): it runs in a group of its own, this often.
DAILY_INTERVAL = "5m"
# The freshest view any exporter has of a job's tier (shared scanners run in pairs).
LAST_SCAN_SUCCESS = "training_job_tier:checkpoint_exporter_last_scan_timestamp_seconds:max"
SLO_WINDOWS = ("2h", "6h", "1d", "3d")
# A job's life, from every exporter that knows it.
FIRST_SEEN = "training_job:checkpoint_job_first_seen_timestamp_seconds:min"
ALIVE = "training_job:checkpoint_job_alive_timestamp_seconds:max"
FINISHED_AT = "training_job:checkpoint_job_finished_timestamp_seconds:max"
HEARTBEAT = "training_job:checkpoint_job_heartbeat_timestamp_seconds:max"
# The last sign of life, or where none came yet, the first sighting.
SIGN = "training_job:checkpoint_job_alive_timestamp_seconds:max_or_first_seen"
# The jobs that said they finished and that no exporter saw alive since (give or take the
# finished_grace a process group takes to exit): one node's old `finished` does not silence a
# new run of the job on other nodes.
FINISHED = "training_job:checkpoint_job_finished:bool"
ABANDON_AFTER = "training_job:checkpoint_job_abandon_after_seconds:max"
PAGING = "training_job:checkpoint_job_paging:max"
# 1 for each job that runs: not finished, and a sign of life within its abandon_after (or named by
# the scheduler's job_running); and for each of those whose objectives were stated, whose
# critical alerts page.
ACTIVE = "training_job:checkpoint_job_active:bool"
PAGES = "training_job:checkpoint_job_pages:bool"
# Each node's write end of the job's newest save: a node still exporting an older save (the job
# moved to other nodes) is no baseline.
CURRENT_WRITE_END = (
    "training_job_instance:checkpoint_last_save_local_write_end_timestamp_seconds:current"
)
# Which exporters exported each job, and each shard, over the last day: refreshed every
# DAILY_INTERVAL, so that a job whose exporters all went down is still known to have had them.
JOB_INFO_DAY = "training_job_instance:checkpoint_job_info:max1d"
ACTIVE_DAY = "training_job:checkpoint_job_active:max1d"  # active at any time in the last day
SHARD_INFO_DAY = "shard_instance:checkpoint_exporter_shard_info:max1d"
# The live interval: plan/worksheet.py's formulas on the measured save cost.
LAST_PAUSE = "training_job:checkpoint_last_save_pause_seconds:max"
SAVE_COST = "training_job:checkpoint_save_cost_seconds:avg1d"
MTBF = "training_job:checkpoint_mtbf_seconds:max"
YOUNG = "training_job:checkpoint_young_interval_seconds"
DALY = "training_job:checkpoint_daly_interval_seconds"
# The mean whole save over a day, and the interval recommended: Young's, or that save's own
# duration when longer (an async save's pause can make Young's shorter than a save takes).
SAVE_DURATION = "training_job:checkpoint_save_duration_seconds:avg1d"
RECOMMENDED = "training_job:checkpoint_recommended_interval_seconds"
WASTE_CONFIGURED = "training_job:checkpoint_waste_fraction:configured"
WASTE_OPTIMAL = "training_job:checkpoint_waste_fraction:optimal"
# The alert's band around Young's interval: a factor, so one rule fits every job. Within it the
# waste stays within 25 % of the optimum's (waste(kT) / waste(T) = (k + 1/k) / 2 = 1.25 at 2).
INTERVAL_BAND = 2


def slo_errors(window: str) -> str:
    return f"training_job:checkpoint_deadline_slo_errors:ratio_rate{window}"


def _node_recording(c: MixinConfig) -> list[dict[str, str]]:
    """Rates and ratios of one exporter's own series: any Prometheus that scrapes it can record
    them."""
    s = "{" + c.selector + "}"
    cl = c.cluster_label
    return [
        {"record": ARRIVAL, "expr": f"rate(checkpoint_staged_bytes_total{s}[30m])"},
        {"record": DRAIN, "expr": f"rate(checkpoint_drained_bytes_total{s}[30m])"},
        {"record": PEAK_FOOTPRINT, "expr": f"""sum by ({cl}, instance, mountpoint) (
  (checkpoint_retained_generations_limit{s} + 1) * checkpoint_last_committed_size_bytes{s}
  * on ({cl}, instance, training_job) group_left (mountpoint)
    checkpoint_job_filesystem_info{{{c.selector},tier="durable"}}
)
/ on ({cl}, instance, mountpoint)
max by ({cl}, instance, mountpoint) (
  checkpoint_filesystem_size_bytes{s} * (1 - checkpoint_filesystem_reserve_ratio{s})
)"""},
        {"record": AVAIL_PREDICTED,
         "expr": f"predict_linear(checkpoint_filesystem_avail_bytes{s}[6h], 86400)"},
    ]  # fmt: skip


def _node_daily(c: MixinConfig) -> list[dict[str, str]]:
    """Per-node records over a day, evaluated every DAILY_INTERVAL rather than every round."""
    s = "{" + c.selector + "}"
    return [
        {"record": COLLECTOR_WORKED,
         "expr": f"max_over_time(checkpoint_exporter_scrape_collector_success{s}[1d])"},
    ]  # fmt: skip


def _job_recording(c: MixinConfig) -> list[dict[str, str]]:
    """One value per job from every exporter that sees it: the Prometheus that scrapes all of
    them, or a global ruler, records these."""
    s = "{" + c.selector + "}"
    cl = c.cluster_label
    dedupe = {
        LAST_COMMITTED: "checkpoint_last_committed_timestamp_seconds",
        INTERVAL: "checkpoint_interval_seconds",
        DEADLINE: "checkpoint_deadline_seconds",
        RETAINED: "checkpoint_retained_generations",
        RETAINED_LIMIT: "checkpoint_retained_generations_limit",
        VALID_GENERATIONS: "checkpoint_retained_valid_generations",
        ALIVE: "checkpoint_job_alive_timestamp_seconds",
        FINISHED_AT: "checkpoint_job_finished_timestamp_seconds",
        HEARTBEAT: "checkpoint_job_heartbeat_timestamp_seconds",
        ABANDON_AFTER: "checkpoint_job_abandon_after_seconds",
        PAGING: "checkpoint_job_paging",
    }
    rules = [
        {"record": name, "expr": f"max by ({cl}, training_job) ({metric}{s})"}
        for name, metric in dedupe.items()
    ]
    on = f"on ({cl}, training_job)"
    write_end = f"checkpoint_last_save_local_write_end_timestamp_seconds{s}"
    local_step = f"checkpoint_last_save_local_step{s}"
    rules += [
        {"record": FIRST_SEEN,
         "expr": f"min by ({cl}, training_job) (checkpoint_job_first_seen_timestamp_seconds{s})"},
        {"record": SIGN, "expr": f"{ALIVE} or {FIRST_SEEN}"},
        {"record": FINISHED,
         "expr": f"{FINISHED_AT} + {parse_duration(c.finished_grace):g} >= {on} {ALIVE}\n"
                 f"or\n{FINISHED_AT} unless {on} {ALIVE}"},
        {"record": ACTIVE, "expr": _active(c)},
        {"record": PAGES, "expr": f"{ACTIVE}\nand {on} ({PAGING} == 1)"},
        # Each node's write end of the job's newest save: the nodes whose newest save is the
        # job's highest step (a node the job left, or not done writing the next save yet,
        # shows an older one); every node, for a job whose events name no step.
        {"record": CURRENT_WRITE_END,
         "expr": f"(\n  {write_end}\n  and on ({cl}, instance, training_job)\n"
                 f"    ({local_step} == {on} group_left () max by ({cl}, training_job) ({local_step}))\n"
                 f"  or\n  {write_end} unless {on} {local_step}\n)\n"
                 # A node of an old run of the job (a roll-back, a step counter started again)
                 # saving the same step hours ago is not of this save either.
                 f"and\n{write_end} > {on} group_left ()\n"
                 f"  (max by ({cl}, training_job) ({write_end}) - {on} {INTERVAL})"},
        {"record": WRITE_END_SPREAD,
         "expr": f"max by ({cl}, training_job) ({CURRENT_WRITE_END}) - min by ({cl}, training_job) ({CURRENT_WRITE_END})"},
        {"record": GENERATIONS_THAT_FIT, "expr": f"""floor(
  max by ({cl}, training_job) (
    (
      checkpoint_filesystem_avail_bytes{s}
      - checkpoint_filesystem_reserve_ratio{s} * checkpoint_filesystem_size_bytes{s}
    )
    * on ({cl}, instance, mountpoint) group_right
      checkpoint_job_filesystem_info{{{c.selector},tier="durable"}}
  )
  / on ({cl}, training_job)
  max by ({cl}, training_job) (checkpoint_last_committed_size_bytes{s})
)"""},
        # 0 before the tier's first pass: CheckpointExporterNotReady covers that time.
        {"record": LAST_SCAN_SUCCESS,
         "expr": f"max by ({cl}, training_job, tier) (checkpoint_exporter_last_scan_timestamp_seconds{s} > 0)"},
    ]  # fmt: skip
    # Every save the histogram observes is counted within the deadline or missed: two series
    # per job, where the deadline's histogram bucket needed a join over every bucket series.
    saves = f'checkpoint_save_duration_seconds_count{{{c.selector},phase="total"}}'
    for window in SLO_WINDOWS:
        within = f"max by ({cl}, training_job) (rate(checkpoint_saves_within_deadline_total{s}[{window}]))"
        total = f"max by ({cl}, training_job) (rate({saves}[{window}]))"
        rules.append(
            {"record": slo_errors(window), "expr": f"1 - (\n  {within}\n  /\n  {total}\n)"}
        )  # fmt: skip
    return rules + _interval_recording(c)


def _active(c: MixinConfig) -> str:
    """The jobs that run, value 1: not finished, and running by their own signs (a job that
    heartbeats while its heartbeats come; another while it showed a sign of life within its
    abandon_after, its first sighting until the first) or, where the mixin joins a scheduler's
    view (``job_running``), named by it. A job that stopped heartbeating (preempted, queued,
    crashed) does not run, however recently it wrote."""
    cl = c.cluster_label
    on = f"on ({cl}, training_job)"
    running = (
        f"time() - {HEARTBEAT} < {parse_duration(c.heartbeat_timeout):g}\n"
        f"or\n(time() - {SIGN} < {ABANDON_AFTER} unless {on} {HEARTBEAT})"
    )
    if c.job_running:
        running = c.job_running
    return f"count by ({cl}, training_job) (\n{_indent(running)}\n  unless {on} {FINISHED}\n)"


def _job_daily(c: MixinConfig) -> list[dict[str, str]]:
    """Per-job records over a day, evaluated every DAILY_INTERVAL rather than every round."""
    s = "{" + c.selector + "}"
    cl = c.cluster_label
    return [
        {"record": ACTIVE_DAY, "expr": f"max_over_time({ACTIVE}[1d])"},
        {"record": JOB_INFO_DAY,
         "expr": f"max by ({cl}, instance, training_job) (max_over_time(checkpoint_job_info{s}[1d]))"},
        {"record": SHARD_INFO_DAY,
         "expr": f"max by ({cl}, instance, shard, shards, scope) (max_over_time(checkpoint_exporter_shard_info{s}[1d]))"},
    ]  # fmt: skip


def _save_cost(c: MixinConfig, phase: str) -> str:
    """The mean observed duration of one phase over a day, for the jobs that observed it."""
    selector = f'{{{c.selector},phase="{phase}"}}'
    return (
        f"max by ({c.cluster_label}, training_job) (\n"
        f"  rate(checkpoint_save_duration_seconds_sum{selector}[1d])\n"
        f"  / (rate(checkpoint_save_duration_seconds_count{selector}[1d]) > 0)\n)"
    )


def _interval_recording(c: MixinConfig) -> list[dict[str, str]]:
    """Young's and Daly's interval and the waste fraction (plan/worksheet.py's young_interval,
    daly_interval, waste_fraction) from the measured save cost and the job's MTBF objective.

    The cost is what training sees of a save: the pause (the ranks' blocking time, from the
    spool), or the whole save for jobs seen from the disk alone, which then stop for all of it
    as far as anyone can tell. No objective gives the restart time, so it is 0 here, as the
    worksheet's default: the waste fractions are lower bounds.
    """
    s = "{" + c.selector + "}"
    cl = c.cluster_label
    s_, m = SAVE_COST, MTBF
    pause = f'checkpoint_last_save_phase_seconds{{{c.selector},phase="pause"}}'
    return [
        # The slowest node's pause of each save: the training-visible pause of a job whose ranks
        # wait for each other. In the cluster shape the nodes export no histograms for a job on
        # a shared tree, only this gauge; its day's average weighs each save by the time it
        # stood, its interval, which is every save alike when the interval holds.
        {"record": LAST_PAUSE, "expr": f"max by ({cl}, training_job) ({pause})"},
        {"record": SAVE_COST, "expr": (
            f"{_save_cost(c, 'pause')}\nor\navg_over_time({LAST_PAUSE}[1d])\n"
            f"or\n{_save_cost(c, 'total')}"
        )},
        {"record": MTBF, "expr": f"max by ({cl}, training_job) (checkpoint_mtbf_seconds{s})"},
        {"record": YOUNG, "expr": f"sqrt(2 * {s_} * {m})"},
        {"record": SAVE_DURATION, "expr": _save_cost(c, "total")},
        {"record": RECOMMENDED,
         "expr": f"{YOUNG} >= on ({cl}, training_job) {SAVE_DURATION}\nor\n"
                 f"{SAVE_DURATION} and on ({cl}, training_job) {YOUNG}"},
        # Daly (2006): sqrt(2sM) (1 + sqrt(s/2M) / 3 + s/18M) - s, and M itself once s >= 2M.
        {"record": DALY, "expr": (
            f"(\n  {YOUNG} * (1 + sqrt({s_} / (2 * {m})) / 3 + {s_} / (18 * {m})) - {s_}\n)\n"
            f"and on ({cl}, training_job) ({s_} < 2 * {m})\n"
            f"or\n{m} and on ({cl}, training_job) ({s_} >= 2 * {m})"
        )},
        # waste(T) = s / T + (T / 2 + restart) / M, restart 0.
        {"record": WASTE_CONFIGURED, "expr": f"{s_} / {INTERVAL}\n+ ({INTERVAL} / 2) / {m}"},
        {"record": WASTE_OPTIMAL, "expr": f"{s_} / {YOUNG}\n+ ({YOUNG} / 2) / {m}"},
    ]  # fmt: skip


def stale_views(c: MixinConfig, tier: str | None = None) -> str:
    """The job tiers (one ``tier``, or any) whose freshest view is older than ``stale_after``."""
    selector = f'{{tier="{tier}"}}' if tier else ""
    return f"time() - {LAST_SCAN_SUCCESS}{selector} > {parse_duration(c.stale_after):g}"


def stale_here(c: MixinConfig) -> str:
    """The job tiers whose view by this exporter is older than ``stale_after``: what a per-node
    rule can know, since it does not see the other exporters' views."""
    last_scan = f"checkpoint_exporter_last_scan_timestamp_seconds{{{c.selector}}}"
    return f"time() - ({last_scan} > 0) > {parse_duration(c.stale_after):g}"


@dataclass(frozen=True)
class _Rule:
    """One alerting rule of an alert (an alert may have several: paging and ticket variants, the
    budget burn's windows)."""

    expr: str
    severity: str | None = None  # None: the alert's (ALERTS, or the mixin's override)
    labels: dict[str, str] = field(default_factory=dict)
    # Replaces {labels} in the description: a template sees the expression's labels, not these.
    words: dict[str, str] = field(default_factory=dict)


def _pages(c: MixinConfig, name: str, base: str) -> list[_Rule]:
    """A job's critical alert: it pages while the job runs and its objectives were stated
    (PAGES), and is the same condition as a ticket otherwise (a discovered run held to
    objectives nobody chose, a finished or abandoned job)."""
    if c.severity_of(name) != CRITICAL:
        return [_Rule(base)]
    on = f"on ({c.cluster_label}, training_job)"
    return [
        _Rule(f"(\n{_indent(base)}\n)\nand {on} {PAGES}"),
        _Rule(f"(\n{_indent(base)}\n)\nunless {on} {PAGES}", WARNING),
    ]


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _incomplete_uploads_piling(c: MixinConfig, unless_stale: str) -> list[_Rule]:
    """Open uploads whose oldest has not grown for incomplete_upload_max_age: the bytes they
    hold, or their count where the store does not tell sizes.

    The exporter dates an upload when it first sees it or sees it grow (stores report fixed or
    drifting start times), so a save in progress, and a job whose saves always hold one upload
    open (each replacing the last), keep the oldest recent; only an upload nothing writes to
    ages. ``max`` across exporters: a replica that restarted dates the uploads anew, and one
    replica's frozen view is no reason for a ticket.
    """
    s = "{" + c.selector + "}"
    on = f"on ({c.cluster_label}, training_job)"

    def per_job(metric: str) -> str:
        return f"max by ({c.cluster_label}, training_job) ({metric}{s})"

    oldest = per_job("checkpoint_object_store_oldest_incomplete_upload_timestamp_seconds")
    stuck = f"time() - {oldest} > {parse_duration(c.incomplete_upload_max_age):g}"
    held = per_job("checkpoint_object_store_incomplete_upload_bytes")
    count = per_job("checkpoint_object_store_incomplete_uploads")
    # The label `unit` says what the value counts (and keeps the two rules apart).
    return [
        _Rule(f"{held}\nand {on}\n  ({stuck})\n{unless_stale}", labels={"unit": "bytes"},
              words={"{uploads}": "{{ $value | humanize1024 }}B of parts in multipart uploads"}),
        _Rule(f"{count}\nunless {on} {held}\nand {on}\n  ({stuck})\n{unless_stale}",
              labels={"unit": "uploads"},
              words={"{uploads}": "{{ $value }} multipart upload(s) (the store does not tell "
                                  "their size)"}),
    ]  # fmt: skip


def _alert_rules(c: MixinConfig) -> dict[str, list[_Rule]]:
    s = "{" + c.selector + "}"
    cl = c.cluster_label
    on = f"on ({cl}, training_job)"
    w = c.event_window
    budget = 1 - c.slo_target
    # The ages below grow by themselves once a job's series stop moving.
    unless_stale = f"unless {on}\n  ({stale_views(c)})"
    unless_durable_stale = f"unless {on}\n  ({stale_views(c, 'durable')})"
    drill_age = f"max by ({cl}, training_job) (checkpoint_restore_drill_max_age_seconds{s})"
    up_now = f"{c.selector.join(('up{', '}'))}"
    # The shards that had replicas in the last day, and the ones with a replica up now. A shard
    # pages when none of its replicas is up: of the sharding that runs, or of any sharding once
    # every replica of the scope is gone (a resharding retires the old shards' labels).
    shards_day = f"max by ({cl}, shard, shards, scope) (max_over_time({SHARD_INFO_DAY}[15m]))"
    live_shards = (
        f"max by ({cl}, shard, shards, scope) "
        f"(checkpoint_exporter_shard_info{s} and on ({cl}, instance) ({up_now} == 1))"
    )
    burn = [
        _Rule(
            f"{slo_errors(long)} > {factor * budget:g}\nand {slo_errors(short)} > {factor * budget:g}",
            WARNING,
            {"long": long, "short": short},
            {"{long}": long, "{short}": short},
        )
        for long, short, factor in (("1d", "2h", 3), ("3d", "6h", 1))
    ]
    fast = (
        f"{slo_errors('6h')} > {6 * budget:g}\nand {slo_errors('2h')} > {6 * budget:g}\n"
        f"and max by ({cl}, training_job) (increase(checkpoint_deadline_misses_total{s}[6h]))"
        f" >= {c.burn_min_misses}"
    )
    if c.severity_of("CheckpointDeadlineBudgetBurn") == CRITICAL:
        burn.insert(0, _Rule(f"(\n{_indent(fast)}\n)\nand {on} {PAGES}", None,
                             {"long": "6h", "short": "2h"}, {"{long}": "6h", "{short}": "2h"}))  # fmt: skip
    rules: dict[str, list[_Rule] | str] = {
        "CheckpointTooOld": (
            f"(time() - {LAST_COMMITTED}\n> {INTERVAL} + {DEADLINE})\n"
            f"{unless_durable_stale}\nand {on} {ACTIVE}"
        ),
        # Alive and watched for an interval and a deadline, its durable tier read, and nothing
        # committed: a wrong path, or a job that crashes before its first save.
        "CheckpointNeverCommitted": (
            f"(time() - {FIRST_SEEN}\n> {INTERVAL} + {DEADLINE})\n"
            f"unless {on} {LAST_COMMITTED}\n"
            f'and {on} {LAST_SCAN_SUCCESS}{{tier="durable"}}\n'
            f"{unless_durable_stale}\nand {on} {ACTIVE}"
            # Seen alive (or running by the scheduler): a job configured before it starts, its
            # directory not made yet, is no job that fails to save.
            + ("" if c.job_running else f"\nand {on} {ALIVE}")
        ),
        "CheckpointDeadlineMissed": f"max by ({cl}, training_job) (increase(checkpoint_deadline_misses_total{s}[{w}])) > 0",
        "CheckpointSaveHung": (
            f"(time() - max by ({cl}, training_job) (checkpoint_oldest_save_in_progress_start_timestamp_seconds{s} > 0)\n"
            f"> 2 * {DEADLINE})\n{unless_stale}\nand {on} {ACTIVE}"
        ),
        "CheckpointSavesPilingUp": f"max by ({cl}, training_job) (checkpoint_saves_in_progress{s}) > 1",
        "CheckpointSaveAborted": f"max by ({cl}, training_job) (increase(checkpoint_saves_aborted_total{s}[{w}])) > 0",
        "CheckpointInvalid": f"min by ({cl}, training_job) (checkpoint_last_committed_valid{s}) == 0",
        # Training restores: every restore minus the drills'.
        "CheckpointRestoreFailed": (
            f"max by ({cl}, training_job) (\n"
            f"  increase(checkpoint_restore_failures_total{s}[{w}])\n"
            f"  - increase(checkpoint_restore_drill_failures_total{s}[{w}])\n) > 0"
        ),
        "CheckpointRestoreDrillFailed": f"max by ({cl}, training_job) (increase(checkpoint_restore_drill_failures_total{s}[{w}])) > 0",
        # The age of the last success; a job never restored counts from when it was first seen.
        "CheckpointRestoreDrillOverdue": (
            f"(\n  time() - max by ({cl}, training_job) (checkpoint_restore_last_success_timestamp_seconds{s})\n"
            f"  > {drill_age}\n"
            f"  or\n  time() - {FIRST_SEEN} > {drill_age}\n"
            f"  unless {on} checkpoint_restore_last_success_timestamp_seconds{s}\n)\n"
            f"and {on} {ACTIVE}"
        ),
        "CheckpointDrainFallingBehind": (
            f"{ARRIVAL} > {c.drain_margin} * {DRAIN}\nand checkpoint_drain_backlog_bytes{s} > 0"
        ),
        "CheckpointDrainStalled": (
            f"(time() - (checkpoint_oldest_undrained_commit_timestamp_seconds{s} > 0)\n"
            f"> checkpoint_interval_seconds{s} + checkpoint_deadline_seconds{s})\n"
            f"unless on ({cl}, instance, training_job)\n  ({stale_here(c)})"
        ),
        "CheckpointDrainLostGeneration": f"increase(checkpoint_drain_lost_generations_total{s}[{w}]) > 0",
        "CheckpointCapacityLow": f"{GENERATIONS_THAT_FIT} < 1",
        "CheckpointCapacityFillingUp": (
            f"{AVAIL_PREDICTED}\n< checkpoint_filesystem_reserve_ratio{s} * checkpoint_filesystem_size_bytes{s}\n"
            f"and checkpoint_filesystem_avail_bytes{s}\n> checkpoint_filesystem_reserve_ratio{s} * checkpoint_filesystem_size_bytes{s}"
        ),
        "CheckpointStragglerNode": (
            f"{CURRENT_WRITE_END}\n- {on} group_left min by ({cl}, training_job) ({CURRENT_WRITE_END})\n"
            f"> {on} group_left {c.straggler_fraction} * {DEADLINE}"
        ),
        "CheckpointExporterDown": f"{up_now} == 0",
        # Exporters that watched a job in the last day are down, and none that is up watches it
        # (a job removed from the config has its exporter up); or no exporter is scraped at all.
        "CheckpointJobUnmonitored": (
            f"max by ({cl}, training_job) (\n"
            f"  max_over_time({JOB_INFO_DAY}[15m])\n  and on ({cl}, instance) ({up_now} == 0)\n)\n"
            f"unless {on} max by ({cl}, training_job) (checkpoint_job_info{s})\n"
            f"and {on} max_over_time({ACTIVE_DAY}[15m])\n"
            f"or\nabsent({up_now})"
        ),
        # A shard of the current sharding (a resharding retires the old shard labels) whose
        # replicas are all down or gone.
        "CheckpointShardUnmonitored": (
            f"(\n  {shards_day}\n  and on ({cl}, shards, scope) {live_shards}\n"
            f"  or\n  {shards_day} unless on ({cl}, scope) {live_shards}\n)\n"
            f"unless on ({cl}, shard, shards, scope) {live_shards}"
        ),
        # The daily record is refreshed every DAILY_INTERVAL: its newest value in 15m.
        "CheckpointCollectorFailing": (
            f"checkpoint_exporter_scrape_collector_success{s} == 0\n"
            f"and on ({cl}, instance, collector) max_over_time({COLLECTOR_WORKED}[15m]) == 1"
        ),
        "CheckpointRetentionExceeded": f"{RETAINED} > {RETAINED_LIMIT}",
        "CheckpointIncompleteUploadsPiling": _incomplete_uploads_piling(c, unless_stale),
        "CheckpointNoRecoverableGeneration": (
            f"{VALID_GENERATIONS} == 0\nand max_over_time({VALID_GENERATIONS}[1d]) > 0"
        ),
        "CheckpointStorageClockSkew": (
            f"max by ({cl}, instance, training_job) (abs(checkpoint_storage_clock_skew_seconds{s})) > 60"
        ),
        # The value is the ratio: configured interval / Young's.
        "CheckpointIntervalOffOptimum": (
            f"{INTERVAL} / {RECOMMENDED} > {INTERVAL_BAND}\n"
            f"or\n{INTERVAL} / {RECOMMENDED} < 1 / {INTERVAL_BAND}"
        ),
        # The value is how long it has been silent.
        # For as long again as abandon_after after it was abandoned, then no more: the old runs
        # under a discover root are not a ticket forever.
        "CheckpointJobAbandoned": (
            f"time() - {SIGN} >= {ABANDON_AFTER}\n"
            f"and {on} time() - {SIGN} < 2 * {ABANDON_AFTER}\n"
            f"unless {on} {FINISHED}\nand {on} ({PAGING} == 1)"
            + (f"\nunless {on} ({c.job_running})" if c.job_running else "")
        ),
        # Runs (its ranks write events) for an hour, and no exporter watches its checkpoints: it
        # saves where nothing is watched (a wrong path), or its directory is outside every root.
        "CheckpointJobPathUnwatched": (
            f"time() - {HEARTBEAT} < {parse_duration(c.heartbeat_timeout):g}\n"
            f"and {on} time() - {FIRST_SEEN} > {parse_duration(c.heartbeat_timeout):g}\n"
            f"unless {on} max by ({cl}, training_job) (checkpoint_job_info{s})"
        ),
        "CheckpointJobsNotWatched": f"checkpoint_exporter_discover_excess_jobs{s} > 0",
        "CheckpointTreeUnreadable": f"checkpoint_exporter_unreadable_paths{s} > 0",
        "CheckpointSpoolUnwritable": f"checkpoint_exporter_spool_writable{s} == 0",
        "CheckpointSpoolSquatted": f"checkpoint_exporter_spool_squatted{s} > 0",
        "CheckpointDataStale": stale_views(c),
        "CheckpointMountStuck": (
            f"max by ({cl}, instance, mountpoint) (\n"
            f"  checkpoint_exporter_mount_stuck{s} == 1 or checkpoint_filesystem_device_error{s} == 1\n)"
        ),
        # As PrometheusBadConfig: max_over_time rides out a missed scrape.
        "CheckpointExporterBadConfig": (
            f"max_over_time(checkpoint_exporter_config_last_reload_successful{s}[5m]) == 0"
        ),
        "CheckpointExporterNotReady": f"checkpoint_exporter_ready{s} == 0",
        "CheckpointDeadlineBudgetBurn": burn,
    }  # fmt: skip
    return {
        name: rule if isinstance(rule, list) else
        (_pages(c, name, rule) if name in PAGING_ALERTS else [_Rule(rule)])
        for name, rule in rules.items()
    }  # fmt: skip


# A job's critical alerts that page only for a running job with stated objectives (a ticket
# otherwise): _pages. CheckpointJobUnmonitored is not among them (a job whose exporters are all
# gone has no series left to say whether it pages), nor the per-node ones.
PAGING_ALERTS = frozenset({
    "CheckpointTooOld", "CheckpointNeverCommitted", "CheckpointSaveHung", "CheckpointInvalid",
    "CheckpointRestoreFailed", "CheckpointCapacityLow", "CheckpointNoRecoverableGeneration",
    "CheckpointDataStale",
})  # fmt: skip

# How the alert knows the job runs, in its description.
RUNNING_BY_SIGNS = (
    "not finished, and heartbeating, or with no heartbeats a spool event or write within its "
    "abandon_after"
)
RUNNING_BY_SCHEDULER = "not finished, and its scheduler says it runs"
# Counts in descriptions are whole numbers: increase() extrapolates (2.012 saves).
_COUNT = '{{ $value | printf "%.0f" }}'
_DESCRIPTIONS = {
    "CheckpointTooOld": "{{ $labels.training_job }}: the newest committed checkpoint is {{ $value | humanizeDuration }} old, more than its interval plus deadline, and the job runs ({running}). A restart now would lose that much training.",
    "CheckpointNeverCommitted": "{{ $labels.training_job }}: watched for {{ $value | humanizeDuration }} and running, and not one checkpoint has committed where it is watched (checkpoint_job_info's path; checkpoint_exporter_path_missing says whether the directory exists). A wrong checkpoint path, or a job that fails before its first save.",
    "CheckpointDeadlineMissed": "{{ $labels.training_job }}: " + _COUNT + " save(s) took longer than the deadline in the last {window}.",
    "CheckpointSaveHung": "{{ $labels.training_job }}: a save started {{ $value | humanizeDuration }} ago and has not committed, more than twice its deadline.",
    "CheckpointSavesPilingUp": "{{ $labels.training_job }}: {{ $value }} saves are in progress at once.",
    "CheckpointSaveAborted": "{{ $labels.training_job }}: " + _COUNT + " save(s) ended without a commit in the last {window} (their ranks reported save_failed, a newer save committed over them, or nothing moved for abort_after).",
    "CheckpointInvalid": "{{ $labels.training_job }}: the newest committed checkpoint failed validation (missing or truncated shard, bad zip, bad metadata or checksum); a restart would pick it.",
    "CheckpointRestoreFailed": "{{ $labels.training_job }}: " + _COUNT + " restore(s) by the training job failed in the last {window}: the job cannot restart from its checkpoint.",
    "CheckpointRestoreDrillFailed": "{{ $labels.training_job }}: " + _COUNT + " restore drill(s) failed in the last {window}; the training job itself has not failed to restore.",
    "CheckpointRestoreDrillOverdue": "{{ $labels.training_job }}: no successful restore for {{ $value | humanizeDuration }} (or in all that time it has been watched), longer than its restore_drill_max_age.",
    "CheckpointDrainFallingBehind": "{{ $labels.training_job }} on {{ $labels.instance }}: staging receives {{ $value | humanize1024 }}B/s, more than drains to durable storage.",
    "CheckpointDrainStalled": "{{ $labels.training_job }} on {{ $labels.instance }}: a staged generation has waited {{ $value | humanizeDuration }} for durable storage.",
    "CheckpointDrainLostGeneration": "{{ $labels.training_job }} on {{ $labels.instance }}: " + _COUNT + " staged generation(s) were deleted from staging before their durable copy committed in the last {window}; they exist nowhere now.",
    "CheckpointCapacityLow": "{{ $labels.training_job }}: {{ $value }} more generations fit in the usable free space; the next save will fail or eat the reserve.",
    "CheckpointCapacityFillingUp": "{{ $labels.mountpoint }} on {{ $labels.instance }} will have {{ $value | humanize1024 }}B available in 24 h, below its reserve.",
    "CheckpointStragglerNode": "{{ $labels.training_job }}: {{ $labels.instance }} finished writing its part of the newest save {{ $value | humanizeDuration }} after the first node.",
    "CheckpointExporterDown": "checkpoint-exporter {{ $labels.instance }} is down; other exporters still watch the shared trees, this node's spool and staging tiers are not read.",
    "CheckpointJobUnmonitored": "{{ with $labels.training_job }}{{ . }}: every checkpoint-exporter that watched it is down, and no other watches it: none of its checkpoint alerts can fire.{{ else }}No checkpoint-exporter is scraped at all: no checkpoint alert can fire.{{ end }}",
    "CheckpointShardUnmonitored": "Shard {{ $labels.shard }} of {{ $labels.shards }}: every replica is down; the jobs of that shard are not watched.",
    "CheckpointCollectorFailing": "checkpoint-exporter {{ $labels.instance }}: collector {{ $labels.collector }} is failing.",
    "CheckpointDeadlineBudgetBurn": "{{ $labels.training_job }}: {{ $value | humanizePercentage }} of saves missed the deadline over {long} (and over {short}), against an SLO of {target}.",
    "CheckpointRetentionExceeded": "{{ $labels.training_job }}: {{ $value }} generations are retained, more than its limit.",
    "CheckpointIncompleteUploadsPiling": "{{ $labels.training_job }}: {uploads} open under its object-store prefix, the oldest not grown for over {upload_age}: left by an interrupted save, and billed as stored until aborted. Abort the stale uploads (the runbook has the commands) and give the bucket a lifecycle rule that aborts incomplete multipart uploads after a day.",
    "CheckpointNoRecoverableGeneration": "{{ $labels.training_job }}: no committed checkpoint that passes validation is left to restore from.",
    "CheckpointStorageClockSkew": "{{ $labels.training_job }} on {{ $labels.instance }}: file times are {{ $value | humanizeDuration }} off this node's clock; ages, and time windows from disk alone, are off by as much.",
    "CheckpointIntervalOffOptimum": "{{ $labels.training_job }}: the configured interval is {{ $value | printf \"%.2f\" }}x the recommended one (Young's interval for its measured save cost, mean over a day, and its mtbf; or the save's own duration when longer); the GPU time lost to saving and to recomputing after failures is above the optimum's.",
    "CheckpointJobAbandoned": "{{ $labels.training_job }}: no sign of life for {{ $value | humanizeDuration }} (no heartbeat, no spool event, no write in its tree), longer than its abandon_after, and it never said it finished: its checkpoint alerts no longer page. Mark it finished or remove it from the config.",
    "CheckpointJobPathUnwatched": "{{ $labels.training_job }}: its ranks have reported for an hour, and no exporter watches its checkpoints: it saves where nothing is watched (its checkpoint path is wrong, or outside every configured path and discover root), so nothing checks them.",
    "CheckpointJobsNotWatched": "checkpoint-exporter {{ $labels.instance }}: {{ $value }} job directories under {{ $labels.root }} are not watched (over max_jobs; the newest are watched).",
    "CheckpointTreeUnreadable": "{{ $labels.training_job }} ({{ $labels.tier }} tier) on {{ $labels.instance }}: {{ $value }} directories cannot be read by the exporter; what is below them is not seen.",
    "CheckpointSpoolSquatted": "{{ $labels.training_job }} on {{ $labels.instance }}: {{ $value }} spool director(y/ies) of the job belong to another user and are not read (the log names each, its owner and the job's); the job's own events go to <job>@<uid>.",
    "CheckpointSpoolUnwritable": "checkpoint-exporter {{ $labels.instance }}: training jobs cannot write the event spool (missing, or not mode 1733); the save clocks of instrumented jobs on this node are lost.",
    "CheckpointDataStale": "{{ $labels.training_job }} ({{ $labels.tier }} tier): no exporter has confirmed its view for {{ $value | humanizeDuration }}; its other checkpoint alerts cannot be trusted, and the age-based ones hold back until it is fresh again.",
    "CheckpointMountStuck": "{{ $labels.mountpoint }} on {{ $labels.instance }}: a scan or statvfs has not answered within its budget (or statvfs fails); the jobs on it are not updated.",
    "CheckpointExporterBadConfig": "checkpoint-exporter {{ $labels.instance }}: the last configuration reload failed; it runs the previous configuration, and a restart would fail.",
    "CheckpointExporterNotReady": "checkpoint-exporter {{ $labels.instance }} has not finished the first pass of every watched tier (checkpoint_exporter_first_scan_done names them); the jobs not passed yet export nothing to alert on.",
}  # fmt: skip


# Alerts on one exporter's own series, each keeping its instance: any Prometheus shard that
# scrapes the exporter evaluates them. Every other alert is on a training_job as a whole, from
# every exporter that sees it (deduplicated, compared across nodes): per job.
NODE_ALERTS = frozenset({
    "CheckpointDrainFallingBehind", "CheckpointDrainStalled", "CheckpointDrainLostGeneration",
    "CheckpointCapacityFillingUp", "CheckpointExporterDown", "CheckpointCollectorFailing",
    "CheckpointStorageClockSkew", "CheckpointMountStuck", "CheckpointExporterBadConfig",
    "CheckpointExporterNotReady", "CheckpointJobsNotWatched", "CheckpointTreeUnreadable",
    "CheckpointSpoolUnwritable", "CheckpointSpoolSquatted",
})  # fmt: skip
NODE, JOB = "node", "job"
SCOPES = (NODE, JOB)


def _alerts(c: MixinConfig, scope: str) -> list[dict[str, Any]]:
    all_rules = _alert_rules(c)
    out = []
    for name, (_, _, summary) in ALERTS.items():
        if (name in NODE_ALERTS) != (scope == NODE):
            continue
        description = (
            _DESCRIPTIONS[name]
            .replace("{window}", c.event_window)
            .replace("{target}", f"{c.slo_target:.2%}")
            .replace("{upload_age}", c.incomplete_upload_max_age)
            .replace("{running}", RUNNING_BY_SCHEDULER if c.job_running else RUNNING_BY_SIGNS)
        )
        for rule in all_rules[name]:
            words = description
            for word, value in rule.words.items():
                words = words.replace(word, value)
            out.append(
                {
                    "alert": name,
                    "expr": rule.expr,
                    "for": c.for_of(name),
                    "labels": {"severity": rule.severity or c.severity_of(name), **rule.labels},
                    "annotations": {
                        "summary": summary,
                        "description": words,
                        "runbook_url": c.runbook(name),
                    },
                }
            )
    return out


def group_name(scope: str, kind: str) -> str:
    """``checkpoint-exporter.node.rules`` ... : the group's name says where it evaluates."""
    return f"checkpoint-exporter.{scope}.{kind}"


def rule_groups(config: MixinConfig | None = None, scope: str | None = None) -> dict[str, Any]:
    """A Prometheus rule file: the per-node groups, then the per-job groups (or one scope's).
    Each scope's recording rules come before its alerts, which read only their own scope's
    records: a per-node file evaluates where no per-job series exist."""
    c = config or MixinConfig()
    recording = {NODE: _node_recording(c), JOB: _job_recording(c)}
    groups: list[dict[str, Any]] = []
    daily = {NODE: _node_daily(c), JOB: _job_daily(c)}
    for each in SCOPES if scope is None else (scope,):
        groups.append(
            {"name": group_name(each, "daily"), "interval": DAILY_INTERVAL, "rules": daily[each]}
        )
        groups.append({"name": group_name(each, "rules"), "rules": recording[each]})
        groups.append({"name": group_name(each, "alerts"), "rules": _alerts(c, each)})
    return {"groups": groups}


def rule_files(config: MixinConfig | None = None) -> dict[str, dict[str, Any]]:
    """The rule files of the config's layout, by file name."""
    c = config or MixinConfig()
    if c.rule_layout == SINGLE:
        return {"checkpoint-exporter.rules.yaml": rule_groups(c)}
    return {f"checkpoint-exporter-{scope}.rules.yaml": rule_groups(c, scope) for scope in SCOPES}


def _prometheus_rule(name: str, labels: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/name": "checkpoint-exporter",
                "app.kubernetes.io/component": "alerting",
                **labels,
            },
        },
        "spec": spec,
    }


def prometheus_rules(config: MixinConfig | None = None) -> dict[str, dict[str, Any]]:
    """The same groups as prometheus-operator PrometheusRules, by file name, labelled for the
    Prometheus resource's ruleSelector (the mixin's rule_labels). The split layout's objects
    also carry `checkpoint-exporter/rules: node|job`, for a selector of one scope (a
    ThanosRuler's); the per-job one takes job_rule_labels, rule_labels by default."""
    c = config or MixinConfig()
    if c.rule_layout == SINGLE:
        return {
            "prometheusrule.yaml": _prometheus_rule(
                "checkpoint-exporter", c.rule_labels, rule_groups(c)
            )
        }
    return {
        "prometheusrule-node.yaml": _prometheus_rule(
            "checkpoint-exporter-node",
            {**c.rule_labels, "checkpoint-exporter/rules": NODE},
            rule_groups(c, NODE),
        ),
        "prometheusrule-job.yaml": _prometheus_rule(
            "checkpoint-exporter-job",
            {**c.job_rules_labels(), "checkpoint-exporter/rules": JOB},
            rule_groups(c, JOB),
        ),
    }


class _Literal(str):
    """Multi-line expressions as YAML block scalars, readable in review."""


def _literal(dumper: yaml.SafeDumper, value: _Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Literal, _literal)


def to_yaml(document: dict[str, Any]) -> str:
    def mark(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        if isinstance(value, str) and "\n" in value:
            return _Literal(value.rstrip("\n") + "\n")
        return value

    header = (
        "# Generated by checkpoint-exporter (make generate); edit the generator, not this file.\n"
    )
    return header + yaml.dump(mark(document), Dumper=_Dumper, sort_keys=False, width=100)
