"""Who owns the embedded Redis: one process per data directory, and only it stops the server.

Real processes throughout: ``EmbeddedRedis`` in this process and in children
that are killed with SIGKILL, and ``linreboot serve`` with two workers whose
parent is killed, as an operator's ``kill -9`` would leave them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import psutil
import pytest
import redis

from loadtest.server import free_port, server_process
from service.embedded import LOCK_FILENAME, DataDirInUse, EmbeddedRedis, OrphanedRedisInUse
from tests.conftest import ADMIN, ADMIN_TOKEN, COVARIATES

ROOT = Path(__file__).resolve().parents[1]
# What a data directory may hold after a clean stop: the data, the lock, Redis's log.
DATA_FILES = {"appendonly.aof", "linreboot.rdb", LOCK_FILENAME, "redis.log"}


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory of the test's own, for this process and the processes it starts."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setenv("TMPDIR", str(directory))
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


def _redis_pids(data_dir: Path) -> list[int]:
    """redis-server processes whose data directory is ``data_dir``."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if ("redis-server" in process.name() and process.status() != psutil.STATUS_ZOMBIE
                    and Path(process.cwd()) == data_dir.resolve()):
                found.append(process.pid)
    return found


def _wait_gone(pids: list[int], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(pid)
            while process.status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < deadline, f"pid {pid} still running"
                time.sleep(0.05)


def _kill(pids: list[int], sig: int = signal.SIGTERM) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    _wait_gone(pids)


_OWNER = """\
import os, sys, time
from pathlib import Path
from service.embedded import EmbeddedRedis
embedded = EmbeddedRedis(Path(sys.argv[1])).start()
print(embedded.url, flush=True)
time.sleep(600)  # until killed
"""


@contextlib.contextmanager
def _killed_owner(data_dir: Path) -> Iterator[str]:
    """A child that starts the embedded Redis and is then killed with SIGKILL; its Redis URL."""
    child = subprocess.Popen([sys.executable, "-c", _OWNER, str(data_dir)], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        assert url.startswith("unix://"), url
        child.kill()
        child.wait()
        yield url
    finally:
        child.kill()
        child.wait()
        _kill(_redis_pids(data_dir))


# -- in one process: the lock and the clean stop ------------------------------------------


def test_a_second_owner_of_a_data_directory_is_refused_and_the_first_keeps_redis(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    first = EmbeddedRedis(data_dir).start()
    try:
        client = redis.Redis.from_url(first.url)
        with pytest.raises(DataDirInUse) as refused:
            EmbeddedRedis(data_dir).start()
        message = str(refused.value)
        assert "\n" not in message and str(data_dir) in message
        assert f"pid {os.getpid()}" in message and "--data-dir" in message
        assert client.ping()  # the refused start stopped nothing
        client.close()
    finally:
        first.stop()
    again = EmbeddedRedis(data_dir).start()  # the lock went with the owner's stop
    again.stop()


def test_a_clean_stop_leaves_nothing_behind(tmp_path: Path, private_tmp: Path) -> None:
    data_dir = tmp_path / "data"
    embedded = EmbeddedRedis(data_dir).start()
    client = redis.Redis.from_url(embedded.url)
    pid = int(client.info("server")["process_id"])  # type: ignore[index]
    client.set("k", "v")
    client.close()
    embedded.stop()
    embedded.stop()  # twice is harmless

    assert not psutil.pid_exists(pid)  # stopped and reaped
    assert list(private_tmp.iterdir()) == []  # no socket or pid directory left
    assert {p.name for p in data_dir.iterdir()} <= DATA_FILES
    assert (data_dir / LOCK_FILENAME).read_text() == ""  # nothing recorded as running


# -- what a killed owner leaves ---------------------------------------------------------------


def test_a_redis_left_by_a_killed_owner_is_stopped_and_replaced_when_unused(
    tmp_path: Path, private_tmp: Path
) -> None:
    data_dir = tmp_path / "data"
    with _killed_owner(data_dir) as orphan_url:
        (orphan_pid,) = _redis_pids(data_dir)
        orphan = redis.Redis.from_url(orphan_url)
        orphan.set("kept", "yes")  # acknowledged, possibly not yet fsynced: SHUTDOWN saves it
        orphan.close()
        leftover = list(private_tmp.iterdir())
        assert len(leftover) == 1  # the killed owner's runtime directory

        embedded = EmbeddedRedis(data_dir).start()
        try:
            assert _redis_pids(data_dir) != [orphan_pid]  # a server of its own
            assert not leftover[0].exists()  # the killed owner's directory cleared
            client = redis.Redis.from_url(embedded.url)
            assert client.get("kept") == b"yes"
            client.close()
        finally:
            embedded.stop()
        assert _redis_pids(data_dir) == []


def test_a_redis_left_by_a_killed_owner_is_kept_while_a_process_uses_it(
    tmp_path: Path, private_tmp: Path
) -> None:
    data_dir = tmp_path / "data"
    with _killed_owner(data_dir) as orphan_url:
        # A process told to use that Redis, and connected, as the workers of `linreboot serve`.
        script = ("import os, redis, time; c = redis.Redis.from_url(os.environ["
                  "'LINREBOOT_REDIS_URL']); c.ping(); print('up', flush=True); time.sleep(600)")
        user = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "LINREBOOT_REDIS_URL": orphan_url})
        try:
            assert user.stdout is not None and user.stdout.readline() == "up\n"
            with pytest.raises(OrphanedRedisInUse) as refused:
                EmbeddedRedis(data_dir).start()
            message = str(refused.value)
            assert "\n" not in message and f"kill {user.pid}" in message
            assert redis.Redis.from_url(orphan_url).ping()  # still there for its user
        finally:
            user.kill()
            user.wait()
        embedded = EmbeddedRedis(data_dir).start()  # its user gone: now it is replaced
        embedded.stop()


# -- `linreboot serve` ---------------------------------------------------------------------


def _serve(port: int, data_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "linreboot", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--data-dir", str(data_dir), *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "LINREBOOT_REDIS_URL": "", "REDIS_URL": "",
            "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN, "LINREBOOT_LOG_LEVEL": "warning"}


def _refusal(command: list[str], env: Mapping[str, str]) -> str:
    """Run a serve that must refuse to start; its one line of stderr."""
    result = subprocess.run(command, env=dict(env), cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 3, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], result.stderr[-2000:]
    return lines[0]


def _ready(url: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(url)


@pytest.mark.slow
def test_a_second_serve_on_a_data_directory_is_refused_and_the_first_keeps_serving(
    tmp_path: Path, private_tmp: Path
) -> None:
    data_dir = tmp_path / "data"
    env = {"LINREBOOT_DATA_DIR": str(data_dir), "LINREBOOT_REDIS_URL": "",
           "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN}
    with server_process(env) as url:
        line = _refusal(_serve(free_port(), data_dir), _env())
        assert str(data_dir) in line and "in use" in line and "--data-dir" in line
        created = httpx.post(f"{url}/experiments", json=COVARIATES, headers=ADMIN, timeout=10)
        assert created.status_code == 201, created.text
    assert list(private_tmp.iterdir()) == []  # the first one's clean stop left nothing


@pytest.mark.slow
def test_orphaned_workers_are_reported_keep_their_redis_and_are_replaced_once_stopped(
    tmp_path: Path, private_tmp: Path
) -> None:
    data_dir, port = tmp_path / "data", free_port()
    url = f"http://127.0.0.1:{port}"
    parent = subprocess.Popen(_serve(port, data_dir, "--workers", "2"), env=_env(), cwd=ROOT)
    workers: list[int] = []
    try:
        _ready(url)
        assert httpx.post(f"{url}/experiments", json=COVARIATES, headers=ADMIN,
                          timeout=10).status_code == 201
        workers = sorted(p.pid for p in psutil.Process(parent.pid).children()
                         if "spawn_main" in " ".join(p.cmdline()))
        assert len(workers) == 2
        parent.kill()  # kill -9: the workers keep the port and the embedded Redis
        parent.wait()

        # Same port: the orphans hold it. Named, and left alone.
        line = _refusal(_serve(port, data_dir), _env())
        assert f"port {port}" in line and f"kill {workers[0]} {workers[1]}" in line
        # Another port: the orphans still use the Redis. Named, and it is left alone.
        line = _refusal(_serve(free_port(), data_dir), _env())
        assert str(data_dir) in line and "kill" in line
        assert all(str(pid) in line.split("kill", 1)[1] for pid in workers)
        for _ in range(4):  # both orphans still serve, from the Redis they had
            got = httpx.get(f"{url}/experiments/cov", headers=ADMIN, timeout=10)
            assert got.status_code == 200, got.text

        _kill(workers)  # what the line said to do
        with server_process({"LINREBOOT_DATA_DIR": str(data_dir), "LINREBOOT_REDIS_URL": "",
                             "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN}) as fresh:
            got = httpx.get(f"{fresh}/experiments/cov", headers=ADMIN, timeout=10)
            assert got.status_code == 200, got.text  # the data survived the hand-over
            assert len(_redis_pids(data_dir)) == 1
        assert _redis_pids(data_dir) == []
        assert list(private_tmp.iterdir()) == []
    finally:
        parent.kill()
        parent.wait()
        _kill(workers, signal.SIGKILL)
        _kill(_redis_pids(data_dir))


@pytest.mark.slow
def test_serve_with_two_workers_stops_clean(tmp_path: Path, private_tmp: Path) -> None:
    data_dir = tmp_path / "data"
    env = {"LINREBOOT_DATA_DIR": str(data_dir), "LINREBOOT_REDIS_URL": "",
           "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN}
    with server_process(env, workers=2) as url:
        assert httpx.get(f"{url}/metrics", timeout=10).status_code == 200
        assert len(_redis_pids(data_dir)) == 1
        (runtime,) = private_tmp.iterdir()  # the Redis socket's, and in it the metrics'
        assert any(p.name.startswith("linreboot-metrics-") for p in runtime.iterdir())
    assert _redis_pids(data_dir) == []
    assert list(private_tmp.iterdir()) == []
    assert {p.name for p in data_dir.iterdir()} <= DATA_FILES


def test_the_lock_is_not_inherited_by_children(tmp_path: Path) -> None:
    """A child that outlives the owner (a worker, the server) must not keep the directory locked."""
    data_dir = tmp_path / "data"
    embedded = EmbeddedRedis(data_dir).start()
    try:
        script = textwrap.dedent("""\
            import fcntl, sys
            with open(sys.argv[1], "a+") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    sys.exit(0)
            sys.exit(1)
        """)
        held = subprocess.run([sys.executable, "-c", script, str(data_dir / LOCK_FILENAME)],
                              check=False)
        assert held.returncode == 0  # locked while the owner runs
        (server_pid,) = _redis_pids(data_dir)
        open_files = {f.path for f in psutil.Process(server_pid).open_files()}
        assert str(data_dir / LOCK_FILENAME) not in open_files
    finally:
        embedded.stop()
