"""Plain ``torch.save`` step files (torch 2.13.0): names, temporary files, detection, settling.

The trees are listings the real library left: names and sizes captured from torch 2.13.0+cpu
through tests/writers/drivers/torchsave_writer.py (``save`` three times, keep-last-2, then
``hang`` half-way through the tensor records), once writing in place and once via
``ckpt_step_N.pt.tmp`` and ``os.replace``. Where a check reads a file, its bytes are a real
torch.save file (``_REAL_ZIP``, ``_REAL_LEGACY``), never a hand-made imitation.
"""

from __future__ import annotations

import base64
import os
import zlib
from array import array
from pathlib import Path

import pytest

from checkpoint_exporter.config import Policy
from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.model import ABORTED, COMMITTED, DURABLE, WRITING, WatchedPath
from checkpoint_exporter.sources import layouts
from checkpoint_exporter.sources.layouts import torchsave
from checkpoint_exporter.sources.layouts.base import ZIP, Options
from checkpoint_exporter.sources.listing import FILE, Dir, OpsBudget, TreeReader
from checkpoint_exporter.sources.validate import BAD_ZIP, Verdict, validate
from tests.helpers.trees import BASE, build, daemon_reader, scan

# torch.save({"model": Linear(2, 2).state_dict(), "optimizer": SGD(...).state_dict(), "step": 5},
# "ckpt_step_5.pt") on torch 2.13.0+cpu (zlib-compressed, base64): 2181 bytes.
_REAL_ZIP = (
    "eNqdVd9r21YUvpYjx9GyLMuPdl3WdEu7zk1TR7JjO9lYCqZ4D4ImTSmIQtGupRtbVLZ0pKt06fAYHSmEPe9hP9iex9jD"
    "nkYptND/oC9lD33r0572OtgGu1dKjSQnadML8sXS+b7z6ZzvXK2r2SGE8nk0sKbQGDJuulT3KXH1yqKJKS66N+1GXULX"
    "++tLoQeooIkM0HFMYkPGMBzbJga1nK4vrXkm8Yh5yTKoBMK5DcgWtByLvUWsVpvCkEEdz2gX9YBati/pHmkGlm3qlHR9"
    "x9O3ShKIhYI2zBA+i8QtArkIIjVsB9Or0U0JhrUMi5Ehr2XZbrgBjKhDFKQrKlIFVbgLr7EtcxdGd9tcxesUxjbgDY29"
    "Ompa2IfxNsvTzrUjHgXebI+oAoWJEL8Dk2pmB6Yi7DSFYxtwPOjBW9oIC9Y7hGJeHDgRPn9b49WDmR68EwrfIp7PagEn"
    "1Yzv+80Q47jU6li3iQezPTgVlc+nmBJ4twfvaaPsr4s93NFbnhO4PszdgNM9OFPQBPbE9uD9Ty7e+5av77R8WPkO6dKg"
    "A2dVFPKbuOOSrtVtwQfszmi/4LpJDLwNBXaT47qE9dZztuDcbsSDPwtlwfxuKH3T8Qg22nD+sjbGWa3NTdbNLrVw0yaw"
    "sBvq3gx8YsKFy2FfQ9U+FG/AIkuiZkiAg7DK3EQgq2JQXFeH8/9h8ZsSexd+rR/owBkkJhxYZHo6mOp7FW3UM+i6wul+"
    "/+vpV7xv/DqYbhaVk3R7ltKxbbW6vIKN+mLM2i+1qktcwMVb8CdvjXCogGn0UUJAc5sShw9Io147at7ny7YotQnXsPPx"
    "sxO8BblDNUygDwemelFu1KuvKGBu+9f7P1Qfrf7279TDk8viQ67kzj9ffD/Oco2/QIk8qERp1BeOpOSJ+/WDX+brqzzv"
    "z2tnV3mi/KF5J1EtkbfvpvKrlKAs8cyPf2xde3H/51AxacDwlX3iWcyBtzE/MXXLbNTnjyBErlQVRV6ulMpVZaVakyul"
    "lSWlUl1hv8tLK3JNKdUqFbksc5Wfrz36qcB0FEKVGS62rzM+kVMDyvf7DqQZ4kM4k0DfEdBhc5wmig/TbILocZpoYILT"
    "XPGhmE5wbWTR/sOYpoi7eSJB8SSL9pmlND7uyiT+06F98EoaH/fWZAL/Rwp/QD3jbZ9L1kBEL2HIdTWXW3h+hmYv9NH5"
    "1H5eiPa/xWhnOP4RQaf3AqLTWcxFmHwYH8X+D5ZK+U8="
)
REAL_ZIP = zlib.decompress(base64.b64decode(_REAL_ZIP))
# The same state saved with _use_new_zipfile_serialization=False (the pre-1.6 format): 817 bytes.
_REAL_LEGACY = (
    "eNptks1O1UAYhtueH6ACouIPKor4V1CPiCjnbDAxBhcTUXEzG9LMaeecjmk7/WamKCZN2EA8egUaLsDEuHBpTCTxIrwH"
    "L8GEhdM54Ea6aNN3vu/93plnNp13bry3s/xn6uWnZxONTefJ74p+F2B5eMyyrExwxQMe++tUSMZTsHUBHtErMVMqpj5N"
    "Q0ZScN5iV4tqI6O+ZG+ohEoBVQ/XtCgjLhTUkIMr+o+lCuqoiqulB0+7MICqeX4ws6xPeEhjsAM9NqaB0lOl+1SEVNDw"
    "EQuUC87MKlQ8XNe1ryjrRgqqgeIiiBp+rlgsXV/Qds7i0Fc0lVz46/Mu1DwPD5RpdCXpUqj3W9zlmBP1oi+6MIBHdU1r"
    "YbHVbN2515xbnF9owqAJHmQ5DKHqigL3ObKQg5xtOKI/9jYM96Iy04iC0VU4arbWZkTCWKSnRvXoP9e7rXk4Fg0hR7sd"
    "N25bcALZWzDedzqp4NQqnM4LOIOHdKufUEVCoghMmPWzWIsWnCvgvNnUAZ1JZEsp26aHZ4olGoWACwVc3EehiKIwVcAl"
    "PFzSJYIkflfwPJMwvQaXC7jiYackI+Dq4wffPpTPRzxoqCQ0VXkC15Bl/EOSZDRlmuB1rQz/g+GHNCAb4Gmx7EupVFTw"
    "dZjp9X3IaxMLZnsmeocLSoIIbqyYQwpZp6NJp4qRdkzhZs/k7uSShnBrxTA3qSU01uC2HoJsmpPcnLkelMEcqpW3aa28"
    "TYewtA9D4dBG2V8+0xtfvu/c/7n0dW98d7JZ23X29V/Z+x+fZx8u/QUJXuVf"
)
REAL_LEGACY = zlib.decompress(base64.b64decode(_REAL_LEGACY))

# What the real runs left (tests/writers/test_torchsave.py's scenario), sizes as written.
IN_PLACE_KILLED = {  # keep-last-2 after steps 5, 10, 15; step 20 killed inside torch.save
    "ckpt_step_10.pt": 6312737,
    "ckpt_step_15.pt": 6312737,
    "ckpt_step_20.pt": 4202304,  # half a zip under its final name
}
REPLACE_KILLED = {  # the same via ckpt_step_N.pt.tmp and os.replace
    "ckpt_step_10.pt": 6312803,
    "ckpt_step_15.pt": 6312803,
    "ckpt_step_20.pt.tmp": 4202304,  # half a zip under the temporary name, never renamed
}


def kinds(found: dict) -> dict[str, list[str]]:
    return {gen_id: [check.kind for check in gen.checks] for gen_id, gen in found.items()}


# --- names ------------------------------------------------------------------------------------

STEP_NAMES = {
    "ckpt_step_50.pt": 50,
    "step-50.pt": 50,
    "step50.pt": 50,
    "checkpoint_50.pth": 50,
    "model_000050.pt": 50,
    "iter_50.pt": 50,
    "iteration-50.pt": 50,
    "global_step50.pt": 50,
    "epoch=3-step=50.pt": 50,  # the step, not the epoch
    "epoch_3.pt": 3,  # a trailing number is all there is
    "50.pt": 50,
    "checkpoint_50.pth.tar": 50,  # the ImageNet example's suffix
}
NOT_CHECKPOINTS = [
    "last.pt",  # no step: its pickle would have to be read
    "best.pth",
    "model.pt",
    "resnet50.pt",  # digits glued to a word are a name, not a step
    "model_v2.pt",
    "ckpt_step_50.ckpt",  # Lightning's suffix: its layout reads it
    "ckpt_step_50.bin",  # any binary
    "ckpt_step_50.tar",
    "ckpt_step_50.pt.bak",
    "notes_50.txt",
    "tmpab12cdef",  # mkstemp without a torch suffix: anybody's
]
TEMPORARY_NAMES = {
    "ckpt_step_50.pt.tmp": "ckpt_step_50.pt",
    "ckpt_step_50.pt.tmp.4711": "ckpt_step_50.pt",
    "ckpt_step_50.pt.temp": "ckpt_step_50.pt",
    "ckpt_step_50.pt.partial": "ckpt_step_50.pt",
    "ckpt_step_50.pt.part": "ckpt_step_50.pt",
    "ckpt_step_50.pt.incomplete": "ckpt_step_50.pt",
    "ckpt_step_50.pt~": "ckpt_step_50.pt",
    "ckpt_step_50.tmp.pt": "ckpt_step_50.pt",
    "ckpt_step_50_tmp.pt": "ckpt_step_50.pt",
    "tmp_ckpt_step_50.pt": "ckpt_step_50.pt",
    "tmp-step-50.pt": "step-50.pt",
    ".ckpt_step_50.pt": "ckpt_step_50.pt",
    ".ckpt_step_50.pt.partial": "ckpt_step_50.pt",
    ".ckpt_step_50.pt.Xy3kQ9": "ckpt_step_50.pt",  # rsync's temporary name
    "tmpk3_x9qzw.pt": None,  # tempfile.mkstemp(dir=root, suffix=".pt"): step unknown
}


def test_the_step_is_read_from_the_name() -> None:
    assert {name: torchsave.classify(name) for name in STEP_NAMES} == {
        name: (torchsave.FINAL, name) for name in STEP_NAMES
    }
    assert {name: torchsave.step_of(name) for name in STEP_NAMES} == STEP_NAMES
    assert {name: torchsave.classify(name) for name in NOT_CHECKPOINTS} == dict.fromkeys(
        NOT_CHECKPOINTS
    )


def test_temporary_names_name_the_file_they_become() -> None:
    assert {name: torchsave.classify(name) for name in TEMPORARY_NAMES} == {
        name: (torchsave.TEMPORARY, final) for name, final in TEMPORARY_NAMES.items()
    }
    # The temporary form of a name that is no checkpoint is nothing either.
    for name in ("last.pt.tmp", ".model.pt", "tmp_best.pth", "notes.tmp"):
        assert torchsave.classify(name) is None, name
    # What the listing re-statts in the root: exactly the names the layout reads.
    assert all(torchsave.is_root_marker(name) for name in [*STEP_NAMES, *TEMPORARY_NAMES])
    assert not any(torchsave.is_root_marker(name) for name in NOT_CHECKPOINTS)


# --- the layout --------------------------------------------------------------------------------


def test_files_written_in_place_settle_and_a_killed_one_is_a_half_zip(tmp_path: Path) -> None:
    build(tmp_path, IN_PLACE_KILLED, BASE)
    layout, found = scan(tmp_path)
    assert layout == "torchsave"
    assert {gen_id: gen.step for gen_id, gen in found.items()} == {
        "ckpt_step_10.pt": 10,
        "ckpt_step_15.pt": 15,
        "ckpt_step_20.pt": 20,
    }
    # No commit marker: the file grows under its final name, so each one settles.
    assert all(gen.state == WRITING and gen.settles for gen in found.values())
    assert kinds(found) == {name: [ZIP] for name in IN_PLACE_KILLED}
    assert {gen_id: gen.bytes for gen_id, gen in found.items()} == IN_PLACE_KILLED


def test_a_file_still_uploading_to_object_storage_never_settles() -> None:
    """The S3 connector's ``torch.save`` is a multipart upload at the final key: the object
    listing shows the open upload as a file marked uploading, a save in progress however still
    its size stands; the object beside it, whole, settles as on a filesystem."""
    names = ("step-3.pt", "step-6.pt")
    root = Dir(
        int(BASE * 1e9), names, FILE * 2, array("q", [1000, 8 * 2**20]),
        array("d", [BASE, BASE]), uploading=frozenset({"step-6.pt"}),
    )  # fmt: skip
    found = {gen.id: gen for gen in torchsave.parse(root, Options())}
    assert {gen_id: (gen.state, gen.settles) for gen_id, gen in found.items()} == {
        "step-3.pt": (WRITING, True),
        "step-6.pt": (WRITING, False),
    }
    assert (found["step-6.pt"].step, found["step-6.pt"].bytes) == (6, 8 * 2**20)


def test_a_temporary_file_is_a_save_in_progress_under_its_final_name(tmp_path: Path) -> None:
    build(tmp_path, REPLACE_KILLED, BASE)
    layout, found = scan(tmp_path)
    assert layout == "torchsave"
    assert set(found) == {"ckpt_step_10.pt", "ckpt_step_15.pt", "ckpt_step_20.pt"}
    in_progress = found["ckpt_step_20.pt"]  # the .tmp file: the rename continues it
    assert (in_progress.state, in_progress.settles, in_progress.checks) == (WRITING, False, ())
    assert (in_progress.step, in_progress.bytes, in_progress.files) == (20, 4202304, 1)
    assert found["ckpt_step_15.pt"].settles and kinds(found)["ckpt_step_15.pt"] == [ZIP]


def test_a_temporary_file_beside_its_final_name_keeps_its_own(tmp_path: Path) -> None:
    """A step saved again (a resumed run) via a temporary file: the final file stays what it
    was until the rename; the temporary file is a save in progress of its own."""
    build(
        tmp_path,
        {
            "ckpt_step_15.pt": 6312803,
            "ckpt_step_15.pt.tmp": 1000,
            ".ckpt_step_20.pt.partial": 10,
            "ckpt_step_20.pt.tmp": 20,  # two temporary files for one name: the first takes it
            "tmpk3_x9qzw.pt": 30,
        },
        BASE,
    )
    _, found = scan(tmp_path)
    assert {gen_id: (gen.step, gen.settles) for gen_id, gen in found.items()} == {
        "ckpt_step_15.pt": (15, True),
        "ckpt_step_15.pt.tmp": (15, False),
        "ckpt_step_20.pt": (20, False),  # .ckpt_step_20.pt.partial sorts first
        "ckpt_step_20.pt.tmp": (20, False),
        "tmpk3_x9qzw.pt": (None, False),
    }
    assert found["ckpt_step_20.pt"].bytes == 10


def test_names_without_a_step_symlinks_and_directories_are_no_generations(tmp_path: Path) -> None:
    build(
        tmp_path,
        {
            "ckpt_step_5.pt": 8,
            "last.pt": 8,
            "best.pth": 8,
            "latest.pt": "->ckpt_step_5.pt",
            "step_9.pt/": "",
            "notes.txt": 3,
        },
        BASE,
    )
    _, found = scan(tmp_path)
    assert set(found) == {"ckpt_step_5.pt"}


def test_only_the_root_is_read(tmp_path: Path) -> None:
    """Step files in a subdirectory are another tree's (a job's path is its checkpoint dir)."""
    build(tmp_path, {"ckpt_step_5.pt": 8, "old/ckpt_step_1.pt": 8}, BASE)
    _, found = scan(tmp_path)
    assert set(found) == {"ckpt_step_5.pt"}


# --- detection ---------------------------------------------------------------------------------

# Trees whose .pt files lie inside generation directories: never torch.save step files.
OTHER_WRITERS = {
    "deepspeed": {
        "global_step10/mp_rank_00_model_states.pt": 8,
        "global_step10/zero_pp_rank_0_mp_rank_00_optim_states.pt": 8,
        "latest": b"global_step10",
        "zero_to_fp32.py": 8,
    },
    "megatron": {  # the legacy format: mp_rank_*/model_optim_rng.pt
        "iter_0000010/mp_rank_00/model_optim_rng.pt": 8,
        "latest_checkpointed_iteration.txt": b"10",
    },
    "hf": {
        "checkpoint-10/optimizer.pt": 8,
        "checkpoint-10/scheduler.pt": 8,
        "checkpoint-10/rng_state.pth": 8,
        "checkpoint-10/model.safetensors": 8,
        "checkpoint-10/trainer_state.json": b"{}",
    },
    "torchtitan": {"checkpoint/step-10/__0_0.distcp": 8, "checkpoint/step-10/.metadata": 8},
    "lightning": {"epoch=0-step=10.ckpt": 8, "epoch=0-step=10.pt": 8},  # .ckpt decides
    "dcp": {"step-10/__0_0.distcp": 8, "step-10/.metadata": 8, "model_step_10.pt": 8},
}


@pytest.mark.parametrize("writer", OTHER_WRITERS)
def test_other_writers_trees_are_not_taken(tmp_path: Path, writer: str) -> None:
    build(tmp_path, OTHER_WRITERS[writer], BASE)
    assert scan(tmp_path)[0] == writer


def test_nested_pt_files_score_nothing(tmp_path: Path) -> None:
    for writer in ("deepspeed", "megatron", "hf", "torchtitan"):
        root = tmp_path / writer
        build(root, OTHER_WRITERS[writer], BASE)
        tree, _ = TreeReader(root, OpsBudget(), layouts.ALL_CONTENT_FILES).read()
        assert tree is not None
        assert torchsave.detect(tree) == 0, writer
        assert torchsave.parse(tree, Options()) == [], writer


def test_a_first_save_in_progress_is_detected_from_its_temporary_file(tmp_path: Path) -> None:
    build(tmp_path, {"ckpt_step_5.pt.tmp": 100}, BASE)
    layout, found = scan(tmp_path)
    assert layout == "torchsave"
    assert found["ckpt_step_5.pt"].state == WRITING
    # A mkstemp name alone says nothing of a step nor a writer.
    other = tmp_path / "other"
    build(other, {"tmpk3_x9qzw.pt": 100}, BASE)
    tree, _ = TreeReader(other, OpsBudget()).read()
    assert tree is not None and torchsave.detect(tree) == 0


# --- validation --------------------------------------------------------------------------------


def test_a_real_file_is_whole_and_one_cut_short_is_not(tmp_path: Path) -> None:
    cut = IN_PLACE_KILLED["ckpt_step_20.pt"] / IN_PLACE_KILLED["ckpt_step_15.pt"]
    build(
        tmp_path,
        {"ckpt_step_5.pt": REAL_ZIP, "ckpt_step_10.pt": REAL_ZIP[: int(len(REAL_ZIP) * cut)]},
        BASE,
    )
    _, found = scan(tmp_path)
    got = {gen_id: validate(str(tmp_path), gen.checks) for gen_id, gen in found.items()}
    assert got["ckpt_step_5.pt"] == Verdict(True)
    assert (got["ckpt_step_10.pt"].valid, got["ckpt_step_10.pt"].reason) == (False, BAD_ZIP)


def test_the_legacy_format_has_no_end_record_and_is_not_judged_whole(tmp_path: Path) -> None:
    """_use_new_zipfile_serialization=False: nothing tells a whole file from one cut short
    without unpickling it, so it fails the zip check (the module's docstring says why)."""
    build(tmp_path, {"ckpt_step_5.pt": REAL_LEGACY}, BASE)
    _, found = scan(tmp_path)
    verdict = validate(str(tmp_path), found["ckpt_step_5.pt"].checks)
    assert (verdict.valid, verdict.reason) == (False, BAD_ZIP)


# --- the root's files are re-statted: they grow in place -----------------------------------------


def grow(path: Path, size: int) -> None:
    with open(path, "ab") as handle:  # the same inode: no directory's mtime moves
        handle.write(b"z" * size)


def test_a_step_file_growing_in_place_is_seen_growing(tmp_path: Path) -> None:
    """A poll sees no directory change while torch.save writes; the root's step files and
    temporary files are re-statted on every read, .pt files inside generation directories
    (DeepSpeed's states, one per rank) are not."""
    files = ("ckpt_step_5.pt", "ckpt_step_10.pt.tmp", "global_step5/x_states.pt")
    build(tmp_path, dict.fromkeys(files, 10))
    tree_reader = daemon_reader(tmp_path)
    tree_reader.read()
    root_mtime = os.stat(tmp_path).st_mtime_ns
    for name in files:
        grow(tmp_path / name, 5000)
    assert os.stat(tmp_path).st_mtime_ns == root_mtime
    tree, stats = tree_reader.read()
    assert tree is not None and stats.listed == 0
    assert tree.file("ckpt_step_5.pt")[0] == 5010
    assert tree.file("ckpt_step_10.pt.tmp")[0] == 5010
    assert tree.subdirs["global_step5"].file("x_states.pt")[0] == 10  # not a marker there


# --- through the tracker -----------------------------------------------------------------------

T = 1_800_000_000.0


def job() -> JobTracker:
    policy = Policy(deadline=30, settle=5, abort_after=30)
    return JobTracker("j", (WatchedPath(DURABLE, "/x"),), policy)


def observe(tracker: JobTracker, root: Path, now: float) -> list:
    tree, _ = TreeReader(root, OpsBudget()).read()
    assert tree is not None
    return tracker.observe(DURABLE, torchsave.parse(tree, Options()), now).requests


def at(path: Path, size: int, mtime: float) -> None:
    with open(path, "wb") as handle:
        handle.write(b"z" * size)
    os.utime(path, (mtime, mtime))


def test_a_renamed_save_is_one_commit_timed_from_its_temporary_file(tmp_path: Path) -> None:
    tracker = job()
    observe(tracker, tmp_path, T)
    temporary, final = tmp_path / "ckpt_step_5.pt.tmp", tmp_path / "ckpt_step_5.pt"
    at(temporary, 100, T + 1)
    assert observe(tracker, tmp_path, T + 1) == []
    at(temporary, 900, T + 4)
    observe(tracker, tmp_path, T + 4)
    # Still for longer than settle, but a temporary name is never judged: no request.
    assert observe(tracker, tmp_path, T + 20) == []
    os.replace(temporary, final)  # size and mtime kept
    (request,) = observe(tracker, tmp_path, T + 21)  # still since T + 4: judged at once
    tracker.submitted(request)
    tracker.apply_verdict(request, Verdict(True))
    state = tracker.state()
    (generation,) = state.generations
    assert (generation.id, generation.state, generation.step) == ("ckpt_step_5.pt", COMMITTED, 5)
    assert (state.saves_committed, state.saves_aborted) == (1, 0)
    # Its duration runs from the temporary file's first sighting to its last write.
    assert dict(state.save_duration)["total"].count == 1
    assert dict(state.last_phases)["total"] == pytest.approx(3.0)  # T + 1 to T + 4


def test_a_killed_temporary_file_is_one_abort_and_retention_none(tmp_path: Path) -> None:
    tracker = job()
    at(tmp_path / "ckpt_step_5.pt", 900, T - 100)
    at(tmp_path / "ckpt_step_10.pt", 900, T - 50)
    (first, second) = observe(tracker, tmp_path, T)  # history, judged at once
    for request in (first, second):
        tracker.apply_verdict(request, Verdict(True))
    at(tmp_path / "ckpt_step_15.pt.tmp", 400, T + 1)  # the kill: it never moves again
    observe(tracker, tmp_path, T + 1)
    tracker.tick(T + 30)
    assert tracker.state().saves_aborted == 0
    tracker.tick(T + 31.1)
    state = tracker.state()
    assert (state.saves_aborted, state.saves_committed) == (1, 0)
    assert {g.id: g.state for g in state.generations} == {
        "ckpt_step_5.pt": COMMITTED,
        "ckpt_step_10.pt": COMMITTED,
        "ckpt_step_15.pt": ABORTED,
    }
    os.remove(tmp_path / "ckpt_step_5.pt")  # keep-last-2: a deletion, not an abort
    observe(tracker, tmp_path, T + 40)
    tracker.tick(T + 100)
    state = tracker.state()
    assert state.saves_aborted == 1
    assert {g.id for g in state.generations} == {"ckpt_step_10.pt", "ckpt_step_15.pt"}
