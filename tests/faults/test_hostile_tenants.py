"""A tenant who can write in the checkpoint tree tries to redirect or blind the daemon: a
discovered job root or a generation swapped for a symlink after it was seen, permissions flipped
to 000 and back. Nothing outside the tree is read, and nothing is lost or counted twice."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from checkpoint_exporter.core.tracker import ValidationRequest
from checkpoint_exporter.daemon.validator import Validator
from checkpoint_exporter.sources.listing import OpsBudget, TreeReader
from checkpoint_exporter.sources.validate import Limits
from tests.conftest import as_nobody, parse_samples, sample, wait_for, write_config
from tests.helpers.hostile import allocation_bomb, metadata_naming, refused_global
from tests.helpers.trees import dcp_generation, scan

pytestmark = [pytest.mark.root, pytest.mark.daemon]


def test_a_subdirectory_swapped_for_a_symlink_is_not_entered(tmp_path: Path) -> None:
    job = tmp_path / "job"
    dcp_generation(job / "step-1")
    outside = tmp_path / "outside"
    dcp_generation(outside / "deep", shards=50)
    (job / "step-1" / "sub").mkdir()
    reader = TreeReader(job, OpsBudget())
    reader.read()
    shutil.rmtree(job / "step-1" / "sub")
    (job / "step-1" / "sub").symlink_to(outside)
    tree, _ = reader.read(force=True)
    assert "sub" not in tree.subdirs["step-1"].subdirs
    assert tree.totals().files == 3  # step-1's own; nothing of the 51 files outside


def test_a_root_that_becomes_a_symlink_is_reported_not_followed(tmp_path: Path) -> None:
    job = tmp_path / "job"
    dcp_generation(job / "step-1")
    other = tmp_path / "other"
    dcp_generation(other / "step-9", shards=7)
    reader = TreeReader(job, OpsBudget())
    tree, _ = reader.read()
    assert set(tree.subdirs) == {"step-1"}
    shutil.rmtree(job)
    job.symlink_to(other)
    tree, stats = reader.read(force=True)
    assert tree is None
    assert stats.errors == [("", "is a symlink: not followed")]
    configured = TreeReader(job, OpsBudget())  # configured as a symlink: the operator's choice
    tree, _ = configured.read()
    assert set(tree.subdirs) == {"step-9"}


def test_a_discovered_job_swapped_for_a_symlink_exports_nothing_of_the_target(
    tmp_path: Path, exporter
) -> None:
    root = tmp_path / "discover"
    dcp_generation(root / "attacker" / "step-1")
    dcp_generation(tmp_path / "victim" / "step-77", shards=9)
    config = write_config(
        tmp_path,
        f"discover: [{{root: {root}, layout: dcp, forget_after: 1h, watch: poll,"
        " poll_interval: 1s}]\n",
    )
    served = exporter("--config.file", str(config))
    wait_for(lambda: served.value("checkpoint_last_committed_valid", training_job="attacker"))
    moved = tmp_path / "moved"
    os.rename(root / "attacker", moved)
    (root / "attacker").symlink_to(tmp_path / "victim")
    wait_for(
        lambda: "is a symlink: not followed" in "".join(served.drain_log()), timeout=15
    )  # the discover root is polled; the job's reader refuses the swapped root
    text = served.metrics()
    # Still its own last known state (step 1, 3 files), nothing of the victim's (step 77, 10).
    assert sample(text, "checkpoint_last_committed_step", training_job="attacker") == 1
    assert sample(text, "checkpoint_last_committed_files", training_job="attacker") == 3
    assert sample(text, "checkpoint_retained_generations", training_job="attacker") == 1


def test_permissions_flipped_to_000_and_back_lose_nothing_and_count_nothing(exporter) -> None:
    """Run as nobody: the tenant makes the job (and then one generation) unreadable for a while.
    The last known state stays, no generation is deleted and counted again as a new commit, and
    the job is current again within a poll once readable."""
    base = Path(tempfile.mkdtemp(prefix="ckpt-flip-"))
    try:
        os.chmod(base, 0o755)
        job = base / "job"
        for step in (1, 2, 3):
            dcp_generation(job / f"step-{step}")
        subprocess.run(["chmod", "-R", "go+rX", str(job)], check=True)
        config = write_config(
            base,
            f"defaults: {{watch: poll, poll_interval: 1s}}\n"
            f"jobs: [{{name: j, path: {job}, layout: dcp}}]\n",
        )
        os.chmod(config, 0o644)
        served = exporter("--config.file", str(config), prefix=as_nobody())

        def figures() -> tuple:
            samples = parse_samples(served.metrics())
            return tuple(
                samples.get(f'{name}{{training_job="j"}}')
                for name in (
                    "checkpoint_retained_generations",
                    "checkpoint_saves_committed_total",
                    "checkpoint_last_committed_step",
                )
            )

        expected = (3, 0, 3)
        wait_for(lambda: figures() == expected)
        scans = "checkpoint_exporter_scan_duration_seconds_count"
        for target, new_step in ((job, 4), (job / "step-3", 5)):
            os.chmod(target, 0o000)
            wait_for(lambda: "permission denied" in "".join(served.drain_log()), timeout=10)
            for _ in range(3):  # several polls (1 s each) while unreadable, each one counted
                read = served.value(scans)
                wait_for(lambda r=read: served.value(scans) > r, timeout=10)
                assert figures() == expected
            os.chmod(target, 0o755)
            dcp_generation(job / f"step-{new_step}")
            subprocess.run(["chmod", "-R", "go+rX", str(job)], check=True)
            expected = (expected[0] + 1, expected[1] + 1, new_step)
            wait_for(lambda e=expected: figures() == e, timeout=5)
        assert figures() == (5, 2, 5)  # two real saves, nothing counted twice
    finally:
        subprocess.run(["chmod", "-R", "u+rwX", str(base)], check=False)
        subprocess.run(["rm", "-rf", str(base)], check=True)


def test_the_validator_does_not_follow_a_generation_swapped_for_a_symlink(tmp_path: Path) -> None:
    """Listed as a directory, swapped for a symlink to another job's checkpoint before the
    validator reads it: no verdict from the other job's files (judged again on the next scan,
    where the listing shows the symlink)."""
    job = tmp_path / "job"
    dcp_generation(job / "step-1")
    (job / "step-1" / "__0_0.distcp").unlink()  # broken: its own verdict would be invalid
    _, found = scan(job, "dcp")
    dcp_generation(tmp_path / "victim" / "step-1")
    shutil.rmtree(job / "step-1")
    (job / "step-1").symlink_to(tmp_path / "victim" / "step-1")
    item = found["step-1"]
    request = ValidationRequest("j", "durable", "step-1", (item.bytes, item.files, 0.0), item)
    validator = Validator(Limits())
    validator.start()
    try:
        validator.submit(request, str(job), follow_root=False)
        assert validator.verdicts.get(timeout=10) == (request, None)
    finally:
        validator.stop()


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_an_allocation_bomb_in_metadata_never_reaches_the_daemons_memory(
    tmp_path: Path, exporter
) -> None:
    """16 MiB of `}` (an empty dict each: ~1 GiB to parse) as a generation's .metadata, beside
    a healthy job: the bomb is bad_metadata, the daemon's peak RSS stays small, the other job's
    commits still show, and the parser recovers for the next file."""
    bomb_job, good_job = tmp_path / "bomb", tmp_path / "good"
    dcp_generation(bomb_job / "step-1")
    (bomb_job / "step-1" / ".metadata").write_bytes(b"\x80\x04" + b"}" * (16 << 20))
    dcp_generation(good_job / "step-1")
    config = write_config(
        tmp_path,
        f"jobs: [{{name: bomb, path: {bomb_job}, layout: dcp}},"
        f" {{name: good, path: {good_job}, layout: dcp}}]\n",
    )
    served = exporter("--config.file", str(config))
    wait_for(
        lambda: served.value("checkpoint_last_committed_valid", training_job="bomb") == 0,
        timeout=60,
    )
    dcp_generation(good_job / "step-2")
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="good") == 2)
    wait_for(lambda: served.value("checkpoint_last_committed_valid", training_job="good") == 1)
    dcp_generation(bomb_job / "step-2")  # the parser, restarted, judges the next file
    wait_for(lambda: served.value("checkpoint_last_committed_valid", training_job="bomb") == 1)
    assert "parsing needs more than" in "".join(served.drain_log())
    peak = _peak_rss_mb(served.process.pid)
    print(f"exporter peak RSS with the bomb: {peak:.0f} MB")
    assert peak < 200


def _children(pid: int) -> list[int]:
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit()
        and _field(entry / "stat", lambda text: text.rsplit(")", 1)[1].split()[1]) == str(pid)
    ]


def _field(path: Path, pick) -> str | None:  # type: ignore[no-untyped-def]
    try:
        return pick(path.read_text())
    except (OSError, IndexError):
        return None  # exited meanwhile


def test_a_refusal_that_repeats_a_48_mib_file_stays_out_of_the_daemon(
    tmp_path: Path, exporter
) -> None:
    """A shard path of 48 MiB of NUL, and a module name of 48 MiB, beside a healthy job: each is
    bad_metadata, logged in a line of bounded length that says how long the value was; the
    daemon's peak RSS stays small (it was 970 MB: the refusal came back over the worker's socket
    as a 201 MB JSON string, then as one 251-million-character log line)."""
    size = 48 << 20
    jobs = {
        "nul": metadata_naming("\0" * size),
        "module": refused_global("m" * size),
    }
    for name, data in jobs.items():
        dcp_generation(tmp_path / name / "step-1")
        (tmp_path / name / "step-1" / ".metadata").write_bytes(data)
    good = tmp_path / "good"
    dcp_generation(good / "step-1")
    entries = [
        f"{{name: {name}, path: {tmp_path / name}, layout: dcp}}" for name in [*jobs, "good"]
    ]
    config = write_config(tmp_path, f"jobs: [{', '.join(entries)}]\n")
    served = exporter("--config.file", str(config))
    for name in jobs:
        wait_for(
            lambda name=name: (
                served.value("checkpoint_last_committed_valid", training_job=name) == 0
            ),
            timeout=120,
        )
    dcp_generation(good / "step-2")
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="good") == 2)
    wait_for(lambda: served.value("checkpoint_last_committed_valid", training_job="good") == 1)
    log = served.drain_log()
    assert sum(f"{size:,} characters" in line for line in log) == 2, log
    longest = max(len(line) for line in log)
    peak = _peak_rss_mb(served.process.pid)
    workers = [_peak_rss_mb(child) for child in _children(served.process.pid)]
    print(f"daemon peak RSS {peak:.0f} MB, parser worker peak {max(workers, default=0):.0f} MB,"
          f" longest log line {longest} characters")  # fmt: skip
    assert longest < 20_000
    assert peak < 200


def test_an_allocation_bomb_too_big_for_its_bound_under_the_cap_is_judged(
    tmp_path: Path, exporter
) -> None:
    """48 MiB of `}`: past 24 times its size the worker would pass its 768 MiB cap, so it fails
    at the cap. The newest generation is still judged (bad_metadata, valid 0), once: not left
    unchecked and asked again every 30 s, with the gauge showing its predecessor's valid 1."""
    job = tmp_path / "job"
    dcp_generation(job / "step-1")
    config = write_config(tmp_path, f"jobs: [{{name: j, path: {job}, layout: dcp}}]\n")
    served = exporter("--config.file", str(config))
    wait_for(lambda: served.value("checkpoint_last_committed_valid", training_job="j") == 1)
    # Put in place whole, as DCP renames its .metadata: one written in place can be read empty
    # first ("Ran out of input", judged again once it is whole), and the log raced the gauge.
    dcp_generation(tmp_path / "staged")
    (tmp_path / "staged" / ".metadata").write_bytes(allocation_bomb(48 << 20))
    (tmp_path / "staged").rename(job / "step-2")
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="j") == 2)
    wait_for(
        lambda: served.value("checkpoint_last_committed_valid", training_job="j") == 0, timeout=60
    )
    log = "".join(served.drain_log())
    assert "an allocation bomb" in log and "not checked" not in log
    print(f"daemon peak RSS with a 48 MiB bomb: {_peak_rss_mb(served.process.pid):.0f} MB")
