"""The landing page at ``/``: per job, the last saves as a timeline, drawn server-side in SVG.

A line per job at the top says in plain words whether it is healthy: the newest checkpoint's
age against its interval plus deadline, the last save's outcome, validity, restores. Each save
is then a stacked bar of its clocks (staging, write, commit; the training-visible pause as a dark
inner bar) against the job's deadline line, placed at its start on a wall-clock axis (UTC), with
its diagnosed symptoms marked above it; late and aborted saves are marked, and restores sit on
the same axis, labelled with their outcome and duration. Capacity and drain sit below. No
JavaScript, no external assets: the page is one HTML document rendered from the snapshot, so it
costs a scrape's worth of nothing.

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
import urllib.parse
from dataclasses import dataclass

from checkpoint_exporter import __version__
from checkpoint_exporter.model import (
    DURABLE,
    STAGING,
    DaemonState,
    FilesystemState,
    JobState,
    SaveRecord,
    Snapshot,
    scanned,
)
from checkpoint_exporter.units import MAX_DURATION, format_duration

log = logging.getLogger(__name__)

# TOP leaves room for two symptom marks above a bar at the top of the scale; BOTTOM for the
# time axis's labels and, below them, the restore marks.
WIDTH, HEIGHT, LEFT, BOTTOM, TOP, RIGHT = 560, 190, 46, 46, 26, 10
STACK = (("staging", "#4c78a8"), ("write", "#f58518"), ("commit", "#54a24b"), ("drain", "#9467bd"))
PAUSE_COLOR, LATE_COLOR, ABORTED_COLOR, OK_COLOR = "#222222", "#d62728", "#9e9e9e", "#2ca02c"
SYMPTOM_COLOR = "#8c564b"
# Two letters per symptom on the bar (the legend and each mark's tooltip spell it out).
SYMPTOM_CODES = {
    "staging_bound": "SB",
    "straggler": "ST",
    "contention": "CO",
    "commit_bound": "CB",
    "backlog": "BL",
    "unrestorable": "UR",
    "training_disturbed": "TD",
}
SYMPTOM_WORDS = {
    "staging_bound": "staging-bound: the pause passed before network traffic rose",
    "straggler": "straggler: one node or rank finished much later than the others",
    "contention": "shared-path contention: slow while other jobs saved at once",
    "commit_bound": "commit-bound: fast payload, slow final commit",
    "backlog": "accumulating backlog: saves progressively slower, generations piling up",
    "unrestorable": "unrestorable: committed, then a restore of it failed",
    "training_disturbed": "training disturbed: GPU utilisation well below its baseline",
}
# Tick spacings for the time axis, in seconds: the first that gives at most MAX_TICKS ticks.
TICK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
              43200, 86400, 172800, 604800)  # fmt: skip
MAX_TICKS = 6

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:72em}
h1{margin-bottom:.2em} h2{margin:1.2em 0 .3em;font-size:1.15em}
table{border-collapse:collapse;margin:.4em 0} td,th{padding:.15em .7em;text-align:left}
th{border-bottom:1px solid #999} .muted{color:#777} .bad{color:#d62728;font-weight:600}
.job{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start}
.legend span{display:inline-block;margin-right:1em} .swatch{display:inline-block;width:.8em;height:.8em;margin-right:.3em}
ul.summary{list-style:none;padding:0;margin:.6em 0} ul.summary li{margin:.2em 0}
.healthy .verdict{color:#2ca02c;font-weight:600} .unhealthy .verdict{color:#d62728;font-weight:600}
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


def _clock(at: float, step: float) -> str:
    """A wall-clock label (UTC) for a tick ``step`` seconds from the next: seconds only when the
    ticks are less than a minute apart, the date when they are a day or more apart."""
    try:
        moment = time.gmtime(at)
    except (OverflowError, OSError, ValueError):
        return "?"
    if step >= 86400:
        return time.strftime("%m-%d", moment)
    return time.strftime("%H:%M:%S" if step < 60 else "%H:%M", moment)


def _ticks(first: float, last: float) -> tuple[float, list[float]]:
    """Round wall-clock times between ``first`` and ``last``: the spacing and the ticks."""
    span = max(last - first, 1.0)
    step = next((s for s in TICK_STEPS if span / s <= MAX_TICKS), None)
    if step is None:  # a span of weeks or more (or a nonsense time): no round spacing needed
        step = span / MAX_TICKS
    tick = math.ceil(first / step) * step
    ticks = []
    while tick <= last and len(ticks) <= MAX_TICKS:
        ticks.append(tick)
        tick += step
    return step, ticks


def _symptom_marks(save: SaveRecord, cx: float, top: float) -> str:
    """One small labelled mark per diagnosed symptom, stacked upward from ``top``."""
    marks = []
    known = [name for name in save.symptoms if name in SYMPTOM_CODES]
    for index, name in enumerate(known):
        y = max(top - 11 * (index + 1), 0.0)
        marks.append(
            f'<g class="symptom symptom-{name.replace("_", "-")}">'
            f"<title>{_esc(SYMPTOM_WORDS[name])}</title>"
            f'<rect x="{cx - 8:.1f}" y="{y:.1f}" width="16" height="10" rx="2" '
            f'fill="{SYMPTOM_COLOR}"/>'
            f'<text x="{cx:.1f}" y="{y + 8:.1f}" font-size="8" text-anchor="middle" '
            f'fill="#fff">{SYMPTOM_CODES[name]}</text></g>'
        )
    return "".join(marks)


def timeline_svg(job: JobState) -> str:
    """The job's recent saves against its deadline, on a wall-clock axis, as an SVG element."""
    saves = list(job.recent_saves)
    restores = list(job.recent_restores)
    deadline = _finite(job.deadline_seconds, default=1.0, high=MAX_DURATION) or 1.0
    totals = [_finite(dict(s.phases).get("total", 0.0), high=MAX_DURATION) for s in saves]
    longest = max([deadline * 1.25, *totals])
    plot_h = HEIGHT - BOTTOM - TOP
    axis_y = TOP + plot_h

    def y(seconds: float) -> float:
        return TOP + plot_h * (1 - min(seconds, longest) / longest)

    # The time axis runs from the first save's start (or restore) to the last save's end (or
    # restore); each bar starts at its save's start. Bars keep a readable width: when saves
    # come closer than that, neighbours overlap rather than the scale lying about time.
    moments = [_finite(s.start, low=-1e15) for s in saves] + [
        _finite(r.at, low=-1e15) for r in restores
    ]
    ends = [_finite(s.end, low=-1e15) for s in saves] + moments
    first = min(moments, default=0.0)
    last = max([*ends, first + 1.0])
    slot = (WIDTH - LEFT - RIGHT) / max(len(saves), 8)
    bar = max(4.0, slot * 0.6)
    plot_w = WIDTH - LEFT - RIGHT - bar

    def x(at: float) -> float:
        share = _finite((_finite(at, low=-1e15) - first) / (last - first), high=1.0)
        return LEFT + share * plot_w

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" data-job="{_esc(job.name)}" '
        f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{_esc(job.name)}: last {len(saves)} saves against a '
        f'{_duration(deadline)} deadline">',
        f'<line x1="{LEFT}" y1="{axis_y}" x2="{WIDTH}" y2="{axis_y}" stroke="#999"/>',
        f'<text x="4" y="{TOP + 8}" font-size="10" fill="#555">{_duration(round(longest))}</text>',
        f'<text x="4" y="{axis_y}" font-size="10" fill="#555">0</text>',
    ]
    if moments:
        step, ticks = _ticks(first, last)
        parts.append(
            f'<text class="axis-unit" x="4" y="{axis_y + 12}" font-size="9" fill="#777">UTC</text>'
        )
        for tick in ticks:
            tx = x(tick) + bar / 2
            parts.append(
                f'<g class="tick"><line x1="{tx:.1f}" y1="{axis_y}" x2="{tx:.1f}" '
                f'y2="{axis_y + 4}" stroke="#999"/><text x="{tx:.1f}" y="{axis_y + 13}" '
                f'font-size="9" text-anchor="middle" fill="#555">{_clock(tick, step)}</text></g>'
            )
    for save in saves:
        left = x(save.start)
        phases = {
            name: _finite(value, high=MAX_DURATION) for name, value in dict(save.phases).items()
        }
        label = f"step {save.step}" if save.step is not None else "save"
        when = f"; started {_clock(_finite(save.start, low=-1e15), 1)} UTC" + "".join(
            f"; {SYMPTOM_WORDS[name]}" for name in save.symptoms if name in SYMPTOM_WORDS
        )
        if save.outcome == "aborted":
            parts.append(
                f'<g class="save aborted"><title>{_esc(label)}: aborted, never committed'
                f"{_esc(when)}</title>"
                f'<rect class="failure" x="{left:.1f}" y="{TOP:.1f}" width="{bar:.1f}" '
                f'height="{plot_h:.1f}" fill="{ABORTED_COLOR}" fill-opacity="0.35"/>'
                f'<text x="{left + bar / 2:.1f}" y="{TOP + plot_h / 2:.1f}" font-size="14" '
                f'text-anchor="middle" fill="{LATE_COLOR}">✕</text>'
                f"{_symptom_marks(save, left + bar / 2, TOP)}</g>"
            )
            continue
        total = phases.get("total", 0.0)
        title = (
            f"{label}: total {total:.2f} s"
            + "".join(
                f", {phase} {phases[phase]:.2f} s"
                for phase in ("pause", "staging", "write", "commit")
                if phase in phases
            )
            + when
        )
        late = save.outcome == "late"
        group = [f'<g class="save {"late" if late else "ok"}"><title>{_esc(title)}</title>']
        base = 0.0
        clocked = sum(phases.get(p, 0.0) for p in ("staging", "write", "commit"))
        if clocked and total - clocked >= 0.01:
            phases["drain"] = total - clocked  # past the job's own commit: the durable copy
        # Each phase is the slowest rank's, and the slowest stager need not be the slowest
        # writer: stacked as they are, they can add up to more than the save took. Drawn in
        # proportion within the total, the bar is as tall as the save was long.
        scale = total / clocked if clocked > total > 0 else 1.0
        stacked = [(name, color) for name, color in STACK if name in phases]
        for name, color in stacked or [("total", "#7f7f7f")]:
            seconds = phases.get(name, total) * (scale if name != "total" else 1.0)
            top, bottom = y(base + seconds), y(base)
            group.append(
                f'<rect class="phase-{name}" x="{left:.1f}" y="{top:.1f}" width="{bar:.1f}" '
                f'height="{max(bottom - top, 0.5):.1f}" fill="{color}"/>'
            )
            base += seconds
        if "pause" in phases:
            top = y(phases["pause"])
            group.append(
                f'<rect class="phase-pause" x="{left + bar * 0.35:.1f}" y="{top:.1f}" '
                f'width="{bar * 0.3:.1f}" height="{max(y(0) - top, 0.5):.1f}" fill="{PAUSE_COLOR}"/>'
            )
        if late:
            group.append(
                f'<rect class="failure" x="{left - 1:.1f}" y="{y(total) - 1:.1f}" width="{bar + 2:.1f}" '
                f'height="{y(0) - y(total) + 2:.1f}" fill="none" stroke="{LATE_COLOR}" stroke-width="2"/>'
            )
        group.append(_symptom_marks(save, left + bar / 2, y(total)))
        group.append("</g>")
        parts.append("".join(group))
    for restore in restores:
        cx, cy = x(restore.at) + bar / 2, HEIGHT - 9
        color = OK_COLOR if restore.ok else LATE_COLOR
        kind = "restore-ok" if restore.ok else "restore-failed failure"
        took = _duration(restore.duration)
        short = f"restored {took}" if restore.ok else f"restore failed {took}"
        at = f"at {_clock(_finite(restore.at, low=-1e15), 1)} UTC"
        what = (
            f"restore succeeded in {took}, {at}"
            if restore.ok
            else f"restore failed: {restore.reason or 'no reason given'} (after {took}, {at})"
        )
        anchor = "end" if cx > WIDTH - 90 else "start"
        dx = -7 if anchor == "end" else 7
        parts.append(
            f'<g class="restore {kind}"><title>{_esc(what)}</title>'
            f'<circle cx="{cx:.1f}" cy="{cy}" r="5" fill="{color}"/>'
            f'<text class="restore-label" x="{cx + dx:.1f}" y="{cy + 3}" font-size="9" '
            f'text-anchor="{anchor}" fill="{color}">{_esc(short)}</text></g>'
        )
    parts.append(
        f'<line class="deadline" x1="{LEFT}" y1="{y(deadline):.1f}" x2="{WIDTH}" '
        f'y2="{y(deadline):.1f}" stroke="{LATE_COLOR}" stroke-dasharray="5,3">'
        f"<title>deadline {_duration(deadline)}</title></line>"
        "</svg>"
    )
    return "".join(parts)


@dataclass(frozen=True)
class Verdict:
    healthy: bool
    problems: tuple[str, ...]  # what makes it unhealthy, worst first
    notes: tuple[str, ...]  # what a reader should know either way


def verdict(job: JobState, now: float) -> Verdict:
    """Whether the job is healthy, in plain words: could it restart from a recent, valid
    checkpoint, and did its last save and restore work. The alerts' conditions, read at once."""
    problems: list[str] = []
    notes: list[str] = []
    newest = job.newest_committed
    interval = _finite(job.interval_seconds, high=MAX_DURATION)
    limit = interval + _finite(job.deadline_seconds, high=MAX_DURATION)
    if not scanned(job, DURABLE):
        # The durable tier is shared and read by other processes (the cluster shape's shared
        # scanners): this one has no generation of it to judge, which is no fault of the job.
        where = ", ".join(p.path for p in job.paths if p.tier == DURABLE) or "its durable tier"
        notes.append(f"newest checkpoint judged by the processes that read {where}")
    elif newest is None or newest.commit_time is None:
        (notes if job.finished else problems).append("no committed checkpoint yet")
    else:
        age = now - _finite(newest.commit_time, default=math.nan, low=-math.inf, high=math.inf)
        if not math.isfinite(age):
            problems.append("the newest checkpoint's commit time is unreadable")
        elif job.finished:
            notes.append(f"newest checkpoint {_ago(now, newest.commit_time)}")
        elif age > limit:
            problems.append(
                f"newest checkpoint {_duration(round(age))} old, over its interval + deadline "
                f"of {_duration(limit)}"
            )
        else:
            notes.append(f"newest checkpoint {_ago(now, newest.commit_time)} (limit "
                         f"{_duration(limit)})")  # fmt: skip
        valid = newest.valid if newest.valid is not None else job.last_committed_valid
        if valid is False:
            reason = f" ({newest.invalid_reason})" if newest.invalid_reason else ""
            problems.append(f"newest checkpoint invalid{reason}")
        elif valid is None:
            notes.append("validation pending")
        else:
            notes.append("valid")
    if job.recent_saves:
        last = job.recent_saves[-1]
        total = dict(last.phases).get("total")
        if last.outcome == "aborted":
            problems.append("last save aborted")
        elif last.outcome == "late":
            problems.append(f"last save late ({_duration(total)} against a "
                            f"{_duration(job.deadline_seconds)} deadline)")  # fmt: skip
        else:
            notes.append(f"last save ok ({_duration(total)})")
        if last.symptoms:
            notes.append("last save: " + ", ".join(n.replace("_", " ") for n in last.symptoms))
    if job.finished:
        notes.insert(0, "finished: nothing pages for it")
    if job.recent_restores and not job.recent_restores[-1].ok:
        last_restore = job.recent_restores[-1]
        what = "last restore drill failed" if last_restore.drill else "last restore failed"
        reason = last_restore.reason
        problems.append(what + (f" ({reason})" if reason else ""))
    elif job.restore_last_success:
        since = now - _finite(job.restore_last_success, low=-1e15)
        drill = _finite(job.restore_drill_max_age_seconds, high=math.inf)
        if since > drill:
            notes.append(f"no restore tested in {_duration(drill)}")
        else:
            notes.append(f"last restore ok {_ago(now, job.restore_last_success)}")
    else:
        notes.append("never restored")
    return Verdict(not problems, tuple(problems), tuple(notes))


def summary_line(job: JobState, now: float) -> str:
    """The job's verdict as one list item linking to its section."""
    judged = verdict(job, now)
    words = "; ".join((*judged.problems, *judged.notes))
    anchor = urllib.parse.quote(f"job-{job.name}", safe="")
    state = "healthy" if judged.healthy else "unhealthy"
    return (
        f'<li class="{state}"><a href="#{_esc(anchor)}">{_esc(job.name)}</a>: '
        f'<span class="verdict">{"healthy" if judged.healthy else "NOT healthy"}</span>'
        f" — {_esc(words)}.</li>"
    )


def _safe_summary_line(job: JobState, now: float) -> str:
    try:
        return summary_line(job, now)
    except Exception:
        log.exception("landing page: cannot judge job %r", getattr(job, "name", "?"))
        return f'<li class="unhealthy">{_esc(job.name)}: cannot be judged; see the log.</li>'


def _job_section(job: JobState, now: float) -> str:
    newest = job.newest_committed
    facts = [
        ("layout", job.layout),
        ("interval / deadline", f"{_duration(job.interval_seconds)} / "
                                f"{_duration(job.deadline_seconds)}"),
        ("newest committed", f"{_ago(now, newest.commit_time)}, step {newest.step}"
                             if newest else "none yet" if scanned(job, DURABLE)
                             else "judged where the durable tier is read"),
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
    symptoms = "".join(
        f'<span title="{_esc(words)}"><i class="swatch" style="background:{SYMPTOM_COLOR}"></i>'
        f"{SYMPTOM_CODES[name]} {_esc(name.replace('_', ' '))}</span>"
        for name, words in SYMPTOM_WORDS.items()
    )
    summary = ""
    if snapshot.jobs:
        jobs = "".join(_safe_job_section(job, now) for job in snapshot.jobs)
        summary = (
            '<ul class="summary">'
            + "".join(_safe_summary_line(job, now) for job in snapshot.jobs)
            + "</ul>"
        )
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
{summary}
<p class="legend">{legend}</p>
<p class="legend muted">Symptoms: {symptoms}</p>
{jobs}
<h2>Capacity</h2>{capacity}
</body></html>
"""
