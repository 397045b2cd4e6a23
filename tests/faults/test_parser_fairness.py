"""One tenant's costly files cannot hold the checks of everyone else: the validator takes jobs in
turn (by the time their checks took), and the one shared parser serves the validators of all
mounts in the order they asked."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from checkpoint_exporter.core.tracker import ValidationRequest
from checkpoint_exporter.daemon.validator import Validator
from checkpoint_exporter.sources import dcp_metadata
from checkpoint_exporter.sources.validate import BAD_METADATA, Limits
from tests.conftest import wait_for
from tests.helpers.hostile import size_over_memoized_list
from tests.helpers.trees import dcp_generation, dcp_metadata_bytes, scan

# torch.Size over a list of 100,000 ints, 2,000 times: about 0.2 s of CPU, inside the budget.
COSTLY = size_over_memoized_list(100_000, 2_000)


def _requests(root: Path, job: str) -> list[ValidationRequest]:
    _, found = scan(root, "dcp")
    return [
        ValidationRequest(job, "durable", name, (item.bytes, item.files, 0.0), item)
        for name, item in sorted(found.items())
    ]


def test_one_jobs_queue_of_costly_checks_does_not_hold_another_jobs_verdict(
    tmp_path: Path,
) -> None:
    """Four costly generations of one job are queued before another job's healthy one: the
    other job's verdict comes after the one check under way, not after all four."""
    costly, healthy = tmp_path / "costly", tmp_path / "healthy"
    for step in range(1, 5):
        dcp_generation(costly / f"step-{step}")
        (costly / f"step-{step}" / ".metadata").write_bytes(COSTLY)
    dcp_generation(healthy / "step-1")
    parser = dcp_metadata.IsolatedParser()
    validator = Validator(Limits(metadata_parser=parser))
    for request in _requests(costly, "costly"):
        validator.submit(request, str(costly))
    for request in _requests(healthy, "healthy"):
        validator.submit(request, str(healthy))
    validator.start()  # everything queued before the first is taken
    try:
        answers = [validator.verdicts.get(timeout=120) for _ in range(5)]
    finally:
        validator.stop()
    assert [request.job for request, _ in answers] == [
        "costly", "healthy", "costly", "costly", "costly",
    ]  # fmt: skip
    for request, verdict in answers:
        assert verdict is not None
        assert verdict.valid == (request.job == "healthy"), (request, verdict)
        assert verdict.valid or verdict.reason == BAD_METADATA


def _parse_file(parser: dcp_metadata.IsolatedParser, path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        parser.parse(fd)
    except dcp_metadata.MetadataError:
        pass  # the costly files are not metadata: refused, after the work
    finally:
        os.close(fd)


@pytest.mark.slow
def test_the_parser_serves_the_mounts_validators_in_the_order_they_asked(tmp_path: Path) -> None:
    """One mount's validator parses three costly files back to back; another mount's asks
    during the first. It is served second, not after the first validator's whole queue (a
    plain lock goes back to the thread that just released it)."""
    costly = tmp_path / "costly.metadata"
    costly.write_bytes(size_over_memoized_list(100_000, 10_000))  # about 1.5 s each
    good = tmp_path / "good.metadata"
    good.write_bytes(dcp_metadata_bytes(4, 16))
    parser = dcp_metadata.IsolatedParser()
    done: list[str] = []

    def busy_mount() -> None:
        for index in range(3):
            _parse_file(parser, costly)
            done.append(f"costly {index}")

    def other_mount() -> None:
        _parse_file(parser, good)
        done.append("good")

    busy = threading.Thread(target=busy_mount, daemon=True)
    other = threading.Thread(target=other_mount, daemon=True)
    try:
        busy.start()
        wait_for(lambda: parser._lock._held, timeout=30)  # the first costly file is parsed
        other.start()
        wait_for(lambda: len(parser._lock._waiting) == 1, timeout=30)  # the other mount waits
        busy.join(timeout=120)
        other.join(timeout=120)
    finally:
        parser.close()
    assert sorted(done) == ["costly 0", "costly 1", "costly 2", "good"]
    assert done.index("good") < done.index("costly 1"), done  # served between the first two


def test_a_generation_touched_faster_than_it_is_checked_waits_once(tmp_path: Path) -> None:
    """Each touch gives a generation a new signature and the tracker a new request; the older
    one still queued is replaced (its verdict would be dropped), so the queue does not grow."""
    job = tmp_path / "job"
    dcp_generation(job / "step-1")
    (request,) = _requests(job, "job")
    touched = [replace(request, signature=(request.signature[0], 1, float(n))) for n in range(5)]
    validator = Validator(Limits())
    for each in touched:
        validator.submit(each, str(job))
    validator.start()
    try:
        answered, verdict = validator.verdicts.get(timeout=30)
        assert answered is touched[-1] and verdict is not None and verdict.valid
        assert validator.verdicts.empty()
    finally:
        validator.stop()
