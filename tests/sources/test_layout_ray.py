"""Ray Train's layout, on trees Ray 2.60 really wrote.

The listings were captured from a real run (tests/writers/drivers/ray_writer.py: Train V2
``TorchTrainer``, one CPU worker, ``CheckpointConfig(num_to_keep=2)``) with the system calls of
the worker and the controller traced: the directory names, the files and their sizes, the
snapshot's JSON, and the order and times of the writes (seconds after the first one; the
kernel's coarse clock stamps files a few milliseconds apart) are Ray's; only the files' bytes
are zeros. Where a state lasted a microsecond (the snapshot truncated, a retention delete
half-done) it is the capture cut at that system call. The live run is tests/writers/test_ray.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from checkpoint_exporter.config import Policy
from checkpoint_exporter.core.tracker import JobTracker
from checkpoint_exporter.model import ABORTED, COMMITTED, DURABLE, WRITING, WatchedPath
from checkpoint_exporter.sources.layouts.base import SAFETENSORS, ZIP
from tests.helpers.trees import BASE, build, scan, touch

A = "checkpoint_2026-12-02_12-53-14.739337"
B = "checkpoint_2026-12-02_12-53-20.210183"
C = "checkpoint_2026-12-02_12-53-23.344714"
D = "checkpoint_2026-12-02_12-53-25.389996"
E = "checkpoint_2026-12-02_12-53-26.525970"  # the killed upload
MODEL, OPTIMIZER = 1053833, 2107939  # torch.save of the driver's model and AdamW state
SNAPSHOT = "checkpoint_manager_snapshot.json"
MARKER = ".validate_storage_marker"

Spec = tuple[bytes | int | str, float]  # content or size, or "" for a directory; seconds


def at(seconds: float) -> float:
    return BASE + seconds


def snapshot(*results: tuple[str, int], latest: str | None = None) -> bytes:
    """The JSON ``CheckpointManager._save_state`` writes, keys in Ray's order."""

    def result(name: str, step: int) -> dict:
        return {"version": 0, "checkpoint_dir_name": name, "metrics": {"step": step}}

    latest_step = dict(results)[latest] if latest else None
    return json.dumps(
        {
            "ray_version": "2.60.0",
            "checkpoint_results": [result(n, s) for n, s in results],
            "checkpoint_report_indices": list(range(len(results))),
            "latest_checkpoint_result": result(latest, latest_step) if latest else None,
            "pending_training_results": [],
            "pending_validation_specs": [],
            "current_report_index": len(results),
            "validated_checkpoint_dir_names": [],
            "timed_out_validation_checkpoint_dir_names": [],
            "failed_validation_checkpoint_dir_names": [],
        },
        separators=(",", ":"),
    ).encode()


def checkpoint(
    name: str, made: float, model_at: float, optimizer_at: float, optimizer: int = OPTIMIZER
) -> dict:
    """``create_dir``, then pyarrow's copy: both files opened O_TRUNC under their final names."""
    return {
        f"{name}/": ("", made),
        f"{name}/model.pt": (MODEL, model_at),
        f"{name}/optimizer.pt": (optimizer, optimizer_at),
    }


def lay_out(root: Path, files: dict[str, Spec]) -> Path:
    root.mkdir()
    for relative, (spec, _) in files.items():
        build(root, {relative: spec})
    # Directories last: creating their files moved their mtimes.
    for relative, (_, seconds) in sorted(files.items(), key=lambda item: -len(item[0])):
        touch(root / relative.rstrip("/"), at(seconds))
    return root


def states(found: dict) -> dict[str, tuple[str, bool]]:
    return {gen_id: (gen.state, gen.settles) for gen_id, gen in found.items()}


W, S, C_, X = (WRITING, False), (WRITING, True), (COMMITTED, False), (ABORTED, False)

START = {MARKER: (b"", 0.0)}
A_DIR = {**START, f"{A}/": ("", 4.801)}
A_DONE = {**START, **checkpoint(A, 4.801, 4.833, 4.833)}
SNAP_A = {**A_DONE, SNAPSHOT: (snapshot((A, 5), latest=A), 6.82)}
B_DONE = {**SNAP_A, **checkpoint(B, 10.217, 10.225, 10.225)}
# The controller's open_output_stream: O_TRUNC, then one write of the whole JSON.
SNAP_B_TRUNCATED = {**B_DONE, SNAPSHOT: (b"", 12.234)}
SNAP_B = {**B_DONE, SNAPSHOT: (snapshot((A, 5), (B, 10), latest=B), 12.234)}
C_HALF = {**SNAP_B, f"{C}/": ("", 13.372), f"{C}/model.pt": (MODEL // 2, 13.380)}
C_DONE = {**SNAP_B, **checkpoint(C, 13.372, 13.393, 13.393)}
# num_to_keep=2: the snapshot without A first, then delete_dir(A), file by file.
SNAP_C = {**C_DONE, SNAPSHOT: (snapshot((B, 10), (C, 15), latest=C), 14.261)}
A_DELETING = {
    **{k: v for k, v in SNAP_C.items() if not k.startswith(A)},
    f"{A}/": ("", 14.264),
    f"{A}/optimizer.pt": (OPTIMIZER, 4.833),
}
A_EMPTY = {**{k: v for k, v in SNAP_C.items() if not k.startswith(A)}, f"{A}/": ("", 14.264)}
A_GONE = {k: v for k, v in SNAP_C.items() if not k.startswith(A)}
D_DONE = {**A_GONE, **checkpoint(D, 15.409, 15.425, 15.445)}
SNAP_D = {
    **{k: v for k, v in D_DONE.items() if not k.startswith(B)},
    SNAPSHOT: (snapshot((C, 15), (D, 20), latest=D), 16.281),
}
# The killed upload: model.pt whole, optimizer.pt half-written, never registered.
KILLED = {**SNAP_D, **checkpoint(E, 16.637, 16.609, 16.643, optimizer=1053969)}


def test_a_checkpoint_commits_when_the_snapshot_names_it(tmp_path: Path) -> None:
    expected = [
        (A_DIR, {A: W}),  # the first upload, before any snapshot: no registration yet
        (A_DONE, {A: W}),
        (SNAP_A, {A: C_}),
        (B_DONE, {A: C_, B: W}),
        # Caught between the truncation and the write: nothing to read, so both settle (and
        # the tracker keeps a committed one committed while it does not move).
        (SNAP_B_TRUNCATED, {A: S, B: S}),
        (SNAP_B, {A: C_, B: C_}),
        (C_HALF, {A: C_, B: C_, C: W}),
        (C_DONE, {A: C_, B: C_, C: W}),
        # A dropped from the snapshot, still on disk: written before C, no save in progress.
        (SNAP_C, {A: X, B: C_, C: C_}),
        (A_DELETING, {A: X, B: C_, C: C_}),
        (A_GONE, {B: C_, C: C_}),
        (D_DONE, {B: C_, C: C_, D: W}),
        (SNAP_D, {C: C_, D: C_}),
        (KILLED, {C: C_, D: C_, E: W}),  # the deadline aborts it
    ]
    for index, (files, want) in enumerate(expected):
        layout, found = scan(lay_out(tmp_path / str(index), files))
        assert layout == "ray", index
        assert states(found) == want, (index, sorted(files))
    found = scan(tmp_path / str(expected.index((SNAP_D, {C: C_, D: C_}))))[1]
    newest, older = found[D], found[C]
    assert (newest.step, older.step) == (20, 15)
    assert newest.commit_time == at(16.281)  # the snapshot's rewrite for it
    assert older.commit_time == at(13.393)  # its own last write: the rewrite naming it is gone
    assert newest.bytes == MODEL + OPTIMIZER and newest.files == 2
    assert [(c.kind, c.path) for c in newest.checks] == [
        (ZIP, f"{D}/model.pt"),
        (ZIP, f"{D}/optimizer.pt"),
    ]


def test_an_upload_never_registered_is_aborted_once_a_later_checkpoint_is(tmp_path: Path) -> None:
    # The run resumed from D after the kill and registered F: E stays behind, never named.
    f = "checkpoint_2026-12-02_13-10-00.000001"
    resumed = {
        **{k: v for k, v in KILLED.items() if not k.startswith(C)},
        **checkpoint(f, 1020.0, 1020.1, 1020.2),
        SNAPSHOT: (snapshot((D, 20), (f, 25), latest=f), 1022.0),
    }
    _, found = scan(lay_out(tmp_path / "resumed", resumed))
    assert states(found) == {D: C_, E: X, f: C_}
    assert D in (found[E].reason or "") or f in (found[E].reason or "")


def test_the_next_upload_while_the_previous_registers_is_in_progress(tmp_path: Path) -> None:
    # The controller registers C while the worker already uploads D (registration follows the
    # upload by up to the controller's poll): D, begun after C's files, is a save in progress.
    files = {**C_DONE, f"{D}/": ("", 13.9), f"{D}/model.pt": (MODEL // 4, 14.0)}
    files[SNAPSHOT] = (snapshot((B, 10), (C, 15), latest=C), 14.261)
    _, found = scan(lay_out(tmp_path / "overlap", files))
    assert states(found)[D] == W and states(found)[C] == C_


def test_an_unreadable_snapshot_makes_every_checkpoint_settle(tmp_path: Path) -> None:
    many = [(f"checkpoint_2026-01-01_00-00-00.{i:06d}", i) for i in range(700)]
    big = snapshot(*many, latest=many[-1][0])
    assert len(big) > 64 * 1024  # num_to_keep=None, hundreds of checkpoints: over the limit
    for name, content in {
        "over-limit": big,
        "not-json": b"{not json",
        "another-schema": b'{"checkpoints": ["' + A.encode() + b'"]}',
        "a-list": b"[]",
    }.items():
        _, found = scan(lay_out(tmp_path / name, {**A_DONE, SNAPSHOT: (content, 6.82)}), "ray")
        assert states(found) == {A: S}, name
        assert [c.kind for c in found[A].checks] == [ZIP, ZIP]


def test_the_step_is_the_reported_metric(tmp_path: Path) -> None:
    def with_metrics(metrics: object) -> dict:
        document = json.loads(snapshot((A, 0), latest=A))
        for result in (document["checkpoint_results"][0], document["latest_checkpoint_result"]):
            result["metrics"] = metrics
        return {**A_DONE, SNAPSHOT: (json.dumps(document).encode(), 6.82)}

    for index, (metrics, step) in enumerate(
        [
            ({"step": 7, "training_iteration": 3}, 7),
            ({"training_iteration": 3, "loss": 0.5}, 3),  # Train V1's and Tune's name
            ({"loss": 0.5}, None),  # nothing reported: Ray keeps no step of its own
            ({"step": -1}, None),
            ({"step": True}, None),
            ({"step": 2**53}, 2**53),
            ({"step": 2**53 + 1}, None),  # past what a float sample holds exactly
            ({"step": 7.5}, None),
            ([7], None),
        ]
    ):
        _, found = scan(lay_out(tmp_path / str(index), with_metrics(metrics)), "ray")
        assert states(found) == {A: C_} and found[A].step == step, metrics


def test_names_the_snapshot_gives_and_what_else_is_in_the_run_directory(tmp_path: Path) -> None:
    files = {
        **START,
        "epoch_3/": ("", 4.0),  # report(checkpoint_dir_name="epoch_3")
        "epoch_3/checkpoint/model.safetensors": (640, 4.1),  # Ray's Transformers callback
        "epoch_3/checkpoint/optimizer.pt": (1280, 4.1),
        "epoch_3/checkpoint/trainer_state.json": (90, 4.1),
        "epoch_4/": ("", 9.0),  # a custom name not registered yet: not known to be Ray's
        "epoch_4/model.pt": (640, 9.1),
        "hang_detector/": ("", 5.0),  # NCCL RAS diagnostics, no checkpoint
        "hang_detector/nccl/report.txt": (10, 5.0),
        SNAPSHOT: (snapshot(("epoch_3", 30), ("../../etc", 31), latest="epoch_3"), 6.0),
    }
    _, found = scan(lay_out(tmp_path / "custom", files))
    assert states(found) == {"epoch_3": C_}
    assert found["epoch_3"].step == 30
    assert sorted((c.kind, c.path) for c in found["epoch_3"].checks) == [
        (SAFETENSORS, "epoch_3/checkpoint/model.safetensors"),
        (ZIP, "epoch_3/checkpoint/optimizer.pt"),
    ]


def test_detection(tmp_path: Path) -> None:
    from checkpoint_exporter.sources.layouts import detect
    from checkpoint_exporter.sources.listing import OpsBudget, TreeReader

    def detected(files: dict) -> str | None:
        root = lay_out(tmp_path / str(len(list(tmp_path.iterdir()))), files)
        tree, _ = TreeReader(root, OpsBudget(), {SNAPSHOT}).read()
        return detect(tree)

    assert detected(START) is None  # a run that saved nothing yet: no generation either way
    assert detected(A_DIR) == "ray"
    assert detected(SNAP_D) == "ray"
    assert detected({SNAPSHOT: (b"", 1.0)}) == "ray"
    # A plain directory of checkpoint_N folders is not Ray's without Ray's files.
    assert detected({"checkpoint_0/model.safetensors": (8, 1.0)}) != "ray"
    # What users report as a Ray checkpoint is often another writer's directory: a
    # save_pretrained model and Accelerate's save_state files. Once registered, Ray's record
    # decides (before the first registration those writers' settling directories win).
    registered = {
        **START,
        f"{A}/": ("", 4.801),
        f"{A}/config.json": (700, 4.81),
        f"{A}/model.safetensors": (4096, 4.82),
        f"{A}/optimizer.bin": (8192, 4.83),
        f"{A}/random_states_0.pkl": (900, 4.833),
        SNAPSHOT: (snapshot((A, 5), latest=A), 6.82),
    }
    assert detected(registered) == "ray"


def test_the_tracker_counts_each_registration_once_and_retention_never(tmp_path: Path) -> None:
    """The capture's states in order through the tracker: four commits, no abort while
    num_to_keep deletes, the killed upload one abort once it stood still past abort_after."""
    tracker = JobTracker("j", (WatchedPath(DURABLE, "/x"),), Policy(deadline=10, abort_after=10))
    sequence = [
        A_DIR, A_DONE, SNAP_A, B_DONE, SNAP_B_TRUNCATED, SNAP_B, C_HALF, C_DONE, SNAP_C,
        A_DELETING, A_EMPTY, A_GONE, D_DONE, SNAP_D, KILLED,
    ]  # fmt: skip
    tracker.observe(DURABLE, [], at(-1.0))
    committed = []
    for index, files in enumerate(sequence):
        _, found = scan(lay_out(tmp_path / str(index), files), "ray")
        now = max(seconds for _, seconds in files.values()) + 0.01
        tracker.observe(DURABLE, list(found.values()), at(now))
        tracker.tick(at(now))
        state = tracker.state()
        committed.append(state.saves_committed)
        assert state.saves_aborted == 0, index
    assert committed == [0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 4, 4]
    state = tracker.state()
    assert sorted(g.id for g in state.generations if g.state == COMMITTED) == [C, D]
    assert [g.id for g in state.generations if g.state == WRITING] == [E]
    tracker.tick(at(16.643 + 10.5))  # nothing moved for abort_after
    state = tracker.state()
    assert (state.saves_committed, state.saves_aborted) == (4, 1)
