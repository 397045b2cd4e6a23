"""A full restore drill over a tree anyone may write: nothing from it runs.

DCP stores every non-tensor value (a step counter, a dataloader state, any object) as a
torch.save pickle inside a shard, which torch's own loader unpickles with weights_only=False;
and torch reads ``.metadata`` with a plain pickle.load, after the drill's allowlisted reader
checked it, so a file swapped in between would run. The drill must read both without running
anything they name."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from checkpoint_exporter.sources.dcp_metadata import MetadataError
from tests.conftest import write_config
from tests.helpers.drill import drill, spool_events, write_dcp

pytestmark = [pytest.mark.torch]


class _Trap:
    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (os.mkdir, (self.path,))


def test_an_object_in_a_shard_is_read_not_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "ckpt").mkdir()
    write_dcp(tmp_path / "ckpt" / "step-100", {"w": 1000}, {"step": 100}, trap=marker)
    config = write_config(
        tmp_path, f"spool: {tmp_path / 'spool'}\njobs: [{{name: j, path: {tmp_path / 'ckpt'}}}]\n"
    )
    result = drill(config, "j", "--full")
    assert not marker.exists(), "the full drill ran code from the checkpoint"
    assert result.returncode == 0, result.stderr
    assert "loaded 1 tensor" in result.stdout and "2 objects read, not unpickled" in result.stdout
    assert [e["event"] for e in spool_events(tmp_path / "spool", "j")] == [
        "restore_start", "restore_done",
    ]  # fmt: skip


def test_metadata_swapped_after_the_check_is_refused_not_run(tmp_path: Path) -> None:
    """The loader reads .metadata through the same allowlist as the scanner, real classes only
    for the names a DCP metadata file uses: a file replaced after the structural check runs
    nothing."""
    from checkpoint_exporter.restore import dcp_metadata_for_load

    marker = tmp_path / "ran"
    write_dcp(tmp_path / "step-1", {"w": 10})
    real = dcp_metadata_for_load(str(tmp_path / "step-1"))
    assert list(real.state_dict_metadata) == ["w"]  # the real torch classes, usable by DCP
    (tmp_path / "step-1" / ".metadata").write_bytes(pickle.dumps(_Trap(marker)))
    with pytest.raises(MetadataError, match=r"refused to load posix\.mkdir"):
        dcp_metadata_for_load(str(tmp_path / "step-1"))
    assert not marker.exists()
