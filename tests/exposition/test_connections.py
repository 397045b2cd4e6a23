"""The connection loop behind the metrics server (exposition/connections.py), in process, on a
clock the tests move: every state has a deadline, the connections and the answers waiting for
slow readers have a cap, and none of it costs a handler thread."""

from __future__ import annotations

import base64
import http.client
import re
import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import bcrypt
import pytest

from checkpoint_exporter import webconfig
from checkpoint_exporter.config import WebConfig
from checkpoint_exporter.exposition import connections
from checkpoint_exporter.exposition.connections import (
    HANDSHAKE_SECONDS,
    IDLE_SECONDS,
    MAX_HEAD_BYTES,
    REQUEST_SECONDS,
    WRITE_SECONDS,
)
from checkpoint_exporter.exposition.server import REFUSAL_DELAY_SECONDS, WORKERS, MetricsServer
from checkpoint_exporter.model import Snapshot
from checkpoint_exporter.webconfig import WebSecurity
from tests.conftest import wait_for
from tests.exposition.test_web_security import Pki, pki  # noqa: F401 (the fixture)

# More than loopback's socket buffers take: an answer a client never reads stalls.
BODY = 16 * 1024 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class BigRenderer:
    """A renderer whose body is BODY bytes: the same bytes for every scrape (as the real one
    serves one snapshot), or new ones each time with ``distinct``."""

    def __init__(self, distinct: bool = False) -> None:
        self.distinct = distinct
        self.body = b"x" * BODY

    def snapshot(self) -> Snapshot:
        return Snapshot()

    def render_parts(self, encoder: object) -> tuple[bytes, bytes]:
        return (b"y" * BODY if self.distinct else self.body), b""


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[MetricsServer, Clock]]]:
    servers: list[MetricsServer] = []

    def start(
        renderer: object | None = None, security: WebSecurity | None = None
    ) -> tuple[MetricsServer, Clock]:
        clock = Clock()
        server = MetricsServer(
            WebConfig(listen_address="127.0.0.1:0"),
            renderer or BigRenderer(),  # type: ignore[arg-type]
            security,
            clock=clock,
        )
        server.start()
        servers.append(server)
        return server, clock

    yield start
    for server in servers:
        server.stop()


def connect(server: MetricsServer, small_buffer: bool = False) -> socket.socket:
    """A client connection; with ``small_buffer``, one whose receive buffer is 4 KiB (set
    before connecting, so the kernel does not grow it): an answer it never reads stalls."""
    sock = socket.socket()
    if small_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", server.address.port))
    return sock


def probe(server: MetricsServer) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", server.address.port, timeout=10)
    try:
        connection.request("GET", "/healthz", headers={"Connection": "close"})
        reply = connection.getresponse()
        reply.read()
        return reply.status
    finally:
        connection.close()


def advance(server: MetricsServer, clock: Clock, seconds: float) -> None:
    """Move the clock and let the loop act on it. A probe answered first means the loop has
    taken in everything the test did before (connections accepted, answers written, at the
    old time); a probe answered after, that it has looked at its deadlines at the new time."""
    assert probe(server) == 200
    clock.now += seconds
    server.connections.wake()
    assert probe(server) == 200


def closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        while data := sock.recv(65536):
            del data
        return True
    except ConnectionResetError:
        return True


def answered(sock: socket.socket, path: str = "/healthz") -> bytes:
    """Sends one request on ``sock`` and returns its answer's status line."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    reply = http.client.HTTPResponse(sock)
    reply.begin()
    reply.read()
    return f"{reply.status}".encode()


def test_a_connection_that_sends_nothing_is_dropped_at_the_request_deadline(serve) -> None:
    server, clock = serve()
    silent, used = connect(server), connect(server)
    advance(server, clock, REQUEST_SECONDS - 1)
    assert answered(used) == b"200"  # still open just before the deadline
    advance(server, clock, 2)
    assert closed_by_server(silent)
    assert server.connections.dropped["idle"] == 1


def test_a_request_head_sent_slowly_is_dropped_whatever_its_pace(serve) -> None:
    """A per-read timeout never fires on a drip of one byte within each timeout; the head as a
    whole must come within REQUEST_SECONDS of its first byte."""
    server, clock = serve()
    drip = connect(server)
    for byte in b"GET /metrics HTTP/1.1\r\n":
        drip.sendall(bytes([byte]))
        advance(server, clock, REQUEST_SECONDS / 40)
    advance(server, clock, REQUEST_SECONDS / 2)
    assert closed_by_server(drip)
    assert server.connections.dropped["slow request"] == 1


def test_a_kept_alive_connection_waits_for_its_next_request_until_the_idle_deadline(serve) -> None:
    server, clock = serve()
    kept = connect(server)
    assert answered(kept) == b"200"
    advance(server, clock, IDLE_SECONDS - 1)
    assert answered(kept) == b"200"  # its next request, then idle again
    advance(server, clock, IDLE_SECONDS + 1)
    assert closed_by_server(kept)


def test_at_the_connection_cap_the_connection_waiting_longest_makes_room(
    serve, monkeypatch
) -> None:
    monkeypatch.setattr(connections, "MAX_CONNECTIONS", 4)
    server, _ = serve()
    held = []
    for n in range(1, 5):
        held.append(connect(server))
        wait_for(lambda n=n: server.connections.open_connections == n)  # in this order
    assert probe(server) == 200  # a fifth: the oldest idle connection made room
    assert closed_by_server(held[0])
    assert answered(held[1]) == b"200"
    assert server.connections.dropped["evicted (full)"] >= 1


def test_a_request_head_over_the_cap_gets_431_and_the_connection_closed(serve) -> None:
    server, _ = serve()
    sock = connect(server)
    sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n")
    reply = http.client.HTTPResponse(sock)
    reply.begin()
    assert reply.status == 431 and reply.getheader("Connection") == "close"
    reply.read()
    assert closed_by_server(sock)


def test_readers_that_never_read_hold_no_handler_thread(serve) -> None:
    """Twice as many clients as handler threads ask for a 4 MB answer and never read it: each
    would have held its thread until a write timeout; the probe and a scrape are answered."""
    server, _ = serve()
    stalled = [connect(server, small_buffer=True) for _ in range(2 * WORKERS)]
    for sock in stalled:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert probe(server) == 200
    connection = http.client.HTTPConnection("127.0.0.1", server.address.port, timeout=10)
    connection.request("GET", "/metrics")
    reply = connection.getresponse()
    assert reply.status == 200 and len(reply.read()) == BODY
    connection.close()
    for sock in stalled:
        sock.close()


def test_a_writer_that_stalls_is_dropped_at_the_write_deadline(serve) -> None:
    server, clock = serve()
    stalled = connect(server, small_buffer=True)
    stalled.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_for(lambda: big_writers(server) == 1)
    advance(server, clock, WRITE_SECONDS + 1)
    assert server.connections.dropped["writing"] == 1
    assert closed_by_server(stalled)


def big_writers(server: MetricsServer) -> int:
    """Connections writing a BODY (a probe's answer, in flight for a moment, is not one)."""
    return sum(1 for c in list(server.connections._writers) if sum(map(len, c.parts)) >= BODY)


def stalled_or_dropped(server: MetricsServer) -> int:
    return big_writers(server) + server.connections.dropped["stalled writer"]


def test_beyond_the_output_budget_the_writer_stalled_longest_is_dropped(serve, monkeypatch) -> None:
    monkeypatch.setattr(connections, "MAX_PENDING_OUTPUT", 2 * BODY + BODY // 2)
    server, clock = serve(BigRenderer(distinct=True))
    stalled = []
    for _ in range(3):
        sock = connect(server, small_buffer=True)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        stalled.append(sock)
        wait_for(lambda: stalled_or_dropped(server) == len(stalled))
        advance(server, clock, 1)
    assert server.connections.dropped["stalled writer"] == 1
    assert closed_by_server(stalled[0])
    assert big_writers(server) == 2


def test_one_body_shared_by_many_answers_counts_once_in_the_output_budget(
    serve, monkeypatch
) -> None:
    """The renderer hands every scraper of one snapshot the same bytes: ten slow readers of
    it hold one body, not ten."""
    monkeypatch.setattr(connections, "MAX_PENDING_OUTPUT", 2 * BODY)
    server, _ = serve(BigRenderer(distinct=False))
    stalled = []
    for _ in range(10):
        sock = connect(server, small_buffer=True)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        stalled.append(sock)
    wait_for(lambda: big_writers(server) == 10)
    assert server.connections.dropped["stalled writer"] == 0
    for sock in stalled:
        sock.close()


def test_pipelined_requests_are_answered_in_order(serve) -> None:
    server, _ = serve()
    sock = connect(server)
    sock.sendall(
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    received = b""
    while chunk := sock.recv(65536):  # to the end: the last request asked for it
        received += chunk
    statuses = re.findall(rb"^HTTP/1\.1 (\d{3}) ", received, re.M)
    assert statuses == [b"200", b"404", b"200"], received


def test_tls_is_negotiated_without_a_thread_and_a_stalled_handshake_is_dropped(
    serve,
    pki: Pki,  # noqa: F811
) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    server, clock = serve(security=WebSecurity(tls=context))
    stalled = connect(server)  # never says hello
    stalled.sendall(b"\x16\x03\x01")  # nor finishes
    client = ssl.create_default_context(cafile=str(pki.ca))
    connection = http.client.HTTPSConnection(
        "127.0.0.1", server.address.port, context=client, timeout=10
    )
    connection.request("GET", "/metrics")
    reply = connection.getresponse()
    assert reply.status == 200 and len(reply.read()) == BODY  # written in many TLS records
    connection.close()
    clock.now += HANDSHAKE_SECONDS + 1
    server.connections.wake()
    assert closed_by_server(stalled)
    wait_for(lambda: server.connections.dropped["handshake"] == 1)


def test_stop_closes_every_connection(serve) -> None:
    server, _ = serve()
    held = [connect(server) for _ in range(10)]
    assert answered(held[0]) == b"200"
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    stopper.join(timeout=10)
    assert not stopper.is_alive()
    assert all(closed_by_server(sock) for sock in held)


def test_a_request_target_that_cannot_be_parsed_costs_only_its_own_answer(serve) -> None:
    """urlsplit refuses "http://[::1" (an unclosed IPv6 literal): on the loop's thread that
    would have ended every connection; in a handler, it left its connection open for good."""
    server, _ = serve()
    sock = connect(server)
    sock.sendall(b"GET http://[::1 HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = http.client.HTTPResponse(sock)
    reply.begin()
    assert reply.status == 400
    assert probe(server) == 200


class BrokenSnapshot(BigRenderer):
    def snapshot(self) -> Snapshot:
        raise RuntimeError("a bug in the landing page's data")


def test_a_handler_that_fails_closes_its_connection_and_nothing_else(serve) -> None:
    server, _ = serve(BrokenSnapshot())
    sock = connect(server)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = http.client.HTTPResponse(sock)
    reply.begin()
    assert reply.status == 500 and reply.getheader("Connection") == "close"
    reply.read()
    assert closed_by_server(sock)
    sock.close()
    assert probe(server) == 200
    wait_for(lambda: server.connections.open_connections == 0)  # none left behind


def test_a_refusal_is_written_after_its_retry_after(serve, monkeypatch) -> None:
    """A client told 429 that asks again at once was answered as fast as it asked (hundreds a
    second from one address, taking the CPU a cached scrape needs); the answer now waits out
    its Retry-After, on a socket, not a thread."""
    monkeypatch.setattr(webconfig, "MAX_WAITING_CHECKS", 0)  # no room: every check is refused
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4))
    server, clock = serve(security=WebSecurity(users={"prometheus": hashed}))
    sock = connect(server)
    token = base64.b64encode(b"prometheus:guess").decode()
    head = f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}\r\n\r\n"
    sock.sendall(head.encode())
    wait_for(lambda: [c.state for c in list(server.connections._connections)] == ["delayed"])
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(1)  # nothing yet
    sock.setblocking(True)
    advance(server, clock, REFUSAL_DELAY_SECONDS)
    reply = http.client.HTTPResponse(sock)
    reply.begin()
    assert reply.status == 429 and reply.getheader("Retry-After") == "1"
