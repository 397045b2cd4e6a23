"""The report: charts from the range queries, and the JSON, Markdown and HTML writers.

The HTML is one self-contained file: inline CSS and inline SVG, no script, no external asset,
so it can be attached to a ticket or a purchase record and still read in ten years.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from html import escape

from checkpoint_exporter.acceptance.charts import BAR, Bar, Chart, Threshold, line_chart, to_svg
from checkpoint_exporter.acceptance.prom import iso
from checkpoint_exporter.acceptance.rows import (
    FAIL,
    INFO,
    NOT_MEASURED,
    PASS,
    Context,
    Results,
    Row,
    count,
    deadline_of,
    overall,
    per_job,
    series_by,
)

SCHEMA = "checkpoint-exporter/acceptance/v1"


@dataclass(frozen=True)
class Report:
    prometheus_url: str
    selector: str
    start: float
    end: float
    generated: float
    version: str
    jobs: tuple[str, ...]
    rows: tuple[Row, ...]
    charts: tuple[Chart, ...]
    objectives_from: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def verdict(self) -> str:
        return overall(self.rows)

    @property
    def exit_status(self) -> int:
        """1 when a measured row failed: what a rollout gate reads (an informational row never
        changes it)."""
        return 1 if self.verdict == FAIL else 0


# --- charts -------------------------------------------------------------------------------------


def build_charts(results: Results, ctx: Context) -> tuple[Chart, ...]:
    """Save durations against the deadline per job, drain backlog, retained generations,
    restore results and the exporter's memory, from the range queries."""

    def only(series: dict[str, list]) -> dict[str, list]:
        return {job: points for job, points in series.items() if job in ctx.jobs}

    charts: list[Chart] = []
    domain = (ctx.start, ctx.end)
    durations = series_by(results, "save_total_range")
    for job in ctx.jobs:
        deadline, source = deadline_of(ctx, results, job)
        charts.append(
            line_chart(
                f"save_duration_{job}",
                f"{job}: save duration (start to durable commit) vs deadline",
                "seconds",
                {job: durations.get(job, [])},
                [Threshold("deadline", deadline)] if deadline is not None else [],
                note=f"deadline from {source}",
                domain=domain,
            )
        )
    charts.append(
        line_chart(
            "drain_backlog",
            "Drain backlog: staged, not yet durable",
            "bytes",
            only(series_by(results, "backlog_range")),
            domain=domain,
        )
    )
    limits = per_job(results, "retention_limit")
    distinct = {v for job, v in limits.items() if job in ctx.jobs}
    charts.append(
        line_chart(
            "retained_generations",
            "Retained committed generations",
            "count",
            only(series_by(results, "retained_range")),
            [Threshold("limit", distinct.pop())] if len(distinct) == 1 else [],
            note="" if len(distinct) <= 1 else "limits differ per job: see the handover row",
            domain=domain,
        )
    )
    restores, failures = per_job(results, "restores"), per_job(results, "restore_failures")
    bars = tuple(
        Bar(
            job,
            (
                ("succeeded", float(max(0, count(restores.get(job)) - count(failures.get(job))))),
                ("failed", float(count(failures.get(job)))),
            ),
        )
        for job in ctx.jobs
    )
    charts.append(Chart("restore_results", "Restores in the range", "count", BAR, bars=bars))
    charts.append(
        line_chart(
            "exporter_memory",
            "Exporter resident memory",
            "bytes",
            series_by(results, "exporter_rss_range", "instance"),
            domain=domain,
        )
    )
    return tuple(charts)


# --- JSON ---------------------------------------------------------------------------------------


def _clean(value: object) -> object:
    """JSON has no NaN or infinity: those become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def row_dict(row: Row) -> dict[str, object]:
    return {
        "key": row.key,
        "title": row.title,
        "checklist": row.checklist,
        "verdict": row.verdict,
        "summary": row.summary,
        "what_to_run": row.what_to_run,
        "queries": [{"name": name, "promql": expr} for name, expr in row.queries],
        "values": row.values,
        "jobs": {
            job: {"verdict": v.verdict, "reasons": list(v.reasons), "values": v.values}
            for job, v in row.jobs.items()
        },
    }


def to_dict(report: Report) -> dict[str, object]:
    return _clean(
        {
            "schema": SCHEMA,
            "verdict": report.verdict,
            "exit_status": report.exit_status,
            "prometheus_url": report.prometheus_url,
            "selector": report.selector,
            "from": iso(report.start),
            "to": iso(report.end),
            "range_seconds": round(report.end - report.start),
            "generated": iso(report.generated),
            "version": report.version,
            "jobs": list(report.jobs),
            "objectives_from": list(report.objectives_from),
            "notes": list(report.notes),
            "rows": [row_dict(row) for row in report.rows],
            "charts": [chart.to_dict() for chart in report.charts],
        }
    )  # type: ignore[return-value]


def to_json(report: Report) -> str:
    return json.dumps(to_dict(report), indent=2, sort_keys=False) + "\n"


# --- Markdown -----------------------------------------------------------------------------------

LABEL = {PASS: "PASS", FAIL: "FAIL", NOT_MEASURED: "NOT MEASURED", INFO: "INFO"}


# Everything Markdown could read as syntax. Label values (job names, instances, reasons) come
# from Prometheus and may hold anything: escaped, they are text, never a link, an image, a tag,
# a table cell or a heading of their own. An underscore inside a word is left as it is (it
# cannot start emphasis there, and commit_bound stays readable in the file).
_MARKDOWN = re.compile(r"[\\`*\[\]<>|~&!#]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")


def _md(text: object) -> str:
    """``text`` as Markdown text: syntax escaped, line breaks as spaces."""
    return _MARKDOWN.sub(lambda m: "\\" + m.group(), " ".join(str(text).splitlines()))


def _code(text: str) -> str:
    """``text`` as a code span: fenced by more backticks than any run of them inside."""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{' '.join(text.splitlines())}{pad}{fence}"


def _fence(text: str) -> str:
    """A fence for a code block holding ``text``."""
    return "`" * max(3, max((len(run) for run in re.findall("`+", text)), default=0) + 1)


def _value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else "—"
    if value is None:
        return "—"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)


def summary_lines(report: Report) -> list[str]:
    """One line per row, as the verb prints them."""
    width = max(len(row.title) for row in report.rows)
    return [f"{LABEL[row.verdict]:<12} {row.title:<{width}}  {row.summary}" for row in report.rows]


def to_markdown(report: Report) -> str:
    out = [
        f"# Checkpoint storage acceptance: {LABEL[report.verdict]}",
        "",
        f"- Prometheus: {_code(report.prometheus_url)}, selector {_code(f'{{{report.selector}}}')}",
        f"- Range: {iso(report.start)} to {iso(report.end)} ({round(report.end - report.start)} s)",
        f"- Jobs: {_md(', '.join(report.jobs) or 'none')}",
        f"- Objectives from: {_md(', '.join(report.objectives_from) or 'the exported series')}",
        f"- Generated {iso(report.generated)} by checkpoint-exporter {_md(report.version)}; "
        f"exit status {report.exit_status}",
        *(f"- Note: {_md(note)}" for note in report.notes),
        "",
        "| Checklist item | Verdict | Summary |",
        "|---|---|---|",
    ]
    out += [
        f"| {_md(row.title)} | {LABEL[row.verdict]} | {_md(row.summary)} |" for row in report.rows
    ]
    for row in report.rows:
        out += [
            "",
            f"## {_md(row.title)}: {LABEL[row.verdict]}",
            "",
            f"_{_md(row.checklist)}_",
            "",
            _md(row.summary),
        ]
        if row.what_to_run:
            out += ["", f"What to run: {_md(row.what_to_run)}"]
        if row.jobs:
            out += ["", "| Job | Verdict | Detail |", "|---|---|---|"]
            out += [
                f"| {_md(job)} | {LABEL[v.verdict]} | {_md('; '.join(v.reasons))} |"
                for job, v in row.jobs.items()
            ]
        values = [(job, v.values) for job, v in row.jobs.items() if v.values]
        if values or row.values:
            out += ["", "Values:", ""]
            out += [f"- {_md(job)}: {_md(_value(dict(v)))}" for job, v in values]
            if row.values:
                out.append(f"- row: {_md(_value(dict(row.values)))}")
        for name, expr in row.queries:
            fence = _fence(expr)
            out += ["", f"{_code(name)}:", "", f"{fence}promql", expr, fence]
    out += ["", "## Charts", ""]
    out += [
        f"- {_md(chart.title)} ({'no data' if chart.empty else chart.kind})"
        for chart in report.charts
    ]
    return "\n".join(out) + "\n"


# --- HTML ---------------------------------------------------------------------------------------

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;
color:#222;padding:0 16px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;width:100%;margin:8px 0}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f5f5f5}
.verdict{font-weight:600;padding:1px 6px;border-radius:3px;white-space:nowrap}
.pass{background:#dff3e0;color:#1b5e20}.fail{background:#fde0e0;color:#b71c1c}
.not-measured{background:#eee;color:#555}.info{background:#e3f2fd;color:#0d47a1}
pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px}
details{margin:6px 0}summary{cursor:pointer;color:#444}
.meta{color:#555}.what{background:#fff8e1;padding:6px 8px;border-left:3px solid #f9a825}
svg.chart{display:block;margin:12px 0;max-width:100%;height:auto}
svg .title{font-weight:600;font-size:13px}svg .tick,svg .legend{font-size:11px;fill:#444}
svg .plot{fill:#fcfcfc;stroke:#ccc}svg .grid{stroke:#eee}
svg .series{stroke-width:1.8}svg .threshold{stroke-dasharray:6 4;stroke-width:1.5}
svg .empty{fill:#888;font-size:13px}
"""


def _badge(verdict: str) -> str:
    css = verdict.replace(" ", "-")
    return f'<span class="verdict {css}">{escape(LABEL[verdict])}</span>'


def to_html(report: Report) -> str:
    e = escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Checkpoint storage acceptance: {e(LABEL[report.verdict])}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>Checkpoint storage acceptance: {_badge(report.verdict)}</h1>",
        '<p class="meta">',
        f"Prometheus <code>{e(report.prometheus_url)}</code>, selector "
        f"<code>{{{e(report.selector)}}}</code><br>",
        f"Range {e(iso(report.start))} to {e(iso(report.end))} "
        f"({round(report.end - report.start)} s); jobs {e(', '.join(report.jobs) or 'none')}<br>",
        f"Objectives from {e(', '.join(report.objectives_from) or 'the exported series')}<br>",
        f"Generated {e(iso(report.generated))} by checkpoint-exporter {e(report.version)}; "
        f"exit status {report.exit_status}",
        "</p>",
        *(f'<p class="what">{e(note)}</p>' for note in report.notes),
        '<table class="rows"><tr><th>Checklist item</th><th>Verdict</th><th>Summary</th></tr>',
    ]
    for row in report.rows:
        out.append(
            f'<tr id="row-{e(row.key)}" class="row"><td><a href="#{e(row.key)}">'
            f"{e(row.title)}</a></td><td>{_badge(row.verdict)}</td>"
            f"<td>{e(row.summary)}</td></tr>"
        )
    out.append("</table>")
    out.append("<h2>Charts</h2>")
    out += [to_svg(chart) for chart in report.charts]
    for row in report.rows:
        out += [
            f'<h2 id="{e(row.key)}">{e(row.title)} {_badge(row.verdict)}</h2>',
            f"<p><em>{e(row.checklist)}</em></p>",
            f"<p>{e(row.summary)}</p>",
        ]
        if row.what_to_run:
            out.append(f'<p class="what">What to run: {e(row.what_to_run)}</p>')
        if row.jobs:
            out.append("<table><tr><th>Job</th><th>Verdict</th><th>Detail</th><th>Values</th></tr>")
            for job, v in row.jobs.items():
                out.append(
                    f"<tr><td>{e(job)}</td><td>{_badge(v.verdict)}</td>"
                    f"<td>{'<br>'.join(e(r) for r in v.reasons)}</td>"
                    f"<td><code>{e(_value(dict(v.values)))}</code></td></tr>"
                )
            out.append("</table>")
        if row.values:
            out.append(f"<p>Values: <code>{e(_value(dict(row.values)))}</code></p>")
        if row.queries:
            out.append(f"<details><summary>PromQL ({len(row.queries)} queries)</summary>")
            out += [
                f"<p><code>{e(name)}</code></p><pre>{e(expr)}</pre>" for name, expr in row.queries
            ]
            out.append("</details>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write(report: Report, directory: object) -> list[str]:
    """Writes acceptance.html, .json and .md into ``directory``; returns their paths."""
    from pathlib import Path

    target = Path(str(directory))
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (
        ("acceptance.html", to_html(report)),
        ("acceptance.json", to_json(report)),
        ("acceptance.md", to_markdown(report)),
    ):
        path = target / name
        path.write_text(text, encoding="utf-8")
        written.append(str(path))
    return written
