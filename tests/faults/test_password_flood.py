"""Basic auth under a flood of wrong passwords: each new password costs a bcrypt check, and the
checks run one at a time. The flood may wait, and be told 429; Prometheus may not be locked out.

The adversarial run this reproduces: 80 clients sending new wrong passwords made a Prometheus
whose credentials were not cached get 429 thirteen times in a row, then a 7.1 s answer; every
check shared one queue of 64, first come first served, so the flood always had it full.
"""

from __future__ import annotations

import base64
import http.client
import threading
from collections.abc import Iterator

import bcrypt
import pytest

from checkpoint_exporter import webconfig
from checkpoint_exporter.config import WebConfig
from checkpoint_exporter.exposition.renderer import Renderer
from checkpoint_exporter.exposition.server import MetricsServer
from checkpoint_exporter.model import Snapshot
from checkpoint_exporter.webconfig import WebSecurity
from tests.conftest import wait_for
from tests.exposition.test_web_security import hold_checks

PASSWORD = "correct horse"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _security(clock: Clock) -> WebSecurity:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4))
    return WebSecurity(users={"prometheus": hashed}, clock=clock)


def _proven_but_no_longer_cached(security: WebSecurity, clock: Clock) -> None:
    """Prometheus' credentials succeeded once; then its scrapes paused past the verdict's
    lifetime (or the cache was emptied), so its next request needs bcrypt again."""
    assert security.authorized("prometheus", PASSWORD, "10.0.0.9")
    clock.now += webconfig.SUCCESS_TTL_SECONDS + 1
    assert security.cached("prometheus", PASSWORD) is None


def test_a_credential_that_succeeded_before_is_checked_ahead_of_a_full_queue() -> None:
    clock = Clock()
    security = _security(clock)
    _proven_but_no_longer_cached(security, clock)
    release, checked = hold_checks(security)
    verdicts: dict[str, bool | None] = {}

    def submit(password: str, client: str) -> None:
        def done(verdict: bool | None) -> None:
            verdicts[password] = verdict

        if not security.check_later("prometheus", password, client, done):
            done(None)  # no room: busy

    submit("in progress", "10.0.1.0")
    wait_for(lambda: checked == [b"in progress"])
    # A flood from many addresses fills the queue, up to its end: the next guess is refused.
    guesses = [f"guess {n}" for n in range(webconfig.MAX_WAITING_CHECKS + 1)]
    for n, guess in enumerate(guesses):
        submit(guess, f"10.0.2.{n}")
    assert security.waiting() == webconfig.MAX_WAITING_CHECKS
    assert verdicts == {guesses[-1]: None}  # no room: busy
    try:
        submit(PASSWORD, "10.0.0.9")
        assert PASSWORD not in verdicts  # queued, in the reserved budget
    finally:
        release.set()
    wait_for(lambda: len(verdicts) == len(guesses) + 2, timeout=30)
    assert verdicts[PASSWORD] is True
    assert checked[:2] == [b"in progress", PASSWORD.encode()]  # the very next check


def test_a_flood_from_one_address_cannot_take_another_addresses_turn() -> None:
    """A Prometheus never seen before (the exporter just restarted) from its own address
    waits for one guess of the flood's at most, not for the whole queue."""
    security = _security(Clock())
    release, checked = hold_checks(security)
    verdicts: dict[str, bool | None] = {}

    def submit(password: str, client: str) -> None:
        def done(verdict: bool | None) -> None:
            verdicts[password] = verdict

        if not security.check_later("prometheus", password, client, done):
            done(None)  # no room: busy

    submit("in progress", "10.0.0.66")
    wait_for(lambda: checked == [b"in progress"])
    guesses = [f"guess {n}" for n in range(webconfig.PER_CLIENT_CHECKS + 1)]
    for guess in guesses:
        submit(guess, "10.0.0.66")
    assert verdicts == {guesses[-1]: None}  # the address has its share waiting already
    try:
        submit(PASSWORD, "10.0.0.9")
        assert PASSWORD not in verdicts
    finally:
        release.set()
    wait_for(lambda: len(verdicts) == len(guesses) + 2, timeout=30)
    assert verdicts[PASSWORD] is True
    assert checked[:3] == [b"in progress", b"guess 0", PASSWORD.encode()]


@pytest.fixture
def guarded() -> Iterator[tuple[MetricsServer, Clock]]:
    clock = Clock()
    server = MetricsServer(
        WebConfig(listen_address="127.0.0.1:0"),
        Renderer(lambda: Snapshot(), []),
        _security(clock),
    )
    server.start()
    yield server, clock
    server.stop()


def _get(port: int, password: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    token = base64.b64encode(f"prometheus:{password}".encode()).decode()
    try:
        connection.request("GET", "/metrics", headers={"Authorization": f"Basic {token}"})
        reply = connection.getresponse()
        reply.read()
        return reply.status
    finally:
        connection.close()


CLOSED = 0  # a flood client's connection closed to make room for a newer one of its address


def test_eighty_guessing_clients_cannot_lock_out_prometheus(guarded) -> None:
    """Over HTTP, every client on one address (loopback), as in the adversarial run. The flood's
    checks are held in progress, so its queue stays full; Prometheus' request, whose
    credentials succeeded before but are no longer cached, is answered 200 at its first try
    (it was 429 thirteen times). 80 clients, as in the adversarial run: more connections
    (each refusal held for its Retry-After) than the address may hold open, so the flood's
    connections also close one another's (tests/faults/test_connection_storm.py), never
    Prometheus' request."""
    server, clock = guarded
    port = server.address.port
    security = server.security
    _proven_but_no_longer_cached(security, clock)
    release, checked = hold_checks(security)
    statuses: list[int] = []
    stop = threading.Event()

    def guess(client: int) -> None:
        attempt = 0
        while not stop.is_set():
            try:
                statuses.append(_get(port, f"{client}/{attempt}"))
            except (http.client.HTTPException, OSError):
                statuses.append(CLOSED)
            attempt += 1

    flood = [threading.Thread(target=guess, args=(n,), daemon=True) for n in range(80)]
    for thread in flood:
        thread.start()
    prometheus: list[int] = []
    try:
        # One check in progress, the address's share queued, the rest of the flood told 429.
        wait_for(
            lambda: (
                security.waiting() == webconfig.PER_CLIENT_CHECKS and {429, CLOSED} & set(statuses)
            )
        )
        scrape = threading.Thread(target=lambda: prometheus.append(_get(port, PASSWORD)))
        scrape.start()
        wait_for(lambda: security.waiting() == webconfig.PER_CLIENT_CHECKS + 1)
    finally:
        release.set()
    scrape.join(timeout=30)
    stop.set()
    for thread in flood:
        thread.join(timeout=30)
    assert prometheus == [200]
    assert checked.index(PASSWORD.encode()) == 1  # right after the one in progress
    assert set(statuses) <= {401, 429, CLOSED}


def test_a_check_that_fails_is_busy_and_the_checker_goes_on() -> None:
    security = _security(Clock())
    check = security._check
    broken = [True]

    def flaky(expected: bytes | None, password: bytes) -> bool:
        if broken.pop() if broken else False:
            raise RuntimeError("bcrypt broke")
        return check(expected, password)

    security._check = flaky  # type: ignore[method-assign]
    with pytest.raises(webconfig.AuthBusy):
        security.authorized("prometheus", PASSWORD, "10.0.0.9")
    assert security.authorized("prometheus", PASSWORD, "10.0.0.9")
