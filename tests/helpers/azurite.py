"""Azurite's Blob service (Microsoft's Azure Storage emulator, from npm) on 127.0.0.1 (a free
port), for the Azure Blob tests: the real Blob REST protocol, started and stopped by the test
that uses it. Its account is the emulator's well-known devstoreaccount1, whose key is public
(Microsoft documents it for every emulator): never a real secret.

The server is installed by ``make tests/servers/node_modules`` (``npm ci`` of tests/servers);
a worktree may symlink that folder. The tests that need it are marked ``azurite`` (make
test-fast leaves them out); run without it, they fail and say how to install it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.servers import free_port

ACCOUNT = "devstoreaccount1"
# The emulator's documented account key (the same in every Azurite and the old Storage Emulator).
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
SERVERS = Path(__file__).resolve().parents[1] / "servers"
AZURITE_BLOB = SERVERS / "node_modules" / ".bin" / "azurite-blob"


def installed() -> bool:
    return AZURITE_BLOB.exists()


@dataclass(frozen=True)
class Azurite:
    endpoint: str  # http://127.0.0.1:PORT/devstoreaccount1: the account's blob endpoint

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint={self.endpoint};"
        )

    def env(self) -> dict[str, str]:
        """The standard Azure environment that points a client (ours, adlfs) at this server."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

    def service(self):  # type: ignore[no-untyped-def]
        """A plain BlobServiceClient, for the test's own writes."""
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}?comp=list", timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # an unsigned request refused (403): the server is up
    except OSError:
        return False


@contextmanager
def azurite() -> Iterator[Azurite]:
    if not installed():
        raise RuntimeError(
            f"Azurite is not installed ({AZURITE_BLOB}): make tests/servers/node_modules"
        )
    port = free_port()
    process = subprocess.Popen(
        [
            str(AZURITE_BLOB), "--inMemoryPersistence", "--skipApiVersionCheck",
            "--disableTelemetry", "--blobHost", "127.0.0.1", "--blobPort", str(port), "--silent",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # node and anything it forks: one process group to stop
        cwd="/tmp",  # in memory, but it still writes its small config files to its cwd
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}/{ACCOUNT}"
    try:
        deadline = time.monotonic() + 60
        while not _answers(endpoint):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("azurite did not start")
            time.sleep(0.1)
        yield Azurite(endpoint)
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
