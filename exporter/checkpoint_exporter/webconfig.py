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
import hmac
import logging
import re
import secrets
import ssl
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkpoint_exporter.schema import Field, Problems, read_mapping_file

log = logging.getLogger(__name__)

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
# exporter-toolkit's extraHTTPHeaders: the headers a web config may set, and their values when
# they are an enumeration.
_EXTRA_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}


class AuthBusy(Exception):
    """Too many password checks are already waiting: answer 429 rather than queue another."""


# Password checks run one at a time, on a thread of their own, so waiting for one costs no
# handler thread; they wait in a bounded queue, and a check that has not begun within
# MAX_WAIT_SECONDS is answered 429. Whose check comes next: first a credential that succeeded
# before (its own small budget, RESERVED_CHECKS, which no flood of new passwords can fill),
# then the waiting clients' in turn, one each, so a flood from one address cannot take another
# address's turn (PER_CLIENT_CHECKS waiting per address, MAX_WAITING_CHECKS in all).
MAX_WAITING_CHECKS = 64
PER_CLIENT_CHECKS = 4
RESERVED_CHECKS = 4
MAX_WAIT_SECONDS = 10.0
# How long a verdict is remembered. A success is refreshed on every use, so a scraper whose
# credentials are in use never needs bcrypt again (and never waits behind a flood of guesses);
# a failure expires on time, and failures live apart so guesses can never evict a success.
SUCCESS_TTL_SECONDS = 300.0
FAILURE_TTL_SECONDS = 300.0
# A credential that succeeded is remembered as such for longer (refreshed on each success): once
# its cached verdict expires (Prometheus paused, or restarted its scrapes), its next check
# takes the reserved budget.
PROVEN_TTL_SECONDS = 7 * 86400.0
_MAX_SUCCESSES = 256
_MAX_FAILURES = 4096
_BCRYPT_MAX_PASSWORD = 72  # bytes; bcrypt 5 refuses longer passwords
# bcrypt's own range is 4..31, but a cost of 18 already takes tens of seconds per check, and
# checks run one at a time: htpasswd -B (4..17) is the bound here.
BCRYPT_COSTS = range(4, 18)
_BCRYPT_HASH = re.compile(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}")

Verdict = Callable[[bool | None], None]  # True, False, or None: not checked (busy)


@dataclass(eq=False)
class _Check:
    """A password check waiting for its turn. Holds the password until then (at most
    MAX_WAIT_SECONDS); the caches keep only HMACs."""

    key: bytes
    expected: bytes | None
    password: bytes
    client: str
    proven: bool
    queued_at: float
    done: Verdict


@dataclass
class WebSecurity:
    """What the server enforces: a TLS context, basic-auth users, extra response headers.

    Password checks follow exporter-toolkit's web/handler.go: an unknown user is checked
    against a dummy hash (here of the same bcrypt cost as the configured users, so the time
    taken does not tell whether a user name exists), only one bcrypt check runs at a time, and
    both verdicts are cached, keyed by user, expected hash and password. Unlike the toolkit,
    the key is an HMAC under a per-process random key (no plaintext password is kept), entries
    expire, failures are kept apart from successes so a flood of wrong passwords cannot
    evict a scraper's cached success, and the checks wait in a bounded, fair queue (above).
    """

    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: dict[str, str] = field(default_factory=dict)
    clock: Any = time.monotonic  # for the verdicts' lifetimes
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    _successes: OrderedDict[bytes, float] = field(default_factory=OrderedDict)  # -> expiry
    _failures: OrderedDict[bytes, float] = field(default_factory=OrderedDict)
    _proven: OrderedDict[bytes, float] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _turn: threading.Condition | None = None  # over _lock: a check was queued
    _reserved: deque[_Check] = field(default_factory=deque)
    _waiting: OrderedDict[str, deque[_Check]] = field(default_factory=OrderedDict)  # in turn
    _queued: int = 0  # checks in _waiting
    _checker: threading.Thread | None = None
    _dummy: bytes | None = None  # the unknown users' hash, made on first use
    bcrypt_checks: int = 0  # bcrypt computations so far (for tests and debugging)

    def cached(self, user: str, password: str) -> bool | None:
        """The remembered verdict on ``password`` for ``user``, or None when it needs a check."""
        key = self._cache_key(user, self.users.get(user), password)
        with self._lock:
            return self._remembered(key, self.clock())

    def check_later(self, user: str, password: str, client: str, done: Verdict) -> bool:
        """Queue a bcrypt check; ``done`` gets its verdict on the checker's thread, or None when
        it waited too long. False, and ``done`` is never called, when the queue has no room."""
        expected = self.users.get(user)
        key = self._cache_key(user, expected, password)
        with self._lock:
            proven = self._live(self._proven, key, self.clock())
            return self._enqueue(
                _Check(key, expected, password.encode(), client, proven, time.monotonic(), done)
            )

    def authorized(self, user: str, password: str, client: str = "") -> bool:
        """Whether ``password`` is ``user``'s, waiting for a check when needed. Raises AuthBusy
        when the check would queue behind too many others, or waited too long."""
        verdict = self.cached(user, password)
        if verdict is not None:
            return verdict
        answered = threading.Event()
        outcome: list[bool | None] = []

        def done(result: bool | None) -> None:
            outcome.append(result)
            answered.set()

        if not self.check_later(user, password, client, done):
            raise AuthBusy
        answered.wait()
        if outcome[0] is None:
            raise AuthBusy
        return outcome[0]

    def waiting(self) -> int:
        """Checks queued, not yet begun (for tests and debugging)."""
        with self._lock:
            return self._queued + len(self._reserved)

    # --- the queue, under _lock ------------------------------------------------------------

    def _remembered(self, key: bytes, now: float) -> bool | None:
        if self._live(self._successes, key, now):
            self._successes[key] = now + SUCCESS_TTL_SECONDS
            self._successes.move_to_end(key)
            return True
        if self._live(self._failures, key, now):
            return False
        return None

    @staticmethod
    def _live(cache: OrderedDict[bytes, float], key: bytes, now: float) -> bool:
        expiry = cache.get(key)
        return expiry is not None and expiry > now

    def _enqueue(self, check: _Check) -> bool:
        if check.proven:
            if len(self._reserved) >= RESERVED_CHECKS:
                return False
            self._reserved.append(check)
        else:
            mine = self._waiting.get(check.client)
            if self._queued >= MAX_WAITING_CHECKS or (mine and len(mine) >= PER_CLIENT_CHECKS):
                return False
            self._waiting.setdefault(check.client, deque()).append(check)
            self._queued += 1
        if self._turn is None:
            self._turn = threading.Condition(self._lock)
        if self._checker is None:
            self._checker = threading.Thread(target=self._run, name="password checks",
                                             daemon=True)  # fmt: skip
            self._checker.start()
        self._turn.notify()
        return True

    def _next(self) -> tuple[_Check | None, list[_Check]]:
        """The next check to run, and the ones that waited too long (answered busy)."""
        limit = time.monotonic() - MAX_WAIT_SECONDS
        expired = [c for c in self._reserved if c.queued_at < limit]
        for check in expired:
            self._reserved.remove(check)
        for client, checks in list(self._waiting.items()):
            while checks and checks[0].queued_at < limit:
                expired.append(checks.popleft())
                self._queued -= 1
            if not checks:
                del self._waiting[client]
        if self._reserved:
            return self._reserved.popleft(), expired
        if not self._waiting:
            return None, expired
        client, checks = next(iter(self._waiting.items()))
        check = checks.popleft()
        self._queued -= 1
        del self._waiting[client]
        if checks:
            self._waiting[client] = checks  # to the back: the other clients go first
        return check, expired

    # --- the checker thread ----------------------------------------------------------------

    def _run(self) -> None:
        assert self._turn is not None
        while True:
            with self._lock:
                check, expired = self._next()
                while check is None and not expired:
                    self._turn.wait()
                    check, expired = self._next()
            for late in expired:
                self._answer(late, None)
            if check is not None:
                try:
                    verdict: bool | None = self._verdict(check)
                except Exception:
                    log.exception("a password check failed")
                    verdict = None  # busy: the client may try again
                self._answer(check, verdict)

    @staticmethod
    def _answer(check: _Check, verdict: bool | None) -> None:
        try:
            check.done(verdict)
        except Exception:  # the caller's: it must not stop the checks of everyone else
            log.exception("answering a password check failed")

    def _verdict(self, check: _Check) -> bool:
        with self._lock:
            verdict = self._remembered(check.key, self.clock())  # the same credential twice
        if verdict is not None:
            return verdict
        ok = self._check(check.expected, check.password)
        with self._lock:
            now = self.clock()
            if ok:
                self._remember(self._successes, check.key, now + SUCCESS_TTL_SECONDS,
                               _MAX_SUCCESSES)  # fmt: skip
                self._remember(self._proven, check.key, now + PROVEN_TTL_SECONDS,
                               _MAX_SUCCESSES)  # fmt: skip
            else:
                self._remember(self._failures, check.key, now + FAILURE_TTL_SECONDS,
                               _MAX_FAILURES)  # fmt: skip
        return ok

    @staticmethod
    def _remember(cache: OrderedDict[bytes, float], key: bytes, expiry: float, limit: int) -> None:
        cache[key] = expiry
        cache.move_to_end(key)
        while len(cache) > limit:
            cache.popitem(last=False)

    def _cache_key(self, user: str, expected: bytes | None, password: str) -> bytes:
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in (user.encode(), expected or b"", password.encode()):
            mac.update(len(part).to_bytes(8, "big"))
            mac.update(part)
        return mac.digest()

    def _check(self, expected: bytes | None, password: bytes) -> bool:
        """One bcrypt computation, whether or not the user exists (on the checker's thread)."""
        import bcrypt

        self.bcrypt_checks += 1
        known = expected is not None
        if expected is None:
            if self._dummy is None:
                # Making the dummy hash is itself one bcrypt computation of that cost.
                self._dummy = bcrypt.hashpw(
                    secrets.token_urlsafe(16).encode(), bcrypt.gensalt(self.dummy_cost())
                )
                return False
            expected = self._dummy
        try:
            # bcrypt reads at most 72 bytes: hash that much whatever the length (same time),
            # and never accept a longer password for its first 72 bytes.
            match = bcrypt.checkpw(password[:_BCRYPT_MAX_PASSWORD], expected)
        except ValueError:  # a hash bcrypt cannot read
            return False
        return match and known and len(password) <= _BCRYPT_MAX_PASSWORD

    def dummy_cost(self) -> int:
        """The cost of the unknown users' hash: the highest of the configured users'."""
        costs = [int(h[4:6]) for h in self.users.values() if h[4:6].isdigit()]
        return max(costs, default=10)


def load_web_config(path: str | Path) -> WebSecurity:
    """Read and check a web config file; every problem is reported with file, key and reason."""
    file = Path(path)
    data, problems = read_mapping_file(file)
    problems.check(_named(data), (), _TOP_FIELDS, list_known=False)
    security = WebSecurity()
    tls = data.get("tls_server_config")
    if tls is not None:
        security.tls = _tls_context(tls, file.parent, problems)
    users = data.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        problems.add(("basic_auth_users",), "expected a mapping of user name to bcrypt hash")
        users = {}
    for user, hashed in users.items():
        key = ("basic_auth_users", str(user))
        if not isinstance(hashed, str) or not _BCRYPT_HASH.fullmatch(hashed):
            problems.add(key, "expected a bcrypt hash ($2y$..., from htpasswd -B)")
            continue
        if int(hashed[4:6]) not in BCRYPT_COSTS:
            problems.add(key, f"bcrypt cost {int(hashed[4:6])} is outside {BCRYPT_COSTS.start}.."
                         f"{BCRYPT_COSTS.stop - 1} (htpasswd -B's range): every password check "
                         "would take too long")  # fmt: skip
            continue
        if ":" in str(user) or any(ord(c) < 0x20 or c == "\x7f" for c in str(user)):
            problems.add(key, "a user name cannot contain ':' or control characters (basic auth "
                         "splits user and password at the first ':')")  # fmt: skip
            continue
        security.users[str(user)] = hashed.encode()
    security.headers = _headers(data.get("http_server_config"), problems)
    problems.raise_if_any()
    return security


def _named(mapping: dict[Any, Any]) -> dict[str, Any]:
    """Keys as this file's messages name them: ``1`` is the key "1", not a list index."""
    return {str(key): value for key, value in mapping.items()}


def _headers(http: object, problems: Problems) -> dict[str, str]:
    if http is None:
        return {}
    at = ("http_server_config",)
    if not isinstance(http, dict):
        problems.add(at, "expected a mapping")
        return {}
    problems.check(_named(http), at, _HTTP_FIELDS, list_known=False)
    headers = http.get("headers") or {}
    if not isinstance(headers, dict):
        problems.add((*at, "headers"), "expected a mapping of header name to value")
        return {}
    clean = {}
    for name, value in headers.items():
        key = (*at, "headers", str(name))
        # A line break in a header would let the config file inject a response; refuse it.
        if not isinstance(value, str) or any(c in f"{name}{value}" for c in "\r\n\0"):
            problems.add(key, "expected a single-line string")
            continue
        # As exporter-toolkit: only these security headers, so a careless entry cannot break
        # the response's own framing (Content-Length, Content-Encoding, Connection, ...).
        allowed = _EXTRA_HEADERS.get(str(name), ())
        if str(name) not in _EXTRA_HEADERS:
            problems.add(key, f"cannot be configured; one of {', '.join(_EXTRA_HEADERS)}")
            continue
        if allowed and value not in allowed:
            problems.add(key, f"must be one of {', '.join(allowed)}, got {value!r}")
            continue
        clean[str(name)] = value
    return clean


def _tls_version(value: object) -> ssl.TLSVersion | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in _VERSIONS:
        raise ValueError(f"must be one of {', '.join(_VERSIONS)}, got {value!r}")
    return _VERSIONS[value]


def _unsupported(value: object) -> None:
    if value:
        raise ValueError(
            "not supported here: Python's TLS uses its own secure defaults; remove the key "
            "rather than have it silently ignored"
        )


def _file_path(value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not value or "\0" in value):
        raise ValueError("expected a file path (a non-empty string without NUL characters)")
    return value


_TOP_FIELDS = (Field("tls_server_config"), Field("basic_auth_users"), Field("http_server_config"))
_HTTP_FIELDS = (Field("headers"), Field("http2"))
_TLS_PATHS = ("cert_file", "key_file", "client_ca_file")
_TLS_FIELDS = (
    *(Field(key, _file_path) for key in _TLS_PATHS),
    Field("client_auth_type"),  # checked once the certificate is loaded
    Field("min_version", _tls_version),
    Field("max_version", _tls_version),
    Field("cipher_suites", _unsupported),
    Field("prefer_server_cipher_suites"),
    Field("curve_preferences", _unsupported),
)


def _tls_context(tls: object, base: Path, problems: Problems) -> ssl.SSLContext | None:
    at = ("tls_server_config",)
    if not isinstance(tls, dict):
        problems.add(at, "expected a mapping")
        return None
    values = problems.check(_named(tls), at, _TLS_FIELDS, list_known=False)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2  # exporter-toolkit's default
    for key, attribute in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        if values.get(key) is not None:
            setattr(context, attribute, values[key])
    if any(key in tls and key not in values for key in _TLS_PATHS):
        return None
    cert, key, ca = (
        None if values.get(name) is None else base / values[name] for name in _TLS_PATHS
    )
    if cert is None or key is None:
        problems.add(at, "cert_file and key_file are both required")
        return None
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        problems.add((*at, "cert_file"), f"cannot load {cert} / {key}: {error}")
        return None
    auth = tls.get("client_auth_type", "NoClientCert")
    if not isinstance(auth, str):
        problems.add((*at, "client_auth_type"), f"must be one of {', '.join(_CLIENT_AUTH)}")
        return None
    if auth in _UNSUPPORTED_CLIENT_AUTH:
        problems.add((*at, "client_auth_type"), f"{auth} is not supported: every client "
                     "certificate is verified here; use VerifyClientCertIfGiven or "
                     "RequireAndVerifyClientCert with client_ca_file")  # fmt: skip
        return None
    if auth not in _CLIENT_AUTH:
        problems.add((*at, "client_auth_type"), f"must be one of {', '.join(_CLIENT_AUTH)}")
        return None
    context.verify_mode = _CLIENT_AUTH[auth]
    if context.verify_mode != ssl.CERT_NONE:
        if ca is None:
            problems.add((*at, "client_ca_file"), f"required with {auth}")
            return None
        try:
            context.load_verify_locations(cafile=str(ca))
        except (OSError, ssl.SSLError) as error:
            problems.add((*at, "client_ca_file"), f"cannot load {ca}: {error}")
            return None
    return context
