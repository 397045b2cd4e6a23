"""`checkpoint-exporter demo` as a new user meets it: jobs commit, faults show within about a
minute, headless Chromium draws the landing page's timelines, and stopping leaves nothing."""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from checkpoint_exporter.demo import objects as s3
from checkpoint_exporter.demo.cluster import JOBS, PAGES_OF, SYMPTOMS_OF
from checkpoint_exporter.demo.cluster import dcp_metadata as demo_metadata
from checkpoint_exporter.mixin import dashboards
from checkpoint_exporter.model import SYMPTOMS
from checkpoint_exporter.sources import dcp_metadata
from tests.conftest import CLI, REPO, require_tool, sample, wait_for
from tests.helpers.alerting import query

pytestmark = [pytest.mark.chromium, pytest.mark.prometheus, pytest.mark.torch, pytest.mark.daemon]

ARTIFACTS = REPO / "test-artifacts"


def free_port_block() -> int:
    """A port p with p and p+10 to p+13 free (the demo's exporter, Prometheus, Alertmanager,
    node_exporter, S3 server)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + 13 < 65535 and all(_free(port + offset) for offset in (10, 11, 12, 13)):
            return port
    raise AssertionError("no free port block")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def chromium(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [require_tool("chromium"), "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--disable-quic", f"--user-data-dir={ARTIFACTS / '.chromium'}",
         *args, url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_demo(tmp_path: Path) -> None:
    port = free_port_block()
    workdir = tmp_path / "demo"
    demo = subprocess.Popen(
        [*CLI, "demo", "--workdir", str(workdir), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:

        def metrics() -> str:
            try:
                with urllib.request.urlopen(f"{base}/metrics", timeout=5) as reply:
                    return reply.read().decode()
            except OSError:
                return ""

        def several_commits_and_a_fault() -> bool:
            text = metrics()
            jobs = ("llama70b-a", "llama70b-b", "llama70b-c", "llama70b-d")
            committed = [
                sample(text, "checkpoint_saves_committed_total", training_job=j) or 0 for j in jobs
            ]
            faults = sum(
                sample(text, name, training_job=j) or 0
                for j in jobs
                for name in ("checkpoint_deadline_misses_total", "checkpoint_saves_aborted_total")
            )
            return sum(1 for c in committed if c >= 1) >= 3 and faults >= 1

        started = time.monotonic()
        wait_for(several_commits_and_a_fault, timeout=90, interval=2)
        print(f"MEASURE commits and a fault after {time.monotonic() - started:.0f} s")

        # Headless Chromium renders the landing page: a timeline per job, with marks.
        ARTIFACTS.mkdir(exist_ok=True)
        dom = chromium(f"{base}/", "--dump-dom").stdout
        # The four jobs on disk, and the one in the embedded S3 server (moto is installed here).
        assert len(re.findall(r'<svg[^>]*class="timeline"', dom)) == len(JOBS) + 1
        assert len(re.findall(r'class="phase-write"', dom)) >= 3
        assert len(re.findall(r'class="deadline"', dom)) == len(JOBS) + 1
        assert re.search(r'class="[^"]*\bfailure\b', dom), "no fault drawn"
        shot = chromium(
            f"{base}/", "--window-size=1280,2200", f"--screenshot={ARTIFACTS / 'landing.png'}"
        )
        assert (ARTIFACTS / "landing.png").stat().st_size > 10_000, shot.stderr

        # Each injected fault is diagnosed as its symptom, on its job; clean saves as none.
        expected = {
            job.name: {
                s for fault in (job.fault, job.second_fault) for s in SYMPTOMS_OF.get(fault, ())
            }
            for job in JOBS
        }
        assert set().union(*expected.values()) >= {
            "straggler", "commit_bound", "staging_bound", "unrestorable",
        }  # fmt: skip

        def symptoms() -> dict[str, dict[str, float]]:
            text = metrics()
            return {
                job: {
                    s: sample(text, "checkpoint_save_symptoms_total", training_job=job, symptom=s)
                    for s in SYMPTOMS
                }
                for job in expected
            }

        def every_fault_diagnosed() -> bool:
            seen = symptoms()
            return all((seen[job][s] or 0) >= 1 for job, wanted in expected.items() for s in wanted)

        wait_for(
            every_fault_diagnosed, timeout=max(5.0, 125 - (time.monotonic() - started)), interval=2
        )
        seen = symptoms()
        for job, wanted in expected.items():
            # Every symptom is exported from the start (rate() works), and a clean save adds none.
            assert all(value is not None for value in seen[job].values()), (job, seen[job])
            unexpected = {s: v for s, v in seen[job].items() if s not in wanted and v}
            assert unexpected == {}, (job, unexpected)
        saves = {
            job: sample(metrics(), "checkpoint_saves_committed_total", training_job=job) or 0
            for job in expected
        }
        # More saves than faulty ones were diagnosed: clean ones among them, with no symptom.
        assert sum(saves.values()) > sum(sum(v or 0 for v in s.values()) for s in seen.values())

        # A slow save is late, never also aborted; only the job whose ranks fail has aborts.
        text = metrics()
        for job in JOBS:
            aborted = sample(text, "checkpoint_saves_aborted_total", training_job=job.name)
            if "abort" not in (job.fault, job.second_fault):
                assert aborted == 0, (job.name, aborted)
        late = sample(text, "checkpoint_deadline_misses_total", training_job="llama70b-b")
        assert late and late >= 1  # its slow commits: late, and not aborted (above)

        # The job in object storage: its saves committed and checked (its .metadata by a ranged
        # GET), its requests counted, its killed save aborted once and its upload left open.
        def object_job_done() -> bool:
            text = metrics()
            return all(
                (sample(text, name, training_job=s3.NAME) or 0) >= 1
                for name in ("checkpoint_saves_committed_total", "checkpoint_saves_aborted_total")
            )

        wait_for(object_job_done, timeout=90, interval=2)
        text = metrics()
        assert sample(text, "checkpoint_last_committed_valid", training_job=s3.NAME) == 1
        assert (sample(text, "checkpoint_object_store_requests_total", training_job=s3.NAME,
                       operation="list") or 0) >= 2  # fmt: skip

        # Its Alertmanager received no page that its own faults do not explain.
        explained = {
            (name, job.name)
            for job in JOBS
            for fault in (job.fault, job.second_fault)
            for name in PAGES_OF.get(fault, ())
        } | {(name, s3.NAME) for name in PAGES_OF["abort"]}
        url = f"http://127.0.0.1:{port + 11}/api/v2/alerts"
        with urllib.request.urlopen(url, timeout=10) as reply:
            received = json.load(reply)
        pages = {
            (a["labels"]["alertname"], a["labels"].get("training_job", ""))
            for a in received
            if a["labels"].get("severity") == "critical"
        }
        assert pages <= explained, pages - explained
        tickets = {a["labels"]["alertname"] for a in received}
        assert "CheckpointSpoolUnwritable" not in tickets  # the demo's spool is 1733

        # The checkpoint-window row: this machine's node_exporter, met by host, has data.
        variables = {"$cluster": ".*", "$training_job": ".*", "$__rate_interval": "1m"}
        panels = [re.sub(r"\$\w+", lambda m: variables.get(m[0], m[0]), expr)
                  for _, title, expr in dashboards.queries(provided=dashboards.REQUIREMENTS)
                  if "(node_exporter)" in title]  # fmt: skip
        assert any(query(f"http://127.0.0.1:{port + 10}", expr) for expr in panels), panels
    finally:
        demo.send_signal(signal.SIGINT)  # what Ctrl-C sends
        output, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, output[-3000:]
    assert "every process it started is gone" in output
    assert f"{base}/" in output  # it printed where to look
    leftovers = [
        p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and any(str(workdir) in part for part in p.info["cmdline"])
    ]  # fmt: skip
    assert leftovers == []
    listening = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == "LISTEN"}
    assert not listening & {port, port + 10, port + 11, port + 12, port + 13}


def test_demo_metadata_without_torch_is_what_torch_reads(tmp_path: Path) -> None:
    """The demo's stand-alone .metadata writer: our reader and torch itself both accept it."""
    blocker = tmp_path / "no-torch"
    blocker.mkdir()
    (blocker / "torch.py").write_text("raise ImportError('no torch here')\n")
    code = (
        "import sys; from checkpoint_exporter.demo.cluster import dcp_metadata; "
        "sys.stdout.buffer.write(dcp_metadata({'__0_0.distcp': 1234, '__1_0.distcp': 99}))"
    )
    data = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, check=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(blocker)},
    ).stdout  # fmt: skip
    assert dcp_metadata.loads(data).shards == {"__0_0.distcp": 1234, "__1_0.distcp": 99}
    assert dcp_metadata.loads(demo_metadata({"__0_0.distcp": 5})).shards == {"__0_0.distcp": 5}
    import torch.distributed.checkpoint.metadata as md  # the real thing, where it is installed

    metadata = pickle.loads(data)  # written by this test, a moment ago
    assert isinstance(metadata, md.Metadata)
    assert {info.relative_path: info.length for info in metadata.storage_data.values()} == {
        "__0_0.distcp": 1234, "__1_0.distcp": 99,
    }  # fmt: skip
