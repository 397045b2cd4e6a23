"""The inotify watcher against real directories: nested creation, renames, depth, unwatch."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_exporter.inotify import Watcher
from tests.conftest import wait_for


class Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[str, str]] = []
        self.overflows = 0
        self.lost: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def changed(self, key: str, path: str) -> None:
        with self.lock:
            self.changes.append((key, path))

    def saw(self, key: str, path: Path) -> bool:
        with self.lock:
            return any(k == key and Path(p) == path for k, p in self.changes)

    def clear(self) -> None:
        with self.lock:
            self.changes.clear()


@pytest.fixture
def watched() -> Iterator[tuple[Watcher, Recorder]]:
    recorder = Recorder()
    watcher = Watcher(
        recorder.changed,
        lambda path: setattr(recorder, "overflows", recorder.overflows + 1),
        lambda key, reason: recorder.lost.append((key, reason)),
    )
    watcher.start()
    yield watcher, recorder
    watcher.stop()


def test_new_nested_directories_are_followed(tmp_path: Path, watched) -> None:
    watcher, recorder = watched
    assert watcher.watch("j", str(tmp_path)) is None
    deep = tmp_path / "step-1" / "a" / "b"
    deep.mkdir(parents=True)  # created faster than their watches can be added
    (deep / "shard").write_bytes(b"x")
    wait_for(lambda: recorder.saw("j", tmp_path / "step-1"))
    wait_for(lambda: watcher.watch_count == 4)
    recorder.clear()
    (deep / ".metadata").write_bytes(b"x")
    wait_for(lambda: recorder.saw("j", deep / ".metadata"))


def test_renamed_directories_report_their_new_path(tmp_path: Path, watched) -> None:
    watcher, recorder = watched
    (tmp_path / "tmp-1" / "sub").mkdir(parents=True)
    assert watcher.watch("j", str(tmp_path)) is None
    os.rename(tmp_path / "tmp-1", tmp_path / "step-1")
    wait_for(lambda: recorder.changes)  # one change per key and batch of events
    assert watcher.watch_count == 3
    recorder.clear()
    (tmp_path / "step-1" / "sub" / "done").write_bytes(b"")
    wait_for(lambda: recorder.saw("j", tmp_path / "step-1" / "sub" / "done"))


def test_depth_limit_keys_and_unwatch(tmp_path: Path, watched) -> None:
    watcher, recorder = watched
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    other = tmp_path / "other"
    other.mkdir()
    assert watcher.watch("shallow", str(tmp_path / "a"), max_depth=1) is None
    assert watcher.watch("other", str(other)) is None
    assert watcher.watch_count == 3  # a, a/b and other; not a/b/c
    (tmp_path / "a" / "b" / "c" / "deep").write_bytes(b"")
    (other / "f").write_bytes(b"")
    wait_for(lambda: recorder.saw("other", other / "f"))
    assert not any(key == "shallow" for key, _ in recorder.changes)
    watcher.unwatch("shallow")
    assert watcher.watch_count == 1
    assert "cannot watch" in (watcher.watch("gone", str(tmp_path / "missing")) or "")
    assert watcher.watch_count == 1
    assert recorder.overflows == 0 and recorder.lost == []
