"""Scopes and sharding (DESIGN "Scopes and sharding"): a process reads only the scopes it is told
(--scope), a shared-scope process only the jobs of its shard (--shard, Prometheus' hashmod), and
a tier outside them is never touched."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest

from checkpoint_exporter import cli, instrument
from checkpoint_exporter.config import NODE, SHARED, Serving, hashmod, parse_serving
from checkpoint_exporter.exposition.collectors import enabled_collectors
from checkpoint_exporter.exposition.renderer import Renderer
from checkpoint_exporter.model import (
    COMMITTED,
    DURABLE,
    STAGING,
    SYMPTOMS,
    DaemonState,
    Generation,
    HistogramState,
    JobState,
    Snapshot,
    WatchedPath,
)
from tests.conftest import parse_samples, sample, wait_for, write_config
from tests.helpers.trees import dcp_generation

# md5 of the name, its last 8 bytes as a big-endian uint64, modulo N: computed apart from the
# code under test, with `printf %s NAME | md5sum | cut -c17-32` and bc.
#   llama70b  F49305F1CA4DC13D = 17623436302870233405
#   job-0     EECE6D84F2F58480 = 17207811644008531072
#   job-1     53442A598FFAB484 =  5999967167720371332
#   gpt-4     C2386D8E8DB44093 = 13995056301084000403
KNOWN = {
    ("llama70b", 2): 1, ("llama70b", 3): 0, ("llama70b", 7): 3,
    ("job-0", 2): 0, ("job-0", 3): 1, ("job-0", 7): 2,
    ("job-1", 2): 0, ("job-1", 3): 0, ("job-1", 7): 4,
    ("gpt-4", 2): 1, ("gpt-4", 3): 1, ("gpt-4", 7): 2,
}  # fmt: skip


def test_hashmod_is_prometheus_hashmod() -> None:
    for (name, modulus), shard in KNOWN.items():
        assert hashmod(name, modulus) == shard, (name, modulus)
        assert Serving(frozenset({SHARED}), shard, modulus).owns(name)
        assert not Serving(frozenset({SHARED}), (shard + 1) % modulus, modulus).owns(name)


def test_serving_flags() -> None:
    assert parse_serving(None, None) == Serving()
    assert parse_serving("node", None) == Serving(frozenset({NODE}))
    assert parse_serving("shared,node", None) == Serving()
    assert parse_serving("shared", "1/4") == Serving(frozenset({SHARED}), 1, 4)
    for scope, shard, reason in (
        ("shared", "2/2", "must be below 2"),
        ("shared", "0/0", "at least 1"),
        ("shared", "1", "expected i/N"),
        ("node", "0/2", "needs the shared scope"),
        ("rack", None, "expected node, shared or node,shared"),
    ):
        with pytest.raises(ValueError, match=reason):
            parse_serving(scope, shard)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--scope=shared", "--shard=2/2"], "--shard=2/2: the shard index must be below 2"),
        (["--scope=shared", "--shard=0/0"], "number of shards must be at least 1"),
        (["--scope=node", "--shard=0/2"], "--shard=0/2 needs the shared scope"),
    ],
)
def test_flag_errors_exit_2(flags: list[str], message: str, capsys) -> None:
    assert cli.main(["serve", "--web.listen-address", "127.0.0.1:0", *flags]) == 2
    assert message in capsys.readouterr().err


def _job(durable_scanned: bool, staging_scanned: bool = True) -> JobState:
    generation = Generation("step-7", DURABLE, 7, COMMITTED, 100.0, 110.0, 110.0, 64, 2, True)
    return JobState(
        name="j",
        layout="dcp",
        paths=(
            WatchedPath(DURABLE, "/shared/j", "poll", "/shared", scanned=durable_scanned),
            WatchedPath(STAGING, "/local/j", "inotify", "/local", scanned=staging_scanned),
        ),
        interval_seconds=900.0,
        deadline_seconds=60.0,
        retained_generations_limit=3,
        restore_drill_max_age_seconds=86400.0,
        generations=(generation,),
        saves_committed=1,
        save_duration=(("total", HistogramState((60.0,), (1, 0), 4.0)),),
        last_phases=(("pause", 1.0), ("total", 4.0)),
        last_write_end=109.0,
        last_committed_valid=True,
        drain_backlog_bytes=64,
        version=1,
    )


def _render(job: JobState, daemon: DaemonState | None = None) -> str:
    snapshot = Snapshot((job,), daemon or DaemonState(ready=True))
    return Renderer(lambda: snapshot, enabled_collectors({})).render(generate_latest).decode()


def _families(text: str) -> set[str]:
    return {key.partition("{")[0] for key in parse_samples(text)}


FROM_THE_TREE = {
    "checkpoint_last_committed_timestamp_seconds", "checkpoint_last_committed_step",
    "checkpoint_last_committed_valid", "checkpoint_saves_in_progress",
    "checkpoint_retained_generations", "checkpoint_saves_committed_total",
    "checkpoint_validation_failures_total", "checkpoint_drain_backlog_bytes",
}  # fmt: skip
FROM_THIS_NODE = {
    "checkpoint_last_save_phase_seconds",
    "checkpoint_last_save_local_write_end_timestamp_seconds", "checkpoint_restores_total",
}  # fmt: skip
# One account per job, kept by the process that sees its durable commit.
DEADLINE_ACCOUNT = {
    "checkpoint_save_duration_seconds_count", "checkpoint_deadline_misses_total",
    "checkpoint_saves_within_deadline_total",
}  # fmt: skip
OBJECTIVES = {
    "checkpoint_interval_seconds", "checkpoint_deadline_seconds",
    "checkpoint_deadline_bucket_info", "checkpoint_retained_generations_limit",
}  # fmt: skip


def test_a_tier_read_elsewhere_exports_no_series_from_its_tree() -> None:
    everything = _render(_job(durable_scanned=True))
    assert _families(everything) >= FROM_THE_TREE | FROM_THIS_NODE | DEADLINE_ACCOUNT | OBJECTIVES

    node_only = _render(_job(durable_scanned=False))
    assert not (FROM_THE_TREE | DEADLINE_ACCOUNT) & _families(node_only)
    # It reads the staging tier: its own drain is judged against the objectives.
    assert _families(node_only) >= FROM_THIS_NODE | OBJECTIVES
    assert sample(node_only, "checkpoint_last_save_phase_seconds", phase="total") == 4.0
    # The tiers it reads are listed; the other is another process's.
    assert sample(node_only, "checkpoint_job_info", tier=STAGING) == 1
    assert sample(node_only, "checkpoint_job_info", tier=DURABLE) is None
    assert sample(node_only, "checkpoint_exporter_watch_info", tier=DURABLE) is None


def test_a_job_known_from_the_spool_alone_exports_its_ranks_clocks_only() -> None:
    """Every node of a job on a shared tree knows it from its spool: were each to export its
    objectives and deadline account, each per-job rule would reduce one copy per node."""
    spool_only = _render(_job(durable_scanned=False, staging_scanned=False))
    families = _families(spool_only)
    assert families >= FROM_THIS_NODE
    assert not (FROM_THE_TREE | DEADLINE_ACCOUNT | OBJECTIVES) & families
    assert sample(spool_only, "checkpoint_last_save_phase_seconds", phase="pause") == 1.0
    # The state timeline's row for this node: once its ranks' saves were read here.
    local = "checkpoint_local_saves_in_progress"
    assert sample(spool_only, local) is None
    saving = replace(
        _job(durable_scanned=False, staging_scanned=False), saves_timed=True,
        local_saves_in_progress=1,
    )  # fmt: skip
    assert sample(_render(saving), local, training_job="j") == 1
    # Its symptom counters only where it diagnosed one; every symptom where a tree is read.
    counted = replace(
        _job(durable_scanned=False, staging_scanned=False), save_symptoms=(("straggler", 2),)
    )
    symptoms = "checkpoint_save_symptoms_total"
    assert sample(_render(counted), symptoms, symptom="straggler") == 2
    assert sample(_render(counted), symptoms, symptom="contention") is None
    assert sample(_render(_job(durable_scanned=True)), symptoms, symptom="contention") == 0


def test_shard_info_only_when_told() -> None:
    job = _job(durable_scanned=True)
    assert "checkpoint_exporter_shard_info" not in _families(_render(job))
    told = _render(job, DaemonState(ready=True, shard_info=(1, 4, "shared")))
    assert sample(told, "checkpoint_exporter_shard_info", shard="1", shards="4", scope="shared")


# --- the real process ---------------------------------------------------------------------------

GENERATION_FAMILIES = (
    "checkpoint_last_committed_step",
    "checkpoint_last_committed_timestamp_seconds",
    "checkpoint_saves_in_progress",
    "checkpoint_retained_generations",
    "checkpoint_saves_committed_total",
    "checkpoint_validation_failures_total",
)


def _fake_mounts(tmp_path: Path, nfs: Path) -> Path:
    """A mount table placing ``nfs`` on an NFS export (the rest on the local root)."""
    procfs = tmp_path / "proc"
    (procfs / "self").mkdir(parents=True)
    (procfs / "self" / "mountinfo").write_text(
        "22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw\n"
        f"97 22 0:53 / {nfs} rw,relatime shared:60 - nfs4 filer:/ckpt rw,vers=4.2\n"
    )
    return procfs


SHARED_JOBS = ("declared", "on-nfs")
# A shared job's objectives and deadline account: the shared scanners', not every node's.
SHARED_SCANNERS_ACCOUNT = (
    "checkpoint_deadline_seconds",
    "checkpoint_interval_seconds",
    "checkpoint_deadline_misses_total",
    "checkpoint_save_duration_seconds_count",
)


def _save_events(spool: Path, job: str, step: int) -> None:
    """One rank's instrumented save, as a training job on this node writes it."""
    with instrument.saving(training_job=job, step=step, spool=str(spool)) as save:
        save.staged()
        save.resume()
        time.sleep(0.05)
        save.written()


def test_a_node_scope_process_reads_only_node_trees(tmp_path: Path, exporter) -> None:
    """`local` (scope node) is read; `declared` (scope: shared) and `on-nfs` (auto, on an NFS
    mount) are not: none of their generations shows, yet their ranks' clocks from this node's
    spool do."""
    local, declared, nfs = tmp_path / "local", tmp_path / "declared", tmp_path / "nfs"
    for root in (local, declared, nfs / "on-nfs"):
        dcp_generation(root / "step-3")
    spool = tmp_path / "spool"
    config = write_config(tmp_path, f"""
spool: {spool}
defaults: {{layout: dcp, poll_interval: 1s}}
jobs:
  - {{name: local, path: {local}, scope: node}}
  - {{name: declared, path: {declared}, scope: shared}}
  - {{name: on-nfs, path: {nfs / "on-nfs"}}}
""")  # fmt: skip
    procfs = _fake_mounts(tmp_path, nfs)
    served = exporter("--config.file", str(config), "--path.procfs", str(procfs), "--scope=node")
    for job in SHARED_JOBS:
        _save_events(spool, job, 3)

    def timed_from_the_spool() -> str | None:
        text = served.metrics()
        phase = "checkpoint_last_save_phase_seconds"
        done = [sample(text, phase, training_job=job, phase="total") for job in SHARED_JOBS]
        return text if all(seconds is not None for seconds in done) else None

    text = wait_for(timed_from_the_spool)
    assert sample(text, "checkpoint_last_committed_step", training_job="local") == 3
    for job in SHARED_JOBS:
        for family in GENERATION_FAMILIES + SHARED_SCANNERS_ACCOUNT:
            assert sample(text, family, training_job=job) is None, (job, family)
        assert sample(text, "checkpoint_job_info", training_job=job) is None, job
        assert sample(text, "checkpoint_last_save_phase_seconds", training_job=job, phase="pause")
    assert sample(text, "checkpoint_exporter_ready") == 1
    scanned = "checkpoint_exporter_last_scan_timestamp_seconds"
    assert sample(text, scanned, training_job="local")
    assert sample(text, scanned, training_job="declared") is None
    assert sample(text, "checkpoint_exporter_shard_info", shard="0", shards="1", scope="node")
    log = "".join(served.drain_log())
    assert "job=on-nfs tier=durable" in log and "scope shared, outside" in log


@pytest.mark.root
def test_a_node_scope_process_never_touches_a_shared_tree(tmp_path: Path, exporter) -> None:
    """A shared tree that hangs on every lookup (a FUSE mount nobody serves): a node-scope
    process starts, gets ready and stops as if it were not there -- no stat at load, no
    placement, no read, no statvfs."""
    from tests.faults.hungfs import hung_mount

    local = tmp_path / "local"
    dcp_generation(local / "step-1")
    with hung_mount(tmp_path / "hung") as hung:
        config = write_config(tmp_path, f"""
spool: {tmp_path / "spool"}
jobs:
  - {{name: local, path: {local}, layout: dcp}}
  - {{name: shared, path: {hung}, scope: shared}}
""")  # fmt: skip
        # A config check that stat-ed the hung path would log "did not answer" (asserted below).
        served = exporter("--config.file", str(config), "--scope=node")
        text = served.metrics()
        assert sample(text, "checkpoint_last_committed_step", training_job="local") == 1
        assert sample(text, "checkpoint_exporter_mount_stuck", mountpoint=str(hung)) is None
        assert sample(text, "checkpoint_filesystem_size_bytes", mountpoint=str(hung)) is None
        assert "did not answer" not in "".join(served.drain_log())
        code, _ = served.stop()  # a hung exit fails in stop(): its wait has a timeout
        assert code == 0


@pytest.mark.root
def test_a_node_scope_process_finds_a_shared_roots_jobs_in_its_spool(
    tmp_path: Path, exporter
) -> None:
    """A discover root marked shared, on a mount that hangs on every lookup: a node-scope
    process learns the jobs whose ranks run on this node from its spool's job directories, so
    the DaemonSet need not mount the shared root at all, and never touches it."""
    from tests.faults.hungfs import hung_mount

    spool = tmp_path / "spool"
    with hung_mount(tmp_path / "hung") as hung:
        config = write_config(tmp_path, f"""
spool: {spool}
discover: [{{root: {hung}, scope: shared, poll_interval: 1s}}]
""")  # fmt: skip
        served = exporter("--config.file", str(config), "--scope=node")
        _save_events(spool, "jobx", 4)  # its directory appears: the job is found (as history)
        known = "checkpoint_restores_total"  # a per-job series every process exports
        wait_for(lambda: served.value(known, training_job="jobx") is not None, 15)
        saved_at = time.time()
        _save_events(spool, "jobx", 5)  # a save of the job now known is timed
        write_end = "checkpoint_last_save_local_write_end_timestamp_seconds"
        wait_for(lambda: (served.value(write_end, training_job="jobx") or 0) >= saved_at, 15)
        text = served.metrics()
        assert sample(text, "checkpoint_exporter_mount_stuck", mountpoint=str(hung)) is None
        assert "cannot list discover root" not in "".join(served.drain_log())
        code, _ = served.stop()  # a hung exit fails in stop(): its wait has a timeout
        assert code == 0


def test_shards_split_the_shared_jobs_disjointly_and_completely(tmp_path: Path, exporter) -> None:
    names = [f"job-{index}" for index in range(8)]
    for name in names:
        dcp_generation(tmp_path / "ckpt" / name / "step-2")
    jobs = "".join(
        f"  - {{name: {name}, path: {tmp_path / 'ckpt' / name}, scope: shared}}\n" for name in names
    )
    config = write_config(tmp_path, f"spool: {tmp_path / 'spool'}\ndefaults: {{layout: dcp}}\n"
                          f"jobs:\n{jobs}")  # fmt: skip
    shards = [
        exporter("--config.file", str(config), "--scope=shared", f"--shard={index}/2")
        for index in range(2)
    ]
    owned = []
    for index, served in enumerate(shards):
        text = served.metrics()
        assert sample(text, "checkpoint_exporter_shard_info", shard=str(index), shards="2",
                      scope="shared") == 1  # fmt: skip
        mine = {n for n in names if sample(text, "checkpoint_job_info", training_job=n)}
        for name in mine:
            assert sample(text, "checkpoint_last_committed_step", training_job=name) == 2
        for name in set(names) - mine:  # nothing at all of another shard's job
            assert not [k for k in parse_samples(text) if f'training_job="{name}"' in k], name
        assert mine == {n for n in names if hashmod(n, 2) == index}
        owned.append(mine)
    assert owned[0] and owned[1] and not owned[0] & owned[1]
    assert owned[0] | owned[1] == set(names)


def test_default_serving_is_the_one_machine_shape() -> None:
    """No flag: both scopes, one shard, every job; the snapshot carries no shard_info."""
    serving = Serving()
    assert serving.default and serving.scope_label == "node,shared"
    assert all(serving.serves(scope, n) for scope in (NODE, SHARED) for n in ("a", "job-0"))
    assert replace(serving, scopes=frozenset({NODE})).tracks("any")
    assert not Serving(frozenset({SHARED}), 1, 2).tracks("job-0")


def test_a_node_that_times_a_shared_jobs_saves_exports_every_symptom_from_zero() -> None:
    """Once its spool shows the job's saves, a node-scope process exports all 7 symptom counters
    at 0, so the first straggler this node sees is an increase() from 0, not a series born at 1
    (which increase() misses). A job it merely knows, with no save here, costs no series."""
    spool_only = _job(durable_scanned=False, staging_scanned=False)
    symptoms = "checkpoint_save_symptoms_total"
    timed = _render(replace(spool_only, saves_timed=True))
    assert all(sample(timed, symptoms, symptom=s) == 0 for s in SYMPTOMS)
    assert not any(sample(_render(spool_only), symptoms, symptom=s) for s in SYMPTOMS)
    assert sample(_render(spool_only), symptoms, symptom="straggler") is None
