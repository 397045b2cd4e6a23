"""``--web.config.file``: TLS and basic auth in the Prometheus exporter-toolkit format.

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # mutual TLS; needs client_ca_file
      client_ca_file: ca.crt
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...                         # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':')
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}

What Python's TLS stack cannot do as asked (accepting client certificates without verifying
them, Go cipher-suite names) is refused with a reason rather than silently weakened.
"""

from __future__ import annotations

import hashlib
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkpoint_exporter.config import ConfigError, ConfigProblem, did_you_mean, read_yaml_file

_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_TLS_KEYS = {
    "cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
    "cipher_suites", "prefer_server_cipher_suites", "curve_preferences",
}  # fmt: skip
_TOP_KEYS = {"tls_server_config", "basic_auth_users", "http_server_config"}


@dataclass
class WebSecurity:
    """What the server enforces: a TLS context, basic-auth users, extra response headers."""

    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: dict[str, str] = field(default_factory=dict)
    _verified: set[tuple[str, bytes]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def authorized(self, user: str, password: str) -> bool:
        """Checks a password against the user's bcrypt hash; successes are remembered by digest,
        because bcrypt is slow on purpose and Prometheus scrapes every few seconds."""
        expected = self.users.get(user)
        if expected is None:
            return False
        key = (user, hashlib.sha256(password.encode()).digest())
        with self._lock:
            if key in self._verified:
                return True
        import bcrypt

        try:
            ok = bcrypt.checkpw(password.encode(), expected)
        except ValueError:
            return False
        if ok:
            with self._lock:
                if len(self._verified) > 1024:
                    self._verified.clear()
                self._verified.add(key)
        return ok


def load_web_config(path: str | Path) -> WebSecurity:
    """Read and check a web config file; every problem is reported with file, key and reason."""
    file = Path(path)
    document = read_yaml_file(file)
    problems = list(document.problems)
    data: Any = document.data or {}

    def problem(key: str, reason: str) -> None:
        line = document.lines.get(tuple(key.split(".")))
        problems.append(ConfigProblem(str(file), key, reason, line))

    if not isinstance(data, dict):
        raise ConfigError([*problems, ConfigProblem(str(file), "", "expected a mapping")])
    for key in data:
        if key not in _TOP_KEYS:
            problem(str(key), "unknown key" + did_you_mean(key, _TOP_KEYS))
    security = WebSecurity()
    tls = data.get("tls_server_config")
    if tls is not None:
        security.tls = _tls_context(tls, file.parent, problem)
    users = data.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        problem("basic_auth_users", "expected a mapping of user name to bcrypt hash")
        users = {}
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            problem(
                f"basic_auth_users.{user}", "expected a bcrypt hash ($2y$..., from htpasswd -B)"
            )
            continue
        security.users[str(user)] = hashed.encode()
    security.headers = _headers(data.get("http_server_config"), problem)
    if problems:
        raise ConfigError(problems)
    return security


def _headers(http: object, problem: Any) -> dict[str, str]:
    if http is None:
        return {}
    if not isinstance(http, dict):
        problem("http_server_config", "expected a mapping")
        return {}
    known = ("headers", "http2")
    for key in http:
        if key not in known:
            problem(f"http_server_config.{key}", "unknown key" + did_you_mean(key, known))
    headers = http.get("headers") or {}
    if not isinstance(headers, dict):
        problem("http_server_config.headers", "expected a mapping of header name to value")
        return {}
    clean = {}
    for name, value in headers.items():
        # A line break in a header would let the config file inject a response; refuse it.
        if not isinstance(value, str) or any(c in f"{name}{value}" for c in "\r\n\0"):
            problem(f"http_server_config.headers.{name}", "expected a single-line string")
            continue
        clean[str(name)] = value
    return clean


def _tls_context(tls: object, base: Path, problem: Any) -> ssl.SSLContext | None:
    if not isinstance(tls, dict):
        problem("tls_server_config", "expected a mapping")
        return None
    for key in tls:
        if key not in _TLS_KEYS:
            problem(f"tls_server_config.{key}", "unknown key" + did_you_mean(key, _TLS_KEYS))
    for key in ("cipher_suites", "curve_preferences"):
        if tls.get(key):
            reason = "not supported here: Python's TLS uses its own secure defaults; remove the key"
            problem(f"tls_server_config.{key}", reason + " rather than have it silently ignored")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2  # exporter-toolkit's default
    for key, attribute in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        value = tls.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or value not in _VERSIONS:
            problem(
                f"tls_server_config.{key}", f"must be one of {', '.join(_VERSIONS)}, got {value!r}"
            )
        else:
            setattr(context, attribute, _VERSIONS[value])

    def path_of(key: str) -> Path | None:
        value = tls.get(key)
        if value is None:
            return None
        path = Path(str(value))
        return path if path.is_absolute() else base / path

    cert, key = path_of("cert_file"), path_of("key_file")
    if cert is None or key is None:
        problem("tls_server_config", "cert_file and key_file are both required")
        return None
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        problem("tls_server_config.cert_file", f"cannot load {cert} / {key}: {error}")
        return None
    auth = tls.get("client_auth_type", "NoClientCert")
    if not isinstance(auth, str):
        problem("tls_server_config.client_auth_type", f"must be one of {', '.join(_CLIENT_AUTH)}")
        return None
    if auth in _UNSUPPORTED_CLIENT_AUTH:
        problem("tls_server_config.client_auth_type", f"{auth} is not supported: every client "
                "certificate is verified here; use VerifyClientCertIfGiven or "
                "RequireAndVerifyClientCert with client_ca_file")  # fmt: skip
        return None
    if auth not in _CLIENT_AUTH:
        problem("tls_server_config.client_auth_type", f"must be one of {', '.join(_CLIENT_AUTH)}")
        return None
    context.verify_mode = _CLIENT_AUTH[auth]
    ca = path_of("client_ca_file")
    if context.verify_mode != ssl.CERT_NONE:
        if ca is None:
            problem("tls_server_config.client_ca_file", f"required with {auth}")
            return None
        try:
            context.load_verify_locations(cafile=str(ca))
        except (OSError, ssl.SSLError) as error:
            problem("tls_server_config.client_ca_file", f"cannot load {ca}: {error}")
            return None
    return context
