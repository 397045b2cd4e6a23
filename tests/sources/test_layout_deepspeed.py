"""DeepSpeed's layout, on trees DeepSpeed 0.19.8 really wrote.

The listings were captured from ``engine.save_checkpoint`` (CPU accelerator, gloo, one process,
tiny model, torch Adam): the directory after each of the checkpoint engine's writes and right
after ``latest`` was opened for writing (truncated, not yet written). Names, sizes, the order of
the writes and their mtimes (milliseconds after the first one, as the kernel's coarse clock
stamped them) are DeepSpeed's; only the bytes are zeros. The live run is
tests/writers/test_deepspeed.py.
"""

from __future__ import annotations

from pathlib import Path

from checkpoint_exporter.model import COMMITTED, WRITING
from tests.helpers.trees import BASE, build, scan, touch

MODEL = "mp_rank_00_model_states.pt"
OPTIM = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
SCRIPTS = {"zero_to_fp32.py": 38580, "zero_to_torch.py": 2490}

Spec = tuple[bytes | int | str, float]  # content or size, or "" for a directory; mtime (ms)


def at(ms: float) -> float:
    return BASE + ms / 1000


def lay_out(root: Path, files: dict[str, Spec]) -> Path:
    root.mkdir()
    for relative, (spec, ms) in files.items():
        build(root, {relative: spec})
        touch(root / relative.rstrip("/"), at(ms))
    return root


def states(found: dict) -> dict[str, tuple[str, bool]]:
    return {gen_id: (gen.state, gen.settles) for gen_id, gen in found.items()}


# ZeRO-1, save_latest=True: two saves, global_step2 then global_step4 (the capture, in order).
STEP2_DIR = {"global_step2/": ("", 0.0)}
STEP2_MODEL = {f"global_step2/{MODEL}": (7129, 6.887)}
STEP2_OPTIM = {**STEP2_MODEL, f"global_step2/{OPTIM}": (16851, 8.742)}
STEP2_SCRIPTS = {"zero_to_fp32.py": (38580, 9.404), "zero_to_torch.py": (2490, 9.563)}
STEP2_TRUNCATED = {**STEP2_OPTIM, **STEP2_SCRIPTS, "latest": (b"", 9.582)}
STEP2_DONE = {**STEP2_OPTIM, **STEP2_SCRIPTS, "latest": (b"global_step2", 9.773)}
STEP4_DIR = {**STEP2_DONE, "global_step4/": ("", 9.773)}  # the same tick as `latest`
STEP4_MODEL = {**STEP2_DONE, f"global_step4/{MODEL}": (7129, 14.176)}
STEP4_OPTIM = {**STEP4_MODEL, f"global_step4/{OPTIM}": (16851, 14.84)}
STEP4_SCRIPTS = {"zero_to_fp32.py": (38580, 15.31), "zero_to_torch.py": (2490, 15.443)}
STEP4_TRUNCATED = {**STEP4_OPTIM, **STEP4_SCRIPTS, "latest": (b"", 15.474)}
STEP4_DONE = {**STEP4_OPTIM, **STEP4_SCRIPTS, "latest": (b"global_step4", 15.724)}

W, S, C = (WRITING, False), (WRITING, True), (COMMITTED, False)


def test_a_save_with_latest_commits_when_latest_names_it(tmp_path: Path) -> None:
    expected = [
        # The job's first save: no `latest` yet, so nothing marks it; it settles meanwhile.
        (STEP2_DIR, {"global_step2": W}),
        (STEP2_MODEL, {"global_step2": S}),
        (STEP2_OPTIM, {"global_step2": S}),
        # `latest` truncated by open(..., "w"): everything already there was written before it.
        (STEP2_TRUNCATED, {"global_step2": C}),
        (STEP2_DONE, {"global_step2": C}),
        # The next save, in the tick `latest` was written in: not older than the pointer.
        (STEP4_DIR, {"global_step2": C, "global_step4": W}),
        (STEP4_MODEL, {"global_step2": C, "global_step4": W}),
        (STEP4_OPTIM, {"global_step2": C, "global_step4": W}),
        (STEP4_TRUNCATED, {"global_step2": C, "global_step4": C}),
        (STEP4_DONE, {"global_step2": C, "global_step4": C}),
    ]
    for index, (files, want) in enumerate(expected):
        _, found = scan(lay_out(tmp_path / str(index), files), "deepspeed")
        assert states(found) == want, (index, sorted(files))
    _, found = scan(tmp_path / str(len(expected) - 1))
    newest, older = found["global_step4"], found["global_step2"]
    assert newest.commit_time == at(15.724) and newest.step == 4
    assert older.commit_time == at(8.742)  # its own last write: when `latest` named it is gone
    want_checks = {f"global_step4/{MODEL}", f"global_step4/{OPTIM}"}
    assert {check.path for check in newest.checks} == want_checks
    assert all(check.kind == "zip" for check in newest.checks)
    assert newest.bytes == 7129 + 16851 and newest.files == 2  # the recovery scripts are not
    assert scan(tmp_path / str(len(expected) - 1))[0] == "deepspeed"


def test_save_latest_false_settles_every_tag(tmp_path: Path) -> None:
    """ZeRO-0 with save_latest=False: model states only, and no `latest` ever."""
    files: dict[str, Spec] = {
        f"global_step2/{MODEL}": (19603, 6.885),
        "global_step4/": ("", 8.0),
    }
    layout, found = scan(lay_out(tmp_path / "a", files))
    assert layout == "deepspeed"
    assert states(found) == {"global_step2": S, "global_step4": W}
    assert [check.path for check in found["global_step2"].checks] == [f"global_step2/{MODEL}"]
    files[f"global_step4/{MODEL}"] = (19603, 12.635)
    del files["global_step4/"]
    _, found = scan(lay_out(tmp_path / "b", files))
    assert states(found) == {"global_step2": S, "global_step4": S}


def test_a_killed_save_is_writing_until_latest_names_it(tmp_path: Path) -> None:
    """The live driver's `hang`: global_step6's optimizer states half-written, `latest` left at
    global_step3. With `latest` it stays writing (the deadline aborts it); without, it settles
    and its zip checks fail."""
    killed = {
        f"global_step6/{MODEL}": (266585, 100.0),
        f"global_step6/{OPTIM}": (397262, 101.0),  # of 795091
    }
    before = {
        f"global_step3/{MODEL}": (266585, 0.0),
        f"global_step3/{OPTIM}": (795091, 1.0),
        **{name: (size, 2.0) for name, size in SCRIPTS.items()},
    }
    _, found = scan(lay_out(tmp_path / "a", {**before, "latest": (b"global_step3", 3.0), **killed}))
    assert states(found) == {"global_step3": C, "global_step6": W}
    _, found = scan(lay_out(tmp_path / "b", {**before, **killed}))
    assert states(found) == {"global_step3": S, "global_step6": S}
    assert len(found["global_step6"].checks) == 2


def test_a_run_resumed_from_an_older_tag_keeps_its_newer_tags_committed(tmp_path: Path) -> None:
    """Resumed from global_step2 after global_step4 was saved, the job saves global_step3: the
    stale global_step4 was written before `latest` was, so it is no save in progress."""
    files = {
        **STEP4_OPTIM,
        **STEP4_SCRIPTS,
        f"global_step3/{MODEL}": (7129, 90_000.0),
        f"global_step3/{OPTIM}": (16851, 90_001.0),
        "latest": (b"global_step3", 90_002.0),
    }
    _, found = scan(lay_out(tmp_path / "a", files))
    assert states(found) == {"global_step2": C, "global_step3": C, "global_step4": C}


def test_an_old_tag_stays_committed_when_its_optimizer_states_are_deleted(tmp_path: Path) -> None:
    """Users free space by deleting old optimizer states: the directory's mtime moves, the
    remaining files' do not."""
    root = lay_out(tmp_path / "a", STEP4_DONE)
    (root / "global_step2" / OPTIM).unlink()
    touch(root / "global_step2", at(60_000.0))  # a minute after `latest`
    _, found = scan(root)
    assert states(found) == {"global_step2": C, "global_step4": C}
    assert len(found["global_step2"].checks) == 1


def test_another_rank_finishing_after_latest(tmp_path: Path) -> None:
    """save_checkpoint has no barrier before rank 0 writes `latest` (engine.py): rank 1's states
    file of the tag `latest` names may be written after it."""
    files = {
        **STEP2_DONE,
        "global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt": (16851, 12.0),
    }
    _, found = scan(lay_out(tmp_path / "a", files))
    assert states(found) == {"global_step2": C}
    assert found["global_step2"].commit_time == at(12.0)


def test_latest_naming_a_missing_or_empty_tag(tmp_path: Path) -> None:
    gone = {**STEP4_DONE, "latest": (b"global_step9", 15.724)}
    _, found = scan(lay_out(tmp_path / "a", gone))
    assert states(found) == {"global_step2": C, "global_step4": C}
    _, found = scan(lay_out(tmp_path / "b", {**STEP2_OPTIM, "latest": (b"global_step2", 9.773)}))
    assert states(found) == {"global_step2": C}
    hollow = {**STEP2_DONE, "global_step4/": ("", 5.0), "latest": (b"global_step4", 9.773)}
    _, found = scan(lay_out(tmp_path / "c", hollow))
    assert states(found) == {"global_step2": C, "global_step4": C}
    assert found["global_step4"].invalid and found["global_step4"].reason == "no_states"
