"""The scanner around its own start and death: its answer to /healthz (Scanner.liveness), since
the port opens before the scanner starts, and the workers its first turn adds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from checkpoint_exporter.config import Config, DiscoverConfig, Policy
from checkpoint_exporter.core.jobs import Tracker
from checkpoint_exporter.daemon.scanner import Scanner
from checkpoint_exporter.daemon.timers import SPOOL_POLL, Periodic, TimerKey
from tests.conftest import wait_for


def _scanner(tmp_path: Path) -> Scanner:
    config = Config(spool=tmp_path / "spool")
    return Scanner(config, Tracker(config))


def _slow_start(
    scanner: Scanner, before: Callable[[], object], after: Callable[[], object]
) -> None:
    """The scanner's thread, its start() slowed: ``before`` runs just before the real thread
    starts, ``after`` just after (a loaded node may run either side of Thread.start())."""
    real = scanner._thread

    class Slowed(threading.Thread):
        def start(self) -> None:
            before()
            real.start()
            after()

        def is_alive(self) -> bool:
            return real.is_alive()

        def join(self, timeout: float | None = None) -> None:
            real.join(timeout)

    scanner._thread = Slowed()


def test_a_probe_while_the_thread_starts_is_not_told_it_exited(tmp_path: Path) -> None:
    """On a loaded node (CI, 2 cores) Thread.start() took long enough for the kubelet's probe to
    find the thread not alive yet, and /healthz said "the scanner thread has exited"."""
    scanner = _scanner(tmp_path)
    answers: list[str | None] = []
    # A probe served just before the thread is alive.
    _slow_start(scanner, before=lambda: answers.append(scanner.liveness()), after=lambda: None)
    scanner.start()
    try:
        assert answers == [None]
        assert scanner.liveness() is None
    finally:
        scanner.stop()


def test_a_worker_the_first_turn_adds_runs_however_slowly_start_returns(tmp_path: Path) -> None:
    """Discovery lists its root on the scanner's first turn, which adds the root's mount worker.
    When that turn ran before start() had marked the scanner started (a loaded CI node), the
    worker was never started: the root was never listed and the exporter never became ready."""
    root = tmp_path / "runs"
    root.mkdir()
    config = Config(
        spool=tmp_path / "spool", discover=(DiscoverConfig(root, 10, 3600.0, Policy()),)
    )
    scanner = Scanner(config, Tracker(config))
    # The first turn is done before start() returns.
    _slow_start(scanner, before=lambda: None, after=lambda: wait_for(lambda: scanner._workers, 5))
    scanner.start()
    try:
        assert wait_for(lambda: scanner.readiness() is None, timeout=10)
    finally:
        scanner.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_scanner_thread_that_died_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def dies(self: Scanner) -> None:
        raise SystemExit  # not caught by the loop's `except Exception`, as a bug's BaseException

    monkeypatch.setattr(Scanner, "_run", dies)
    scanner = _scanner(tmp_path)
    scanner.start()
    try:
        assert wait_for(scanner.liveness, timeout=5) == "the scanner thread has exited"
    finally:
        scanner.stop()
    assert scanner.liveness() is None  # stopped on purpose: not a failure


def test_a_timer_that_fails_costs_no_other_timer_of_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in one timer's handling failed the whole turn: the timers popped after it were
    lost, never due again (the spool's poll among them: the spool never read again)."""
    scanner = _scanner(tmp_path)
    handled: list[TimerKey] = []
    broken = Periodic("broken")

    def due(self: Scanner, key: TimerKey, now: float) -> None:
        handled.append(key)
        if key == broken:
            raise RuntimeError("a bug")

    monkeypatch.setattr(Scanner, "_due", due)
    start = time.monotonic() - 10
    scanner._timers.at(broken, start)
    scanner._timers.at(SPOOL_POLL, start + 1)
    with pytest.raises(RuntimeError, match="a bug"):
        scanner._turn()  # the loop logs it
    assert SPOOL_POLL in handled
