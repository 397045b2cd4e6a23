"""The Hugging Face layout, on trees transformers 5.24 (safetensors 0.8) really wrote.

Every listing below was captured from a real save by tests/writers/drivers/hf_writer.py (or, for the
shard-count changes, by ``save_pretrained`` itself): names, sizes, and mtimes relative to the
first file, in the order the writes happened (``strace`` of the same saves confirmed it). The
files are rebuilt here with zeros of the same sizes: the layout reads names, sizes and times.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checkpoint_exporter.model import COMMITTED, WRITING
from checkpoint_exporter.sources.layouts import hf
from checkpoint_exporter.sources.layouts.base import SAFETENSORS, SAFETENSORS_INDEX, ZIP
from checkpoint_exporter.sources.listing import OpsBudget, TreeReader
from tests.helpers.trees import BASE, build, scan

Listing = dict[str, tuple[int, float]]  # path -> (size, seconds after the first write)

# `--mode trainer`: Trainer(save_total_limit=3), four saves (checkpoint-2 rotated away), then a
# save killed inside the model's safetensors write: its `.tmpXXXXXX` never renamed.
TRAINER_KILLED: Listing = {
    "checkpoint-4/config.json": (818, 0.0000),
    "checkpoint-4/generation_config.json": (195, 0.0007),
    "checkpoint-4/model.safetensors": (476744, 0.0029),
    "checkpoint-4/training_args.bin": (5265, 0.0039),
    "checkpoint-4/optimizer.pt": (971611, 0.0044),
    "checkpoint-4/scheduler.pt": (1465, 0.0076),
    "checkpoint-4/rng_state.pth": (14327, 0.0079),
    "checkpoint-4/trainer_state.json": (776, 0.0085),
    "checkpoint-6/config.json": (818, 0.0223),
    "checkpoint-6/generation_config.json": (195, 0.0228),
    "checkpoint-6/model.safetensors": (476744, 0.0228),
    "checkpoint-6/training_args.bin": (5265, 0.0248),
    "checkpoint-6/optimizer.pt": (971611, 0.0253),
    "checkpoint-6/scheduler.pt": (1465, 0.0281),
    "checkpoint-6/rng_state.pth": (14327, 0.0284),
    "checkpoint-6/trainer_state.json": (776, 0.0290),
    "checkpoint-8/config.json": (818, 0.0433),
    "checkpoint-8/generation_config.json": (195, 0.0440),
    "checkpoint-8/model.safetensors": (476744, 0.0462),
    "checkpoint-8/training_args.bin": (5265, 0.0467),
    "checkpoint-8/optimizer.pt": (971611, 0.0472),
    "checkpoint-8/scheduler.pt": (1465, 0.0498),
    "checkpoint-8/rng_state.pth": (14327, 0.0500),
    "checkpoint-8/trainer_state.json": (776, 0.0505),
    "checkpoint-10/config.json": (818, 0.0645),
    "checkpoint-10/generation_config.json": (195, 0.0653),
    "checkpoint-10/.tmp0UAqFz": (476744, 0.0673),
}

# `--mode dirs`: save_pretrained(ROOT/checkpoint-N, max_shard_size="200KB"), newest three kept,
# then a save killed in its second shard's temporary file (the first shard already renamed).
DIRS_KILLED: Listing = {
    "checkpoint-4/config.json": (817, 0.0000),
    "checkpoint-4/generation_config.json": (195, 0.0005),
    "checkpoint-4/model-00001-of-00003.safetensors": (142256, 0.0005),
    "checkpoint-4/model-00002-of-00003.safetensors": (201096, 0.0005),
    "checkpoint-4/model-00003-of-00003.safetensors": (133448, 0.0005),
    "checkpoint-4/model.safetensors.index.json": (2143, 0.0037),
    "checkpoint-6/config.json": (817, 0.0154),
    "checkpoint-6/generation_config.json": (195, 0.0157),
    "checkpoint-6/model-00001-of-00003.safetensors": (142256, 0.0157),
    "checkpoint-6/model-00002-of-00003.safetensors": (201096, 0.0157),
    "checkpoint-6/model-00003-of-00003.safetensors": (133448, 0.0157),
    "checkpoint-6/model.safetensors.index.json": (2143, 0.0182),
    "checkpoint-8/config.json": (817, 0.0281),
    "checkpoint-8/generation_config.json": (195, 0.0287),
    "checkpoint-8/model-00001-of-00003.safetensors": (142256, 0.0300),
    "checkpoint-8/model-00002-of-00003.safetensors": (201096, 0.0300),
    "checkpoint-8/model-00003-of-00003.safetensors": (133448, 0.0300),
    "checkpoint-8/model.safetensors.index.json": (2143, 0.0310),
    "checkpoint-10/config.json": (817, 0.0412),
    "checkpoint-10/generation_config.json": (195, 0.0418),
    "checkpoint-10/.tmpMRGhsV": (201096, 0.0433),
    "checkpoint-10/model-00001-of-00003.safetensors": (142256, 0.0433),
}

# `--mode root`: save_pretrained(ROOT, max_shard_size="200KB"), the second of two saves.
ROOT_SAVED: Listing = {
    "config.json": (817, 0.0000),
    "generation_config.json": (195, 0.0007),
    "model-00001-of-00003.safetensors": (142256, 0.0007),
    "model-00002-of-00003.safetensors": (201096, 0.0007),
    "model-00003-of-00003.safetensors": (133448, 0.0007),
    "model.safetensors.index.json": (2143, 0.0054),
}

# `--mode root`, a save killed in the second shard: config rewritten, the first shard replaced,
# the second and third still the previous save's, the index the previous save's.
ROOT_KILLED: Listing = {
    "model-00002-of-00003.safetensors": (201096, 0.0000),
    "model-00003-of-00003.safetensors": (133448, 0.0000),
    "model.safetensors.index.json": (2143, 0.0044),
    "config.json": (817, 0.0175),
    ".tmpTsqWu2": (201096, 0.0181),
    "generation_config.json": (195, 0.0181),
    "model-00001-of-00003.safetensors": (142256, 0.0181),
}

# `--mode root`: killed as above, then the job restarted and saved again into the same root.
ROOT_RESAVED_AFTER_KILL: Listing = {
    ".tmpFfF7zN": (201096, 0.0000),
    "config.json": (817, 14.1634),
    "generation_config.json": (195, 14.1640),
    "model-00001-of-00003.safetensors": (142256, 14.2153),
    "model-00002-of-00003.safetensors": (201096, 14.2153),
    "model-00003-of-00003.safetensors": (133448, 14.2153),
    "model.safetensors.index.json": (2143, 14.2203),
}

# save_pretrained sharded, then unsharded into the same directory: the stale index stays.
SHARDED_THEN_SINGLE: Listing = {
    "model.safetensors.index.json": (2143, 0.0000),
    "config.json": (817, 0.0019),
    "generation_config.json": (195, 0.0023),
    "model.safetensors": (476744, 0.0023),
}

SHARDS = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]


def materialise(root: Path, listing: Listing, offset: float = 0.0) -> None:
    for path, (size, seconds) in listing.items():
        build(root, {path: size}, BASE + offset + seconds)


def states(found: dict) -> dict[str, tuple[str, bool]]:
    return {gen_id: (gen.state, gen.settles) for gen_id, gen in found.items()}


def kinds(found_item) -> list[tuple[str, str]]:
    return sorted((check.kind, check.path) for check in found_item.checks)


def test_trainer_checkpoints_commit_at_trainer_state_and_a_killed_save_writes(
    tmp_path: Path,
) -> None:
    materialise(tmp_path, TRAINER_KILLED)
    layout, found = scan(tmp_path)
    assert layout == "hf"
    assert states(found) == {
        "checkpoint-4": (COMMITTED, False),
        "checkpoint-6": (COMMITTED, False),
        "checkpoint-8": (COMMITTED, False),
        "checkpoint-10": (WRITING, False),  # marker never written: the deadline aborts it
    }
    assert [found[f"checkpoint-{n}"].step for n in (4, 6, 8, 10)] == [4, 6, 8, 10]
    assert found["checkpoint-8"].commit_time == BASE + 0.0505  # trainer_state.json's mtime
    assert kinds(found["checkpoint-8"]) == [
        (SAFETENSORS, "checkpoint-8/model.safetensors"),
        (ZIP, "checkpoint-8/optimizer.pt"),
        (ZIP, "checkpoint-8/rng_state.pth"),
        (ZIP, "checkpoint-8/scheduler.pt"),
        (ZIP, "checkpoint-8/training_args.bin"),
    ]
    # The killed save's temporary file is on disk and counted, but checked by nothing.
    assert found["checkpoint-10"].bytes == 818 + 195 + 476744
    assert found["checkpoint-10"].checks == ()


def replay(root: Path, listing: Listing, prefix: str) -> list[tuple[str, tuple[str, bool]]]:
    """Write a captured save's files one at a time, in the captured order, each weights file
    first as safetensors' temporary file and then renamed onto its name (as safetensors 0.8
    does); returns the generation's state after every step."""
    seen = []
    reader = TreeReader(root, OpsBudget(), hf.LAYOUT.content_files)
    for number, (path, (size, seconds)) in enumerate(listing.items()):
        if not path.startswith(prefix + "/"):
            continue
        target = root / path
        if target.name.endswith(".safetensors"):
            temporary = target.with_name(f".tmpAb{number:04d}")
            build(root, {str(temporary.relative_to(root)): size}, BASE + seconds)
            seen.append((".tmp", _state(reader, prefix)))
            os.rename(temporary, target)
        else:
            build(root, {path: size}, BASE + seconds)
        seen.append((target.name, _state(reader, prefix)))
    return seen


def _state(reader: TreeReader, prefix: str) -> tuple[str, bool]:
    tree, _ = reader.read(force=True)
    assert tree is not None
    found = {item.id: item for item in hf.LAYOUT.parse(tree, hf.Options())}
    return found[prefix].state, found[prefix].settles


def test_a_first_trainer_save_commits_only_at_trainer_state(tmp_path: Path) -> None:
    # No earlier checkpoint tells this tree is the Trainer's: the model files alone settle,
    # the Trainer's own files say the marker is still to come.
    steps = replay(tmp_path, TRAINER_KILLED, "checkpoint-4")
    writing, settling = (WRITING, False), (WRITING, True)
    assert steps == [
        ("config.json", writing),  # no weights yet
        ("generation_config.json", writing),
        (".tmp", writing),  # a weights write in flight
        ("model.safetensors", settling),
        ("training_args.bin", settling),
        ("optimizer.pt", writing),  # only the Trainer writes it: trainer_state.json will follow
        ("scheduler.pt", writing),
        ("rng_state.pth", writing),
        ("trainer_state.json", (COMMITTED, False)),
    ]


def test_a_later_trainer_save_waits_for_its_trainer_state(tmp_path: Path) -> None:
    earlier = {
        k: v for k, v in TRAINER_KILLED.items() if k.startswith(("checkpoint-4/", "checkpoint-6/"))
    }
    materialise(tmp_path, earlier)
    steps = replay(tmp_path, TRAINER_KILLED, "checkpoint-8")
    # checkpoint-8 is rebuilt from scratch while 4 and 6 are committed: never settling.
    assert all(state == (WRITING, False) for _, state in steps[:-1])
    assert steps[-1] == ("trainer_state.json", (COMMITTED, False))


def test_the_sigterm_save_sentinel_keeps_a_checkpoint_writing(tmp_path: Path) -> None:
    # trainer_jit_checkpoint.py writes it before _save_checkpoint, removes it after.
    materialise(tmp_path, TRAINER_KILLED)
    build(tmp_path, {f"checkpoint-8/{hf.INCOMPLETE}": b"Checkpoint started at step 8"})
    _, found = scan(tmp_path)
    assert found["checkpoint-8"].state == WRITING and not found["checkpoint-8"].settles
    (tmp_path / "checkpoint-8" / hf.INCOMPLETE).unlink()
    _, found = scan(tmp_path)
    assert found["checkpoint-8"].state == COMMITTED


def test_save_pretrained_directories_settle_once_every_shard_and_the_index_are_there(
    tmp_path: Path,
) -> None:
    steps = replay(tmp_path, DIRS_KILLED, "checkpoint-4")
    writing, settling = (WRITING, False), (WRITING, True)
    assert steps == [
        ("config.json", writing),
        ("generation_config.json", writing),
        (".tmp", writing),
        ("model-00001-of-00003.safetensors", writing),  # 1 of 3 shards
        (".tmp", writing),
        ("model-00002-of-00003.safetensors", writing),
        (".tmp", writing),
        ("model-00003-of-00003.safetensors", writing),  # every shard, the index to come
        ("model.safetensors.index.json", settling),
    ]


def test_save_pretrained_directories_and_a_killed_one(tmp_path: Path) -> None:
    materialise(tmp_path, DIRS_KILLED)
    layout, found = scan(tmp_path)
    assert layout == "hf"
    assert states(found) == {
        "checkpoint-4": (WRITING, True),
        "checkpoint-6": (WRITING, True),
        "checkpoint-8": (WRITING, True),
        "checkpoint-10": (WRITING, False),
    }
    assert found["checkpoint-8"].step == 8
    assert kinds(found["checkpoint-8"]) == [
        *((SAFETENSORS, f"checkpoint-8/{shard}") for shard in SHARDS),
        (SAFETENSORS_INDEX, "checkpoint-8/model.safetensors.index.json"),
    ]
    index = next(c for c in found["checkpoint-8"].checks if c.kind == SAFETENSORS_INDEX)
    # The validator sizes the shards from the directory holding the index in the tier's listing.
    tree, _ = TreeReader(tmp_path, OpsBudget()).read()
    holding = tree.directory_of(index.path) if tree is not None else None
    assert holding is not None and set(SHARDS) <= set(holding.names)


def test_a_model_saved_into_the_root_is_generation_dot_without_a_step(tmp_path: Path) -> None:
    materialise(tmp_path, ROOT_SAVED)
    layout, found = scan(tmp_path)
    assert layout == "hf"
    assert states(found) == {".": (WRITING, True)}
    root = found["."]
    assert root.step is None
    assert root.bytes == sum(size for size, _ in ROOT_SAVED.values()) and root.files == 6
    assert (root.start_time, root.last_write_time) == pytest.approx((BASE, BASE + 0.0054), abs=1e-5)
    assert kinds(root) == [
        *((SAFETENSORS, shard) for shard in SHARDS),
        (SAFETENSORS_INDEX, "model.safetensors.index.json"),
    ]


def test_a_save_killed_while_rewriting_the_root_stays_writing(tmp_path: Path) -> None:
    # The shards on disk are whole (renamed into place), the old index names them all: only
    # the temporary file, the newest thing there, tells the rewrite never finished.
    materialise(tmp_path, ROOT_KILLED)
    _, found = scan(tmp_path)
    assert states(found) == {".": (WRITING, False)}


def test_a_leftover_temporary_file_from_an_earlier_kill_does_not_hold_the_root(
    tmp_path: Path,
) -> None:
    materialise(tmp_path, ROOT_RESAVED_AFTER_KILL)
    _, found = scan(tmp_path)
    assert states(found) == {".": (WRITING, True)}
    assert found["."].bytes == sum(size for size, _ in ROOT_RESAVED_AFTER_KILL.values())


def test_a_stale_index_beside_a_single_file_is_not_checked(tmp_path: Path) -> None:
    # save_pretrained deletes stale shards but not the stale index; loaders take
    # model.safetensors first, so the index naming deleted shards is no fault.
    materialise(tmp_path, SHARDED_THEN_SINGLE)
    _, found = scan(tmp_path)
    assert states(found) == {".": (WRITING, True)}
    assert kinds(found["."]) == [(SAFETENSORS, "model.safetensors")]


def test_a_final_save_model_into_a_trainer_root_is_its_own_generation(tmp_path: Path) -> None:
    # Trainer.save_model() into output_dir writes what a checkpoint's save_model part writes;
    # the example scripts then add save_state()'s trainer_state.json and save_metrics' files.
    materialise(tmp_path, {k: v for k, v in TRAINER_KILLED.items() if "checkpoint-10" not in k})
    final = {
        name.removeprefix("checkpoint-8/"): (size, seconds + 1)
        for name, (size, seconds) in TRAINER_KILLED.items()
        if name.startswith("checkpoint-8/")
        and name.split("/")[1]
        in ("config.json", "generation_config.json", "model.safetensors", "training_args.bin")
    }
    materialise(tmp_path, final)
    build(tmp_path, {"trainer_state.json": 776, "train_results.json": 120}, BASE + 2)
    build(tmp_path, {"all_results.json": 120}, BASE + 2)
    _, found = scan(tmp_path)
    assert states(found)["."] == (WRITING, True)
    assert found["."].bytes == sum(size for size, _ in final.values())
    assert found["."].last_write_time == pytest.approx(BASE + 1.0467, abs=1e-5)
    assert kinds(found["."]) == [(SAFETENSORS, "model.safetensors"), (ZIP, "training_args.bin")]
    assert {k: v for k, v in states(found).items() if k != "."} == {
        "checkpoint-4": (COMMITTED, False),
        "checkpoint-6": (COMMITTED, False),
        "checkpoint-8": (COMMITTED, False),
    }


def test_detection_needs_a_saved_model_and_leaves_other_writers_trees_alone(
    tmp_path: Path,
) -> None:
    from checkpoint_exporter.sources.layouts import detect

    def detected(name: str, files: dict) -> str | None:
        root = tmp_path / name
        build(root, files)
        tree, _ = TreeReader(root, OpsBudget()).read()
        assert tree is not None
        return detect(tree)

    assert detected("config-only", {"config.json": b"{}"}) is None
    assert detected("weights-only", {"model.safetensors": 16}) is None
    assert detected("model", {"config.json": b"{}", "model.safetensors": 16}) == "hf"
    assert detected("in-a-dir", {"final/config.json": b"{}", "final/model.safetensors": 16}) == (
        "hf"
    )
    lightning = {"epoch=0-step=1.ckpt": 8, "config.json": b"{}", "model.safetensors": 16}
    assert detected("lightning", lightning) == "lightning"
    titan = {
        "checkpoint/step-10/.metadata": 2,
        "checkpoint/step-20/config.json": b"{}",
        "checkpoint/step-20/model.safetensors.index.json": b'{"weight_map": {}}',
        "checkpoint/step-20/model-00001-of-00001.safetensors": 16,
    }
    assert detected("torchtitan", titan) == "torchtitan"
    dcp = {"step-1/.metadata": 2, "step-1/__0_0.distcp": 8, "config.json": b"{}"}
    assert detected("dcp", dcp) not in ("hf", None)
