"""The FastAPI application: ``create_app(settings)``.

Nothing is created at import time. ``create_app`` configures logging and
builds the app; its lifespan opens the :class:`ExperimentService` (which
connects to Redis, or starts the embedded one) and closes it on shutdown.
``linreboot serve --workers N`` runs several workers on one Redis; plain
``uvicorn --factory app.main:create_app --workers N`` needs ``REDIS_URL``
(without it each worker would try to own the embedded Redis's directory).
As such a factory (no settings given: a serving process), the app also
settles the process's garbage collector once started (:mod:`app.heap`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI
from threadpoolctl import threadpool_limits

from app.auth import AdminTokens
from app.direct_route import DirectLaneAPI
from app.errors import install_error_handlers
from app.heap import settle
from app.logs import configure_logging
from app.metrics import Metrics
from app.middleware import AccessLogMiddleware, BodyLimitMiddleware
from app.openapi import publish_limits
from app.routes import FIRST_ROUTERS, ROUTERS
from app.routes.docs import install_docs
from service.errors import StartupError
from service.experiments import ExperimentService
from service.settings import Settings

__all__ = ["create_app"]

logger = logging.getLogger("linreboot.app")
_UVICORN_STARTUP_FAILURE = 3

_DESCRIPTION = """\
Online recommendations with the LinReBoot contextual bandit (Wu et al., UAI 2022).

Create an experiment with the admin token, then call `/choose` for a decision and
`/reward` with its `decision_id` once the outcome is known, both with the
experiment's `X-API-Key`. Each reward counts exactly once: repeating it is safe.
"""


def create_app(settings: Settings | None = None, *, serving: bool | None = None) -> FastAPI:
    """The app for ``settings`` (read from the environment when not given).

    As uvicorn's factory, a wrong setting in the environment is one log line and
    exit code 3, uvicorn's for a failed start (its supervisor then stops rather
    than restarting the worker). ``serving`` (by default: when the settings come
    from the environment, as uvicorn's factory) settles the garbage collector once
    the app has started (:func:`app.heap.settle`: a process-wide change, not for an
    app run inside another program, such as the tests).
    """
    app_serving = settings is None if serving is None else serving
    settings = settings if settings is not None else _settings_or_exit()
    configure_logging(settings.log_level)
    app = DirectLaneAPI(
        title="LinReBoot recommendations",
        version=_version(),
        description=_DESCRIPTION,
        lifespan=_lifespan,
        docs_url=None,  # served from the package instead of a CDN: app.routes.docs
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.serving = app_serving
    app.state.metrics = Metrics()
    app.state.admin_tokens = AdminTokens(settings)
    install_error_handlers(app)
    publish_limits(app, settings)
    # Mounted directly and first, as @app.post routes would be: FastAPI matches
    # an included router's routes twice per request, and its own /openapi.json
    # comes first in the app's list.
    for router in FIRST_ROUTERS:
        app.router.routes[0:0] = router.routes
    for router in ROUTERS:
        app.include_router(router)
    install_docs(app)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(AccessLogMiddleware, metrics=app.state.metrics)  # outermost: sees 413s
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    # A request's matrices are at most 64 x 64: BLAS threads only contend with the
    # event loop and the propensity thread. A worker is one core; scale with workers.
    with threadpool_limits(limits=1):
        async with _service(app, settings):
            yield


@asynccontextmanager
async def _service(app: FastAPI, settings: Settings) -> AsyncIterator[None]:
    service = await ExperimentService.open(settings)
    if settings.default_admin_token:
        logger.warning(
            "INSECURE: LINREBOOT_ADMIN_TOKEN is the default %r; set a secret before exposing "
            "the service", "change-me",
        )
    for warning in service.persistence_warnings:
        logger.warning(
            "PERSISTENCE AT RISK: %s",
            warning,
            extra={"fields": {"persistence_warning": warning}},
        )
    for failure in service.upgrade_failures:
        logger.error("EXPERIMENT NOT UPGRADED: %s", failure,
                     extra={"fields": {"upgrade_failure": failure}})
    if service.upgraded:
        logger.warning(
            "upgraded %d experiment(s) stored by an earlier version", len(service.upgraded),
            extra={"fields": {"upgraded": service.upgraded}},
        )
    app.state.service = service
    service.defaults_observer = app.state.metrics.record_defaults
    service.start_sweeper()  # stopped by service.close()
    if app.state.serving:
        settle()
    try:
        yield
    finally:
        del app.state.service
        await service.close()


def _settings_or_exit() -> Settings:
    try:
        return Settings.load()
    except StartupError as exc:
        configure_logging("error")
        logger.error("cannot start: %s", exc)
        raise SystemExit(_UVICORN_STARTUP_FAILURE) from None


def _version() -> str:
    try:
        return version("linreboot")
    except PackageNotFoundError:
        return "0+unknown"
