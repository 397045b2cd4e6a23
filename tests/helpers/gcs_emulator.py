"""gcp-storage-emulator on 127.0.0.1 (a free port), for the GCS tests: the GCS JSON API (listing,
media download, resumable uploads) over plain HTTP, in memory, started and stopped by the test
that uses it. Clients find it as Google's SDKs (and gcsfs) do: ``STORAGE_EMULATOR_HOST``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

PROJECT = "test-project"  # the emulator accepts any


@dataclass(frozen=True)
class GCSEmulator:
    endpoint: str  # http://127.0.0.1:PORT

    def env(self) -> dict[str, str]:
        """The environment that points Google's SDKs, gcsfs and the exporter at this server
        (no credentials: the emulator is never authenticated)."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def create_bucket(self, name: str) -> None:
        self._request("POST", f"/storage/v1/b?project={PROJECT}", json.dumps({"name": name}))

    def put(self, bucket: str, key: str, data: bytes) -> dict[str, object]:
        """One object, by a multipart upload (the emulator fails a media upload of no bytes);
        its resource as the server answers it."""
        boundary = "gcs-emulator-boundary"
        body = b"".join((
            f"--{boundary}\r\nContent-Type: application/json\r\n\r\n".encode(),
            json.dumps({"name": key}).encode(),
            f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
            data,
            f"\r\n--{boundary}--\r\n".encode(),
        ))  # fmt: skip
        answer = self._request(
            "POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=multipart", body,
            f"multipart/related; boundary={boundary}",
        )  # fmt: skip
        return dict(json.loads(answer))

    def delete(self, bucket: str, key: str) -> None:
        self._request("DELETE", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(key, safe='')}")

    def _request(
        self, method: str, path: str, body: str | bytes | None = None, content_type: str = ""
    ) -> bytes:
        data = body.encode() if isinstance(body, str) else body
        request = urllib.request.Request(f"{self.endpoint}{path}", data=data, method=method)
        if content_type or isinstance(body, str):
            request.add_header("Content-Type", content_type or "application/json")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return bytes(answer.read())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def gcs_emulator() -> Iterator[GCSEmulator]:
    """A running emulator in its own process (the exporter under test and the writers share no
    interpreter with it), stopped on exit."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
         "--port", str(port), "--in-memory", "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{endpoint}/", timeout=1):  # its health check
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("gcp-storage-emulator did not start") from None
                time.sleep(0.1)
        yield GCSEmulator(endpoint)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
