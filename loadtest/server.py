"""A service in a subprocess on a free loopback port, for replays and tests.

Only starts the ``linreboot serve`` command: nothing here imports the service.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import IO

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def server_process(
    env: dict[str, str], workers: int = 1, timeout_seconds: float = 60.0,
    port: int | None = None, log: IO[bytes] | None = None,
) -> Iterator[str]:
    """Run ``linreboot serve`` in a subprocess on ``port`` (default: a free one); yields
    its base URL. ``log``: a file for its log lines (default: this process's stderr)."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "linreboot", "serve", "--host", "127.0.0.1",
           "--port", str(port), "--workers", str(workers)]
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, timeout_seconds)
        yield url
    finally:
        proc.terminate()  # graceful: the server also stops (and saves) its embedded Redis
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} during start-up")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"server at {url} not ready after {timeout_seconds:.0f} s")
