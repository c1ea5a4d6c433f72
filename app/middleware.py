"""Two small ASGI middlewares: the request-body limit and the access log.

Pure ASGI rather than ``BaseHTTPMiddleware``, so bodies stream through
untouched and nothing runs in an extra task.
"""

from __future__ import annotations

import logging
import random
import re
import sys
import time

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import error_response
from app.logs import request_id
from app.metrics import Metrics
from service.domain import valid_experiment_id
from service.errors import StartupError

__all__ = ["AccessLogMiddleware", "BodyLimitMiddleware", "BodyTooLarge"]

access_logger = logging.getLogger("linreboot.access")
# A client's request id is kept if it is a plain token: nothing to escape in a log or header.
_SAFE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:=+/-]{1,128}")
# What the decision routes put in request.state for the access log (app.deps.ExperimentCaller).
_DECISION_FIELDS = ("decision_id", "decision_ids")


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes")


class BodyLimitMiddleware:
    """413 for a body over ``max_body_bytes``.

    A declared ``Content-Length`` over the limit is refused before anything is
    read; a chunked body is counted as it is read, and reading stops with
    :class:`BodyTooLarge` (an ``HTTPException``, so FastAPI passes it on to the
    error handlers) once the count passes the limit.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            too_large = BodyTooLarge(self.max_body_bytes)
            response = error_response(413, "too_large", too_large.detail)
            await response(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
            return message

        await self.app(scope, limited_receive, send)


class AccessLogMiddleware:
    """One JSON log line and one latency observation per HTTP request.

    The route is the matched template (``/experiments/{experiment_id}``), so
    metric labels stay few; ``experiment_id`` comes from the path or from
    ``request.state.experiment_id`` (set by the API-key check), and the
    decision routes leave their decision ids in ``request.state``.

    Every request gets an id: the client's ``X-Request-ID`` if it is a safe
    token, else a new one. It is returned as ``X-Request-ID`` and is in every
    log line written while the request runs (:data:`app.logs.request_id`).
    A change that takes an ``Idempotency-Key`` (:mod:`app.deps`) says it back.

    It also shortens a failed start-up's report (see :func:`_one_line_startup_failure`).
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                send = _one_line_startup_failure(send)
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # unless a response starts: an exception on its way to the 500 handler
        state = scope.setdefault("state", {})  # shared with request.state downstream
        rid = _request_id(scope["headers"])
        header = (b"x-request-id", rid.encode())
        context = request_id.set(rid)

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), header]
                honoured = state.get("idempotency_key")  # app.deps: a change that takes one
                if honoured is not None:
                    headers.append((b"idempotency-key", honoured.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            seconds = time.perf_counter() - started
            route = getattr(scope.get("route"), "path", "<unmatched>")
            self.metrics.observe_request(scope["method"], route, status, seconds)
            if access_logger.isEnabledFor(logging.INFO):
                _log_request(scope, state, route, status, seconds, rid)
            request_id.reset(context)


def _request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's ``X-Request-ID`` if it is a safe token, else a new random one."""
    for name, value in headers:  # ASGI header names are lower-case bytes
        if name == b"x-request-id":
            if _SAFE_REQUEST_ID.fullmatch(value):
                return value.decode()
            break
    return f"{random.getrandbits(64):016x}"  # an id, not a secret: no need for os.urandom


def _one_line_startup_failure(send: Send) -> Send:
    """Report a :class:`StartupError` at start-up as its own line.

    Starlette sends the whole traceback as the failure message, which uvicorn
    logs as one 5 KB line; the error's message already names the setting and
    what to do.
    """

    async def send_short(message: Message) -> None:
        if message["type"] == "lifespan.startup.failed":
            failure = sys.exc_info()[1]  # send is called from Starlette's except block
            if isinstance(failure, StartupError):
                message = {**message, "message": f"cannot start: {failure}"}
        await send(message)

    return send_short


def _log_request(
    scope: Scope, state: dict[str, object], route: str, status: int, seconds: float, rid: str
) -> None:
    fields: dict[str, object] = {
        "request_id": rid,
        "method": scope["method"],
        "route": route,
        "status": status,
        "latency_ms": round(seconds * 1000, 3),
    }
    experiment_id = scope.get("path_params", {}).get("experiment_id") or state.get(
        "experiment_id"
    )
    if isinstance(experiment_id, str) and valid_experiment_id(experiment_id):
        fields["experiment_id"] = experiment_id
    for name in _DECISION_FIELDS:
        if name in state:
            fields[name] = state[name]
    access_logger.info("request", extra={"fields": fields})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:  # ASGI header names are lower-case bytes
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
