"""--web.config.file with real TLS clients: server TLS, basic auth, mutual TLS, min_version."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest

from checkpoint_exporter import webconfig
from checkpoint_exporter.webconfig import AuthBusy, WebSecurity
from tests.conftest import Exporter, require_tool, run_cli, wait_for, write_config

pytestmark = [pytest.mark.daemon]

PASSWORD = "correct horse"


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # signed by a CA the server does not trust
    rogue_key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(
        [require_tool("openssl"), *map(str, args)], cwd=cwd, check=True, capture_output=True
    )


def _signed(directory: Path, name: str, ca: str, subject: str, extensions: str) -> None:
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
             cwd=directory)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext",
             cwd=directory)  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "rogue-ca"):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2",
                 "-subj", f"/CN=test {ca}", cwd=directory)  # fmt: skip
    _signed(directory, "server", "ca", "/CN=localhost",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")  # fmt: skip
    _signed(directory, "client", "ca", "/CN=prometheus", "extendedKeyUsage=clientAuth\n")
    _signed(directory, "rogue", "rogue-ca", "/CN=intruder", "extendedKeyUsage=clientAuth\n")
    return Pki(*(directory / name for name in (
        "ca.crt", "server.crt", "server.key", "client.crt", "client.key", "rogue.crt", "rogue.key"
    )))  # fmt: skip


@pytest.fixture
def secured(tmp_path: Path) -> Iterator:
    started: list[Exporter] = []

    def start(web_config: str) -> Exporter:
        web = write_config(tmp_path, web_config, "web.yaml")
        instance = Exporter("--web.config.file", str(web))
        started.append(instance)
        return instance

    yield start
    for instance in started:
        instance.close()


def _client(pki: Pki, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert:
        context.load_cert_chain(*cert)
    return context


def _get(
    exporter: Exporter, context: ssl.SSLContext, auth: tuple[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    host, port = exporter.base.removeprefix("https://").rsplit(":", 1)
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    headers = {}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    try:
        connection.request("GET", "/metrics", headers=headers)
        reply = connection.getresponse()
        return reply.status, dict(reply.headers), reply.read()
    finally:
        connection.close()


def _hash(password: str, rounds: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds)).decode()


def test_tls_with_basic_auth(secured, pki: Pki) -> None:
    exporter = secured(f"""
tls_server_config: {{cert_file: {pki.server_cert}, key_file: {pki.server_key}}}
basic_auth_users:
  prometheus: {_hash(PASSWORD)}
http_server_config:
  headers: {{Strict-Transport-Security: max-age=31536000}}
""")
    assert exporter.base.startswith("https://")
    client = _client(pki)

    status, headers, body = _get(exporter, client, ("prometheus", PASSWORD))
    assert status == 200
    assert b"checkpoint_exporter_build_info" in body
    assert headers["Strict-Transport-Security"] == "max-age=31536000"
    # The cached success must not let a different password through afterwards.
    for auth in (None, ("prometheus", "wrong"), ("grafana", PASSWORD), ("prometheus", "")):
        status, headers, body = _get(exporter, client, auth)
        assert status == 401, auth
        assert headers["WWW-Authenticate"].startswith("Basic ")
        assert b"checkpoint_" not in body
    assert _get(exporter, client, ("prometheus", PASSWORD))[0] == 200

    # Plain HTTP to the TLS port gets no metrics: the handshake fails and the connection closes.
    port = int(exporter.base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
        plain.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        received = b""
        try:
            while chunk := plain.recv(4096):
                received += chunk
        except ConnectionResetError:
            pass
    assert b"200 OK" not in received and b"checkpoint_" not in received
    # A client that does not trust the server's CA refuses it.
    with pytest.raises(ssl.SSLCertVerificationError):
        _get(exporter, ssl.create_default_context(), ("prometheus", PASSWORD))
    assert exporter.process.poll() is None


def test_mutual_tls_requires_a_certificate_from_the_client_ca(secured, pki: Pki) -> None:
    exporter = secured(f"""
tls_server_config:
  cert_file: {pki.server_cert}
  key_file: {pki.server_key}
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {pki.ca}
""")
    status, _, body = _get(exporter, _client(pki, (pki.client_cert, pki.client_key)))
    assert status == 200 and b"checkpoint_exporter_build_info" in body
    for refused in (_client(pki), _client(pki, (pki.rogue_cert, pki.rogue_key))):
        # TLS 1.3 reports the server's rejection of the client certificate on the first read.
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)):
            _get(exporter, refused)
    assert exporter.process.poll() is None


def test_min_version_refuses_older_clients(secured, pki: Pki) -> None:
    exporter = secured(f"""
tls_server_config:
  cert_file: {pki.server_cert}
  key_file: {pki.server_key}
  min_version: TLS13
""")
    old = _client(pki)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(ssl.SSLError):
        _get(exporter, old)
    assert _get(exporter, _client(pki))[0] == 200


def _serve(web_config: Path) -> subprocess.CompletedProcess:
    return run_cli(
        "serve", "--web.listen-address", "127.0.0.1:0", "--web.config.file", str(web_config)
    )


def test_a_bad_web_config_stops_the_start_with_every_reason(tmp_path: Path, pki: Pki) -> None:
    web = write_config(
        tmp_path,
        f"""
tls_server_config:
  cert_file: {pki.server_cert}
  key_file: {tmp_path}/missing.key
  client_auth_type: RequestClientCert
  min_vesion: TLS12
basic_auth_users:
  prometheus: plaintext-password
http_server_config:
  headers: {{X-Injected: "a\\r\\nSet-Cookie: x=1"}}
""",
        "web.yaml",
    )
    result = _serve(web)
    assert result.returncode == 2
    for expected in (
        "tls_server_config.min_vesion: unknown key; did you mean 'min_version'?",
        "tls_server_config.cert_file: cannot load",
        "basic_auth_users.prometheus: expected a bcrypt hash",
        "http_server_config.headers.X-Injected: expected a single-line string",
        str(web),
    ):
        assert expected in result.stderr, result.stderr
    assert "plaintext-password" not in result.stderr  # secrets are never echoed

    unverified = write_config(tmp_path, f"""
tls_server_config:
  cert_file: {pki.server_cert}
  key_file: {pki.server_key}
  client_auth_type: RequestClientCert
""", "unverified.yaml")  # fmt: skip
    result = _serve(unverified)
    assert result.returncode == 2
    assert "RequestClientCert is not supported" in result.stderr

    wrong_types = write_config(tmp_path, f"""
tls_server_config:
  cert_file: {pki.server_cert}
  key_file: {pki.server_key}
  client_auth_type: [RequireAndVerifyClientCert]
  max_version: {{TLS13: true}}
""", "wrong-types.yaml")  # fmt: skip
    result = _serve(wrong_types)  # found by `make fuzz`: a list or mapping here was a crash
    assert result.returncode == 2, result.stderr
    assert "tls_server_config.client_auth_type: must be one of" in result.stderr
    assert "tls_server_config.max_version: must be one of" in result.stderr

    result = _serve(tmp_path / "absent.yaml")
    assert result.returncode == 2 and "absent.yaml: file does not exist" in result.stderr


# --- hardening against a hostile or careless client ([tenants] item 5) ------------------------


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _timed_get(base: str, path: str, headers: dict[str, str]) -> tuple[int, float]:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        started = time.perf_counter()
        connection.request("GET", path, headers=headers)
        reply = connection.getresponse()
        reply.read()
        return reply.status, time.perf_counter() - started
    finally:
        connection.close()


def test_unknown_users_take_as_long_as_known_ones(secured) -> None:
    """Without a dummy bcrypt hash for unknown users, a wrong password took 60 ms for a known
    user and under 1 ms for an unknown one: user names could be enumerated by timing. Each try
    uses a new password (a repeated one is answered from the cache, equally fast for both)."""
    exporter = secured(f"basic_auth_users: {{prometheus: {_hash(PASSWORD, rounds=10)}}}\n")
    known, unknown = [], []
    for attempt in range(15):  # interleaved, so load on the machine hits both alike
        status, seconds = _timed_get(exporter.base, "/metrics", _basic("prometheus", f"x{attempt}"))
        assert status == 401
        known.append(seconds)
        status, seconds = _timed_get(exporter.base, "/metrics", _basic(f"user{attempt}", "x"))
        assert status == 401
        unknown.append(seconds)
    ratio = statistics.median(unknown) / statistics.median(known)
    assert 0.5 < ratio < 2.0, (statistics.median(known), statistics.median(unknown))


def test_a_password_flood_does_not_starve_a_cached_scraper(secured, tmp_path: Path) -> None:
    """16 threads send wrong passwords (each new, so each needs bcrypt at cost 10) while
    Prometheus scrapes with its cached credentials. With every guess hashed in parallel the
    scrape's median went from 5 ms to about 100 ms on 2 cores; bcrypt checks now run one at a
    time and a cached credential never waits for them (measured: about 12 ms). Ceiling: the
    flooded median under 4x the quiet median plus 10 ms. Each scrape renders the exporter's own
    process metrics afresh (on by default), so it needs the CPU the flood takes."""
    for index in range(20):
        (tmp_path / "ckpt" / f"job{index}").mkdir(parents=True)
    config = write_config(
        tmp_path,
        "jobs:\n" + "".join(f"  - {{name: job{i}, path: ckpt/job{i}}}\n" for i in range(20)),
    )
    web = write_config(
        tmp_path, f"basic_auth_users: {{prometheus: {_hash(PASSWORD, rounds=10)}}}\n", "web.yaml"
    )
    exporter = Exporter("--config.file", str(config), "--web.config.file", str(web))
    try:
        scrape = _basic("prometheus", PASSWORD)
        assert _timed_get(exporter.base, "/metrics", scrape)[0] == 200  # now cached
        quiet = [_timed_get(exporter.base, "/metrics", scrape)[1] for _ in range(20)]
        stop = threading.Event()
        statuses: list[int] = []

        def guess(thread: int) -> None:
            attempt = 0
            while not stop.is_set():
                status, _ = _timed_get(
                    exporter.base, "/metrics", _basic("prometheus", f"{thread}/{attempt}")
                )
                statuses.append(status)
                attempt += 1

        threads = [threading.Thread(target=guess, args=(n,), daemon=True) for n in range(16)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(1.0)  # every guessing thread is in flight
            flooded = []
            for _ in range(25):
                status, seconds = _timed_get(exporter.base, "/metrics", scrape)
                assert status == 200
                flooded.append(seconds)
                time.sleep(0.02)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
        ceiling = 4 * statistics.median(quiet) + 0.010
        assert statistics.median(flooded) < ceiling, (statistics.median(quiet), flooded)
        assert statuses and set(statuses) <= {401, 429}
    finally:
        exporter.close()


def test_healthz_needs_no_credentials(secured, tmp_path: Path) -> None:
    """Probes (kubelet, systemd, load balancers) carry no credentials: /healthz answers them;
    everything else, the landing page included, still needs the password."""
    exporter = secured(f"basic_auth_users: {{prometheus: {_hash(PASSWORD)}}}\n")
    assert exporter.get("/healthz").status == 200 and exporter.get("/healthz").text == "ok\n"
    for path in ("/metrics", "/", "/nothing-here", "/healthz/../metrics"):
        reply = exporter.get(path)
        assert reply.status == 401, path
        assert b"checkpoint_" not in reply.body
    assert exporter.get("/metrics", _basic("prometheus", PASSWORD)).status == 200

    # A telemetry path named /healthz is the metrics, and keeps its authentication.
    web = write_config(
        tmp_path, f"basic_auth_users: {{prometheus: {_hash(PASSWORD)}}}\n", "w2.yaml"
    )
    metrics_there = Exporter("--web.config.file", str(web), "--web.telemetry-path", "/healthz")
    try:
        assert metrics_there.get("/healthz").status == 401
        reply = metrics_there.get("/healthz", _basic("prometheus", PASSWORD))
        assert reply.status == 200 and b"checkpoint_exporter_build_info" in reply.body
    finally:
        metrics_there.close()


def test_healthz_over_tls_needs_no_credentials(secured, pki: Pki) -> None:
    exporter = secured(f"""
tls_server_config: {{cert_file: {pki.server_cert}, key_file: {pki.server_key}}}
basic_auth_users: {{prometheus: {_hash(PASSWORD)}}}
""")
    host, port = exporter.base.removeprefix("https://").rsplit(":", 1)
    connection = http.client.HTTPSConnection(host, int(port), context=_client(pki), timeout=10)
    try:
        connection.request("GET", "/healthz")
        reply = connection.getresponse()
        assert (reply.status, reply.read()) == (200, b"ok\n")
    finally:
        connection.close()
    assert _get(exporter, _client(pki))[0] == 401  # /metrics still needs the password


# --- the password checks themselves, in process ------------------------------------------


def _security(**users: str) -> WebSecurity:
    return WebSecurity(users={user: hashed.encode() for user, hashed in users.items()})


def test_both_verdicts_are_cached_and_guesses_never_evict_a_success(monkeypatch) -> None:
    """As exporter-toolkit: successes and failures are cached per (user, hash, password); here
    failures live apart, so a stream of guesses cannot push out a scraper's success."""
    monkeypatch.setattr(webconfig, "_MAX_FAILURES", 4)
    security = _security(prometheus=_hash(PASSWORD))
    assert security.authorized("prometheus", PASSWORD)
    assert security.authorized("prometheus", PASSWORD)
    assert security.bcrypt_checks == 1
    assert not security.authorized("prometheus", "wrong")
    assert not security.authorized("prometheus", "wrong")
    assert security.bcrypt_checks == 2
    for attempt in range(20):
        assert not security.authorized("prometheus", f"guess {attempt}")
    assert len(security._failures) == 4
    checks = security.bcrypt_checks
    assert security.authorized("prometheus", PASSWORD)
    assert security.bcrypt_checks == checks  # still cached
    # The key covers the user and the hash: a right password for another name is no hit.
    assert not security.authorized("grafana", PASSWORD)
    assert security.bcrypt_checks == checks + 1


def test_cached_verdicts_expire() -> None:
    now = [1000.0]
    security = _security(prometheus=_hash(PASSWORD))
    security.clock = lambda: now[0]
    assert security.authorized("prometheus", PASSWORD)
    assert not security.authorized("prometheus", "wrong")
    now[0] += webconfig.SUCCESS_TTL_SECONDS - 1  # a success in use is refreshed on each hit
    assert security.authorized("prometheus", PASSWORD)
    now[0] += webconfig.SUCCESS_TTL_SECONDS - 1
    assert security.authorized("prometheus", PASSWORD)
    assert security.bcrypt_checks == 2
    now[0] += webconfig.SUCCESS_TTL_SECONDS + 1
    assert security.authorized("prometheus", PASSWORD)
    assert not security.authorized("prometheus", "wrong")  # its failure expired long ago
    assert security.bcrypt_checks == 4


def test_unknown_users_cost_one_bcrypt_of_the_configured_cost() -> None:
    security = _security(prometheus=_hash(PASSWORD), grafana=_hash(PASSWORD, rounds=6))
    assert security.dummy_cost() == 6
    assert not security.authorized("nobody", PASSWORD)
    assert security._dummy is not None and security._dummy.startswith(b"$2b$06$")
    assert not security.authorized("someone", PASSWORD)
    assert security.bcrypt_checks == 2
    # The dummy hash's own password is random; even it would not let an unknown user in.
    assert not security.authorized("nobody", "")


def test_longer_passwords_are_not_matched_on_their_first_72_bytes() -> None:
    password = "p" * 72
    security = _security(prometheus=_hash(password))
    assert security.authorized("prometheus", password)
    assert not security.authorized("prometheus", password + "extra")


def hold_checks(security: WebSecurity) -> tuple[threading.Event, list[bytes]]:
    """Every bcrypt check of ``security`` waits for the returned event (a long check in
    progress); the list records the passwords checked, in order."""
    release = threading.Event()
    checked: list[bytes] = []
    check = security._check

    def held(expected: bytes | None, password: bytes) -> bool:
        checked.append(password)
        release.wait()
        return check(expected, password)

    security._check = held  # type: ignore[method-assign]
    return release, checked


def test_a_queue_of_password_checks_is_bounded(monkeypatch) -> None:
    security = _security(prometheus=_hash(PASSWORD))
    assert security.authorized("prometheus", PASSWORD)
    release, checked = hold_checks(security)
    answers: list[bool | None] = []
    assert security.check_later("prometheus", "first", "10.0.0.1", answers.append)
    wait_for(lambda: checked == [b"first"])  # a long check in progress
    try:
        monkeypatch.setattr(webconfig, "MAX_WAIT_SECONDS", -1.0)  # whatever waits, too long
        assert security.check_later("prometheus", "late", "10.0.0.2", answers.append)
        assert security.waiting() == 1 and answers == []
        monkeypatch.setattr(webconfig, "MAX_WAITING_CHECKS", 1)
        with pytest.raises(AuthBusy):
            security.authorized("prometheus", "guess", "10.0.0.3")  # refused without waiting
        assert security.authorized("prometheus", PASSWORD)  # cached: never waits
    finally:
        release.set()
    wait_for(lambda: len(answers) == 2)
    assert answers == [False, None]  # "late" waited past its time: never checked, busy
    assert checked == [b"first"]


def test_too_many_waiting_checks_get_429(monkeypatch) -> None:
    """The handler's answer to AuthBusy, through a real server in process."""
    from checkpoint_exporter.config import WebConfig
    from checkpoint_exporter.exposition.renderer import Renderer
    from checkpoint_exporter.exposition.server import MetricsServer
    from checkpoint_exporter.model import Snapshot

    security = _security(prometheus=_hash(PASSWORD))
    monkeypatch.setattr(webconfig, "MAX_WAITING_CHECKS", 0)
    web = WebConfig(listen_address="127.0.0.1:0")
    server = MetricsServer(web, Renderer(lambda: Snapshot(), []), security=security)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.address.port}"
        status, _ = _timed_get(base, "/metrics", _basic("prometheus", "guess"))
        assert status == 429
        assert _timed_get(base, "/healthz", {})[0] == 200
    finally:
        server.stop()


def test_probes_need_no_credentials_and_the_runbooks_do() -> None:
    """/healthz and /readyz are for probes, which carry no credentials; with basic auth on,
    /runbooks needs the password like every other page (docs/security.md: only the probes are
    open), and a failing probe's answer is the reason alone."""
    from checkpoint_exporter.config import WebConfig
    from checkpoint_exporter.exposition.renderer import Renderer
    from checkpoint_exporter.exposition.server import MetricsServer
    from checkpoint_exporter.model import Snapshot

    security = _security(prometheus=_hash(PASSWORD))
    web = WebConfig(listen_address="127.0.0.1:0")
    server = MetricsServer(
        web,
        Renderer(lambda: Snapshot(), []),
        security,
        liveness=lambda: None,
        readiness=lambda: "first pass not finished (1 of 3 tiers)",
    )
    server.start()
    try:
        base = f"http://127.0.0.1:{server.address.port}"
        assert _timed_get(base, "/healthz", {})[0] == 200
        assert _timed_get(base, "/readyz", {})[0] == 503
        for path in ("/runbooks", "/readyz/../runbooks", "/"):
            assert _timed_get(base, path, {})[0] == 401, path
        assert _timed_get(base, "/runbooks", _basic("prometheus", PASSWORD))[0] == 200
        # A body on a probe is refused like anywhere else: nothing is read or echoed.
        host, port = base.removeprefix("http://").rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            connection.request("GET", "/readyz", body=b"<script>", headers={"Connection": "close"})
            reply = connection.getresponse()
            assert reply.status == 400 and b"<script>" not in reply.read()
        finally:
            connection.close()
    finally:
        server.stop()
