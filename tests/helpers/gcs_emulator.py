"""gcp-storage-emulator on 127.0.0.1 (a free port), for the GCS tests: the GCS JSON API (listing,
media download, resumable uploads) over plain HTTP, in memory, started and stopped by the test
that uses it. Clients find it as Google's SDKs (and gcsfs) do: ``STORAGE_EMULATOR_HOST``."""

from __future__ import annotations

import base64
import http.server
import json
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tests.helpers.servers import serving

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


@contextmanager
def gcs_emulator() -> Iterator[GCSEmulator]:
    """A running emulator in its own process (the exporter under test and the writers share no
    interpreter with it), stopped on exit."""
    with serving(
        lambda port: [sys.executable, "-m", "gcp_storage_emulator", "start", "--host",
                      "127.0.0.1", "--port", str(port), "--in-memory", "--quiet"],
        "/", "gcp-storage-emulator",  # "/" is its health check
    ) as endpoint:  # fmt: skip
        yield GCSEmulator(endpoint)


@dataclass
class Front:
    """A proxy before the emulator, for what it does not do as GCS does. It pages listings
    (gcp-storage-emulator ignores ``maxResults`` and ``pageToken``: every listing is one page),
    answers the statuses queued in ``faults`` first (throttling), can drop the ``Range`` header
    (a store that ignores it), keeps each request's path and Authorization header, and hands
    out a token to any POST (an OAuth token endpoint, for credentials that refresh)."""

    emulator: GCSEmulator
    endpoint: str = ""
    faults: list[int] = field(default_factory=list)
    fault_body: bytes = b""
    ignore_range: bool = False
    seen: list[tuple[str, str]] = field(default_factory=list)  # (path, Authorization)
    token: str = "ya29.test-token-never-real"  # what its OAuth token endpoint (POST) hands out


def _page(answer: dict[str, object], query: dict[str, list[str]]) -> dict[str, object]:
    """One page of a whole listing as GCS pages it: names and prefixes in one order, at most
    ``maxResults`` of them, the token naming the last one given."""
    items = {str(item["name"]): item for item in answer.get("items") or ()}  # type: ignore[union-attr]
    prefixes = [str(prefix) for prefix in answer.get("prefixes") or ()]  # type: ignore[union-attr]
    names = sorted([*items, *prefixes])
    after = base64.urlsafe_b64decode(query["pageToken"][0]).decode() if "pageToken" in query else ""
    names = [name for name in names if name > after]
    size = int(query.get("maxResults", ["1000"])[0])
    shown, more = names[:size], names[size:]
    page: dict[str, object] = {
        "kind": "storage#objects",
        "items": [items[name] for name in shown if name in items],
        "prefixes": [name for name in shown if name not in items],
    }
    if more:
        page["nextPageToken"] = base64.urlsafe_b64encode(shown[-1].encode()).decode()
    return page


@contextmanager
def front(emulator: GCSEmulator) -> Iterator[Front]:
    state = Front(emulator)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.seen.append((self.path, self.headers.get("Authorization", "")))
            if state.faults:
                self._answer(state.faults.pop(0), state.fault_body)
                return
            url = urllib.parse.urlsplit(self.path)
            headers = {"Range": self.headers["Range"]} if self.headers.get("Range") else {}
            if state.ignore_range:
                headers = {}
            request = urllib.request.Request(f"{emulator.endpoint}{self.path}", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    status, body = answer.status, answer.read()
            except urllib.error.HTTPError as error:
                status, body = error.code, error.read()
            if status == 200 and url.path.endswith("/o"):  # a listing
                query = urllib.parse.parse_qs(url.query)
                body = json.dumps(_page(json.loads(body), query)).encode()
            self._answer(status, body)

        def do_POST(self) -> None:
            """An OAuth token endpoint: any refresh gets ``state.token``."""
            state.seen.append((self.path, self.headers.get("Authorization", "")))
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            token = {"access_token": state.token, "expires_in": 3600, "token_type": "Bearer"}
            self._answer(200, json.dumps(token).encode())

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
