"""The memory-capped metadata worker and the validator around it: the exporter's own trouble (a
worker killed, one that cannot start, a file that hangs, a limit too small for a real file, a
bug) is never a verdict on a checkpoint; only the checkpoint's own faults are."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import threading
from pathlib import Path

import pytest

from checkpoint_exporter.core.tracker import ValidationRequest
from checkpoint_exporter.daemon import validator
from checkpoint_exporter.daemon.validator import Validator
from checkpoint_exporter.model import COMMITTED
from checkpoint_exporter.sources import ckpt_step, dcp_metadata
from checkpoint_exporter.sources.layouts.base import DCP, ZIP, ZIP_STEP, Check, Found
from checkpoint_exporter.sources.validate import BAD_METADATA, Limits, Verdict, validate
from tests.conftest import wait_for
from tests.helpers.hostile import (
    allocation_bomb,
    costly_step_pickle,
    metadata_naming,
    refused_global,
    size_over_memoized_list,
)
from tests.helpers.trees import dcp_generation, dcp_metadata_bytes
from tests.sources.test_layout_lightning import torch_like_zip

MiB = 1024 * 1024


def parse(parser: dcp_metadata.IsolatedParser, path: Path) -> dcp_metadata.DcpMetadata:
    fd = os.open(path, os.O_RDONLY)
    try:
        return parser.parse(fd)
    finally:
        os.close(fd)


@pytest.fixture
def parser():
    instance = dcp_metadata.IsolatedParser()
    yield instance
    instance.close()


@pytest.mark.slow
def test_a_worker_killed_while_idle_is_replaced_not_blamed_on_the_next_file(
    tmp_path: Path, parser
) -> None:
    good = tmp_path / "good.metadata"
    good.write_bytes(dcp_metadata_bytes(4, 16))
    assert len(parse(parser, good).shards) == 4
    assert parser._process is not None
    parser._process.kill()  # the OOM killer, a stray signal to the process group
    parser._process.wait()
    assert len(parse(parser, good).shards) == 4


def test_a_worker_that_cannot_start_is_unavailable_not_bad_metadata(
    tmp_path: Path, parser, monkeypatch
) -> None:
    good = tmp_path / "good.metadata"
    good.write_bytes(dcp_metadata_bytes(4, 16))

    def no_processes(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")  # a pids limit

    monkeypatch.setattr(subprocess, "Popen", no_processes)
    with pytest.raises(dcp_metadata.ParserUnavailable):
        parse(parser, good)


def test_a_file_that_never_ends_times_out_as_unavailable(tmp_path: Path) -> None:
    """A stuck read (a hung NFS server, here a pipe whose writer never writes): the worker is
    killed after the timeout, and that is no verdict."""
    fifo = tmp_path / ".metadata"
    os.mkfifo(fifo)
    slow = dcp_metadata.IsolatedParser(timeout=1.0)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # open, silent
    try:
        os.set_blocking(fd, True)
        with pytest.raises(dcp_metadata.ParserUnavailable, match="longer than"):
            slow.parse(fd)
    finally:
        os.close(writer)
        os.close(fd)
        slow.close()


def _ints_pickle(count: int) -> bytes:
    """A plain pickle of many distinct ints: about 7 bytes of heap per input byte, as far from
    a bomb as real metadata is (which needs up to about 16)."""
    body = b"".join(b"J" + struct.pack("<i", n) + b"a" for n in range(count))
    return b"\x80\x04]" + body + b"."


@pytest.mark.slow
def test_a_real_file_too_large_for_the_limit_is_unchecked_a_bomb_is_bad(
    tmp_path: Path,
) -> None:
    big = tmp_path / "big.metadata"
    big.write_bytes(_ints_pickle(3_000_000))  # 18 MiB needing ~120 MiB
    bomb = tmp_path / "bomb.metadata"
    bomb.write_bytes(b"\x80\x04" + b"}" * (4 * MiB) + b".")  # 4 MiB needing ~300 MiB
    small = dcp_metadata.IsolatedParser(memory_limit=128 * MiB)
    roomy = dcp_metadata.IsolatedParser(memory_limit=1024 * MiB)
    try:
        with pytest.raises(dcp_metadata.ParserUnavailable, match=r"scan\.metadata_memory_bytes"):
            parse(small, big)
        with pytest.raises(dcp_metadata.MetadataTooLarge, match="allocation bomb"):
            parse(roomy, bomb)
        with pytest.raises(dcp_metadata.MetadataError, match="not DCP Metadata"):
            parse(roomy, big)  # within a roomier limit it parses, and is simply not metadata
    finally:
        small.close()
        roomy.close()


@pytest.mark.slow
@pytest.mark.parametrize("framed", [False, True])
def test_an_allocation_bomb_above_24_times_its_size_under_the_cap_is_a_bomb(
    tmp_path: Path, parser, framed: bool
) -> None:
    """32 MiB of `}` asks for 2.3 GiB: more than 24 times its size, but that bound is above the
    768 MiB cap, so the worker fails at the cap. It is still a bomb (judged once as
    bad_metadata), not a real file too large for the operator's cap (asked again every 30 s);
    also when the whole pickle is one FRAME, which hides how far the parser got."""
    bomb = tmp_path / "bomb.metadata"
    bomb.write_bytes(allocation_bomb(32 * MiB, framed))
    with pytest.raises(dcp_metadata.MetadataTooLarge, match="allocation bomb"):
        parse(parser, bomb)
    good = tmp_path / "good.metadata"
    good.write_bytes(dcp_metadata_bytes(4, 16))
    assert len(parse(parser, good).shards) == 4


def test_a_refusal_that_repeats_the_file_comes_back_as_a_short_excerpt(
    tmp_path: Path, parser
) -> None:
    """A shard path of 4 MiB of NUL, a module name of 4 MiB: the refusal names them, in an
    excerpt of bounded length that says how long they were (it was the whole value, escaped:
    16 MiB here, 201 MB over the socket and in one log line for 48 MiB)."""
    for name, data in (
        ("nul-path.metadata", metadata_naming("\0" * (4 * MiB))),
        ("module.metadata", refused_global("m" * (4 * MiB))),
    ):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(dcp_metadata.MetadataError) as refused:
            parse(parser, tmp_path / name)
        message = str(refused.value)
        assert len(message) < 1000, (name, len(message))
        assert f"{4 * MiB:,} characters" in message, message


def test_the_daemon_reads_no_more_than_reply_bytes_of_an_answer() -> None:
    """Whatever the worker says, the daemon reads at most REPLY_BYTES of it: an answer that
    claims more is refused after its 8-byte header."""
    ours, theirs = socket.socketpair()
    body = json.dumps({"error": "x" * (64 * MiB)}).encode()

    def send() -> None:
        with contextlib.suppress(OSError):  # the daemon's end closes without reading it all
            theirs.sendall(len(body).to_bytes(8, "big") + body)
        theirs.close()

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        with pytest.raises(ValueError, match="more than"):
            dcp_metadata._receive(ours)
    finally:
        ours.close()
        sender.join(timeout=10)
    assert 64 * MiB > dcp_metadata.REPLY_BYTES


@pytest.mark.slow
def test_a_file_that_costs_cpu_not_memory_is_judged_once_within_its_budget(
    tmp_path: Path,
) -> None:
    """torch.Size over one memoized list of a million ints, rebuilt 100,000 times: 2.7 MB that
    would hold the parser for minutes (its timeout, 120 s, then again every 30 s). The worker
    stops at its CPU budget for the file's size, and that is a verdict (bad_metadata, kept for
    the file's signature), not a parser unavailable; the next file gets a fresh worker."""
    generation = tmp_path / "step-1"
    dcp_generation(generation)
    (generation / ".metadata").write_bytes(size_over_memoized_list(1_000_000, 100_000))
    parser = dcp_metadata.IsolatedParser(timeout=90.0)
    try:
        verdict = validate(str(tmp_path), [Check(DCP, "step-1")], Limits(metadata_parser=parser))
        assert not verdict.unchecked, verdict
        assert verdict.reason == BAD_METADATA and "CPU" in verdict.detail, verdict
        good = tmp_path / "good.metadata"
        good.write_bytes(dcp_metadata_bytes(4, 16))
        assert len(parse(parser, good).shards) == 4
    finally:
        parser.close()


def test_the_step_scan_of_a_ckpt_runs_in_the_worker_not_in_the_daemon(
    tmp_path: Path, parser, monkeypatch
) -> None:
    """The opcode scan of a .ckpt's data.pkl costs up to seconds of CPU: the daemon hands the
    descriptor to the worker (the scan run here would fail this test)."""
    (tmp_path / "last.ckpt").write_bytes(torch_like_zip({"global_step": 42, "state": [1, 2]}))

    def in_the_daemon(*args: object) -> None:
        raise AssertionError("the opcode scan ran in the daemon's process")

    monkeypatch.setattr(ckpt_step, "step_in", in_the_daemon)
    limits = Limits(metadata_parser=parser)
    assert validate(str(tmp_path), [Check(ZIP_STEP, "last.ckpt")], limits) == Verdict(True, step=42)


@pytest.mark.slow
def test_the_step_scan_runs_under_the_cpu_budget(tmp_path: Path) -> None:
    """The costliest data.pkl the scan accepts (2.8 million opcodes, about 2 s): under a budget
    of under a second its step is unknown, not waited for; the zip is still judged."""
    (tmp_path / "last.ckpt").write_bytes(torch_like_zip(costly_step_pickle(1_400_000)))
    tight = dcp_metadata.IsolatedParser(cpu_seconds=0.1, cpu_seconds_per_mib=0.0)
    roomy = dcp_metadata.IsolatedParser()
    checks = [Check(ZIP_STEP, "last.ckpt")]
    try:
        assert validate(str(tmp_path), checks, Limits(metadata_parser=roomy)).step == 5
        assert validate(str(tmp_path), checks, Limits(metadata_parser=tight)) == Verdict(True)
    finally:
        tight.close()
        roomy.close()


def _request(root: Path, generation: str, checks: tuple[Check, ...]) -> ValidationRequest:
    found = Found(generation, 1, COMMITTED, 0, 0, 0, 1, 1, checks)
    return ValidationRequest("j", "durable", generation, (1, 1, 0.0), found)


def _verdict_for(request: ValidationRequest, root: Path) -> Verdict | None:
    checker = Validator(Limits())
    checker.start()
    try:
        checker.submit(request, str(root))
        answered, verdict = checker.verdicts.get(timeout=10)
        assert answered is request
        return verdict
    finally:
        checker.stop()


def test_a_validator_bug_is_an_unchecked_answer_never_a_silence(
    tmp_path: Path, monkeypatch
) -> None:
    dcp_generation(tmp_path / "step-1")

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("a bug")

    monkeypatch.setattr(validator, "validate", broken)
    check = Check(ZIP, "step-1/.metadata")
    verdict = _verdict_for(_request(tmp_path, "step-1", (check,)), tmp_path)
    assert verdict is not None and verdict.unchecked and not verdict.valid


def test_a_directory_below_the_generation_swapped_for_a_symlink_is_not_followed(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(Path(__file__), outside / "model_optim_rng.pt")  # not a zip: would be bad_zip
    job = tmp_path / "job"
    (job / "iter_1").mkdir(parents=True)
    (job / "iter_1" / "mp_rank_00").symlink_to(outside)
    check = Check(ZIP, "iter_1/mp_rank_00/model_optim_rng.pt")
    assert _verdict_for(_request(job, "iter_1", (check,)), job) is None


# --- a worker stuck in the kernel ------------------------------------------------------------
#
# A read that a FUSE server has taken and never answers waits uninterruptibly: SIGKILL is not
# acted on until the answer comes (fs/fuse/dev.c, request_wait_answer), like a read on a hard
# NFS mount whose server went away mid-request. The server below answers what opening a file
# needs and takes every read without answering; leaving the context aborts the connection, so
# the stuck read fails and the worker dies.

_FUSE_LOOKUP, _FUSE_GETATTR, _FUSE_OPEN, _FUSE_READ, _FUSE_INIT = 1, 3, 14, 15, 26
_FUSE_INTERRUPT = 36
_FOPEN_DIRECT_IO = 1  # reads go to the server, not through the page cache (whose waits are
# killable)
_IN_HEADER = struct.Struct("<IIQQIIIHH")
_OUT_HEADER = struct.Struct("<IiQ")
_FOREVER = 1 << 30  # seconds a lookup or attributes stay valid: asked once


def _attr(node: int, mode: int, size: int) -> bytes:
    # fuse_attr: ino size blocks atime mtime ctime, nsecs, mode nlink uid gid rdev blksize flags
    return struct.pack("<6Q10I", node, size, 8, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


_libc = ctypes.CDLL(None, use_errno=True)


class ReadsNeverAnswered:
    """A FUSE mount holding one file, ``stuck``, whose reads never return."""

    def __init__(self, mountpoint: Path) -> None:
        self.mountpoint = mountpoint
        self.file = mountpoint / "stuck"
        self.read_taken = threading.Event()
        self._stopping = threading.Event()
        self._fd = -1
        self._thread = threading.Thread(target=self._serve, name="fuse server", daemon=True)

    def __enter__(self) -> ReadsNeverAnswered:
        if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
            pytest.skip("a FUSE mount needs root and /dev/fuse")
        self.mountpoint.mkdir()
        self._fd = os.open("/dev/fuse", os.O_RDWR)
        options = f"fd={self._fd},rootmode=40000,user_id=0,group_id=0".encode()
        if _libc.mount(b"stuckfs", bytes(self.mountpoint), b"fuse", 0, options):
            os.close(self._fd)
            raise OSError(ctypes.get_errno(), f"mount fuse on {self.mountpoint}")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._thread.join()
        os.close(self._fd)  # the last reference: aborts the connection, stuck reads fail
        _libc.umount2(bytes(self.mountpoint), 2)  # MNT_DETACH

    def _serve(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while not self._stopping.is_set():
            if not poller.poll(50):
                continue
            try:
                request = os.read(self._fd, 1 << 17)
            except OSError:
                return  # the connection is gone
            _, opcode, unique, node, *_ = _IN_HEADER.unpack_from(request)
            body = request[_IN_HEADER.size :]
            if opcode in (_FUSE_READ, _FUSE_INTERRUPT):
                self.read_taken.set()  # taken, never answered
                continue
            self._answer(unique, *self._reply(opcode, node, body))

    def _reply(self, opcode: int, node: int, body: bytes) -> tuple[int, bytes]:
        """(error, payload) for a request."""
        if opcode == _FUSE_INIT:  # protocol 7.31, nothing optional
            return 0, struct.pack("<4I2H2I2H2IH11H", 7, 31, 0, 0, 0, 0, 4096, 1, *[0] * 16)
        if opcode == _FUSE_LOOKUP and node == 1 and body.rstrip(b"\0") == b"stuck":
            return 0, struct.pack("<4Q2I", 2, 0, _FOREVER, _FOREVER, 0, 0) + _attr(
                2, 0o100444, 4096
            )
        if opcode == _FUSE_GETATTR and node in (1, 2):
            mode = 0o40755 if node == 1 else 0o100444
            return 0, struct.pack("<QII", _FOREVER, 0, 0) + _attr(node, mode, 4096)
        if opcode == _FUSE_OPEN:
            return 0, struct.pack("<QIi", 0, _FOPEN_DIRECT_IO, 0)
        if opcode == _FUSE_LOOKUP:
            return -errno.ENOENT, b""
        return -errno.ENOSYS, b""

    def _answer(self, unique: int, error: int, payload: bytes) -> None:
        os.write(
            self._fd, _OUT_HEADER.pack(_OUT_HEADER.size + len(payload), error, unique) + payload
        )


def _parse_in_thread(
    parser: dcp_metadata.IsolatedParser, fd: int
) -> tuple[threading.Thread, list[object]]:
    """A parse on a thread of its own; its result or exception lands in the list."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(parser.parse(fd))
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=run, name="parse", daemon=True)
    thread.start()
    return thread, outcome


def _exited(pid: int) -> bool:
    """Whether a child has exited: a zombie, or reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.root
def test_close_returns_at_once_with_the_worker_stuck_in_an_unkillable_read(
    tmp_path: Path,
) -> None:
    parser = dcp_metadata.IsolatedParser(timeout=60.0)
    closing = threading.Thread(target=parser.close, name="close", daemon=True)
    with ReadsNeverAnswered(tmp_path / "stuck") as server:
        fd = os.open(server.file, os.O_RDONLY)
        parsing, outcome = _parse_in_thread(parser, fd)
        assert server.read_taken.wait(10)
        assert parser._process is not None
        worker = parser._process.pid
        closing.start()
        closing.join(timeout=1.0)  # the daemon's SIGTERM budget is 2 s in all
        closed = not closing.is_alive()
        parsing.join(timeout=1.0)
        answered = not parsing.is_alive()
    # Leaving the mount aborted it: the stuck read failed, so everything has ended by now.
    closing.join(timeout=10)
    parsing.join(timeout=10)
    os.close(fd)
    assert closed, "close() waited for a worker that cannot die"
    assert answered and isinstance(outcome[0], dcp_metadata.ParserUnavailable)
    wait_for(lambda: _exited(worker))  # killed, it died once its read failed
    parser.close()
    assert not Path(f"/proc/{worker}").exists()  # reaped: no zombie left behind


@pytest.mark.root
def test_a_request_behind_a_stuck_read_gives_up_in_time_then_a_fresh_worker_parses(
    tmp_path: Path,
) -> None:
    good = tmp_path / "good.metadata"
    good.write_bytes(dcp_metadata_bytes(4, 16))
    parser = dcp_metadata.IsolatedParser(timeout=1.0)
    good_fd = os.open(good, os.O_RDONLY)
    try:
        with ReadsNeverAnswered(tmp_path / "stuck") as server:
            stuck_fd = os.open(server.file, os.O_RDONLY)
            stuck, stuck_outcome = _parse_in_thread(parser, stuck_fd)
            assert server.read_taken.wait(10)
            queued, queued_outcome = _parse_in_thread(parser, good_fd)
            # Each gives up within its timeout (the queued one: for the lock, then its own).
            stuck.join(timeout=5.0)
            queued.join(timeout=5.0)
            finished = not stuck.is_alive() and not queued.is_alive()
            # The stuck worker is left behind, still stuck: the next file gets a fresh one.
            after = parse(parser, good) if finished else None
        stuck.join(timeout=10)
        queued.join(timeout=10)
        os.close(stuck_fd)
    finally:
        os.close(good_fd)
        parser.close()
    assert finished, "a request waited without bound behind a worker that cannot die"
    assert isinstance(stuck_outcome[0], dcp_metadata.ParserUnavailable)
    (queued_answer,) = queued_outcome  # either no verdict, or parsed by a fresh worker
    assert isinstance(queued_answer, dcp_metadata.ParserUnavailable) or (
        isinstance(queued_answer, dcp_metadata.DcpMetadata) and len(queued_answer.shards) == 4
    )
    assert after is not None and len(after.shards) == 4
