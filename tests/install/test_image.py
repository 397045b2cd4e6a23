"""The image, built from the shipped Dockerfile and run as an SRE runs it: read-only root, a
non-root user, the config mounted, scraped from the host on loopback; its HEALTHCHECK with TLS
off and on. This host has no Docker engine and no registry: podman builds and runs it, on a
base assembled from Debian packages and a wheelhouse (scripts/ensure-image, `make image`)."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from checkpoint_exporter import __version__
from tests.conftest import REPO, sample, wait_for, write_config
from tests.exposition.test_web_security import Pki, pki  # noqa: F401  (the certificates, a fixture)
from tests.helpers.alerting import free_port
from tests.helpers.trees import dcp_generation

SETUP = REPO / "build" / "image"  # scripts/ensure-image's default
NOBODY = "65534:65534"
CONFIG_DIR = "/etc/checkpoint-exporter"  # where the image's CMD and HEALTHCHECK look


@dataclass
class Podman:
    """podman with the tests' storage and this host's settings (build/image/podman)."""

    command: Path

    def __call__(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(self.command), *args], capture_output=True, text=True, timeout=timeout
        )
        if check:
            assert result.returncode == 0, f"podman {' '.join(args)}:\n{result.stderr[-3000:]}"
        return result


@pytest.fixture(scope="module")
def podman() -> Podman:
    ready = (SETUP / "podman").exists() and (SETUP / "base.ref").exists()
    if not ready or not (SETUP / "wheelhouse" / ".complete").exists():
        pytest.fail(f"no image setup in {SETUP}: run `make image` (scripts/ensure-image) first")
    return Podman(SETUP / "podman")


@pytest.fixture(scope="module")
def saved(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(the image's ID, its archive): the shipped Dockerfile built by scripts/build-image on the
    Debian base, pinned by digest as a release pins its base, pip offline from the wheelhouse,
    no network at all."""
    archive = tmp_path_factory.mktemp("image") / f"checkpoint-exporter-image-{__version__}.tar"
    result = _build_image(
        "--base", (SETUP / "base.ref").read_text().strip(),
        "--wheelhouse", str(SETUP / "wheelhouse"), "--tag", "checkpoint-exporter:test",
        str(archive),  # the archive's path alone, as scripts/release passes it
        "--", "--network=none",
        engine=str(podman.command),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    built = result.stdout.strip()
    yield built, archive
    podman("rmi", "--force", built, check=False)
    podman("image", "prune", "--force", check=False)  # the build stage's image


@pytest.fixture(scope="module")
def image(saved: tuple[str, Path]) -> str:
    return saved[0]


def _build_image(*args: str, engine: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(REPO / "scripts" / "build-image"), *args], capture_output=True, text=True,
        timeout=900, env={**os.environ, "IMAGE_ENGINE": engine, "PYTHON": sys.executable},
    )  # fmt: skip


@pytest.fixture
def mounted(tmp_path: Path) -> tuple[Path, Path]:
    """(the config directory, the checkpoints' root): readable by anyone, as the files of a
    node are for the exporter's user; a DCP generation of job llama at step 100."""
    config, checkpoints = tmp_path / "config", tmp_path / "ckpt"
    dcp_generation(checkpoints / "llama" / "step-100")
    config.mkdir()
    for path in (tmp_path, config, *checkpoints.rglob("*"), checkpoints):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return config, checkpoints


@pytest.fixture
def container(podman: Podman, image: str) -> Iterator:
    started: list[str] = []

    def run(config: Path, checkpoints: Path, *args: str) -> str:
        name = f"checkpoint-exporter-test-{len(started)}-{free_port()}"
        podman(
            "run", "--detach", "--name", name, "--read-only", "--user", NOBODY,
            "--network=host", "--volume", f"{config}:{CONFIG_DIR}:ro",
            "--volume", f"{checkpoints}:/mnt/ckpt:ro", *args, image,
        )  # fmt: skip
        started.append(name)
        return name

    yield run
    for name in started:
        podman("rm", "--force", "--time", "0", name, check=False)


def _get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _answers(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        return _get(url, context)[0] == 200
    except OSError:  # not listening yet
        return False


def _config(config: Path, port: int, web: str = "") -> None:
    write_config(config, f"""
web: {{listen_address: "127.0.0.1:{port}"{web}}}
jobs:
  - {{name: llama, path: /mnt/ckpt/llama, interval: 15m, deadline: 60s}}
""").chmod(0o644)  # fmt: skip


@pytest.mark.image
def test_the_image_serves_read_only_as_nobody(podman: Podman, container, mounted) -> None:
    config, checkpoints = mounted
    port = free_port()
    _config(config, port)
    name = container(config, checkpoints)
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(base + "/readyz"), timeout=60)

    assert _get(base + "/healthz") == (200, "ok\n")
    status, metrics = _get(base + "/metrics")
    assert status == 200
    assert sample(metrics, "checkpoint_last_committed_step", training_job="llama") == 100
    assert sample(metrics, "checkpoint_exporter_build_info", version=__version__) == 1
    assert podman("exec", name, "id", "-u").stdout.strip() == "65534"
    probe = podman("healthcheck", "run", name, check=False)
    assert probe.returncode == 0, probe.stdout + probe.stderr

    podman("stop", "--time", "20", name, timeout=60)  # SIGTERM: a clean stop, exit 0
    state = podman("inspect", "--format", "{{.State.ExitCode}} {{.HostConfig.ReadonlyRootfs}}",
                   name)  # fmt: skip
    assert state.stdout.split() == ["0", "true"]


@pytest.mark.image
def test_the_healthcheck_speaks_tls_when_the_web_config_turns_it_on(
    podman: Podman,
    container,
    mounted,
    pki: Pki,  # noqa: F811
) -> None:
    """TLS on in the config file's web: block, with a certificate from a CA the image does not
    know: the image's HEALTHCHECK (plain HTTP before `healthcheck`) reports healthy."""
    config, checkpoints = mounted
    for source, target in ((pki.server_cert, "server.crt"), (pki.server_key, "server.key")):
        shutil.copy(source, config / target)
        (config / target).chmod(0o644)  # the test's key: readable by the container's nobody
    web = write_config(config, "tls_server_config: {cert_file: server.crt, key_file: server.key}\n",
                       "web.yaml")  # fmt: skip
    web.chmod(0o644)
    port = free_port()
    _config(config, port, ", config_file: web.yaml")
    name = container(config, checkpoints)
    unverified = ssl.create_default_context()
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
    base = f"https://127.0.0.1:{port}"
    wait_for(lambda: _answers(base + "/readyz", unverified), timeout=60)

    status, metrics = _get(base + "/metrics", unverified)
    assert status == 200 and "checkpoint_last_committed_step" in metrics
    probe = podman("healthcheck", "run", name, check=False)
    assert probe.returncode == 0, probe.stdout + probe.stderr


@pytest.mark.image
def test_the_image_as_built(podman: Podman, image: str) -> None:
    """What `docker inspect` shows an SRE: a non-root user, the HEALTHCHECK (kept only in the
    docker format, which scripts/build-image asks for), the version and base as labels."""
    version = podman("run", "--rm", "--read-only", "--network=none", image, "--version")
    assert version.stdout.strip() == f"checkpoint-exporter {__version__}"
    shown = podman(
        "image", "inspect", "--format",
        '{{.Config.User}}|{{json .Config.Healthcheck.Test}}|'
        '{{index .Config.Labels "org.opencontainers.image.version"}}|'
        '{{index .Config.Labels "org.opencontainers.image.base.name"}}',
        image,
    ).stdout.strip().split("|")  # fmt: skip
    user, healthcheck, label, base = shown
    assert user == "10001:10001"
    assert '"healthcheck"' in healthcheck and f"{CONFIG_DIR}/config.yaml" in healthcheck
    assert label == __version__
    assert base == (SETUP / "base.ref").read_text().strip()


@pytest.mark.image
def test_the_saved_archive_is_the_image_with_its_healthcheck(saved: tuple[str, Path]) -> None:
    """--save (make release) writes a docker-archive: `docker load` and `podman load` read it,
    and unlike an OCI archive it keeps the HEALTHCHECK."""
    built, archive = saved
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert manifest[0]["RepoTags"] == ["localhost/checkpoint-exporter:test"]
        config = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
    assert built.removeprefix("sha256:") in manifest[0]["Config"]
    assert config["config"]["Healthcheck"]["Test"][1:3] == ["checkpoint-exporter", "healthcheck"]


def test_a_release_image_needs_its_base_pinned(tmp_path: Path) -> None:
    """What is saved is released: a base named by tag alone is refused before anything is built
    (no engine is even asked)."""
    for base in ("python:3.11-slim-bookworm", ""):
        result = _build_image("--base", base, "--save", str(tmp_path), engine="false")
        assert result.returncode == 2
        assert "pin its base by digest" in result.stderr and not list(tmp_path.iterdir())
    flavor = _build_image("--flavor", "cuda", engine="false")
    assert flavor.returncode == 2 and "slim or full" in flavor.stderr
