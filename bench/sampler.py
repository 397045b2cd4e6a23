"""sampler: the CPU the telemetry sampler costs at 1 Hz on a big node.

A fixture node as node_exporter's tests fake hardware: procfs and sysfs trees with 8 Ethernet
NICs, 4 InfiniBand ports and the checkpoint disk, and the fake pynvml (tests/fakes) answering for
8 GPUs. The exporter's own sources and Sampler take ``SAMPLES`` samples back to back; the CPU per
sample times 3,600 is the CPU per hour at 1 Hz. The fake NVML parses its state once
(FAKE_NVML_STATIC) and then answers from memory, so this measures the exporter's side of each
call; a real NVML call goes to the driver (tens of microseconds each, 32 per sample here).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

from checkpoint_exporter.sources.telemetry.disk import DiskSource
from checkpoint_exporter.sources.telemetry.gpu import GpuSource
from checkpoint_exporter.sources.telemetry.infiniband import InfinibandSource
from checkpoint_exporter.sources.telemetry.net import NetSource
from checkpoint_exporter.sources.telemetry.sampler import Sampler

REPO = Path(__file__).resolve().parent.parent
NICS, IB_PORTS, GPUS = 8, 4, 8


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def build_node(root: Path) -> tuple[Path, Path]:
    """procfs and sysfs of the node; returns (procfs, sysfs)."""
    procfs, sysfs = root / "proc", root / "sys"
    header = (
        "Inter-|   Receive  |  Transmit\n face |bytes    packets errs drop fifo frame "
        "compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
    )
    lines = [f"  eth{i}: {10**12 + i} 10 0 0 0 0 0 0 {2 * 10**12 + i} 20 0 0 0 0 0 0"
             for i in range(NICS)]  # fmt: skip
    lines.append("    lo: 1000 10 0 0 0 0 0 0 1000 10 0 0 0 0 0 0")
    _write(procfs / "net/dev", header + "\n".join(lines) + "\n")
    for i in range(NICS):
        _write(sysfs / f"class/net/eth{i}/speed", "200000\n")
        _write(sysfs / f"class/net/eth{i}/type", "1\n")
    for i in range(IB_PORTS):
        port = sysfs / f"class/infiniband/mlx5_{i}/ports/1"
        _write(port / "rate", "400 Gb/sec (4X NDR)\n")
        _write(port / "counters_ext/port_xmit_data_64", f"{10**13 + i}\n")
        _write(port / "counters_ext/port_rcv_data_64", f"{2 * 10**13 + i}\n")
    _write(procfs / "diskstats", " 259 0 nvme0n1 100 0 800 10 50 0 123456789 20 0 30 40 0 0 0 0\n")
    return procfs, sysfs


def _fake_nvml(root: Path) -> None:
    state = root / "nvml.json"
    gpus = [{"util": 40 + i, "memory_used": 10**10, "pcie": [10**12, 2 * 10**12]}
            for i in range(GPUS)]  # fmt: skip
    state.write_text(__import__("json").dumps({"init": "ok", "gpus": gpus}))
    os.environ["FAKE_NVML_STATE"], os.environ["FAKE_NVML_STATIC"] = str(state), "1"
    spec = importlib.util.spec_from_file_location("pynvml", REPO / "tests/fakes/pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pynvml"] = module
    spec.loader.exec_module(module)


def bench_sampler(samples: int = 3000) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="checkpoint-exporter-sampler-") as tmp:
        root = Path(tmp)
        procfs, sysfs = build_node(root)
        _fake_nvml(root)
        disk = DiskSource(procfs)
        disk.devices = {"nvme0n1"}
        gpu = GpuSource(required=True)
        sources = [NetSource(procfs, sysfs, ".*", skip_ipoib=True), InfinibandSource(sysfs),
                   disk, gpu]  # fmt: skip
        sampler = Sampler(sources, interval=1.0, retention=3600)
        sampler.sample_once()
        assert all(sampler.available.values()), f"a source had no data: {sampler.errors}"
        series = len(sampler.rings)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(samples):
            sampler.sample_once()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        gpu.close()
    per_sample = cpu / samples
    return {
        "nics": NICS, "ib_ports": IB_PORTS, "gpus": GPUS, "series_sampled": series,
        "samples": samples, "cpu_ms_per_sample": per_sample * 1000,
        "wall_ms_per_sample": wall / samples * 1000,
        "cpu_seconds_per_hour_at_1hz": per_sample * 3600,
        "core_percent_at_1hz": per_sample * 100,
    }  # fmt: skip


def report(row: dict[str, object]) -> str:
    return (
        f"{row['nics']} NICs, {row['ib_ports']} IB ports, {row['gpus']} GPUs "
        f"({row['series_sampled']} counters): {row['cpu_ms_per_sample']:.3f} ms CPU per sample, "
        f"{row['cpu_seconds_per_hour_at_1hz']:.2f} CPU s/h at 1 Hz = "
        f"{row['core_percent_at_1hz']:.3f}% of a core"
    )


if __name__ == "__main__":
    print(report(bench_sampler()))
