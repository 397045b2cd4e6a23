"""Prometheus, Alertmanager and the processes around them, for the end-to-end tests."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Webhook:
    """Alertmanager's receiver: collects every notification posted to it."""

    def __init__(self) -> None:
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def firing(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for message in self.received:
            for alert in message["alerts"]:
                if alert["status"] == "firing":
                    out.setdefault(alert["labels"]["alertname"], set()).add(
                        alert["labels"].get("training_job", "")
                    )
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def query(prometheus: str, expr: str) -> list:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as reply:
        answer = json.load(reply)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def stop(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it is still there 10 s later."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
