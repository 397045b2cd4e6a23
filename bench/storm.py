"""storm: what a connection storm costs the real exporter (docs/security.md, "The metrics
endpoint"). Not part of ``make bench``: run it by hand,

    PYTHONPATH=exporter python bench/storm.py [--connections 10000] [--watch 60]

Storms against ``checkpoint-exporter serve`` on loopback:

  closed   CONNECTIONS connections opened and closed at once (RST, as a killed client's)
  idle     CONNECTIONS connections opened and held idle for the watch period
  auth     basic auth on (bcrypt cost 10): GUESSERS clients on 127.0.0.1 send new wrong
           passwords while Prometheus, from 127.0.0.2 and never answered before (the exporter
           just started), scrapes once a second

For closed and idle: the exporter's peak and current RSS, the latency of a /healthz probe sent
every 0.25 s (a probe that fails or takes more than 5 s counts as failed), and how long SIGTERM
takes to end the process afterwards (killed after 30 s). For auth: Prometheus' answers, how many
were 429 before the first 200, and the latency of its 200s.
"""

from __future__ import annotations

import argparse
import base64
import collections
import http.client
import itertools
import json
import multiprocessing
import os
import re
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

PROBE_TIMEOUT = 5.0


def _rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    with open(f"/proc/{pid}/status") as status:
        text = status.read()
    rss = int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) * 1024  # type: ignore[union-attr]
    hwm = int(re.search(r"VmHWM:\s+(\d+)", text).group(1)) * 1024  # type: ignore[union-attr]
    return rss, hwm


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _start(*flags: str) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "checkpoint_exporter", "serve", "--web.listen-address",
         "127.0.0.1:0", *flags],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stderr is not None
    for line in process.stderr:
        match = re.search(r"url=http://[^:\s]+:(\d+)/", line)
        if match:
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return process, int(match.group(1))
    raise RuntimeError("the exporter did not start")


def _probe(port: int) -> float | None:
    """Seconds /healthz took, or None when it failed or took longer than PROBE_TIMEOUT."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT)
    try:
        connection.request("GET", "/healthz")
        reply = connection.getresponse()
        ok = reply.status == 200 and reply.read() == b"ok\n"
    except (OSError, http.client.HTTPException):
        ok = False
    finally:
        connection.close()
    took = time.perf_counter() - started
    return took if ok and took <= PROBE_TIMEOUT else None


def _open(port: int, count: int) -> list[socket.socket]:
    """``count`` connections, their handshakes completed (or given up after 10 s)."""
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        sockets.append(s)
    pending = {s.fileno(): s for s in sockets}
    poller = select.epoll()
    for fd in pending:
        poller.register(fd, select.EPOLLOUT)
    deadline = time.monotonic() + 10
    while pending and time.monotonic() < deadline:
        for fd, _ in poller.poll(0.2):
            poller.unregister(fd)
            pending.pop(fd, None)
    poller.close()
    return sockets


def _reset(sockets: list[socket.socket]) -> None:
    """Close with RST (SO_LINGER 0), all at once."""
    for s in sockets:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()


def _watch(process: subprocess.Popen, port: int, seconds: float) -> dict[str, object]:
    latencies: list[float | None] = []
    peak_threads = 0
    first_ok = None
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        took = _probe(port)
        latencies.append(took)
        if took is not None and first_ok is None:
            first_ok = time.monotonic() - started
        peak_threads = max(peak_threads, _threads(process.pid))
        time.sleep(0.25)
    ok = sorted(t for t in latencies if t is not None)
    return {
        "probes": len(latencies),
        "probes_failed": sum(1 for t in latencies if t is None),
        "first_ok_s": None if first_ok is None else round(first_ok, 2),
        "probe_p50_ms": round(ok[len(ok) // 2] * 1000, 1) if ok else None,
        "probe_max_ms": round(ok[-1] * 1000, 1) if ok else None,
        "peak_threads": peak_threads,
    }


def _stop(process: subprocess.Popen) -> float | None:
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None
    return round(time.monotonic() - started, 2)


def storm(kind: str, connections: int, watch: float) -> dict[str, object]:
    process, port = _start()
    try:
        time.sleep(1.0)
        baseline = _rss(process.pid)[0]
        sockets = _open(port, connections)
        if kind == "closed":
            _reset(sockets)
            row = _watch(process, port, watch)
        else:
            row = _watch(process, port, watch)
            _reset(sockets)
        rss, hwm = _rss(process.pid)
        row.update(
            storm=kind, connections=connections, rss_before_mb=round(baseline / 1e6, 1),
            rss_peak_mb=round(hwm / 1e6, 1), rss_after_mb=round(rss / 1e6, 1),
            sigterm_s=_stop(process),
        )  # fmt: skip
        return row
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _get(port: int, password: str, source: str) -> tuple[int | None, float]:
    """(status or None, seconds) of one /metrics with basic auth, sent from ``source``."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=30, source_address=(source, 0)
    )
    token = base64.b64encode(f"prometheus:{password}".encode()).decode()
    try:
        connection.request("GET", "/metrics", headers={"Authorization": f"Basic {token}"})
        reply = connection.getresponse()
        reply.read()
        status: int | None = reply.status
    except (OSError, http.client.HTTPException):
        status = None
    finally:
        connection.close()
    return status, time.perf_counter() - started


def _guess(port: int, guessers: int) -> None:
    """``guessers`` threads sending new wrong passwords from 127.0.0.1, until killed."""

    def guess(client: int) -> None:
        for attempt in itertools.count():
            _get(port, f"{client}/{attempt}", "127.0.0.1")

    threads = [threading.Thread(target=guess, args=(n,), daemon=True) for n in range(guessers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def auth_flood(guessers: int, watch: float) -> dict[str, object]:
    import bcrypt

    with tempfile.TemporaryDirectory() as directory:
        web = os.path.join(directory, "web.yaml")
        hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=10)).decode()
        with open(web, "w") as out:
            out.write(f"basic_auth_users: {{prometheus: '{hashed}'}}\n")
        process, port = _start("--web.config.file", web)
        # The guessers run in a process of their own, so Prometheus' client here does not
        # wait for their threads.
        flood = multiprocessing.get_context("spawn").Process(
            target=_guess, args=(port, guessers), daemon=True
        )
        try:
            flood.start()
            time.sleep(3.0)  # the flood is in full swing
            answers = []
            started = time.monotonic()
            while time.monotonic() - started < watch:
                answers.append(_get(port, "secret", "127.0.0.2"))
                time.sleep(1.0)
        finally:
            flood.kill()
            flood.join()
            process.kill()
            process.wait()
    statuses = [status for status, _ in answers]
    first_ok = statuses.index(200) if 200 in statuses else None
    ok = sorted(seconds for status, seconds in answers if status == 200)
    return {
        "storm": "auth", "guessers": guessers, "scrapes": len(answers),
        "statuses": dict(collections.Counter(str(status) for status in statuses)),
        "refused_before_first_200": first_ok if first_ok is not None else len(statuses),
        "first_200_s": round(answers[first_ok][1], 3) if first_ok is not None else None,
        "p50_200_s": round(ok[len(ok) // 2], 3) if ok else None,
        "max_200_s": round(ok[-1], 3) if ok else None,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--watch", type=float, default=60.0)
    parser.add_argument("--guessers", type=int, default=80)
    parser.add_argument("--storm", choices=("closed", "idle", "auth"), action="append")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (max(soft, min(hard, args.connections + 1024)), hard)
    )
    for kind in args.storm or ("closed", "idle", "auth"):
        if kind == "auth":
            row = auth_flood(args.guessers, args.watch)
        else:
            row = storm(kind, args.connections, args.watch)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
