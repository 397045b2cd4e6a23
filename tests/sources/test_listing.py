"""Incremental listing: cost follows what changed; nothing is followed, written or blocked on."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from checkpoint_exporter.sources.listing import DIR, FILE, LINK, OTHER, Dir, OpsBudget, TreeReader
from tests.helpers.trees import build


def tree_of(root: Path, **kw) -> TreeReader:
    return TreeReader(root, OpsBudget(), **kw)


def test_an_unchanged_tree_costs_one_stat_per_directory(tmp_path: Path) -> None:
    for step in range(5):
        build(tmp_path, {f"step-{step}/__{i}_0.distcp": 8 for i in range(50)})
    reader = tree_of(tmp_path)
    first, stats = reader.read()
    assert (stats.listed, stats.statted) == (6, 255)  # root + 5 dirs; 5 dirs + 250 files
    again, stats = reader.read()
    assert (stats.listed, stats.statted) == (0, 5)  # only the subdirectories' mtimes
    assert again is first  # the very same immutable tree: derived values are reused


def test_a_change_lists_one_directory_and_stats_only_the_new_file(tmp_path: Path) -> None:
    build(tmp_path, {f"step-1/__{i}_0.distcp": 8 for i in range(100)})
    reader = tree_of(tmp_path)
    before, _ = reader.read()
    build(tmp_path, {"step-1/.metadata": 4})
    after, stats = reader.read()
    assert (stats.listed, stats.statted) == (1, 2)  # step-1 listed; its lstat + .metadata
    assert after.subdirs["step-1"].has_file(".metadata")
    assert before.subdirs["step-1"].totals().files == 100
    assert after.subdirs["step-1"].totals().files == 101


def test_root_markers_are_restatted_in_the_root_only(tmp_path: Path) -> None:
    """A file growing in place changes no directory's mtime: a root marker is re-statted on
    every read; the same name one level down (a rank's file in a generation) is not."""
    build(tmp_path, {"a.pt": 8, "b.txt": 8, "gen/a.pt": 8})
    reader = tree_of(tmp_path, root_marker=lambda name: name.endswith(".pt"))
    reader.read()
    for name in ("a.pt", "b.txt", "gen/a.pt"):
        with open(tmp_path / name, "ab") as handle:
            handle.write(b"z" * 100)
    tree, stats = reader.read()
    assert tree is not None and (stats.listed, stats.statted) == (0, 2)  # gen/'s mtime, a.pt
    assert tree.file("a.pt")[0] == 108
    assert tree.file("b.txt")[0] == 8
    assert tree.subdirs["gen"].file("a.pt")[0] == 8


def test_hot_generations_are_restatted_at_most_once_a_second(tmp_path: Path) -> None:
    build(tmp_path, {"step-1/__0_0.distcp": 8})
    reader = tree_of(tmp_path)
    reader.read(hot=["step-1"])
    with open(tmp_path / "step-1" / "__0_0.distcp", "ab") as shard:
        shard.write(b"x" * 100)  # grows without touching the directory's mtime
    tree, _ = reader.read(hot=["step-1"])
    assert tree.subdirs["step-1"].file("__0_0.distcp")[0] == 8  # within the second: cached
    time.sleep(1.05)
    tree, _ = reader.read(hot=["step-1"])
    assert tree.subdirs["step-1"].file("__0_0.distcp")[0] == 108
    tree, _ = reader.read(force_paths=["step-1"])
    assert tree.subdirs["step-1"].file("__0_0.distcp")[0] == 108


def test_kinds_symlinks_and_special_files(tmp_path: Path) -> None:
    build(tmp_path, {"gen/data": 4, "gen/link": "->/etc/passwd", "gen/sub/": ""})
    os.mkfifo(tmp_path / "gen" / "latest")  # a FIFO where a marker file should be
    reader = tree_of(tmp_path, content_names={"latest", "data"})
    tree, _ = reader.read()
    gen = tree.subdirs["gen"]
    assert {n: k for n, k, _, _ in gen.entries()} == {
        "data": FILE, "link": LINK, "sub": DIR, "latest": OTHER,
    }  # fmt: skip
    assert "link" not in gen.subdirs and gen.contents == {"data": b"\0" * 4}
    assert gen.totals().files == 1


def test_contents_are_read_when_they_change(tmp_path: Path) -> None:
    build(tmp_path, {"latest": b"global_step1"})
    reader = tree_of(tmp_path, content_names={"latest"})
    assert reader.read()[0].contents["latest"] == b"global_step1"
    (tmp_path / "latest").write_bytes(b"global_step22")
    assert reader.read(force=True)[0].contents["latest"] == b"global_step22"


def test_a_missing_root_and_a_vanished_subtree(tmp_path: Path) -> None:
    reader = tree_of(tmp_path / "absent")
    assert reader.read()[0] is None
    build(tmp_path, {"job/step-1/a": 1})
    reader = tree_of(tmp_path / "job")
    reader.read()
    (tmp_path / "job" / "step-1" / "a").unlink()
    (tmp_path / "job" / "step-1").rmdir()
    tree, stats = reader.read()
    assert tree.subdirs == {} and stats.errors == []


def test_the_budget_paces_metadata_operations() -> None:
    slept: list[float] = []
    budget = OpsBudget(per_second=100, sleep=slept.append)
    for _ in range(300):
        budget.spend()
    assert budget.total == 300
    assert 2.7 <= sum(slept) <= 2.8  # 25 free in the bucket (0.25 s), then 275 at 100 per second
    unlimited = OpsBudget(0, sleep=slept.append)
    before = len(slept)
    for _ in range(1000):
        unlimited.spend()
    assert len(slept) == before


def test_many_root_markers_cost_one_index_per_read_not_a_search_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torch.save run keeping every save has thousands of ``ckpt_step_N.pt`` in its root, each
    a marker re-statted on every read: a linear search of the names per marker made a root of
    20,000 cost seconds of CPU per read (quadratic)."""
    build(tmp_path, {f"ckpt_step_{i}.pt": 8 for i in range(400)})
    reader = tree_of(tmp_path, root_marker=lambda name: name.endswith(".pt"))
    reader.read()
    searches = 0
    position = Dir._position

    def counted(self: Dir, name: str) -> int | None:
        nonlocal searches
        searches += 1
        return position(self, name)

    monkeypatch.setattr(Dir, "_position", counted)
    with open(tmp_path / "ckpt_step_399.pt", "ab") as handle:
        handle.write(b"z")
    tree, stats = reader.read()
    assert tree is not None and stats.statted == 400
    assert tree.file("ckpt_step_399.pt")[0] == 9
    assert searches < 16


def test_the_directory_a_check_names_is_found_in_the_tiers_listing(tmp_path: Path) -> None:
    """The validator takes a check's sizes from the tier's listing: the directory the check's
    path names, or the one holding the file it names; nothing for what was not listed."""
    (tmp_path / "step-1" / "sub").mkdir(parents=True)
    (tmp_path / "step-1" / "index.json").write_text("{}")
    (tmp_path / "step-1" / "sub" / "shard").write_bytes(b"x" * 5)
    tree, _ = TreeReader(tmp_path, OpsBudget()).read()
    assert tree is not None
    generation = tree.subdirs["step-1"]
    assert tree.directory_of(".") is tree and tree.directory_of("") is tree
    assert tree.directory_of("step-1") is generation
    assert tree.directory_of("step-1/index.json") is generation
    assert tree.directory_of("step-1/sub").file("shard") == (5, pytest.approx(time.time(), abs=60))
    assert tree.directory_of("step-1/absent.json") is None
    assert tree.directory_of("step-1/index.json/deeper") is None
    assert tree.directory_of("step-2") is None
