"""The load benchmark's smoke run: 50 concurrent scrapers for 10 s against a real exporter
tracking 200 jobs while saves continue. bench/ (`make bench`) runs it for 60 s and reports;
here it must answer every scrape, completely, while the saves go on."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

from load import report, run_load

pytestmark = [pytest.mark.daemon]


def test_fifty_scrapers_against_two_hundred_jobs_while_saving() -> None:
    result = run_load(seconds=10, scrapers=50, jobs=200, generations=3, warmup=2)
    print(report(result))
    assert result.errors == 0, result.first_error
    assert result.fewest_scrapes >= 1  # every scraper got answers, not just a lucky few
    assert result.saves >= 20  # the snapshot kept changing under the scrapers
    assert result.rss_max_mb > 0
