"""The connections behind the metrics server: one thread owns every socket.

Anyone who can reach the port may open connections, hold them idle, send a request one byte at
a time, or never read the answer. None of that may cost a thread, nor the probes their answer:
the loop accepts, negotiates TLS, reads each request's head and writes each answer without
blocking, and hands a complete head to a bounded pool of handler threads (``dispatch``), which
answer through ``respond``. So a handler thread only ever computes (renders, checks a
password); the network's pace is the loop's business, with a deadline for every state:

    handshake  TLS must be negotiated within HANDSHAKE_SECONDS
    reading    a new connection's first request, and any request once its first byte came,
               must be whole within REQUEST_SECONDS; a kept-alive connection may wait
               IDLE_SECONDS for its next one
    handling   with a handler thread (no deadline here: the handler's own work is bounded)
    delayed    a refusal held back before it is written (``respond``'s ``delay``), so a client
               that retries at once cannot make the server answer it as fast as it asks
    writing    the answer must be out within WRITE_SECONDS
    lingering  after the last answer, the client's leftovers are read and dropped for at most
               LINGER_SECONDS (so that closing does not reset the answer away)

At most MAX_CONNECTIONS are open, and at most MAX_CONNECTIONS_PER_CLIENT from one address.
Beyond either, a new connection is still let in: the connection waiting longest for a request
makes room, else the writer that has made no progress for longest (however little it has left
to write), else the request handed to a handler most recently (its answer is dropped), never a
probe's; among that address's own connections at its cap, among all at the server's. So a storm
of clients that ask and never read cannot keep a probe or a scrape out, and one address cannot
take more than its share. Answers waiting to be written hold at most MAX_PENDING_OUTPUT
bytes; beyond, the writer that has made no progress for longest is dropped. The budgets are in
docs/security.md.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 512
# From one client address. Prometheus (even an HA pair behind one NAT), the kubelet's probes, a
# load balancer's checks take a few each; the kubelet shares the node's address with every
# hostNetwork pod, whose surplus closes its own connections, not the probes' (a new connection
# always gets in). Above the 50 concurrent scrapers of the load test and bench (at 32 their
# connections closed one another's scrapes: 3,446 errors in 10 s). 8 addresses at the cap
# fill the server.
MAX_CONNECTIONS_PER_CLIENT = 64
MAX_HEAD_BYTES = 16 * 1024  # request line and headers; Prometheus sends about 300 bytes
MAX_PENDING_OUTPUT = 64 * 1024 * 1024  # distinct answer bytes held for slow readers
HANDSHAKE_SECONDS = 10.0
REQUEST_SECONDS = 10.0
IDLE_SECONDS = 120.0  # longer than any scrape interval, so Prometheus' connection is kept
WRITE_SECONDS = 60.0
LINGER_SECONDS = 2.0
MAX_LINGER_BYTES = 64 * 1024
ACCEPTS_PER_TURN = 64  # then the loop looks at the connections it has (a probe among them)
_SEND_CHUNK = 256 * 1024
_RECV_CHUNK = 64 * 1024
_LONGEST_WAIT = 1.0  # the loop looks at its clock at least this often

HANDSHAKE, READING, HANDLING, DELAYED, WRITING, LINGERING, CLOSED = (
    "handshake", "reading", "handling", "delayed", "writing", "lingering", "closed",
)  # fmt: skip
_EVICTABLE = (HANDSHAKE, READING, DELAYED, LINGERING)
_HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 25\r\nConnection: close\r\n\r\nrequest head is too large"
)


@dataclass(eq=False)
class Connection:
    sock: socket.socket
    client: tuple[Any, ...]
    tls: bool
    state: str = READING
    buffer: bytearray = field(default_factory=bytearray)
    deadline: float = 0.0
    since: float = 0.0  # when it entered its state
    progressed: float = 0.0  # writing: when a send last took bytes
    # Its place in the order in which connections are closed to make room (lowest first): a
    # serial taken when it entered its state or, writing, when a send last took bytes. Ties of
    # the clock (a coarse one, or a test's) cannot reorder it.
    turn: int = 0
    out: deque[memoryview] = field(default_factory=deque)
    parts: Sequence[bytes] = ()  # the answer being written (held in the output budget)
    close_after: bool = False
    lingered: int = 0
    events: int = 0  # what the selector watches for it
    exchange: Exchange | None = None
    delayed: tuple[Sequence[bytes], bool] = ((), True)  # the answer held back, and close_after


@dataclass(eq=False)
class Exchange:
    """One request's head, handed to a handler thread; ``respond`` with its answer."""

    connection: Connection
    head: bytes
    client: tuple[Any, ...]
    decided: Any = None  # for the handler: what an earlier pass of this request decided
    probe: bool = False  # set by ``dispatch``: its connection is not closed to make room

    @property
    def abandoned(self) -> bool:
        """Its connection was closed (to make room, or stopping): nothing to answer."""
        return self.connection.exchange is not self


class ConnectionLoop:
    """Accepts on ``listener`` and runs every connection; ``dispatch(exchange)`` is called on
    the loop's thread with each complete request head and must not block."""

    def __init__(
        self,
        listener: socket.socket,
        tls: ssl.SSLContext | None,
        dispatch: Callable[[Exchange], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.dropped: Counter[str] = Counter()  # connections closed by the loop, by reason
        self._listener = listener
        self._tls = tls
        self._dispatch = dispatch
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        for end in (listener, self._wake_r, self._wake_w):
            end.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._accepting = True
        self._resume_accepting_at: float | None = None
        self._connections: set[Connection] = set()
        # Connections that may be closed to make room, oldest in their state first.
        self._evictable: OrderedDict[Connection, None] = OrderedDict()
        # Connections writing, the one that made progress longest ago first; and handled,
        # the oldest request first: when nothing is evictable, writers make room oldest first, then
        # handled requests newest first (_victim).
        self._writers: OrderedDict[Connection, None] = OrderedDict()
        self._handling: OrderedDict[Connection, None] = OrderedDict()
        self._by_client: dict[Any, set[Connection]] = {}
        self._deadlines: list[tuple[float, int, Connection]] = []
        self._serial = itertools.count()
        self._held: dict[int, list[int]] = {}  # id(part) -> [size, holders]
        self._held_bytes = 0
        self._answers: queue.SimpleQueue[tuple[Exchange, Sequence[bytes], bool, float]] = (
            queue.SimpleQueue()
        )
        self._stopping = threading.Event()

    # --- for other threads ----------------------------------------------------------------

    def respond(
        self, exchange: Exchange, parts: Sequence[bytes], close: bool, delay: float = 0.0
    ) -> None:
        """The answer to ``exchange`` (no parts: none, close the connection), written after
        ``delay`` seconds; any thread."""
        self._answers.put((exchange, parts, close, delay))
        self.wake()

    def wake(self) -> None:
        """Make the loop look at its answers and its clock now (tests move a fake clock)."""
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"\0")

    def stop(self) -> None:
        self._stopping.set()
        self.wake()

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    # --- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                for key, _ in self._selector.select(self._wait()):
                    if key.data == "listener":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    elif key.data.state != CLOSED:
                        self._guarded(self._ready, key.data)
                self._take_answers()
                self._expire(self.clock())
                self._maybe_resume_accepting()
        finally:
            for connection in list(self._connections):
                self._close(connection)
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _wait(self) -> float:
        now = self.clock()
        wait = _LONGEST_WAIT
        if self._deadlines:
            wait = min(wait, self._deadlines[0][0] - now)
        if self._resume_accepting_at is not None:
            wait = min(wait, self._resume_accepting_at - now)
        return max(0.0, wait)

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while self._wake_r.recv(4096):
                pass

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            if len(self._connections) >= MAX_CONNECTIONS and not self._can_make_room():
                self._pause_accepting(None)  # until a connection closes or may be closed
                return
            try:
                sock, client = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors or memory: make room, and give the kernel a moment.
                    log.warning("cannot accept a connection: %s", error.strerror)
                    if not self._evict("out of descriptors"):
                        self._pause_accepting(self.clock() + 0.1)
                    return
                continue  # ECONNABORTED and the like: that client is gone
            if not self._make_room(client[0]):
                self.dropped["refused (client cap)"] += 1
                sock.close()
                continue
            try:
                self._open(sock, client)
            except Exception:
                log.exception("opening a connection from %s failed", client[0])
                sock.close()

    def _open(self, sock: socket.socket, client: tuple[Any, ...]) -> None:
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            # Headers and body go out in separate sends; Nagle would hold the body 40 ms.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        now = self.clock()
        if self._tls is not None:
            try:
                sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (ssl.SSLError, OSError):
                sock.close()
                return
        connection = Connection(sock, client, tls=self._tls is not None)
        self._connections.add(connection)
        self._by_client.setdefault(client[0], set()).add(connection)
        try:
            if connection.tls:
                self._enter(connection, HANDSHAKE, now + HANDSHAKE_SECONDS, now)
                self._handshake(connection)
            else:
                self._enter(connection, READING, now + REQUEST_SECONDS, now)
                self._read(connection)
        except Exception:
            self._close(connection)  # out of every table, not left to hold its slot
            raise

    def _ready(self, connection: Connection) -> None:
        if connection.state == HANDSHAKE:
            self._handshake(connection)
        elif connection.state == READING:
            self._read(connection)
        elif connection.state == WRITING:
            self._write(connection)
        elif connection.state == LINGERING:
            self._discard(connection)

    # --- states ---------------------------------------------------------------------------

    def _enter(self, connection: Connection, state: str, deadline: float, now: float) -> None:
        connection.state, connection.since, connection.deadline = state, now, deadline
        connection.turn = next(self._serial)
        self._evictable.pop(connection, None)
        self._handling.pop(connection, None)
        if state in _EVICTABLE:
            self._evictable[connection] = None
        elif state == HANDLING:
            self._handling[connection] = None
        if state != HANDLING:
            self._push_deadline(connection)

    def _set_deadline(self, connection: Connection, deadline: float) -> None:
        """An earlier deadline in the same state (its place among the evictable kept)."""
        if deadline < connection.deadline:
            connection.deadline = deadline
            self._push_deadline(connection)

    def _push_deadline(self, connection: Connection) -> None:
        heapq.heappush(self._deadlines, (connection.deadline, next(self._serial), connection))
        if len(self._deadlines) > 4 * len(self._connections) + 64:  # drop the stale entries
            self._deadlines = [
                (c.deadline, next(self._serial), c)
                for c in self._connections
                if c.state != HANDLING
            ]
            heapq.heapify(self._deadlines)

    def _watch(self, connection: Connection, events: int) -> None:
        if events == connection.events:
            return
        if connection.events == 0:
            self._selector.register(connection.sock, events, connection)
        elif events == 0:
            self._selector.unregister(connection.sock)
        else:
            self._selector.modify(connection.sock, events, connection)
        connection.events = events

    def _handshake(self, connection: Connection) -> None:
        try:
            connection.sock.do_handshake()  # type: ignore[attr-defined]
        except ssl.SSLWantReadError:
            self._watch(connection, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(connection, selectors.EVENT_WRITE)
            return
        except (ssl.SSLError, OSError) as error:
            log.debug("TLS handshake with %s failed: %s", connection.client, error)
            self._close(connection)
            return
        now = self.clock()
        self._enter(connection, READING, now + REQUEST_SECONDS, now)
        self._read(connection)

    def _read(self, connection: Connection) -> None:
        """Reads what has come of the next request's head; dispatches it once whole."""
        while True:
            room = MAX_HEAD_BYTES - len(connection.buffer)
            if room <= 0:
                break
            try:
                data = connection.sock.recv(min(room, _RECV_CHUNK))
            except (BlockingIOError, ssl.SSLWantReadError):
                self._watch(connection, selectors.EVENT_READ)
                break
            except ssl.SSLWantWriteError:
                self._watch(connection, selectors.EVENT_WRITE)
                break
            except OSError:  # ssl.SSLError included: a reset, a broken record
                self._close(connection)
                return
            if not data:
                self._close(connection)  # the client is done (or gave up)
                return
            if not connection.buffer:
                # The request has begun: it must be whole within REQUEST_SECONDS, however
                # slowly its bytes arrive (a per-read timeout would let a drip go on forever).
                self._set_deadline(connection, self.clock() + REQUEST_SECONDS)
            connection.buffer += data
            # TLS may hold decrypted bytes the selector cannot see; plain sockets are read
            # again when the selector says so.
            if not (connection.tls and connection.sock.pending()):  # type: ignore[attr-defined]
                break
        self._dispatch_head(connection)

    def _dispatch_head(self, connection: Connection) -> None:
        end = _head_end(connection.buffer)
        if end is None:
            if len(connection.buffer) >= MAX_HEAD_BYTES:
                self.dropped["head too large"] += 1
                connection.buffer.clear()
                self._send(connection, (_HEAD_TOO_LARGE,), close=True)
            return
        head = bytes(connection.buffer[:end])
        del connection.buffer[:end]
        self._enter(connection, HANDLING, 0.0, self.clock())
        self._watch(connection, 0)  # nothing more is read until this request is answered
        connection.exchange = Exchange(connection, head, connection.client)
        self._dispatch(connection.exchange)

    def _take_answers(self) -> None:
        while True:
            try:
                exchange, parts, close, delay = self._answers.get_nowait()
            except queue.Empty:
                return
            connection = exchange.connection
            if connection.state != HANDLING or connection.exchange is not exchange:
                continue  # closed meanwhile (stopping)
            connection.exchange = None
            if not parts:
                self._close(connection)
            elif delay > 0:
                now = self.clock()
                connection.delayed = (parts, close)
                self._enter(connection, DELAYED, now + delay, now)
            else:
                self._guarded(self._send, connection, parts, close)

    def _guarded(self, step: Callable[..., None], connection: Connection, *args: Any) -> None:
        """``step`` on ``connection``; a bug there costs that connection, not the loop."""
        try:
            step(connection, *args)
        except Exception:
            log.exception("connection from %s failed", connection.client[0])
            self._close(connection)

    def _send(self, connection: Connection, parts: Sequence[bytes], close: bool) -> None:
        now = self.clock()
        connection.parts = tuple(part for part in parts if part)
        connection.out = deque(memoryview(part) for part in connection.parts)
        connection.close_after = close
        connection.progressed = now
        self._hold(connection.parts)
        self._writers[connection] = None
        self._writers.move_to_end(connection)
        self._enter(connection, WRITING, now + WRITE_SECONDS, now)
        self._write(connection)
        if connection.state == WRITING:
            self._shed_output(keep=connection)

    def _write(self, connection: Connection) -> None:
        while connection.out:
            view = connection.out[0]
            try:
                sent = connection.sock.send(view[:_SEND_CHUNK])
            except (BlockingIOError, ssl.SSLWantWriteError):
                self._watch(connection, selectors.EVENT_WRITE)
                return
            except ssl.SSLWantReadError:
                self._watch(connection, selectors.EVENT_READ)
                return
            except OSError:
                self._close(connection)
                return
            connection.progressed = self.clock()
            connection.turn = next(self._serial)
            self._writers.move_to_end(connection)
            if sent >= len(view):
                connection.out.popleft()
            else:
                connection.out[0] = view[sent:]
        self._written(connection)

    def _written(self, connection: Connection) -> None:
        self._release(connection)
        now = self.clock()
        if connection.close_after:
            self._linger(connection, now)
            return
        # Kept alive: the next request may already be here (pipelined, or held by TLS).
        wait = REQUEST_SECONDS if connection.buffer else IDLE_SECONDS
        self._enter(connection, READING, now + wait, now)
        self._watch(connection, selectors.EVENT_READ)
        if connection.buffer:
            self._dispatch_head(connection)
        if connection.state == READING:
            self._read(connection)

    def _linger(self, connection: Connection, now: float) -> None:
        if connection.tls:
            self._close(connection)  # no half-close in TLS; its clients read to the length
            return
        try:
            connection.sock.shutdown(socket.SHUT_WR)  # the client sees the end at once
        except OSError:
            self._close(connection)
            return
        connection.buffer.clear()
        self._enter(connection, LINGERING, now + LINGER_SECONDS, now)
        self._watch(connection, selectors.EVENT_READ)
        self._discard(connection)

    def _discard(self, connection: Connection) -> None:
        try:
            data = connection.sock.recv(_RECV_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        connection.lingered += len(data)
        if not data or connection.lingered > MAX_LINGER_BYTES:
            self._close(connection)

    # --- budgets --------------------------------------------------------------------------

    def _expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, connection = heapq.heappop(self._deadlines)
            if connection.state in (CLOSED, HANDLING) or connection.deadline != deadline:
                continue  # a stale entry: the connection moved on
            if connection.state == DELAYED:  # its time has come: the answer goes out
                parts, close = connection.delayed
                connection.delayed = ((), True)
                self._guarded(self._send, connection, parts, close)
                continue
            reason = connection.state
            if connection.state == READING:
                reason = "slow request" if connection.buffer else "idle"
            if connection.state != LINGERING:
                self.dropped[reason] += 1
            self._close(connection)

    def _can_make_room(self) -> bool:
        return self._victim(None) is not None

    def _make_room(self, address: Any) -> bool:
        """Room for a new connection from ``address``: at its cap, one of its own is closed;
        at the server's, one of anyone's. False when none may be (only probes are open)."""
        own = self._by_client.get(address)
        if own is not None and len(own) >= MAX_CONNECTIONS_PER_CLIENT:
            return self._evict("client cap", own)
        if len(self._connections) >= MAX_CONNECTIONS:
            return self._evict("full")
        return True

    def _evict(self, reason: str, among: set[Connection] | None = None) -> bool:
        """Close the first of ``among`` (default: all) in _victim's order; False when none."""
        connection = self._victim(among)
        if connection is None:
            return False
        self.dropped[f"evicted ({reason})"] += 1
        self._close(connection)
        return True

    def _victim(self, among: set[Connection] | None) -> Connection | None:
        """The connection waiting longest in an evictable state; else the writer that made
        progress longest ago, whatever it has left to write (a client that never reads renews
        its write deadline with each request); else the request handed to a handler most
        recently: one that has waited longest (Prometheus' behind a flood of its own address's
        password guesses) is not the flood's to close. Never a probe's request: its connection
        is answered in a moment."""
        for tier, newest in ((self._evictable, False), (self._writers, False),
                             (self._handling, True)):  # fmt: skip
            if among is None:  # each tier is in oldest-first order already
                order = reversed(tier) if newest else iter(tier)
                found = next((c for c in order if not _probe(c)), None)
            else:  # at most MAX_CONNECTIONS_PER_CLIENT
                pick = max if newest else min
                found = pick((c for c in among if c in tier and not _probe(c)), default=None,
                             key=lambda c: c.turn)  # fmt: skip
            if found is not None:
                return found
        return None

    def _hold(self, parts: Sequence[bytes]) -> None:
        # Parts are counted once however many answers share them (the renderer hands every
        # scraper of one snapshot the same body).
        for part in parts:
            held = self._held.get(id(part))
            if held is None:
                self._held[id(part)] = [len(part), 1]
                self._held_bytes += len(part)
            else:
                held[1] += 1

    def _release(self, connection: Connection) -> None:
        self._writers.pop(connection, None)
        for part in connection.parts:
            held = self._held[id(part)]
            held[1] -= 1
            if held[1] == 0:
                del self._held[id(part)]
                self._held_bytes -= held[0]
        connection.parts, connection.out = (), deque()

    def _shed_output(self, keep: Connection) -> None:
        """Over the output budget, drop the writers stalled longest (never ``keep``)."""
        while self._held_bytes > MAX_PENDING_OUTPUT:
            stalled = next((c for c in self._writers if c is not keep), None)
            if stalled is None:
                return
            self.dropped["stalled writer"] += 1
            self._close(stalled)

    def _pause_accepting(self, until: float | None) -> None:
        if self._accepting:
            self._selector.unregister(self._listener)
            self._accepting = False
        self._resume_accepting_at = until

    def _maybe_resume_accepting(self) -> None:
        if self._accepting:
            return
        if len(self._connections) >= MAX_CONNECTIONS and not self._can_make_room():
            return
        if self._resume_accepting_at is not None and self.clock() < self._resume_accepting_at:
            return
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._accepting = True
        self._resume_accepting_at = None

    def _close(self, connection: Connection) -> None:
        if connection.state == CLOSED:
            return
        if connection.parts:
            self._release(connection)
        self._writers.pop(connection, None)
        self._watch(connection, 0)
        connection.state = CLOSED
        connection.exchange = None
        connection.delayed = ((), True)
        self._evictable.pop(connection, None)
        self._handling.pop(connection, None)
        self._connections.discard(connection)
        own = self._by_client.get(connection.client[0])
        if own is not None:
            own.discard(connection)
            if not own:
                del self._by_client[connection.client[0]]
        with contextlib.suppress(OSError):
            connection.sock.close()


def _probe(connection: Connection) -> bool:
    return connection.exchange is not None and connection.exchange.probe


def _head_end(buffer: bytearray) -> int | None:
    """Where a request's head ends (after its blank line), or None while it is incomplete.
    Lines may end in LF alone, as http.server reads them."""
    ends = [at + len(mark) for mark in (b"\n\r\n", b"\n\n") if (at := buffer.find(mark)) >= 0]
    return min(ends) if ends else None
