"""The scanner's answer to /healthz (Scanner.liveness) around its own start and death: the port
opens before the scanner starts, so a probe can arrive while its thread is still starting."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from checkpoint_exporter.config import Config
from checkpoint_exporter.core.tracker import Tracker
from checkpoint_exporter.daemon.scanner import Scanner
from tests.conftest import wait_for


def _scanner(tmp_path: Path) -> Scanner:
    config = Config(spool=tmp_path / "spool")
    return Scanner(config, Tracker(config))


def test_a_probe_while_the_thread_starts_is_not_told_it_exited(tmp_path: Path) -> None:
    """On a loaded node (CI, 2 cores) Thread.start() took long enough for the kubelet's probe to
    find the thread not alive yet, and /healthz said "the scanner thread has exited"."""
    scanner = _scanner(tmp_path)
    answers: list[str | None] = []
    real = scanner._thread

    class Probed(threading.Thread):
        def start(self) -> None:  # a probe served just before the thread is alive
            answers.append(scanner.liveness())
            real.start()

        def is_alive(self) -> bool:
            return real.is_alive()

        def join(self, timeout: float | None = None) -> None:
            real.join(timeout)

    scanner._thread = Probed()
    scanner.start()
    try:
        assert answers == [None]
        assert scanner.liveness() is None
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
