"""Benchmarks: ``make bench``. Prints a table per benchmark, writes bench/results/<name>.json and
the tables of the benchmarks that ran into docs/performance.md (between its bench markers).

  scrape    /metrics p50/p99 at 10, 200 and 1,000 jobs; node_exporter as the anchor (scrape.py)
  scan      cold scan of 1,000,000 files against find; idle CPU and RSS at 10k and 1M files,
            polling and inotify; scrapes over both trees (scan.py)
  detect    commit marker written -> visible in /metrics, 100 commits, inotify and polling,
            a marker renamed into place (DCP) and a pointer rewritten in place (DeepSpeed)
  metadata  metadata operations while a 4,096-rank save runs (metadata.py)
  sampler   telemetry sampler CPU at 1 Hz: 8 NICs, 4 IB ports, 8 GPUs (sampler.py)
  load      50 concurrent scrapers for 60 s, 200 jobs, saves continuing (load.py)
  rules     the split rules evaluated by Prometheus over 2,048 node-scope exporters x 16 jobs
            and two shared-scope replicas (rules.py)
  objects   an s3:// job of 100,000 objects (cold read, idle reads) and 100 idle s3:// jobs
            polled every 30 s, requests per minute; against moto on 127.0.0.1 (objects.py)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO)]

from checkpoint_exporter import __version__  # noqa: E402

RESULTS = HERE / "results"
DOC = REPO / "docs" / "performance.md"
BENCHMARKS = (
    "scrape", "scan", "idle", "detect", "metadata", "sampler", "load", "rules", "objects",
)  # fmt: skip


def machine() -> dict[str, object]:
    model = ""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        model = re.search(r"model name\s*:\s*(.*)", cpuinfo).group(1)  # type: ignore[union-attr]
    except (OSError, AttributeError):
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": model or platform.processor() or platform.machine(),
        "cores": os.cpu_count(), "memory_gib": round(memory, 1),
        "kernel": platform.release(), "python": platform.python_version(),
        "version": __version__, "date": time.strftime("%Y-%m-%d"),
    }  # fmt: skip


def _write(name: str, data: object) -> None:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), "results": data}, indent=2) + "\n")
    print(f"wrote {path.relative_to(REPO)}", file=sys.stderr)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _ms(value: object) -> str:
    return f"{float(value):.2f}"  # type: ignore[arg-type]


def run_scrape(args: argparse.Namespace) -> str:
    from scrape import bench_node_exporter, bench_scrape

    rows = bench_scrape(args.jobs, args.scrapes, 10)
    anchor = bench_node_exporter(args.scrapes)
    if anchor is not None:
        rows.append(anchor)
    _write("scrape", rows)
    return _table(
        ["jobs", "render", "series", "bytes", "p50 ms", "p99 ms", "us/series"],
        [[str(r["jobs"] or "-"), str(r["render"]), str(r["series"]), str(r["bytes"]),
          _ms(r["p50_ms"]), _ms(r["p99_ms"]), _ms(r["us_per_series"])] for r in rows],
    )  # fmt: skip


def run_scan(args: argparse.Namespace) -> str:
    from scan import LARGE, SMALL, bench_scan

    cold, idle = bench_scan((SMALL, LARGE), args.idle_seconds, args.scrapes)
    _write("scan", {"cold": cold, "idle": idle})
    cold_table = _table(
        ["files", "find s", "exporter s", "ratio", "us/file"],
        [[f"{r['files']:,}", f"{r['find_s']:.2f}", f"{r['exporter_read_s']:.2f}",
          f"{r['ratio']:.2f}", f"{r['us_per_file']:.2f}"] for r in cold],
    )  # fmt: skip
    idle_table = _table(
        ["files", "mode", "start to port s", "start to all jobs s", "idle CPU s/h",
         "reconcile CPU s/h", "% of a core", "RSS MB", "scrape p50 ms", "scrape p99 ms"],
        [[f"{r['files']:,}", str(r["mode"]), f"{r['start_to_port_s']:.2f}",
          f"{r['first_scan_to_metrics_s']:.1f}",
          f"{r['cpu_s_per_hour']:.1f}", f"{r['reconcile_cpu_s_per_hour']:.2f}",
          f"{r['core_percent']:.2f}", f"{r['rss_mb']:.0f}",
          _ms(r["scrape_p50_ms"]) if r["mode"] == "inotify" else "-",
          _ms(r["scrape_p99_ms"]) if r["mode"] == "inotify" else "-"] for r in idle],
    )  # fmt: skip
    return f"Cold scan\n\n{cold_table}\n\nIdle\n\n{idle_table}"


def run_detect(args: argparse.Namespace) -> str:
    from detect import bench_detect

    rows = [
        bench_detect(mode, args.commits, 1.0, writer)
        for writer in ("dcp", "pointer")
        for mode in ("inotify", "poll")
    ]
    _write("detect", rows)
    return _table(
        ["commit marker", "watch", "commits", "p50 ms", "p99 ms", "max ms", "target p99 ms"],
        [[".metadata renamed" if r["writer"] == "dcp" else "`latest` rewritten in place",
          str(r["mode"]) + (f" every {r['poll_interval_s']:g} s" if r["poll_interval_s"] else ""),
          str(r["commits"]), f"{r['p50_ms']:.0f}", f"{r['p99_ms']:.0f}", f"{r['max_ms']:.0f}",
          f"{r['target_p99_ms']:.0f}"] for r in rows],
    )  # fmt: skip


def run_idle(args: argparse.Namespace) -> str:
    from idle import bench_idle

    rows = bench_idle()
    _write("idle", rows)
    return _table(
        ["jobs", "mode", "poll interval", "start to port s", "start to all jobs s", "idle CPU s/h",
         "% of a core", "RSS MB", "vs fewest jobs"],
        [[f"{r['jobs']:,}", r["mode"], r["poll_interval"] or "-", f"{r['start_to_port_s']:.2f}",
          f"{r['start_to_all_jobs_s']:.2f}", f"{r['cpu_s_per_hour']:.1f}",
          f"{r['core_percent']:.2f}", f"{r['rss_mb']:.0f}",
          f"{r['ratio_to_fewest']:.2f}x" if "ratio_to_fewest" in r else ""] for r in rows],
    )  # fmt: skip


def run_metadata(args: argparse.Namespace) -> str:
    from metadata import bench_metadata

    rows = bench_metadata(args.ranks)
    _write("metadata", rows)
    return _table(
        ["run", "new files", "files already there", "operations", "per new file",
         "ops/s during the save", "save to valid s", "budget ops/s", "first scan s"],
        [[str(r["run"]), str(r["ranks"] + 1), str(r["files_already_there"]),
          f"{r['operations']:.0f}", f"{r['operations_per_new_file']:.2f}",
          f"{r['ops_per_second_during_save']:.0f}", f"{r['save_to_valid_s']:.1f}",
          str(r["budget_ops_per_second"] or "-"), f"{r['first_scan_s']:.1f}"] for r in rows],
    )  # fmt: skip


def run_sampler(args: argparse.Namespace) -> str:
    from sampler import bench_sampler

    row = bench_sampler()
    _write("sampler", row)
    return _table(
        ["NICs", "IB ports", "GPUs", "counters", "CPU ms/sample", "CPU s/h at 1 Hz", "% of a core"],
        [[str(row["nics"]), str(row["ib_ports"]), str(row["gpus"]), str(row["series_sampled"]),
          f"{row['cpu_ms_per_sample']:.3f}", f"{row['cpu_seconds_per_hour_at_1hz']:.2f}",
          f"{row['core_percent_at_1hz']:.3f}"]],
    )  # fmt: skip


def run_load(args: argparse.Namespace) -> str:
    from load import as_dict, run_load

    result = run_load(args.load_seconds, args.load_scrapers, args.load_jobs)
    _write("load", as_dict(result))
    return _table(
        ["scrapers", "seconds", "jobs", "saves", "scrapes", "errors", "scrapes/s", "p50 ms",
         "p99 ms", "max ms", "RSS MB start -> end (max)"],
        [[str(result.scrapers), f"{result.seconds:.0f}", str(result.jobs), str(result.saves),
          str(result.scrapes), str(result.errors), f"{result.scrapes_per_second:.0f}",
          f"{result.p50_ms:.1f}", f"{result.p99_ms:.1f}", f"{result.max_ms:.0f}",
          f"{result.rss_start_mb:.0f} -> {result.rss_end_mb:.0f} ({result.rss_max_mb:.0f})"]],
    )  # fmt: skip


def run_rules(args: argparse.Namespace) -> str:
    from rules import REPLICAS, bench_rules, metadata_walkers

    rows = [
        bench_rules(args.nodes, 16, ingest=ingest, jobs_per_node=per_node or None)
        for per_node in args.rules_jobs_per_node
        for ingest in args.rules_ingest
    ]
    metadata = RESULTS / "metadata.json"
    walkers = (
        metadata_walkers(json.loads(metadata.read_text())["results"], args.nodes, REPLICAS)
        if metadata.exists()
        else None
    )
    _write("rules", {"rows": rows, "metadata_walkers": walkers})
    groups = sorted({name for row in rows for name in row["rule_groups_seconds"]})
    table = _table(
        ["nodes x jobs", "jobs a node knows", "kept of the nodes' series", "series/node",
         "series/replica",
         "head series", "MB per scrape round", "scrape s/target",
         *[f"{name} eval s, median (max)" for name in groups], "Prometheus RSS MB"],
        [[f"{row['nodes']} x {row['jobs']}", str(row["jobs_per_node"]), str(row["ingest"]),
          f"{row['series_kept_per_node']} of {row['series_per_node']}",
          str(row["series_per_replica"]), f"{row['head_series']:,.0f}",
          f"{row['exposition_mb']:.0f}", f"{row['scrape_seconds_per_target']:.1f}",
          *[f"{row['rule_groups_seconds'][name]:.2f} ({row['rule_groups_max_seconds'][name]:.2f})"
            for name in groups],
          f"{row['prometheus_rss_mb']:.0f}"] for row in rows],
    )  # fmt: skip
    notes = [
        f"Slowest rules, {row['jobs_per_node']} jobs a node, {row['ingest']} (seconds per "
        "evaluation): "
        + ", ".join(f"{name} {seconds:.2f}" for name, seconds in row["slowest_rules"])
        for row in rows
    ]
    if walkers is not None:
        notes.append(
            "Metadata operations on the shared filesystem, computed (the metadata bench's "
            f"polled NFS save, {walkers['operations_per_save_per_walker']:,.0f} operations at "
            f"{walkers['ops_per_second_per_walker']:,.0f}/s per walker, times the walkers): "
            f"every node walking the tree, {walkers['walkers_before']:,} walkers, "
            f"{walkers['ops_per_second_before']:,.0f}/s during a save; the shard's "
            f"{walkers['walkers_after']} replicas, {walkers['ops_per_second_after']:,.0f}/s."
        )
    return table + "\n\n" + "\n\n".join(notes)


def _requests(spent: dict[str, int]) -> str:
    return ", ".join(f"{n} {operation.upper()}" for operation, n in sorted(spent.items()))


def run_objects(args: argparse.Namespace) -> str:
    from objects import bench_objects

    result = bench_objects(args.object_generations, args.object_jobs, args.object_minutes)
    _write("objects", result)
    listing, idle = result["listing"], result["idle"]
    listing_table = _table(
        ["objects", "generations", "cold read s", "cold read CPU s", "cold read requests",
         "second read requests", "idle read requests", "idle read ms", "layout parse s",
         "request cap per read"],
        [[f"{listing['objects']:,}", str(listing["generations"]), f"{listing['cold_seconds']:.1f}",
          f"{listing['cold_cpu_seconds']:.1f}", _requests(listing["cold_requests"]),
          _requests(listing["second_requests"]), f"{listing['idle_requests_per_read']:g}",
          f"{listing['idle_ms_per_read']:.0f}", f"{listing['layout_parse_seconds']:.2f}",
          f"{listing['max_requests_per_read']:,}"]],
    )  # fmt: skip
    idle_table = _table(
        ["jobs", "generations each", "poll interval s", "minutes", "LIST/min", "LIST_UPLOADS/min",
         "requests/min (min-max of each minute)", "expected/min", "exporter CPU s/min",
         "% of a core"],
        [[str(idle["jobs"]), str(idle["generations_per_job"]), f"{idle['poll_interval_s']:g}",
          f"{idle['minutes']:g}", f"{idle['list_per_minute']:.0f}",
          f"{idle['list_uploads_per_minute']:.0f}",
          f"{idle['requests_per_minute']:.0f} ({idle['min_per_minute']}-{idle['max_per_minute']})",
          f"{idle['expected_per_minute']:.0f}", f"{idle['cpu_seconds_per_minute']:.2f}",
          f"{idle['core_percent']:.2f}"]],
    )  # fmt: skip
    return f"Listing 100,000 objects\n\n{listing_table}\n\nIdle requests per minute\n\n{idle_table}"


RUNNERS: dict[str, Callable[[argparse.Namespace], str]] = {
    "scrape": run_scrape, "scan": run_scan, "idle": run_idle, "detect": run_detect,
    "metadata": run_metadata, "sampler": run_sampler, "load": run_load, "rules": run_rules,
    "objects": run_objects,
}  # fmt: skip


def write_doc(tables: dict[str, str]) -> None:
    """Replace the sections of the benchmarks that ran; the others keep their last results."""
    text = DOC.read_text()
    begin, end = "<!-- bench:begin -->", "<!-- bench:end -->"
    before, _, rest = text.partition(begin)
    block, _, after = rest.partition(end)
    sections = {}
    for part in block.split("\n### ")[1:]:
        name, _, table = part.partition("\n\n")
        sections[name.strip()] = table.strip()
    sections.update(tables)
    m = machine()
    header = (
        f"Last measured {m['date']} by `make bench` (checkpoint-exporter {m['version']}) on "
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}."
    )
    parts = [f"### {name}\n\n{sections[name]}" for name in BENCHMARKS if name in sections]
    DOC.write_text(f"{before}{begin}\n{header}\n\n" + "\n\n".join(parts) + f"\n{end}{after}")
    print(f"wrote {DOC.relative_to(REPO)}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=BENCHMARKS, nargs="+", default=list(BENCHMARKS))
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--jobs", type=int, nargs="+", default=[10, 200, 1000])
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--commits", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--load-seconds", type=float, default=60)
    parser.add_argument("--load-scrapers", type=int, default=50)
    parser.add_argument("--load-jobs", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=2048)
    parser.add_argument(
        "--rules-ingest",
        nargs="+",
        default=["everything"],
        help="what Prometheus keeps of the nodes' series, one rules row each (bench/rules.py): "
        "everything, or 'node series the rules read'",
    )
    parser.add_argument(
        "--rules-jobs-per-node", nargs="+", type=int, default=[1, 0],
        help="the jobs each node's exporter knows from its spool, one rules row each; 0 for "
        "every job on every node (the worst case)",
    )  # fmt: skip
    parser.add_argument("--object-generations", type=int, default=100)  # x 1,000 objects
    parser.add_argument("--object-jobs", type=int, default=100)
    parser.add_argument("--object-minutes", type=float, default=5)
    args = parser.parse_args()
    tables = {}
    for name in args.only:
        print(f"\n== {name} ==", file=sys.stderr)
        started = time.monotonic()
        tables[name] = RUNNERS[name](args)
        print(f"\n{name} ({time.monotonic() - started:.0f} s)\n{tables[name]}", flush=True)
    write_doc(tables)


if __name__ == "__main__":
    main()
