"""The real DCP job of tests/helpers/dcp_writer.py as a subprocess the tests can SIGKILL."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

WRITER = Path(__file__).resolve().parent / "dcp_writer.py"


class Writer:
    """The DCP job in its own process group, its JSON lines on a queue."""

    def __init__(self, root: Path, *args: str):
        self.process = subprocess.Popen(
            [sys.executable, str(WRITER), str(root), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))

    def next(self, timeout: float = 120) -> dict:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            stderr = self.process.stderr.read() if self.process.poll() is not None else ""
            raise AssertionError(
                f"writer printed nothing for {timeout} s: {stderr[-2000:]}"
            ) from None

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        for stream in (self.process.stdout, self.process.stderr):
            if stream:
                stream.close()
