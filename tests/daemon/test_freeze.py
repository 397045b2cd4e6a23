"""The start-up heap is frozen out of the cyclic collector once the first pass is done
(daemon/app.py ``freeze_when_ready``): full collections then walk what changed, not every job."""

from __future__ import annotations

import pytest

from checkpoint_exporter.daemon import app


class _Stop:
    """A stop event that never waits: each look at it is one step of the loop."""

    def __init__(self, set_after: int | None = None) -> None:
        self.looks = 0
        self.set_after = set_after

    def wait(self, timeout: float) -> bool:
        self.looks += 1
        return self.set_after is not None and self.looks >= self.set_after


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(app.gc, "collect", lambda: calls.append("collect"))
    monkeypatch.setattr(app.gc, "freeze", lambda: calls.append("freeze"))
    return calls


def test_the_heap_is_frozen_once_ready_after_a_collection(frozen: list[str]) -> None:
    answers = iter(["first pass not finished (1 of 2 tiers)", "first pass not finished", None])
    stop = _Stop()
    app.freeze_when_ready(lambda: next(answers), stop)  # type: ignore[arg-type]
    assert frozen == ["collect", "freeze"]
    assert stop.looks == 2


def test_a_stop_before_ready_freezes_nothing(frozen: list[str]) -> None:
    app.freeze_when_ready(lambda: "first pass not finished", _Stop(set_after=3))  # type: ignore[arg-type]
    assert frozen == []
