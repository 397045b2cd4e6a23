"""The restore drill as the on-call meets it: its events marked as a drill's and counted apart by
a real exporter; `--full` without torch, or on a layout it cannot load, is not a failed restore;
`--full` on a real DCP generation larger than its memory bound stays under it; torch.save files
are read record by record, their CRC-32s checked, nothing in them unpickled; safetensors tensor by
tensor, against their shapes."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from checkpoint_exporter.cli import build_parser
from tests.conftest import Exporter, sample, wait_for, write_config
from tests.helpers.drill import (
    drill,
    drill_with_peak_rss,
    hidden_torch,
    spool_events,
    write_dcp,
)
from tests.helpers.trees import build, dcp_generation

pytestmark = [pytest.mark.torch]

JOB = "llama"
NOT_FULL = 3  # the drill's exit status: the structural drill passed, the full one could not run
NO_TORCH = "torch is not installed here: --full needs it; running the structural drill"


def _config(root: Path) -> Path:
    (root / "ckpt").mkdir(exist_ok=True)
    return write_config(
        root, f"spool: {root / 'spool'}\njobs: [{{name: {JOB}, path: {root / 'ckpt'}}}]\n"
    )


def _kinds(events: list[dict]) -> list[tuple[str, bool]]:
    return [(event["event"], event.get("drill", False)) for event in events]


def _settled(path: Path) -> None:
    """Older than the settle period: a file without a commit marker is committed once still."""
    os.utime(path, (time.time() - 60, time.time() - 60))


def _truncate_a_shard(generation: Path) -> None:
    shard = sorted(generation.glob("*.distcp"))[0]
    os.truncate(shard, shard.stat().st_size // 2)


@pytest.mark.daemon
def test_drills_are_marked_and_counted_apart_by_a_real_exporter(tmp_path: Path) -> None:
    config = _config(tmp_path)
    dcp_generation(tmp_path / "ckpt" / "step-100")
    exporter = Exporter("--config.file", str(config))
    try:
        assert drill(config, JOB).returncode == 0
        dcp_generation(tmp_path / "ckpt" / "step-200")
        _truncate_a_shard(tmp_path / "ckpt" / "step-200")
        failed = drill(config, JOB)
        assert failed.returncode == 1 and "truncated_shard" in failed.stderr

        def counted() -> bool:
            text = exporter.metrics()
            return sample(text, "checkpoint_restore_drills_total", training_job=JOB) == 2

        wait_for(counted, timeout=10)
        text = exporter.metrics()
        assert sample(text, "checkpoint_restore_drill_failures_total", training_job=JOB) == 1
        assert sample(text, "checkpoint_restores_total", training_job=JOB) == 2
        assert sample(text, "checkpoint_restore_failures_total", training_job=JOB) == 1
    finally:
        exporter.close()
    assert _kinds(spool_events(tmp_path / "spool", JOB)) == [
        ("restore_start", True), ("restore_done", True),
        ("restore_start", True), ("restore_failed", True),
    ]  # fmt: skip


def test_full_without_torch_runs_the_structural_drill_and_says_it_could_not_load(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    write_dcp(tmp_path / "ckpt" / "step-100", {"w": 1000}, {"step": 100})
    env = hidden_torch(tmp_path / "no-torch")

    result = drill(config, JOB, "--full", env=env)
    assert result.returncode == NOT_FULL, result.stderr
    assert NO_TORCH in result.stderr and "structural check passed" in result.stderr
    assert "FAILED" not in result.stderr
    # What ran is a structural drill, and it passed: no failed restore for a missing torch.
    assert _kinds(spool_events(tmp_path / "spool", JOB)) == [
        ("restore_start", True), ("restore_done", True),
    ]  # fmt: skip

    # A broken generation is still a failed restore, torch or not.
    write_dcp(tmp_path / "ckpt" / "step-200", {"w": 1000}, {"step": 200})
    _truncate_a_shard(tmp_path / "ckpt" / "step-200")
    broken = drill(config, JOB, "--full", env=env)
    assert broken.returncode == 1 and "FAILED" in broken.stderr, broken.stderr
    assert _kinds(spool_events(tmp_path / "spool", JOB))[-1] == ("restore_failed", True)


def test_full_on_a_layout_with_nothing_it_can_load_is_not_a_failed_restore(
    tmp_path: Path,
) -> None:
    """An Orbax step: tensorstore files, nothing the drill can read back without JAX."""
    config = _config(tmp_path)
    build(tmp_path / "ckpt", {
        "100/_CHECKPOINT_METADATA": '{"init_timestamp_nsecs": 1, "commit_timestamp_nsecs": 2}',
        "100/commit_success.txt": "ok", "100/default/manifest.ocdbt": 64,
    })  # fmt: skip
    result = drill(config, JOB, "--full")
    assert result.returncode == NOT_FULL, result.stderr
    assert "structural check passed" in result.stderr and "FAILED" not in result.stderr
    assert "nothing in this orbax generation that --full can load" in result.stderr
    assert _kinds(spool_events(tmp_path / "spool", JOB)) == [
        ("restore_start", True), ("restore_done", True),
    ]  # fmt: skip


def test_a_full_drill_of_a_generation_larger_than_its_bound_stays_under_it(
    tmp_path: Path,
) -> None:
    """1.26 GB of tensors in four shard files, loaded under a 768 MiB bound: in batches, the
    one tensor too large for a batch read unparsed, the object read and not unpickled."""
    config = _config(tmp_path)
    tensors = {f"layers.{index}.w": 6_000_000 for index in range(40)}  # 24 MB each
    tensors["embed"] = 75_000_000  # 300 MB: more than a batch may hold under this bound
    total = write_dcp(tmp_path / "ckpt" / "step-100", tensors, {"step": 100}, shards=4)
    bound = 768 << 20
    assert total > 1.5 * bound

    result, peak = drill_with_peak_rss(config, JOB, "--full", f"--full-max-bytes={bound}")
    assert result.returncode == 0, result.stderr
    assert peak < bound, f"peak RSS {peak / 1e6:.0f} MB over the {bound / 1e6:.0f} MB bound"
    assert "full restore: torch 2.13" in result.stderr
    report = result.stdout
    batches = re.search(r"loaded 40 tensors \(0\.960 GB\) in (\d+) batches", report)
    assert batches and int(batches.group(1)) >= 2, report
    assert "1 tensor too large for a batch read unparsed (0.300 GB)" in report
    assert "1 object read, not unpickled" in report
    assert "4 of 4 shard files read" in report
    reported = re.search(r"peak RSS ([\d.]+) GB of ([\d.]+) GB allowed", report)
    assert reported and float(reported.group(1)) * 1e9 <= peak + 1e7, report
    events = spool_events(tmp_path / "spool", JOB)
    assert _kinds(events) == [("restore_start", True), ("restore_done", True)]


def test_the_bound_is_a_flag_with_a_floor() -> None:
    parser = build_parser()
    base = ["restore-drill", "--config.file", "c.yaml", "--job", JOB]
    assert parser.parse_args(base).full_max_bytes >= 4 << 30
    assert parser.parse_args([*base, "--full-max-bytes", "1073741824"]).full_max_bytes == 1 << 30
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--full-max-bytes", str(64 << 20)])
    full = parser.parse_args([*base, "--generation", "step-1", "--full"])
    assert (full.generation, full.full) == ("step-1", True)


# --- torch.save files ----------------------------------------------------------------------


def _lightning_checkpoint(path: Path) -> None:
    """A Lightning-style .ckpt: tensors beside objects only the training code may unpickle
    (argparse.Namespace hyper-parameters), which torch.load(weights_only=True) refuses."""
    code = (
        "import argparse, sys, torch\n"
        "torch.save({'state_dict': {'w': torch.arange(4096, dtype=torch.float32),\n"
        "                           'b': torch.ones(512)},\n"
        "            'hyper_parameters': argparse.Namespace(lr=0.1), 'global_step': 100},\n"
        "           sys.argv[1])\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=300)
    _settled(path)


def _flip_a_byte_of_a_tensor(path: Path) -> None:
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)  # the 16 KiB tensor
    with path.open("r+b") as file:
        file.seek(info.header_offset + 26)
        name, extra = struct.unpack("<HH", file.read(4))
        file.seek(info.header_offset + 30 + name + extra + info.file_size // 2)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    _settled(path)


def test_torch_save_files_are_read_record_by_record_and_checked(tmp_path: Path) -> None:
    config = _config(tmp_path)
    checkpoint = tmp_path / "ckpt" / "epoch=0-step=100.ckpt"
    _lightning_checkpoint(checkpoint)
    result = drill(config, JOB, "--full")
    assert result.returncode == 0, result.stderr
    assert re.search(r"2 storage records \([\d.]+ GB\) of 1 torch.save file read", result.stdout)

    _flip_a_byte_of_a_tensor(checkpoint)  # the zip's end record intact: structurally fine
    assert drill(config, JOB).returncode == 0
    corrupted = drill(config, JOB, "--full")
    assert corrupted.returncode == 1
    assert "FAILED" in corrupted.stderr and "CRC-32" in corrupted.stderr
    assert _kinds(spool_events(tmp_path / "spool", JOB))[-1] == ("restore_failed", True)


# --- safetensors ---------------------------------------------------------------------------


def _safetensors(shape: list[int], data: int) -> bytes:
    entry = {"dtype": "F32", "shape": shape, "data_offsets": [0, data]}
    header = json.dumps({"__metadata__": {"format": "pt"}, "w": entry}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * data


def _hf_generation(root: Path, weights: bytes) -> None:
    """A save_pretrained directory, unchanged for longer than the settle period."""
    build(root, {"checkpoint-4/config.json": "{}", "checkpoint-4/model.safetensors": weights})
    for path in [*(root / "checkpoint-4").iterdir(), root / "checkpoint-4"]:
        _settled(path)


def test_safetensors_are_read_tensor_by_tensor_against_their_shapes(tmp_path: Path) -> None:
    config = _config(tmp_path)
    _hf_generation(tmp_path / "ckpt", _safetensors([4], 16))
    result = drill(config, JOB, "--full")
    assert result.returncode == 0, result.stderr
    assert "full restore: torch not needed" in result.stderr
    assert "1 tensor (0.000 GB) of 1 safetensors file read" in result.stdout

    # Four floats' worth of data for a tensor of five: the file is long enough for its header
    # (structurally fine), but no loader could make the tensor.
    _hf_generation(tmp_path / "ckpt", _safetensors([5], 16))
    assert drill(config, JOB).returncode == 0
    short = drill(config, JOB, "--full")
    assert short.returncode == 1 and "FAILED" in short.stderr
    assert "is 20 bytes, its data_offsets hold 16" in short.stderr
