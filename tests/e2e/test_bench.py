"""Smoke versions of the benchmarks (bench/): each runs small and gives sane numbers.

No timing is asserted here (speed targets live in ``make bench`` and docs/performance.md); what
is asserted is that every benchmark measures what it says: the scrape bodies agree, the scan
finds every file, every commit is detected, and a save costs its new files, not the whole tree.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import require_tool

pytestmark = [pytest.mark.prometheus, pytest.mark.daemon]

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import detect  # noqa: E402
import metadata  # noqa: E402
import objects  # noqa: E402
import rules  # noqa: E402
import scan  # noqa: E402
import scrape  # noqa: E402
from tree import Shape  # noqa: E402


def test_scrape_smoke_measures_both_renderers_and_the_node_exporter_anchor() -> None:
    rows = scrape.bench_scrape([3], scrapes=5, count=2)
    assert [row["render"] for row in rows] == list(scrape.MODES)
    by_mode = {row["render"]: row for row in rows}
    # The cached render is the same exposition as prometheus_client's.
    assert by_mode["unchanged"]["series"] == by_mode["prometheus_client"]["series"] > 100
    for row in rows:
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["us_per_series"] > 0
    require_tool("prometheus-node-exporter")
    anchor = scrape.bench_node_exporter(scrapes=5)
    assert anchor is not None and anchor["series"] > 0 and anchor["p50_ms"] > 0


def test_scan_smoke_reads_every_file_and_measures_the_idle_daemon(tmp_path: Path) -> None:
    shape = Shape(jobs=3, generations=2, shards=5)
    cold, idle = scan.bench_scan((shape,), idle_seconds=2, scrapes=5, workdir=tmp_path)
    assert cold[0]["files"] == shape.files == 36
    assert cold[0]["find_s"] > 0 and cold[0]["exporter_read_s"] > 0
    assert [row["mode"] for row in idle] == ["poll", "inotify"]
    for row in idle:
        assert row["files"] == 36
        assert row["cpu_s_per_hour"] >= 0 and 10 < row["rss_mb"] < 1000
    assert idle[1]["scrape_p50_ms"] > 0 and idle[1]["series"] > 0
    assert list(tmp_path.iterdir()) == []  # the trees are removed


@pytest.mark.parametrize(
    ("mode", "commits", "poll", "writer"),
    [
        ("inotify", 5, 1.0, "dcp"),
        ("poll", 3, 1.0, "dcp"),
        ("inotify", 5, 1.0, "pointer"),
        ("poll", 3, 1.0, "pointer"),
    ],
)
def test_detect_smoke_sees_every_commit(mode: str, commits: int, poll: float, writer: str) -> None:
    row = detect.bench_detect(mode, commits, poll, writer)
    assert row["commits"] == commits
    assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]


def test_metadata_smoke_a_save_costs_its_new_files_not_the_tree() -> None:
    small, large = (
        metadata.bench_metadata_run("inotify", "inotify", False, 10_000, ranks=256, retained=n)
        for n in (2, 16)
    )
    assert large["files_already_there"] - small["files_already_there"] == 14 * 257
    # 14 more generations (3,598 more files) cost the same save only the per-pass lstat of
    # their directories: the descent is gated by directory mtimes, so a save is O(new files).
    assert large["operations"] - small["operations"] < 0.5 * 14 * 257
    assert small["operations"] >= 2 * 257  # each new file statted when it appears and at commit


# Generation-derived series: only the shared scanners export them; the spool's clocks and the
# window telemetry: only the nodes.
FROM_THE_TREE = ("checkpoint_last_committed_timestamp_seconds", "checkpoint_retained_generations")
FROM_THE_NODE = (
    "checkpoint_last_save_local_write_end_timestamp_seconds",
    "checkpoint_last_save_gpu_utilization_ratio",
)


def _families(lines: list[str]) -> set[str]:
    return {line.partition("{")[0].partition(" ")[0] for line in lines}


def test_rules_smoke_the_fleet_shape_every_series_and_every_group() -> None:
    node, shared = rules.exposition(3, "node"), rules.exposition(3, "shared")
    assert not _families(node) & set(FROM_THE_TREE) and set(FROM_THE_NODE) <= _families(node)
    assert set(FROM_THE_TREE) <= _families(shared) and not _families(shared) & set(FROM_THE_NODE)
    # The deadline account is the shared scanners': the total phase's histogram, 11 buckets a
    # job; the nodes export none.
    assert rules.bucket_lines(node) == 0 and rules.bucket_lines(shared) == 3 * 11

    everything, one_job = (
        rules.bench_rules(4, 3, targets=2, evaluation_interval=1, rounds=2, ingest=ingest,
                          jobs_per_node=per_node)
        for ingest, per_node in (("everything", None), ("node series the rules read", 1))
    )  # fmt: skip
    assert set(everything["rule_groups_seconds"]) == {
        f"checkpoint-exporter.{scope}.{kind}"
        for scope in ("node", "job")
        for kind in ("daily", "rules", "alerts")
    }
    assert all(seconds > 0 for seconds in everything["rule_groups_seconds"].values())
    # Every node and both replicas were ingested.
    assert everything["head_series"] >= 4 * len(node) + rules.REPLICAS * len(shared)
    assert everything["jobs_per_node"] == 3 and one_job["jobs_per_node"] == 1
    # A node that knows one job exports a third of the per-job series, and the relabelling
    # keeps only what the rules read of them.
    one = rules.exposition(1, "node")
    assert one_job["series_per_node"] == len(one) < len(node)
    kept = rules.kept_names(one, "node series the rules read")
    assert one_job["series_kept_per_node"] == sum(1 for line in one if rules._name(line) in kept)
    assert one_job["head_series"] < everything["head_series"]
    assert everything["prometheus_rss_mb"] > 0 and everything["exposition_mb"] > 0


def test_objects_smoke_counts_the_requests_of_a_listing_and_of_idle_jobs() -> None:
    """Against moto: the cold read lists the root once and each generation once (one page of
    1,000 keys each), the next read the same (its generations seal when two listings agree),
    then every read is one LIST and one LIST_UPLOADS; idle jobs polled every 30 s make exactly
    that each poll, every minute alike."""
    result = objects.bench_objects(generations=3, jobs=4, minutes=2)
    listing, idle = result["listing"], result["idle"]
    assert (listing["objects"], listing["generations"], listing["layout"]) == (3000, 3, "dcp")
    assert listing["cold_requests"] == {"list": 1 + 3, "list_uploads": 1}
    assert listing["second_requests"] == listing["cold_requests"]
    assert listing["idle_requests_per_read"] == 2
    polls = 4 * 2 * 2  # jobs x polls a minute x minutes
    assert idle["requests"] == {"list": polls, "list_uploads": polls}
    assert idle["min_per_minute"] == idle["max_per_minute"] == idle["expected_per_minute"] == 16
    assert idle["cpu_seconds_per_minute"] > 0
