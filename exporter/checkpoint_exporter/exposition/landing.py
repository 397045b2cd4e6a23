"""The landing page at ``/``: per job, the last saves as a timeline, drawn server-side in SVG.

Each save is a stacked bar of its clocks (staging, write, commit; the training-visible pause as
a dark inner bar) against the job's deadline line; late and aborted saves and failed restores are
marked. Capacity and drain sit below. No JavaScript, no external assets: the page is one HTML
document rendered from the snapshot, so it costs a scrape's worth of nothing.

Every number drawn or printed comes from events and files other users wrote: each goes through
``_finite``, ``_duration`` or ``_bytes``, which turn infinities, NaN, negatives and absurd sizes
into something printable, and a job whose section still fails to render is shown as such,
without taking the other jobs' sections (or the page) with it.
"""

from __future__ import annotations

import html
import logging
import math
import time

from checkpoint_exporter import __version__
from checkpoint_exporter.model import (
    STAGING,
    DaemonState,
    FilesystemState,
    JobState,
    Snapshot,
    newest_committed,
)
from checkpoint_exporter.units import MAX_DURATION, format_duration

log = logging.getLogger(__name__)

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 560, 150, 46, 22, 10
STACK = (("staging", "#4c78a8"), ("write", "#f58518"), ("commit", "#54a24b"), ("drain", "#9467bd"))
PAUSE_COLOR, LATE_COLOR, ABORTED_COLOR = "#222222", "#d62728", "#9e9e9e"

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:72em}
h1{margin-bottom:.2em} h2{margin:1.2em 0 .3em;font-size:1.15em}
table{border-collapse:collapse;margin:.4em 0} td,th{padding:.15em .7em;text-align:left}
th{border-bottom:1px solid #999} .muted{color:#777} .bad{color:#d62728;font-weight:600}
.job{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start}
.legend span{display:inline-block;margin-right:1em} .swatch{display:inline-block;width:.8em;height:.8em;margin-right:.3em}
"""


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _finite(value: object, default: float = 0.0, low: float = 0.0, high: float = 1e15) -> float:
    """``value`` as a float within [low, high]; ``default`` for NaN, None and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf if value > 0 else -math.inf
    if math.isnan(number):
        return default
    return min(max(number, low), high)


def _duration(seconds: object) -> str:
    """A duration as people read it; "?" for what is not one."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return "?"
    value = _finite(seconds, default=-1.0, low=-1.0, high=math.inf)
    if value < 0:
        return "?"
    if value > MAX_DURATION:
        return f">{format_duration(MAX_DURATION)}"
    return format_duration(value)


def _bytes(value: object) -> str:
    number = _finite(value, default=math.nan, low=-1e30, high=1e30)
    if math.isnan(number):
        return "?"
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(number) < 1000 or unit == "PB":
            return f"{number:.3g} {unit}"
        number /= 1000
    return f"{number} B"  # unreachable


def _ago(now: float, then: float | None) -> str:
    if not then:
        return "never"
    value = _finite(then, default=math.nan, low=-math.inf, high=math.inf)
    if not math.isfinite(value):
        return "?"
    if value > now + 1:
        return f"{_duration(value - now)} from now"
    return f"{_duration(round(now - value))} ago"


def timeline_svg(job: JobState) -> str:
    """The job's recent saves against its deadline, as an SVG element."""
    saves = list(job.recent_saves)
    deadline = _finite(job.deadline_seconds, default=1.0, high=MAX_DURATION) or 1.0
    totals = [_finite(dict(s.phases).get("total", 0.0), high=MAX_DURATION) for s in saves]
    longest = max([deadline * 1.25, *totals])
    plot_h = HEIGHT - BOTTOM - TOP

    def y(seconds: float) -> float:
        return TOP + plot_h * (1 - min(seconds, longest) / longest)

    slot = (WIDTH - LEFT - 10) / max(len(saves), 8)
    bar = max(4.0, slot * 0.6)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" data-job="{_esc(job.name)}" '
        f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{_esc(job.name)}: last {len(saves)} saves against a '
        f'{_duration(deadline)} deadline">',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH}" y2="{TOP + plot_h}" stroke="#999"/>',
        f'<text x="4" y="{TOP + 8}" font-size="10" fill="#555">{_duration(round(longest))}</text>',
        f'<text x="4" y="{TOP + plot_h}" font-size="10" fill="#555">0</text>',
    ]
    for index, save in enumerate(saves):
        x = LEFT + index * slot + (slot - bar) / 2
        phases = {
            name: _finite(value, high=MAX_DURATION) for name, value in dict(save.phases).items()
        }
        label = f"step {save.step}" if save.step is not None else "save"
        if save.outcome == "aborted":
            parts.append(
                f'<g class="save aborted"><title>{_esc(label)}: aborted, never committed</title>'
                f'<rect class="failure" x="{x:.1f}" y="{TOP:.1f}" width="{bar:.1f}" '
                f'height="{plot_h:.1f}" fill="{ABORTED_COLOR}" fill-opacity="0.35"/>'
                f'<text x="{x + bar / 2:.1f}" y="{TOP + plot_h / 2:.1f}" font-size="14" '
                f'text-anchor="middle" fill="{LATE_COLOR}">✕</text></g>'
            )
            continue
        total = phases.get("total", 0.0)
        title = f"{label}: total {total:.2f} s" + "".join(
            f", {phase} {phases[phase]:.2f} s"
            for phase in ("pause", "staging", "write", "commit")
            if phase in phases
        )
        late = save.outcome == "late"
        group = [f'<g class="save {"late" if late else "ok"}"><title>{_esc(title)}</title>']
        base = 0.0
        clocked = sum(phases.get(p, 0.0) for p in ("staging", "write", "commit"))
        if clocked and total - clocked >= 0.01:
            phases["drain"] = total - clocked  # past the job's own commit: the durable copy
        stacked = [(name, color) for name, color in STACK if name in phases]
        for name, color in stacked or [("total", "#7f7f7f")]:
            seconds = phases.get(name, total)
            top, bottom = y(base + seconds), y(base)
            group.append(
                f'<rect class="phase-{name}" x="{x:.1f}" y="{top:.1f}" width="{bar:.1f}" '
                f'height="{max(bottom - top, 0.5):.1f}" fill="{color}"/>'
            )
            base += seconds
        if "pause" in phases:
            top = y(phases["pause"])
            group.append(
                f'<rect class="phase-pause" x="{x + bar * 0.35:.1f}" y="{top:.1f}" '
                f'width="{bar * 0.3:.1f}" height="{max(y(0) - top, 0.5):.1f}" fill="{PAUSE_COLOR}"/>'
            )
        if late:
            group.append(
                f'<rect class="failure" x="{x - 1:.1f}" y="{y(total) - 1:.1f}" width="{bar + 2:.1f}" '
                f'height="{y(0) - y(total) + 2:.1f}" fill="none" stroke="{LATE_COLOR}" stroke-width="2"/>'
            )
        group.append("</g>")
        parts.append("".join(group))
    first = _finite(saves[0].start, low=-1e15) if saves else 0.0
    span = max(_finite(saves[-1].end, low=-1e15) - first, 1.0) if saves else 1.0
    for restore in job.recent_restores:
        if not saves:
            break
        share = _finite((_finite(restore.at, low=-1e15) - first) / span, high=1.0)
        cx = LEFT + share * (WIDTH - LEFT - 10)
        color = "#2ca02c" if restore.ok else LATE_COLOR
        kind = "restore-ok" if restore.ok else "restore-failed failure"
        what = "restore succeeded" if restore.ok else f"restore failed: {restore.reason}"
        parts.append(
            f'<circle class="{kind}" cx="{cx:.1f}" cy="{HEIGHT - 7}" r="5" fill="{color}">'
            f"<title>{_esc(what)}</title></circle>"
        )
    parts.append(
        f'<line class="deadline" x1="{LEFT}" y1="{y(deadline):.1f}" x2="{WIDTH}" '
        f'y2="{y(deadline):.1f}" stroke="{LATE_COLOR}" stroke-dasharray="5,3">'
        f"<title>deadline {_duration(deadline)}</title></line>"
        "</svg>"
    )
    return "".join(parts)


def _job_section(job: JobState, now: float) -> str:
    newest = newest_committed(job)
    facts = [
        ("layout", job.layout),
        ("interval / deadline", f"{_duration(job.interval_seconds)} / "
                                f"{_duration(job.deadline_seconds)}"),
        ("newest committed", f"{_ago(now, newest.commit_time)}, step {newest.step}"
                             if newest else "none yet"),
        ("valid", {True: "yes", False: "NO", None: "checking"}[newest.valid] if newest else "—"),
        ("saves in progress", sum(1 for g in job.generations if g.state == "writing")),
        ("committed / aborted / late", f"{job.saves_committed} / {job.saves_aborted} / "
                                       f"{job.deadline_misses}"),
        ("last restore", _ago(now, job.restore_last_success)
         + (f", {job.restore_failures} failed" if job.restore_failures else "")),
    ]  # fmt: skip
    if any(path.tier == STAGING for path in job.paths):
        facts.append(
            ("drain backlog", f"{job.drain_backlog_generations} generations, "
                              f"{_bytes(job.drain_backlog_bytes)}")
        )  # fmt: skip
    rows = "".join(
        f"<tr><th>{_esc(k)}</th><td{' class=bad' if v in ('NO',) else ''}>{_esc(v)}</td></tr>"
        for k, v in facts
    )
    paths = "<br>".join(_esc(f"{p.tier}: {p.path}") for p in job.paths)
    return (
        f'<section class="job-block" id="job-{_esc(job.name)}"><h2>{_esc(job.name)}</h2>'
        f'<div class="job">{timeline_svg(job)}<table>{rows}'
        f'<tr><th>paths</th><td class="muted">{paths}</td></tr></table></div></section>'
    )


def _safe_job_section(job: JobState, now: float) -> str:
    """The job's section; if its state still cannot be drawn, a line saying so (the other
    jobs and the page are never lost to one job's numbers)."""
    try:
        return _job_section(job, now)
    except Exception:
        log.exception("landing page: cannot draw job %r", getattr(job, "name", "?"))
        return (
            f'<section class="job-block"><h2>{_esc(job.name)}</h2>'
            '<p class="bad">This job\'s state cannot be drawn; see the log and /metrics.</p>'
            "</section>"
        )


def _free(fs: FilesystemState) -> float:
    size = _finite(fs.size_bytes, high=1e30)
    return _finite(fs.avail_bytes, high=1e30) / size if size else 0.0


def _low(fs: FilesystemState) -> bool:
    sized = _finite(fs.size_bytes, high=1e30) > 0
    return sized and _free(fs) < _finite(fs.reserve_ratio, high=1.0)


def _readiness(daemon: DaemonState) -> str:
    """A line while the first pass runs: until then the page shows part of what is on disk."""
    if daemon.ready:
        return ""
    done = sum(1 for _job, _tier, finished, _entries in daemon.first_scans if finished)
    return (
        f'<p class="bad">starting: first pass not finished ({done} of '
        f"{len(daemon.first_scans)} tiers); what is shown below may be incomplete.</p>"
    )


def render(snapshot: Snapshot, telemetry_path: str) -> str:
    now = time.time()
    path = _esc(telemetry_path)
    legend = "".join(
        f'<span><i class="swatch" style="background:{color}"></i>{name}</span>'
        for name, color in (*STACK, ("pause", PAUSE_COLOR), ("late / failed", LATE_COLOR),
                            ("aborted", ABORTED_COLOR))
    )  # fmt: skip
    if snapshot.jobs:
        jobs = "".join(_safe_job_section(job, now) for job in snapshot.jobs)
    else:
        jobs = (
            "<p>No training jobs are configured: add <code>jobs:</code> or "
            "<code>discover:</code> to the config file.</p>"
        )
    filesystems = "".join(
        f"<tr><td>{_esc(fs.mountpoint)}</td><td>{_esc(fs.fstype)}</td><td>{_bytes(fs.size_bytes)}</td>"
        f"<td>{_bytes(fs.avail_bytes)}</td><td>{fs.reserve_ratio:.0%}</td>"
        f"<td{' class=bad' if fs.avail_bytes < fs.reserve_ratio * fs.size_bytes else ''}>"
        f"{fs.avail_bytes / fs.size_bytes if fs.size_bytes else 0:.0%}</td></tr>"
        for fs in snapshot.filesystems
    )
    capacity = (
        "<table><tr><th>mountpoint</th><th>type</th><th>size</th><th>available</th>"
        f"<th>reserve</th><th>free</th></tr>{filesystems}</table>"
        if filesystems
        else '<p class="muted">No filesystem probed yet.</p>'
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>checkpoint-exporter</title>
<meta http-equiv="refresh" content="10"><style>{STYLE}</style></head>
<body><h1>checkpoint-exporter</h1>
<p class="muted">Version {_esc(__version__)}. Is every training job's state reaching recoverable
storage before its deadline? <a href="{path}">Metrics</a> · <a href="/runbooks">Runbooks</a> ·
<a href="/healthz">Health</a> · <a href="/readyz">Readiness</a></p>
{_readiness(snapshot.daemon)}
<p class="legend">{legend}</p>
{jobs}
<h2>Capacity</h2>{capacity}
</body></html>
"""
