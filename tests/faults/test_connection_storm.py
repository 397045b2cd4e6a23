"""Anyone who can reach the metrics port, no credentials needed, against the real `serve`: 10,000
connections reset at once, and 10,000 held idle. Neither may take the probes, SIGTERM or the
exporter's memory with it.

The adversarial run these reproduce: each connection had its own thread, with no cap; 10,000
reset at once left every /healthz failing for the 120 s watched (threads drained at about 4 a
second) and SIGTERM unhandled after 30 s; 10,000 idle ones cost 294 MB. Here (bench/storm.py,
before the fix): 4,155 threads, every probe failed for 40 s, SIGTERM unhandled after 30 s;
5,706 threads and 185 MB for the idle ones.

And clients that ask for /metrics and never read the answer (a 4 KiB receive buffer), in
process on a clock the tests move (so no write deadline passes: 60 s is long for a probe, and
the client reconnects or asks again once it is closed): 512 of them filled the connection cap
with writers, which were never closed to make room, so /healthz timed out (the kubelet restarts
the pod in a loop) and scrapes failed (the review's reproduction: 512 writing, the listener
paused, the probe unanswered after 5 s).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import resource
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from checkpoint_exporter.config import WebConfig
from checkpoint_exporter.exposition import connections
from checkpoint_exporter.exposition.server import PROBE_WORKERS, WORKERS, MetricsServer
from tests.conftest import wait_for
from tests.exposition.test_connections import BODY, BigRenderer, serve  # noqa: F401 (the fixture)
from tests.faults.test_spool_floods import peak_rss_kb

STORM = 10_000
# What a kubelet probe would wait (its default timeoutSeconds is 1; this machine is shared and
# slow): a probe that gets no answer within it has failed.
PROBE_TIMEOUT = 5.0
# The server's own threads: the accept loop, the handler and probe pools, the password checker;
# the rest of the exporter (scanner, parser, telemetry, reload) is well under the slack.
THREAD_CEILING = 1 + WORKERS + PROBE_WORKERS + 1 + 24
RSS_GROWTH_CEILING_KB = 40 * 1024  # measured: about 5 MB for 10,000 idle connections


@pytest.fixture(autouse=True)
def _enough_descriptors() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = STORM + 1024
    if hard < wanted:
        pytest.fail(f"RLIMIT_NOFILE hard limit {hard} is below the {wanted} this test needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _port(served) -> int:  # type: ignore[no-untyped-def]
    return int(served.base.rsplit(":", 1)[1])


def _open(port: int, count: int) -> list[socket.socket]:
    """``count`` connections, their handshakes done (or given up by the kernel)."""
    sockets = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        sockets.append(s)
    poller = select.epoll()
    pending = {s.fileno() for s in sockets}
    for fd in pending:
        poller.register(fd, select.EPOLLOUT)
    deadline = time.monotonic() + 30
    while pending and time.monotonic() < deadline:
        for fd, _ in poller.poll(0.2):
            poller.unregister(fd)
            pending.discard(fd)
    poller.close()
    return sockets


def _reset(sockets: list[socket.socket]) -> None:
    """Close each with RST (SO_LINGER 0), as a killed client's connections end."""
    for s in sockets:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()


def _probe(port: int) -> int | None:
    """/healthz's status, or None when it did not answer within PROBE_TIMEOUT."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _sockets(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


def test_ten_thousand_connections_reset_at_once_leave_probes_and_sigterm_working(
    exporter,
) -> None:
    served = exporter()
    port = _port(served)
    sockets = _open(port, STORM)
    _reset(sockets)
    peak_threads = _threads(served.process.pid)
    statuses = []
    for _ in range(5):
        statuses.append(_probe(port))
        peak_threads = max(peak_threads, _threads(served.process.pid))
    print(f"probes after the storm: {statuses}; peak threads {peak_threads}")
    assert statuses == [200] * 5
    assert peak_threads <= THREAD_CEILING
    code, took = served.stop()
    print(f"SIGTERM took {took:.2f} s")
    assert code == 0


def test_ten_thousand_idle_connections_cost_bounded_threads_sockets_and_memory(exporter) -> None:
    served = exporter()
    port = _port(served)
    pid = served.process.pid
    before_kb = peak_rss_kb(pid)
    sockets = _open(port, STORM)
    try:
        held = _sockets(pid)
        statuses = [_probe(port) for _ in range(5)]
        threads = _threads(pid)
        grown_kb = peak_rss_kb(pid) - before_kb
        print(f"held {held} sockets, {threads} threads, peak RSS +{grown_kb / 1024:.1f} MB")
        assert statuses == [200] * 5
        # The listener, the loop's wake-up pair and the connections it keeps: beyond the cap,
        # the connection idle longest makes room (the rest wait in the kernel's backlog).
        assert held <= connections.MAX_CONNECTIONS + 8
        assert threads <= THREAD_CEILING
        assert grown_kb <= RSS_GROWTH_CEILING_KB
        code, _ = served.stop()
        assert code == 0
    finally:
        _reset(sockets)


# --- slow readers, in process -----------------------------------------------------------------


def _slow_reader(server: MetricsServer, source: str) -> socket.socket:
    """A client from ``source`` (a loopback address of its own) that asks for /metrics and
    never reads: its 4 KiB receive buffer (set before connecting, so the kernel does not grow
    it) stalls the answer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect(("127.0.0.1", server.address.port))
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock


def _request(server: MetricsServer, source: str, path: str) -> tuple[int, int] | None:
    """``path``'s status and body length for a client from ``source``, or None when it got no
    answer within PROBE_TIMEOUT."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", server.address.port, timeout=PROBE_TIMEOUT, source_address=(source, 0)
    )
    try:
        connection.request("GET", path, headers={"Connection": "close"})
        reply = connection.getresponse()
        return reply.status, len(reply.read())
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()


def _stalled(server: MetricsServer) -> int:
    """Connections writing a whole BODY that stalled (a probe's answer is not one)."""
    return sum(
        1
        for c in list(server.connections._connections)
        if c.state == connections.WRITING and sum(map(len, c.parts)) >= BODY
    )


def _settled(server: MetricsServer, expected: int) -> bool:
    """Every slow reader accepted and its answer stalled, or its connection closed to make
    room: ``expected`` of them accounted for."""
    dropped = sum(n for reason, n in server.connections.dropped.items() if "evicted" in reason)
    return _stalled(server) + dropped >= expected


@pytest.mark.slow
def test_slow_readers_from_many_addresses_leave_the_probes_and_a_scrape_answered(
    serve,  # noqa: F811
) -> None:
    """MAX_CONNECTIONS slow readers, spread over as many addresses as the per-client cap needs
    to fill the server: the loopback probe (the image's HEALTHCHECK), a probe from a new address
    (the kubelet's) and a scrape are answered, each by closing the writer stalled longest."""
    server, _ = serve(BigRenderer())
    share = connections.MAX_CONNECTIONS_PER_CLIENT
    sources = [f"127.0.1.{n}" for n in range(1, connections.MAX_CONNECTIONS // share + 1)]
    held = [_slow_reader(server, source) for source in sources for _ in range(share)]
    try:
        wait_for(lambda: _settled(server, len(held)), timeout=60)
        assert server.connections.open_connections >= connections.MAX_CONNECTIONS - 1
        answers = [
            _request(server, "127.0.0.1", "/healthz"),
            _request(server, "127.0.2.1", "/readyz"),
            _request(server, "127.0.2.2", "/metrics"),
        ]
        print(f"answers {answers}; dropped {dict(server.connections.dropped)}")
        assert answers == [(200, 3), (200, 3), (200, BODY)]
        assert server.connections.dropped["evicted (full)"] >= 1  # then the probe's slot
    finally:
        for sock in held:
            sock.close()


@pytest.mark.slow
def test_slow_readers_from_one_address_hold_its_share_only(serve) -> None:  # noqa: F811
    """MAX_CONNECTIONS slow readers from one address: it holds MAX_CONNECTIONS_PER_CLIENT
    connections, its oldest stalled writers closed to make room for its own new ones; a probe
    from that very address (a tenant on the node shares it with the kubelet) is answered too."""
    server, _ = serve(BigRenderer())
    held = [_slow_reader(server, "127.0.3.1") for _ in range(connections.MAX_CONNECTIONS)]
    try:
        wait_for(lambda: _settled(server, len(held)), timeout=60)
        assert server.connections.open_connections <= connections.MAX_CONNECTIONS_PER_CLIENT
        answers = [
            _request(server, "127.0.3.1", "/healthz"),
            _request(server, "127.0.0.1", "/healthz"),
            _request(server, "127.0.3.2", "/metrics"),
        ]
        print(f"answers {answers}; dropped {dict(server.connections.dropped)}")
        assert answers == [(200, 3), (200, 3), (200, BODY)]
        assert server.connections.dropped["evicted (client cap)"] >= (
            connections.MAX_CONNECTIONS - connections.MAX_CONNECTIONS_PER_CLIENT
        )
    finally:
        for sock in held:
            sock.close()


def _until_slow_readers_stall(server: MetricsServer) -> None:
    """Until no slow reader's answer moves for 0.3 s: its first MiBs go into the kernel's
    buffers on loopback, and each send is progress until they are full."""

    def turns() -> dict[int, int]:
        return {
            id(c): c.turn
            for c in list(server.connections._connections)
            if c.state == connections.WRITING and c.client[0].startswith("127.0.4.")
        }

    before = turns()
    while True:
        time.sleep(0.3)
        now = turns()
        if now == before:
            return
        before = now


def test_a_scrape_that_reads_is_not_closed_for_stalled_ones(
    serve,  # noqa: F811
    monkeypatch,
) -> None:
    """A scraper reading its answer makes progress: at the cap, the writers that stalled
    before it go first, however late they came. Progress is a send, so a reader is seen
    progressing once it has drained the kernel's buffers: left, a reader that reads less than
    them between two newcomers can be taken for stalled."""
    monkeypatch.setattr(connections, "MAX_CONNECTIONS", 8)
    server, _ = serve(BigRenderer())
    # A small receive buffer, as the slow readers': each MiB it reads is one the server sends
    # then (its progress), not one loopback's large buffers held before the next reader came.
    reading = socket.socket()
    reading.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    reading.settimeout(10)
    reading.connect(("127.0.0.1", server.address.port))
    reading.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    got = len(reading.recv(65536))
    held = [_slow_reader(server, f"127.0.4.{n}") for n in range(1, 8)]
    try:
        wait_for(lambda: _stalled(server) >= 8)
        # New slow readers keep coming; the reader goes on reading, each time more than the
        # kernel's buffers hold (a 4 MiB send buffer at most here: tcp_wmem), so the server has
        # sent it more since the last one came.
        for n in range(8, 11):
            while got < 5 * 1024 * 1024 * (n - 7):
                chunk = reading.recv(1024 * 1024)
                assert chunk, f"the reading scraper was closed after {got} bytes"
                got += len(chunk)
            held.append(_slow_reader(server, f"127.0.4.{n}"))
            wait_for(lambda n=n: _settled(server, n + 1))  # the reader is a writer too
            _until_slow_readers_stall(server)
        while chunk := reading.recv(1024 * 1024):
            got += len(chunk)
            if got >= BODY:
                break
        assert got >= BODY  # the whole answer (its head and body), never cut
        assert server.connections.dropped["evicted (full)"] >= 3  # the stalled went
    finally:
        reading.close()
        for sock in held:
            sock.close()


class _Held(BigRenderer):
    """A renderer, and a liveness check, that wait until ``release``: requests stay handled."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def render_parts(self, encoder: object) -> tuple[bytes, bytes]:
        self.release.wait(30)
        return super().render_parts(encoder)

    def liveness(self) -> None:
        self.release.wait(30)


def test_a_probe_in_hand_is_never_closed_to_make_room() -> None:
    """The kubelet shares the node's address with every hostNetwork pod: a burst of requests
    from it, all in handlers' hands, closes the oldest of them to make room for the newest,
    and never the probe's."""
    held_renderer = _Held()
    server = MetricsServer(
        WebConfig(listen_address="127.0.0.1:0"),
        held_renderer,  # type: ignore[arg-type]
        liveness=held_renderer.liveness,
    )
    server.start()
    answer: list[tuple[int, int] | None] = []
    prober = threading.Thread(
        target=lambda: answer.append(_request(server, "127.0.5.1", "/healthz"))
    )
    burst: list[socket.socket] = []
    try:
        prober.start()
        wait_for(lambda: [c.state for c in list(server.connections._connections)] == ["handling"])
        for _ in range(2 * connections.MAX_CONNECTIONS_PER_CLIENT):
            burst.append(_slow_reader(server, "127.0.5.1"))
        wait_for(lambda: server.connections.dropped["evicted (client cap)"]
                 >= connections.MAX_CONNECTIONS_PER_CLIENT)  # fmt: skip
        held_renderer.release.set()
        prober.join(PROBE_TIMEOUT + 1)
        assert answer == [(200, 3)]
    finally:
        held_renderer.release.set()
        for sock in burst:
            sock.close()
        server.stop()


def test_a_connection_whose_opening_fails_holds_no_slot(
    serve,  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug in a new connection's first read (after it joined the tables) costs that
    connection only: it leaves every table, not holding its address's slot until a deadline
    that it may never get, and the next client is answered."""
    server, _ = serve(BigRenderer())
    real_read = connections.ConnectionLoop._read
    failed: list[bool] = []

    def read_once_broken(self: connections.ConnectionLoop, connection: object) -> None:
        if not failed:
            failed.append(True)
            raise RuntimeError("a bug")
        real_read(self, connection)  # type: ignore[arg-type]

    monkeypatch.setattr(connections.ConnectionLoop, "_read", read_once_broken)
    broken = socket.create_connection(("127.0.0.1", server.address.port))
    try:
        wait_for(lambda: failed)
        wait_for(lambda: server.connections.open_connections == 0)
        assert server.connections._by_client == {}
        assert _request(server, "127.0.6.1", "/healthz") == (200, 3)
    finally:
        broken.close()


def test_a_scrape_waiting_longest_in_hand_is_not_closed_for_its_address_s_burst() -> None:
    """A scrape in a handler's hands, then a burst of requests from its own address (a flood of
    password guesses beside Prometheus, a tenant sharing the node's address): at the address's
    cap the newest requests in hand make room, not the scrape that has waited longest. Before,
    the oldest did: the scrape was closed unanswered."""
    held_renderer = _Held()
    server = MetricsServer(
        WebConfig(listen_address="127.0.0.1:0"),
        held_renderer,  # type: ignore[arg-type]
        liveness=lambda: None,
    )
    server.start()
    answer: list[tuple[int, int] | None] = []
    scraper = threading.Thread(
        target=lambda: answer.append(_request(server, "127.0.7.1", "/metrics"))
    )
    burst: list[socket.socket] = []
    try:
        scraper.start()
        wait_for(lambda: [c.state for c in list(server.connections._connections)] == ["handling"])
        for _ in range(2 * connections.MAX_CONNECTIONS_PER_CLIENT):
            burst.append(_slow_reader(server, "127.0.7.1"))
        wait_for(lambda: server.connections.dropped["evicted (client cap)"]
                 >= connections.MAX_CONNECTIONS_PER_CLIENT)  # fmt: skip
        held_renderer.release.set()
        scraper.join(PROBE_TIMEOUT + 10)
        assert answer == [(200, BODY)]
    finally:
        held_renderer.release.set()
        for sock in burst:
            sock.close()
        server.stop()
