"""HTTP: the landing page, /metrics, /healthz, /readyz and /runbooks. Renders the current
snapshot; no other I/O.

The sockets are the connection loop's (connections.py): it hands each complete request head to
a bounded pool of handler threads, the probes to a pool of their own, so neither a storm of
connections nor slow clients nor a flood of password guesses can keep /healthz and /readyz
from answering (docs/security.md, "The metrics endpoint").
"""

from __future__ import annotations

import base64
import errno
import gzip
import io
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from prometheus_client.exposition import choose_encoder

from checkpoint_exporter import __version__
from checkpoint_exporter.config import ListenAddress, WebConfig, parse_listen_address
from checkpoint_exporter.exposition import landing, runbooks_page
from checkpoint_exporter.exposition.connections import ConnectionLoop, Exchange
from checkpoint_exporter.exposition.renderer import Encoder, Renderer
from checkpoint_exporter.webconfig import WebSecurity

log = logging.getLogger(__name__)


# Answered without authentication: the probes (kubelet, systemd, a load balancer) have no
# credentials, and the answers say only "ok" or why not (a reason that names no job or path).
# Everything else, the landing page and the runbooks included, needs them (docs/security.md).
UNAUTHENTICATED_PATHS = ("/healthz", "/readyz")
# Handler threads: they only compute (the loop does the network, the password checker the
# waiting), so a few are enough; the probes have their own, so a queue of renders never delays
# them.
WORKERS = 8
PROBE_WORKERS = 2
# A 429 is written this long after it is decided (its Retry-After): a client that retries at
# once is held to about one refusal a second per connection, instead of as many as the server
# can write (the held connection costs a socket, and is the first to go when room is needed).
REFUSAL_DELAY_SECONDS = 1.0
# socketserver's default listen backlog is 5: a burst of connections (several Prometheus
# replicas, a probe, a few slow clients) would have SYNs dropped and wait out a 1 s retransmit.
# The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 1024


def _listen(host: str, port: int) -> socket.socket:
    if host:
        candidates = [(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0], host)]
    else:
        # ":port" means every interface: IPv6 with IPv4 mapped in, else plain IPv4.
        candidates = [(socket.AF_INET6, "::")] if socket.has_ipv6 else []
        candidates.append((socket.AF_INET, "0.0.0.0"))
    for attempt, (family, bind_host) in enumerate(candidates, start=1):
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            # Prometheus restarts scrapes quickly after an exporter restart: no TIME_WAIT wait.
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and bind_host == "::":
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            listener.bind((bind_host, port))
            listener.listen(LISTEN_BACKLOG)
            return listener
        except OSError as error:
            listener.close()
            if attempt == len(candidates) or error.errno == errno.EADDRINUSE:
                raise
            log.debug("cannot listen on %s (%s); trying the next address family", bind_host, error)
    raise AssertionError("unreachable")


class _Pool:
    """``size`` daemon threads running ``handle`` on what is put."""

    def __init__(self, name: str, size: int, handle: Callable[[Exchange], None]) -> None:
        self._queue: queue.SimpleQueue[Exchange | None] = queue.SimpleQueue()
        self._handle = handle
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{n}", daemon=True) for n in range(size)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def put(self, exchange: Exchange) -> None:
        self._queue.put(exchange)

    def stop(self) -> None:
        for _ in self._threads:
            self._queue.put(None)

    def _run(self) -> None:
        while (exchange := self._queue.get()) is not None:
            try:
                self._handle(exchange)
            except Exception:
                log.exception("handling a request failed")


HealthCheck = Callable[[], str | None]  # None: healthy (or ready); else the reason it is not


class MetricsServer:
    """Serves ``renderer``'s scrapes, a landing page built from its snapshot, the probes and
    the runbooks.

    ``liveness`` backs /healthz: it should fail only when the core is wedged, since the kubelet
    restarts the process when it does. ``readiness`` backs /readyz (the first pass is not
    finished). Without them, both answer "ok".
    """

    def __init__(
        self,
        web: WebConfig,
        renderer: Renderer,
        security: WebSecurity | None = None,
        *,
        liveness: HealthCheck | None = None,
        readiness: HealthCheck | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.web = web
        self.renderer = renderer
        self.security = security or WebSecurity()
        self.liveness = liveness
        self.readiness = readiness
        address = parse_listen_address(web.listen_address)
        self._listener = _listen(address.host, address.port)
        self.connections = ConnectionLoop(
            self._listener, self.security.tls, self._dispatch, clock=clock
        )
        self._handlers = _Pool("http", WORKERS, self._handle)
        self._probes = _Pool("http-probe", PROBE_WORKERS, self._handle)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> ListenAddress:
        host, port = self._listener.getsockname()[:2]
        return ListenAddress(str(host), int(port))

    @property
    def url(self) -> str:
        address = self.address
        if address.host in ("::", "0.0.0.0"):
            address = ListenAddress("localhost", address.port)
        scheme = "https" if self.security.tls is not None else "http"
        return f"{scheme}://{address}{self.web.telemetry_path}"

    def render(self, encoder: Encoder) -> tuple[bytes, ...]:
        return self.renderer.render_parts(encoder)

    def start(self) -> None:
        self._handlers.start()
        self._probes.start()
        self._thread = threading.Thread(target=self.connections.run, name="http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.connections.stop()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._handlers.stop()
        self._probes.stop()
        self._listener.close()

    def _dispatch(self, exchange: Exchange) -> None:
        """On the loop's thread: a probe to the probes' pool, anything else to the handlers."""
        request_line = exchange.head.split(b"\n", 1)[0].split()
        path = _path(request_line[1].decode("latin-1")) if len(request_line) == 3 else None
        exchange.probe = path in UNAUTHENTICATED_PATHS and path != self.web.telemetry_path
        (self._probes if exchange.probe else self._handlers).put(exchange)

    def _handle(self, exchange: Exchange) -> None:
        if exchange.abandoned:
            return  # its connection was closed to make room: nobody to answer
        try:
            handler = _Handler(self, exchange)
        except Exception:
            log.exception("handling a request from %s failed", exchange.client[0])
            self.connections.respond(exchange, (_FAILED,), close=True)
            return
        credentials = handler.needs_check
        if credentials is None:
            delay = REFUSAL_DELAY_SECONDS if handler.refused else 0.0
            self.connections.respond(
                exchange, handler.output.parts, handler.close_connection, delay
            )
            return

        def checked(verdict: bool | None) -> None:
            exchange.decided = (credentials, verdict)
            self._handlers.put(exchange)  # answered again, the verdict now known

        if not self.security.check_later(*credentials, str(exchange.client[0]), checked):
            exchange.decided = (credentials, None)  # no room to wait: 429
            self._handle(exchange)


_FAILED = (
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 22\r\nConnection: close\r\n\r\nerror handling request"
)


def _path(target: str) -> str | None:
    """The path of a request target, or None when it cannot be parsed (an unclosed IPv6
    literal makes urlsplit raise)."""
    try:
        return urlsplit(target).path
    except ValueError:
        return None


class _Output:
    """What a handler writes: kept as parts (a rendered body is not copied) for the loop."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        if data:
            self.parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass


def gzip_accepted(header: str) -> bool:
    """Whether an Accept-Encoding header (RFC 9110 12.5.3) takes gzip.

    prometheus_client's gzip_accepted ignores quality values, so ``gzip;q=0`` ("never gzip")
    would get gzip; here a coding with q=0 is refused, and ``*`` stands for gzip unless gzip is
    named. A malformed quality value counts as 0: when in doubt, send identity."""
    gzip_q: float | None = None
    any_q: float | None = None
    for item in header.split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        coding = coding.lower()
        if not coding:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
                if not 0.0 <= q <= 1.0:  # nan and out-of-range values included
                    q = 0.0
        if coding in ("gzip", "x-gzip"):
            gzip_q = q if gzip_q is None else max(gzip_q, q)
        elif coding == "*":
            any_q = q
    if gzip_q is not None:
        return gzip_q > 0
    return any_q is not None and any_q > 0


class _Handler(BaseHTTPRequestHandler):
    """One request, from its head (read by the loop) to its answer (written by the loop)."""

    server_version = f"checkpoint-exporter/{__version__}"
    sys_version = ""  # don't advertise the Python version to the network
    protocol_version = "HTTP/1.1"

    def __init__(self, exporter: MetricsServer, exchange: Exchange) -> None:
        # Not BaseRequestHandler's __init__: there is no socket here, only the head and the
        # answer's parts.
        self.exporter = exporter
        self.exchange = exchange
        self.client_address = exchange.client
        self.rfile = io.BytesIO(exchange.head)
        self.output = _Output()
        self.wfile = self.output  # type: ignore[assignment]
        self.needs_check: tuple[str, str] | None = None  # credentials to check before answering
        self.refused = False  # answered 429: too many password checks waiting
        self.close_connection = True
        self.handle_one_request()
        if self.needs_check is not None:
            self.output.parts.clear()

    def do_GET(self) -> None:
        self._respond(head=False)

    def do_HEAD(self) -> None:
        self._respond(head=True)

    def _respond(self, head: bool) -> None:
        self._head = head
        if self._has_body():
            # The body would otherwise be read as the next request on this connection (a
            # request smuggled past whatever checked this one). Refuse and close instead; the
            # loop reads and drops what the client still sends for a moment before closing,
            # so closing does not reset the connection before the client has read the answer.
            self.close_connection = True
            self._send(400, "text/plain; charset=utf-8", b"a GET or HEAD request has no body\n")
            return
        path = _path(self.path)
        if path is None:
            self.close_connection = True
            self._send(400, "text/plain; charset=utf-8", b"bad request target\n")
            return
        web = self.exporter.web
        public = path in UNAUTHENTICATED_PATHS and path != web.telemetry_path
        if self.exporter.security.users and not public:
            verdict = self._authenticated()
            if verdict is None and self.needs_check is not None:
                return  # answered once the password is checked
            if verdict is None:
                self.refused = True
                self._send(429, "text/plain; charset=utf-8", b"too many password checks\n",
                           extra={"Retry-After": "1"})  # fmt: skip
                return
            if not verdict:
                self._send(401, "text/plain; charset=utf-8", b"unauthorized\n", challenge=True)
                return
        if path == web.telemetry_path:
            self._metrics()
        elif path == "/healthz":
            self._probe(self.exporter.liveness)
        elif path == "/readyz":
            self._probe(self.exporter.readiness)
        elif path == "/" and web.telemetry_path != "/":
            page = landing.render(self.exporter.renderer.snapshot(), web.telemetry_path)
            self._send(200, "text/html; charset=utf-8", page.encode())
        elif path == "/runbooks":
            runbooks = runbooks_page.shipped_page()
            if runbooks is None:
                self._send(404, "text/plain; charset=utf-8", b"no runbooks in this build\n")
            else:
                self._send(200, "text/html; charset=utf-8", runbooks.encode())
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def _has_body(self) -> bool:
        if self.headers.get("Transfer-Encoding") is not None:
            return True
        length = self.headers.get("Content-Length")
        return length is not None and length.strip() != "0"

    def _authenticated(self) -> bool | None:
        """The verdict on the request's credentials; None when there is none yet: either a
        check is needed (``needs_check`` says whose) or the checks were too busy."""
        scheme, _, credentials = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(credentials, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        decided = self.exchange.decided
        if decided is not None and decided[0] == (user, password):
            return decided[1]  # checked for this very request: True, False, or None (busy)
        verdict = self.exporter.security.cached(user, password)
        if verdict is None:
            self.needs_check = (user, password)
        return verdict

    def _probe(self, check: HealthCheck | None) -> None:
        try:
            reason = check() if check is not None else None
        except Exception:
            log.exception("health check failed")
            reason = "the health check itself failed"
        if reason is None:
            self._send(200, "text/plain; charset=utf-8", b"ok\n")
        else:
            self._send(503, "text/plain; charset=utf-8", f"{reason}\n".encode())

    def _metrics(self) -> None:
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        try:
            parts = self.exporter.render(encoder)
        except Exception:
            log.exception("rendering metrics failed")
            self._send(500, "text/plain; charset=utf-8", b"error rendering metrics\n")
            return
        encoding = None
        if gzip_accepted(self.headers.get("Accept-Encoding", "")):
            parts, encoding = (gzip.compress(b"".join(parts), compresslevel=1),), "gzip"
        self._send(200, content_type, parts, encoding)

    def _send(
        self,
        status: int,
        content_type: str,
        body: bytes | Sequence[bytes],
        encoding: str | None = None,
        challenge: bool = False,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        for name, value in {**self.exporter.security.headers, **(extra or {})}.items():
            self.send_header(name, value)
        if challenge:
            self.send_header("WWW-Authenticate", 'Basic realm="checkpoint-exporter"')
        if self.close_connection:
            self.send_header("Connection", "close")
        parts = (body,) if isinstance(body, bytes) else body
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(sum(len(part) for part in parts)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()
        if not self._head:
            for part in parts:
                self.wfile.write(part)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http %s %s", self.address_string(), format % args)
