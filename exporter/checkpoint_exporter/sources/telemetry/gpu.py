"""GPUs through NVML (nvidia-ml-py's ``pynvml``): utilisation, memory used, PCIe byte counters.

No NVML library, no driver, a lost GPU, a call a device does not support: each is "no data",
logged once, never a crash. Initialisation is retried every RETRY_INIT_SECONDS (10 s) while it
fails, so a driver loaded after the exporter started is picked up; a GPU that falls off the bus
stops reporting and is logged once; when every GPU fails, NVML is shut down and initialised afresh
on the same period. Shutting NVML down on exit waits a bounded time: a shutdown that hangs in a
wedged driver is left behind, so the exporter still exits within its SIGTERM budget.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from checkpoint_exporter.errors import NoDataError
from checkpoint_exporter.sources.telemetry.base import Sample

log = logging.getLogger(__name__)

RETRY_INIT_SECONDS = 10.0  # between nvmlInit attempts (a failing one costs a millisecond)
_PCIE_FIELDS = (("pcie_tx_bytes", 197), ("pcie_rx_bytes", 198))  # NVML_FI_DEV_PCIE_COUNT_*


class GpuSource:
    name = "gpu"

    def __init__(self, required: bool = False):
        self.required = required  # telemetry.gpu: on (an absent NVML is an error, not a shrug)
        self._nvml: Any = None
        self._handles: list[tuple[str, Any]] = []
        self._next_init = 0.0
        self._unsupported: set[tuple[str, str]] = set()
        self._lost: set[str] = set()
        self._logged: set[str] = set()

    def _once(self, key: str, message: str, *args: object, level: int | None = None) -> None:
        """Log a condition the first time it is seen; absent NVML is news only if required."""
        if key not in self._logged:
            self._logged.add(key)
            default = logging.ERROR if self.required else logging.INFO
            log.log(level if level is not None else default, message, *args)

    def _init(self) -> None:
        now = time.monotonic()
        if self._handles or now < self._next_init:
            return
        self._next_init = now + RETRY_INIT_SECONDS
        try:
            import pynvml
        except ImportError:
            self._once("import", "GPU telemetry off: nvidia-ml-py (pynvml) is not installed")
            return
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            handles = [(str(i), pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        except pynvml.NVMLError as error:
            self._once(f"init:{type(error).__name__}", "GPU telemetry off: %s", error)
            return
        self._nvml, self._handles, self._lost = pynvml, handles, set()
        log.info("GPU telemetry on: %d GPUs", len(handles))

    def sample(self) -> Sample:
        self._init()
        if not self._handles:
            raise NoDataError("NVML unavailable")
        nvml = self._nvml
        out: Sample = {}
        failed: list[str] = []
        for index, handle in self._handles:
            if index in self._lost:
                continue
            try:
                out.update(self._device(nvml, index, handle))
            except nvml.NVMLError_GpuIsLost:
                self._lost.add(index)
                self._once(
                    f"lost:{index}", "GPU %s is lost: no more telemetry from it", index,
                    level=logging.WARNING,
                )  # fmt: skip
            except nvml.NVMLError as error:
                failed.append(f"GPU {index}: {error}")
                self._once(f"error:{index}:{type(error).__name__}", "GPU %s: %s", index, error)
        if not out and (failed or len(self._lost) == len(self._handles)):
            # Every GPU gone or failing: the driver was unloaded or reset under us. Handles from
            # the old session are worthless; initialise NVML afresh later.
            self._restart("; ".join(failed) or "every GPU is lost")
        if not out:
            raise NoDataError("no GPU answered")
        return out

    def _restart(self, reason: str) -> None:
        log.warning("GPU telemetry lost (%s); retrying every %.0f s", reason, RETRY_INIT_SECONDS)
        if self._nvml is not None:
            _shutdown(self._nvml)
        self._nvml, self._handles, self._lost = None, [], set()
        self._logged = {key for key in self._logged if not key.startswith(("init:", "error:"))}
        self._next_init = time.monotonic() + RETRY_INIT_SECONDS

    def _device(self, nvml: Any, index: str, handle: Any) -> Sample:
        out: Sample = {}
        for field, call in (
            ("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0),
            ("memory_used_bytes", lambda: float(nvml.nvmlDeviceGetMemoryInfo(handle).used)),
        ):
            if (index, field) in self._unsupported:
                continue
            try:
                out[(index, field)] = call()
            except nvml.NVMLError_NotSupported:
                self._unsupported.add((index, field))
        if (index, "pcie") not in self._unsupported:
            try:
                values = nvml.nvmlDeviceGetFieldValues(handle, [fid for _, fid in _PCIE_FIELDS])
            except nvml.NVMLError_NotSupported:
                self._unsupported.add((index, "pcie"))
            else:
                for (field, _), value in zip(_PCIE_FIELDS, values, strict=True):
                    if value.nvmlReturn == nvml.NVML_SUCCESS:
                        out[(index, field)] = float(value.value.ullVal)
        return out

    def close(self, timeout: float = 0.5) -> None:
        """Shut NVML down, waiting at most ``timeout``: a shutdown that hangs in the driver is
        left on a daemon thread, so the process still exits."""
        nvml, self._nvml, self._handles = self._nvml, None, []
        if nvml is None:
            return
        shutdown = threading.Thread(
            target=_shutdown, args=(nvml,), name="nvml shutdown", daemon=True
        )
        shutdown.start()
        shutdown.join(timeout)
        if shutdown.is_alive():
            log.warning("NVML shutdown has not returned in %.1f s; exiting without it", timeout)


def _shutdown(nvml: Any) -> None:
    with contextlib.suppress(nvml.NVMLError):
        nvml.nvmlShutdown()
