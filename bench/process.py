"""A real exporter (``checkpoint-exporter serve``) in its own process, and what it costs."""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

_TICKS = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))] if ordered else 0.0


def write_config(path: Path, jobs: dict[str, Path], extra: str = "", **defaults: str) -> Path:
    """A config of DCP jobs; ``defaults`` become the jobs' defaults (watch, poll_interval)."""
    policy = ", ".join(f"{key}: {value}" for key, value in {"layout": "dcp", **defaults}.items())
    lines = [f"spool: {path.parent / 'spool'}", f"defaults: {{{policy}}}", extra, "jobs:"]
    lines += [f"  - {{name: {name}, path: {where}}}" for name, where in jobs.items()]
    path.write_text("\n".join(line for line in lines if line) + "\n")
    return path


class Exporter:
    def __init__(self, config: Path, *flags: str, prefix: tuple[str, ...] = ()):
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "checkpoint_exporter", "serve",
             "--config.file", str(config), "--web.listen-address", "127.0.0.1:0", *flags],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.port = self._port()
        self._connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def _port(self) -> int:
        assert self.process.stderr is not None
        said = []
        for line in self.process.stderr:
            said.append(line)
            match = re.search(r"url=http://[^:\s]+:(\d+)/", line)
            if match:
                # Keep draining stderr so the exporter never blocks on a full pipe.
                threading.Thread(target=self.process.stderr.read, daemon=True).start()
                return int(match.group(1))
        raise RuntimeError("the exporter exited before listening:\n" + "".join(said[-20:]))

    def scrape(self) -> bytes:
        try:
            self._connection.request("GET", "/metrics")
            return self._connection.getresponse().read()
        except (ConnectionError, http.client.RemoteDisconnected):
            # The server closes a keep-alive connection idle past its timeout: reconnect.
            self._connection.close()
            self._connection.request("GET", "/metrics")
            return self._connection.getresponse().read()

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        parsed = {}
        for family in text_string_to_metric_families(self.scrape().decode()):
            for sample in family.samples:
                parsed[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return parsed

    def total(self, name: str) -> float:
        """The sum of a metric's samples over all label sets."""
        return sum(value for (key, _), value in self.samples().items() if key == name)

    def wait_for_jobs(self, jobs: int, timeout: float, files: int | None = None) -> float:
        """Seconds until ``jobs`` jobs show a committed generation (of ``files`` files)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            committed = [
                value
                for (name, _), value in self.samples().items()
                if name == "checkpoint_last_committed_files"
            ]
            if len(committed) >= jobs and (files is None or min(committed) == files):
                return time.monotonic() - started
            time.sleep(0.05)
        raise TimeoutError(f"{jobs} jobs were not all committed within {timeout} s")

    def cpu_seconds(self) -> float:
        """User + system CPU of the exporter process, all threads."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self._connection.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
