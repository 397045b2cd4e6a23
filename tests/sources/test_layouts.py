"""Every writer's layout, from fixture trees laid out as checkpoint-layouts.md describes them.

The trees are real directories read by the real listing; only the writers (which cannot run
here, except DCP, tested live in test_live_dcp.py) are replaced by files of the same names.
"""

from __future__ import annotations

import json
from pathlib import Path

from checkpoint_exporter.model import ABORTED, COMMITTED, WRITING
from tests.helpers.trees import BASE, build, dcp_generation, scan, touch


def states(found: dict) -> dict[str, str]:
    return {gen_id: gen.state for gen_id, gen in found.items()}


def test_dcp_directories(tmp_path: Path) -> None:
    build(tmp_path, {"step-100/__0_0.distcp": 100, "step-100/__1_0.distcp": 50}, BASE)
    build(tmp_path, {"step-100/.metadata": 10}, BASE + 7)
    build(tmp_path, {"step-200/__0_0.distcp": 100, "step-200/.metadata.tmp": 5}, BASE + 20)
    build(tmp_path, {"step-300/__0_0.distcp": 30}, BASE + 30)
    build(tmp_path, {"notes/readme.txt": 3})  # not a checkpoint
    touch(tmp_path / "step-100", BASE + 7)  # the rename of .metadata.tmp touched the directory
    _, found = scan(tmp_path, "dcp")
    assert states(found) == {"step-100": COMMITTED, "step-200": WRITING, "step-300": WRITING}
    committed = found["step-100"]
    assert (committed.step, committed.bytes, committed.files) == (100, 160, 3)
    assert committed.commit_time == BASE + 7 and committed.start_time == BASE
    assert [check.kind for check in committed.checks] == ["dcp"]
    assert found["step-200"].commit_time is None


def test_dcp_without_collectives_commits_when_every_rank_has_metadata(tmp_path: Path) -> None:
    build(tmp_path, {"a/__0_0.distcp": 1, "a/__1_0.distcp": 1, "a/__0.metadata": 1}, BASE)
    build(tmp_path, {"b/__0_0.distcp": 1, "b/__1_0.distcp": 1}, BASE)
    build(tmp_path, {"b/__0.metadata": 1, "b/__1.metadata": 1}, BASE + 3)
    _, found = scan(tmp_path, "dcp")
    assert states(found) == {"a": WRITING, "b": COMMITTED}
    assert found["b"].commit_time == BASE + 3


def test_nvidia_resiliency_ext_async_saves_are_read_as_dcp(tmp_path: Path) -> None:
    """Names and sizes captured from nvidia-resiliency-ext 0.4.1's async save (two ranks,
    ``thread_count=2``: each rank's two forked writers, one shard each; tests/writers/
    test_nvrx.py): a committed step and one killed inside the writers, before the finalize step
    renamed ``.metadata`` into place."""
    shards = {"__0_0.distcp": 798454, "__0_1.distcp": 797942, "__1_0.distcp": 806020}
    build(tmp_path, {f"step-5/{name}": size for name, size in shards.items()}, BASE)
    build(tmp_path, {"step-5/__1_1.distcp": 811880, "step-5/.metadata": 8672}, BASE + 2)
    killed = {"__0_0.distcp": 263721, "__0_1.distcp": 263721, "__1_0.distcp": 1261}
    build(tmp_path, {f"step-10/{name}": size for name, size in killed.items()}, BASE + 9)
    layout, found = scan(tmp_path)
    assert layout == "dcp"
    assert states(found) == {"step-5": COMMITTED, "step-10": WRITING}
    committed = found["step-5"]
    assert (committed.step, committed.bytes) == (5, 798454 + 797942 + 806020 + 811880 + 8672)
    assert committed.commit_time == BASE + 2


def test_torchtitan(tmp_path: Path) -> None:
    build(tmp_path, {"checkpoint/step-10/__0_0.distcp": 8, "checkpoint/step-10/.metadata": 2})
    build(tmp_path, {"checkpoint/step-20/": ""})  # created, nothing written yet
    build(
        tmp_path,
        {
            "checkpoint/step-30/model.safetensors.index.json": b'{"weight_map": {}}',
            "checkpoint/step-30/model-00001-of-00001.safetensors": 16,
        },
    )
    layout, found = scan(tmp_path)
    assert layout == "torchtitan"
    assert states(found) == {
        "checkpoint/step-10": COMMITTED,
        "checkpoint/step-20": WRITING,
        "checkpoint/step-30": COMMITTED,
    }
    assert found["checkpoint/step-30"].checks[0].kind == "safetensors_index"
    assert found["checkpoint/step-10"].step == 10


def _megatron_iteration(root: Path, step: int, mtime: float, complete: bool = True) -> None:
    name = f"iter_{step:07d}"
    build(root, {f"{name}/__0_0.distcp": 64, f"{name}/__1_0.distcp": 64}, mtime)
    if complete:
        build(root, {f"{name}/.metadata": 8}, mtime + 1)
        build(root, {f"{name}/metadata.json": b'{"sharded_backend": "torch_dist"}'}, mtime + 2)


def test_megatron_tracker_decides(tmp_path: Path) -> None:
    _megatron_iteration(tmp_path, 100, BASE)
    _megatron_iteration(tmp_path, 150, BASE + 50, complete=False)  # died; 200 committed later
    _megatron_iteration(tmp_path, 200, BASE + 100)
    _megatron_iteration(tmp_path, 300, BASE + 200)  # written, tracker not yet rewritten (async)
    build(tmp_path, {"latest_checkpointed_iteration.txt": b"200\n"}, BASE + 110)
    layout, found = scan(tmp_path)
    assert layout == "megatron"
    assert states(found) == {
        "iter_0000100": COMMITTED,
        "iter_0000150": ABORTED,
        "iter_0000200": COMMITTED,
        "iter_0000300": WRITING,
    }
    assert found["iter_0000200"].commit_time == BASE + 110  # the tracker is written last
    assert found["iter_0000100"].commit_time == BASE + 2  # metadata.json, the iteration's own
    assert "tracker moved on" in found["iter_0000150"].reason


def test_megatron_legacy_and_integrity(tmp_path: Path) -> None:
    build(tmp_path, {"iter_0000010/mp_rank_00/model_optim_rng.pt": 32}, BASE)
    build(tmp_path, {"iter_0000010/mp_rank_01/model_optim_rng.pt": 32}, BASE)
    build(
        tmp_path, {"iter_0000020/mp_rank_00/model_optim_rng.pt": 32, "iter_0000020/mp_rank_01/": ""}
    )
    build(tmp_path, {"latest_checkpointed_iteration.txt": b"20"}, BASE + 9)
    _, found = scan(tmp_path)
    assert states(found) == {"iter_0000010": COMMITTED, "iter_0000020": ABORTED}
    assert {check.kind for check in found["iter_0000010"].checks} == {"zip"}
    _megatron_iteration(tmp_path, 30, BASE + 20)
    build(tmp_path, {"iter_0000030/integrity.json": b"{}"})
    build(tmp_path, {"latest_checkpointed_iteration.txt": b"30"}, BASE + 30)
    _, plain = scan(tmp_path)
    _, verified = scan(tmp_path, verify_checksums=True)
    assert [c.kind for c in plain["iter_0000030"].checks] == ["dcp"]
    assert [c.kind for c in verified["iter_0000030"].checks] == ["dcp", "integrity"]


def test_nemo_unfinished_marker(tmp_path: Path) -> None:
    # ModelCheckpoint touches the marker before the save writes (a marker newer than every file
    # is a removal: tests/sources/test_layout_megatron.py).
    done = "llama--val_loss=1.20-step=100-consumed_samples=800"
    busy = "llama--val_loss=1.10-step=200-consumed_samples=1600"
    build(tmp_path, {f"{busy}-unfinished": 0}, BASE)
    for name in (done, busy):
        weights = {"__0_0.distcp": 32, ".metadata": 4, "metadata.json": b"{}"}
        build(tmp_path, {f"{name}/weights/{k}": v for k, v in weights.items()}, BASE + 1)
        build(tmp_path, {f"{name}/context/model.yaml": b"x: 1"}, BASE + 2)
    layout, found = scan(tmp_path)
    assert layout == "nemo"
    assert states(found) == {done: COMMITTED, busy: WRITING}
    assert found[done].step == 100 and found[done].checks[0].path == f"{done}/weights"


def test_deepspeed_latest_and_decoupled_commit(tmp_path: Path) -> None:
    for step, mtime in ((100, BASE), (200, BASE + 100), (300, BASE + 200)):
        build(
            tmp_path,
            {
                f"global_step{step}/mp_rank_00_model_states.pt": 64,
                f"global_step{step}/zero_pp_rank_0_mp_rank_00_optim_states.pt": 128,
            },
            mtime,
        )
    build(tmp_path, {"latest": b"global_step200", "zero_to_fp32.py": b"#"}, BASE + 105)
    layout, found = scan(tmp_path)
    assert layout == "deepspeed"
    assert states(found) == {
        "global_step100": COMMITTED,
        "global_step200": COMMITTED,
        "global_step300": WRITING,  # decoupled: `latest` follows at a later step()
    }
    assert found["global_step200"].commit_time == BASE + 105
    assert len(found["global_step100"].checks) == 2


def test_hf_trainer(tmp_path: Path) -> None:
    build(
        tmp_path, {"checkpoint-100/model.safetensors": 16, "checkpoint-100/optimizer.pt": 8}, BASE
    )
    build(tmp_path, {"checkpoint-100/trainer_state.json": b'{"global_step": 100}'}, BASE + 4)
    build(tmp_path, {"checkpoint-200/model.safetensors": 16})
    build(tmp_path, {"checkpoint-300/trainer_state.json": b"{}"})
    build(tmp_path, {"checkpoint-300/checkpoint-is-incomplete.txt": b""})
    build(tmp_path, {"tmp-checkpoint-400/model.safetensors": 16})  # 4.36-4.38 staging only
    layout, found = scan(tmp_path)
    assert layout == "hf"
    assert states(found) == {
        "checkpoint-100": COMMITTED,
        "checkpoint-200": WRITING,
        "checkpoint-300": WRITING,
        "tmp-checkpoint-400": WRITING,
    }
    assert found["checkpoint-100"].commit_time == BASE + 4
    assert {c.kind for c in found["checkpoint-100"].checks} == {"zip", "safetensors"}
    # trainer_state.json is the marker: nothing in a Trainer's tree settles without it.
    assert not any(gen.settles for gen in found.values())


def test_lightning_files_links_and_sharded_directories(tmp_path: Path) -> None:
    # Lightning 2.6.6 moves a temporary file into place, a copy across filesystems: no marker,
    # every .ckpt settles. A full last.ckpt is a save of its own (its step only inside); a
    # symlink is a name, never a generation. tests/sources/test_layout_lightning.py has the real
    # trees.
    build(tmp_path, {"epoch=0-step=100.ckpt": 64}, BASE)
    build(tmp_path, {"epoch=1-step=200.ckpt": 64, "last.ckpt": 64}, BASE + 60)
    build(tmp_path, {"last-link.ckpt": "->epoch=1-step=200.ckpt"})
    build(tmp_path, {"epoch=2-step=300.ckpt/__0_0.distcp": 8, "epoch=2-step=300.ckpt/.metadata": 2})
    build(tmp_path, {"epoch=3-step=400.ckpt/__0_0.distcp": 8, "epoch=3-step=400.ckpt/.metadata": 2})
    build(tmp_path, {"epoch=3-step=400.ckpt/meta.pt": 2})
    layout, found = scan(tmp_path)
    assert layout == "lightning"
    assert states(found) == {
        "epoch=0-step=100.ckpt": WRITING,
        "epoch=1-step=200.ckpt": WRITING,
        "last.ckpt": WRITING,
        "epoch=2-step=300.ckpt": WRITING,  # meta.pt comes after the DCP save
        "epoch=3-step=400.ckpt": WRITING,
    }
    assert {gen_id for gen_id, gen in found.items() if gen.settles} == {
        "epoch=0-step=100.ckpt",
        "epoch=1-step=200.ckpt",
        "last.ckpt",
        "epoch=3-step=400.ckpt",  # meta.pt is written in place: judged once still
    }
    assert (found["last.ckpt"].step, found["epoch=1-step=200.ckpt"].step) == (None, 200)
    assert "last-link.ckpt" not in found  # a symlink is another name, never followed
    assert found["epoch=0-step=100.ckpt"].start_time == BASE


def _orbax_metadata(init: float, commit: float | None) -> bytes:
    data = {"init_timestamp_nsecs": int(init * 1e9)}
    if commit is not None:
        data["commit_timestamp_nsecs"] = int(commit * 1e9)
    return json.dumps(data).encode()


def test_orbax_rename_mode(tmp_path: Path) -> None:
    build(tmp_path, {"100/_CHECKPOINT_METADATA": _orbax_metadata(BASE, BASE + 12)})
    build(tmp_path, {"100/default/manifest.ocdbt": 64, "100/default/ocdbt.process_0/d/abc": 256})
    build(
        tmp_path,
        {"200.orbax-checkpoint-tmp/_CHECKPOINT_METADATA": _orbax_metadata(BASE + 50, None)},
    )
    build(tmp_path, {"50.orbax-checkpoint-tmp-1712345678/default/x": 8})  # an old, abandoned save
    layout, found = scan(tmp_path)
    assert layout == "orbax"
    assert states(found) == {
        "100": COMMITTED,
        "200.orbax-checkpoint-tmp": WRITING,
        "50.orbax-checkpoint-tmp-1712345678": ABORTED,
    }
    committed = found["100"]
    assert (committed.start_time, committed.commit_time) == (BASE, BASE + 12)
    assert committed.bytes > 320 and committed.step == 100
    assert found["200.orbax-checkpoint-tmp"].start_time == BASE + 50


def test_orbax_commit_file_mode_and_bad_metadata(tmp_path: Path) -> None:
    build(tmp_path, {"ckpt_300/commit_success.txt": b"ok", "ckpt_300/default/x": 8})
    build(tmp_path, {"ckpt_300/_CHECKPOINT_METADATA": _orbax_metadata(BASE, BASE + 5)})
    # Commit-file mode writes the metadata right after the mkdir, with a null commit time; saves
    # are serialized, so the one in progress is the newest step.
    build(
        tmp_path,
        {"ckpt_600/_CHECKPOINT_METADATA": _orbax_metadata(BASE, None), "ckpt_600/default/x": 8},
    )
    build(
        tmp_path,
        {"ckpt_500/commit_success.txt": b"ok", "ckpt_500/_CHECKPOINT_METADATA": b"{not json"},
    )
    _, found = scan(tmp_path)
    assert states(found) == {"ckpt_300": COMMITTED, "ckpt_600": WRITING, "ckpt_500": COMMITTED}
    assert found["ckpt_500"].invalid and found["ckpt_500"].reason == "bad_metadata"


def test_auto_detection_picks_each_writer(tmp_path: Path) -> None:
    trees = {
        "dcp": {"s1/__0_0.distcp": 1, "s1/.metadata": 1},
        "torchtitan": {"checkpoint/step-1/.metadata": 1},
        "megatron": {"iter_0000001/metadata.json": 1},
        "nemo": {"m--step=1-consumed_samples=8/weights/.metadata": 1},
        "deepspeed": {"global_step1/mp_rank_00_model_states.pt": 1, "latest": b"global_step1"},
        "accelerate": {"checkpoints/checkpoint_0/random_states_0.pkl": 1},
        "hf": {"checkpoint-1/trainer_state.json": 1},
        "lightning": {"epoch=0-step=1.ckpt": 1},
        "orbax": {"1/_CHECKPOINT_METADATA": b"{}"},
        "ray": {
            "checkpoint_2026-12-02_12-53-14.739337/model.pt": 1,
            "checkpoint_manager_snapshot.json": b'{"checkpoint_results": [{"checkpoint_dir_name":'
            b' "checkpoint_2026-12-02_12-53-14.739337", "metrics": {"step": 5}}]}',
        },
        "torchsave": {"ckpt_step_1.pt": 1},
    }
    for expected, files in trees.items():
        root = tmp_path / expected
        build(root, files)
        assert scan(root)[0] == expected
    # NeMo 3's NeMoModelCheckpoint: Lightning's files, NeMo's marker of a save (or removal)
    # beside them; a first save's marker alone (its file still in $TMPDIR) is the same writer.
    nemo3 = {"tiny--score=-2.0000-epoch=0.ckpt": 1, "tiny--score=-5.0000-epoch=0-unfinished": 0}
    for files in (nemo3, {"tiny--score=-2.0000-epoch=0-unfinished": 0}):
        root = tmp_path / f"nemo3-{len(files)}"
        build(root, files)
        assert scan(root)[0] == "lightning"


def test_a_save_in_progress_cannot_flip_the_layout(tmp_path: Path) -> None:
    # NeMo 3 touches `<name>-unfinished` beside Lightning `.ckpt` files while it saves: the
    # marker is the nemo layout's surest sign (NeMo 2 directories), but nemo finds no
    # checkpoint here, and lightning finds two that last. Before, every .ckpt vanished from
    # the metrics for the length of each save.
    build(tmp_path, {"epoch=0-step=10.ckpt": 64, "epoch=0-step=20.ckpt": 64}, BASE)
    build(tmp_path, {"epoch=0-step=30-unfinished": 0}, BASE + 5)
    layout, found = scan(tmp_path)
    assert layout == "lightning"
    assert {"epoch=0-step=10.ckpt", "epoch=0-step=20.ckpt"} <= set(found)


def test_with_nothing_that_lasts_yet_the_surest_sign_decides(tmp_path: Path) -> None:
    # A job's first save, still being written: no layout finds a lasting checkpoint, so the
    # specific writer's sign wins over the generic DCP reading of the same directory.
    build(tmp_path / "megatron", {"iter_0000001/__0_0.distcp": 8}, BASE)
    assert scan(tmp_path / "megatron")[0] == "megatron"
    build(tmp_path / "orbax", {"1.orbax-checkpoint-tmp-7/d/file": 8}, BASE)
    assert scan(tmp_path / "orbax")[0] == "orbax"


def test_a_generic_reading_of_the_same_save_in_progress_cannot_take_the_tree(
    tmp_path: Path,
) -> None:
    # Lightning's sharded first save: the DCP save is done (`.metadata` renamed into place),
    # rank 0's `meta.pt` not yet written. DCP reads that directory as committed, Lightning as a
    # save in progress: the same generation, read less strictly. Taken by `dcp` for that
    # instant, the save was counted twice (committed by dcp, then written again and settled
    # under lightning) and a save killed before `meta.pt` was never aborted.
    sharded = tmp_path / "lightning"
    dcp_generation(sharded / "epoch=0-step=100.ckpt")
    layout, found = scan(sharded)
    assert layout == "lightning"
    assert states(found) == {"epoch=0-step=100.ckpt": WRITING}
    # Ray Train's first upload of a DCP checkpoint, before the controller registered it.
    ray = tmp_path / "ray"
    build(ray, {".validate_storage_marker": 0})
    dcp_generation(ray / "checkpoint_2026-12-02_12-53-14.739337")
    layout, found = scan(ray)
    assert layout == "ray"
    assert states(found) == {"checkpoint_2026-12-02_12-53-14.739337": WRITING}


def test_a_tree_with_nothing_recognisable_has_no_layout(tmp_path: Path) -> None:
    from checkpoint_exporter.sources.layouts import detect
    from checkpoint_exporter.sources.listing import OpsBudget, TreeReader

    build(tmp_path, {"logs/out.txt": 3, "README": 1})
    tree, _ = TreeReader(tmp_path, OpsBudget()).read()
    assert detect(tree) is None


def test_mtime_helper_sets_directory_times(tmp_path: Path) -> None:
    build(tmp_path, {"d/": ""})
    touch(tmp_path / "d", BASE)
    assert (tmp_path / "d").stat().st_mtime == BASE
