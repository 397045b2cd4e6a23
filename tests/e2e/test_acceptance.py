"""`checkpoint-exporter acceptance`: the seed article's section 8 checklist judged from a real
Prometheus. The rows and the writers on canned query results; the client and the bad-input exits
against a loopback server; and once, end to end, against the demo's own Prometheus after a few
minutes of injected faults, with the HTML rendered by headless Chromium."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from checkpoint_exporter.acceptance import queries, rows
from checkpoint_exporter.acceptance.charts import to_svg
from checkpoint_exporter.acceptance.prom import (
    PrometheusClient,
    PrometheusError,
    Sample,
    Series,
    time_range,
)
from checkpoint_exporter.acceptance.report import (
    SCHEMA,
    Report,
    build_charts,
    to_dict,
    to_html,
    to_markdown,
)
from checkpoint_exporter.acceptance.rows import (
    FAIL,
    INFO,
    NOT_MEASURED,
    PASS,
    Context,
    Objectives,
)
from checkpoint_exporter.acceptance.run import UsageError, judge, parse_parameters, plan_objectives
from checkpoint_exporter.mixin.config import MixinConfig
from checkpoint_exporter.units import parse_duration
from tests.conftest import CLI, REPO, require_tool, run_cli, wait_for

T0 = 1_700_000_000.0
JOBS = ("alpha", "beta")
SELECTOR = 'job="checkpoint-exporter"'


def s(value: float, job: str = "alpha", **labels: str) -> Sample:
    return Sample(tuple(sorted({"training_job": job, **labels}.items())), value)


def series(points: list[float], job: str = "alpha", label: str = "training_job") -> Series:
    return Series(((label, job),), tuple((T0 + 10 * i, v) for i, v in enumerate(points)))


def ctx(**kw) -> Context:
    return Context(**{"jobs": JOBS, "start": T0, "end": T0 + 600, **kw})


# --- the rows on canned results ------------------------------------------------------------------


def test_known_checkpoint_pass_fail_and_not_measured() -> None:
    results = {
        "size_bytes": [s(980e9), s(700e9, "beta")],
        "files": [s(512), s(256, "beta")],
        "valid_min": [s(1), s(1, "beta")],
        "validation_failures": [s(0, reason="missing_shard"), s(0, "beta", reason="checksum")],
        "node_written_bytes": [s(500e9, instance="n1"), s(480e9, instance="n2")],
    }
    row = rows.known_checkpoint(results, ctx())
    assert row.verdict == PASS
    assert row.jobs["alpha"].values["files"] == 512
    assert row.jobs["alpha"].values["node_imbalance"] == pytest.approx(500 / 480)
    assert row.what_to_run  # no --parameters: says how to compare with the plan

    # Against the plan: 70e9 x 14 B = 980 GB; alpha matches, beta is 29% short (no master weights).
    planned = rows.known_checkpoint(results, ctx(parameters=70e9))
    assert planned.verdict == FAIL
    assert planned.jobs["alpha"].verdict == PASS
    assert planned.jobs["beta"].verdict == FAIL
    assert "-29%" in planned.jobs["beta"].reasons[0]
    assert planned.summary.startswith("beta:")
    # The seed's 10% serialisation allowance is within the 12% tolerance.
    allowance = {**results, "size_bytes": [s(1078e9), s(1078e9, "beta")]}
    assert rows.known_checkpoint(allowance, ctx(parameters=70e9)).verdict == PASS

    torn = {**results, "validation_failures": [s(2.04, reason="truncated_shard")]}
    row = rows.known_checkpoint(torn, ctx())
    assert row.verdict == FAIL and "truncated_shard x2" in row.jobs["alpha"].reasons[0]
    assert rows.known_checkpoint({}, ctx()).verdict == NOT_MEASURED


def test_single_job_baseline_records_the_four_clocks() -> None:
    phases = ("pause", "staging", "write", "commit", "total")
    means = dict(zip(phases, (0.4, 0.6, 20.0, 2.0, 23.0), strict=True))
    results = {
        "phase_mean": [s(v, phase=p) for p, v in means.items()],
        "phase_p50": [s(22.0, phase="total")],
        "phase_max": [s(31.0, phase="total")],
        "restore_duration_max": [s(45.0)],
        "deadline": [s(60.0), s(60.0, "beta")],
    }
    row = rows.single_job_baseline(results, ctx())
    assert row.jobs["alpha"].verdict == PASS
    assert row.jobs["alpha"].values["phases"]["pause"]["mean"] == 0.4
    assert "restore 45.00s" in row.jobs["alpha"].reasons
    assert row.jobs["beta"].verdict == NOT_MEASURED  # no save
    assert row.verdict == PASS
    slow = {**results, "phase_p50": [s(75.0, phase="total")]}
    assert rows.single_job_baseline(slow, ctx()).verdict == FAIL
    assert rows.single_job_baseline({}, ctx()).verdict == NOT_MEASURED


def test_concurrent_burst_judges_each_job_by_its_own_deadline() -> None:
    results = {
        "saves": [s(4), s(4, "beta")],
        "within_deadline": [s(4), s(3, "beta")],
        "deadline_misses": [s(0), s(1.02, "beta")],
        "phase_max": [s(50, phase="total"), s(75, "beta", phase="total")],
        "deadline": [s(60), s(60, "beta")],
        "peak_concurrent_jobs": [Sample((), 2.0)],
    }
    row = rows.concurrent_burst(results, ctx())
    assert row.verdict == FAIL
    assert row.jobs["alpha"].verdict == PASS
    assert row.jobs["beta"].verdict == FAIL
    assert row.jobs["beta"].reasons == ("1 of 4 saves missed the 60.00s deadline (worst 75.00s)",)
    assert "alpha" not in row.summary  # the failing job is named, not an aggregate

    clean = {**results, "deadline_misses": [], "phase_max": [s(50, phase="total")]}
    assert rows.concurrent_burst(clean, ctx()).verdict == PASS
    # Every save met the deadline, but never two jobs at once: no burst was tested.
    alone = {**clean, "peak_concurrent_jobs": [Sample((), 1.0)]}
    row = rows.concurrent_burst(alone, ctx())
    assert row.verdict == NOT_MEASURED and "synchronized" in row.what_to_run
    # The agreed deadline (config) is stricter than the exported one: 50 s > 45 s fails.
    agreed = ctx(objectives={"alpha": Objectives(deadline=45.0, source="plan.yaml")})
    assert rows.concurrent_burst(clean, agreed).jobs["alpha"].verdict == FAIL


def test_repeatability_finds_backlog_memory_and_retention_growth() -> None:
    draining = [0, 5e9, 0, 0, 5e9, 0, 0, 5e9, 0, 0, 5e9, 0]
    results = {
        "committed": [s(6), s(1, "beta")],
        "backlog_range": [series(draining)],
        "in_progress_range": [series([0, 1, 0] * 4)],
        "retained_range": [series([3] * 12)],
        "retention_limit": [s(3)],
        "exporter_rss_range": [series([50e6] * 12, "n1:25780", "instance")],
    }
    row = rows.repeatability(results, ctx())
    assert row.jobs["alpha"].verdict == PASS
    assert row.jobs["beta"].verdict == NOT_MEASURED  # one save: no trend
    assert row.verdict == PASS
    growing = {
        **results,
        "backlog_range": [
            series([0, 5e9, 5e9, 8e9, 1e10, 1e10, 2e10, 2e10, 2e10, 3e10, 3e10, 4e10])
        ],
    }
    row = rows.repeatability(growing, ctx())
    assert row.verdict == FAIL and "drain backlog never drains" in row.jobs["alpha"].reasons[0]
    leaking = {**results, "retained_range": [series([3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9])]}
    assert "over the limit of 3" in rows.repeatability(leaking, ctx()).jobs["alpha"].reasons[0]
    memory = {
        **results,
        "exporter_rss_range": [
            series([50e6] * 4 + [60e6] * 4 + [80e6] * 4, "n1:25780", "instance")
        ],
    }
    row = rows.repeatability(memory, ctx())
    assert row.verdict == FAIL and "exporter n1:25780 grew" in row.summary


def test_interrupted_save_needs_an_abort_and_a_kept_generation() -> None:
    results = {
        "aborts": [s(1.1), s(0, "beta")],
        "valid_generations_range": [series([0, 0, 1, 2, 3, 3, 2, 3]), series([1, 2], "beta")],
        "valid_generations_last": [s(3), s(2, "beta")],
        "last_committed_valid": [s(1), s(1, "beta")],
    }
    row = rows.interrupted_save(results, ctx())
    assert row.verdict == PASS  # the zeros before the first commit are not a loss
    assert row.jobs["alpha"].verdict == PASS and row.jobs["beta"].verdict == NOT_MEASURED
    lost = {**results, "valid_generations_range": [series([1, 2, 1, 0, 1])]}
    row = rows.interrupted_save(lost, ctx())
    assert row.verdict == FAIL and "last recoverable" in row.jobs["alpha"].reasons[0]
    none = {**results, "aborts": [s(0), s(0, "beta")]}
    row = rows.interrupted_save(none, ctx())
    assert row.verdict == NOT_MEASURED and "kill" in row.what_to_run


def test_recovery_drill_fails_on_a_failed_restore() -> None:
    results = {
        "restores": [s(3), s(2, "beta")],
        "restore_failures": [s(0), s(2, "beta")],
        "restore_duration_max": [s(12.5)],
    }
    row = rows.recovery_drill(results, ctx(config_file="/etc/ce.yaml"))
    assert row.verdict == FAIL and row.jobs["beta"].reasons == ("2 of 2 restores failed",)
    assert row.jobs["alpha"].verdict == PASS
    idle = rows.recovery_drill({}, ctx(config_file="/etc/ce.yaml"))
    assert idle.verdict == NOT_MEASURED
    assert "restore-drill --config.file /etc/ce.yaml" in idle.what_to_run


def test_handover_records_thresholds_and_compares_them_with_the_agreed_ones() -> None:
    results = {
        "interval": [s(900), s(900, "beta")],
        "deadline": [s(60), s(60, "beta")],
        "retention_limit": [s(3), s(3, "beta")],
        "drill_max_age": [s(604800), s(604800, "beta")],
        "build_info": [Sample((("instance", "n1"), ("version", "0.1.0")), 1)],
        "filesystem_size": [
            Sample((("device", "d"), ("fstype", "lustre"), ("mountpoint", "/c")), 2e13)
        ],
        "job_filesystems": [s(1, tier="durable", mountpoint="/c")],
        "nic_speed": [Sample((("device", "ib0"), ("instance", "n1")), 5e10)],
    }
    row = rows.handover(results, ctx(config_file="ce.yaml"))
    assert row.verdict == PASS
    assert row.jobs["alpha"].values["recovery_command"] == (
        "checkpoint-exporter restore-drill --config.file ce.yaml --job alpha"
    )
    assert row.values["versions"] == {"0.1.0": ["n1"]}
    assert row.values["links"][0]["device"] == "ib0"
    agreed = {"beta": Objectives(deadline=45.0, source="plan.yaml")}
    row = rows.handover(results, ctx(objectives=agreed))
    assert row.verdict == FAIL and "deadline 60" in row.jobs["beta"].reasons[0]
    assert rows.handover({**results, "build_info": []}, ctx()).verdict == FAIL


def test_symptoms_are_listed_with_their_runbooks_and_never_decide_the_exit_status() -> None:
    """A multi-hour run shows some symptom; it is section 7's diagnosis, not a section 8 item."""
    absent = rows.symptoms({}, ctx())
    assert absent.verdict == INFO and "no checkpoint_save_symptoms_total" in absent.summary
    zero = {"symptoms": [s(0, symptom="straggler"), s(0, "beta", symptom="straggler")]}
    row = rows.symptoms(zero, ctx())
    assert row.verdict == INFO and row.summary == "no save in the range showed a symptom"
    seen = {
        "symptoms": [
            s(2.04, symptom="straggler"),
            s(1, symptom="commit_bound"),
            s(0, "beta", symptom="straggler"),
        ]
    }
    row = rows.symptoms(seen, ctx())
    assert row.verdict == INFO
    assert row.jobs["alpha"].verdict == row.jobs["beta"].verdict == INFO
    assert row.jobs["alpha"].values["symptoms"] == {"commit_bound": 1, "straggler": 2}
    assert row.jobs["alpha"].values["runbooks"]["straggler"] == "/runbooks#symptom-straggler"
    assert row.jobs["alpha"].reasons == (
        "commit_bound x1 (runbook /runbooks#symptom-commit_bound)",
        "straggler x2 (runbook /runbooks#symptom-straggler)",
    )
    assert row.summary == "alpha: commit_bound x1, straggler x2"
    # Every judged row passed: the symptoms leave the gate open.
    passed = rows.recovery_drill({"restores": [s(1)]}, ctx())
    report = Report(
        prometheus_url="http://127.0.0.1:9090",
        selector=SELECTOR,
        start=T0,
        end=T0 + 600,
        generated=T0 + 601,
        version="0.1.0",
        jobs=JOBS,
        rows=(passed, row),
        charts=(),
    )
    assert (report.verdict, report.exit_status) == (PASS, 0)
    assert "| Bottleneck symptoms (informational) | INFO | alpha: commit_bound x1" in to_markdown(
        report
    )
    assert '<span class="verdict info">INFO</span>' in to_html(report)


# --- the queries, evaluated by promtool over a day of synthetic series ----------------------------

SCRAPE = 15  # seconds between the synthetic samples
DAY_START, DAY_END = 3705.0, 3705.0 + 86400  # a day's range: the range step is 360 s


def _values(points: list[float | None]) -> str:
    """promtool's input notation: runs of one value as ``vxN`` (N + 1 samples), ``_`` missing."""
    out: list[str] = []
    i = 0
    while i < len(points):
        j = i
        while j + 1 < len(points) and points[j + 1] == points[i]:
            j += 1
        value = "_" if points[i] is None else f"{points[i]:g}"
        out += [value] * (j - i + 1) if value == "_" else [f"{value}x{j - i}" if j > i else value]
        i = j + 1
    return " ".join(out)


def _steps(*changes: tuple[float, float | None], end: float = DAY_END) -> list[float | None]:
    """A series sampled every SCRAPE seconds from 0 to ``end``: each (time, value) holds from
    that time on; None: no sample (the series does not exist yet)."""
    out: list[float | None] = []
    for i in range(int(end // SCRAPE) + 1):
        t, value = i * SCRAPE, None
        for since, v in changes:
            if t >= since:
                value = v
        out.append(value)
    return out


def promtool_eval(tmp_path: Path, series: dict[str, list], checks: list[tuple]) -> None:
    """Evaluates each (expr, eval_time, {labels: value}) over ``series`` with promtool."""
    test = {
        "interval": f"{SCRAPE}s",
        "input_series": [{"series": name, "values": _values(v)} for name, v in series.items()],
        "promql_expr_test": [
            {
                "expr": expr,
                "eval_time": f"{at:.0f}s",
                "exp_samples": [{"labels": labels, "value": v} for labels, v in want.items()],
            }
            for expr, at, want in checks
        ],
    }
    path = tmp_path / "acceptance-queries.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [], "tests": [test]}))
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


def _m(name: str, job: str, instance: str = "n1", **labels: str) -> str:
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return f'{name}{{job="checkpoint-exporter",instance="{instance}",training_job="{job}"{extra}}}'


@pytest.mark.prometheus
def test_newest_save_and_restore_gauges_count_only_events_in_the_range(tmp_path: Path) -> None:
    """A 90 s save (of a torn generation) committed a minute before --from, and a 500 s restore
    two minutes before, are not the range's: the gauges still show them after --from, until the
    next save or restore. The burst row failed on that save with no miss counted in the range."""
    start = DAY_START
    q = queries.build_queries(SELECTOR, start, DAY_END, 360.0)
    phase, committed = "checkpoint_last_save_phase_seconds", "checkpoint_saves_committed_total"
    duration, restores = "checkpoint_restore_last_duration_seconds", "checkpoint_restores_total"
    valid = "checkpoint_last_committed_valid"
    series = {
        # late: the slow save at start - 60 s, a 20 s one 15 minutes into the range.
        _m(phase, "late", phase="total"): _steps((0, 30), (start - 60, 90), (start + 900, 20)),
        _m(committed, "late"): _steps((0, 4), (start - 60, 5), (start + 900, 6)),
        # A node exports its ranks' phases; the commits are counted where the tree is read.
        _m(phase, "late", "n2", phase="pause"): _steps((0, 1), (start - 70, 9), (start + 890, 2)),
        _m(valid, "late"): _steps((0, 1), (start - 60, 0), (start + 900, 1)),
        _m(valid, "fresh"): _steps((start + 600, 0)),
        _m(duration, "late"): _steps((0, 10), (start - 120, 500), (start + 1800, 40)),
        _m(restores, "late"): _steps((0, 0), (start - 120, 1), (start + 1800, 2)),
        # fresh: its exporter started in the range, so its series begin there.
        _m(phase, "fresh", phase="total"): _steps((start + 600, 30)),
        _m(committed, "fresh"): _steps((start + 600, 1)),
        # quiet: nothing after --from; its last save and restore were before it.
        _m(phase, "quiet", phase="total"): _steps((0, 75)),
        _m(committed, "quiet"): _steps((0, 3)),
        _m(duration, "quiet"): _steps((0, 300)),
        _m(restores, "quiet"): _steps((0, 1)),
        # busy: commits every 4 minutes, faster than the 6-minute step; the slowest in range.
        _m(phase, "busy", phase="total"): _steps(
            (0, 10), *((start + 240 * k, 50 if k == 100 else 10 + k % 3) for k in range(1, 300))
        ),
        _m(committed, "busy"): _steps((0, 0), *((start + 240 * k, k) for k in range(1, 300))),
    }
    promtool_eval(
        tmp_path,
        series,
        [
            (
                q["phase_max"].expr,
                DAY_END,
                {
                    '{phase="total",training_job="late"}': 20,
                    '{phase="pause",training_job="late"}': 2,
                    '{phase="total",training_job="fresh"}': 30,
                    '{phase="total",training_job="busy"}': 50,
                },
            ),
            (q["restore_duration_max"].expr, DAY_END, {'{training_job="late"}': 40}),
            # late's torn generation was before the range; fresh's in it.
            (
                q["valid_min"].expr,
                DAY_END,
                {'{training_job="late"}': 1, '{training_job="fresh"}': 0},
            ),
        ],
    )


@pytest.mark.prometheus
def test_peak_concurrency_sees_a_one_minute_burst_in_six_hours(tmp_path: Path) -> None:
    """Two jobs save together for one minute, between two points of the range's 90 s step (a
    day's is 6 minutes; promtool's sample limit keeps this range shorter)."""
    start, end = DAY_START, DAY_START + 6 * 3600
    span = time_range(f"{start}", f"{end}", None, end)
    assert span.step == 90
    q = queries.build_queries(SELECTOR, start, end, span.step)
    burst = start + 10_005  # 60 s from the step point before: none falls inside it
    flight = "checkpoint_saves_in_progress"
    series = {
        _m(flight, job): _steps((0, 0), (burst, 1), (burst + 60, 0), end=end)
        for job in ("alpha", "beta")
    }
    series[_m(flight, "gamma")] = _steps((0, 0), (burst + 1200, 1), (burst + 1260, 0), end=end)
    promtool_eval(tmp_path, series, [(q["peak_concurrent_jobs"].expr, end, {"{}": 2})])


@pytest.mark.prometheus
def test_valid_generations_read_0_only_after_the_alerts_for(tmp_path: Path) -> None:
    """An exporter restart reads 0 valid generations for a minute while it validates: not a lost
    generation. Ten minutes of 0 is one, as CheckpointNoRecoverableGeneration pages on."""
    start = DAY_START
    q = queries.build_queries(SELECTOR, start, DAY_END, 360.0)
    valid = "checkpoint_retained_valid_generations"
    dip = start + 7200
    series = {
        _m(valid, "restarted"): _steps((0, 2), (dip, 0), (dip + 60, 2)),
        _m(valid, "lost"): _steps((0, 2), (dip, 0), (dip + 600, 1)),
    }
    expr = q["valid_generations_range"].expr
    checks = [
        (expr, dip + 45, {'{training_job="restarted"}': 2, '{training_job="lost"}': 2}),
        (expr, dip + 585, {'{training_job="restarted"}': 2, '{training_job="lost"}': 0}),
    ]
    promtool_eval(tmp_path, series, checks)


def test_the_lost_generation_wait_is_the_paging_alerts_for() -> None:
    wait = MixinConfig().for_of("CheckpointNoRecoverableGeneration")
    assert parse_duration(wait) == queries.NO_RECOVERABLE_FOR


# --- the writers ---------------------------------------------------------------------------------


def canned_report() -> Report:
    results = {
        "size_bytes": [s(9e6), s(4e6, "beta")],
        "deadline_misses": [s(1, "beta")],
        "saves": [s(3), s(3, "beta")],
        "deadline": [s(5), s(4, "beta")],
        "restores": [s(2), s(1, "beta")],
        "restore_failures": [s(1, "beta")],
        "save_total_range": [series([1, 1, 6, 1]), series([2, 2, 2], "beta")],
        "backlog_range": [series([0, 9e6, 0])],
        "retained_range": [series([1, 2, 3]), series([1, 2, 3], "beta")],
        "retention_limit": [s(3), s(3, "beta")],
        "build_info": [Sample((("instance", "n1"), ("version", "0.1.0")), 1)],
    }
    context = ctx()
    return Report(
        prometheus_url="http://127.0.0.1:9090",
        selector='job="checkpoint-exporter"',
        start=T0,
        end=T0 + 600,
        generated=T0 + 601,
        version="0.1.0",
        jobs=JOBS,
        rows=judge(results, context, 'job="checkpoint-exporter"'),
        charts=build_charts(results, context),
    )


def test_json_report_schema() -> None:
    report = canned_report()
    document = json.loads(json.dumps(to_dict(report)))
    assert document["schema"] == SCHEMA
    assert document["verdict"] == FAIL and document["exit_status"] == 1
    assert document["from"] == "2023-11-14T22:13:20+00:00"
    keys = [row["key"] for row in document["rows"]]
    assert keys == [
        "known_checkpoint",
        "single_job_baseline",
        "concurrent_burst",
        "mixed_workload",
        "repeatability",
        "degraded_path",
        "interrupted_save",
        "recovery_drill",
        "handover",
        "symptoms",
    ]
    for row in document["rows"]:
        assert set(row) == {
            "key",
            "title",
            "checklist",
            "verdict",
            "summary",
            "what_to_run",
            "queries",
            "values",
            "jobs",
        }
        assert row["verdict"] in (PASS, FAIL, NOT_MEASURED, INFO)
        assert all(set(q) == {"name", "promql"} for q in row["queries"])
    burst = document["rows"][2]
    assert burst["jobs"]["beta"]["verdict"] == FAIL
    assert any("checkpoint_deadline_misses_total" in q["promql"] for q in burst["queries"])
    assert document["rows"][3]["what_to_run"]  # mixed workload: what to run
    charts = {chart["key"]: chart for chart in document["charts"]}
    assert set(charts) == {
        "save_duration_alpha",
        "save_duration_beta",
        "drain_backlog",
        "retained_generations",
        "restore_results",
        "exporter_memory",
    }
    assert charts["save_duration_beta"]["thresholds"] == [{"name": "deadline", "value": 4.0}]
    assert charts["restore_results"]["bars"][1] == {
        "category": "beta",
        "values": {"succeeded": 0.0, "failed": 1.0},
    }


def test_markdown_report_has_a_table_row_per_checklist_item() -> None:
    report = canned_report()
    text = to_markdown(report)
    assert text.startswith("# Checkpoint storage acceptance: FAIL\n")
    table = [line for line in text.splitlines() if line.startswith("| ") and " | " in line]
    assert "| Concurrent burst | FAIL | beta: 1 of 3 saves missed the 4.00s deadline" in text
    assert "| Degraded path | NOT MEASURED |" in text
    for row in report.rows:
        assert any(line.startswith(f"| {row.title} |") for line in table)
    assert "```promql\nmax by (training_job) (increase(checkpoint_deadline_misses_total" in text


def test_html_report_is_self_contained_with_one_svg_per_chart() -> None:
    report = canned_report()
    html = to_html(report)
    assert html.count("<svg") == len(report.charts) == 6
    for chart in report.charts:
        assert f'data-chart="{chart.key}"' in html
    # No asset from anywhere: no script, no stylesheet link, no remote src/href/url().
    assert "<script" not in html and "<link" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", html)
    assert "<style>" in html and 'class="threshold"' in html  # inline CSS, deadline lines drawn
    assert html.count('class="bar bar-failed"') == 1  # beta's failed restore


def test_an_empty_chart_says_so() -> None:
    chart = build_charts({}, ctx())[0]
    assert "no data in the range" in to_svg(chart)


# --- the client, the arguments and the exits -----------------------------------------------------


class FakePrometheus:
    """A loopback server answering the query API from a function of (path, params)."""

    def __init__(self, answer) -> None:  # type: ignore[no-untyped-def]
        self.seen: list[dict[str, str]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                params = dict(urllib.parse.parse_qsl(url.query))
                owner.seen.append(params)
                status, body = answer(url.path, params)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakePrometheus:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def _ok(result_type: str, result: list) -> dict:
    return {"status": "success", "data": {"resultType": result_type, "result": result}}


def test_client_reads_vectors_and_matrices_and_names_the_url_on_errors() -> None:
    def answer(path: str, params: dict[str, str]):  # type: ignore[no-untyped-def]
        if params["query"] == "bad(":
            return 400, {"status": "error", "error": "parse error: unclosed left parenthesis"}
        if path.endswith("query_range"):
            return 200, _ok(
                "matrix",
                [{"metric": {"training_job": "a"}, "values": [[T0, "1"], [T0 + 5, "NaN"]]}],
            )
        return 200, _ok("vector", [{"metric": {"training_job": "a"}, "value": [T0, "2.5"]}])

    with FakePrometheus(answer) as fake:
        client = PrometheusClient(fake.url + "/")
        assert client.query("up", T0) == [Sample((("training_job", "a"),), 2.5)]
        assert fake.seen[-1]["time"] == f"{T0:.3f}"
        [matrix] = client.query_range("up", T0, T0 + 5, 5)
        assert matrix.points[0] == (T0, 1.0) and matrix.label("training_job") == "a"
        with pytest.raises(PrometheusError, match=re.escape(fake.url) + ".*unclosed left"):
            client.query("bad(", T0)
    with pytest.raises(PrometheusError, match=f"cannot reach Prometheus at {re.escape(fake.url)}"):
        client.query("up", T0)


def test_time_range_arguments() -> None:
    now = T0
    assert time_range(None, None, None, now).start == now - 3600
    assert time_range(None, None, "10m", now).start == now - 600
    span = time_range("2023-11-14T22:00:00Z", None, "5m", now)
    assert (span.start, span.end) == (T0 - 800, T0 - 500)
    assert time_range("now-15m", "now-5m", None, now).seconds == 600
    for bad, match in (
        (("now", "now-1h", None), "empty"),
        (("yesterday", None, None), "--from: 'yesterday' is not a time"),
        ((None, None, "-5m"), "--range"),
        ((None, None, "0s"), "longer than zero"),
        (("now-1h", "now", "10m"), "at most two"),
    ):
        with pytest.raises(ValueError, match=match):
            time_range(*bad, now)


def test_plan_objectives_read_what_plan_emits(tmp_path: Path) -> None:
    emitted = run_cli("plan", "--example", "--emit-objectives")
    assert emitted.returncode == 0, emitted.stderr
    path = tmp_path / "objectives.yaml"
    path.write_text(emitted.stdout)
    objectives = plan_objectives(str(path))
    assert (objectives.interval, objectives.deadline) == (900.0, 60.0)
    assert objectives.retained_generations == 3.0
    assert objectives.restore_drill_max_age is None  # not in the plan's block: not compared


def test_parameters_read_as_plan_reads_them() -> None:
    assert parse_parameters("70B") == 70e9
    assert parse_parameters("70e9") == parse_parameters("70_000_000_000") == 70e9
    assert parse_parameters(None) is None
    for bad in ("many", "-5", "0"):
        with pytest.raises(UsageError, match="--parameters"):
            parse_parameters(bad)


def test_unreachable_prometheus_exits_2_naming_the_url(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    result = run_cli("acceptance", "--prometheus.url", url, "--output", str(tmp_path / "out"))
    assert result.returncode == 2
    assert f"cannot reach Prometheus at {url}" in result.stderr
    assert not (tmp_path / "out").exists()


def test_bad_time_range_and_bad_objectives_exit_2(tmp_path: Path) -> None:
    base = ("acceptance", "--prometheus.url", "http://127.0.0.1:1", "--output", str(tmp_path))
    result = run_cli(*base, "--from", "now", "--to", "now-1h")
    assert result.returncode == 2 and "the time range is empty" in result.stderr
    result = run_cli(*base, "--range", "soon")
    assert result.returncode == 2 and "--range=soon" in result.stderr
    (tmp_path / "objectives.yaml").write_text("defaults: {deadline: fast}\n")
    result = run_cli(*base, "--objectives", str(tmp_path / "objectives.yaml"))
    assert result.returncode == 2 and "defaults.deadline" in result.stderr


def test_no_matching_series_is_an_input_error_not_a_pass(tmp_path: Path) -> None:
    """A wrong selector or range must never let a rollout gate pass on no data."""
    with FakePrometheus(lambda path, params: (200, _ok("vector", []))) as fake:
        result = run_cli(
            "acceptance", "--prometheus.url", fake.url, "--range", "10m", "--output", str(tmp_path)
        )
    assert result.returncode == 2
    assert f'no checkpoint-exporter series match {{job="checkpoint-exporter"}} at {fake.url}' in (
        result.stderr
    )


# --- end to end: the demo's Prometheus after a few minutes of injected faults ---------------------


def _free_port_block() -> int:
    from tests.e2e.test_demo import free_port_block

    return free_port_block()


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[tuple[str, Path, float]]:
    port = _free_port_block()
    workdir = tmp_path / "demo"
    started = time.time()
    process = subprocess.Popen(
        [*CLI, "demo", "--workdir", str(workdir), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    prometheus = f"http://127.0.0.1:{port + 10}"
    try:

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{prometheus}/-/ready", timeout=2) as reply:
                    return reply.status == 200
            except OSError:
                return process.poll() is not None  # stop waiting: it exited

        wait_for(ready, timeout=90, interval=1)
        log = workdir / "prometheus.log"
        assert process.poll() is None, "the demo exited"
        assert ready(), log.read_text()[-3000:] if log.exists() else "no prometheus.log"
        yield prometheus, workdir, started
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output[-3000:]


DEMO_SECONDS = 165  # two to three faults of each kind (one save in three, intervals 20-30 s)


@pytest.mark.chromium
@pytest.mark.prometheus
@pytest.mark.torch
@pytest.mark.daemon
@pytest.mark.timeout(480)
def test_acceptance_against_the_demo(demo: tuple[str, Path, float], tmp_path: Path) -> None:
    from tests.e2e.test_demo import chromium

    prometheus, workdir, started = demo
    time.sleep(max(0.0, started + DEMO_SECONDS - time.time()))
    out = tmp_path / "report"
    result = subprocess.run(
        [
            *CLI,
            "acceptance",
            "--prometheus.url",
            prometheus,
            "--from",
            f"{started:.0f}",
            "--to",
            "now",
            "--config.file",
            str(workdir / "config.yaml"),
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    document = json.loads((out / "acceptance.json").read_text())
    verdicts = {row["key"]: row["verdict"] for row in document["rows"]}
    jobs = {row["key"]: row["jobs"] for row in document["rows"]}
    detail = json.dumps(document["rows"], indent=1)[:6000]
    # The four jobs on disk, and the one saving into the embedded S3 server (moto is here).
    assert document["jobs"] == ["llama70b-a", "llama70b-b", "llama70b-c", "llama70b-d",
                                "llama70b-s3"]  # fmt: skip
    # The demo's faults: b's saves miss the deadline, d's torn generation fails validation and
    # its restore drills, c's save is aborted and leaves a committed, valid generation.
    assert verdicts["concurrent_burst"] == FAIL, detail
    assert jobs["concurrent_burst"]["llama70b-b"]["verdict"] == FAIL
    assert jobs["concurrent_burst"]["llama70b-c"]["verdict"] == PASS
    assert verdicts["recovery_drill"] == FAIL
    assert jobs["recovery_drill"]["llama70b-d"]["verdict"] == FAIL
    assert jobs["recovery_drill"]["llama70b-a"]["verdict"] == PASS
    assert verdicts["known_checkpoint"] == FAIL
    assert jobs["known_checkpoint"]["llama70b-d"]["verdict"] == FAIL
    assert "truncated_shard" in jobs["known_checkpoint"]["llama70b-d"]["reasons"][0]
    assert verdicts["interrupted_save"] == PASS, detail
    assert jobs["interrupted_save"]["llama70b-c"]["verdict"] == PASS
    # b's saves were slow, never interrupted: the row does not pass it on a slow commit.
    assert jobs["interrupted_save"]["llama70b-b"]["verdict"] == NOT_MEASURED, detail
    assert verdicts["single_job_baseline"] == PASS, detail
    assert verdicts["repeatability"] == PASS, detail
    assert verdicts["handover"] == PASS, detail
    assert verdicts["mixed_workload"] == verdicts["degraded_path"] == NOT_MEASURED
    # The symptoms the demo's faults imply, listed and never judged: the exit status is the
    # failing checklist rows'.
    assert verdicts["symptoms"] == INFO, detail
    implied = {
        "llama70b-a": "straggler",
        "llama70b-b": "commit_bound",
        "llama70b-c": "staging_bound",
        "llama70b-d": "unrestorable",
    }
    for job, symptom in implied.items():
        listed = jobs["symptoms"][job]["values"]
        assert listed["symptoms"].get(symptom, 0) >= 1, (job, jobs["symptoms"])
        assert listed["runbooks"][symptom] == f"/runbooks#symptom-{symptom}"
    # One line per row on stdout, and the PromQL behind each measured row.
    for row in document["rows"]:
        assert any(line.endswith(row["summary"]) for line in result.stdout.splitlines())
        assert row["queries"] or row["verdict"] == NOT_MEASURED
    # Headless Chromium renders the report with every chart.
    dom = chromium((out / "acceptance.html").as_uri(), "--dump-dom").stdout
    # A save-duration chart per job (five), and four across them.
    assert len(re.findall(r'<svg[^>]*class="chart"', dom)) == len(document["charts"]) == 9
    for chart in document["charts"]:
        assert f'data-chart="{chart["key"]}"' in dom
        if chart["key"].startswith("save_duration_"):
            assert chart["series"][0]["points"], chart["key"]  # drawn from real data
    assert 'class="bar bar-failed"' in dom  # d's failed drills
    (REPO / "test-artifacts").mkdir(exist_ok=True)
    chromium(
        (out / "acceptance.html").as_uri(),
        "--window-size=1200,3000",
        f"--screenshot={REPO / 'test-artifacts' / 'acceptance.png'}",
    )
