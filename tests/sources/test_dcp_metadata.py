"""The allowlisted DCP metadata reader: real metadata parses; hostile pickles never run."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint_exporter.sources import dcp_metadata
from checkpoint_exporter.sources.dcp_metadata import MetadataError

pytestmark = [pytest.mark.torch]

WRITE_REAL = r"""
import sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed.checkpoint as dcp
sd = {"model": {"w": torch.randn(32, 16), "b": torch.zeros(8, dtype=torch.bfloat16)}, "step": 7}
dcp.save(sd, checkpoint_id=sys.argv[1], no_dist=True)
"""


@pytest.fixture(scope="module")
def real_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dcp") / "step-7"
    subprocess.run([sys.executable, "-c", WRITE_REAL, str(path)], check=True, timeout=300)
    return path


def test_reads_real_torch_metadata_without_torch(real_checkpoint: Path) -> None:
    code = (
        "import sys; from checkpoint_exporter.sources import dcp_metadata; "
        f"m = dcp_metadata.read({str(real_checkpoint / '.metadata')!r}); "
        "print(m.version, sorted(m.shards.items())); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    version_line, torch_loaded = out.stdout.strip().splitlines()
    size = os.path.getsize(real_checkpoint / "__0_0.distcp")
    assert version_line == f"1.0.0 [('__0_0.distcp', {size})]"
    assert torch_loaded == "False"


def write_megatron(root: Path, saves: int = 1) -> Path:
    """Megatron-LM's save (tests/writers/drivers/megatron_writer.py: real megatron-core 0.16.1,
    a tiny GPTModel, torch_dist) into ``root``; returns the newest ``iter_*`` directory."""
    from tests.writers.harness import DRIVERS, writer_python

    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [writer_python("torch"), str(DRIVERS / "megatron_writer.py"), str(root)],
        input="save\n" * saves + "quit\n",
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
    )
    return max(root.glob("iter_*"))


@pytest.fixture(scope="module")
def megatron_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_megatron(tmp_path_factory.mktemp("megatron") / "save")


PLANNER = "torch.distributed.checkpoint.planner"


@pytest.mark.writers
def test_reads_real_megatron_core_metadata_without_torch(megatron_checkpoint: Path) -> None:
    """megatron-core stores its save plans (SavePlan, WriteItem...) in .metadata: admitted as
    inert stand-ins; the shard sizes are the offsets + lengths the writer recorded."""
    code = (
        "import sys; from checkpoint_exporter.sources import dcp_metadata; "
        f"m = dcp_metadata.read({str(megatron_checkpoint / '.metadata')!r}); "
        "print(sorted(m.shards.items())); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    shards_line, torch_loaded = out.stdout.strip().splitlines()
    sizes = sorted((p.name, p.stat().st_size) for p in megatron_checkpoint.glob("*.distcp"))
    assert len(sizes) >= 1 and shards_line == repr(sizes)  # each shard ends where its data ends
    assert torch_loaded == "False"


@pytest.mark.writers
def test_megatron_metadata_references_exactly_the_admitted_planner_classes(
    megatron_checkpoint: Path,
) -> None:
    seen: set[tuple[str, str]] = set()

    class Recording(dcp_metadata._AllowlistUnpickler):
        def find_class(self, module: str, name: str) -> object:
            seen.add((module, name))
            return super().find_class(module, name)

    root = Recording(io.BytesIO((megatron_checkpoint / ".metadata").read_bytes())).load()
    assert isinstance(root, dcp_metadata.Metadata)
    planner = {name for module, name in seen if module == PLANNER}
    assert planner == {"SavePlan", "WriteItem", "WriteItemType", "TensorWriteData"}
    plans = root.get("all_local_plans")
    assert isinstance(plans, list) and all(isinstance(p, dcp_metadata.SavePlan) for p in plans)


@pytest.mark.parametrize(
    "name", ["LoadPlan", "ReadItem", "SavePlanner", "LoadItemType", "BytesIOWriteData", "os"]
)
def test_other_planner_names_are_refused(name: str) -> None:
    with pytest.raises(MetadataError, match="refused to load"):
        dcp_metadata.loads(_global(PLANNER, name))


def test_a_save_plan_cannot_smuggle_a_global() -> None:
    """A stand-in's state is data: a refused global inside it still stops the load."""
    payload = (
        b"\x80\x04"
        + _global(PLANNER, "SavePlan")[:-1]  # push the stand-in class
        + b")\x81"  # EMPTY_TUPLE, NEWOBJ
        + b"}(\x8c\x05items"
        + _global("os", "system")[:-1]
        + b"u"  # SETITEMS
        + b"b."  # BUILD, STOP
    )
    with pytest.raises(MetadataError, match=r"refused to load os\.system"):
        dcp_metadata.loads(payload)


class _Evil:
    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


class _Eval:
    def __reduce__(self):
        return (eval, ("__import__('os').system('true')",))


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n" + b"."


@pytest.mark.parametrize(
    "payload_name",
    ["os_system", "builtins_eval", "nested_global", "getattr_chain", "subprocess", "persistent"],
)
def test_code_execution_is_refused(tmp_path: Path, payload_name: str) -> None:
    marker = tmp_path / "pwned"
    payloads = {
        "os_system": pickle.dumps(_Evil(marker)),
        "builtins_eval": pickle.dumps(_Eval()),
        "nested_global": _global("torch.distributed.checkpoint.metadata", "os.system"),
        "getattr_chain": _global("builtins", "getattr"),
        "subprocess": _global("subprocess", "Popen"),
        "persistent": b"\x80\x04P1\n.",
    }
    with pytest.raises(MetadataError):
        dcp_metadata.loads(payloads[payload_name])
    assert not marker.exists()


def test_a_class_allowed_for_one_module_is_refused_in_another() -> None:
    with pytest.raises(MetadataError, match=r"refused to load os\.Metadata"):
        dcp_metadata.loads(_global("os", "Metadata"))


def test_pickle_bomb_and_oversized_claims_are_bounded(tmp_path: Path) -> None:
    # A billion-laughs memo bomb: 40 levels of lists, each holding the previous one ten times,
    # 10**40 leaves in a few hundred bytes. Nothing here walks it: a walk would never end, which
    # the suite's per-test timeout fails.
    out = io.BytesIO()
    out.write(b"\x80\x04]\x94(" + b"K\x01" * 10 + b"e")
    for level in range(1, 41):
        out.write(b"(" + (b"h" + bytes([level - 1])) * 10 + b"l\x94")
    out.write(b".")
    with pytest.raises(MetadataError):
        dcp_metadata.loads(out.getvalue())
    # A claimed 4 GiB string in a tiny file, and a file above the size limit.
    with pytest.raises(MetadataError):
        dcp_metadata.loads(b"\x80\x04\x8d" + (2**32).to_bytes(8, "little") + b"abc")
    big = tmp_path / "big.metadata"
    big.write_bytes(b"\0" * 2048)
    with pytest.raises(MetadataError, match="above the 1024-byte limit"):
        dcp_metadata.read(str(big), size_limit=1024)


TRAVERSALS = ("../../etc/passwd", "/etc/passwd", "a/../../x")


@pytest.fixture(scope="module")
def traversal_metadata() -> dict[str, bytes]:
    """Real torch Metadata objects whose shard paths leave the checkpoint directory."""
    code = rf"""
import pickle, sys, warnings
warnings.filterwarnings("ignore")
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, BytesStorageMetadata
from torch.distributed.checkpoint.filesystem import _StorageInfo
out = {{}}
for path in {TRAVERSALS!r}:
    index = MetadataIndex("step")
    m = Metadata(state_dict_metadata={{"step": BytesStorageMetadata()}},
                 storage_data={{index: _StorageInfo(path, 0, 10)}})
    out[path] = pickle.dumps(m)
sys.stdout.buffer.write(pickle.dumps(out))
"""
    data = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, check=True, timeout=300
    ).stdout
    return pickle.loads(data)  # written by the test itself, a moment ago


@pytest.mark.parametrize("relative_path", TRAVERSALS)
def test_traversal_in_relative_path_is_refused(
    relative_path: str, traversal_metadata: dict[str, bytes]
) -> None:
    with pytest.raises(MetadataError, match="leaves the checkpoint directory"):
        dcp_metadata.loads(traversal_metadata[relative_path])


def test_garbage_and_wrong_top_level_objects() -> None:
    for data in (b"", b"not a pickle", pickle.dumps({"storage_data": {}}), pickle.dumps(42)):
        with pytest.raises(MetadataError):
            dcp_metadata.loads(data)


def test_symlinked_or_special_metadata_is_not_read(tmp_path: Path, real_checkpoint: Path) -> None:
    link = tmp_path / ".metadata"
    link.symlink_to(real_checkpoint / ".metadata")
    with pytest.raises(OSError):
        dcp_metadata.read(str(link))
    fifo = tmp_path / "fifo.metadata"
    os.mkfifo(fifo)
    with pytest.raises(OSError):  # a plain open() blocks forever: the suite's timeout fails it
        dcp_metadata.read(str(fifo))
