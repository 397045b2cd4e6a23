"""The Megatron-LM and NeMo 2 layouts, on trees the real megatron-core 0.16.1 wrote.

A module fixture runs Megatron-LM's save sequence (tests/writers/drivers/megatron_writer.py: a tiny
GPTModel, ``dist_checkpointing.save`` torch_dist, the tracker rewritten in place) four times,
keeping three iterations, then kills a fifth save half-way through its shards. Each test works on
a copy. NeMo is not installed in the writers' virtualenv: its trees are built following
``ModelCheckpoint``'s order of writes (layouts/nemo.py), with ``weights/`` a real megatron-core
torch_dist save taken from the fixture.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from checkpoint_exporter.model import ABORTED, COMMITTED, WRITING
from checkpoint_exporter.sources import validate
from checkpoint_exporter.sources.layouts.base import DCP, ZIP
from tests.helpers.trees import BASE, build, dcp_metadata_bytes, scan, touch
from tests.writers.harness import Driver, disk_bytes

TRACKER = "latest_checkpointed_iteration.txt"
# Tests marked ``writers`` run megatron-core in the writers' virtualenv (.venv-writers/torch).


@pytest.fixture(scope="module")
def megatron_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("megatron") / "save"
    root.mkdir()
    driver = Driver("megatron", "torch", root)
    try:
        steps = [driver.save()["step"] for _ in range(4)]
        hung = driver.hang()
    finally:
        driver.close()  # SIGKILLs the process group: the hung writers die mid-shard
    assert steps == [5, 10, 15, 20] and hung["step"] == 25
    return root


@pytest.fixture
def tree(megatron_tree: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "save"
    shutil.copytree(megatron_tree, copy, symlinks=True)  # copy2: mtimes kept
    return copy


def states(found: dict) -> dict[str, str]:
    return {gen_id: gen.state for gen_id, gen in found.items()}


def _verdict(root: Path, found) -> validate.Verdict:
    return validate.validate(str(root), found.checks)


@pytest.mark.writers
def test_real_megatron_save_sequence(tree: Path) -> None:
    assert sorted(os.listdir(tree)) == [
        "iter_0000010", "iter_0000015", "iter_0000020", "iter_0000025", TRACKER,
    ]  # fmt: skip
    assert sorted(os.listdir(tree / "iter_0000020")) == [
        ".metadata", "__0_0.distcp", "__0_1.distcp", "common.pt", "metadata.json",
    ]  # fmt: skip
    assert not (tree / "iter_0000025" / ".metadata").exists()  # killed inside the shard write
    layout, found = scan(tree)
    assert layout == "megatron"
    assert states(found) == {
        "iter_0000010": COMMITTED,
        "iter_0000015": COMMITTED,
        "iter_0000020": COMMITTED,
        "iter_0000025": WRITING,  # newer than the tracker: aborted by the deadline, not here
    }
    newest = found["iter_0000020"]
    assert newest.step == 20 and newest.bytes == disk_bytes(tree / "iter_0000020")
    assert newest.commit_time == (tree / TRACKER).stat().st_mtime  # the tracker is the commit
    older = found["iter_0000010"]
    assert older.commit_time == (tree / "iter_0000010" / "metadata.json").stat().st_mtime
    assert [check.kind for check in newest.checks] == [DCP, ZIP]  # shards, and common.pt
    for name in ("iter_0000010", "iter_0000015", "iter_0000020"):
        assert _verdict(tree, found[name]) == validate.VALID


@pytest.mark.writers
def test_tracker_moved_past_an_incomplete_iteration(tree: Path) -> None:
    """A job resumed from iteration 20 with another --save-interval saves 30: the killed 25 will
    never finish."""
    shutil.copytree(tree / "iter_0000020", tree / "iter_0000030")
    with open(tree / TRACKER, "w") as f:  # Megatron-LM's rewrite in place
        f.write("30")
    _, found = scan(tree)
    assert found["iter_0000025"].state == ABORTED
    assert "tracker moved on" in (found["iter_0000025"].reason or "")
    assert found["iter_0000030"].state == COMMITTED


@pytest.mark.writers
def test_tracker_caught_mid_rewrite(tree: Path) -> None:
    """``open(path, "w")`` truncates before writing: an empty tracker decides nothing."""
    (tree / TRACKER).write_bytes(b"")
    _, found = scan(tree)
    assert states(found)["iter_0000020"] == COMMITTED
    assert states(found)["iter_0000025"] == WRITING


@pytest.mark.writers
def test_complete_but_not_yet_tracked(tree: Path) -> None:
    """metadata.json is written before the barrier and the tracker (all of --async-save's
    finalization): a complete iteration above the tracker is still being saved."""
    (tree / TRACKER).write_text("15")
    _, found = scan(tree)
    assert found["iter_0000020"].state == WRITING
    (tree / "iter_0000020" / "metadata.json").unlink()  # killed between .metadata and it
    (tree / TRACKER).write_text("20")
    _, found = scan(tree)
    assert found["iter_0000020"].state == ABORTED  # does not load without metadata.json


@pytest.mark.writers
def test_shard_sizes_truncation_only_when_shorter(tree: Path) -> None:
    shard = tree / "iter_0000020" / "__0_0.distcp"
    size = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(b"\0" * 7)  # longer than the metadata needs: still whole
    assert _verdict(tree, scan(tree)[1]["iter_0000020"]) == validate.VALID
    os.truncate(shard, size - 1)
    verdict = _verdict(tree, scan(tree)[1]["iter_0000020"])
    assert (verdict.valid, verdict.reason) == (False, validate.TRUNCATED_SHARD)
    assert f"is {size - 1} bytes, metadata needs {size}" in verdict.detail
    os.truncate(tree / "iter_0000015" / "common.pt", 100)
    verdict = _verdict(tree, scan(tree)[1]["iter_0000015"])
    assert (verdict.valid, verdict.reason) == (False, validate.BAD_ZIP)


@pytest.mark.slow
def test_torch_dcp_format_has_no_metadata_json(tmp_path: Path) -> None:
    """``--ckpt-format torch_dcp``: torch's own FileSystemWriter, a plain DCP directory (no
    metadata.json, no common.pt), complete at its .metadata."""
    build(tmp_path, {"iter_0000040/__0_0.distcp": 64}, BASE)
    (tmp_path / "iter_0000040" / ".metadata").write_bytes(dcp_metadata_bytes(1, 64))
    build(tmp_path, {"iter_0000050/__0_0.distcp": 64, TRACKER: b"50"}, BASE + 10)
    _, found = scan(tmp_path)
    assert states(found) == {"iter_0000040": COMMITTED, "iter_0000050": ABORTED}
    assert [check.kind for check in found["iter_0000040"].checks] == [DCP]
    assert _verdict(tmp_path, found["iter_0000040"]) == validate.VALID


def test_legacy_format_completes_with_model_optim_rng(tmp_path: Path) -> None:
    """Legacy ``torch``: distrib_optim.pt is written before model_optim_rng.pt."""
    build(tmp_path, {"iter_0000010/mp_rank_00/model_optim_rng.pt": 32}, BASE)
    build(tmp_path, {"iter_0000020/mp_rank_00/distrib_optim.pt": 32}, BASE + 10)
    build(tmp_path, {TRACKER: b"20"}, BASE + 20)
    _, found = scan(tmp_path)
    assert states(found) == {"iter_0000010": COMMITTED, "iter_0000020": ABORTED}


@pytest.mark.writers
def test_release_directory(tree: Path) -> None:
    shutil.copytree(tree / "iter_0000020", tree / "release")
    _, found = scan(tree)
    assert found["release"].state == COMMITTED and found["release"].step is None
    (tree / TRACKER).write_text("release")
    _, found = scan(tree)
    assert found["release"].state == COMMITTED


# --- NeMo 2 --------------------------------------------------------------------------------

NEMO = "llama--val_loss=1.20-step=10-consumed_samples=80.0"


def _nemo_checkpoint(root: Path, name: str, weights: Path, start: float) -> Path:
    """ModelCheckpoint._save_checkpoint's order: marker, weights/, context/; the marker stays
    (the finalize callback removes it)."""
    marker = root / f"{name.removesuffix('-EMA')}-unfinished"
    build(root, {marker.name: 0}, start)
    shutil.copytree(weights, root / name / "weights")
    for path in (root / name / "weights").iterdir():
        touch(path, start + 1)
    build(
        root, {f"{name}/context/io.json": b"{}", f"{name}/context/model.yaml": b"a: 1"}, start + 2
    )
    return marker


@pytest.mark.writers
def test_nemo_save_and_removal(tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    weights = tree / "iter_0000020"  # exactly what dist_checkpointing.save wrote
    marker = _nemo_checkpoint(root, NEMO, weights, BASE)
    layout, found = scan(root)
    assert layout == "nemo"
    assert states(found) == {NEMO: WRITING}  # saved, not finalized
    marker.unlink()  # the finalize callback
    _, found = scan(root)
    committed = found[NEMO]
    assert (committed.state, committed.step, committed.commit_time) == (COMMITTED, 10, BASE + 2)
    assert committed.bytes == disk_bytes(root / NEMO)
    assert [(c.kind, c.path) for c in committed.checks] == [(DCP, f"{NEMO}/weights")]
    assert _verdict(root, committed) == validate.VALID
    # _remove_checkpoint: marker touched after every write, then rmtree, then unlink.
    build(root, {marker.name: 0}, BASE + 100)
    _, found = scan(root)
    assert found == {}  # NeMo no longer counts it, and would delete it on restart
    shutil.rmtree(root / NEMO / "weights")
    _, found = scan(root)
    assert found == {}


@pytest.mark.writers
def test_nemo_async_save_before_finalization(tree: Path, tmp_path: Path) -> None:
    """ckpt_async_save=True (the default): context/ is written while the shards are, and
    .metadata / metadata.json land at finalization, before the marker goes."""
    root = tmp_path / "checkpoints"
    marker = _nemo_checkpoint(root, NEMO, tree / "iter_0000025", BASE)  # the killed save's shards
    assert states(scan(root)[1]) == {NEMO: WRITING}
    marker.unlink()  # no marker but no .metadata: only a copy or a bug leaves that
    _, found = scan(root)
    verdict = _verdict(root, found[NEMO])
    assert (found[NEMO].state, verdict.valid, verdict.reason) == (
        COMMITTED, False, validate.MISSING_SHARD,
    )  # fmt: skip


@pytest.mark.writers
def test_nemo_weights_without_metadata_json_are_invalid(tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _nemo_checkpoint(root, NEMO, tree / "iter_0000020", BASE).unlink()
    (root / NEMO / "weights" / "metadata.json").unlink()
    _, found = scan(root)
    assert found[NEMO].invalid and found[NEMO].reason == validate.MISSING_SHARD


@pytest.mark.writers
def test_nemo_names_last_ema_and_links(tree: Path, tmp_path: Path) -> None:
    """NeMoLogger's fallback name has no step; ``-last`` is a second save of the same step (or a
    symlink, with save_last="link"); ``-EMA`` shares its checkpoint's marker."""
    root = tmp_path / "checkpoints"
    weights = tree / "iter_0000020"
    plain = "default--val_loss=0.0000-epoch=0-consumed_samples=80.0"
    _nemo_checkpoint(root, plain, weights, BASE).unlink()
    _nemo_checkpoint(root, f"{NEMO}-last", weights, BASE + 10).unlink()
    marker = _nemo_checkpoint(root, f"{NEMO}-EMA", weights, BASE + 20)
    (root / "linked-last").symlink_to(plain)
    layout, found = scan(root)
    assert layout == "nemo"
    assert states(found) == {plain: COMMITTED, f"{NEMO}-last": COMMITTED, f"{NEMO}-EMA": WRITING}
    assert found[plain].step is None and found[f"{NEMO}-last"].step == 10
    assert marker.name == f"{NEMO}-unfinished"
    marker.unlink()
    assert states(scan(root)[1])[f"{NEMO}-EMA"] == COMMITTED
    shutil.rmtree(root / f"{NEMO}-last")
    shutil.rmtree(root / f"{NEMO}-EMA")
    assert scan(root)[0] == "nemo"  # no marker, no step in sight: weights/ + context/ decide
