"""The golden /metrics: the reference snapshot (exposition/golden.py) rendered as a scrape, byte
for byte as committed in tests/exposition/golden/. A change to any metric's name, help, type,
labels or value formatting shows here as a diff; `make generate` rebuilds the files when the
change is meant."""

from __future__ import annotations

import difflib
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text

from checkpoint_exporter import __version__
from checkpoint_exporter.config import WebConfig
from checkpoint_exporter.exposition import golden
from checkpoint_exporter.exposition.collectors import ALL_SPECS, REGISTRY
from checkpoint_exporter.exposition.server import MetricsServer
from tests.conftest import REPO, require_tool

GOLDEN = REPO / "tests" / "exposition" / "golden"
REGENERATE = "make generate"  # python -m checkpoint_exporter.mixin.generate
FILES = sorted(golden.files())


def _committed(relative: str) -> str:
    path = REPO / relative
    assert path.exists(), f"{relative} is missing: run {REGENERATE}"
    return path.read_text()


@pytest.mark.parametrize("relative", FILES)
def test_a_scrape_of_the_reference_snapshot_is_the_golden_file(relative: str) -> None:
    committed, rendered = _committed(relative), golden.files()[relative]
    if rendered != committed:
        diff = "".join(
            difflib.unified_diff(
                committed.splitlines(True),
                rendered.splitlines(True),
                f"{relative} (committed)",
                f"{relative} (rendered now)",
            )
        )
        pytest.fail(
            f"the scrape changed:\n{diff}\nIf the change is meant, regenerate the golden files "
            f"with `{REGENERATE}` (python -m checkpoint_exporter.mixin.generate) and commit them "
            "with it.",
            pytrace=False,
        )


@pytest.fixture
def serve() -> Iterator:
    """The reference snapshot served by the real HTTP server on a loopback port."""
    servers: list[MetricsServer] = []

    def start(stem: str) -> str:
        renderer = golden.renderer(golden.SNAPSHOTS[stem]())
        server = MetricsServer(WebConfig("127.0.0.1:0"), renderer)
        server.start()
        servers.append(server)
        return f"http://127.0.0.1:{server.address.port}/metrics"

    yield start
    for server in servers:
        server.stop()


@pytest.mark.parametrize("relative", FILES)
def test_the_golden_file_is_what_metrics_serves(serve, relative: str) -> None:
    """Not a render beside the scrape's: the body /metrics sends for the format's Accept header,
    less only what golden.normalise replaces."""
    stem, suffix = Path(relative).name.split(".")
    request = urllib.request.Request(serve(stem), headers={"Accept": golden.FORMATS[suffix]})
    with urllib.request.urlopen(request, timeout=10) as reply:
        body = reply.read()
    assert golden.normalise(body).decode() == _committed(relative)


def _families(relative: str) -> dict[str, object]:
    parse = parse_openmetrics if relative.endswith(".openmetrics") else parse_text
    return {family.name: family for family in parse(_committed(relative))}


@pytest.mark.parametrize("suffix", sorted(golden.FORMATS))
def test_the_reference_snapshot_shows_every_metric_with_its_labels(suffix: str) -> None:
    """Every metric the exporter can export has a sample in the golden file, with the spec's
    type and labels: a new metric must be given a state in exposition/golden.py. Both files
    parse as their format (prometheus_client's parsers, the OpenMetrics one strict)."""
    families = _families(f"tests/exposition/golden/metrics.{suffix}")
    for spec in ALL_SPECS:
        name = spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name
        family = families.get(name)
        assert family is not None and family.samples, f"{spec.name}: no sample"
        assert family.type == spec.kind, spec.name
        assert family.documentation == spec.help, spec.name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == set(spec.labels), (spec.name, sample)
    unknown = set(families) - {
        spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name
        for spec in ALL_SPECS
    }
    assert not unknown, f"families without a spec (process_* and python_* must stay out): {unknown}"


@pytest.mark.prometheus
def test_promtool_lints_every_family_clean() -> None:
    """promtool's checks (names, units, counters' _total, HELP) over every family at once."""
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=_committed("tests/exposition/golden/metrics.prom"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def _success(relative: str) -> dict[str, float]:
    family = _families(relative)["checkpoint_exporter_scrape_collector_success"]
    return {sample.labels["collector"]: sample.value for sample in family.samples}


def test_every_collector_has_data_in_the_reference_snapshot_and_some_have_none_at_start() -> None:
    assert _success("tests/exposition/golden/metrics.prom") == dict.fromkeys(REGISTRY, 1.0)
    starting = _success("tests/exposition/golden/starting.prom")
    assert {name for name, ok in starting.items() if not ok} == {
        "disk",
        "filesystem",
        "gpu",
        "network",
    }


def test_normalising_replaces_the_versions_and_durations_only() -> None:
    """golden.normalise is the one place the golden files differ from a scrape: the build info's
    two version labels and each collector's measured duration. Every other line is untouched."""
    encoder = choose_encoder(golden.FORMATS["prom"])[0]
    raw = golden.renderer(golden.snapshot()).render(encoder)
    changed = [
        (before, after)
        for before, after in zip(raw.split(b"\n"), golden.normalise(raw).split(b"\n"), strict=True)
        if before != after
    ]
    build = [pair for pair in changed if pair[0].startswith(b"checkpoint_exporter_build_info{")]
    assert len(build) == 1
    assert f'version="{__version__}"'.encode() in build[0][0]
    assert build[0][1] == (
        b'checkpoint_exporter_build_info{python_version="(normalised)",version="(normalised)"} 1.0'
    )
    durations = [pair for pair in changed if pair not in build]
    assert durations and all(
        re.fullmatch(
            rb"checkpoint_exporter_scrape_collector_duration_seconds\{collector=\"\w+\"\} 0\.0",
            after,
        )
        and before.rsplit(b" ", 1)[0] == after.rsplit(b" ", 1)[0]
        for before, after in durations
    ), durations
    assert len(durations) <= len(REGISTRY)  # a duration that happened to be 0.0 is unchanged


@pytest.mark.slow
def test_generate_check_reports_a_stale_golden_file_and_generate_mends_it(tmp_path: Path) -> None:
    """`generate --check` (the suite's test_generated_files_are_current) names a stale golden file
    with its diff; `make generate` rewrites it."""
    for tree in ("docs", "alerts", "dashboards", "deploy", "tests/exposition/golden"):
        shutil.copytree(REPO / tree, tmp_path / tree)
    runbooks = "exporter/checkpoint_exporter/runbooks.md"
    (tmp_path / runbooks).parent.mkdir(parents=True)
    shutil.copy(REPO / runbooks, tmp_path / runbooks)
    stale = tmp_path / "tests/exposition/golden/metrics.prom"
    stale.write_text(stale.read_text().replace("Time to rescan one job.", "Time to scan a job."))
    command = [sys.executable, "-m", "checkpoint_exporter.mixin.generate", "--root", str(tmp_path)]

    check = subprocess.run([*command, "--check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "+++ tests/exposition/golden/metrics.prom (generated)" in check.stdout
    assert "+# HELP checkpoint_exporter_scan_duration_seconds Time to rescan one job." in (
        check.stdout
    )
    assert "1 generated file(s) are stale" in check.stderr

    assert subprocess.run(command, capture_output=True, timeout=120).returncode == 0
    assert stale.read_text() == _committed("tests/exposition/golden/metrics.prom")
