"""The Orbax and torchtitan layouts, on trees their real libraries wrote.

Every block below is a listing captured from the real library: orbax-checkpoint 0.12.8 on JAX
0.10.2 (CPU; ``CheckpointManager``, synchronous saves, hooks snapshotting the tree at
``AtomicRenameTemporaryPath.finalize`` / ``CommitFileTemporaryPath.finalize``, before the
step's ``commit_success.txt``, before its rename and after each ``os.unlink`` of the retention
``rmtree``), and torchtitan 0.3.0 on torch 2.13 (its ``CheckpointManager`` as
tests/writers/drivers/torchtitan_writer.py drives it, and a last-step Hugging Face export hooked
before consolidation and before the index). One line per file: mtime offset in seconds, size (or
``meta <init offset> <commit offset|null>`` for ``_CHECKPOINT_METADATA``, ``commit <size>`` for
``commit_success.txt``, ``json <content>``, ``dir`` for an empty directory), path. Directory
mtimes were not captured: each is set to its newest entry. ``{T}`` is ``.orbax-checkpoint-tmp``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from checkpoint_exporter.model import ABORTED, COMMITTED, WRITING
from tests.helpers.trees import BASE, scan

RENAME_5_SAVING = """
0.012 meta 5{T}/_CHECKPOINT_METADATA -0.01 null
0.011 287 5{T}/default{T}/_METADATA
0.006 83 5{T}/default{T}/_sharding
0.000 134 5{T}/default{T}/array_metadatas/process_0
0.012 213 5{T}/default{T}/d/36a3171a130e868a8d0d3ba66d1f2af1
0.018 113 5{T}/default{T}/manifest.ocdbt
0.007 213 5{T}/default{T}/ocdbt.process_0/d/5fe1497d3b3c0e438d6f9fb182ff53e6
0.000 176 5{T}/default{T}/ocdbt.process_0/d/902c9afc0030c320f42a85d519eeb1cb
0.009 166 5{T}/default{T}/ocdbt.process_0/manifest.ocdbt
"""
RENAME_5 = """
0.021 meta 5/_CHECKPOINT_METADATA -0.01 0.021
0.022 commit 5/commit_success.txt 54
0.011 287 5/default/_METADATA
0.006 83 5/default/_sharding
0.000 134 5/default/array_metadatas/process_0
0.019 commit 5/default/commit_success.txt 83
0.012 213 5/default/d/36a3171a130e868a8d0d3ba66d1f2af1
0.018 113 5/default/manifest.ocdbt
0.007 213 5/default/ocdbt.process_0/d/5fe1497d3b3c0e438d6f9fb182ff53e6
0.000 176 5/default/ocdbt.process_0/d/902c9afc0030c320f42a85d519eeb1cb
0.009 166 5/default/ocdbt.process_0/manifest.ocdbt
"""
RENAME_10_BEFORE_RENAME = """
0.046 meta 10{T}/_CHECKPOINT_METADATA 0.025 0.046
0.047 commit 10{T}/commit_success.txt 55
0.038 287 10{T}/default/_METADATA
0.031 83 10{T}/default/_sharding
0.035 134 10{T}/default/array_metadatas/process_0
0.044 commit 10{T}/default/commit_success.txt 84
0.039 214 10{T}/default/d/6b144bc20aaaf24ef3de2a0d1e403fb3
0.042 113 10{T}/default/manifest.ocdbt
0.029 176 10{T}/default/ocdbt.process_0/d/0b37221f8ba4ce5ef8c22aba80391401
0.035 214 10{T}/default/ocdbt.process_0/d/bc1c1d9711c3c89b50fc07e02779de14
0.036 166 10{T}/default/ocdbt.process_0/manifest.ocdbt
"""
RENAME_10 = """
0.046 meta 10/_CHECKPOINT_METADATA 0.025 0.046
0.047 commit 10/commit_success.txt 55
0.038 287 10/default/_METADATA
0.031 83 10/default/_sharding
0.035 134 10/default/array_metadatas/process_0
0.044 commit 10/default/commit_success.txt 84
0.039 214 10/default/d/6b144bc20aaaf24ef3de2a0d1e403fb3
0.042 113 10/default/manifest.ocdbt
0.029 176 10/default/ocdbt.process_0/d/0b37221f8ba4ce5ef8c22aba80391401
0.035 214 10/default/ocdbt.process_0/d/bc1c1d9711c3c89b50fc07e02779de14
0.036 166 10/default/ocdbt.process_0/manifest.ocdbt
"""
RENAME_5_DELETING = """
0.011 287 5/default/_METADATA
0.006 83 5/default/_sharding
0.000 134 5/default/array_metadatas/process_0
0.019 commit 5/default/commit_success.txt 83
0.012 213 5/default/d/36a3171a130e868a8d0d3ba66d1f2af1
0.018 113 5/default/manifest.ocdbt
0.007 213 5/default/ocdbt.process_0/d/5fe1497d3b3c0e438d6f9fb182ff53e6
0.000 176 5/default/ocdbt.process_0/d/902c9afc0030c320f42a85d519eeb1cb
0.009 166 5/default/ocdbt.process_0/manifest.ocdbt
"""
RENAME_5_DELETING_LAST = """
0.059 dir 5/default/d/
"""
COMMIT_FILE_5_SAVING = """
0.009 meta 5/_CHECKPOINT_METADATA -0.011 null
0.008 287 5/default/_METADATA
0.004 83 5/default/_sharding
0.000 134 5/default/array_metadatas/process_0
0.009 213 5/default/d/b9871a1b96a1fe9922910df5473117a1
0.012 113 5/default/manifest.ocdbt
0.004 213 5/default/ocdbt.process_0/d/44de8e0a78c9185636877a54114c58f8
0.000 176 5/default/ocdbt.process_0/d/7509af44ce38713dc7790d4741b59aba
0.005 166 5/default/ocdbt.process_0/manifest.ocdbt
"""
COMMIT_FILE_5 = """
0.014 meta 5/_CHECKPOINT_METADATA -0.011 0.014
0.015 commit 5/commit_success.txt 59
0.008 287 5/default/_METADATA
0.004 83 5/default/_sharding
0.000 134 5/default/array_metadatas/process_0
0.013 commit 5/default/commit_success.txt 67
0.009 213 5/default/d/b9871a1b96a1fe9922910df5473117a1
0.012 113 5/default/manifest.ocdbt
0.004 213 5/default/ocdbt.process_0/d/44de8e0a78c9185636877a54114c58f8
0.000 176 5/default/ocdbt.process_0/d/7509af44ce38713dc7790d4741b59aba
0.005 166 5/default/ocdbt.process_0/manifest.ocdbt
"""
COMMIT_FILE_10_SAVING = """
0.029 meta 10/_CHECKPOINT_METADATA 0.018 null
0.028 287 10/default/_METADATA
0.025 83 10/default/_sharding
0.024 134 10/default/array_metadatas/process_0
0.029 214 10/default/d/0eede9bfa755fa54142438729af7a414
0.031 113 10/default/manifest.ocdbt
0.019 176 10/default/ocdbt.process_0/d/1f4c16018c51f07a8bb7a7298904c445
0.025 214 10/default/ocdbt.process_0/d/25780440f12db4df64f3a512ccca4c40
0.026 166 10/default/ocdbt.process_0/manifest.ocdbt
"""
COMMIT_FILE_10_BEFORE_MARKER = """
0.034 meta 10/_CHECKPOINT_METADATA 0.018 0.034
0.028 287 10/default/_METADATA
0.025 83 10/default/_sharding
0.024 134 10/default/array_metadatas/process_0
0.033 commit 10/default/commit_success.txt 68
0.029 214 10/default/d/0eede9bfa755fa54142438729af7a414
0.031 113 10/default/manifest.ocdbt
0.019 176 10/default/ocdbt.process_0/d/1f4c16018c51f07a8bb7a7298904c445
0.025 214 10/default/ocdbt.process_0/d/25780440f12db4df64f3a512ccca4c40
0.026 166 10/default/ocdbt.process_0/manifest.ocdbt
"""
COMMIT_FILE_10 = """
0.034 meta 10/_CHECKPOINT_METADATA 0.018 0.034
0.035 commit 10/commit_success.txt 60
0.028 287 10/default/_METADATA
0.025 83 10/default/_sharding
0.024 134 10/default/array_metadatas/process_0
0.033 commit 10/default/commit_success.txt 68
0.029 214 10/default/d/0eede9bfa755fa54142438729af7a414
0.031 113 10/default/manifest.ocdbt
0.019 176 10/default/ocdbt.process_0/d/1f4c16018c51f07a8bb7a7298904c445
0.025 214 10/default/ocdbt.process_0/d/25780440f12db4df64f3a512ccca4c40
0.026 166 10/default/ocdbt.process_0/manifest.ocdbt
"""
COMMIT_FILE_5_DELETING = """
0.008 287 5/default/_METADATA
0.004 83 5/default/_sharding
0.000 134 5/default/array_metadatas/process_0
0.013 commit 5/default/commit_success.txt 67
0.009 213 5/default/d/b9871a1b96a1fe9922910df5473117a1
0.012 113 5/default/manifest.ocdbt
0.004 213 5/default/ocdbt.process_0/d/44de8e0a78c9185636877a54114c58f8
0.000 176 5/default/ocdbt.process_0/d/7509af44ce38713dc7790d4741b59aba
0.005 166 5/default/ocdbt.process_0/manifest.ocdbt
"""
# torchtitan: four saves with keep_latest_k=3 (step-5 purged), then a save killed in its shard
# write (tests/writers/drivers/torchtitan_writer.py, async_mode "disabled").
TORCHTITAN_KILLED = """
0.009 14555 checkpoint/step-10/.metadata
0.000 3244487 checkpoint/step-10/__0_0.distcp
0.054 14555 checkpoint/step-15/.metadata
0.050 3244487 checkpoint/step-15/__0_0.distcp
0.110 14555 checkpoint/step-20/.metadata
0.100 3244487 checkpoint/step-20/__0_0.distcp
0.133 1261 checkpoint/step-25/__0_0.distcp
"""
# torchtitan's last step with last_save_in_hf: shards first, then the consolidated file, then
# the index.
TORCHTITAN_TWO_SAVES = """
0.008 14368 checkpoint/step-1/.metadata
0.000 144346 checkpoint/step-1/__0_0.distcp
0.021 14368 checkpoint/step-2/.metadata
0.013 144346 checkpoint/step-2/__0_0.distcp
"""
HF_SHARDED = """
0.027 19240 checkpoint/step-3/sharded/shard-00001-model-00001-of-00001.safetensors
"""
HF_CONSOLIDATED = """
0.029 19034 checkpoint/step-3/model-00001-of-00001.safetensors
"""
HF_INDEX = """
0.029 json checkpoint/step-3/model.safetensors.index.json {"metadata":{"total_size":18720},\
"weight_map":{"0.weight":"model-00001-of-00001.safetensors","0.bias":"model-00001-of-00001.\
safetensors","1.weight":"model-00001-of-00001.safetensors","1.bias":"model-00001-of-00001.\
safetensors"}}
"""
# The default last step (last_save_model_only): a model-only DCP save, smaller.
MODEL_ONLY_LAST = """
0.028 1361 checkpoint/step-3/.metadata
0.026 24996 checkpoint/step-3/__0_0.distcp
"""


def _metadata(init: str, commit: str) -> bytes:
    """``_CHECKPOINT_METADATA`` as Orbax 0.12.8 writes it (keys in its order)."""
    handler = "orbax.checkpoint._src.handlers.standard_checkpoint_handler.StandardCheckpointHandler"
    data = {
        "item_handlers": {"default": handler},
        "metrics": {},
        "performance_metrics": {},
        "init_timestamp_nsecs": round((BASE + float(init)) * 1e9),
        "commit_timestamp_nsecs": None if commit == "null" else round((BASE + float(commit)) * 1e9),
        "custom_metadata": {},
    }
    return json.dumps(data).encode()


def lay(root: Path, *blocks: str, strip: str = "") -> None:
    """Write captured listings below ``root`` (``strip``: a path prefix to leave out)."""
    dirs: dict[Path, float] = {}
    for block in blocks:
        for line in block.replace("{T}", ".orbax-checkpoint-tmp").strip().splitlines():
            offset, kind, rest = line.split(" ", 2)
            path_text, _, extra = rest.partition(" ")
            path = root / path_text.removeprefix(strip)
            mtime = BASE + float(offset)
            if kind == "dir":
                path.mkdir(parents=True, exist_ok=True)
                dirs[path] = max(dirs.get(path, 0.0), mtime)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if kind == "meta":
                data = _metadata(*extra.split())
            elif kind == "commit":
                data = b"Checkpoint commit was successful to ROOT".ljust(int(extra), b".")
            elif kind == "json":
                data = extra.encode()
            else:
                data = b"\0" * int(kind)
            path.write_bytes(data)
            os.utime(path, (mtime, mtime))
            for parent in path.parents:
                if parent == root:
                    break
                dirs[parent] = max(dirs.get(parent, 0.0), mtime)
    for directory in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        os.utime(directory, (dirs[directory], dirs[directory]))


def at(offset: float) -> object:
    """A captured time, as the exporter reads it back (float seconds, nanosecond files)."""
    return pytest.approx(BASE + offset, abs=1e-4)


def states(found: dict) -> dict[str, str]:
    return {gen_id: gen.state for gen_id, gen in found.items()}


# --- Orbax, rename mode (the default on a local path) -------------------------------------


def test_orbax_first_save_in_progress(tmp_path: Path) -> None:
    lay(tmp_path, RENAME_5_SAVING)
    layout, found = scan(tmp_path)
    assert layout == "orbax"
    assert states(found) == {"5.orbax-checkpoint-tmp": WRITING}
    assert found["5.orbax-checkpoint-tmp"].step == 5
    assert found["5.orbax-checkpoint-tmp"].start_time == at(-0.01)  # the writer's init time


def test_orbax_rename_is_the_commit(tmp_path: Path) -> None:
    # Step 10's tmp directory has everything, commit_success.txt included, but no rename yet.
    lay(tmp_path, RENAME_5, RENAME_10_BEFORE_RENAME)
    _, found = scan(tmp_path)
    assert states(found) == {"5": COMMITTED, "10.orbax-checkpoint-tmp": WRITING}
    committed = found["5"]
    assert committed.step == 5
    # The writer's own init and commit times, from _CHECKPOINT_METADATA.
    assert committed.start_time == at(-0.01) and committed.commit_time == at(0.021)
    data = 287 + 83 + 134 + 213 + 113 + 213 + 176 + 166
    markers = 54 + 83 + len(_metadata("-0.01", "0.021"))
    assert (committed.files, committed.bytes) == (11, data + markers)


def test_orbax_committed_steps_and_retention_in_place(tmp_path: Path) -> None:
    lay(tmp_path / "before", RENAME_5, RENAME_10)
    _, found = scan(tmp_path / "before")
    assert states(found) == {"5": COMMITTED, "10": COMMITTED}
    assert found["10"].commit_time == at(0.046)
    # max_to_keep: rmtree took step 5's metadata and commit_success.txt first; then only an
    # empty directory is left; then nothing. It never reads as a save in progress.
    for name, block in (("markers", RENAME_5_DELETING), ("last", RENAME_5_DELETING_LAST)):
        lay(tmp_path / name, block, RENAME_10)
        _, found = scan(tmp_path / name)
        assert states(found) == {"5": COMMITTED, "10": COMMITTED}, name
    (tmp_path / "empty" / "5").mkdir(parents=True)  # before rmtree's last rmdir
    lay(tmp_path / "empty", RENAME_10)
    _, found = scan(tmp_path / "empty", "orbax")
    assert states(found) == {"10": COMMITTED}


def test_orbax_tmp_directory_below_the_newest_step_was_abandoned(tmp_path: Path) -> None:
    lay(tmp_path, RENAME_5_SAVING, RENAME_10)
    _, found = scan(tmp_path)
    assert states(found) == {"5.orbax-checkpoint-tmp": ABORTED, "10": COMMITTED}


# --- Orbax, commit-file mode (gs://, or AtomicityMode.COMMIT_FILE) --------------------------


def test_orbax_commit_file_first_save_in_progress(tmp_path: Path) -> None:
    # No step has commit_success.txt yet: the null commit time says the save is not done.
    lay(tmp_path, COMMIT_FILE_5_SAVING)
    layout, found = scan(tmp_path)
    assert layout == "orbax"
    assert states(found) == {"5": WRITING}


def test_orbax_commit_file_marker_is_the_commit(tmp_path: Path) -> None:
    lay(tmp_path / "saving", COMMIT_FILE_5, COMMIT_FILE_10_SAVING)
    _, found = scan(tmp_path / "saving")
    assert states(found) == {"5": COMMITTED, "10": WRITING}
    assert found["5"].commit_time == at(0.014)
    # Every item finalized and the commit time recorded, the marker next: committed.
    lay(tmp_path / "marker", COMMIT_FILE_5, COMMIT_FILE_10_BEFORE_MARKER)
    _, found = scan(tmp_path / "marker")
    assert states(found) == {"5": COMMITTED, "10": COMMITTED}
    assert found["10"].commit_time == at(0.034)


def test_orbax_commit_file_retention_and_abandoned_step(tmp_path: Path) -> None:
    lay(tmp_path / "deleting", COMMIT_FILE_5_DELETING, COMMIT_FILE_10)
    _, found = scan(tmp_path / "deleting")
    assert states(found) == {"5": COMMITTED, "10": COMMITTED}
    lay(tmp_path / "abandoned", COMMIT_FILE_5_SAVING, COMMIT_FILE_10)
    _, found = scan(tmp_path / "abandoned")
    assert states(found) == {"5": ABORTED, "10": COMMITTED}


# --- torchtitan ---------------------------------------------------------------------------


def test_torchtitan_dump_folder(tmp_path: Path) -> None:
    lay(tmp_path, TORCHTITAN_KILLED)
    layout, found = scan(tmp_path)
    assert layout == "torchtitan"
    assert states(found) == {
        "checkpoint/step-10": COMMITTED,
        "checkpoint/step-15": COMMITTED,
        "checkpoint/step-20": COMMITTED,
        "checkpoint/step-25": WRITING,
    }
    newest = found["checkpoint/step-20"]
    assert (newest.step, newest.bytes, newest.commit_time) == (20, 14555 + 3244487, at(0.110))
    assert [check.kind for check in newest.checks] == ["dcp"]


def test_step_directories_in_the_root_are_plain_dcp(tmp_path: Path) -> None:
    # The job pointed at the checkpoint folder itself: auto-detection cannot tell torchtitan
    # from any DCP user's step-N; `layout: torchtitan` reads it the same way.
    lay(tmp_path, TORCHTITAN_KILLED, strip="checkpoint/")
    layout, found = scan(tmp_path)
    assert layout == "dcp"
    assert states(found)["step-20"] == COMMITTED and states(found)["step-25"] == WRITING
    _, found = scan(tmp_path, "torchtitan")
    assert states(found) == {
        "step-10": COMMITTED,
        "step-15": COMMITTED,
        "step-20": COMMITTED,
        "step-25": WRITING,
    }


def test_torchtitan_last_step_in_hugging_face_format(tmp_path: Path) -> None:
    for name, blocks, state in (
        ("sharded", (HF_SHARDED,), WRITING),
        ("consolidated", (HF_SHARDED, HF_CONSOLIDATED), WRITING),
        ("indexed", (HF_SHARDED, HF_CONSOLIDATED, HF_INDEX), COMMITTED),
    ):
        lay(tmp_path / name, TORCHTITAN_TWO_SAVES, *blocks)
        _, found = scan(tmp_path / name)
        assert states(found)["checkpoint/step-3"] == state, name
        assert states(found)["checkpoint/step-2"] == COMMITTED
    last = found["checkpoint/step-3"]
    assert [check.kind for check in last.checks] == ["safetensors_index"]
    assert last.commit_time == at(0.029) and last.step == 3


def test_torchtitan_model_only_last_step(tmp_path: Path) -> None:
    lay(tmp_path, TORCHTITAN_TWO_SAVES, MODEL_ONLY_LAST)
    _, found = scan(tmp_path)
    assert set(states(found).values()) == {COMMITTED}
    assert found["checkpoint/step-3"].bytes == 1361 + 24996
