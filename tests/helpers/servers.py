"""A protocol server the tests run on 127.0.0.1 in a process of its own: started on a free port,
waited for until it answers, stopped on exit (S3's moto, gcp-storage-emulator)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving(
    command: Callable[[int], list[str]], health: str, name: str, env: dict[str, str] | None = None
) -> Iterator[str]:
    """``command(port)`` running until the block ends; yields ``http://127.0.0.1:PORT`` once
    ``health`` (a path) answers."""
    port = free_port()
    process = subprocess.Popen(
        command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{endpoint}{health}", timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
