"""The package as an SRE installs it. `scripts/release` builds the wheel (from the sdist), the
sdist and the deploy tarball from a copy of the checkout; the install steps of
docs/install-package.md then run as written, as root, in a mount namespace whose /opt, /etc,
/var, /usr/local and /mnt are overlays over this machine's (so the package really is in
/opt/checkpoint-exporter and the units in /etc/systemd/system, and nothing reaches the machine
itself); the shipped units' command lines serve from that install as their User=. pip reads
only the release and the wheelhouse (`make wheelhouse`), never an index.

The release build takes a while, so the tests that need it run with the daemon tier."""

from __future__ import annotations

import hashlib
import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import checkpoint_exporter
from tests.conftest import REPO, Exporter, require_tool, sample, wait_for
from tests.helpers.trees import dcp_generation

VERSION = checkpoint_exporter.__version__
WHEELHOUSE = REPO / "build" / "wheelhouse"
GUIDE = REPO / "docs" / "install-package.md"
SYSTEMD = REPO / "deploy" / "systemd"
PREFIX = "/opt/checkpoint-exporter"
WHEEL = f"checkpoint_exporter-{VERSION}-py3-none-any.whl"
SDIST = f"checkpoint_exporter-{VERSION}.tar.gz"
DEPLOY = f"checkpoint-exporter-deploy-{VERSION}"
# What the deploy tarball holds, as `git ls-files` names it.
DEPLOYED = ("deploy", "alerts", "dashboards", "LICENSE", "README.md", "CHANGELOG.md")
OVERLAID = ("opt", "etc", "var", "usr/local", "mnt")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _wheelhouse() -> tuple[Path, str]:
    """The wheelhouse, and the Python its wheels are for (the distribution's python3)."""
    if not (WHEELHOUSE / ".complete").exists():
        pytest.fail(f"{WHEELHOUSE} is missing: run `make test` (make wheelhouse) first")
    return WHEELHOUSE, (WHEELHOUSE / ".python").read_text().strip()


def _offline(home: Path, *find_links: Path) -> dict[str, str]:
    """An environment where pip reads these directories alone (no index, config file or cache)
    and nothing of this test's interpreter leaks in: PYTHONPATH would import the checkout
    instead of what was installed."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": SYSTEM_PATH,
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": " ".join(str(directory) for directory in find_links),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_CACHE_DIR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def _git(*args: str, cwd: Path) -> str:
    command = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True).stdout


def _committed_copy(destination: Path) -> Path:
    """The working tree as its next commit would hold it (tracked files and new ones git does
    not ignore), committed in a repository of its own: a clean tree to release."""
    listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=REPO)
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is still listed
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    _git("init", "-q", cwd=destination)
    _git("add", "-A", cwd=destination)
    _git("commit", "-q", "-m", "release", cwd=destination)
    return destination


def _release(checkout: Path, home: Path, **env: str) -> subprocess.CompletedProcess:
    wheelhouse, _ = _wheelhouse()
    return subprocess.run(
        [str(checkout / "scripts" / "release")],
        cwd=checkout, capture_output=True, text=True, timeout=600,
        env={**_offline(home, wheelhouse), "PYTHON": sys.executable, **env},
    )  # fmt: skip


@dataclass
class Release:
    checkout: Path
    dist: Path
    log: str


IMAGE = REPO / "build" / "image"  # scripts/ensure-image: a base pinned by digest, and podman


def _image_env() -> dict[str, str]:
    """What builds the release's image offline, where `make image` made a base for it."""
    if not (IMAGE / "base.ref").exists():
        return {}
    return {
        "IMAGE_ENGINE": str(IMAGE / "podman"),
        "IMAGE_BASE": (IMAGE / "base.ref").read_text().strip(),
        "IMAGE_WHEELHOUSE": str(IMAGE / "wheelhouse"),
    }


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    checkout = _committed_copy(tmp_path_factory.mktemp("checkout"))
    result = _release(checkout, tmp_path_factory.mktemp("home"), **_image_env())
    assert result.returncode == 0, result.stderr[-4000:]
    return Release(checkout, checkout / "dist", result.stderr)


@pytest.mark.daemon
def test_a_release_holds_the_wheel_the_sdist_and_the_deploy_tarball_with_their_sums(
    release: Release,
) -> None:
    dist = release.dist
    image = f"checkpoint-exporter-image-{VERSION}.tar"
    expected = {WHEEL, SDIST, f"{DEPLOY}.tar.gz", "SHA256SUMS"}
    if _image_env():
        expected.add(image)
    else:
        assert "release: no image: " in release.log
    assert {path.name for path in dist.iterdir()} == expected
    sums = dict(
        reversed(line.split("  ", 1)) for line in (dist / "SHA256SUMS").read_text().splitlines()
    )
    assert sums == {
        name: hashlib.sha256((dist / name).read_bytes()).hexdigest()
        for name in expected - {"SHA256SUMS"}
    }
    # build made the wheel from the sdist, so what the sdist lacks the wheel lacks too.
    assert "Building wheel from sdist" in release.log
    package = {
        name
        for name in _git("ls-files", "exporter/checkpoint_exporter", cwd=release.checkout).split()
        if name.endswith((".py", ".md"))
    }
    with zipfile.ZipFile(dist / WHEEL) as wheel:
        members = set(wheel.namelist())
        info = f"checkpoint_exporter-{VERSION}.dist-info"
        metadata = wheel.read(f"{info}/METADATA").decode()
        license_text = wheel.read(f"{info}/licenses/LICENSE")
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert {name.removeprefix("exporter/") for name in package} <= members
    assert f"Version: {VERSION}\n" in metadata
    assert "License-Expression: Apache-2.0\n" in metadata and "License-File: LICENSE\n" in metadata
    assert license_text == (REPO / "LICENSE").read_bytes()
    assert "Apache License" in license_text.decode() and "END OF TERMS AND CONDITIONS" in (
        license_text.decode()
    )
    assert "checkpoint-exporter = checkpoint_exporter.cli:main" in entry_points
    with tarfile.open(dist / SDIST) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"LICENSE", "README.md", "pyproject.toml", *package} <= names


@pytest.mark.daemon
def test_the_deploy_tarball_is_the_committed_deploy_files(release: Release) -> None:
    """Every tracked file of deploy/, alerts/ and dashboards/ (and LICENSE, README, CHANGELOG)
    under one directory, with fixed owners and times, so one commit gives the same bytes."""
    tracked = _git("ls-files", "--", *DEPLOYED, cwd=release.checkout).split()
    assert "deploy/systemd/checkpoint-exporter.service" in tracked
    assert any(name.startswith("alerts/") for name in tracked)
    assert any(name.startswith("dashboards/") for name in tracked)
    with tarfile.open(release.dist / f"{DEPLOY}.tar.gz") as archive:
        members = archive.getmembers()
        assert sorted(member.name for member in members) == sorted(
            f"{DEPLOY}/{name}" for name in tracked
        )
        for member in members:
            content = archive.extractfile(member).read()  # type: ignore[union-attr]
            name = member.name.split("/", 1)[1]
            assert content == (release.checkout / name).read_bytes(), name
            assert (member.uid, member.gid, member.mode & 0o022) == (0, 0, 0), name
    assert {member.mtime for member in members} == {
        int(_git("log", "-1", "--format=%ct", cwd=release.checkout))
    }


def test_a_release_refuses_a_tree_with_changes(tmp_path: Path) -> None:
    checkout = _committed_copy(tmp_path / "checkout")
    with (checkout / "exporter" / "checkpoint_exporter" / "__init__.py").open("a") as init:
        init.write("# an edit nobody committed\n")
    (checkout / "notes.txt").write_text("a file nobody added\n")
    result = _release(checkout, tmp_path / "home")
    assert result.returncode == 1
    assert "exporter/checkpoint_exporter/__init__.py" in result.stderr
    assert "notes.txt" in result.stderr and "RELEASE_ALLOW_DIRTY=1" in result.stderr
    assert not (checkout / "dist").exists()


# --- the install on a node ---------------------------------------------------------------


class Node:
    """This machine with /opt, /etc, /var, /usr/local and /mnt overlaid: whatever a command run
    through it writes there lands in upper directories under ``root`` and nowhere else, and is
    there for the next command."""

    def __init__(self, root: Path):
        self.root = root
        mounts = []
        for name in OVERLAID:
            work = root / "work" / name
            work.mkdir(parents=True)
            self.upper(name).mkdir(parents=True)
            options = f"lowerdir=/{name},upperdir={self.upper(name)},workdir={work}"
            mounts.append(f"mount -t overlay overlay -o {shlex.quote(options)} /{name}")
        self._mounts = "; ".join(mounts)

    def upper(self, name: str) -> Path:
        """Where what is written under /name lands."""
        return self.root / "upper" / name

    def command(self, script: str, *args: str) -> list[str]:
        """argv that runs a bash script (with its $1...) in a fresh mount namespace with the
        overlays mounted; the mounts die with it."""
        return [
            require_tool("unshare"), "--mount", "--propagation", "private",
            "bash", "-euo", "pipefail", "-c", f"{self._mounts}; {script}", "bash", *args,
        ]  # fmt: skip

    def run(self, script: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(script, *args), capture_output=True, text=True, timeout=300, **kwargs
        )


def _install_steps() -> list[str]:
    """The guide's install block, line by line."""
    block = re.search(r"```sh\n(python3 -m venv .*?)```", GUIDE.read_text(), re.S)
    assert block, f"{GUIDE}: the install block (```sh, from `python3 -m venv`) is gone"
    return block.group(1).splitlines()


def _unit_setting(unit: Path, key: str) -> str:
    found = re.findall(rf"^{key}=(.*)$", unit.read_text(), re.M)
    assert len(found) == 1, f"{unit}: {key}= {found}"
    return found[0]


def test_every_unit_runs_the_installed_command_and_says_how_to_install_it() -> None:
    """ExecStart names the virtualenv the guide creates, and each install command a unit's
    comment gives (`#   $ ...`) is a line of the guide's block, which the test below runs."""
    steps = _install_steps()
    assert steps[0] == f"python3 -m venv {PREFIX}"
    given = []
    for unit in sorted(SYSTEMD.glob("*.service")):
        assert _unit_setting(unit, "ExecStart").startswith(f"{PREFIX}/bin/checkpoint-exporter ")
        assert "docs/install-package.md" in unit.read_text(), unit.name
        for command in re.findall(r"^#\s+\$ (.*)$", unit.read_text(), re.M):
            assert command in steps, f"{unit.name}: `{command}` is not in {GUIDE.name}"
            given.append(command)
    assert "systemctl enable --now checkpoint-exporter" in given


def _as_user_of(unit: Path) -> str:
    """A script that runs its arguments as the unit's User= and Group=, as systemd would."""
    user, group = _unit_setting(unit, "User"), _unit_setting(unit, "Group")
    return f'exec setpriv --reuid={user} --regid={group} --clear-groups -- "$@"'


# What systemd gives a service: no PYTHONPATH, no virtualenv of the test's.
SERVICE_ENV = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"}


class Service(Exporter):
    """A unit's ExecStart= run as its User= through a Node; read, scraped and stopped as the
    tests' other exporters are."""

    def __init__(self, node: Node, unit: Path):  # not Exporter's: its own command line
        argv = shlex.split(_unit_setting(unit, "ExecStart"))
        self.process = subprocess.Popen(
            node.command(_as_user_of(unit), *argv), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=SERVICE_ENV,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.base = self._wait_for_url(timeout=60)


@pytest.mark.root
@pytest.mark.daemon
def test_the_guides_install_serves_under_the_shipped_units(
    release: Release, tmp_path: Path
) -> None:
    wheelhouse, python = _wheelhouse()
    node = Node(tmp_path / "node")
    unpacked = tmp_path / "unpacked"
    with tarfile.open(release.dist / f"{DEPLOY}.tar.gz") as archive:
        archive.extractall(unpacked, filter="data")
    unpacked = unpacked / DEPLOY
    # Before the install systemd refuses the unit, as it did on a node where nothing put the
    # command where ExecStart says (the verification below is not vacuous).
    before = node.run("systemd-analyze verify deploy/systemd/checkpoint-exporter.service",
                      cwd=unpacked)  # fmt: skip
    assert before.returncode != 0
    assert f"Command {PREFIX}/bin/checkpoint-exporter is not executable" in before.stderr

    # The guide's block as written. No systemd runs here: systemctl is a stand-in that records
    # what it is asked, and what it would do follows (verify, then the unit's command line).
    stand_ins = tmp_path / "stand-ins"
    stand_ins.mkdir()
    (stand_ins / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/systemctl.log\n')
    (stand_ins / "systemctl").chmod(0o755)
    env = _offline(tmp_path / "home", wheelhouse, release.dist)
    # python3 is the distribution's, whose version the wheelhouse's wheels are for.
    env["PATH"] = f"{stand_ins}:{Path(python).parent}:{SYSTEM_PATH}"
    installed = node.run("\n".join(_install_steps()), cwd=unpacked, env=env)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert f"checkpoint-exporter {VERSION}\n" in installed.stdout
    asked = (tmp_path / "systemctl.log").read_text().splitlines()
    assert asked == ["daemon-reload", "enable --now checkpoint-exporter"]
    assert (node.upper("opt") / "checkpoint-exporter" / "bin" / "checkpoint-exporter").exists()

    units = node.upper("etc") / "systemd" / "system"
    verified = node.run(
        "systemd-analyze verify checkpoint-exporter.service"
        " checkpoint-exporter-restore-drill@llama70b.service"
        " checkpoint-exporter-restore-drill@llama70b.timer checkpoint-exporter-shared@0-2.service"
    )
    assert verified.returncode == 0 and verified.stdout + verified.stderr == "", verified.stderr

    # What the administrator does next: a checkpoint root with a job in it, and (for this test)
    # a port of its own on loopback instead of :25780.
    dcp_generation(node.upper("mnt") / "ckpt" / "llama70b" / "step-100")
    config = node.upper("etc") / "checkpoint-exporter" / "config.yaml"
    settings = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**settings, "web": {"listen_address": "127.0.0.1:0"}}))

    service = Service(node, units / "checkpoint-exporter.service")
    try:
        assert service.get("/healthz").status == 200
        assert service.get("/runbooks").status == 200  # package data: the wheel came from the sdist

        def scraped() -> str | None:
            text = service.metrics()
            valid = sample(text, "checkpoint_last_committed_valid", training_job="llama70b")
            return text if valid == 1 else None

        metrics = wait_for(scraped, timeout=60)
        assert sample(metrics, "checkpoint_last_committed_step", training_job="llama70b") == 100
        assert sample(metrics, "checkpoint_exporter_build_info", version=VERSION) == 1
        # The spool tmpfiles made, writable by training jobs, read as the unit's user.
        assert sample(metrics, "checkpoint_exporter_spool_writable") == 1
        assert service.stop()[0] == 0, "".join(service.log)
    finally:
        service.close()

    # The drill unit's command line, instance llama70b, on the checkpoint the service read.
    drill = units / "checkpoint-exporter-restore-drill@.service"
    argv = [arg.replace("%i", "llama70b") for arg in shlex.split(_unit_setting(drill, "ExecStart"))]
    drilled = node.run(_as_user_of(drill), *argv, env=SERVICE_ENV)
    assert drilled.returncode == 0, drilled.stdout + drilled.stderr


@pytest.mark.daemon
def test_pipx_installs_the_wheel(release: Release, tmp_path: Path) -> None:
    wheelhouse, python = _wheelhouse()
    env = {
        **_offline(tmp_path / "home", wheelhouse),
        "PIPX_HOME": str(tmp_path / "pipx"),
        "PIPX_BIN_DIR": str(tmp_path / "bin"),
        "PIPX_MAN_DIR": str(tmp_path / "man"),
        "PIPX_DEFAULT_PYTHON": python,
    }
    pipx = [sys.executable, "-m", "pipx"]
    installed = subprocess.run([*pipx, "install", str(release.dist / WHEEL)], env=env,
                               capture_output=True, text=True, timeout=300)  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    command = tmp_path / "bin" / "checkpoint-exporter"
    version = subprocess.run([str(command), "--version"], capture_output=True, text=True,
                             env=env, timeout=60)  # fmt: skip
    assert version.stdout == f"checkpoint-exporter {VERSION}\n"
    checked = subprocess.run(
        [str(command), "check-config", "--config.file", str(SYSTEMD / "config.yaml")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
