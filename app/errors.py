"""Errors to HTTP responses, in one place.

Every error body is :class:`app.schemas.ErrorOut`: ``{"error", "message",
"details"?}``. Nothing here echoes what the client sent: pydantic's ``input``
and ``ctx`` are dropped, and a dictionary key that failed validation is shown
as ``<key>``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from app.schemas import ErrorDetail, ErrorOut
from service.errors import (
    Conflict,
    DomainError,
    Forbidden,
    InvalidInput,
    NotFound,
    StoreFull,
    StoreUnavailable,
)

__all__ = ["error_response", "install_error_handlers"]

logger = logging.getLogger("linreboot.app")

_DOMAIN_STATUS: dict[type[DomainError], tuple[int, str]] = {
    InvalidInput: (422, "invalid_input"),
    NotFound: (404, "not_found"),
    Forbidden: (403, "forbidden"),
    Conflict: (409, "conflict"),
    StoreFull: (503, "store_full"),
    StoreUnavailable: (503, "store_unavailable"),
}
_HTTP_CODES = {401: "unauthorized", 403: "forbidden", 404: "not_found", 413: "too_large"}
_MAX_LISTED = 5
_MAX_LOC_TEXT = 64


def error_response(
    status: int,
    error: str,
    message: str,
    details: list[ErrorDetail] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = ErrorOut(error=error, message=message, details=details)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(DomainError, _domain_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected_error)


async def _domain_error(request: Request, exc: DomainError) -> JSONResponse:
    status, error = next(
        (_DOMAIN_STATUS[c] for c in type(exc).__mro__ if c in _DOMAIN_STATUS),
        (400, "bad_request"),
    )
    headers = None
    if isinstance(exc, StoreUnavailable):
        retry_after = request.app.state.settings.retry_after_seconds
        headers = {"Retry-After": str(retry_after)}
        logger.warning("store unavailable: %s", exc)
        if isinstance(exc, StoreFull):
            request.app.state.metrics.set_store_full(True)
    return error_response(status, error, str(exc), headers=headers)


async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    details = [_detail(e) for e in exc.errors()]
    listed = "; ".join(f"{_dotted(d.loc)}: {d.msg}" for d in details[:_MAX_LISTED])
    more = len(details) - _MAX_LISTED
    message = f"invalid request: {listed}" + (f" (and {more} more)" if more > 0 else "")
    return error_response(422, "invalid_input", message, details)


async def _http_error(_request: Request, exc: HTTPException) -> JSONResponse:
    error = _HTTP_CODES.get(exc.status_code) or _phrase_code(exc.status_code)
    return error_response(exc.status_code, error, str(exc.detail), headers=exc.headers)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    route = getattr(request.scope.get("route"), "path", "<unmatched>")
    logger.error("unhandled error", exc_info=exc, extra={"fields": {"route": route}})
    return error_response(500, "internal_error", "internal server error")


def _detail(error: dict[str, Any]) -> ErrorDetail:
    """A pydantic error without its ``input``, ``ctx`` and ``url``."""
    if error.get("type") == "json_invalid":
        reason = (error.get("ctx") or {}).get("error", "malformed document")
        return ErrorDetail(loc=["body"], msg=f"invalid JSON: {reason}", type="json_invalid")
    msg = str(error["msg"]).removeprefix("Value error, ")  # our validators' own words
    return ErrorDetail(loc=_safe_loc(error.get("loc", ())), msg=msg, type=error["type"])


def _safe_loc(loc: Sequence[Any]) -> list[str | int]:
    parts: list[str | int] = []
    for i, part in enumerate(loc):
        if part == "[key]":
            continue
        if i + 1 < len(loc) and loc[i + 1] == "[key]":
            parts.append("<key>")  # the key itself is the bad value
        elif isinstance(part, int):
            parts.append(part)
        else:
            text = str(part)
            parts.append(text if len(text) <= _MAX_LOC_TEXT else text[:_MAX_LOC_TEXT] + "...")
    return parts


def _dotted(loc: Sequence[str | int]) -> str:
    return ".".join(str(p) for p in loc)


def _phrase_code(status: int) -> str:
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "error"
