"""The daemon touches the core through the ``Tracker`` alone, by job name: ``apply`` (the one
call that changes a job), ``state`` (its published view), ``publish``, and a job's lifecycle
(``start``, ``life``, ``forget``). It never holds a ``JobTracker`` nor reads its fields, so
what the core keeps inside a job can change without the daemon knowing."""

from __future__ import annotations

import ast
from pathlib import Path

import checkpoint_exporter

PACKAGE = Path(checkpoint_exporter.__file__).parent
# The daemon's side: the loop's modules and the wiring that builds it.
DAEMON = sorted((PACKAGE / "daemon").glob("*.py")) + sorted((PACKAGE / "cli").glob("*.py"))
ALLOWED = {"apply", "state", "publish", "start", "life", "forget", "names", "snapshot"}


def tracker_uses(source: str) -> set[str]:
    """The attributes read of anything named ``tracker`` (``tracker.x``, ``self.tracker.x``,
    ``self._scanner.tracker.x``), and ``JobTracker`` wherever it is imported or named."""
    uses = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            owner = node.value
            named = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
            if named == "tracker":
                uses.add(node.attr)
        if isinstance(node, ast.ImportFrom) and any(a.name == "JobTracker" for a in node.names):
            uses.add("JobTracker")
        if isinstance(node, ast.Name) and node.id == "JobTracker":
            uses.add("JobTracker")
    return uses


def test_the_daemon_calls_the_core_through_apply_state_and_publish() -> None:
    assert len(DAEMON) > 10
    used = {path.name: tracker_uses(path.read_text()) - ALLOWED for path in DAEMON}
    assert {name: extra for name, extra in used.items() if extra} == {}


def test_the_check_bites() -> None:
    reaching_in = """
from checkpoint_exporter.core.tracker import JobTracker
def f(self):
    self.tracker.jobs["j"].clocks.dropped
    self._scanner.tracker.apply("j", None)
"""
    assert tracker_uses(reaching_in) - ALLOWED == {"jobs", "JobTracker"}
