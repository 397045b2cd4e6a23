"""The read-only guarantee: as an unprivileged user, over root-owned read-only trees, the
exporter works fully, and no system call it makes ever asks to change a watched path."""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, Exporter, as_nobody, require_tool, sample, wait_for, write_config
from tests.helpers.trees import dcp_generation

pytestmark = [pytest.mark.root, pytest.mark.daemon]

# Every system call that creates, changes or removes a file by name.
_MUTATING = (
    "creat",
    "truncate",
    "rename",
    "renameat",
    "renameat2",
    "unlink",
    "unlinkat",
    "mkdir",
    "mkdirat",
    "rmdir",
    "chmod",
    "fchmodat",
    "chown",
    "lchown",
    "fchownat",
    "utimes",
    "utimensat",
    "futimesat",
    "link",
    "linkat",
    "symlink",
    "symlinkat",
    "mknod",
    "mknodat",
    "setxattr",
    "lsetxattr",
    "removexattr",
    "lremovexattr",
)
_WRITE_FLAGS = re.compile(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND")


@pytest.fixture
def read_only_tree() -> Iterator[Path]:
    """Root-owned trees, every directory r-x and every file r-- for everyone."""
    if os.geteuid() != 0:
        pytest.fail("the read-only test runs as root, to drop to nobody (CI runs as root)")
    base = Path(tempfile.mkdtemp(prefix="ckpt-read-only-"))
    os.chmod(base, 0o755)
    for step in (1, 2, 3):
        dcp_generation(base / "trees" / "single" / f"step-{step}")
    for step in (1, 2):
        dcp_generation(base / "trees" / "durable" / f"step-{step}")
    for step in (1, 2, 3):
        dcp_generation(base / "trees" / "staging" / f"step-{step}")
    for directory, _, files in os.walk(base / "trees"):
        os.chmod(directory, 0o555)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o444)
    (base / "spool").mkdir(mode=0o1777)
    os.chmod(base / "spool", 0o1777)
    yield base
    shutil.rmtree(base)


def _exercise(served: Exporter, base: Path, trees: Path) -> None:
    """Every job read, validated and drained as usual; a new generation seen and checked."""

    def fully_working() -> bool:
        text = served.metrics()
        return (
            sample(text, "checkpoint_last_committed_valid", training_job="single") == 1
            and sample(text, "checkpoint_last_committed_valid", training_job="tiered") == 1
            and sample(text, "checkpoint_drain_backlog_generations", training_job="tiered") == 1
        )

    wait_for(fully_working, timeout=30)
    # A new generation, written by its owner, is seen and validated like any other.
    staging = base / "new"
    dcp_generation(staging / "step-4")
    os.rename(staging / "step-4", trees / "single" / "step-4")
    wait_for(lambda: served.value("checkpoint_last_committed_step", training_job="single") == 4)
    wait_for(lambda: served.value("checkpoint_last_committed_valid", training_job="single") == 1)
    text = served.metrics()
    assert sample(text, "checkpoint_exporter_scan_errors_total") == 0
    assert sample(text, "checkpoint_exporter_watch_info", training_job="single", mode="inotify")


def test_unprivileged_over_read_only_trees(read_only_tree: Path, exporter) -> None:
    base, trees = read_only_tree, read_only_tree / "trees"
    config = write_config(base, f"""
spool: {base / "spool"}
defaults: {{layout: dcp}}
jobs:
  - {{name: single, path: {trees / "single"}}}
  - {{name: tiered, path: {trees / "durable"}, staging: {trees / "staging"}}}
""")  # fmt: skip
    os.chmod(config, 0o644)
    trace = base / "syscalls.log"
    strace = [
        # -y: descriptors printed with their paths, since the exporter opens everything
        # relative to a directory descriptor (openat(7</tree/step-1>, ".metadata", ...)).
        require_tool("strace"), "-f", "-qq", "-y", "-o", str(trace),
        "-e", "trace=open,openat,openat2," + ",".join(_MUTATING), *as_nobody(),
    ]  # fmt: skip
    served = exporter("--config.file", str(config), prefix=strace)
    # strace's child is the exporter (setpriv execs it). Signals go to it directly: strace
    # would only detach, leaving it running.
    children = Path(f"/proc/{served.process.pid}/task/{served.process.pid}/children")
    traced = int(children.read_text().split()[0])
    try:
        _exercise(served, base, trees)
        os.kill(traced, signal.SIGTERM)
        assert served.process.wait(timeout=10) == 0  # strace exits with its tracee's status
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(traced, signal.SIGKILL)

    calls = [line for line in trace.read_text().splitlines() if str(trees) in line]
    reads = [line for line in calls if ".metadata" in line and "O_RDONLY" in line]
    assert reads, "the trace saw the exporter read the trees"  # the trace itself works
    opened_for_writing = [line for line in calls if "open" in line and _WRITE_FLAGS.search(line)]
    assert not opened_for_writing, opened_for_writing
    changed = [line for line in calls if re.search(rf"\b({'|'.join(_MUTATING)})\(", line)]
    assert not changed, changed


# Calls that create, write, move or remove files. Only the modules below may make them, for the
# reasons given; none of them handles a watched path.
_WRITERS = {
    "open", "os.open", "write_text", "write_bytes", "os.remove", "os.unlink", "unlink",
    "os.rename", "os.replace", "rename", "os.mkdir", "os.makedirs", "mkdir",
    "os.chmod", "chmod", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copy",
    "shutil.copy2", "shutil.copyfile", "os.truncate", "rmdir", "os.rmdir", "touch",
}  # fmt: skip
_ALLOWED = {
    "demo/cluster.py": "writes the simulated cluster in its own work directory",
    "mixin/generate.py": "writes the repository's generated files",
    "instrument.py": "runs inside training jobs, appending to the spool",
    "sources/spool.py": "removes spool files past spool_retention, and the job directories they "
    "leave empty (the spool is not watched)",
    "acceptance/report.py": "writes the report files `acceptance` is asked to write (--output)",
    "restore.py": "the drill's worker writes its result to a pipe and temporary files only",
    "sources/fsread.py": "opens read-only, O_NOFOLLOW (its flags are checked by the test below); "
    "every read of a watched file or directory goes through it",
    "sources/inotify.py": "creates a pipe to wake its own thread",
    "schema.py": "opens configuration files O_RDONLY | O_NONBLOCK (a FIFO cannot block it); "
    "never a watched path",
    "acceptance/prom.py": "opens URLs (urllib's OpenerDirector.open), no file",
}


def _calls(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        if isinstance(function, ast.Name):
            name = function.id
        elif isinstance(function, ast.Attribute):
            owner = function.value
            name = f"{owner.id}.{function.attr}" if isinstance(owner, ast.Name) else function.attr
            if name not in _WRITERS:
                name = function.attr
        else:
            continue
        if name in _WRITERS:
            found.append((node.lineno, name))
    return found


def test_only_modules_away_from_watched_paths_write_files() -> None:
    package = REPO / "exporter" / "checkpoint_exporter"
    offenders = {}
    for path in sorted(package.rglob("*.py")):
        relative = str(path.relative_to(package))
        calls = _calls(path)
        if calls and relative not in _ALLOWED:
            offenders[relative] = calls
    assert not offenders, f"file-changing calls outside the allowed modules: {offenders}"
    stale = [name for name in _ALLOWED if not (package / name).is_file()]
    assert not stale, f"allowed modules that no longer exist: {stale}"
    fsread = (package / "sources" / "fsread.py").read_text()
    flags = dict(re.findall(r"^(_\w*FLAGS) = (.+)$", fsread, re.M))
    assert set(flags) == {"_FLAGS", "_ROOT_DIRECTORY_FLAGS", "_DIRECTORY_FLAGS"}, flags
    assert "O_RDONLY" in flags["_FLAGS"] and "O_NOFOLLOW" in flags["_FLAGS"]
    assert "O_RDONLY" in flags["_ROOT_DIRECTORY_FLAGS"]
    assert "O_NOFOLLOW" in flags["_DIRECTORY_FLAGS"]
    for value in flags.values():
        assert not re.search(r"O_WRONLY|O_RDWR|O_CREAT|O_APPEND|O_TRUNC", value), value
