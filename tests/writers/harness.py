"""The writers tier: a real checkpoint library saving under a running exporter.

A driver (tests/writers/drivers/NAME_writer.py) runs in the writers' virtualenv (.venv-writers/,
built by scripts/ensure-writers) and takes one command per line on stdin:

- ``save``: one training step or a few, then one real save through the library; prints
  ``{"event": "saved", "step": N, "path": "<generation on disk>"}`` once the library returned
  (and, for asynchronous writers, once the save finished).
- ``hang``: starts a save and stops it half-way through writing its data (bytes on disk, the
  library's commit not reached); prints ``{"event": "hanging", "step": N, "path": ...}`` and
  waits there to be SIGKILLed.
- ``quit``: exits.

Every other line it prints is ignored. The test owns the truth: what the library reported and what
is on disk (``disk_bytes``), never what the exporter's layouts think.

Drivers are named ``<writer>_writer.py``: a script named like its library would shadow it (the
script's folder comes first on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO, Exporter, parse_samples, write_config

DRIVERS = Path(__file__).resolve().parent / "drivers"

# Which runs run on every change (`make test`) and which nightly (`make test-nightly`): every
# writer's scenarios run on every change in one watch mode, the other mode nightly. The watch
# modes alternate between writers, so every change drives both the inotify and the poll path
# against real writers; each writer's second mode reads the same commits through the other
# path, which the suite's own watch tests cover for every layout.
NIGHTLY = pytest.mark.nightly
INOTIFY_EVERY_CHANGE = ["inotify", pytest.param("poll", marks=NIGHTLY)]
POLL_EVERY_CHANGE = [pytest.param("inotify", marks=NIGHTLY), "poll"]
VENVS = Path(os.environ.get("WRITERS_VENVS", REPO / ".venv-writers"))


def writer_python(venv: str) -> str:
    """The interpreter of a writers' virtualenv; its absence is a set-up error, never a skip."""
    python = VENVS / venv / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: run `make test` (scripts/ensure-writers) first")
    return str(python)


class Driver:
    """One driver process in its own process group, its JSON lines on a queue."""

    def __init__(self, name: str, venv: str, root: Path | str, *args: str, env: dict | None = None):
        self.name = name
        self.stderr: list[str] = []
        self.process = subprocess.Popen(
            [writer_python(venv), str(DRIVERS / f"{name}_writer.py"), str(root), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={
                **os.environ,
                "DS_ACCELERATOR": "cpu",
                "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1",
                "OMP_NUM_THREADS": "1",
                **(env or {}),
            },
        )
        self.lines: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._pump_out, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump_out(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                try:
                    self.lines.put(json.loads(line))
                except ValueError:
                    continue

    def _pump_err(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr.append(line)
            del self.stderr[:-200]

    def command(self, verb: str, expect: str, timeout: float = 150) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(verb + "\n")
        self.process.stdin.flush()
        return self.wait_for(expect, f"after {verb!r} ", timeout)

    def wait_for(self, event: str, after: str = "", timeout: float = 150) -> dict:
        """The driver's next line of ``event`` (lines of other events are dropped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            if line.get("event") == event:
                return line
        raise AssertionError(
            f"{self.name} driver: no {event!r} {after}within {timeout} s "
            f"(exit {self.process.poll()}):\n" + "".join(self.stderr[-60:])
        )

    def save(self, timeout: float = 150) -> dict:
        return self.command("save", "saved", timeout)

    def hang(self, timeout: float = 150) -> dict:
        return self.command("hang", "hanging", timeout)

    def kill(self) -> None:
        """SIGKILL the driver's whole session, as a node failure would: its process group, and
        the processes a library moved into groups of their own (Ray's workers call setpgid;
        they stay in the driver's session, which ``start_new_session`` made its own)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        kill_session(self.process.pid)  # the driver leads its session
        self.process.wait(timeout=30)

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(AssertionError, OSError):
                self.command("quit", "bye", timeout=5)
        self.kill()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream:
                with contextlib.suppress(OSError):
                    stream.close()


def session_members(session: int) -> list[int]:
    """The live processes whose session id is ``session`` (zombies are dead already: their
    reaper may be a PID 1 that never reaps)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stream:
                stat_line = stream.read()
        except OSError:
            continue  # exited meanwhile
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
        fields = stat_line[stat_line.rfind(b")") + 2 :].split()
        if int(fields[3]) == session and fields[0] not in (b"Z", b"X"):
            members.append(int(entry))
    return members


def kill_session(session: int, timeout: float = 30.0) -> None:
    """SIGKILL every process of ``session`` until none is left (a dying parent may still fork)."""
    deadline = time.monotonic() + timeout
    while members := session_members(session):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of session {session} outlived SIGKILL: {members}")
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def disk_bytes(path: str | Path) -> int:
    """Bytes of the regular files at or below ``path`` (symlinks not followed)."""
    status = os.lstat(path)
    if stat.S_ISREG(status.st_mode):
        return status.st_size
    if stat.S_ISLNK(status.st_mode):
        return 0
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            entry = os.lstat(os.path.join(directory, name))
            if stat.S_ISREG(entry.st_mode):
                total += entry.st_size
    return total


@dataclass(frozen=True)
class Truth:
    """Where the test reads what the writer left: the disk, or (tests/writers/test_dcp_s3.py)
    the object store."""

    bytes_of: Callable[[str], int] = disk_bytes
    exists: Callable[[str], bool] = os.path.lexists


DISK = Truth()


@dataclass
class Expected:
    """What the exporter must say about the job; None leaves a figure unchecked."""

    step: int | None = None
    retained: int | None = None
    newest_path: str | None = None  # the generation whose bytes the exporter must report
    valid: int | None = 1
    committed: int | None = None  # checkpoint_saves_committed_total
    aborted: int | None = 0
    in_progress: int | None = 0
    layout: str | None = None
    extra: dict[str, float] = field(default_factory=dict)  # other per-job families' values


JOB = "w"


class Watched:
    """A real exporter watching one writer's directory as job ``w``."""

    def __init__(
        self,
        root: Path | str,
        config_dir: Path,
        watch: str = "inotify",
        deadline: str = "10s",
        settle: str = "2s",
        layout: str = "auto",
        extra: str = "",
        env: dict[str, str] | None = None,
        truth: Truth = DISK,
    ):
        self.root = root
        self.truth = truth
        poll = "poll_interval: 1s, " if watch == "poll" else ""
        config = write_config(
            config_dir,
            f"""
defaults: {{interval: 1m, deadline: {deadline}, abort_after: {deadline}, settle: {settle},
           {poll}watch: {watch}}}
jobs:
  - {{name: {JOB}, path: {root}, layout: {layout}{extra}}}
""",
        )
        self.exporter = Exporter("--config.file", str(config), env=env)

    def figures(self, extra: Collection[str] = ()) -> dict[str, float | str | None]:
        samples = parse_samples(self.exporter.metrics())
        label = f'training_job="{JOB}"'

        def one(name: str) -> float | None:
            for key, value in samples.items():
                metric, _, rest = key.partition("{")
                if metric == name and label in rest and "phase=" not in rest:
                    return value
            return None

        layout = next(
            (
                key.split('layout="', 1)[1].split('"', 1)[0]
                for key in samples
                if key.startswith("checkpoint_job_info{") and label in key
            ),
            None,
        )
        return {
            "step": one("checkpoint_last_committed_step"),
            "retained": one("checkpoint_retained_generations"),
            "bytes": one("checkpoint_last_committed_size_bytes"),
            "valid": one("checkpoint_last_committed_valid"),
            "committed": one("checkpoint_saves_committed_total"),
            "aborted": one("checkpoint_saves_aborted_total"),
            "in_progress": one("checkpoint_saves_in_progress"),
            "layout": layout,
            **{name: one(name) for name in extra},
        }

    def mismatches(self, want: Expected) -> list[str]:
        got = self.figures(want.extra)
        wrong = []
        checks: dict[str, object] = {
            "step": want.step,
            "retained": want.retained,
            "valid": want.valid,
            "committed": want.committed,
            "aborted": want.aborted,
            "in_progress": want.in_progress,
            "layout": want.layout,
            **want.extra,
        }
        for key, value in checks.items():
            if value is not None and got[key] != value:
                wrong.append(f"{key}: exporter {got[key]!r}, truth {value!r}")
        if want.newest_path is not None:
            truth = self.truth.bytes_of(want.newest_path)
            exported = got["bytes"]
            if exported is None or abs(float(exported) - truth) > 0.01 * truth:
                wrong.append(f"bytes: exporter {exported!r}, truth {truth} ({want.newest_path})")
        return wrong

    def expect(self, want: Expected, timeout: float = 10.0, hold: float = 0.0) -> float:
        """Wait until every figure equals the truth; then, for ``hold`` seconds, insist that they
        stay equal (no false abort after the deadline, no blink). Returns the wait."""
        started = time.monotonic()
        deadline = started + timeout
        wrong = self.mismatches(want)
        while wrong and time.monotonic() < deadline:
            time.sleep(0.05)
            wrong = self.mismatches(want)
        waited = time.monotonic() - started
        if wrong:
            raise AssertionError(
                f"after {waited:.1f} s the exporter disagrees with the disk:\n  "
                + "\n  ".join(wrong)
                + "\n--- exporter log (tail) ---\n"
                + "".join(self.exporter.drain_log()[-40:])
            )
        end = time.monotonic() + hold
        while time.monotonic() < end:
            wrong = self.mismatches(want)
            if wrong:
                raise AssertionError(
                    "the exporter drifted from the truth while nothing was written:\n  "
                    + "\n  ".join(wrong)
                    + "\n--- exporter log (tail) ---\n"
                    + "".join(self.exporter.drain_log()[-40:])
                )
            time.sleep(0.1)
        return waited

    def log_lines(self, needle: str) -> list[str]:
        return [line for line in self.exporter.drain_log() if needle in line]

    def close(self) -> None:
        self.exporter.close()


def retained(paths: list[str], exists: Callable[[str], bool] = os.path.lexists) -> int:
    """How many of the generations a writer reported are still on disk (its own retention); a
    generation saved again in place counts once."""
    return sum(1 for path in set(paths) if exists(path))


@dataclass
class Scenario:
    """The tier's common run: ``saves`` good saves under the writer's own retention, figures
    checked after each; a quiet spell past the deadline (no false abort); then one save killed
    half-way, which must count as exactly one abort with the previous generation kept, once
    nothing moved for abort_after (set to the deadline here, so the tier waits seconds)."""

    driver: Driver
    watched: Watched
    saves: int = 4
    deadline: float = 10.0
    settle: float = 2.0
    layout: str | None = None
    # Whether the exporter can know the step: False where the writer keeps it only inside a
    # file the exporter does not read.
    steps_known: bool = True
    latencies: list[float] = field(default_factory=list)

    def run(self, kill: bool = True) -> list[dict]:
        reported: list[dict] = []
        for count in range(1, self.saves + 1):
            line = self.driver.save()
            reported.append(line)
            want = Expected(
                step=line["step"] if self.steps_known else None,
                retained=retained([r["path"] for r in reported], self.watched.truth.exists),
                newest_path=line["path"],
                committed=count,
                layout=self.layout,
            )
            # Detection is quick (inotify, or a poll); a marker-less generation also waits out
            # its settle period; validation reads a few headers.
            self.latencies.append(self.watched.expect(want, timeout=self.settle + 20))
        newest = reported[-1]
        final = Expected(
            step=newest["step"] if self.steps_known else None,
            retained=retained([r["path"] for r in reported], self.watched.truth.exists),
            newest_path=newest["path"],
            committed=self.saves,
            layout=self.layout,
        )
        # Past the deadline and the settle period with nothing written: nothing may change.
        self.watched.expect(final, hold=self.deadline + self.settle + 2)
        if kill:
            hung = self.driver.hang()
            self.driver.kill()
            final.aborted = 1
            final.retained = retained([r["path"] for r in reported], self.watched.truth.exists)
            self.watched.expect(final, timeout=self.deadline + self.settle + 20)
            aborted = self.watched.log_lines("aborted")
            assert aborted, "an aborted save logs a warning"
            assert any(f"job={JOB}" in line for line in aborted), aborted
            reported.append(hung)
        print(f"{self.driver.name}: save-to-metrics waits {[round(x, 2) for x in self.latencies]}")
        return reported


@contextlib.contextmanager
def watching(
    tmp_path: Path, writer: str, venv: str, *driver_args: str, job: str = "job", **watched: str
) -> Iterator[tuple[Path, Driver, Watched]]:
    """A fresh job directory, a real exporter watching it (``watched``: Watched's options) and
    the writer's driver saving into it; both stopped on the way out."""
    root = tmp_path / job
    root.mkdir()
    exporter = Watched(root, tmp_path, **watched)
    try:
        driver = Driver(writer, venv, root, *driver_args)
        try:
            yield root, driver, exporter
        finally:
            driver.close()
    finally:
        exporter.close()
