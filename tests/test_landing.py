"""The landing page's timelines, drawn from a snapshot: bars, deadline line, failure marks."""

from __future__ import annotations

import math
import re

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
        T,
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
    page = render(Snapshot(T, (hostile_job(value), job()), filesystems=(filesystem,)), "/metrics")
    assert page.count('<svg xmlns="http://www.w3.org/2000/svg" class="timeline"') == 2
    assert "cannot be drawn" not in page  # the per-job fallback was not needed
    assert page.rstrip().endswith("</html>")


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**40), 10**40))
def test_any_number_anywhere_renders(value: float) -> None:
    page = render(Snapshot(T, (hostile_job(value),)), "/metrics")
    assert "cannot be drawn" not in page and "</svg>" in page


def test_one_undrawable_job_does_not_take_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    from checkpoint_exporter.exposition import landing

    def broken(job: JobState) -> str:
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(landing, "timeline_svg", broken)
    page = render(Snapshot(T, (job(name="a"), job(name="b"))), "/metrics")
    assert page.count("cannot be drawn") == 2 and page.rstrip().endswith("</html>")


def test_the_page_says_when_the_first_pass_is_not_finished() -> None:
    from checkpoint_exporter.model import DaemonState

    first_scans = (
        ("a", "durable", True, 10),
        ("a", "staging", False, 3),
        ("b", "durable", False, 0),
    )
    starting = Snapshot(T, (job(),), DaemonState(ready=False, first_scans=first_scans))
    page = render(starting, "/metrics")
    assert "starting: first pass not finished (1 of 3 tiers)" in page
    assert 'href="/runbooks"' in page and 'href="/readyz"' in page
    ready = Snapshot(T, (job(),), DaemonState(ready=True, first_scans=first_scans))
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
