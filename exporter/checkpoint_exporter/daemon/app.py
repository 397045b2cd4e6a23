"""The daemon put together: the tracker, node telemetry, the scanner and the metrics server built
from one configuration, started port first, stopped on SIGTERM or SIGINT, and reloaded on SIGHUP.

The CLI resolves the flags and the config file into a Config and hands it here with how to read
it again (``reread``); everything from there on is the daemon's.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from checkpoint_exporter.config import Config, ConfigError

# The process's exit status: 0 stopped on a signal, 1 it could not start (the port).
EXIT_OK, EXIT_FAILURE = 0, 1

# The logger serve has always logged under (logs.py prints its name, less this prefix).
log = logging.getLogger("checkpoint_exporter")

WAKE_BACKSTOP_SECONDS = 5.0  # the main thread looks at the signal flags at least this often
# Once the first pass is done (or after this long in any case) the heap built at start-up is
# frozen out of the collector's reach.
FREEZE_AFTER_SECONDS = 600.0


class Signals:
    """SIGTERM / SIGINT stop, SIGHUP reloads the configuration. The handler only records the
    signal and wakes the main thread through a pipe: a handler must take no lock (it runs
    between two bytecodes of the main thread, which may hold that very lock), and a write to a
    pipe takes none. The main thread sleeps on the pipe rather than waking ten times a second
    to look (2 to 3 CPU seconds an hour of an idle exporter)."""

    def __init__(self) -> None:
        self.stop: int | None = None
        self.reloads = 0
        self._woken, self._wake = os.pipe()
        os.set_blocking(self._wake, False)
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGHUP, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            self.reloads += 1
        else:
            self.stop = signum
        # After the flag: the main thread wakes to find it set (a full pipe wakes it as well).
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake, b"\0")

    def wait(self, handled_reloads: int) -> str:
        """Returns "stop", or "reload" once more SIGHUPs came than ``handled_reloads``."""
        while self.stop is None and self.reloads == handled_reloads:
            # The handler runs on this thread, here or between two bytecodes before: either way
            # its byte is in the pipe by the time this looks. The timeout is a backstop only.
            readable, _, _ = select.select([self._woken], [], [], WAKE_BACKSTOP_SECONDS)
            if readable:
                os.read(self._woken, 512)
        return "stop" if self.stop is not None else "reload"


def freeze_when_ready(readiness: Callable[[], str | None], stop: threading.Event) -> None:
    """Move what start-up built (every job's tracker, its listings, the config) out of the cyclic
    collector's reach once the first pass is done: a full collection walks the whole heap, so
    at 1,000 jobs each cost about 80 ms and came every few minutes of an idle exporter, a cost
    that grew with the jobs. Objects made later are collected as before; a frozen one that
    becomes cyclic garbage stays (bounded by the start-up heap), freed ones are freed as ever."""
    deadline = time.monotonic() + FREEZE_AFTER_SECONDS
    while readiness() is not None and time.monotonic() < deadline:
        if stop.wait(1.0):
            return
    gc.collect()  # the start-up's garbage is not frozen with it
    gc.freeze()


def reload_config(reread: Callable[[], Config], scanner: Any) -> None:
    """Read the file again as at start (``reread``: same loader, same flag overrides); a bad
    file is logged and the running configuration kept."""
    try:
        config = reread()
    except ConfigError as error:
        for problem in getattr(error, "problems", []) or [error]:
            log.error("configuration reload failed, keeping the running one: %s", problem)
        scanner.reload_failed()
        return
    except (OSError, ValueError) as error:
        log.error("configuration reload failed, keeping the running one: %s", error)
        scanner.reload_failed()
        return
    log.info("reloading configuration from %s", config.source or "defaults")
    scanner.reload(config)


class App:
    """One serve process. ``security``: the web config (TLS, basic auth) or None;
    ``collectors``: the --collector.<name> choices stated; ``runtime_metrics``: the process_*
    and python_* metrics; ``reread``: the configuration read again, for SIGHUP."""

    def __init__(
        self,
        config: Config,
        *,
        security: Any,
        collectors: dict[str, bool],
        runtime_metrics: bool,
        reread: Callable[[], Config],
    ) -> None:
        self.config = config
        self.security = security
        self.collectors = collectors
        self.runtime_metrics = runtime_metrics
        self.reread = reread

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT; the exit status."""
        from checkpoint_exporter.core.jobs import Tracker
        from checkpoint_exporter.daemon.scanner import Scanner
        from checkpoint_exporter.exposition.collectors import enabled_collectors
        from checkpoint_exporter.exposition.renderer import Renderer, runtime_registry
        from checkpoint_exporter.exposition.server import MetricsServer
        from checkpoint_exporter.sources.telemetry.node import NodeTelemetry

        config = self.config
        tracker = Tracker(config)
        telemetry = NodeTelemetry(config)
        # Builds no tree and touches no watched path: every read runs behind the open port.
        scanner = Scanner(config, tracker, telemetry=telemetry)

        def snapshot() -> Any:
            return tracker.snapshot

        runtime = runtime_registry() if self.runtime_metrics else None
        renderer = Renderer(snapshot, enabled_collectors(self.collectors), runtime)
        try:
            server = MetricsServer(
                config.web,
                renderer,
                self.security,
                liveness=scanner.liveness,
                readiness=scanner.readiness,
            )
        except OSError as error:
            log.error("cannot listen on %s: %s", config.web.listen_address, error.strerror or error)
            return EXIT_FAILURE
        signals = Signals()
        server.start()
        log.info(
            "listening: address=%s url=%s jobs=%d config=%s",
            server.address,
            server.url,
            len(config.jobs),
            config.source or "none",
        )
        if not config.serving.default:
            log.info("serving: scope=%s shard=%d/%d", config.serving.scope_label,
                     config.serving.shard, config.serving.shards)  # fmt: skip
        scanner.start()
        telemetry.start()
        stopping = threading.Event()
        threading.Thread(
            target=freeze_when_ready, args=(scanner.readiness, stopping), name="gc-freeze",
            daemon=True,
        ).start()  # fmt: skip
        handled, reloading = 0, None
        while signals.wait(handled) == "reload":
            if reloading is not None and reloading.is_alive():
                time.sleep(0.1)  # one reload at a time; SIGHUPs meanwhile make one more
                continue
            handled = signals.reloads
            # Off the main thread: loading checks the jobs' directories, and a stat on a hung
            # mount must not keep this thread from answering SIGTERM.
            reloading = threading.Thread(
                target=reload_config, args=(self.reread, scanner), name="reload", daemon=True
            )
            reloading.start()
        assert signals.stop is not None
        log.info("stopping on %s", signal.Signals(signals.stop).name)
        stopping.set()
        server.stop()
        scanner.stop()
        telemetry.stop()
        return EXIT_OK
