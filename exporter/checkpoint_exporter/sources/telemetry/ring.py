"""A fixed-size ring of (time, value) samples: memory is set at creation, whatever the uptime."""

from __future__ import annotations

import threading
from array import array


class Ring:
    def __init__(self, size: int):
        self.size = size
        self._times = array("d", bytes(8 * size))
        self._values = array("d", bytes(8 * size))
        self._next = 0
        self._count = 0
        self._lock = threading.Lock()  # one writer (the sampler), readers on other threads

    def append(self, time: float, value: float) -> None:
        with self._lock:
            self._times[self._next] = time
            self._values[self._next] = value
            self._next = (self._next + 1) % self.size
            self._count = min(self._count + 1, self.size)

    def samples(self, start: float, end: float) -> tuple[list[float], list[float]]:
        """Samples from the last one at or before ``start`` to the first at or after ``end``."""
        with self._lock:
            order = [(self._next - self._count + i) % self.size for i in range(self._count)]
            times = [self._times[i] for i in order]
            values = [self._values[i] for i in order]
        first = 0
        while first + 1 < len(times) and times[first + 1] <= start:
            first += 1
        last = len(times) - 1
        while last - 1 >= 0 and times[last - 1] >= end:
            last -= 1
        return times[first : last + 1], values[first : last + 1]

    def __len__(self) -> int:
        return self._count
