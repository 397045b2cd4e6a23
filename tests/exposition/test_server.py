"""The real `serve` process over loopback HTTP: endpoints, promtool, signals, exit statuses."""

from __future__ import annotations

import gzip
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CLI, parse_samples, require_tool, run_cli, write_config

pytestmark = [pytest.mark.prometheus, pytest.mark.daemon]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "ckpt" / "llama70b").mkdir(parents=True)
    (tmp_path / "stage" / "llama70b").mkdir(parents=True)
    (tmp_path / "ckpt" / "m<&>").mkdir()
    return write_config(
        tmp_path,
        """
defaults: {interval: 15m, deadline: 60s}
jobs:
  - {name: llama70b, path: ckpt/llama70b, staging: stage/llama70b, deadline: 45s, layout: dcp}
  - {name: mixtral, path: "ckpt/m<&>", retained_generations: 5}
""",
    )


def ready(served):
    """The exporter once /readyz says its first pass is done (the port opens before it)."""
    deadline = time.monotonic() + 30
    while (reply := served.get("/readyz")).status != 200:
        assert reply.status == 503 and time.monotonic() < deadline, reply
        time.sleep(0.05)
    return served


def test_metrics_reflect_the_config(exporter, config: Path, tmp_path: Path) -> None:
    served = ready(exporter("--config.file", str(config)))
    reply = served.get("/metrics")
    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    got = parse_samples(reply.text)
    assert got['checkpoint_deadline_seconds{training_job="llama70b"}'] == 45
    assert got['checkpoint_interval_seconds{training_job="llama70b"}'] == 900
    assert got['checkpoint_retained_generations_limit{training_job="mixtral"}'] == 5
    assert got['checkpoint_restore_drill_max_age_seconds{training_job="llama70b"}'] == 604800
    durable = tmp_path / "ckpt" / "llama70b"
    staging = tmp_path / "stage" / "llama70b"
    assert (
        got[
            f'checkpoint_job_info{{layout="dcp",path="{durable}",tier="durable",training_job="llama70b"}}'
        ]
        == 1
    )
    assert (
        got[
            f'checkpoint_job_info{{layout="dcp",path="{staging}",tier="staging",training_job="llama70b"}}'
        ]
        == 1
    )
    assert got['checkpoint_exporter_scrape_collector_success{collector="jobs"}'] == 1
    assert 'checkpoint_exporter_scrape_collector_duration_seconds{collector="jobs"}' in got
    assert any(name.startswith("checkpoint_exporter_build_info{") for name in got)
    # The exporter's own process and Python metrics are on by default, as in node_exporter.
    assert got["process_resident_memory_bytes"] > 0
    assert any(name.startswith("python_gc_objects_collected_total{") for name in got)


def test_promtool_accepts_the_exposition(exporter, config: Path) -> None:
    body = exporter("--config.file", str(config)).get("/metrics").body
    result = subprocess.run(
        [require_tool("promtool"), "check", "metrics"], input=body, capture_output=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_openmetrics_and_gzip(exporter, config: Path) -> None:
    served = exporter("--config.file", str(config))
    reply = served.get("/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
    assert reply.text.rstrip().endswith("# EOF")
    zipped = served.get("/metrics", {"Accept-Encoding": "gzip"})
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert b"checkpoint_deadline_seconds" in gzip.decompress(zipped.body)


def test_landing_page_health_and_404(exporter, config: Path) -> None:
    served = ready(exporter("--config.file", str(config)))
    page = served.get("/")
    assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "llama70b" in page.text and 'href="/metrics"' in page.text
    assert "m&lt;&amp;&gt;" in page.text and "m<&>" not in page.text  # escaped, never injected
    assert "Python" not in page.headers.get("Server", "")
    assert served.get("/healthz").text == "ok\n"
    assert served.get("/nothing-here").status == 404


def test_exporter_metrics_flags_and_collector_flags(exporter, config: Path) -> None:
    served = ready(
        exporter(
            "--config.file",
            str(config),
            "--web.disable-exporter-metrics",
            "--no-collector.jobs",
            "--web.telemetry-path",
            "/custom",
        )
    )
    text = served.get("/custom").text
    assert not re.search(r"^(# [A-Z]+ )?(process|python)_", text, re.M)
    assert "checkpoint_deadline_seconds{" not in text  # the jobs collector is disabled
    assert 'checkpoint_exporter_scrape_collector_success{collector="jobs"}' not in text
    assert 'checkpoint_exporter_scrape_collector_success{collector="checkpoints"} 1.0' in text
    assert served.get("/metrics").status == 404
    # The old switch is still accepted (the contract never removes a flag): it does nothing but
    # say so, since the metrics it used to turn on are on by default.
    old = exporter(
        "--config.file", str(config), "--web.enable-exporter-metrics", "--path.rootfs", "/host"
    )
    assert "process_resident_memory_bytes" in old.metrics()
    assert any("--web.enable-exporter-metrics is deprecated" in line for line in old.log)
    assert any("--path.rootfs is deprecated" in line for line in old.log)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stops_cleanly_on_a_signal(exporter, config: Path, signum: int) -> None:
    served = exporter("--config.file", str(config))
    assert served.get("/metrics").status == 200
    code, _ = served.stop(signum)  # a hung exit fails in stop(): its wait has a timeout
    assert code == 0


def test_serves_without_a_config_file(exporter) -> None:
    served = exporter()
    text = served.get("/metrics").text
    assert 'checkpoint_exporter_scrape_collector_success{collector="jobs"} 1.0' in text
    assert "No training jobs are configured" in served.get("/").text


def test_port_in_use_is_a_runtime_failure(config: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("--config.file", str(config), "--web.listen-address", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert "cannot listen on" in result.stderr


def test_bad_config_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    path = write_config(tmp_path, "jobs: [{name: a, path: file}]\n")  # a file, not a directory
    result = run_cli("serve", "--config.file", str(path))
    assert result.returncode == 2 and "jobs[0].path" in result.stderr


def test_bad_flags_are_usage_errors(tmp_path: Path) -> None:
    assert run_cli("serve", "--web.listen-address", "nonsense").returncode == 2
    assert run_cli("serve", "--no-such-flag").returncode == 2
    assert run_cli("serve", "--web.telemetry-path", "metrics").returncode == 2


def test_version_and_module_entry_point() -> None:
    from checkpoint_exporter import __version__

    console_script = str(Path(sys.executable).parent / "checkpoint-exporter")
    for command in ([*CLI, "--version"], [console_script, "--version"]):
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0
        assert result.stdout.strip() == f"checkpoint-exporter {__version__}"


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"),
    [
        ("gzip", True),
        ("gzip;q=0", False),
        ("GZIP ; Q=0.000", False),
        ("gzip;q=0.5, identity", True),
        ("identity, gzip;q=0", False),
        ("*;q=0", False),
        ("*", True),
        ("gzip;q=0, *", False),  # gzip named: the wildcard does not bring it back
        ("x-gzip", True),
        ("gzip;q=nonsense", False),
        ("gzip;q=2", False),
        ("deflate, br", False),
        ("", False),
    ],
)
def test_gzip_negotiation_honours_quality_values(accept_encoding: str, gzipped: bool) -> None:
    from checkpoint_exporter.exposition.server import gzip_accepted

    assert gzip_accepted(accept_encoding) is gzipped


def test_gzip_q0_is_not_gzipped(exporter, config: Path) -> None:
    served = exporter("--config.file", str(config))
    refused = served.get("/metrics", {"Accept-Encoding": "gzip;q=0"})
    assert "Content-Encoding" not in refused.headers
    assert b"checkpoint_deadline_seconds" in refused.body
    wildcard = served.get("/metrics", {"Accept-Encoding": "*;q=0.5"})
    assert wildcard.headers["Content-Encoding"] == "gzip"


def _raw_exchange(base: str, request: bytes) -> bytes:
    """Everything the server sends back on one connection, until it closes or goes quiet."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(request)
        connection.settimeout(3)
        received = b""
        try:
            while chunk := connection.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return received


@pytest.mark.parametrize(
    "framing",
    [
        "Content-Length: {length}\r\n",
        "Transfer-Encoding: chunked\r\n",
    ],
)
def test_a_get_body_is_never_read_as_a_second_request(exporter, framing: str) -> None:
    """A body on GET used to be left in the stream and parsed as the next request (here a
    request for /smuggled, answered 404 on the same connection). It is refused now."""
    served = exporter()
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    body = (
        smuggled
        if "Content-Length" in framing
        else b"%x\r\n%s\r\n0\r\n\r\n" % (len(smuggled), smuggled)
    )
    head = f"GET /metrics HTTP/1.1\r\nHost: x\r\n{framing.format(length=len(smuggled))}\r\n"
    received = _raw_exchange(served.base, head.encode() + body)
    assert received.startswith(b"HTTP/1.1 400 "), received[:200]
    assert received.count(b"HTTP/1.1 ") == 1, received  # one answer, then the connection closed
    assert b"Connection: close" in received
    # An empty body is no body.
    received = _raw_exchange(
        served.base,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    assert received.startswith(b"HTTP/1.1 200 ") and received.endswith(b"ok\n")


def test_listen_backlog_holds_a_burst_of_connections(exporter) -> None:
    """socketserver's default backlog of 5 dropped the 7th SYN of a burst while the server was
    busy. The exporter is stopped (SIGSTOP) so nothing is accepted; 200 connections must all
    complete their handshake into the kernel's accept queue (at least 128 needed)."""
    served = exporter()
    host, port = served.base.removeprefix("http://").rsplit(":", 1)
    sockets: list[socket.socket] = []
    served.process.send_signal(signal.SIGSTOP)
    try:
        for _ in range(200):
            pending = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            pending.setblocking(False)
            pending.connect_ex((host, int(port)))
            sockets.append(pending)
        connected: set[int] = set()
        deadline = time.monotonic() + 3  # a dropped SYN is retransmitted only after 1 s, 3 s...
        while len(connected) < len(sockets) and time.monotonic() < deadline:
            waiting = [s for s in sockets if s.fileno() not in connected]
            _, writable, _ = select.select([], waiting, [], 0.2)
            for ready in writable:
                if ready.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    connected.add(ready.fileno())
        assert len(connected) >= 129, f"{len(connected)} of 200 connections completed"
    finally:
        served.process.send_signal(signal.SIGCONT)
        for pending in sockets:
            pending.close()
    assert served.get("/healthz").status == 200


# --- the probes and the runbooks, on a server in this process ---------------------------------


@pytest.fixture
def serve_in_process():
    """A MetricsServer on a loopback port; stopped by the test's end."""
    from checkpoint_exporter.config import WebConfig
    from checkpoint_exporter.exposition.renderer import Renderer
    from checkpoint_exporter.exposition.server import MetricsServer
    from checkpoint_exporter.model import Snapshot

    servers: list[MetricsServer] = []

    def start(**checks) -> str:
        server = MetricsServer(WebConfig("127.0.0.1:0"), Renderer(lambda: Snapshot(), []), **checks)
        server.start()
        servers.append(server)
        return f"http://127.0.0.1:{server.address.port}"

    yield start
    for server in servers:
        server.stop()


def _get(url: str, method: str = "GET") -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_healthz_and_readyz_answer_from_their_checks(serve_in_process) -> None:
    """None from a check: 200 "ok"; a reason: 503 with the reason. /healthz is liveness (a
    wedged core), /readyz readiness (the first pass)."""
    state = {"live": None, "ready": "first pass not finished (1 of 3 tiers)"}
    base = serve_in_process(liveness=lambda: state["live"], readiness=lambda: state["ready"])
    assert _get(base + "/healthz") == (200, "ok\n")
    assert _get(base + "/readyz") == (503, "first pass not finished (1 of 3 tiers)\n")
    assert _get(base + "/readyz", "HEAD") == (503, "")
    state["ready"] = None
    assert _get(base + "/readyz") == (200, "ok\n")
    state["live"] = "the core loop has not turned for 75 s"
    assert _get(base + "/healthz") == (503, "the core loop has not turned for 75 s\n")


def test_a_broken_check_is_a_failed_probe(serve_in_process) -> None:
    def broken() -> str | None:
        raise RuntimeError("lock poisoned")

    base = serve_in_process(liveness=broken)
    assert _get(base + "/healthz") == (503, "the health check itself failed\n")
    assert _get(base + "/readyz") == (200, "ok\n")  # without a check: ready


def test_runbooks_page_has_an_anchor_for_every_heading(serve_in_process) -> None:
    """Alerts link to /runbooks#<alert in lower case>: every heading of docs/runbooks.md has its
    GitHub-style id in the page served from the package's copy (`make generate` copies it)."""
    from checkpoint_exporter.exposition.runbooks_page import slug
    from tests.conftest import REPO

    source = (REPO / "docs" / "runbooks.md").read_text()
    status, page = _get(serve_in_process() + "/runbooks")
    assert status == 200 and page.startswith("<!DOCTYPE html>")
    seen: dict[str, int] = {}
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", source, re.M)
    assert "CheckpointTooOld" in headings
    for heading in headings:
        assert f'id="{slug(heading.replace("`", ""), seen)}"' in page, heading
    assert 'id="checkpointtooold"' in page and "<script" not in page
