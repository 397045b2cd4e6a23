"""Node telemetry: sources over fixture sysfs/procfs trees, NVML through a fake pynvml with the
library's own error classes, window arithmetic, and the whole chain through a real exporter."""

from __future__ import annotations

import ctypes
import importlib.util
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from checkpoint_exporter import instrument
from checkpoint_exporter.config import Config, PathsConfig, TelemetryConfig
from checkpoint_exporter.exposition.metrics import NoDataError
from checkpoint_exporter.sources.telemetry import gpu as gpu_module
from checkpoint_exporter.sources.telemetry.correlate import counter_delta, gauge_mean, peak_rate
from checkpoint_exporter.sources.telemetry.disk import DiskSource, parse_diskstats, resolve
from checkpoint_exporter.sources.telemetry.gpu import GpuSource
from checkpoint_exporter.sources.telemetry.infiniband import InfinibandSource
from checkpoint_exporter.sources.telemetry.net import NetSource, parse_net_dev
from checkpoint_exporter.sources.telemetry.node import NodeTelemetry
from checkpoint_exporter.sources.telemetry.ring import Ring
from checkpoint_exporter.sources.telemetry.sampler import Sampler
from checkpoint_exporter.sources.watch import Mount
from tests.conftest import REPO, Exporter, sample, wait_for, write_config
from tests.helpers.node import NET_DEV_HEADER, FakeNode
from tests.helpers.trees import dcp_generation

pytestmark = [pytest.mark.root]

FAKES = REPO / "tests" / "fakes"
MB = 1e6
TMPFS_BYTES = 64 << 20


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    mountpoint = tmp_path / "ckpt"
    mountpoint.mkdir()
    return FakeNode(tmp_path / "node", mountpoint).build()


@pytest.fixture
def private_disk(node: FakeNode) -> Iterator[Path]:
    """The fixture node's mountpoint on a tmpfs of a known size, which only the test writes to:
    its capacity is not what other processes on the machine happen to do to a shared disk."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    libc = ctypes.CDLL(None, use_errno=True)
    mountpoint = str(node.mountpoint).encode()
    if libc.mount(b"tmpfs", mountpoint, b"tmpfs", 0, f"size={TMPFS_BYTES}".encode()):
        raise OSError(ctypes.get_errno(), "mount tmpfs")
    try:
        yield node.mountpoint
    finally:
        libc.umount2(mountpoint, 2)  # MNT_DETACH


# --- window arithmetic ---------------------------------------------------------------------


def test_counter_delta_interpolates_and_survives_resets() -> None:
    series = ([0.0, 1.0, 2.0, 3.0], [0.0, 100.0, 200.0, 50.0])  # reset between 2 and 3
    assert counter_delta(series, 0.5, 1.5) == pytest.approx(100)
    assert counter_delta(series, 0.0, 3.0) == pytest.approx(250)  # 100 + 100 + 50 after reset
    assert counter_delta(series, 10, 11) is None  # no sample near: no value, not zero
    assert peak_rate(series, 0, 3) == pytest.approx(100)


def test_gauge_mean_is_time_weighted() -> None:
    series = ([0.0, 1.0, 2.0], [0.0, 1.0, 1.0])
    assert gauge_mean(series, 0.0, 2.0) == pytest.approx(0.75)
    assert gauge_mean(series, 0.5, 0.5) == pytest.approx(0.5)  # an instant
    assert gauge_mean(series, 5.0, 6.0) is None


def test_ring_memory_is_fixed() -> None:
    ring = Ring(5)
    for i in range(1000):
        ring.append(float(i), float(i))
    assert len(ring) == 5
    assert ring.samples(0, 10_000) == ([995.0, 996.0, 997.0, 998.0, 999.0],) * 2


# --- sources over fixture trees --------------------------------------------------------------


def test_network_devices_bond_and_ipoib(node: FakeNode) -> None:
    source = NetSource(node.procfs, node.sysfs, "^(eth|en|ib|mlx|bond)", skip_ipoib=True)
    values = source.sample()
    assert sorted({device for device, _ in values}) == ["bond0", "eth0"]  # eth1 is bond0's
    assert values[("bond0", "tx_bytes")] == 1_000_000
    assert source.speed_bits("eth0") == 25e9 and source.speed_bits("lo") is None
    with_ipoib = NetSource(node.procfs, node.sysfs, "^(eth|ib|bond)", skip_ipoib=False)
    assert "ib0" in {device for device, _ in with_ipoib.sample()}
    with pytest.raises(NoDataError):
        NetSource(node.procfs, node.sysfs, "^wlan", skip_ipoib=True).sample()


def test_net_dev_parses_as_psutil_reads_it(tmp_path: Path, monkeypatch) -> None:
    """The counters psutil gave from the same file, so the metrics are unchanged."""
    kernel = NET_DEV_HEADER + (
        "    lo:    1000      10    0    0    0     0          0         0     1000      10    0"
        "    0    0     0       0          0\n"
        "  eth0:12345678901234 99 0 0 0 0 0 0 98765432109876 77 0 0 0 0 0 0\n"  # no space
        "  eth1: 5 1 0 0 0 0 0 0 6 1 0 0 0 0 0 0\n"
    )
    expected = {"lo": (1000, 1000), "eth0": (12345678901234, 98765432109876), "eth1": (5, 6)}
    assert parse_net_dev(kernel) == expected
    assert parse_net_dev(kernel + "torn line without a colon\n  eth2: 12") == expected
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "dev").write_text(kernel)
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))  # what the exporter used to do
    counters = psutil.net_io_counters(pernic=True, nowrap=False)
    assert {n: (c.bytes_recv, c.bytes_sent) for n, c in counters.items()} == expected


def test_sampling_writes_no_process_wide_global(node: FakeNode) -> None:
    before = psutil.PROCFS_PATH
    NetSource(node.procfs, node.sysfs, "^eth", skip_ipoib=True).sample()
    assert before == psutil.PROCFS_PATH  # another user of psutil in the process still sees /proc


class _Interleaving(str):
    """A device name that runs ``during`` (once) when its hash is next taken: sample() takes it
    while iterating the device set, so ``during`` runs exactly mid-iteration."""

    during: Callable[[], None] | None = None

    def __hash__(self) -> int:
        during, self.during = self.during, None
        if during is not None:
            during()
        return str.__hash__(self)


def test_a_path_placed_while_the_sampler_reads_the_device_set(
    node: FakeNode, caplog: pytest.LogCaptureFixture
) -> None:
    (node.sysfs / "dev/block/8:2").symlink_to("../../devices/pci0000:00/sda/sda2")
    paths = PathsConfig(procfs=node.procfs, sysfs=node.sysfs)
    telemetry = NodeTelemetry(Config(paths=paths, telemetry=TelemetryConfig(gpu="off")))
    watched = _Interleaving("dm-0")
    telemetry.disk.add(watched)

    def the_scanner_places_a_path_on_sda2() -> None:
        mount = Mount(str(node.mountpoint), "/dev/sda2", "ext4", "8:2")
        scanner = threading.Thread(target=telemetry.place, args=(str(node.mountpoint), mount))
        scanner.start()
        scanner.join()

    watched.during = the_scanner_places_a_path_on_sda2
    telemetry.sampler.sample_once()
    assert watched.during is None  # the scanner did run mid-iteration
    assert dict(telemetry.available())["disk"], telemetry.sampler.errors
    assert "failed" not in caplog.text  # Set changed size during iteration, before
    telemetry.sampler.sample_once()
    assert set(telemetry.sampler.series("disk", "written_bytes")) == {"dm-0", "sda2"}
    telemetry.stop()


def test_infiniband_counters_are_four_octet_units(node: FakeNode) -> None:
    source = InfinibandSource(node.sysfs)
    values = source.sample()
    assert values[("mlx5_0/1", "tx_bytes")] == 1_000_000  # port_xmit_data 250000 x 4
    assert source.speed_bits("mlx5_1/1") == 400e9
    with pytest.raises(NoDataError):
        InfinibandSource(node.root / "no-such-sysfs").sample()


def test_block_devices_behind_a_mount(node: FakeNode) -> None:
    volume = resolve(node.sysfs, "253:0")
    assert (volume.name, volume.kind, volume.disks) == ("dm-0", "dm", ("sda", "sdb"))
    assert resolve(node.sysfs, "0:53") is None  # nfs: no block device
    assert parse_diskstats("   8 2 sda2 1 0 8 1 5 0 1000 2 0 3 4")["sda2"] == 512_000
    source = DiskSource(node.procfs)
    with pytest.raises(NoDataError):
        source.sample()  # no watched path on a block device yet
    source.add("dm-0")
    assert source.sample() == {("dm-0", "written_bytes"): 1_000_000 // 512 * 512}


def test_sampled_counters_give_the_bytes_of_a_window(node: FakeNode) -> None:
    node.rates = {"bond0": 100 * MB, "mlx5_0": 200 * MB, "dm-0": 50 * MB}
    clock = [1000.0]
    net = NetSource(node.procfs, node.sysfs, "^(eth|ib|bond)", skip_ipoib=True)
    disk = DiskSource(node.procfs)
    disk.add("dm-0")
    sampler = Sampler([net, InfinibandSource(node.sysfs), disk], 1.0, 60, clock=lambda: clock[0])
    for _ in range(10):
        sampler.sample_once()
        node.advance(1.0)
        clock[0] += 1.0
    tx = {**sampler.series("network", "tx_bytes"), **sampler.series("infiniband", "tx_bytes")}
    window = (1002.5, 1006.5)
    total = sum(counter_delta(ring.samples(*window), *window) for ring in tx.values())
    assert total == pytest.approx(300 * MB * 4, rel=0.001)
    (disk_ring,) = sampler.series("disk", "written_bytes").values()
    assert counter_delta(disk_ring.samples(*window), *window) == pytest.approx(200 * MB, rel=0.001)


# --- GPUs through the fake pynvml -------------------------------------------------------------


@pytest.fixture
def fake_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("pynvml", FAKES / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    spec.loader.exec_module(module)
    state = tmp_path / "nvml.json"
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    monkeypatch.setattr(gpu_module, "RETRY_INIT_SECONDS", 0.0)

    def set_state(**kw) -> None:
        state.write_text(json.dumps(kw))

    return set_state


def test_gpus_report_utilisation_memory_and_pcie(fake_nvml) -> None:
    fake_nvml(init="ok", gpus=[
        {"util": 40, "memory_used": 8 << 30, "pcie": [1000, 2000]},
        {"util": 90, "memory_used": 1 << 30, "pcie": "not_supported"},
    ])  # fmt: skip
    source = GpuSource()
    values = source.sample()
    assert values[("0", "utilization")] == 0.40 and values[("1", "utilization")] == 0.90
    assert values[("0", "memory_used_bytes")] == 8 << 30
    assert values[("0", "pcie_tx_bytes")] == 1000 and ("1", "pcie_tx_bytes") not in values


def test_missing_library_and_driver_are_no_data_logged_once(fake_nvml, caplog) -> None:
    caplog.set_level(logging.INFO)
    source = GpuSource()
    for mode in ("library_not_found", "library_not_found", "driver_not_loaded"):
        fake_nvml(init=mode, gpus=[])
        with pytest.raises(NoDataError):
            source.sample()
    assert caplog.text.count("NVML Shared Library Not Found") == 1
    assert caplog.text.count("Driver Not Loaded") == 1
    fake_nvml(init="ok", gpus=[{"util": 10, "memory_used": 1, "pcie": [1, 1]}])
    assert source.sample()[("0", "utilization")] == 0.10  # the driver came up: picked up


def test_a_lost_gpu_stops_reporting_without_taking_the_others(fake_nvml, caplog) -> None:
    fake_nvml(init="ok", gpus=[{"util": 10, "memory_used": 1}, {"util": 20, "memory_used": 1}])
    source = GpuSource()
    assert len(source.sample()) == 4
    fake_nvml(init="ok", gpus=[{"util": 10, "memory_used": 1}, {"lost": True}])
    assert set(source.sample()) == {("0", "utilization"), ("0", "memory_used_bytes")}
    source.sample()
    assert caplog.text.count("GPU 1 is lost") == 1
    fake_nvml(init="ok", gpus=[{"lost": True}, {"lost": True}])
    with pytest.raises(NoDataError):
        source.sample()


def test_nvml_disappearing_mid_run_is_reinitialised_when_back(fake_nvml, caplog) -> None:
    gpus = [{"util": 10, "memory_used": 1}, {"util": 20, "memory_used": 1}]
    fake_nvml(init="ok", gpus=gpus)
    source = GpuSource()
    assert len(source.sample()) == 4
    fake_nvml(init="driver_not_loaded", gpus=gpus)  # device calls fail, and so would init
    for _ in range(3):
        with pytest.raises(NoDataError):
            source.sample()
    assert caplog.text.count("GPU telemetry lost") == 1
    fake_nvml(init="ok", gpus=gpus[:1])  # back, with one GPU fewer: a fresh session
    assert set(source.sample()) == {("0", "utilization"), ("0", "memory_used_bytes")}


class _Hung:
    """A telemetry source whose sample() blocks until released, like an NVML call on a wedged
    GPU or a read of a sysfs file behind a hung driver."""

    name = "hung"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def sample(self) -> dict[tuple[str, str], float]:
        self.entered.set()
        self.release.wait()
        return {}


def _stops_within(stop: Callable[[], None], seconds: float) -> bool:
    """Runs ``stop`` on a thread of its own: whether it returned within ``seconds``."""
    stopping = threading.Thread(target=stop, name="stop", daemon=True)
    stopping.start()
    stopping.join(seconds)
    return not stopping.is_alive()


def test_the_sampler_stops_at_once_with_a_source_hung_in_a_call() -> None:
    hung = _Hung()
    sampler = Sampler([hung], interval=0.05, retention=1.0)
    sampler.start()
    try:
        assert hung.entered.wait(10)
        stopped = _stops_within(sampler.stop, 2.0)  # the exporter exits within 2 s of SIGTERM
    finally:
        hung.release.set()
    assert stopped, "stop() waited for a source hung in a call"


def test_telemetry_stops_at_once_with_nvml_shutdown_hung(
    fake_nvml, node: FakeNode, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    fake_nvml(init="ok", gpus=[{"util": 10, "memory_used": 1, "pcie": [1, 1]}])
    in_shutdown, release = threading.Event(), threading.Event()

    def hung_shutdown() -> None:  # a wedged driver
        in_shutdown.set()
        release.wait()

    monkeypatch.setattr(sys.modules["pynvml"], "nvmlShutdown", hung_shutdown)
    paths = PathsConfig(procfs=node.procfs, sysfs=node.sysfs)
    telemetry = NodeTelemetry(Config(paths=paths, telemetry=TelemetryConfig(gpu="on")))
    telemetry.start()
    try:
        assert dict(telemetry.available())["gpu"]
        stopped = _stops_within(telemetry.stop, 2.0)
        assert in_shutdown.wait(10)  # it was asked, and is left behind
    finally:
        release.set()
    assert stopped, "stop() waited for a hung NVML shutdown"
    assert "NVML shutdown has not returned" in caplog.text


# --- the whole chain: a real exporter on the fixture node -------------------------------------


def test_what_the_node_did_during_a_save(
    node: FakeNode, private_disk: Path, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    nvml_state = tmp_path / "nvml.json"
    nvml_state.write_text(json.dumps({"init": "ok", "gpus": [{"util": 30, "memory_used": 1}] * 2}))
    config = write_config(
        tmp_path,
        f"spool: {spool}\n"
        "telemetry: {sample_interval: 200ms, network_devices: '^(eth|ib|bond)'}\n"
        f"jobs: [{{name: j, path: {node.mountpoint}, layout: dcp}}]\n",
    )
    env = {"PYTHONPATH": str(FAKES), "FAKE_NVML_STATE": str(nvml_state)}
    node.run(step=0.01)
    exporter = Exporter(
        "--config.file", str(config), "--path.procfs", str(node.procfs),
        "--path.sysfs", str(node.sysfs), env=env,
    )  # fmt: skip
    try:
        time.sleep(1.5)  # a quiet baseline at 30% GPU
        node.rates = {"bond0": 100 * MB, "mlx5_0": 200 * MB, "dm-0": 50 * MB}
        nvml_state.write_text(
            json.dumps({"init": "ok", "gpus": [{"util": 80, "memory_used": 1}] * 2})
        )
        with instrument.saving(training_job="j", step=1, spool=str(spool)) as save:
            started = time.time()
            time.sleep(2.0)
            dcp_generation(node.mountpoint / "step-1")
            save.resume()
            save.staged()
            save.written()
        window = time.time() - started
        node.rates = {}

        def correlated() -> bool:
            return (
                sample(
                    exporter.get("/metrics").text,
                    "checkpoint_last_save_gpu_utilization_ratio",
                    training_job="j",
                )
                is not None
            )

        wait_for(correlated, timeout=10)
        text = exporter.get("/metrics").text

        def value(name: str) -> float:
            return sample(text, name, training_job="j")

        assert value("checkpoint_last_save_network_transmit_bytes") == pytest.approx(
            300 * MB * window, rel=0.15
        )
        assert value("checkpoint_last_save_disk_written_bytes") == pytest.approx(
            50 * MB * window, rel=0.15
        )
        # mlx5_0 at 200 MB/s of 200 Gb/s is the busiest link: 1.6 / 200, where bond0 is at
        # 0.8 / 200. A peak is at least the busiest link's mean; above it by how much the fake
        # node's counter thread, starved on a busy machine, catches up in one 200 ms sample.
        peak = value("checkpoint_last_save_network_peak_utilization_ratio")
        assert 0.008 * 0.85 <= peak <= 0.008 * 4
        assert value("checkpoint_last_save_gpu_utilization_ratio") == pytest.approx(0.80, abs=0.08)
        assert value("checkpoint_last_save_gpu_baseline_utilization_ratio") == pytest.approx(
            0.30, abs=0.08
        )
        fs = {"mountpoint": str(node.mountpoint), "device": "/dev/mapper/vg-ckpt", "fstype": "xfs"}
        assert sample(text, "checkpoint_filesystem_size_bytes", **fs) == TMPFS_BYTES
        # Probed empty (when the job was placed), or by a 30 s probe during or after the
        # generation's write: only the test writes there, so never less than is free now.
        stats = os.statvfs(private_disk)
        avail = sample(text, "checkpoint_filesystem_avail_bytes", **fs)
        assert stats.f_bavail * stats.f_frsize <= avail <= TMPFS_BYTES
        assert sample(text, "checkpoint_filesystem_reserve_ratio", **fs) == 0.2
        assert sample(text, "checkpoint_job_filesystem_info", training_job="j", tier="durable",
                      mountpoint=str(node.mountpoint)) == 1  # fmt: skip
        for collector in ("network", "disk", "gpu", "filesystem"):
            assert (
                sample(text, "checkpoint_exporter_scrape_collector_success", collector=collector)
                == 1
            )
    finally:
        node.stop()
        exporter.close()


def test_a_node_without_gpus_or_infiniband(tmp_path: Path) -> None:
    config = write_config(tmp_path, "telemetry: {infiniband: false}\n")
    exporter = Exporter("--config.file", str(config), env={"PYTHONPATH": str(FAKES)})
    try:
        text = exporter.get("/metrics").text
        assert sample(text, "checkpoint_exporter_scrape_collector_success", collector="gpu") == 0
        assert exporter.get("/metrics").status == 200
        assert exporter.process.poll() is None
    finally:
        exporter.close()
