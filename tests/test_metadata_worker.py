"""The memory-capped metadata worker and the validator around it: the exporter's own trouble (a
worker killed, one that cannot start, a file that hangs, a limit too small for a real file, a
bug) is never a verdict on a checkpoint; only the checkpoint's own faults are."""

from __future__ import annotations

import errno
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from checkpoint_exporter.core.tracker import ValidationRequest
from checkpoint_exporter.daemon import scanner
from checkpoint_exporter.daemon.scanner import Validator
from checkpoint_exporter.model import COMMITTED
from checkpoint_exporter.sources import dcp_metadata
from checkpoint_exporter.sources.layouts.base import ZIP, Check, Found
from checkpoint_exporter.sources.validate import Limits, Verdict
from tests.helpers.trees import dcp_generation, dcp_metadata_bytes

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


def _request(root: Path, generation: str, checks: tuple[Check, ...]) -> ValidationRequest:
    found = Found(generation, 1, COMMITTED, 0, 0, 0, 1, 1, checks)
    return ValidationRequest("j", "durable", generation, (1, 1, 0.0), found)


def _verdict_for(request: ValidationRequest, root: Path) -> Verdict | None:
    validator = Validator(Limits())
    validator.start()
    try:
        validator.submit(request, str(root))
        answered, verdict = validator.verdicts.get(timeout=10)
        assert answered is request
        return verdict
    finally:
        validator.stop()


def test_a_validator_bug_is_an_unchecked_answer_never_a_silence(
    tmp_path: Path, monkeypatch
) -> None:
    dcp_generation(tmp_path / "step-1")

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("a bug")

    monkeypatch.setattr(scanner, "validate", broken)
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
