"""The inotify watcher against real directories: nested creation, renames, depth, unwatch."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_exporter.sources import fsread
from checkpoint_exporter.sources.inotify import Watcher
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


def _inotify_descriptors() -> set[int]:
    """This process's open inotify instances, as the kernel names them in /proc/self/fd."""
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:inotify":
                found.add(int(name))
        except OSError:
            continue  # the descriptor listdir itself used, closed by now
    return found


def test_removed_and_recreated_root_is_watched_again(tmp_path: Path, watched) -> None:
    watcher, recorder = watched
    root = tmp_path / "job"
    (root / "step-1").mkdir(parents=True)
    assert watcher.watch("j", str(root)) is None
    shutil.rmtree(root)
    wait_for(lambda: watcher.watch_count == 1)  # the parent, awaiting the root's return
    recorder.clear()
    (root / "step-2").mkdir(parents=True)
    # Healed: the scanner is told to re-read the whole root, since nothing saw what was written
    # into it before its watch came back; later writes are reported one by one again.
    wait_for(lambda: recorder.saw("j", root))
    wait_for(lambda: watcher.watch_count == 2)  # job and job/step-2; the parent's went
    (root / "step-2" / ".metadata").write_bytes(b"x")
    wait_for(lambda: recorder.saw("j", root / "step-2" / ".metadata"))
    (root / "step-3").mkdir()
    wait_for(lambda: recorder.saw("j", root / "step-3"))
    wait_for(lambda: watcher.watch_count == 3)  # new directories are followed again
    assert recorder.lost == []


def test_a_root_whose_parent_went_too_is_awaited_further_up(tmp_path: Path, watched) -> None:
    watcher, recorder = watched
    root = tmp_path / "mnt" / "job"
    root.mkdir(parents=True)
    assert watcher.watch("j", str(root)) is None
    shutil.rmtree(tmp_path / "mnt")
    wait_for(lambda: watcher.watch_count == 1)  # tmp_path, awaiting mnt
    recorder.clear()
    (root / "step-1").mkdir(parents=True)
    wait_for(lambda: recorder.saw("j", root))
    wait_for(lambda: watcher.watch_count == 2)
    (root / "step-1" / "shard").write_bytes(b"x")
    wait_for(lambda: recorder.saw("j", root / "step-1" / "shard"))


def test_an_operators_root_symlink_is_watched_again_when_its_target_is_back(
    tmp_path: Path, watched
) -> None:
    watcher, recorder = watched
    target, link = tmp_path / "volume" / "job", tmp_path / "job"
    target.mkdir(parents=True)
    link.symlink_to(target)
    assert watcher.watch("j", str(link)) is None
    shutil.rmtree(target)
    wait_for(lambda: watcher.watch_count == 0)  # its target may come back anywhere: looked for
    recorder.clear()
    (target / "step-1").mkdir(parents=True)
    wait_for(lambda: recorder.saw("j", link))
    wait_for(lambda: watcher.watch_count == 2)
    (target / "step-1" / "shard").write_bytes(b"x")
    wait_for(lambda: recorder.saw("j", link / "step-1" / "shard"))


def test_root_moved_away_is_unwatched_and_its_replacement_watched(tmp_path: Path, watched) -> None:
    watcher, recorder = watched
    root = tmp_path / "job"
    (root / "step-1").mkdir(parents=True)
    assert watcher.watch("j", str(root)) is None
    os.rename(root, tmp_path / "old")
    (root / "step-2").mkdir(parents=True)
    wait_for(lambda: recorder.saw("j", root))
    wait_for(lambda: watcher.watch_count == 2)  # job and job/step-2; nothing of old
    recorder.clear()
    (tmp_path / "old" / "step-1" / "late").write_bytes(b"x")
    (root / "step-2" / "shard").write_bytes(b"x")
    wait_for(lambda: recorder.saw("j", root / "step-2" / "shard"))
    assert all(Path(path).is_relative_to(root) for _, path in recorder.changes)


def test_recreated_and_returning_subtrees_are_followed(tmp_path: Path, watched) -> None:
    watcher, recorder = watched
    root = tmp_path / "job"
    (root / "step-1" / "model").mkdir(parents=True)
    assert watcher.watch("j", str(root)) is None
    shutil.rmtree(root / "step-1")
    (root / "step-1" / "model").mkdir(parents=True)
    # Written until seen: the watch of the new subtree comes a moment after its creation.
    wait_for(lambda: _written_and_seen(recorder, "j", root / "step-1" / "model" / "shard"))
    os.rename(root / "step-1", tmp_path / "aside")
    os.rename(tmp_path / "aside", root / "step-1")
    recorder.clear()
    wait_for(lambda: _written_and_seen(recorder, "j", root / "step-1" / "model" / "other"))
    assert watcher.watch_count == 3


def _written_and_seen(recorder: Recorder, key: str, path: Path) -> bool:
    path.write_bytes(b"x")
    return recorder.saw(key, path)


def test_a_failed_reader_gives_every_key_up_to_polling(tmp_path: Path) -> None:
    recorder = Recorder()
    before = _inotify_descriptors()
    watcher = Watcher(
        recorder.changed, lambda path: None, lambda k, r: recorder.lost.append((k, r))
    )
    (descriptor,) = _inotify_descriptors() - before
    watcher.start()
    try:
        for key in ("a", "b"):
            (tmp_path / key).mkdir()
            assert watcher.watch(key, str(tmp_path / key)) is None
        # The kernel fails the reader's next read: a directory now stands where its inotify
        # descriptor was (read() says EISDIR); an event on the old instance wakes the reader.
        directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        os.dup2(directory, descriptor)
        os.close(directory)
        (tmp_path / "a" / "f").write_bytes(b"x")
        wait_for(lambda: sorted(key for key, _ in recorder.lost) == ["a", "b"])
        assert all("inotify reader failed" in reason for _, reason in recorder.lost)
        # A job added afterwards is not promised a watch that nobody reads.
        assert "inotify reader failed" in (watcher.watch("c", str(tmp_path)) or "")
    finally:
        watcher.stop()


def test_an_exception_in_dispatch_gives_every_key_up_to_polling(tmp_path: Path) -> None:
    lost: list[tuple[str, str]] = []

    def broken(key: str, path: str) -> None:
        raise RuntimeError("callback bug")

    watcher = Watcher(broken, lambda path: None, lambda key, reason: lost.append((key, reason)))
    watcher.start()
    try:
        assert watcher.watch("j", str(tmp_path)) is None
        (tmp_path / "f").write_bytes(b"x")
        wait_for(lambda: lost)
        assert lost == [("j", "inotify reader failed: RuntimeError: callback bug")]
    finally:
        watcher.stop()


def test_a_directory_swapped_for_a_symlink_leads_no_watch_outside(tmp_path: Path) -> None:
    root, outside = tmp_path / "job", tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    root.mkdir()
    recorder = Recorder()
    gate, paused = threading.Event(), threading.Event()

    def changed(key: str, path: str) -> None:
        recorder.changed(key, path)
        if not paused.is_set():  # hold the reader while the tenant swaps the directory
            paused.set()
            gate.wait(10)

    watcher = Watcher(changed, lambda path: None, lambda key, reason: None)
    watcher.start()
    try:
        assert watcher.watch("j", str(root)) is None
        (root / "a").mkdir()
        wait_for(paused.is_set)
        (root / "a" / "b").mkdir()  # its event is read after the swap
        os.rename(root / "a", root / "real")
        os.symlink(outside, root / "a")
        gate.set()
        wait_for(lambda: recorder.saw("j", root / "real"))
        wait_for(lambda: watcher.watch_count == 3)  # job, job/real, job/real/b
        recorder.clear()
        (outside / "b" / "f").write_bytes(b"x")
        (root / "real" / "b" / "g").write_bytes(b"x")
        wait_for(lambda: recorder.saw("j", root / "real" / "b" / "g"))
        assert not recorder.saw("j", root / "a" / "b" / "f")
        assert watcher.watch_count == 3
    finally:
        gate.set()
        watcher.stop()


def test_a_root_symlink_is_followed_only_when_allowed(tmp_path: Path, watched) -> None:
    watcher, recorder = watched
    (tmp_path / "target").mkdir()
    os.symlink(tmp_path / "target", tmp_path / "link")
    refused = watcher.watch("tenant", str(tmp_path / "link"), follow_root_symlink=False)
    assert "cannot watch" in (refused or "")
    assert watcher.watch_count == 0
    assert watcher.watch("operator", str(tmp_path / "link")) is None
    (tmp_path / "target" / "f").write_bytes(b"x")
    wait_for(lambda: recorder.saw("operator", tmp_path / "link" / "f"))


class HungOpen:
    """``fsread.open_directory`` as a hung mount makes it for one directory name: the open waits
    until released, where the kernel would wait on the filesystem."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.entered, self.released = threading.Event(), threading.Event()
        real = fsread.open_directory

        def open_directory(path, *args, **kwargs) -> int:
            if os.path.basename(os.fsencode(path)) == os.fsencode(name):
                self.entered.set()
                self.released.wait(30)
            return real(path, *args, **kwargs)

        monkeypatch.setattr(fsread, "open_directory", open_directory)


class Call:
    """A call on a thread of its own, so that a test can see it hang and still end."""

    def __init__(self, function) -> None:
        self._result: list[object] = []
        self._thread = threading.Thread(target=lambda: self._result.append(function()))
        self._thread.start()

    def result(self, timeout: float) -> object:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"still running after {timeout} s"
        return self._result[0]

    def join(self) -> None:
        self._thread.join(30)


def _kernel_watches(descriptor: int) -> int:
    """The watches the kernel holds on an inotify instance: leaked ones included."""
    with open(f"/proc/self/fdinfo/{descriptor}") as info:
        return sum(line.startswith("inotify wd:") for line in info)


@pytest.fixture
def instance() -> Iterator[tuple[Watcher, Recorder, int]]:
    """A started watcher, its recorder and its inotify descriptor."""
    recorder = Recorder()
    before = _inotify_descriptors()
    watcher = Watcher(
        recorder.changed, lambda path: None, lambda key, reason: recorder.lost.append((key, reason))
    )
    (descriptor,) = _inotify_descriptors() - before
    watcher.start()
    yield watcher, recorder, descriptor
    watcher.stop()


def test_a_hung_directory_in_watch_blocks_no_other_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, instance
) -> None:
    watcher, recorder, descriptor = instance
    hung = HungOpen(monkeypatch, "stuck")
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "stuck").mkdir(parents=True)
    b.mkdir()
    stuck = Call(lambda: watcher.watch("a", str(a)))  # a scan worker on the hung mount
    try:
        assert hung.entered.wait(5)
        assert Call(lambda: watcher.watch("b", str(b))).result(timeout=2) is None
        (b / "f").write_bytes(b"x")
        wait_for(lambda: recorder.saw("b", b / "f"))
        Call(lambda: watcher.unwatch("a")).result(timeout=1)  # the core thread never waits
    finally:
        hung.released.set()
    # The late watches of the unwatched root are given back, not leaked.
    assert stuck.result(timeout=5) is None
    assert watcher.watch_count == 1 and _kernel_watches(descriptor) == 1
    (a / "stuck" / "f").write_bytes(b"x")
    (b / "g").write_bytes(b"x")
    wait_for(lambda: recorder.saw("b", b / "g"))
    assert not any(key == "a" for key, _ in recorder.changes)


def test_a_hung_new_directory_blinds_no_other_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, instance
) -> None:
    watcher, recorder, descriptor = instance
    hung = HungOpen(monkeypatch, "stuck")
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for root in (a, b, c):
        root.mkdir()
    assert watcher.watch("a", str(a)) is None
    assert watcher.watch("b", str(b)) is None
    try:
        (a / "stuck").mkdir()  # followed by the watcher: its open hangs
        assert hung.entered.wait(5)
        (b / "f").write_bytes(b"x")
        wait_for(lambda: recorder.saw("b", b / "f"))  # the reader still reads
        assert Call(lambda: watcher.watch("c", str(c))).result(timeout=2) is None
        Call(lambda: watcher.unwatch("a")).result(timeout=1)
    finally:
        hung.released.set()
    wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith("inotify ")])
    assert watcher.watch_count == 2 and _kernel_watches(descriptor) == 2  # b and c


def test_stop_returns_while_a_directory_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hung = HungOpen(monkeypatch, "stuck")
    before = _inotify_descriptors()
    watcher = Watcher(lambda key, path: None, lambda path: None, lambda key, reason: None)
    watcher.start()
    a, b = tmp_path / "a" / "stuck", tmp_path / "b"
    a.mkdir(parents=True)
    b.mkdir()
    assert watcher.watch("b", str(b)) is None
    stuck = Call(lambda: watcher.watch("a", str(a)))  # a scan worker hangs
    try:
        (b / "new" / "stuck").mkdir(parents=True)  # and so does following this
        assert hung.entered.wait(5)
        Call(watcher.stop).result(timeout=1)  # SIGTERM must exit within 2 s
    finally:
        hung.released.set()
        stuck.join()
    # The descriptor is closed once the last thread that was using it has let go.
    assert stuck.result(timeout=0) == "inotify watcher stopped"
    wait_for(lambda: not _inotify_descriptors() - before)


def test_a_watch_given_up_while_another_key_adds_it_is_added_again(
    tmp_path: Path, instance
) -> None:
    watcher, recorder, descriptor = instance
    assert watcher.watch("x", str(tmp_path)) is None
    # The second key's inotify_add_watch finds the first key's watch, and returns before the
    # first key's unwatch gives that watch back to the kernel.
    libc = watcher._libc
    real, added, resume = libc.inotify_add_watch, threading.Event(), threading.Event()

    def add_watch(fd: int, path: bytes, mask: int) -> int:
        wd = real(fd, path, mask)
        added.set()
        resume.wait(10)
        return wd

    libc.inotify_add_watch = add_watch
    second = Call(lambda: watcher.watch("y", str(tmp_path)))
    try:
        assert added.wait(5)
        Call(lambda: watcher.unwatch("x")).result(timeout=1)
        libc.inotify_add_watch = real
    finally:
        resume.set()
    assert second.result(timeout=5) is None
    (tmp_path / "f").write_bytes(b"x")
    wait_for(lambda: recorder.saw("y", tmp_path / "f"))
    assert watcher.watch_count == 1 and _kernel_watches(descriptor) == 1
