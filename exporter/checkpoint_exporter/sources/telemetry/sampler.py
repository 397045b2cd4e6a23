"""The sampler thread: every source at ``telemetry.sample_interval`` into fixed-size rings."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence

from checkpoint_exporter.errors import NoDataError
from checkpoint_exporter.sources.telemetry.base import Sample
from checkpoint_exporter.sources.telemetry.ring import Ring

log = logging.getLogger(__name__)


class Source:
    """The interface (structural): a name and ``sample() -> Sample``, raising NoDataError."""

    name: str

    def sample(self) -> Sample:  # pragma: no cover - the interface
        raise NotImplementedError


class Sampler:
    def __init__(
        self,
        sources: Sequence[Source],
        interval: float,
        retention: float,
        clock: Callable[[], float] = time.time,
    ):
        self.sources = list(sources)
        self.interval = interval
        self.size = max(8, math.ceil(retention / interval) + 2)
        self.clock = clock
        self.rings: dict[tuple[str, str, str], Ring] = {}  # (source, device, field)
        self.available: dict[str, bool] = {source.name: False for source in self.sources}
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 0.5) -> None:
        """Waits at most ``timeout`` for a sample under way: a source hung in a call (NVML,
        a sysfs read) is left on the daemon thread, which ends with the process."""
        self._stop.set()
        if self._thread.is_alive():  # stopping what never started is fine
            self._thread.join(timeout)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow source): skip, never burst to catch up
                next_at, delay = time.monotonic(), 0
            self._stop.wait(delay)

    def sample_once(self) -> None:
        for source in self.sources:
            now = self.clock()
            try:
                values = source.sample()
            except NoDataError as reason:
                self.available[source.name] = False
                self.errors[source.name] = str(reason)
                continue
            except Exception:  # a source must never take the sampler down
                log.exception("telemetry source %s failed", source.name)
                self.available[source.name] = False
                continue
            self.available[source.name] = True
            for (device, field), value in values.items():
                key = (source.name, device, field)
                ring = self.rings.get(key)
                if ring is None:
                    with self._lock:
                        ring = self.rings.setdefault(key, Ring(self.size))
                ring.append(now, value)

    def series(self, source: str, field: str) -> dict[str, Ring]:
        """device -> ring, for one source and field."""
        with self._lock:
            items = list(self.rings.items())
        return {device: ring for (name, device, f), ring in items if name == source and f == field}
