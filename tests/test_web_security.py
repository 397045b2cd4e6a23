"""--web.config.file with real TLS clients: server TLS, basic auth, mutual TLS, min_version."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest

from tests.conftest import Exporter, require_tool, run_cli, write_config

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


def _hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


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
