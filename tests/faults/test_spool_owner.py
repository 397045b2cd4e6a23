"""Tenants against the spool's names: the spool root is open to every user (mode 1733), so
whoever makes ``<spool>/jobB`` first owns it. A squatter who does so before jobB's ranks start
can forge jobB's restores (masking the drill-overdue alert) and saves, and jobB's own ranks,
refused by the squatter's directory, lose every event.

A job's directory is read only when its owner is the job's: the configured ``spool_owner``,
else the owner of the job's checkpoint tree; a directory of another user is refused, counted
(``dropped_bytes_total{reason="owner"}``) and reported (a log line and ``squatted``). The job's
own ranks, finding their directory taken, write beside it into ``<job>@<uid>``, which the reader
trusts when that uid owns it and is the job's.

Tests run as root: the squatter is uid 65534 and the rightful job uid 1000 (setpriv).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_exporter.sources.spool import HOLD, SpoolReader
from tests.conftest import REPO, as_user, require_tool, sample, wait_for, write_config

pytestmark = [pytest.mark.root]

SQUATTER, JOB = 65534, 1000

WRITE = """
import sys
sys.path.insert(0, sys.argv[1])
import checkpoint_exporter_instrument as instrument
spool, job, what = sys.argv[2], sys.argv[3], sys.argv[4]
if what == "drill":
    with instrument.restoring(training_job=job, step=1, spool=spool, drill=True):
        pass
else:
    with instrument.saving(training_job=job, step=int(what), spool=spool) as s:
        s.resume(); s.staged(); s.written()
"""


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory every user can reach, with a spool as deployed (1733) and the vendored
    instrument (the single file a training image copies in)."""
    if os.geteuid() != 0:
        pytest.fail("needs root: the squatter and the job are other users")
    path = Path(tempfile.mkdtemp(prefix="spool-owner-"))
    os.chmod(path, 0o755)
    (path / "spool").mkdir(mode=0o1733)
    os.chmod(path / "spool", 0o1733)
    (path / "vendor").mkdir()
    shutil.copy(
        REPO / "exporter" / "checkpoint_exporter" / "instrument.py",
        path / "vendor" / "checkpoint_exporter_instrument.py",
    )
    subprocess.run(["chmod", "-R", "go+rX", str(path / "vendor")], check=True)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def write_as(uid: int, base: Path, job: str, what: str) -> subprocess.CompletedProcess:
    """A training process of user ``uid`` emits a drill (``what="drill"``) or a save of step
    ``what`` through the vendored instrument."""
    command = [
        require_tool("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
        sys.executable, "-I", "-S", "-c", WRITE, str(base / "vendor"), str(base / "spool"), job,
        what,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)


def squat(base: Path, job: str = "jobB") -> None:
    """The squatter makes ``<spool>/<job>`` before the job does, and forges a drill and a save."""
    write_as(SQUATTER, base, job, "drill")
    write_as(SQUATTER, base, job, "666")
    assert (base / "spool" / job).stat().st_uid == SQUATTER


def events_of(reader: SpoolReader) -> list[tuple[str, int | None, bool]]:
    return sorted((e.event, e.step, e.drill) for p in range(3) for e in reader.poll())


SAVE_7 = sorted((e, 7, False) for e in ("save_start", "resume", "staged", "written", "committed"))


def test_a_squatters_directory_is_refused_and_the_job_writes_beside_it(
    base: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the forged drill and step 666 were read as jobB's, and jobB's ranks got
    'permission denied' from the squatter's directory: all of jobB's own events were lost."""
    squat(base)
    done = write_as(JOB, base, "jobB", "7")
    assert "spool unavailable" not in done.stderr  # the job's events are not lost
    reader = SpoolReader(base / "spool", known_jobs=lambda: {"jobB": frozenset({JOB})})
    with caplog.at_level(logging.WARNING):
        events = events_of(reader)
    assert events == SAVE_7  # no drill, no step 666
    assert reader.dropped_bytes_total["owner"] > 0
    assert reader.squatted == {"jobB": 1}
    (line,) = [r.getMessage() for r in caplog.records if "jobB is owned" in r.getMessage()]
    assert f"{base}/spool/jobB" in line and f"uid {SQUATTER}" in line and f"uid {JOB}" in line
    # Once reported, not again on every poll.
    caplog.clear()
    reader.poll()
    assert not caplog.records


def test_the_squatter_taking_the_fallback_name_too(base: Path) -> None:
    """The squatter can guess ``jobB@1000`` as well: the rank then writes into a directory of
    its own with a name nobody can guess in advance, and the reader trusts it by its owner."""
    squat(base)
    squat(base, f"jobB@{JOB}")
    write_as(JOB, base, "jobB", "7")
    names = sorted(p.name for p in (base / "spool").iterdir())
    assert len(names) == 3 and names[2].startswith(f"jobB@{JOB}.")
    reader = SpoolReader(base / "spool", known_jobs=lambda: {"jobB": frozenset({JOB})})
    assert events_of(reader) == SAVE_7
    assert reader.squatted == {"jobB": 2}


def test_a_symlink_in_place_of_the_jobs_directory_is_not_followed(base: Path) -> None:
    """The squatter's ``jobB`` is a link to a directory of jobB's user (its home, say): the
    job's ranks used to write through it; now they write beside it."""
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    os.chown(elsewhere, JOB, JOB)
    os.symlink(elsewhere, base / "spool" / "jobB")
    os.lchown(base / "spool" / "jobB", SQUATTER, SQUATTER)
    write_as(JOB, base, "jobB", "7")
    assert list(elsewhere.iterdir()) == []
    reader = SpoolReader(base / "spool", known_jobs=lambda: {"jobB": frozenset({JOB})})
    assert events_of(reader) == SAVE_7


def test_a_file_of_another_user_in_the_jobs_own_directory_is_not_read(base: Path) -> None:
    """A job whose directory is writable by others (umask 0): what another user puts in it is
    not the job's."""
    write_as(JOB, base, "jobB", "7")
    os.chmod(base / "spool" / "jobB", 0o777)
    forged = base / "spool" / "jobB" / "h-666.jsonl"  # what any user may now put there
    write_as(SQUATTER, base, "forged", "666")
    shutil.move(next((base / "spool" / "forged").iterdir()), forged)
    forged.write_bytes(forged.read_bytes().replace(b'"forged"', b'"jobB"'))
    assert forged.stat().st_uid == SQUATTER
    reader = SpoolReader(base / "spool", known_jobs=lambda: {"jobB": frozenset({JOB})})
    assert events_of(reader) == SAVE_7
    assert reader.dropped_bytes_total["owner"] > 0
    assert reader.squatted == {}  # the directory is the job's


def test_root_is_trusted_and_holds_nothing_up(base: Path) -> None:
    """Root can do anything on the node anyway: a drill run as root writes ``jobB@0`` beside
    the job's directory, and is read."""
    write_as(JOB, base, "jobB", "7")
    write_as(0, base, "jobB", "drill")
    assert (base / "spool" / "jobB@0").stat().st_uid == 0
    reader = SpoolReader(base / "spool", known_jobs=lambda: {"jobB": frozenset({JOB})})
    events = events_of(reader)
    assert [e for e in events if e[2]] == [("restore_done", 1, True), ("restore_start", 1, True)]
    assert reader.squatted == {}


def test_where_nothing_says_whose_it_is(base: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No ``spool_owner`` and no tree read here (a node-scope process for a shared job): a
    directory with one owner is read, whoever that is. Two users claiming one job is a contest
    nothing can settle: neither is read, both are reported, a drill as root still counts."""
    write_as(JOB, base, "jobB", "7")
    reader = SpoolReader(base / "spool", known_jobs=lambda: {"jobB": None})
    assert events_of(reader) == SAVE_7
    write_as(0, base, "jobB", "drill")  # root: no contest
    squat(base, f"jobB@{SQUATTER}")
    write_as(JOB, base, "jobB", "8")
    reader.root_relist_min = reader.root_relist_max = 0.0  # see the new directories at once
    with caplog.at_level(logging.WARNING):
        events = events_of(reader)
    assert [e[:2] for e in events] == [("restore_done", 1), ("restore_start", 1)]
    assert reader.squatted == {"jobB": 2}
    assert any("more than one owner" in r.getMessage() for r in caplog.records)


def test_held_while_the_owner_is_not_known_yet(base: Path) -> None:
    """At start-up the daemon has not read the job's tree yet: its spool directories wait
    (not read, not refused), so a squatter's history cannot slip in before the owner is
    known; the job's own history is then read as history."""
    squat(base)
    write_as(JOB, base, "jobB", "7")
    owners: dict[str, frozenset[int] | None] = {"jobB": HOLD}
    reader = SpoolReader(base / "spool", known_jobs=lambda: owners)
    assert events_of(reader) == [] and reader.squatted == {}
    assert reader.dropped_bytes_total == {}
    owners["jobB"] = frozenset({JOB})
    events = [e for _ in range(3) for e in reader.poll()]
    assert sorted((e.event, e.step, e.drill) for e in events) == SAVE_7
    assert all(e.history for e in events)
    assert reader.squatted == {"jobB": 1}


@pytest.mark.parametrize("told_by", ["the tree's owner", "spool_owner"])
def test_through_the_exporter(base: Path, exporter, told_by: str) -> None:
    """End to end: jobB's tree belongs to uid 1000, or (a tree root made by root, which says
    nothing) the config says ``spool_owner: 1000``. The squatter's directory, there before the
    exporter started, forges a drill: the drill never shows, the squatted directory is on
    /metrics, and the job's own save (written beside it) is timed."""
    tree = base / "jobB-ckpt"
    tree.mkdir()
    if told_by == "spool_owner":
        policy = f", spool_owner: {JOB}"
    else:
        os.chown(tree, JOB, JOB)
        policy = ""
    squat(base)
    config = write_config(
        base,
        f"spool: {base / 'spool'}\njobs: [{{name: jobB, path: {tree}, layout: dcp{policy}}}]\n",
    )
    served = exporter("--config.file", str(config))
    write_as(SQUATTER, base, "jobB", "drill")  # and live, while it runs
    write_as(JOB, base, "jobB", "7")
    count = "checkpoint_save_duration_seconds_count"
    wait_for(lambda: sample(served.metrics(), count, training_job="jobB", phase="total") == 1)
    text = served.metrics()
    assert sample(text, "checkpoint_exporter_spool_squatted", training_job="jobB") == 1
    owner = sample(text, "checkpoint_exporter_spool_dropped_bytes_total", reason="owner")
    assert owner is not None and owner > 0
    success = "checkpoint_restore_last_success_timestamp_seconds"
    assert sample(text, success, training_job="jobB") is None  # the forged drill
    assert sample(text, "checkpoint_restore_drills_total", training_job="jobB") in (None, 0)
    log = "".join(served.drain_log())
    assert f"{base}/spool/jobB is owned by uid {SQUATTER}" in log, log


def test_a_drill_written_as_the_jobs_user_is_read(base: Path) -> None:
    """No squatter: nothing changes for the job; its directory is the plain ``<job>``."""
    write_as(JOB, base, "jobB", "drill")
    assert sorted(p.name for p in (base / "spool").iterdir()) == ["jobB"]
    (written,) = (base / "spool" / "jobB").iterdir()
    assert written.stat().st_uid == JOB and oct(written.parent.stat().st_mode)[-3:] == "755"
    reader = SpoolReader(base / "spool", known_jobs=lambda: {"jobB": frozenset({JOB})})
    assert [e[0] for e in events_of(reader)] == ["restore_done", "restore_start"]


# --- the restore drill, run as the exporter's own user ------------------------------------------
# The drill runs as the exporter does (the CronJob and the DaemonSet share a uid; the systemd
# drill is the checkpoint-exporter user): it cannot write into the job's 0755 directory and
# writes ``<job>@<its uid>`` beside it. That uid may write drills for any job: its directory is
# read for drill events only, and never makes a second owner.

EXPORTER = 10001  # the image's user


def test_a_drill_run_as_the_exporters_user_is_read(base: Path, shape: str) -> None:
    """Before: ``jobB@10001`` was refused as squatted: the drill's results never read (a false
    weekly CheckpointRestoreDrillOverdue and a CheckpointSpoolSquatted ticket); in the cluster
    shape two owners, neither read: the job's own events lost too."""
    write_as(JOB, base, "jobB", "7")
    write_as(EXPORTER, base, "jobB", "drill")
    assert (base / "spool" / f"jobB@{EXPORTER}").stat().st_uid == EXPORTER
    reader = SpoolReader(base / "spool", known_jobs=lambda: {"jobB": _SHAPES[shape]})
    reader.own_uid = EXPORTER  # as os.geteuid() says in the exporter's own process
    drill = [("restore_done", 1, True), ("restore_start", 1, True)]
    assert events_of(reader) == sorted(SAVE_7 + drill)
    assert reader.squatted == {}
    assert reader.dropped_bytes_total["owner"] == 0


def test_only_drills_are_read_from_the_exporters_user(base: Path, shape: str) -> None:
    """Anything else written as the exporter's uid (a training image run as that user, or the
    exporter's own uid forging a save) is refused and counted, event by event."""
    write_as(JOB, base, "jobB", "7")
    write_as(EXPORTER, base, "jobB", "9")
    write_as(EXPORTER, base, "jobB", "drill")
    reader = SpoolReader(base / "spool", known_jobs=lambda: {"jobB": _SHAPES[shape]})
    reader.own_uid = EXPORTER
    drill = [("restore_done", 1, True), ("restore_start", 1, True)]
    assert events_of(reader) == sorted(SAVE_7 + drill)
    assert reader.dropped_total["not_drill"] == 5  # save_start ... committed of step 9
    assert reader.squatted == {}


def test_the_exporters_user_alone_is_the_jobs_where_nothing_says_whose_it_is(base: Path) -> None:
    """One user runs the exporter and the training (a workstation, a single-tenant node), and
    nothing says whose the job is: its saves are read. Before, the exporter's own uid was read
    for drills only, and every save was refused as not_drill."""
    write_as(EXPORTER, base, "jobB", "7")
    write_as(EXPORTER, base, "jobB", "drill")
    for known in (lambda: {"jobB": None}, None):
        reader = SpoolReader(base / "spool", known_jobs=known)
        reader.own_uid = EXPORTER
        drill = [("restore_done", 1, True), ("restore_start", 1, True)]
        assert events_of(reader) == sorted(SAVE_7 + drill)
        assert reader.dropped_total["not_drill"] == 0


_SHAPES: dict[str, frozenset[int] | None] = {
    "node": frozenset({JOB}),  # the tree's owner (or spool_owner) says whose jobB is
    "cluster": None,  # a node-scope process: nothing says
}


@pytest.fixture(params=sorted(_SHAPES))
def shape(request: pytest.FixtureRequest) -> str:
    return request.param


def test_a_drill_through_the_exporter_run_as_its_own_user(base: Path, exporter) -> None:
    """End to end, as deployed: the exporter runs as its own uid, which owns the spool root
    (1733); the job's tree and directory are uid 1000's; the drill, run as the exporter's uid,
    is counted, and nothing is squatted."""
    os.chown(base / "spool", EXPORTER, EXPORTER)
    tree = base / "jobB-ckpt"
    tree.mkdir()
    os.chown(tree, JOB, JOB)
    config = write_config(
        base, f"spool: {base / 'spool'}\njobs: [{{name: jobB, path: {tree}, layout: dcp}}]\n"
    )
    os.chmod(config, 0o644)
    served = exporter("--config.file", str(config), prefix=as_user(EXPORTER, EXPORTER))
    write_as(JOB, base, "jobB", "7")
    write_as(EXPORTER, base, "jobB", "drill")
    drills = "checkpoint_restore_drills_total"
    wait_for(lambda: sample(served.metrics(), drills, training_job="jobB") == 1, timeout=30)
    text = served.metrics()
    count = "checkpoint_save_duration_seconds_count"
    assert sample(text, count, training_job="jobB", phase="total") == 1
    assert sample(text, "checkpoint_exporter_spool_squatted", training_job="jobB") in (None, 0)
