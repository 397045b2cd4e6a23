"""Tier reads applied to a job's generations (the state machine in core/generations.py)."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from checkpoint_exporter.core.base import JobBase
from checkpoint_exporter.core.generations import (
    FirstSight,
    Gen,
    Happened,
    Stalled,
    StillAfterLoss,
    behind,
    listing_path,
    reread,
    step,
    written_to,
)
from checkpoint_exporter.core.skew import SKEW_FUTURE
from checkpoint_exporter.core.validation import Observed, ValidationRequest
from checkpoint_exporter.model import (
    COMMITTED,
    DURABLE,
    WRITING,
    Found,
    Verdict,
)

# The parts of a JobTracker log as the tracker did before it was split (logger=core.tracker).
log = logging.getLogger("checkpoint_exporter.core.tracker")


@dataclass(eq=False)
class Scans(JobBase):
    """What the reads of each tier showed: the generations' lifecycle."""

    # Per tier, what the last scan could not read: a generation first seen once it became
    # readable is history, and no save behind it is aborted while it cannot be seen.
    _unreadable: dict[str, frozenset[str]] = field(default_factory=dict)
    _hidden_since: dict[str, float] = field(default_factory=dict)  # when that began, per tier

    def observe(
        self,
        tier: str,
        found: list[Found],
        now: float,
        unreadable: Collection[str] = (),
        layout: str | None = None,
    ) -> Observed:
        """Apply one scan of ``tier``: what to validate, and what just committed (``Observed``).

        ``layout``: the layout the scan detected (None when fixed by the config or not known
        yet); the durable tier's names the job's.
        ``unreadable`` names the relative paths the scan could not read ("" for the root): what
        is known below them stays as it was (a permission flipped for a moment is not a deletion
        followed by a burst of false commits), and nothing new is taken from them.
        """
        if tier == DURABLE and layout is not None and layout != self.layout:
            log.info("job=%s: layout detected as %s", self.name, layout)
            self.layout = layout
            self._touch()
        if unreadable and first_read_failed(tier, self._scanned, unreadable):
            return Observed()  # nothing known yet and nothing readable: the next read is the first
        first = tier not in self._scanned
        hidden_before = self._unreadable.get(tier, frozenset())
        hidden_since = self._hidden_since.get(tier, now)
        self._unreadable[tier] = frozenset(unreadable)
        if not unreadable:
            self._hidden_since.pop(tier, None)
        elif not hidden_before:
            self._hidden_since[tier] = now
        self.skew.saw(now)
        self._scanned.add(tier)
        changed = first
        seen = set()
        requests = []
        for item in found:
            key = (tier, item.id)
            if unreadable and behind(item.id, unreadable):
                if key in self._gens:
                    seen.add(key)
                continue
            seen.add(key)
            gen = self._gens.get(key)
            if gen is None:
                # Behind what could not be read, and written before that began: it was there
                # all along, unseen (history); written since, it is a save like any other.
                history = first or (
                    bool(hidden_before)
                    and behind(item.id, hidden_before)
                    and item.last_write_time < hidden_since
                )
                gen, changed = self._new(tier, item, now, history), True
                self._sign_of_life(item.last_write_time, now)
                if history:  # watched since before its first generation was written, at least
                    self.first_seen = min(self.first_seen, max(0.0, min(item.start_time, now)))
                else:
                    self._runs_again(item.start_time, now)
            elif item is not gen.found:  # the scanner passes the same Found while nothing moved
                if written_to(gen.found, item):
                    self._sign_of_life(item.last_write_time, now)
                self._update(gen, item, now)
                changed = True
            if item.invalid and gen.state == COMMITTED and gen.validated != gen.signature:
                self._verdict(gen, Verdict(False, item.reason, "found by the layout"))
                changed = True
            elif self._settled(gen, now) and not gen.found.checks:
                self._judged(gen, Verdict(True))  # nothing structural to wait for
                changed = True
            elif self._needs_validation(gen, now):
                requests.append(ValidationRequest(self.name, tier, item.id, gen.signature, item))
        for key in [k for k in self._gens if k[0] == tier and k not in seen]:
            if unreadable and behind(key[1], unreadable):
                continue  # not seen because it could not be read: kept as last known
            del self._gens[key]  # deleted (retention) or renamed away
            changed = True
        self._next_retry = min(
            (g.retry_at for g in self._gens.values() if g.retry_at > now and g.pending is None),
            default=None,
        )
        if changed:
            self._touch()
        self._still_writing()
        self._update_drain()
        # Newest first, so the generation a restore would pick is judged first.
        requests.sort(key=lambda r: r.found.commit_time or 0.0, reverse=True)
        return Observed(requests)

    def _new(self, tier: str, item: Found, now: float, first: bool) -> Gen:
        gen = Gen(item, tier, item.state, item.start_time, now, history=first, found_at=now)
        gen.seen(now)
        gen.committed_at = item.commit_time if item.state == COMMITTED else None
        if not first or item.last_write_time - now > SKEW_FUTURE:
            # History says nothing of the clock, unless it is dated ahead of now.
            self.skew.sample(item.last_write_time - now, now)
        self._gens[(tier, item.id)] = gen
        if first and item.settles and now - item.last_write_time < self.policy.settle:
            # Found at start-up with files younger than the settle period: a save once they
            # stay still (older ones are judged at once, as history).
            gen.history = False
        elif first and item.settles:
            gen.progress_at = now - self.policy.settle
        abandoned = now - item.last_write_time > self.policy.abort_seconds
        seen = FirstSight(item.state, first, item.settles, abandoned)
        gen.state, happened = step(None, seen)
        if happened is Happened.COMMITTED:
            self._commit(gen)
        elif happened is Happened.ABORTED:
            self._abort(gen, item.reason)
        if gen.state == COMMITTED and not item.checks and not item.invalid:
            gen.valid, gen.validated = True, gen.signature  # nothing structural to check
        return gen

    def _update(self, gen: Gen, item: Found, now: float) -> None:
        evidence = reread(gen, item, now, self.policy.settle)
        before = gen.public() if gen.state == COMMITTED else None
        if evidence.moved:
            gen.progress_at = now
            if item.last_write_time != gen.found.last_write_time:
                self.skew.sample(item.last_write_time - now, now)
        gen.start_time = min(gen.start_time, item.start_time)
        gen.found = item
        gen.seen(now)
        gen.state, happened = step(gen.state, evidence)
        if happened is Happened.DELETING:
            gen.last_commit = None
        elif happened is Happened.RESAVED:
            self._recommit(gen, item, now)
        elif happened is Happened.COMMITTED:
            self._commit(gen)
            if not item.checks and not item.invalid:
                gen.valid, gen.validated = True, gen.signature
        elif happened is Happened.ABORTED:
            self._abort(gen, item.reason)
        elif happened is Happened.REWRITTEN:
            # The commit marker went away, or a generation without one changed after its
            # verdict: it is being written again (rewritten in place, copied over), a new save.
            gen.history = False
            gen.valid = gen.invalid_reason = gen.validated = gen.pending = None
            gen.progress_at = now
            gen.start_time = item.start_time if evidence.moved else gen.start_time
            if item.settles and before is not None:
                gen.last_commit = before
        elif happened is Happened.LIVE:
            gen.history = False  # it moved while we watched: a live save, counted when judged
        if gen.state == COMMITTED and item.commit_time is not None:
            gen.committed_at = item.commit_time

    def _recommit(self, gen: Gen, item: Found, now: float) -> None:
        """The generation was saved again under its own name: a new save, counted and judged
        afresh (its previous verdict stands on the gauge until the new one is known)."""
        gen.state, gen.history, gen.last_commit = WRITING, False, None
        gen.start_time, gen.progress_at = item.start_time, now
        gen.valid = gen.invalid_reason = gen.validated = gen.pending = None
        self._commit(gen)
        if not item.checks and not item.invalid:
            gen.valid, gen.validated = True, gen.signature

    def _abort_stalled(self, now: float) -> None:
        """Abort saves that made no progress for their stall limit (on the local clock)."""
        if self._writing:
            for gen in self._gens.values():
                hidden = self._unreadable.get(gen.tier)
                if hidden and behind(gen.found.id, hidden):
                    continue  # cannot be seen now: no progress is not evidence of an abort
                if gen.state == WRITING and self._stalled(gen, now):
                    reason = gen.invalid_reason or (
                        f"no progress for {self.policy.abort_seconds:g} s since its last write"
                    )
                    gen.state, happened = step(gen.state, Stalled(reason))
                    if happened is Happened.ABORTED:
                        self._abort(gen, reason)
                    self._touch()
            self._still_writing()

    def _judge_lost(self, now: float) -> None:
        """A deleting generation still for the settle period lost its files for good."""
        for gen in self._gens.values():
            if gen.lost_for_good(now, self.policy.settle):
                # Judged again: its signature changed since its verdict.
                gen.state, _ = step(gen.state, StillAfterLoss())
                self._next_retry = min(self._next_retry or now, now)  # a scan asks for it
                self._touch()

    def _stalled(self, gen: Gen, now: float) -> bool:
        limit = self._stall_limit(gen)
        return limit is not None and now - gen.progress_at > limit

    def _stall_limit(self, gen: Gen) -> float | None:
        """Seconds without progress after which a save in progress is aborted; None: not now.

        abort_after, not the deadline: a save slower than its deadline is late (counted when it
        commits), and a slow commit writes nothing for a while before its marker appears."""
        if gen.found.settles:
            # Judged by its checks once still; a verdict under way is waited for (so is one
            # whose checks could not run: not judged is not aborted), and one that found it
            # incomplete stands only once abort_after passed without progress.
            if gen.pending == gen.signature or gen.retry_at:
                return None
            return max(self.policy.abort_seconds, self.policy.settle)
        return self.policy.abort_seconds

    def _superseded(self, newer: Gen) -> None:
        """A newer save committed on the tier while an older one made no progress since before
        it started: the job moved on, the older save will never finish (a rank died mid-save
        and the job restarted): aborted now rather than after abort_after."""
        for gen in list(self._gens.values()):
            if gen is newer or gen.tier != newer.tier or gen.state != WRITING or gen.history:
                continue
            if self._stall_limit(gen) is None:
                continue  # its verdict is under way, or its checks could not run: not judged
            older, new = gen.found.step, newer.found.step
            if older is not None and new is not None and older >= new:
                continue
            if gen.found.last_write_time < newer.start_time:
                self._abort(gen, f"a newer save ({newer.found.id}) committed while it stood still")
        self._still_writing()

    def hot_directories(self, tier: str) -> list[str]:
        """Generations being written on ``tier``: their files are re-statted while hot."""
        return [
            listing_path(gen.found.id)
            for (t, _), gen in self._gens.items()
            if t == tier and gen.state == WRITING
        ]

    def has_saves_in_progress(self) -> bool:
        return self._writing


def first_read_failed(tier: str, scanned: Collection[str], unreadable: Collection[str]) -> bool:
    """The tier was never read and its root cannot be: nothing to keep, nothing to learn."""
    return tier not in scanned and "" in unreadable
