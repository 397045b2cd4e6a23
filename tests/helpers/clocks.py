"""The daemon's two clocks for a loop run turn by turn (Scanner(clock=, monotonic=)), moved by
the test alone."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Clocks:
    wall: float
    mono: float = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds
