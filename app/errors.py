"""Errors to HTTP responses, in one place.

Every error body is :class:`app.schemas.ErrorOut`: ``{"error", "message",
"details"?}``. Nothing here echoes what the client sent: pydantic's ``input``
and ``ctx`` are dropped, and a body location names only what the request
models name (their fields) and list positions: a dictionary key
(``arm_contexts``) or an unknown field is shown as ``<key>``, whatever it is.
"""

from __future__ import annotations

import functools
import logging
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from http import HTTPStatus
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match

from app.schemas import ErrorDetail, ErrorOut, Hyperparameters, request_models
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
_KEY = "<key>"  # stands for a name the client chose


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


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    error = _HTTP_CODES.get(exc.status_code) or _phrase_code(exc.status_code)
    if exc.status_code == 405:
        allow = ", ".join(_allowed_methods(request))
        return error_response(405, error, f"this path takes {allow}", headers={"Allow": allow})
    return error_response(exc.status_code, error, str(exc.detail), headers=exc.headers)


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route takes at the request's path.

    Starlette's 405 names only the methods of the first route whose path
    matches, but ``GET /experiments`` and ``POST /experiments`` are two
    routes. Each method is tried against every route (included routers
    match their own routes), which needs nothing but ``BaseRoute.matches``.
    """
    routes = request.app.router.routes
    return [
        method for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] == Match.FULL
               for route in routes)
    ]


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    route = getattr(request.scope.get("route"), "path", "<unmatched>")
    logger.error("unhandled error", exc_info=exc, extra={"fields": {"route": route}})
    return error_response(500, "internal_error", "internal server error")


# A name a client may have meant as a hyperparameter: shown back (it cannot carry
# markup, control characters or a secret of any length); anything else is <key>.
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,39}")


def _unknown_hyperparameter(error: dict[str, Any]) -> ErrorDetail | None:
    """An unknown name in ``hyperparameters``: named (when it is a plain name), with the
    names there are (``policies.HYPERPARAMETERS`` says which policy takes which)."""
    loc = tuple(error.get("loc", ()))
    if error.get("type") != "extra_forbidden" or loc[:2] != ("body", "hyperparameters") \
            or len(loc) != 3:
        return None
    key = str(loc[2])
    named = key if _NAME.fullmatch(key) else _KEY
    known = ", ".join(Hyperparameters.model_fields)
    return ErrorDetail(loc=["body", "hyperparameters", named],
                       msg=f"unknown hyperparameter {named!r}; the hyperparameters are {known}",
                       type="extra_forbidden")


def _detail(error: dict[str, Any]) -> ErrorDetail:
    """A pydantic error without its ``input``, ``ctx`` and ``url``."""
    unknown = _unknown_hyperparameter(error)
    if unknown is not None:
        return unknown
    if error.get("type") == "json_invalid":
        reason = (error.get("ctx") or {}).get("error", "malformed document")
        return ErrorDetail(loc=["body"], msg=f"invalid JSON: {reason}", type="json_invalid")
    msg = str(error["msg"]).removeprefix("Value error, ")  # our validators' own words
    return ErrorDetail(loc=_safe_loc(error.get("loc", ())), msg=msg, type=error["type"])


def _safe_loc(loc: Sequence[Any]) -> list[str | int]:
    """``loc`` with every name the client chose replaced by ``<key>``.

    Path, query and header locations name declared parameters. In the body,
    a part is kept if it is a list position or a name of the request models;
    the part after a dictionary field is its key, and pydantic's ``[key]``
    marker (the key itself failed) adds nothing.
    """
    if not loc or loc[0] != "body":
        return [p if isinstance(p, int) else str(p) for p in loc]
    names, dict_fields = _wire_names()
    parts: list[str | int] = ["body"]
    key_next = False
    for part in loc[1:]:
        if part == "[key]":
            continue
        if key_next or not (isinstance(part, int) or part in names):
            parts.append(_KEY)
            key_next = False
        else:
            parts.append(part)
            key_next = part in dict_fields
    return parts


@functools.cache
def _wire_names() -> tuple[frozenset[str], frozenset[str]]:
    """The names the request models use, and those of their dictionary fields.

    Names are field names and aliases, model names and literal values (the
    last two are the tags pydantic puts in the location of a union member).
    """
    names: set[str] = set()
    dict_fields: set[str] = set()
    for model in request_models():
        names.add(model.__name__)
        for name, field in model.model_fields.items():
            wire_name = field.alias or name
            names.update({name, wire_name})
            if _is_dict(field.annotation):
                dict_fields.add(wire_name)
            for inner in _flattened(field.annotation):
                if typing.get_origin(inner) is Literal:
                    names.update(str(v) for v in typing.get_args(inner))
    return frozenset(names), frozenset(dict_fields)


def _flattened(annotation: Any) -> Iterator[Any]:
    """The annotation and every type inside it."""
    yield annotation
    for arg in typing.get_args(annotation):
        yield from _flattened(arg)


def _is_dict(annotation: Any) -> bool:
    """A dict, or a union with a dict in it (``dict[...] | None``), annotated or not."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _is_dict(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_is_dict(arg) for arg in typing.get_args(annotation))
    return origin is dict


def _dotted(loc: Sequence[str | int]) -> str:
    return ".".join(str(p) for p in loc)


def _phrase_code(status: int) -> str:
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "error"
