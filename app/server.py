"""Run the service under uvicorn (``linreboot serve``).

Every worker builds its own app with ``create_app()`` from the environment
(uvicorn's ``--factory``), so whatever the workers must share goes into the
environment before they start:

- without ``REDIS_URL``, one embedded Redis started and owned here, its URL
  exported as ``LINREBOOT_REDIS_URL`` (a Redis per worker would split the state);
- with more than one worker, a ``PROMETHEUS_MULTIPROC_DIR`` (a fresh temporary
  directory unless one is given, in the embedded Redis's runtime directory if
  there is one; stale ``*.db`` files in a given one are removed), so that
  ``/metrics`` sums all workers;
- ``LINREBOOT_SERVE_PID``, this process's pid: a worker that outlives this
  process (kill -9) is then recognisably an orphan.

Everything that can stop the service from starting is checked here first,
before any worker starts, and reported as one line on stderr with a non-zero
exit code: a wrong setting (2), a port or data directory in use, orphaned
workers, a Redis that does not answer (3).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

import psutil
import uvicorn

from app.logs import configure_logging
from app.metrics import MULTIPROC_ENV
from app.protocol import HEAD_TIMEOUT_ENV, GuardedHttpToolsProtocol
from service.embedded import EmbeddedRedis
from service.errors import StartupError
from service.experiments import ExperimentService
from service.settings import Settings, unknown_variables

__all__ = ["SERVE_PID_ENV", "serve"]

logger = logging.getLogger("linreboot.serve")

APP_FACTORY = "app.main:create_app"
SERVE_PID_ENV = "LINREBOOT_SERVE_PID"


def serve(
    host: str | None = None,
    port: int | None = None,
    workers: int | None = None,
    data_dir: Path | None = None,
) -> int:
    """Serve until interrupted; arguments override the ``LINREBOOT_*`` settings.

    Returns 0 after a clean stop, or the :class:`StartupError`'s exit code after
    printing its one line.
    """
    given = {"host": host, "port": port, "workers": workers, "data_dir": data_dir}
    overrides: dict[str, object] = {k: v for k, v in given.items() if v is not None}
    try:
        settings = Settings.load(overrides)
        configure_logging(settings.log_level)
        for line in unknown_variables(os.environ):  # a misspelling is not silent
            logger.warning(line)
        for key, value in overrides.items():  # the workers see the settings this process sees
            os.environ[f"LINREBOOT_{key.upper()}"] = str(value)
        os.environ[HEAD_TIMEOUT_ENV] = str(settings.request_head_timeout_seconds)
        # uvicorn re-raises a captured SIGTERM after its shutdown, which would kill
        # this process before the embedded Redis is stopped; a SystemExit unwinds
        # the ExitStack instead (uvicorn restores this handler before re-raising).
        signal.signal(signal.SIGTERM, _exit_on_signal)
        with ExitStack() as stack:
            _prepare(settings, stack)
            uvicorn.run(
                APP_FACTORY,
                factory=True,
                host=settings.host,
                port=settings.port,
                workers=settings.workers,
                log_config=None,  # uvicorn's records go to the root logger: JSON lines
                log_level=settings.log_level,
                access_log=False,  # the app writes its own access log
                http=GuardedHttpToolsProtocol,  # a deadline on each request's head
            )
    except StartupError as exc:
        print(f"linreboot serve: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


def _prepare(settings: Settings, stack: ExitStack) -> None:
    """Check what the workers will need, and start what they share."""
    directory = os.environ.get(MULTIPROC_ENV)
    if directory and not Path(directory).is_dir():
        raise StartupError(f"{MULTIPROC_ENV}: {directory} is not a directory: create it, "
                           "or unset the variable")
    _check_port(settings.host, settings.port)
    runtime_dir = None
    if settings.redis_url is None:
        embedded = EmbeddedRedis(settings.data_dir).start()
        stack.callback(embedded.stop)
        os.environ["LINREBOOT_REDIS_URL"] = embedded.url
        runtime_dir = embedded.runtime_dir  # cleared by the next owner if this one is killed
    else:
        asyncio.run(ExperimentService.check_store(settings))
    _prepare_multiprocess_metrics(settings.workers, stack, runtime_dir)
    os.environ[SERVE_PID_ENV] = str(os.getpid())


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _prepare_multiprocess_metrics(workers: int, stack: ExitStack, parent: Path | None) -> None:
    directory = os.environ.get(MULTIPROC_ENV)
    if directory:
        for stale in Path(directory).glob("*.db"):  # counts of a previous run
            stale.unlink()
    elif workers > 1:
        directory = stack.enter_context(
            tempfile.TemporaryDirectory(prefix="linreboot-metrics-", dir=parent)
        )
        os.environ[MULTIPROC_ENV] = directory


# -- the port ------------------------------------------------------------------


def _check_port(host: str, port: int) -> None:
    """Bind as uvicorn will, and let go: a refusal is one line naming what holds the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except socket.gaierror:
            raise StartupError(
                "LINREBOOT_HOST (--host): not an address or a name this machine can resolve"
            ) from None
        except OSError as exc:
            raise _bind_error(exc, host, port) from None


def _bind_error(exc: OSError, host: str, port: int) -> StartupError:
    if exc.errno == errno.EADDRINUSE:
        return StartupError(_port_in_use(port), exit_code=3)
    if exc.errno == errno.EADDRNOTAVAIL:
        return StartupError("LINREBOOT_HOST (--host): not an address of this machine")
    if exc.errno == errno.EACCES:
        return StartupError(
            f"LINREBOOT_PORT (--port): port {port} needs privileges; choose 1024 or above"
        )
    return StartupError(f"cannot listen on {host} port {port}: {exc.strerror}", exit_code=3)


def _port_in_use(port: int) -> str:
    holders = _listeners(port)
    orphans = [p.pid for p in holders if _orphaned_worker(p)]
    if orphans:
        pids = " ".join(map(str, orphans))
        return (f"port {port} is held by the workers of a linreboot serve that is gone "
                f"(pids {pids}): stop them (kill {pids}) and start again")
    who = ", ".join(f"pid {p.pid} ({_name(p)})" for p in holders) or "another process"
    return (f"port {port} is in use by {who}: stop it, or choose another port "
            "(LINREBOOT_PORT or --port)")


def _listeners(port: int) -> list[psutil.Process]:
    """The processes listening on ``port`` that this user may see, in pid order.

    Process by process: workers share their parent's listening socket, and the
    system-wide table names only one process per socket.
    """
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   for c in process.net_connections(kind="inet")):
                found.append(process)
    return sorted(found, key=lambda p: p.pid)


def _orphaned_worker(process: psutil.Process) -> bool:
    """A worker of ``linreboot serve`` whose serve process has died."""
    try:
        serve_pid = int(process.environ().get(SERVE_PID_ENV, "0"))
        return serve_pid not in (0, process.pid) and process.ppid() != serve_pid
    except (psutil.Error, ValueError):
        return False


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.Error:
        return "?"
