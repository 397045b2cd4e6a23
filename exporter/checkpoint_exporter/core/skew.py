"""The storage clock against this node's: how far file mtimes run ahead of (or behind) it.

Each change's newest mtime minus the local time it was seen is the storage clock's offset plus
the detection latency, so the largest recent sample is the best estimate of the offset.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

SKEW_SAMPLES = 16  # changes whose mtime-versus-local-clock offsets estimate the storage's skew
SKEW_TOLERANCE = 2.0  # offsets this small are detection latency, not a clock to correct
# The skew gauge holds the largest offset seen this long (its alert needs 15 minutes), so one file
# dated far off is reported even after sixteen ordinary changes pushed it out of the estimate.
SKEW_HOLD = 3600.0
# A sample this far above the samples' median is one file's date, not the storage's clock: it is
# reported, never used to move other times onto the local clock.
SKEW_OUTLIER = 60.0
# A file dated further ahead is no clock at all (the spool refuses events this far ahead too):
# the gauge reports it, the estimate of the storage's offset never takes it.
SKEW_FUTURE = 300.0


def skew_tolerance(poll_interval: float) -> float:
    """Offsets up to this are detection latency (a poll's interval, and a second of mtime
    granularity), not a clock to correct; windows that differ by no more are the same save's."""
    return max(SKEW_TOLERANCE, poll_interval + 1.0)


@dataclass
class StorageClock:
    """One job's estimate of its storage's clock offset, from the changes it saw."""

    samples: deque[float] = field(default_factory=lambda: deque(maxlen=SKEW_SAMPLES))
    held: tuple[float, float] | None = None  # the largest offset lately, and when seen
    clock: float = 0.0  # the local time of the newest observation (SKEW_HOLD runs on it)

    def saw(self, now: float) -> None:
        """A read at ``now`` (the hold expires on the reads' clock, not on samples alone)."""
        self.clock = max(self.clock, now)

    def sample(self, offset: float, now: float) -> None:
        if offset <= SKEW_FUTURE:
            self.samples.append(offset)  # else a date, not a clock: reported, never used
        # Held: the largest offset ahead of the clock. A date far behind it is an old file copied
        # with its times (`cp -a`, `rsync -a`), not a clock: it goes by with the other samples.
        held = self.held
        if offset > 0 and (held is None or offset >= held[0] or now - held[1] > SKEW_HOLD):
            self.held = (offset, now)

    @property
    def gauge(self) -> float | None:
        """The offset of the recent changes, or the largest seen within SKEW_HOLD (one file
        dated far off is reported long enough for its alert)."""
        estimate = self.estimate()
        held = self.held
        if held is None or estimate is None or abs(held[0]) <= abs(estimate):
            return estimate
        return held[0] if held[1] >= self.clock - SKEW_HOLD else estimate

    def estimate(self) -> float | None:
        """The storage clock's offset: the largest recent sample (detection latency only makes
        samples smaller), leaving out one far above the rest (a file's date, not a clock)."""
        samples = sorted(self.samples)
        if not samples:
            return None
        median = samples[(len(samples) - 1) // 2]
        return max(sample for sample in samples if sample <= median + SKEW_OUTLIER)

    def local_time(self, mtime: float, tolerance: float) -> float:
        """A storage timestamp on this node's clock, once the offset is clearly more than the
        detection latency (``tolerance``)."""
        skew = self.estimate()
        if skew is None or abs(skew) <= tolerance:
            return mtime
        return mtime - skew
