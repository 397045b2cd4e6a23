"""`acceptance` against a hostile Prometheus: its answers are untrusted input. Whatever it sends,
the verb ends with exit status 2 and one line naming the query and the reason (never a
traceback, never 1, which means "a measured row failed"), holds a bounded amount of memory,
keeps its deadline, and writes label values escaped in every format of the report.

The adversarial run these reproduce: a traceback and exit 1 on 1e308, malformed or deeply nested
JSON; 4.9 GB held for a 400 MB answer; a slow drip kept it past its timeout; raw label values in
the Markdown report.
"""

from __future__ import annotations

import io
import json
import re
import resource
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from checkpoint_exporter.acceptance import prom
from checkpoint_exporter.acceptance.run import Request, run
from tests.conftest import CLI

Answer = Callable[[BaseHTTPRequestHandler, str, dict[str, str]], None]
MEMORY_LIMIT = 1024 * 1024 * 1024  # the verb under test: a 400 MB answer read whole passes it


class HostilePrometheus:
    """A loopback server that answers `vector(1)` as Prometheus does (so the verb gets as far as
    its queries) and every other query with ``answer``, which writes the raw response."""

    def __init__(self, answer: Answer) -> None:
        self.stop = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                params = dict(urllib.parse.parse_qsl(url.query))
                try:
                    if params.get("query") == "vector(1)":
                        send(self, vector([({}, "1")]))
                    else:
                        answer(self, url.path, params)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up, as it should

            def log_message(self, *args: object) -> None:
                pass

        self.owner = owner
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HostilePrometheus:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def send(handler: BaseHTTPRequestHandler, body: bytes, length: bool = True) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    if length:
        handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def answer_of(result_type: str, result: object) -> bytes:
    return json.dumps(
        {"status": "success", "data": {"resultType": result_type, "result": result}}
    ).encode()


def vector(samples: list[tuple[dict[str, str], str]], at: float | None = None) -> bytes:
    when = time.time() if at is None else at
    return answer_of("vector", [{"metric": labels, "value": [when, v]} for labels, v in samples])


def matrix(labels: dict[str, str], values: list[tuple[float, str]]) -> bytes:
    return answer_of("matrix", [{"metric": labels, "values": [list(v) for v in values]}])


def run_against(answer: Answer, tmp_path: Path, **request: object) -> tuple[int, str, str]:
    """The verb in process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with HostilePrometheus(answer) as fake:
        status = run(
            Request(fake.url, span="10m", output=str(tmp_path / "report"), **request),  # type: ignore[arg-type]
            out,
            err,
        )
    return status, out.getvalue(), err.getvalue()


def every_query(body: Callable[[str, dict[str, str]], bytes]) -> Answer:
    def answer(handler: BaseHTTPRequestHandler, path: str, params: dict[str, str]) -> None:
        send(handler, body(path, params))

    return answer


JOB = {"training_job": "alpha", "instance": "n1", "phase": "total", "reason": "r"}


@pytest.mark.parametrize(
    ("name", "body", "reason"),
    [
        (
            "a value of 1e308",
            lambda path, params: (
                matrix(JOB, [(time.time() - 60, "1e308")])
                if path.endswith("query_range")
                else vector([(JOB, "1e308")])
            ),
            "out of range: '1e308'",
        ),
        (
            "a value of 5e-324",
            lambda path, params: (
                matrix(JOB, [(time.time() - 60, "5e-324")])
                if path.endswith("query_range")
                else vector([(JOB, "5e-324")])
            ),
            "out of range: '5e-324'",
        ),
        (
            "a time of 1e308",
            lambda path, params: vector([(JOB, "1")], at=1e308),
            "out of range: 1e+308 is not a unix time",
        ),
        (
            "a value that is not [time, value]",
            lambda path, params: answer_of("vector", [{"metric": JOB, "value": "x"}]),
            "data.result[0].value is not [time, value]",
        ),
        (
            "labels that are not strings",
            lambda path, params: answer_of(
                "vector", [{"metric": {"training_job": ["a"]}, "value": [1, "1"]}]
            ),
            "data.result[0].metric['training_job'] is not a string",
        ),
        (
            "a result that is not a list",
            lambda path, params: (
                b'{"status": "success", "data": {"resultType": "matrix", "result": {"a": 1}}}'
                if path.endswith("query_range")
                else vector([(JOB, "1")])
            ),
            "data.result is not a list",
        ),
        (
            "JSON nested 100,000 deep",
            lambda path, params: b"[" * 100_000 + b"]" * 100_000,
            "the answer is JSON nested too deeply",
        ),
        ("no JSON at all", lambda path, params: b"<html>", "the answer is not JSON"),
    ],
)
def test_an_answer_that_cannot_be_prometheus_is_exit_2_naming_the_query(
    tmp_path: Path, name: str, body: Callable[[str, dict[str, str]], bytes], reason: str
) -> None:
    status, _, err = run_against(every_query(body), tmp_path)
    assert status == 2, (name, err)
    assert re.search(r"acceptance: Prometheus at http://127\.0\.0\.1:\d+: query '.+': ", err), err
    assert reason in err, err
    assert "Traceback" not in err


def test_nan_and_infinities_are_prometheus_own_values_not_errors(tmp_path: Path) -> None:
    def body(path: str, params: dict[str, str]) -> bytes:
        if path.endswith("query_range"):
            return matrix(JOB, [(time.time() - 60, "NaN"), (time.time() - 30, "+Inf")])
        return vector([(JOB, "-Inf")])

    status, _, err = run_against(every_query(body), tmp_path)
    assert status in (0, 1), err  # judged: the rows say what they make of it
    assert (tmp_path / "report" / "acceptance.json").exists()


def test_an_answer_over_the_size_cap_is_refused_without_reading_it_all(
    tmp_path: Path, monkeypatch
) -> None:
    """With and without a Content-Length: a valid answer padded past the cap."""
    monkeypatch.setattr(prom, "MAX_ANSWER_BYTES", 1024 * 1024)
    padded = json.loads(vector([(JOB, "1")]))
    padded["padding"] = "x" * (2 * 1024 * 1024)
    body = json.dumps(padded).encode()
    for length in (True, False):

        def answer(handler: BaseHTTPRequestHandler, path: str, params: dict[str, str]) -> None:
            send(handler, body, length=length)  # noqa: B023 (called within this iteration)

        status, _, err = run_against(answer, tmp_path)
        assert status == 2, err
        assert "the answer is larger than 1 MiB" in err


def test_answers_over_the_total_budget_are_refused(tmp_path: Path, monkeypatch) -> None:
    """Each answer under its cap, but the verb asks some forty queries: what they may hold
    together is bounded too (16 MiB answers of 220,000 series each held 3 GB)."""
    body = vector([(JOB, "1")] * 2000)
    monkeypatch.setattr(prom, "MAX_TOTAL_BYTES", 5 * len(body))
    status, _, err = run_against(every_query(lambda path, params: body), tmp_path)
    assert status == 2, err
    assert "the answers together are larger than" in err


def test_a_400_mb_answer_costs_no_more_than_the_cap(tmp_path: Path) -> None:
    """The real cap, against an answer streamed without end: the verb, limited to 1 GiB of
    address space, stops reading at the cap (it held 4.9 GB for 400 MB)."""
    chunk = b"[1," * 100_000

    def answer(handler: BaseHTTPRequestHandler, path: str, params: dict[str, str]) -> None:
        handler.send_response(200)
        handler.end_headers()
        sent = 0
        while sent < 400 * 1024 * 1024:
            handler.wfile.write(chunk)
            sent += len(chunk)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    with HostilePrometheus(answer) as fake:
        result = subprocess.run(
            [*CLI, "acceptance", "--prometheus.url", fake.url, "--range", "10m", "--output",
             str(tmp_path / "report")],
            capture_output=True, text=True, timeout=120, preexec_fn=limit, check=False,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"the answer is larger than {prom.MAX_ANSWER_BYTES // 1024 // 1024} MiB" in (
        result.stderr
    )


def test_a_slow_drip_is_cut_at_the_total_deadline(tmp_path: Path) -> None:
    """A byte every 0.2 s: a per-read timeout of 1 s never fires, and the answer would take
    about 20 s; the request's whole time is 1 s."""
    body = vector([(JOB, "1")])

    def answer(handler: BaseHTTPRequestHandler, path: str, params: dict[str, str]) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.flush()
        for byte in body[:100]:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            time.sleep(0.2)
        handler.wfile.write(body[100:])

    started = time.monotonic()
    status, _, err = run_against(answer, tmp_path, timeout=1.0)
    took = time.monotonic() - started
    print(f"given up after {took:.1f} s")
    assert status == 2, err
    assert "no whole answer within 1 s" in err


HOSTILE_JOB = "x|y\n# Injected <b>bold</b> [link](javascript:alert(1)) `code` \x1b[31m\u202e \ud800"


def test_label_values_are_escaped_in_every_format(tmp_path: Path) -> None:
    labels = {**JOB, "training_job": HOSTILE_JOB}

    def body(path: str, params: dict[str, str]) -> bytes:
        if path.endswith("query_range"):
            return matrix(labels, [(time.time() - 60, "5")])
        return vector([(labels, "5")])

    status, out, err = run_against(every_query(body), tmp_path)
    assert status in (0, 1), err
    report = tmp_path / "report"
    markdown = (report / "acceptance.md").read_text(encoding="utf-8")
    html = (report / "acceptance.html").read_text(encoding="utf-8")
    document = json.loads((report / "acceptance.json").read_text(encoding="utf-8"))
    for text in (markdown, html, out):
        assert "\x1b" not in text and "\u202e" not in text
        assert "\n# Injected" not in text  # no line of its own, no heading
    assert "<b>" not in markdown and "<b>" not in html
    assert "[link](javascript" not in markdown and "`code`" not in markdown
    assert "x|y" not in markdown  # a cell of its own in a table
    assert "\\<b\\>" in markdown and "&lt;b&gt;" in html
    # The JSON keeps the value, with what no report can show as escapes.
    job = document["jobs"][0]
    assert job.startswith("x|y\\n# Injected <b>bold</b> [link](javascript:alert(1))")
    assert job.endswith("\\x1b[31m\\u202e \\ud800")


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch) -> Iterator[None]:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    yield
