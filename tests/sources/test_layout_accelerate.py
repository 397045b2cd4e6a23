"""The Accelerate layout, on trees accelerate 1.15 (safetensors 0.8, torch 2.13) really wrote.

The listings below were captured from real saves by tests/writers/drivers/accelerate_writer.py
(``Accelerator.save_state()`` of a prepared model, AdamW, StepLR, a shuffled dataloader and one
object registered for checkpointing): names, sizes, and mtimes relative to the first file, in the
order of the writes (``strace -f`` of the same saves: ``rmtree`` of the oldest directory, then
``mkdir checkpoint_N``, safetensors' ``.tmpXXXXXX`` renamed onto ``model.safetensors``, then each
``torch.save`` opened ``O_TRUNC`` under its final name). The files are rebuilt here with zeros
of the same sizes: the layout reads names, sizes and times.
"""

from __future__ import annotations

import os
from pathlib import Path

from checkpoint_exporter.model import WRITING
from checkpoint_exporter.sources.layouts import MARKER_NAMES, accelerate, hf
from checkpoint_exporter.sources.layouts.base import DCP, SAFETENSORS, ZIP
from checkpoint_exporter.sources.listing import OpsBudget, TreeReader
from tests.helpers.trees import BASE, build, scan, touch

Listing = dict[str, tuple[int, float]]  # path -> (size, seconds after the first write)

# --mode automatic (total_limit=2): four saves, checkpoint_2 deleted by the fifth save before it
# wrote checkpoint_4, killed half-way through optimizer.bin (no random_states_0.pkl yet).
KILLED_IN_OPTIMIZER: Listing = {
    "checkpoints/checkpoint_3/model.safetensors": (1051976, 0.0000),
    "checkpoints/checkpoint_3/optimizer.bin": (2107939, 0.0188),
    "checkpoints/checkpoint_3/scheduler.bin": (1465, 0.0228),
    "checkpoints/checkpoint_3/random_states_0.pkl": (14561, 0.0308),
    "checkpoints/checkpoint_3/custom_checkpoint_0.pkl": (1333, 0.0369),
    "checkpoints/checkpoint_4/model.safetensors": (1051976, 0.6908),
    "checkpoints/checkpoint_4/optimizer.bin": (1053759, 0.7468),
}

# The same, killed half-way through random_states_0.pkl: every file before it whole.
KILLED_IN_RANDOM_STATES: Listing = {
    "checkpoints/checkpoint_3/model.safetensors": (1051976, 0.0000),
    "checkpoints/checkpoint_3/optimizer.bin": (2107939, 0.0065),
    "checkpoints/checkpoint_3/scheduler.bin": (1465, 0.0110),
    "checkpoints/checkpoint_3/random_states_0.pkl": (14497, 0.0122),
    "checkpoints/checkpoint_3/custom_checkpoint_0.pkl": (1333, 0.0169),
    "checkpoints/checkpoint_4/model.safetensors": (1051976, 0.0639),
    "checkpoints/checkpoint_4/optimizer.bin": (2107939, 0.0667),
    "checkpoints/checkpoint_4/scheduler.bin": (1465, 0.0714),
    "checkpoints/checkpoint_4/random_states_0.pkl": (7220, 0.0720),
}

# --mode explicit: save_state(ROOT/step_N), the user keeping two, the fifth save killed in
# optimizer.bin.
EXPLICIT_KILLED: Listing = {
    "step_9/model.safetensors": (1051976, 0.0000),
    "step_9/optimizer.bin": (2107939, 0.0010),
    "step_9/scheduler.bin": (1465, 0.0045),
    "step_9/random_states_0.pkl": (14497, 0.0052),
    "step_9/custom_checkpoint_0.pkl": (1333, 0.0062),
    "step_12/model.safetensors": (1051976, 1.0464),
    "step_12/optimizer.bin": (2107939, 1.0532),
    "step_12/scheduler.bin": (1465, 1.0532),
    "step_12/custom_checkpoint_0.pkl": (1333, 1.0612),
    "step_12/random_states_0.pkl": (14497, 1.0612),
    "step_15/model.safetensors": (1051976, 2.0065),
    "step_15/optimizer.bin": (1053759, 2.0232),
}

CHECKPOINT_3 = sum(size for path, (size, _) in KILLED_IN_OPTIMIZER.items() if "_3/" in path)


def materialise(root: Path, listing: Listing, strip: str = "") -> None:
    for path, (size, seconds) in listing.items():
        build(root, {path.removeprefix(strip): size}, BASE + seconds)


def states(found: dict) -> dict[str, tuple[str, bool]]:
    return {gen_id: (gen.state, gen.settles) for gen_id, gen in found.items()}


def kinds(found_item) -> list[tuple[str, str]]:
    return sorted((check.kind, check.path) for check in found_item.checks)


def test_automatic_naming_settles_and_a_save_killed_in_the_optimizer_is_writing(
    tmp_path: Path,
) -> None:
    materialise(tmp_path, KILLED_IN_OPTIMIZER)
    touch(tmp_path / "checkpoints" / "checkpoint_3", BASE)  # made just before its first file
    layout, found = scan(tmp_path)
    assert layout == "accelerate"
    assert states(found) == {
        "checkpoints/checkpoint_3": (WRITING, True),  # no marker: judged once still
        "checkpoints/checkpoint_4": (WRITING, False),  # no random_states_0.pkl: not done
    }
    done = found["checkpoints/checkpoint_3"]
    assert done.step is None, "checkpoint_3 is the fourth save, not step 3"
    assert (done.bytes, done.files) == (CHECKPOINT_3, 5)
    assert done.start_time == BASE and done.last_write_time == BASE + 0.0369
    prefix = "checkpoints/checkpoint_3/"
    assert kinds(done) == [
        (SAFETENSORS, prefix + "model.safetensors"),
        (ZIP, prefix + "custom_checkpoint_0.pkl"),
        (ZIP, prefix + "optimizer.bin"),
        (ZIP, prefix + "random_states_0.pkl"),
        (ZIP, prefix + "scheduler.bin"),
    ]
    assert found["checkpoints/checkpoint_4"].step is None


def test_a_save_killed_in_its_random_states_settles_for_its_zip_check_to_judge(
    tmp_path: Path,
) -> None:
    materialise(tmp_path, KILLED_IN_RANDOM_STATES)
    _, found = scan(tmp_path)
    killed = found["checkpoints/checkpoint_4"]
    assert (killed.state, killed.settles) == (WRITING, True)
    assert (ZIP, "checkpoints/checkpoint_4/random_states_0.pkl") in kinds(killed)


def test_the_job_path_may_be_the_checkpoints_directory(tmp_path: Path) -> None:
    materialise(tmp_path, KILLED_IN_OPTIMIZER, strip="checkpoints/")
    layout, found = scan(tmp_path)
    assert layout == "accelerate"
    assert states(found) == {"checkpoint_3": (WRITING, True), "checkpoint_4": (WRITING, False)}
    assert (SAFETENSORS, "checkpoint_3/model.safetensors") in kinds(found["checkpoint_3"])


def test_a_weights_write_in_flight_keeps_the_save_writing(tmp_path: Path) -> None:
    # Killed inside safetensors' save_file: the directory holds its temporary file only.
    build(tmp_path, {"checkpoints/checkpoint_0/.tmpYIzjdP": 1051976}, BASE)
    # Another rank's random_states landed while the main process still writes the weights.
    build(tmp_path, {"checkpoints/checkpoint_1/random_states_1.pkl": 14497}, BASE + 10)
    build(tmp_path, {"checkpoints/checkpoint_1/.tmp7T1rk3": 1051976}, BASE + 11)
    # A temporary file an earlier kill left, older than a later save's files: not in flight.
    build(tmp_path, {"checkpoints/checkpoint_2/.tmpetPmvU": 1051976}, BASE + 20)
    for path, (size, seconds) in KILLED_IN_OPTIMIZER.items():
        if "_3/" in path:
            build(tmp_path, {path.replace("_3/", "_2/"): size}, BASE + 30 + seconds)
    layout, found = scan(tmp_path)
    assert layout == "accelerate"
    assert states(found) == {
        "checkpoints/checkpoint_0": (WRITING, False),
        "checkpoints/checkpoint_1": (WRITING, False),
        "checkpoints/checkpoint_2": (WRITING, True),
    }


def test_another_ranks_random_states_alone_is_no_finished_save(tmp_path: Path) -> None:
    # DDP on two processes: rank 1 has nothing but its RNG state to write, and writes it while
    # the main process still gathers its state dict and turns the tensors into bytes, before
    # safetensors' temporary file exists (seconds for a large model). Settled and judged then,
    # the save was committed with no weights in it, and counted again once the main process
    # wrote them; a kill in that window read as a good checkpoint.
    build(tmp_path, {"checkpoints/checkpoint_0/random_states_1.pkl": 14497}, BASE)
    layout, found = scan(tmp_path)
    assert layout == "accelerate"
    assert states(found) == {"checkpoints/checkpoint_0": (WRITING, False)}
    build(tmp_path, {"step_100/random_states_1.pkl": 14497}, BASE)  # an explicit directory
    assert states(scan(tmp_path)[1])["step_100"] == (WRITING, False)


def test_the_first_save_is_recognised_before_its_first_file(tmp_path: Path) -> None:
    build(tmp_path, {"checkpoints/checkpoint_0/": ""})
    layout, found = scan(tmp_path)
    assert layout == "accelerate"
    assert states(found) == {"checkpoints/checkpoint_0": (WRITING, False)}


def test_explicit_directories_carry_the_step_their_name_states(tmp_path: Path) -> None:
    materialise(tmp_path, EXPLICIT_KILLED)
    # The same save under accelerate's other example name, and the user's own extras beside
    # them: a save_pretrained export and a tracker's logs are no save_state.
    for path, (size, seconds) in EXPLICIT_KILLED.items():
        if path.startswith("step_9/"):
            build(tmp_path, {path.replace("step_9/", "epoch_3/"): size}, BASE + seconds)
    build(tmp_path, {"final/config.json": 700, "final/model.safetensors": 1051976}, BASE)
    build(tmp_path, {"runs/events.out.tfevents.1": 88}, BASE + 5)
    layout, found = scan(tmp_path)
    assert layout == "accelerate"
    assert states(found) == {
        "step_9": (WRITING, True),
        "step_12": (WRITING, True),
        "step_15": (WRITING, False),
        "epoch_3": (WRITING, True),
    }
    assert {gen_id: gen.step for gen_id, gen in found.items()} == {
        "step_9": 9,
        "step_12": 12,
        "step_15": 15,
        "epoch_3": None,  # an epoch is no step
    }


def test_a_job_path_saved_into_itself_is_one_generation_without_its_logs(tmp_path: Path) -> None:
    for path, (size, seconds) in EXPLICIT_KILLED.items():
        if path.startswith("step_12/"):
            build(tmp_path, {path.removeprefix("step_12/"): size}, BASE + seconds)
    build(tmp_path, {"runs/events.out.tfevents.1": 88}, BASE + 50)  # still being written
    layout, found = scan(tmp_path)
    assert layout == "accelerate"
    assert states(found) == {".": (WRITING, True)}
    saved = found["."]
    assert saved.step is None
    assert saved.files == 5 and saved.last_write_time == BASE + 1.0612
    assert (ZIP, "optimizer.bin") in kinds(saved)


def test_fsdp_sharded_state_is_done_once_its_dcp_saves_committed(tmp_path: Path) -> None:
    # save_fsdp_model / save_fsdp_optimizer with SHARDED_STATE_DICT: DCP directories.
    shards = {
        "checkpoints/checkpoint_0/pytorch_model_fsdp_0/__0_0.distcp": 4096,
        "checkpoints/checkpoint_0/optimizer_0/__0_0.distcp": 8192,
        "checkpoints/checkpoint_0/random_states_1.pkl": 14497,
    }
    build(tmp_path, shards, BASE)
    _, found = scan(tmp_path)
    assert states(found) == {"checkpoints/checkpoint_0": (WRITING, False)}
    build(tmp_path, {"checkpoints/checkpoint_0/pytorch_model_fsdp_0/.metadata": 300}, BASE + 1)
    build(tmp_path, {"checkpoints/checkpoint_0/optimizer_0/.metadata": 300}, BASE + 2)
    build(tmp_path, {"checkpoints/checkpoint_0/random_states_0.pkl": 14497}, BASE + 3)
    _, found = scan(tmp_path)
    done = found["checkpoints/checkpoint_0"]
    assert (done.state, done.settles) == (WRITING, True)
    assert [check for check in kinds(done) if check[0] == DCP] == [
        (DCP, "checkpoints/checkpoint_0/optimizer_0"),
        (DCP, "checkpoints/checkpoint_0/pytorch_model_fsdp_0"),
    ]


def _detected(root: Path, files: dict) -> tuple[int, int, str | None]:
    """(accelerate's score, hf's score, the layout auto-detection picks)."""
    from checkpoint_exporter.sources.layouts import detect

    build(root, files)
    tree, _ = TreeReader(root, OpsBudget()).read()
    assert tree is not None
    return accelerate.detect(tree), hf.detect(tree), detect(tree)


def test_accelerate_and_the_trainer_never_take_each_others_trees(tmp_path: Path) -> None:
    saved = {
        "checkpoints/checkpoint_0/model.safetensors": 16,
        "checkpoints/checkpoint_0/optimizer.bin": 16,
        "checkpoints/checkpoint_0/random_states_0.pkl": 16,
    }
    # hf does not claim accelerate's tree, even with a final save_pretrained in the project.
    assert _detected(tmp_path / "a", saved)[1:] == (0, "accelerate")
    exported = {**saved, "config.json": 700, "model.safetensors": 16}
    assert _detected(tmp_path / "b", exported)[2] == "accelerate"
    # The Trainer's checkpoint-N (FSDP: accelerate's save_fsdp_* write optimizer_0/ and
    # pytorch_model_fsdp_0/ in it, or optimizer.bin), even under a folder named checkpoints/.
    trainer = {
        "checkpoint-5/model.safetensors": 16,
        "checkpoint-5/optimizer.bin": 16,
        "checkpoint-5/optimizer_0/__0_0.distcp": 16,
        "checkpoint-5/pytorch_model_fsdp_0/__0_0.distcp": 16,
        "checkpoint-5/rng_state_0.pth": 16,
        "checkpoint-5/trainer_state.json": b"{}",
    }
    assert _detected(tmp_path / "c", trainer) == (0, hf.TRAINER_SCORE, "hf")
    nested = {f"checkpoints/{path}": spec for path, spec in trainer.items()}
    assert _detected(tmp_path / "d", nested)[0] == 0


def test_checkpoint_n_names_alone_yield_to_writers_that_show_their_files(tmp_path: Path) -> None:
    # Orbax with the prefix "checkpoint": checkpoint_100/ with its own metadata.
    orbax = {"checkpoint_100/_CHECKPOINT_METADATA": b"{}", "checkpoint_100/default/x": 8}
    score, _, picked = _detected(tmp_path / "orbax", orbax)
    assert (score, picked) == (accelerate.ROOT_NAMES_SCORE, "orbax")


def test_random_states_0_is_restatted_when_a_save_rewrites_a_directory_in_place(
    tmp_path: Path,
) -> None:
    """save_state into a directory that exists truncates each torch.save file in place: no new
    name, so the directory's mtime does not move; a poll sees the rewrite by this marker."""
    build(tmp_path, {"pytorch_model.bin": 64, "random_states_0.pkl": 100}, BASE)
    touch(tmp_path, BASE)
    reader = TreeReader(tmp_path, OpsBudget(), marker_names=MARKER_NAMES)
    reader.read()
    with open(tmp_path / "random_states_0.pkl", "r+b") as stream:
        stream.write(b"\0" * 150)
    os.utime(tmp_path / "random_states_0.pkl", (BASE + 9, BASE + 9))
    touch(tmp_path, BASE)
    tree, _ = reader.read()
    assert tree is not None and tree.file("random_states_0.pkl") == (150, BASE + 9)
