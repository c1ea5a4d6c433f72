"""Run the service under uvicorn (``linreboot serve``).

Every worker builds its own app with ``create_app()`` from the environment
(uvicorn's ``--factory``), so whatever the workers must share goes into the
environment before they start:

- without ``REDIS_URL``, one embedded Redis started here, its URL exported as
  ``LINREBOOT_REDIS_URL`` (a Redis per worker would split the state);
- with more than one worker, a ``PROMETHEUS_MULTIPROC_DIR`` (a fresh temporary
  directory unless one is given; stale ``*.db`` files in a given one are
  removed), so that ``/metrics`` sums all workers.
"""

from __future__ import annotations

import os
import signal
import tempfile
from contextlib import ExitStack
from pathlib import Path
from types import FrameType

import uvicorn

from app.logs import configure_logging
from app.metrics import MULTIPROC_ENV
from service.embedded import EmbeddedRedis
from service.settings import Settings

__all__ = ["serve"]

APP_FACTORY = "app.main:create_app"


def serve(
    host: str | None = None,
    port: int | None = None,
    workers: int | None = None,
    data_dir: Path | None = None,
) -> int:
    """Serve until interrupted; arguments override the ``LINREBOOT_*`` settings. Returns 0."""
    given = {"host": host, "port": port, "workers": workers, "data_dir": data_dir}
    overrides: dict[str, object] = {k: v for k, v in given.items() if v is not None}
    settings = Settings(**overrides)  # type: ignore[arg-type]
    configure_logging(settings.log_level)
    for key, value in overrides.items():  # the workers see the settings this process sees
        os.environ[f"LINREBOOT_{key.upper()}"] = str(value)
    # uvicorn re-raises a captured SIGTERM after its shutdown, which would kill
    # this process before the embedded Redis is stopped; a SystemExit unwinds
    # the ExitStack instead (uvicorn restores this handler before re-raising).
    signal.signal(signal.SIGTERM, _exit_on_signal)
    with ExitStack() as stack:
        if settings.redis_url is None:
            embedded = EmbeddedRedis(settings.data_dir).start()
            stack.callback(embedded.stop)
            os.environ["LINREBOOT_REDIS_URL"] = embedded.url
        _prepare_multiprocess_metrics(settings.workers, stack)
        uvicorn.run(
            APP_FACTORY,
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            log_config=None,  # uvicorn's records go to the root logger: JSON lines
            log_level=settings.log_level,
            access_log=False,  # the app writes its own access log
        )
    return 0


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _prepare_multiprocess_metrics(workers: int, stack: ExitStack) -> None:
    directory = os.environ.get(MULTIPROC_ENV)
    if directory:
        for stale in Path(directory).glob("*.db"):  # counts of a previous run
            stale.unlink()
    elif workers > 1:
        directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="linreboot-metrics-"))
        os.environ[MULTIPROC_ENV] = directory
