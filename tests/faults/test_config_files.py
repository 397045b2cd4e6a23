"""Configuration files that are not files: a FIFO, a character device, a file too large to be a
configuration, a file on a mount that stopped answering. Each read (the first load, a SIGHUP
reload, --web.config.file, the mixin config, check-config) takes a regular file only, up to a
size cap and within a deadline; anything else is a clear error naming the file, and for a
reload a failed reload (checkpoint_exporter_config_last_reload_successful 0), never a hang.

The adversarial run these reproduce: a SIGHUP while the config path was a FIFO blocked every
later reload and still reported success; a config linked to /dev/zero was read until memory ran
out.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from checkpoint_exporter import schema
from checkpoint_exporter.schema import ConfigError, read_config_text
from tests.conftest import CLI, wait_for, write_config

RELOADED = "checkpoint_exporter_config_last_reload_successful"
MEMORY_LIMIT = 1024 * 1024 * 1024  # for the CLI under test: /dev/zero read whole would pass it


def _cli(*args: str) -> subprocess.CompletedProcess:
    """The CLI under a 1 GiB address-space limit, killed after 60 s (a hang fails the test)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=60, preexec_fn=limit, check=False
    )


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _device(path: Path) -> Path:
    path.symlink_to("/dev/zero")
    return path


def _huge(path: Path) -> Path:
    with open(path, "wb") as sparse:  # 5 GiB of holes: no disk, no memory until read
        sparse.truncate(5 * 1024**3)
    return path


NOT_FILES = {
    "fifo": (_fifo, "not a regular file (a FIFO)"),
    "device": (_device, "not a regular file (a character device)"),
    "huge": (_huge, f"larger than {schema.MAX_CONFIG_BYTES // 1024 // 1024} MiB"),
}
VERBS = {
    "serve": lambda path: ("serve", "--web.listen-address", "127.0.0.1:0", "--config.file", path),
    "web config": lambda path: ("serve", "--web.config.file", path),
    "check-config": lambda path: ("check-config", "--config.file", path),
    "mixin config": lambda path: ("rules", "--config.file", path, "--output-dir", "/nonexistent"),
}


@pytest.mark.daemon
@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("kind", NOT_FILES)
def test_a_config_that_is_not_a_regular_file_is_refused_naming_it(
    tmp_path: Path, verb: str, kind: str
) -> None:
    make, reason = NOT_FILES[kind]
    path = make(tmp_path / "config.yaml")
    result = _cli(*VERBS[verb](str(path)))
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{path}: {reason}" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_read_that_does_not_answer_is_an_error_after_the_deadline(
    tmp_path: Path, monkeypatch
) -> None:
    """A config on a mount that stopped answering: the read is given up (the thread that made
    it is left to the kernel) and said so; a later read does not queue behind it."""
    path = write_config(tmp_path, "jobs: []\n")
    release = threading.Event()
    reads = []

    def hung(file: Path, limit: int) -> str:
        reads.append(file)
        release.wait()
        raise OSError("the mount came back, too late")

    monkeypatch.setattr(schema, "CONFIG_READ_SECONDS", 0.1)
    monkeypatch.setattr(schema, "_read_regular", hung)
    try:
        for _ in range(2):
            with pytest.raises(ConfigError, match=r"did not answer within 0\.1 s"):
                read_config_text(path)
        assert len(reads) == 2
        # Past MAX_HUNG_READS reads still stuck, none is even tried: no thread piles up.
        for _ in range(schema.MAX_HUNG_READS):
            with pytest.raises(ConfigError):
                read_config_text(path)
        assert len(reads) == schema.MAX_HUNG_READS
        with pytest.raises(ConfigError, match=r"earlier reads .* have not returned"):
            read_config_text(path)
    finally:
        release.set()
    wait_for(lambda: schema.hung_reads() == 0)
    monkeypatch.undo()
    assert read_config_text(path) == "jobs: []\n"


@pytest.mark.daemon
def test_a_reload_of_a_fifo_fails_and_the_next_reload_works(tmp_path: Path, exporter) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    spool = f"spool: {tmp_path / 'spool'}\n"
    config = write_config(tmp_path, f"{spool}jobs: [{{name: a, path: {a}}}]\n")
    served = exporter("--config.file", str(config))
    assert served.value(RELOADED) == 1

    config.unlink()
    _fifo(config)  # nobody ever writes to it: open() without O_NONBLOCK waits forever
    served.process.send_signal(signal.SIGHUP)
    wait_for(lambda: served.value(RELOADED) == 0)
    assert any(
        "configuration reload failed" in line and f"{config}: not a regular file (a FIFO)" in line
        for line in served.drain_log()
    )

    config.unlink()
    config.write_text(f"{spool}jobs: [{{name: a, path: {a}}}, {{name: b, path: {b}}}]\n")
    served.process.send_signal(signal.SIGHUP)
    wait_for(lambda: served.value(RELOADED) == 1)
    wait_for(lambda: served.value("checkpoint_job_info", training_job="b") == 1)
    code, _ = served.stop()
    assert code == 0


@pytest.mark.daemon
@pytest.mark.root
def test_a_reload_from_a_hung_mount_fails_after_the_deadline(tmp_path: Path, exporter) -> None:
    """The config's directory stops answering (a hard NFS mount whose server went away): the
    reload fails once the read's deadline passes; once the mount answers again, so does the
    next reload."""
    from tests.faults.hungfs import hung_mount, tmpfs

    a = tmp_path / "a"
    a.mkdir()
    with tmpfs(tmp_path / "etc") as etc:
        config = write_config(etc, f"spool: {tmp_path / 'spool'}\njobs: [{{name: a, path: {a}}}]\n")
        served = exporter("--config.file", str(config))
        assert served.value(RELOADED) == 1
        with hung_mount(etc):
            served.process.send_signal(signal.SIGHUP)
            wait_for(lambda: served.value(RELOADED) == 0, timeout=schema.CONFIG_READ_SECONDS + 10)
            assert any(f"{config}: did not answer within" in line for line in served.drain_log())
        served.process.send_signal(signal.SIGHUP)
        wait_for(lambda: served.value(RELOADED) == 1, timeout=schema.CONFIG_READ_SECONDS + 10)
        code, _ = served.stop()
        assert code == 0
