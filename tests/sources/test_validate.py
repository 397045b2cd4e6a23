"""Structural validation against real files: torch DCP and torch.save zips, safetensors, sha256."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint_exporter.sources.layouts.base import (
    DCP,
    INTEGRITY,
    SAFETENSORS,
    SAFETENSORS_INDEX,
    ZIP,
    Check,
)
from checkpoint_exporter.sources.listing import Dir, OpsBudget, TreeReader
from checkpoint_exporter.sources.validate import Limits, validate

pytestmark = [pytest.mark.torch]

WRITE = r"""
import sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed.checkpoint as dcp
root = sys.argv[1]
state = {"a": torch.randn(64, 64), "b": torch.randn(128), "step": 3}
dcp.save(state, checkpoint_id=root + "/dcp", no_dist=True)
torch.save({"w": torch.randn(256)}, root + "/model_states.pt")
"""


@pytest.fixture(scope="module")
def real_save(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("real_save")
    subprocess.run([sys.executable, "-c", WRITE, str(root)], check=True, timeout=300)
    return root


def copy(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    return dst


DCP_ROOT = Check(DCP, ".")  # the tier root is the DCP checkpoint


def listed(root: Path) -> Dir:
    """The tier's listing, as the daemon hands it to the validator with the checks."""
    listing, _ = TreeReader(root, OpsBudget()).read()
    assert listing is not None
    return listing


def test_real_dcp_save_is_valid(real_save: Path) -> None:
    assert validate(str(real_save / "dcp"), [DCP_ROOT], tree=listed(real_save / "dcp")).valid


def test_truncated_and_deleted_shards(real_save: Path, tmp_path: Path) -> None:
    truncated = copy(real_save / "dcp", tmp_path / "truncated")
    shard = truncated / "__0_0.distcp"
    os.truncate(shard, shard.stat().st_size - 100)
    verdict = validate(str(truncated), [DCP_ROOT], tree=listed(truncated))
    assert (verdict.valid, verdict.reason) == (False, "truncated_shard")
    assert "__0_0.distcp" in verdict.detail
    deleted = copy(real_save / "dcp", tmp_path / "deleted")
    (deleted / "__0_0.distcp").unlink()
    verdict = validate(str(deleted), [DCP_ROOT], tree=listed(deleted))
    assert (verdict.valid, verdict.reason) == (False, "missing_shard")


def test_stale_listing_is_confirmed_before_calling_a_shard_truncated(
    real_save: Path, tmp_path: Path
) -> None:
    growing = copy(real_save / "dcp", tmp_path / "growing")
    shard = growing / "__0_0.distcp"
    full = shard.read_bytes()
    shard.write_bytes(full[:10])
    listing = listed(growing)  # listed while the shard was short
    shard.write_bytes(full)
    assert validate(str(growing), [DCP_ROOT], tree=listing).valid


def test_corrupt_metadata_is_bad_metadata(real_save: Path, tmp_path: Path) -> None:
    broken = copy(real_save / "dcp", tmp_path / "broken")
    (broken / ".metadata").write_bytes(b"\x80\x04garbage")
    verdict = validate(str(broken), [DCP_ROOT], tree=listed(broken))
    assert (verdict.valid, verdict.reason) == (False, "bad_metadata")


def test_torch_save_zip_trailer(real_save: Path, tmp_path: Path) -> None:
    good = copy(real_save / "model_states.pt", tmp_path / "good.pt")
    assert validate(str(tmp_path), [Check(ZIP, "good.pt")]).valid
    cut = copy(real_save / "model_states.pt", tmp_path / "cut.pt")
    os.truncate(cut, good.stat().st_size - 30)
    verdict = validate(str(tmp_path), [Check(ZIP, "cut.pt")])
    assert (verdict.valid, verdict.reason) == (False, "bad_zip")
    assert validate(str(tmp_path), [Check(ZIP, "absent.pt")]).reason == "missing_shard"


def safetensors_file(path: Path, tensor_bytes: int, cut: int = 0) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [tensor_bytes // 4],
                               "data_offsets": [0, tensor_bytes]}}).encode()  # fmt: skip
    data = struct.pack("<Q", len(header)) + header + b"\0" * tensor_bytes
    path.write_bytes(data[: len(data) - cut])


def test_safetensors_header_and_index(tmp_path: Path) -> None:
    safetensors_file(tmp_path / "model-00001-of-00002.safetensors", 64)
    safetensors_file(tmp_path / "model-00002-of-00002.safetensors", 64, cut=8)
    assert validate(str(tmp_path), [Check(SAFETENSORS, "model-00001-of-00002.safetensors")]).valid
    verdict = validate(str(tmp_path), [Check(SAFETENSORS, "model-00002-of-00002.safetensors")])
    assert verdict.reason == "truncated_shard"
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    "a": "model-00001-of-00002.safetensors",
                    "b": "model-00003.safetensors",
                }
            }
        )
    )
    verdict = validate(str(tmp_path), [Check(SAFETENSORS_INDEX, "model.safetensors.index.json")])
    assert (verdict.reason, "model-00003.safetensors" in verdict.detail) == ("missing_shard", True)


def test_integrity_manifest_checksums(tmp_path: Path) -> None:
    iteration = tmp_path / "iter_0000010"
    iteration.mkdir()
    (iteration / "__0_0.distcp").write_bytes(b"x" * 1000)
    digest = hashlib.sha256(b"x" * 1000).hexdigest()
    manifest = {"algorithm": "sha256", "files": {"__0_0.distcp": digest}}
    (iteration / "integrity.json").write_text(json.dumps(manifest))
    check = [Check(INTEGRITY, "iter_0000010")]
    assert validate(str(tmp_path), check, Limits(checksum_bytes_per_second=0)).valid
    (iteration / "__0_0.distcp").write_bytes(b"y" * 1000)  # silent corruption, same size
    verdict = validate(str(tmp_path), check)
    assert (verdict.valid, verdict.reason) == (False, "checksum")
    manifest["files"] = {"../../etc/passwd": digest}
    (iteration / "integrity.json").write_text(json.dumps(manifest))
    assert validate(str(tmp_path), check).reason == "bad_metadata"
