"""Every PromQL expression the acceptance report runs, by name.

Instant queries are evaluated at the end of the range and look back over the whole range
(``increase(x[R])``, ``last_over_time(x[R])``), so a range in the past is judged as it was.
Per-job series are reduced with ``max by (training_job)``, as the shipped recording rules do:
on a shared filesystem several exporters see the same job, and the largest view is the job's.
"""

from __future__ import annotations

from dataclasses import dataclass

INSTANT, RANGE = "instant", "range"

# What the exporter's own network selection matches by default (config telemetry.network_devices):
# node_exporter's NIC series of those devices make the inventory of links.
NIC_DEVICES = "(eth|en|ib|mlx|bond).*"
TOTAL = 'phase="total"'


@dataclass(frozen=True)
class Query:
    name: str
    expr: str
    kind: str = INSTANT


def _metric(name: str, selector: str, extra: str = "") -> str:
    matchers = ",".join(part for part in (selector, extra) if part)
    return f"{name}{{{matchers}}}"


def build_queries(selector: str, window: str, step: str) -> dict[str, Query]:
    """``selector``: the matchers that find the exporters' series (as the mixin's, e.g.
    ``job="checkpoint-exporter"``); ``window``: the range as a PromQL duration; ``step``: the
    subquery resolution."""

    def m(name: str, extra: str = "") -> str:
        return _metric(name, selector, extra)

    def last(name: str, by: str = "training_job", extra: str = "") -> str:
        return f"max by ({by}) (last_over_time({m(name, extra)}[{window}]))"

    def inc(name: str, by: str = "training_job", extra: str = "") -> str:
        return f"max by ({by}) (increase({m(name, extra)}[{window}]))"

    duration = "checkpoint_save_duration_seconds"
    instant = {
        # known checkpoint
        "size_bytes": last("checkpoint_last_committed_size_bytes"),
        "files": last("checkpoint_last_committed_files"),
        "valid_min": f"min by (training_job) "
        f"(min_over_time({m('checkpoint_last_committed_valid')}[{window}]))",
        "validation_failures": inc("checkpoint_validation_failures_total", "training_job, reason"),
        "node_written_bytes": last(
            "checkpoint_last_save_disk_written_bytes", "training_job, instance"
        ),
        # single-job baseline: the four clocks
        "phase_mean": f"{inc(duration + '_sum', 'training_job, phase')}\n/\n"
        f"{inc(duration + '_count', 'training_job, phase')}",
        "phase_p50": "histogram_quantile(0.5, "
        f"{inc(duration + '_bucket', 'training_job, phase, le')})",
        "phase_max": f"max by (training_job, phase) "
        f"(max_over_time({m('checkpoint_last_save_phase_seconds')}[{window}]))",
        "restore_duration_max": f"max by (training_job) "
        f"(max_over_time({m('checkpoint_restore_last_duration_seconds')}[{window}]))",
        # concurrent burst
        "saves": inc(duration + "_count", extra=TOTAL),
        "within_deadline": inc("checkpoint_saves_within_deadline_total"),
        "deadline_misses": inc("checkpoint_deadline_misses_total"),
        "committed": inc("checkpoint_saves_committed_total"),
        "peak_concurrent_jobs": f"max_over_time((count(max by (training_job) "
        f"({m('checkpoint_saves_in_progress')}) > 0))[{window}:{step}])",
        # interrupted save
        "aborts": inc("checkpoint_saves_aborted_total"),
        "valid_generations_last": last("checkpoint_retained_valid_generations"),
        "last_committed_valid": f"min by (training_job) "
        f"(last_over_time({m('checkpoint_last_committed_valid')}[{window}]))",
        # recovery drill
        "restores": inc("checkpoint_restores_total"),
        "restore_failures": inc("checkpoint_restore_failures_total"),
        "restore_last_success": last("checkpoint_restore_last_success_timestamp_seconds"),
        # handover: the exported objectives, versions, inventory
        "interval": last("checkpoint_interval_seconds"),
        "deadline": last("checkpoint_deadline_seconds"),
        "retention_limit": last("checkpoint_retained_generations_limit"),
        "drill_max_age": last("checkpoint_restore_drill_max_age_seconds"),
        "mtbf": last("checkpoint_mtbf_seconds"),
        "build_info": last("checkpoint_exporter_build_info", "instance, version"),
        "filesystem_size": last("checkpoint_filesystem_size_bytes", "mountpoint, device, fstype"),
        "filesystem_avail": last("checkpoint_filesystem_avail_bytes", "mountpoint, device, fstype"),
        "job_filesystems": last("checkpoint_job_filesystem_info", "training_job, tier, mountpoint"),
        "nic_speed": f"max by (instance, device) (last_over_time("
        f'node_network_speed_bytes{{device=~"{NIC_DEVICES}"}}[{window}]))',
        # symptoms (issue 17 item 1), where the exporter has them
        "symptoms": inc("checkpoint_save_symptoms_total", "training_job, symptom"),
    }
    ranged = {
        "save_total_range": f"max by (training_job) "
        f"({m('checkpoint_last_save_phase_seconds', TOTAL)})",
        "backlog_range": f"max by (training_job) ({m('checkpoint_drain_backlog_bytes')})",
        "in_progress_range": f"max by (training_job) ({m('checkpoint_saves_in_progress')})",
        "retained_range": f"max by (training_job) ({m('checkpoint_retained_generations')})",
        "retained_bytes_range": f"max by (training_job) ({m('checkpoint_retained_bytes')})",
        "valid_generations_range": f"max by (training_job) "
        f"({m('checkpoint_retained_valid_generations')})",
        "exporter_rss_range": f"max by (instance) ({m('process_resident_memory_bytes')})",
    }
    queries = {name: Query(name, expr) for name, expr in instant.items()}
    queries.update({name: Query(name, expr, RANGE) for name, expr in ranged.items()})
    return queries
