"""The main thread's wait for SIGTERM, SIGINT and SIGHUP (daemon/app.py ``Signals``): it sleeps
on a pipe the handler writes to, so a signal wakes it at once and nothing else does."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from checkpoint_exporter.daemon.app import Signals

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@pytest.fixture
def signals() -> Iterator[Signals]:
    before = {number: signal.getsignal(number) for number in HANDLED}
    try:
        yield Signals()
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def _send_from_another_thread(number: int) -> None:
    # As a signal arrives while the main thread sleeps in ``wait``.
    thread = threading.Thread(target=os.kill, args=(os.getpid(), number))
    thread.start()
    thread.join()


def test_a_sighup_wakes_the_wait_for_a_reload_and_sigterm_for_a_stop(signals: Signals) -> None:
    _send_from_another_thread(signal.SIGHUP)
    assert signals.wait(0) == "reload"
    assert signals.reloads == 1
    _send_from_another_thread(signal.SIGTERM)
    assert signals.wait(1) == "stop"
    assert signals.stop == signal.SIGTERM


def test_a_signal_handled_before_the_wait_is_not_missed(signals: Signals) -> None:
    """The handler may run between the flag's check and the sleep: its byte waits in the pipe."""
    os.kill(os.getpid(), signal.SIGINT)  # handled on this thread before ``wait`` is called
    assert signals.wait(0) == "stop"
    assert signals.stop == signal.SIGINT
