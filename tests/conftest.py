"""Shared helpers: run the real CLI, and a real exporter process on a loopback port."""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The heartbeats a save starts would outlive the test that saved (a daemon thread writing into
# its spool every minute, into later tests' time): off, except where a test starts them itself.
os.environ["CHECKPOINT_EXPORTER_HEARTBEAT_SECONDS"] = "0"
CLI = [sys.executable, "-m", "checkpoint_exporter"]


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False
    )


def require_tool(name: str) -> str:
    """Path of a toolchain binary; its absence is a set-up error, never a skip."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run `make test` (scripts/ensure-toolchain) first")
    return path


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()


class Exporter:
    """``checkpoint-exporter serve`` in a subprocess, listening on an ephemeral loopback port."""

    def __init__(
        self,
        *args: str,
        cwd: Path | None = None,
        prefix: list[str] | None = None,
        env: dict[str, str] | None = None,
        ready: bool = True,
    ):
        merged = {**os.environ, **(env or {})}
        self.process = subprocess.Popen(
            [*(prefix or []), *CLI, "serve", "--web.listen-address", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            # A prefix may run it as another user (setpriv), who may not read the checkout.
            env=as_user_env(merged) if prefix else merged,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.base = self._wait_for_url()
        if ready:
            self.wait_ready()

    def wait_ready(self, timeout: float = 30) -> None:
        """Until the first pass is done (the port opens before it). Read from the log, so it
        works with TLS and basic auth alike."""
        try:
            wait_for(lambda: any("ready: " in line for line in self.log), timeout)
        except AssertionError:
            self.process.kill()
            raise AssertionError("exporter never became ready:\n" + "".join(self.log)) from None

    def _pump(self) -> None:
        assert self.process.stderr is not None
        try:
            for line in self.process.stderr:
                self.log.append(line)
                self.lines.put(line)
        except ValueError:  # close() shut the stream under this reader: the process is gone
            pass
        self.lines.put("")

    def drain_log(self) -> list[str]:
        """Every log line the exporter wrote so far."""
        return list(self.log)

    def _wait_for_url(self, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                continue
            match = re.search(r"url=(https?://\S+?)(/[^\s\"]*)?[\s\"]", line)
            if "listening" in line and match:
                return match.group(1)
            if line == "":
                break
        self.process.kill()
        raise AssertionError("exporter did not start:\n" + "".join(self.log))

    def get(self, path: str, headers: dict[str, str] | None = None) -> Response:
        request = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return Response(reply.status, dict(reply.headers), reply.read())
        except urllib.error.HTTPError as error:
            return Response(error.code, dict(error.headers), error.read())

    def metrics(self) -> str:
        reply = self.get("/metrics")
        assert reply.status == 200, reply
        return reply.text

    def value(self, name: str, **labels: str) -> float | None:
        """One sample from a fresh scrape (labels not given may have any value)."""
        return sample(self.metrics(), name, **labels)

    def stop(self, signum: int = signal.SIGTERM) -> tuple[int, float]:
        started = time.monotonic()
        self.process.send_signal(signum)
        code = self.process.wait(timeout=10)
        return code, time.monotonic() - started

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        for stream in (self.process.stdout, self.process.stderr):
            if stream:
                stream.close()


# What a fixture needs, marked where the fixture is asked for rather than by hand on each test:
# a test that starts the exporter is a `daemon` test wherever it lives, one that has PyTorch
# write a real checkpoint first a `torch` test.
FIXTURE_MARKERS = {"exporter": "daemon", "real_checkpoint": "torch", "real_save": "torch"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


@pytest.fixture
def exporter() -> Iterator[type[Exporter]]:
    started: list[Exporter] = []

    def start(
        *args: str,
        cwd: Path | None = None,
        prefix: list[str] | None = None,
        env: dict[str, str] | None = None,
        ready: bool = True,
    ) -> Exporter:
        instance = Exporter(*args, cwd=cwd, prefix=prefix, env=env, ready=ready)
        started.append(instance)
        return instance

    yield start  # type: ignore[misc]
    for instance in started:
        instance.close()


def write_config(directory: Path, text: str, name: str = "config.yaml") -> Path:
    path = directory / name
    path.write_text(text)
    return path


# What a process run as another user imports: the package and its runtime dependencies.
_RUNTIME_MODULES = ("checkpoint_exporter", "yaml", "prometheus_client", "pynvml", "bcrypt")


@functools.cache
def readable_runtime() -> str:
    """A world-readable copy of the package and its runtime dependencies, for the processes the
    tests run as another user: a checkout in `mktemp -d` (0700), and the virtualenv in it, are
    not theirs to read. Removed when the session ends."""
    runtime = Path(tempfile.mkdtemp(prefix="checkpoint-exporter-runtime-"))
    atexit.register(shutil.rmtree, runtime, ignore_errors=True)
    for name in _RUNTIME_MODULES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, f"{name} is not installed"
        origin = Path(spec.origin)
        if origin.name == "__init__.py":
            shutil.copytree(origin.parent, runtime / name, ignore=_NOT_RUNTIME)
        else:
            shutil.copy2(origin, runtime)
    for path in (runtime, *runtime.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return str(runtime)


_NOT_RUNTIME = shutil.ignore_patterns("__pycache__")


def as_user(uid: int | str, gid: int | str) -> list[str]:
    """A command prefix that runs as ``uid``:``gid`` with no supplementary groups (tests run as
    root in CI). Its process imports the package through ``as_user_env``."""
    return [require_tool("setpriv"), f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]


def as_user_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (this process's by default) for a process run as another user: the package and
    its dependencies from ``readable_runtime``, before any PYTHONPATH given."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (readable_runtime(), env.get("PYTHONPATH")) if p)
    return env


def as_nobody() -> list[str]:
    """A command prefix that drops to the unprivileged 'nobody' user (tests run as root in CI)."""
    if os.geteuid() != 0:
        return []
    return as_user("nobody", "nogroup")


def parse_samples(text: str) -> dict[str, float]:
    """Exposition text -> {'name{labels}': value}."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def sample(text: str, name: str, **labels: str) -> float | None:
    """One sample's value, matching the given labels (others may be present)."""
    for key, value in parse_samples(text).items():
        metric, _, rest = key.partition("{")
        if metric != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', rest))
        if all(found.get(k) == v for k, v in labels.items()):
            return value
    return None


def wait_for(condition, timeout: float = 10.0, interval: float = 0.02):
    """Poll until ``condition()`` is truthy; returns its value or fails with the last one."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s (last: {value!r})")
        time.sleep(interval)
