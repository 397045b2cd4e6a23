"""HTTP: the landing page, /metrics, /healthz, /readyz and /runbooks. Renders the current
snapshot; no other I/O."""

from __future__ import annotations

import base64
import contextlib
import errno
import gzip
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.exposition import choose_encoder

from checkpoint_exporter import __version__
from checkpoint_exporter.config import ListenAddress, WebConfig, parse_listen_address
from checkpoint_exporter.exposition import landing, runbooks_page
from checkpoint_exporter.exposition.renderer import Encoder, Renderer
from checkpoint_exporter.webconfig import AuthBusy, WebSecurity

log = logging.getLogger(__name__)


# Answered without authentication: the probes (kubelet, systemd, a load balancer) have no
# credentials, and the answers say only "ok" or why not (a reason that names no job or path).
# Everything else, the landing page and the runbooks included, needs them (docs/security.md).
UNAUTHENTICATED_PATHS = ("/healthz", "/readyz")
MAX_DRAINED_BODY = 64 * 1024  # a body on GET is refused; up to this much is read off first


class _DualStackServer(ThreadingHTTPServer):
    daemon_threads = True
    # Prometheus restarts scrapes quickly after an exporter restart; don't wait out TIME_WAIT.
    allow_reuse_address = True
    # socketserver's default listen backlog is 5: a burst of connections (several Prometheus
    # replicas, a probe, a few slow clients) would have SYNs dropped and wait out a 1 s
    # retransmit. The kernel caps it at net.core.somaxconn.
    request_queue_size = 1024
    tls: ssl.SSLContext | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        """TLS is negotiated here, on the connection's own thread, so a slow or hostile client
        never holds up accept()."""
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(10)
        try:
            secured = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as error:
            log.debug("TLS handshake with %s failed: %s", client_address, error)
            return
        try:
            super().finish_request(secured, client_address)
        finally:
            secured.close()

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def _bind(host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    if host:
        candidates = [(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0], host)]
    else:
        # ":port" means every interface: IPv6 with IPv4 mapped in, else plain IPv4.
        candidates = [(socket.AF_INET6, "::")] if socket.has_ipv6 else []
        candidates.append((socket.AF_INET, "0.0.0.0"))
    for attempt, (family, bind_host) in enumerate(candidates, start=1):
        server_class = type("_Server", (_DualStackServer,), {"address_family": family})
        try:
            return server_class((bind_host, port), handler)
        except OSError as error:
            if attempt == len(candidates) or error.errno == errno.EADDRINUSE:
                raise
            log.debug("cannot listen on %s (%s); trying the next address family", bind_host, error)
    raise AssertionError("unreachable")


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
    ) -> None:
        self.web = web
        self.renderer = renderer
        self.security = security or WebSecurity()
        self.liveness = liveness
        self.readiness = readiness
        address = parse_listen_address(web.listen_address)
        handler = type("_BoundHandler", (_Handler,), {"exporter": self})
        self._httpd = _bind(address.host, address.port, handler)
        self._httpd.tls = self.security.tls
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> ListenAddress:
        host, port = self._httpd.server_address[:2]
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
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=2)
        self._httpd.server_close()


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
    exporter: MetricsServer
    server_version = f"checkpoint-exporter/{__version__}"
    sys_version = ""  # don't advertise the Python version to the network
    protocol_version = "HTTP/1.1"
    timeout = 30  # a stalled client cannot hold a thread forever
    # Headers and body go out in two writes; with Nagle on, the client's delayed ACK adds 40 ms.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        self._respond(head=False)

    def do_HEAD(self) -> None:
        self._respond(head=True)

    def _respond(self, head: bool) -> None:
        self._head = head
        if self._has_body():
            # The body would otherwise be read as the next request on this connection (a
            # request smuggled past whatever checked this one). Refuse and close instead;
            # a small body is read first, so closing does not reset the connection before
            # the client has read the answer.
            self._drain_small_body()
            self.close_connection = True
            self._send(400, "text/plain; charset=utf-8", b"a GET or HEAD request has no body\n")
            return
        path = urlsplit(self.path).path
        web = self.exporter.web
        public = path in UNAUTHENTICATED_PATHS and path != web.telemetry_path
        if self.exporter.security.users and not public:
            try:
                authenticated = self._authenticated()
            except AuthBusy:
                self._send(429, "text/plain; charset=utf-8", b"too many password checks\n",
                           extra={"Retry-After": "1"})  # fmt: skip
                return
            if not authenticated:
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

    def _drain_small_body(self) -> None:
        length = self.headers.get("Content-Length", "").strip()
        if self.headers.get("Transfer-Encoding") is None and length.isdigit():
            size = int(length)
            if size <= MAX_DRAINED_BODY:
                with contextlib.suppress(OSError):
                    self.rfile.read(size)

    def _authenticated(self) -> bool:
        scheme, _, credentials = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(credentials, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return self.exporter.security.authorized(user, password)

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
