"""Validation bookkeeping: which generations to check, and what their verdicts do."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from checkpoint_exporter.core.base import JobBase
from checkpoint_exporter.core.generations import Gen, Happened, Judged, step
from checkpoint_exporter.model import (
    COMMITTED,
    WRITING,
    Found,
    Verdict,
)


@dataclass(frozen=True)
class Observed:
    """What one scan of a tier did: the committed generations to validate."""

    requests: list[ValidationRequest] = field(default_factory=list)


@dataclass(frozen=True)
class ValidationRequest:
    job: str
    tier: str
    generation: str
    signature: tuple[int, int, float]
    found: Found


@dataclass(eq=False)
class Validation(JobBase):
    """Requests, verdicts and retries of the structural checks."""

    validation_failures: Counter[str] = field(default_factory=Counter)
    _next_retry: float | None = None  # the soonest retry_at of a generation left unchecked

    def _settled(self, gen: Gen, now: float) -> bool:
        """A generation without a commit marker, unchanged for the settle period, unjudged."""
        return (
            gen.state == WRITING
            and gen.found.settles
            and gen.still(now, self.policy.settle)
            and gen.validated != gen.signature
        )

    def _needs_validation(self, gen: Gen, now: float) -> bool:
        if not gen.found.checks or gen.pending == gen.signature or now < gen.retry_at:
            return False
        if gen.state == COMMITTED:
            return gen.validated != gen.signature
        return self._settled(gen, now)

    def submitted(self, request: ValidationRequest) -> None:
        """The request is on its way: don't ask again for the same signature."""
        gen = self._gens.get((request.tier, request.generation))
        if gen is not None:
            gen.pending = request.signature

    def apply_verdict(self, request: ValidationRequest, verdict: Verdict) -> None:
        self._touch()
        gen = self._gens.get((request.tier, request.generation))
        if gen is None or gen.signature != request.signature:
            return  # gone, or changed since: a fresh request is already on its way
        if gen.state == WRITING and gen.found.settles:
            self._judged(gen, verdict)
            return
        self._verdict(gen, verdict)

    def _judged(self, gen: Gen, verdict: Verdict) -> None:
        """A generation without a commit marker, still for the settle period, was checked: whole
        means committed (when its last write ended); incomplete stays a save in progress until
        the deadline passes without progress (a writer may pause between two chunks)."""
        gen.validated, gen.pending, gen.retry_at = gen.signature, None, 0.0
        if verdict.step is not None:
            gen.step_inside = verdict.step
        gen.state, happened = step(gen.state, Judged(verdict.valid, gen.history))
        if happened is Happened.INCOMPLETE:
            gen.invalid_reason = verdict.reason
            return
        if happened is Happened.COMMITTED:
            self._commit(gen)  # history is committed without a count: gauges only
        gen.valid, gen.invalid_reason, gen.last_commit = True, None, None
        self._still_writing()

    def retry_validation(self, request: ValidationRequest, not_before: float = 0.0) -> None:
        """No verdict: the generation moved while it was read (ask again on the next scan), or
        its checks could not run (ask again at ``not_before``)."""
        gen = self._gens.get((request.tier, request.generation))
        if gen is not None and gen.pending == request.signature:
            gen.pending, gen.retry_at = None, not_before
            if not_before:
                self._next_retry = min(self._next_retry or not_before, not_before)

    def validation_retry_due(self, now: float) -> bool:
        """A generation left unchecked is due to be asked again (``due_validations``)."""
        if self._next_retry is None or now < self._next_retry:
            return False
        self._next_retry = None
        return True

    def due_validations(self, now: float) -> list[ValidationRequest]:
        """The checks whose retry came due, asked again from what the last read saw of each
        generation: a timer, not a read of the tier (a generation that changed since has been
        read again anyway, and a verdict on an older signature is dropped)."""
        if not self.validation_retry_due(now):
            return []
        requests = [
            ValidationRequest(self.name, tier, gen.found.id, gen.signature, gen.found)
            for (tier, _), gen in self._gens.items()
            if self._needs_validation(gen, now)
        ]
        self._next_retry = min(
            (g.retry_at for g in self._gens.values() if g.retry_at > now and g.pending is None),
            default=None,
        )
        return requests

    def _verdict(self, gen: Gen, verdict: Verdict) -> None:
        first_verdict_of_history = gen.history and gen.validated is None
        gen.valid, gen.invalid_reason = verdict.valid, verdict.reason
        gen.validated, gen.pending, gen.retry_at = gen.signature, None, 0.0
        if verdict.step is not None:
            gen.step_inside = verdict.step
        if not verdict.valid and verdict.reason and not first_verdict_of_history:
            self.validation_failures[verdict.reason] += 1
