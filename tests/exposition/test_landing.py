"""The landing page's timelines, drawn from a snapshot: bars, deadline line, failure marks."""

from __future__ import annotations

import math
import re
import time
from dataclasses import replace
from html import escape as html_escape

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint_exporter.exposition.landing import render, timeline_svg
from checkpoint_exporter.model import (
    DURABLE,
    STAGING,
    FilesystemState,
    Generation,
    JobState,
    RestoreRecord,
    SaveRecord,
    Snapshot,
    WatchedPath,
)

T = 1_800_000_000.0


def job(**kw) -> JobState:
    saves = (
        SaveRecord(100, T, T + 3, (("commit", 0.5), ("pause", 0.5), ("staging", 1.0),
                                   ("total", 3.0), ("write", 1.5)), "ok"),
        SaveRecord(200, T + 60, T + 70, (("total", 10.0),), "late"),
        SaveRecord(300, T + 120, T + 125, (), "aborted"),
        SaveRecord(400, T + 180, T + 186, (("commit", 0.5), ("staging", 1.0), ("total", 6.0),
                                           ("write", 1.5)), "ok"),
    )  # fmt: skip
    restores = (RestoreRecord(T + 100, True, 4.0), RestoreRecord(T + 190, False, 1.0, "torn"))
    defaults = dict(
        name="llama<70b>", layout="dcp", paths=(WatchedPath(DURABLE, "/ckpt/j"),),
        interval_seconds=60, deadline_seconds=8, retained_generations_limit=3,
        restore_drill_max_age_seconds=3600, recent_saves=saves, recent_restores=restores,
    )  # fmt: skip
    return JobState(**{**defaults, **kw})


def count(svg: str, cls: str) -> int:
    return len(re.findall(rf'class="[^"]*\b{cls}\b[^"]*"', svg))


def test_bars_deadline_and_failures() -> None:
    svg = timeline_svg(job())
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert count(svg, "save") == 4
    assert count(svg, "phase-staging") == 2 and count(svg, "phase-write") == 2
    assert count(svg, "phase-pause") == 1
    assert count(svg, "phase-drain") == 1  # save 400: 6 s total, 3 s on the clocks
    assert count(svg, "phase-total") == 1  # save 200, timed from disk alone
    assert count(svg, "deadline") == 1
    assert count(svg, "aborted") == 1 and count(svg, "late") == 1
    assert count(svg, "restore-failed") == 1 and count(svg, "restore-ok") == 1
    assert count(svg, "failure") == 3  # the late bar, the aborted save, the failed restore
    assert "step 100: total 3.00 s, pause 0.50 s, staging 1.00 s" in svg
    assert "restore failed: torn" in svg
    # The deadline sits below the late save's top: 8 s of a 10 s scale.
    deadline_y = float(re.search(r'class="deadline" x1="\d+" y1="([\d.]+)"', svg).group(1))
    late_top = float(
        re.search(r'class="save late">.*?class="phase-total" x="[\d.]+" y="([\d.]+)"', svg).group(1)
    )
    assert late_top < deadline_y


def test_page_escapes_names_and_shows_capacity() -> None:
    snapshot = Snapshot(
        (job(),),
        filesystems=(FilesystemState("/ckpt", "filer:/x", "nfs4", 10**13, 10**12, 0.2),),
    )
    page = render(snapshot, "/metrics")
    assert "llama&lt;70b&gt;" in page and "llama<70b>" not in page
    assert "/ckpt" in page and "10%" in page and "class=bad" in page  # 10% free, under the reserve
    assert "<script" not in page  # no JavaScript


EDGES = (math.inf, -math.inf, math.nan, 1e308, -1e308, -1.0, 0.0, 2.0**63, 10**30)


def hostile_job(value: float) -> JobState:
    """Every number the page draws or prints set to ``value``."""
    saves = (
        SaveRecord(1, value, value, (("total", value), ("staging", value), ("pause", value)), "ok"),
        SaveRecord(2, T, value, (("total", value), ("write", value)), "late"),
        SaveRecord(3, value, T, (), "aborted"),
    )
    committed = Generation("step-1", DURABLE, 1, "committed", value, value, value, 10, 1, True)
    return job(
        interval_seconds=value, deadline_seconds=value, restore_drill_max_age_seconds=value,
        generations=(committed,), recent_saves=saves,
        recent_restores=(RestoreRecord(value, True, value), RestoreRecord(value, False, value)),
        restore_last_success=value, restore_last_duration=value, drain_backlog_bytes=value,
        oldest_undrained_commit=value,
        paths=(WatchedPath(DURABLE, "/d"), WatchedPath(STAGING, "/s")),
    )  # fmt: skip


@pytest.mark.parametrize("value", EDGES, ids=repr)
def test_the_page_renders_whatever_the_numbers(value: float) -> None:
    """inf, NaN, 1e308 (whose differences overflow), negatives: drawn or shown as "?", never
    an exception (which used to be an empty reply for every job)."""
    filesystem = FilesystemState("/ckpt", "dev", "xfs", value, value, value)  # type: ignore[arg-type]
    page = render(Snapshot((hostile_job(value), job()), filesystems=(filesystem,)), "/metrics")
    assert page.count('<svg xmlns="http://www.w3.org/2000/svg" class="timeline"') == 2
    assert "cannot be drawn" not in page  # the per-job fallback was not needed
    assert page.rstrip().endswith("</html>")


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**40), 10**40))
def test_any_number_anywhere_renders(value: float) -> None:
    page = render(Snapshot((hostile_job(value),)), "/metrics")
    assert "cannot be drawn" not in page and "</svg>" in page


def test_one_undrawable_job_does_not_take_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    from checkpoint_exporter.exposition import landing

    def broken(job: JobState) -> str:
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(landing, "timeline_svg", broken)
    page = render(Snapshot((job(name="a"), job(name="b"))), "/metrics")
    assert page.count("cannot be drawn") == 2 and page.rstrip().endswith("</html>")


def test_the_page_says_when_the_first_pass_is_not_finished() -> None:
    from checkpoint_exporter.model import DaemonState

    first_scans = (
        ("a", "durable", True, 10),
        ("a", "staging", False, 3),
        ("b", "durable", False, 0),
    )
    starting = Snapshot((job(),), DaemonState(ready=False, first_scans=first_scans))
    page = render(starting, "/metrics")
    assert "starting: first pass not finished (1 of 3 tiers)" in page
    assert 'href="/runbooks"' in page and 'href="/readyz"' in page
    ready = Snapshot((job(),), DaemonState(ready=True, first_scans=first_scans))
    assert "starting:" not in render(ready, "/metrics")


def test_runbook_markdown_is_rendered_escaped() -> None:
    """The runbooks' little Markdown, and nothing the text could smuggle in as markup."""
    from checkpoint_exporter.exposition.runbooks_page import to_html

    html = to_html(
        "# Run<books>\n\n## CheckpointTooOld\n\n**Meaning.** a `x<y>` and *this* <script>\n"
        "[docs](https://example.com/?a=1&b=2) [bad](javascript:alert(1)) [rel](#checkpointtooold)"
        "\n\n- one\n- two\n  continued\n\n1. first\n2. second\n\n```yaml\nkey: <b>\n```\n"
        "## Same name\n## Same name\n"
    )
    assert '<h1 id="runbooks">Run&lt;books&gt;</h1>' in html
    assert '<h2 id="checkpointtooold">CheckpointTooOld</h2>' in html
    assert (
        "<strong>Meaning.</strong> a <code>x&lt;y&gt;</code> and <em>this</em> &lt;script&gt;"
        in (html)
    )
    assert '<a href="https://example.com/?a=1&amp;b=2">docs</a>' in html
    assert '<a href="#checkpointtooold">rel</a>' in html
    assert "javascript:" not in html.split("bad")[0][-60:] and 'href="javascript' not in html
    assert "<ul><li>one</li><li>two continued</li></ul>" in html
    assert "<ol><li>first</li><li>second</li></ol>" in html
    assert '<pre><code class="language-yaml">key: &lt;b&gt;</code></pre>' in html
    assert 'id="same-name"' in html and 'id="same-name-1"' in html
    assert "<script" not in html and "<b>" not in html


def test_every_symptom_has_a_mark_and_words() -> None:
    from checkpoint_exporter.exposition.landing import SYMPTOM_CODES, SYMPTOM_WORDS
    from checkpoint_exporter.model import SYMPTOMS

    assert set(SYMPTOM_CODES) == set(SYMPTOM_WORDS) == set(SYMPTOMS)
    assert len(set(SYMPTOM_CODES.values())) == len(SYMPTOMS)


def test_symptoms_are_marked_on_their_bars() -> None:
    base = job().recent_saves
    saves = (
        replace(base[0], symptoms=("straggler", "commit_bound")),
        base[1],
        replace(base[2], symptoms=("backlog",)),  # an aborted save can be diagnosed too
        base[3],
    )
    svg = timeline_svg(job(recent_saves=saves))
    assert count(svg, "symptom") == 3
    assert count(svg, "symptom-straggler") == 1 and count(svg, "symptom-commit-bound") == 1
    assert count(svg, "symptom-backlog") == 1
    # Each mark sits inside its save's group, is labelled and explains itself.
    groups = re.findall(r'<g class="save [^"]*">.*?</g>(?=<g class="(?:save|restore|tick)|<line)',
                        svg)  # fmt: skip
    assert len(groups) == 4
    assert "symptom-straggler" in groups[0] and "symptom" not in groups[1]
    assert re.search(r'class="symptom symptom-straggler"><title>straggler: one node', svg)
    assert ">ST</text>" in svg and ">CB</text>" in svg and ">BL</text>" in svg
    assert "step 100: total 3.00 s" in svg and "straggler: one node" in groups[0]
    # Nothing drawn for a name the page does not know (a newer exporter's symptom).
    unknown = (replace(base[0], symptoms=("made_up",)),)
    assert count(timeline_svg(job(recent_saves=unknown)), "symptom") == 0
    assert count(timeline_svg(job()), "symptom") == 0  # clean saves carry no mark


def ticks(svg: str) -> list[tuple[float, str]]:
    return [
        (float(x), label)
        for x, label in re.findall(
            r'<g class="tick"><line x1="([\d.]+)".*?<text [^>]*>([^<]*)</text></g>', svg
        )
    ]


def bar_x(svg: str, step: int) -> float:
    found = re.search(rf"<title>step {step}:.*?</title><rect [^>]*x=\"([\d.]+)\"", svg)
    assert found, step
    return float(found.group(1))


def labels_of(saves: tuple[SaveRecord, ...]) -> list[str]:
    return [label for _, label in ticks(timeline_svg(job(recent_saves=saves, recent_restores=())))]


def test_the_timeline_has_a_wall_clock_axis() -> None:
    svg = timeline_svg(job())
    # The saves span T .. T + 186 s and a restore at T + 190 s: a tick a minute, UTC.
    assert [label for _, label in ticks(svg)] == ["08:00", "08:01", "08:02", "08:03"]
    assert time.strftime("%H:%M", time.gmtime(T)) == "08:00"
    xs = [x for x, _ in ticks(svg)]
    assert xs == sorted(xs) and xs[1] - xs[0] == pytest.approx(xs[3] - xs[2], abs=0.2)
    assert 'class="axis-unit"' in svg and ">UTC</text>" in svg
    # Bars stand at their save's start, on the same axis: step 200 (T + 60) under the 08:01 tick.
    assert bar_x(svg, 100) < bar_x(svg, 200) < bar_x(svg, 400)
    width = float(re.search(r'class="phase-total" x="[\d.]+" y="[\d.]+" width="([\d.]+)"',
                            svg).group(1))  # fmt: skip
    assert bar_x(svg, 200) + width / 2 == pytest.approx(xs[1], abs=0.2)
    # A few seconds of saves: ticks with seconds.
    quick = tuple(
        SaveRecord(i, T + 2 * i, T + 2 * i + 1, (("total", 1.0),), "ok") for i in range(6)
    )
    assert labels_of(quick) == [
        "08:00:00",
        "08:00:02",
        "08:00:04",
        "08:00:06",
        "08:00:08",
        "08:00:10",
    ]
    # Days of them: dates.
    daily = tuple(SaveRecord(i, T + 86400 * i, T + 86400 * i + 5, (), "aborted") for i in range(4))
    assert labels_of(daily) == ["01-16", "01-17", "01-18"]
    # No saves, no restores: no axis to draw.
    assert ticks(timeline_svg(job(recent_saves=(), recent_restores=()))) == []


def test_restore_marks_are_labelled_with_outcome_and_duration() -> None:
    svg = timeline_svg(job())
    marks = re.findall(r'<g class="restore ([^"]*)"><title>([^<]*)</title>.*?'
                       r'<text class="restore-label"[^>]*>([^<]*)</text></g>', svg)  # fmt: skip
    assert [(kind, label) for kind, _, label in marks] == [
        ("restore-ok", "restored 4s"),
        ("restore-failed failure", "restore failed 1s"),
    ]
    assert marks[0][1] == "restore succeeded in 4s, at 08:01:40 UTC"
    assert marks[1][1] == "restore failed: torn (after 1s, at 08:03:10 UTC)"


def committed(at: float, valid: bool | None = True) -> Generation:
    reason = None if valid is not False else "missing_shard"
    return Generation("step-9", DURABLE, 9, "committed", at - 5, at - 1, at, 10, 1, valid, reason)


def healthy_job(**kw) -> JobState:
    now = T + 200
    saves = job().recent_saves[3:]  # the last one ok, in 6 s against an 8 s deadline
    healthy = dict(
        generations=(committed(now - 30),), recent_saves=saves,
        recent_restores=(RestoreRecord(now - 60, True, 4.0),), restore_last_success=now - 60,
    )  # fmt: skip
    return job(**{**healthy, **kw})


def test_the_summary_says_healthy_in_plain_words() -> None:
    from checkpoint_exporter.exposition.landing import summary_line, verdict

    now = T + 200
    judged = verdict(healthy_job(), now)
    assert judged.healthy and judged.problems == ()
    assert judged.notes == (
        "newest checkpoint 30s ago (limit 1m8s)",
        "valid",
        "last save ok (6s)",
        "last restore ok 1m ago",
    )
    line = summary_line(healthy_job(), now)
    assert line.startswith('<li class="healthy"><a href="#job-llama%3C70b%3E">llama&lt;70b&gt;</a>')
    assert '<span class="verdict">healthy</span>' in line


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (dict(generations=(committed(T + 200 - 600),)),
         "newest checkpoint 10m old, over its interval + deadline of 1m8s"),
        (dict(generations=()), "no committed checkpoint yet"),
        (dict(generations=(committed(T + 170, valid=False),)),
         "newest checkpoint invalid (missing_shard)"),
        (dict(recent_saves=job().recent_saves[:2]), "last save late (10s against a 8s deadline)"),
        (dict(recent_saves=job().recent_saves[:3]), "last save aborted"),
        (dict(recent_restores=(RestoreRecord(T + 190, False, 1.0, "torn"),)),
         "last restore failed (torn)"),
    ],
)  # fmt: skip
def test_the_summary_says_what_is_wrong(change: dict, problem: str) -> None:
    from checkpoint_exporter.exposition.landing import summary_line, verdict

    judged = verdict(replace(healthy_job(), **change), T + 200)
    assert not judged.healthy and judged.problems == (problem,)
    line = summary_line(replace(healthy_job(), **change), T + 200)
    assert line.startswith('<li class="unhealthy">') and "NOT healthy" in line
    assert html_escape(problem) in line


def test_the_summary_notes_what_is_not_a_fault() -> None:
    from checkpoint_exporter.exposition.landing import verdict

    pending = healthy_job(generations=(committed(T + 170, valid=None),))
    assert verdict(pending, T + 200).healthy
    assert "validation pending" in verdict(pending, T + 200).notes
    never = healthy_job(recent_restores=(), restore_last_success=None)
    assert verdict(never, T + 200).healthy and "never restored" in verdict(never, T + 200).notes
    stale = healthy_job(restore_drill_max_age_seconds=30)
    assert "no restore tested in 30s" in verdict(stale, T + 200).notes
    diagnosed = healthy_job(
        recent_saves=(replace(job().recent_saves[3], symptoms=("contention",)),)
    )
    assert "last save: contention" in verdict(diagnosed, T + 200).notes


def test_the_page_opens_with_a_summary_per_job() -> None:
    page = render(Snapshot((healthy_job(name="a&b"), job(name="<c>"))), "/metrics")
    summary = page[page.index('<ul class="summary">') : page.index("</ul>")]
    assert summary.count("<li") == 2
    assert '<li class="healthy"><a href="#job-a%26b">a&amp;b</a>' in summary
    assert '<li class="unhealthy"><a href="#job-%3Cc%3E">&lt;c&gt;</a>' in summary
    assert "<c>" not in page and "a&b" not in page
    assert page.index('<ul class="summary">') < page.index('class="timeline"')
    assert "Symptoms:" in page and "ST straggler" in page


def test_a_job_whose_durable_tier_is_read_elsewhere_is_not_judged_on_it() -> None:
    """The cluster shape: a node-scope process knows a job on a shared tree from its spool
    alone. It has no durable generations for it; the shared scanners judge those."""
    from checkpoint_exporter.exposition.landing import summary_line, verdict

    shared = (WatchedPath(DURABLE, "/shared/j", scanned=False),)
    now = T + 200
    judged = verdict(healthy_job(paths=shared, generations=()), now)
    assert judged.healthy and judged.problems == ()
    assert judged.notes[0] == "newest checkpoint judged by the processes that read /shared/j"
    assert "last save ok (6s)" in judged.notes
    assert "NOT healthy" not in summary_line(healthy_job(paths=shared, generations=()), now)
    page = render(Snapshot((healthy_job(paths=shared, generations=()),)), "/metrics")
    assert "judged where the durable tier is read" in page and "none yet" not in page
    # What this process does see still counts: a late save is still a problem.
    late = healthy_job(paths=shared, generations=(), recent_saves=job().recent_saves[:2])
    assert verdict(late, now).problems == ("last save late (10s against a 8s deadline)",)
    # Staging read here, durable elsewhere: the same.
    two = (WatchedPath(DURABLE, "/shared/j", scanned=False), WatchedPath(STAGING, "/local/j"))
    assert verdict(healthy_job(paths=two, generations=()), now).healthy


# --- [pager]: what the page says agrees with what pages ---------------------------------------


def test_a_straggling_jobs_on_time_save_is_drawn_below_its_deadline() -> None:
    """Each phase is the slowest rank's: rank 0 staged for 4 s, rank 1 wrote for 5 s, so the
    phases add up to 10 s while the save took 7 s against an 8 s deadline. The bar is as tall as
    the save: under the deadline line, its title keeps the measured phases."""
    on_time = SaveRecord(500, T, T + 7, (("commit", 1.0), ("staging", 4.0), ("total", 7.0),
                                         ("write", 5.0)), "ok")  # fmt: skip
    svg = timeline_svg(job(recent_saves=(on_time,), recent_restores=()))
    deadline_y = float(re.search(r'class="deadline" x1="\d+" y1="([\d.]+)"', svg).group(1))
    tops = [float(v) for v in re.findall(r'class="phase-\w+" x="[\d.]+" y="([\d.]+)"', svg)]
    assert min(tops) > deadline_y  # SVG y grows downwards: every segment below the line
    assert "total 7.00 s, staging 4.00 s, write 5.00 s" in svg


def test_a_finished_job_is_not_unhealthy_for_its_age() -> None:
    from checkpoint_exporter.exposition.landing import verdict

    old = healthy_job(generations=(committed(T + 200 - 86400),), finished=True)
    judged = verdict(old, T + 200)
    assert judged.healthy and judged.notes[0] == "finished: nothing pages for it"
    assert verdict(healthy_job(generations=(), finished=True), T + 200).healthy


def test_a_failed_drill_is_told_from_a_failed_restart() -> None:
    from checkpoint_exporter.exposition.landing import verdict

    drill = healthy_job(recent_restores=(RestoreRecord(T + 190, False, 1.0, "torn", drill=True),))
    assert verdict(drill, T + 200).problems == ("last restore drill failed (torn)",)
