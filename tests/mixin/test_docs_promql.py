"""The PromQL written in docs/metrics.md, evaluated by promtool over the article's example."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, require_tool

pytestmark = [pytest.mark.prometheus]


def documented(name: str) -> str:
    text = (REPO / "docs" / "metrics.md").read_text()
    match = re.search(
        rf"<!-- BEGIN GENERATED: promql {name} .*?-->\n```promql\n(.*?)```", text, re.S
    )
    assert match, f"docs/metrics.md has no promql block {name!r}"
    return match.group(1)


def test_capacity_expressions_match_the_worked_example(tmp_path: Path) -> None:
    fs = (
        'job="checkpoint-exporter",instance="node1",mountpoint="/mnt/ckpt",'
        'device="filer:/ckpt",fstype="nfs4"'
    )
    series = [
        {"series": f"checkpoint_filesystem_size_bytes{{{fs}}}", "values": "2.156e13"},
        # Three retained generations of four jobs are on disk: 21.56 - 12.936 TB left.
        {"series": f"checkpoint_filesystem_avail_bytes{{{fs}}}", "values": "8.624e12"},
        {"series": f"checkpoint_filesystem_reserve_ratio{{{fs}}}", "values": "0.2"},
    ]
    for job in ("a", "b", "c", "d"):
        labels = f'job="checkpoint-exporter",instance="node1",training_job="{job}"'
        placed = f'{labels},tier="durable",mountpoint="/mnt/ckpt"'
        series += [
            {"series": f"checkpoint_last_committed_size_bytes{{{labels}}}", "values": "1.078e12"},
            {"series": f"checkpoint_retained_generations_limit{{{labels}}}", "values": "3"},
            {"series": f"checkpoint_job_filesystem_info{{{placed}}}", "values": "1"},
        ]
    fit, footprint = "job:checkpoint_generations_that_fit:count", "mountpoint:checkpoint_peak:ratio"
    rules = tmp_path / "rules.yaml"
    recorded = [
        {"record": fit, "expr": documented("generations_that_fit")},
        {"record": footprint, "expr": documented("peak_footprint_ratio")},
    ]
    rules.write_text(yaml.safe_dump({"groups": [{"name": "docs", "rules": recorded}]}))
    expected_fit = [{"labels": f'{fit}{{training_job="{j}"}}', "value": 4} for j in "abcd"]
    expected_footprint = [
        {"labels": f'{footprint}{{instance="node1",mountpoint="/mnt/ckpt"}}', "value": 1}
    ]
    unit_test = {
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            {"expr": fit, "eval_time": "0m", "exp_samples": expected_fit},
            {"expr": footprint, "eval_time": "0m", "exp_samples": expected_footprint},
        ],
    }
    test = tmp_path / "test.yaml"
    test.write_text(
        yaml.safe_dump(
            {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [unit_test]}
        )
    )
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", str(test)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
