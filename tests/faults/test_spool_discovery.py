"""A tenant against discovery through the spool. A node-scope process learns the jobs under a
shared discover root from its spool's job directories (it never touches the shared root). The
spool is open to every user (mode 1733), so ``mkdir spool/a{1..200}`` took every ``max_jobs``
slot: each directory was a job, dated now, and the names taken in alphabetical order, so every
real job after them went unmonitored and "the newest are watched" was false.

Now a spool directory is a job only when its last listing found a spool file in it, and the
jobs are taken newest first by the last change of their directories (their spool files'
included), as the shared scanners take a root's subdirectories.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from checkpoint_exporter import instrument
from checkpoint_exporter.sources.spool import Listed, SpoolReader
from tests.conftest import sample, wait_for, write_config

DAY = 86400.0
# A per-job series every process exports, a node-scope one for a spool-only job included.
INFO = "checkpoint_restores_total"
EXCESS = "checkpoint_exporter_discover_excess_jobs"


def _save(spool: Path, job: str, step: int) -> None:
    with instrument.saving(training_job=job, step=step, spool=str(spool)) as save:
        save.resume()
        save.staged()
        save.written()


def _age(directory: Path, seconds: float) -> None:
    """Its spool files and itself last changed ``seconds`` ago."""
    then = time.time() - seconds
    for path in [*directory.iterdir(), directory]:
        os.utime(path, (then, then))


def _node_exporter(tmp_path: Path, exporter, max_jobs: int):  # type: ignore[no-untyped-def]
    config = write_config(tmp_path, f"""
spool: {tmp_path / 'spool'}
discover: [{{root: {tmp_path / 'shared'}, scope: shared, max_jobs: {max_jobs}, poll_interval: 1s}}]
""")  # fmt: skip
    return exporter("--config.file", str(config), "--scope=node")


def test_empty_spool_directories_take_no_max_jobs_slot(tmp_path: Path, exporter) -> None:
    """Before: the 200 directories took the 200 slots, and the job written after them was over
    max_jobs, not watched."""
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o1733)
    served = _node_exporter(tmp_path, exporter, max_jobs=200)
    for index in range(1, 201):
        (spool / f"a{index}").mkdir()
    _save(spool, "jobx", 4)
    saved = time.monotonic()
    wait_for(lambda: served.value(INFO, training_job="jobx") is not None, 20)
    print(f"the real job watched {time.monotonic() - saved:.2f} s after its first save")
    text = served.metrics()
    assert not any(sample(text, INFO, training_job=f"a{i}") for i in range(1, 201))
    assert sample(text, EXCESS, root=str(tmp_path / "shared")) == 0


def test_the_newest_spool_jobs_are_watched(tmp_path: Path, exporter) -> None:
    """max_jobs 2 and three jobs in the spool: the two that wrote last are watched, whatever
    their names. Before: the first two in alphabetical order, the newest left out."""
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o1733)
    for job, days in (("a-oldest", 3), ("b-older", 2), ("c-new", 0)):
        _save(spool, job, 1)
        if days:
            _age(spool / job, days * DAY)
    served = _node_exporter(tmp_path, exporter, max_jobs=2)
    root = str(tmp_path / "shared")
    wait_for(lambda: served.value(EXCESS, root=root) == 1, 20)
    text = served.metrics()
    assert sample(text, INFO, training_job="c-new") is not None
    assert sample(text, INFO, training_job="b-older") is not None
    assert sample(text, INFO, training_job="a-oldest") is None


def test_the_reader_tells_a_job_from_a_mkdir(tmp_path: Path) -> None:
    """In process: per job, the newest change of its directories (its spool files included)
    and whether any holds a spool file, as of their last complete listings; a job's
    ``<job>@<uid>`` directory counts with it."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "h-1.jsonl").write_text("")
    (tmp_path / "job@1000").mkdir()
    (tmp_path / "job@1000" / "h-2.jsonl").write_text("")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("")  # not a spool file
    newest = time.time() - 60
    _age(tmp_path / "job", 3 * DAY)
    os.utime(tmp_path / "job@1000" / "h-2.jsonl", (newest, newest))
    os.utime(tmp_path / "job@1000", (newest - 10, newest - 10))
    reader = SpoolReader(tmp_path, known_jobs=lambda: {"job": None})
    reader.poll()
    reader.poll()
    listed = reader.listed()
    assert listed == {
        "empty": Listed(listed["empty"].mtime, False),
        "job": Listed(newest, True),
        "other": Listed(listed["other"].mtime, False),
    }
    (tmp_path / "empty").rmdir()
    reader.root_relist_min = 0.0  # see it gone at the next poll
    os.utime(tmp_path, (time.time() + 5, time.time() + 5))
    reader.poll()
    assert "empty" not in reader.listed()


def test_a_directory_dated_ahead_of_the_clock_is_not_the_newest(tmp_path: Path) -> None:
    """The spool is this node's: nothing in it is dated ahead of its clock but by a tenant's
    `touch -d 2099`, which made a job the newest for ever (first to a max_jobs slot, never the
    one idle longest). Such a date counts for nothing: the directory is dated by its other
    changes, or ranks oldest."""
    (tmp_path / "forged").mkdir()
    (tmp_path / "forged" / "h-1.jsonl").write_text("")
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "h-2.jsonl").write_text("")
    ahead = time.time() + 365 * DAY
    for path in (tmp_path / "forged" / "h-1.jsonl", tmp_path / "forged"):
        os.utime(path, (ahead, ahead))
    reader = SpoolReader(tmp_path, known_jobs=lambda: {"real": None, "forged": None})
    reader.poll()
    reader.poll()
    listed = reader.listed()
    assert listed["forged"] == Listed(0.0, True)
    assert 0 < listed["real"].mtime <= time.time()
