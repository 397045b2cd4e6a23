"""A fake ``pynvml`` at the module boundary: the real nvidia-ml-py module's constants, structures
and error classes, with the device calls answered from a JSON state file
(``$FAKE_NVML_STATE``, re-read on every call so a test can change a GPU mid-run)::

    {"init": "ok" | "library_not_found" | "driver_not_loaded",  # not ok: device calls fail too
     "gpus": [{"util": 40, "memory_used": 1024, "pcie": [tx_bytes, rx_bytes] | "not_supported",
               "lost": false}]}

Put this directory first on PYTHONPATH (or in sys.modules) to stand in for the library on a
machine without GPUs. Errors are raised as the library raises them: NVMLError(code), which the
library maps to its own subclasses (NVMLError_LibraryNotFound, NVMLError_GpuIsLost, ...; note
GpuIsLost, not the GPUIsLost of some documentation).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
_spec = importlib.machinery.PathFinder.find_spec(
    "pynvml", [p for p in sys.path if Path(p or ".").resolve() != Path(_HERE)]
)
assert _spec is not None and _spec.origin is not None, "nvidia-ml-py must be installed"
# The real module, under its own name, so its error classes are generated on itself.
_real_spec = importlib.util.spec_from_file_location("_pynvml_real", _spec.origin)
assert _real_spec is not None and _real_spec.loader is not None
_real = importlib.util.module_from_spec(_real_spec)
sys.modules["_pynvml_real"] = _real
_real_spec.loader.exec_module(_real)
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})


_parsed: dict[tuple[str, int, int, int], dict] = {}  # FAKE_NVML_STATIC: the one parse


def _state() -> dict:
    """The state file, re-read on every call; with ``FAKE_NVML_STATIC=1`` (the sampler
    benchmark, which should measure the exporter rather than this fake) read once."""
    path = os.environ.get("FAKE_NVML_STATE")
    if not path:
        return {"init": "library_not_found", "gpus": []}
    if os.environ.get("FAKE_NVML_STATIC") != "1":
        return json.loads(Path(path).read_text())
    info = os.stat(path)
    key = (path, info.st_ino, info.st_mtime_ns, info.st_size)
    if key not in _parsed:
        _parsed.clear()
        _parsed[key] = json.loads(Path(path).read_text())
    return _parsed[key]


def _gpu(handle: int) -> dict:
    state = _state()
    if state.get("init", "ok") != "ok":  # the driver went away under a running process
        raise _real.NVMLError(_real.NVML_ERROR_UNKNOWN)
    gpus = state.get("gpus", [])
    if handle >= len(gpus) or gpus[handle].get("lost"):
        raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)
    return gpus[handle]


def nvmlInit() -> None:
    mode = _state().get("init", "ok")
    if mode == "library_not_found":
        raise _real.NVMLError(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
    if mode == "driver_not_loaded":
        raise _real.NVMLError(_real.NVML_ERROR_DRIVER_NOT_LOADED)


def nvmlShutdown() -> None:
    return None


def nvmlDeviceGetCount() -> int:
    return len(_state().get("gpus", []))


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    return index


def nvmlDeviceGetUtilizationRates(handle: int):
    gpu = _gpu(handle)
    if gpu.get("util") == "not_supported":
        raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
    result = _real.c_nvmlUtilization_t()
    result.gpu, result.memory = int(gpu.get("util", 0)), 0
    return result


def nvmlDeviceGetMemoryInfo(handle: int, version=None):
    result = _real.c_nvmlMemory_t()
    result.used = int(_gpu(handle).get("memory_used", 0))
    return result


def nvmlDeviceGetFieldValues(handle: int, field_ids: list[int]):
    gpu = _gpu(handle)
    pcie = gpu.get("pcie", "not_supported")
    if pcie == "not_supported":
        raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
    values = (_real.c_nvmlFieldValue_t * len(field_ids))()
    known = {
        _real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: pcie[0],
        _real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: pcie[1],
    }
    for slot, field_id in zip(values, field_ids, strict=True):
        slot.fieldId = field_id
        if field_id in known:
            slot.nvmlReturn = _real.NVML_SUCCESS
            slot.valueType = _real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            slot.value.ullVal = int(known[field_id])
        else:
            slot.nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
    return values
