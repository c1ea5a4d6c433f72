"""The route class of ``/choose`` and ``/reward``: declared with FastAPI, served directly.

FastAPI builds the OpenAPI description (body model, the ``X-API-Key``
security scheme, responses) from the endpoint's signature. At request time
its generic machinery (dependency solving, body embedding, response-model
re-validation) costs more than the rest of a decision together, so these
routes run the same steps directly, in FastAPI's order and with its error
format:

1. no ``X-API-Key``: 401 (as the declared caller dependency would);
2. the body: strict JSON (:func:`app.strict_json.loads_strict`); a body
   whose content type is not JSON is a 415, as on the management routes
   (:class:`app.strict_json.StrictJSONRoute`); JSON errors, a missing body
   and model errors are a :class:`RequestValidationError` located under
   ``body``, as FastAPI reports them;
3. the endpoint, called with ``body``, ``caller`` and, if it declares one,
   ``response`` (whose status code it may set);
4. its return value serialised as JSON: a pydantic model, or :class:`Trusted`
   (the response model's fields made by the service itself, serialised as the
   model would serialise them, without validating the service's own values again:
   at k = 10 a ranking's validation cost more than its serialisation).

An endpoint served this way takes exactly those parameters; :class:`DirectRoute`
refuses any other signature when the app is built.

:class:`DirectLaneAPI` then serves a POST to such a route's path without
FastAPI's stack: Starlette's error middleware, FastAPI's exception telemetry
and body limit, the exception middleware, the exit stack and the router's
matching are a layer each, on every request, and these routes use none of
what they do but the exception handlers, which the lane calls itself. The
app's own middlewares (access log, body limit) wrap the lane as they wrap
the stack.
"""

from __future__ import annotations

import functools
import inspect
import json
import typing
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from pydantic_core import to_json
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from app.deps import API_KEY_HEADER, experiment_caller
from app.strict_json import is_json, loads_strict, not_json

__all__ = ["DirectLaneAPI", "DirectRoute", "Trusted"]

_PARAMETERS = {"body", "caller", "response"}


class DirectRoute(APIRoute):
    """An ``APIRoute`` for ``async def endpoint(body: Model, caller: ..., [response])``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint = self.endpoint
        parameters = set(inspect.signature(endpoint).parameters)
        if not {"body", "caller"} <= parameters <= _PARAMETERS:
            raise TypeError(f"{endpoint.__name__} must take body, caller and optionally response")
        body_model = typing.get_type_hints(endpoint)["body"]
        if not (isinstance(body_model, type) and issubclass(body_model, BaseModel)):
            raise TypeError(f"{endpoint.__name__}: body must be a pydantic model")
        wants_response = "response" in parameters

        async def handler(request: Request) -> Response:
            caller = experiment_caller(request, request.headers.get(API_KEY_HEADER))
            body = _validated(body_model, await _body(request))
            arguments: dict[str, Any] = {"body": body, "caller": caller}
            status = Response()  # the endpoint may set its status_code
            if wants_response:
                arguments["response"] = status
            result: BaseModel | Trusted = await endpoint(**arguments)
            content = (result.json() if isinstance(result, Trusted)
                       else result.model_dump_json())
            return Response(content, status.status_code, media_type="application/json")

        return handler


@dataclass(frozen=True)
class Trusted:
    """An answer of the fields of the route's response model (``response_model``) as plain
    values (str, int, float, bool, None, lists and dicts of them) that the service made
    itself: serialised as the model serialises them (a NaN or infinite float as null),
    without validating them again (each model's ``fields_of`` is checked against the
    model in tests/test_trusted.py)."""

    fields: dict[str, Any]

    def json(self) -> bytes:
        return to_json(self.fields, inf_nan_mode="null")


def _validated(model: type[BaseModel], body: Any) -> BaseModel:
    try:
        return model.model_validate(body, from_attributes=True)  # as FastAPI validates
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


_MISSING = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}


async def _body(request: Request) -> Any:
    """The parsed JSON body; 415 if the content type is not JSON."""
    try:
        raw = await request.body()
    except StarletteHTTPException:  # e.g. the body limit's 413
        raise
    except Exception as exc:  # the client went away mid-body: 400, as FastAPI answers
        raise HTTPException(400, "There was an error parsing the body") from exc
    if not raw:
        raise RequestValidationError([_MISSING])
    if not is_json(request.headers.get("content-type")):
        raise not_json()
    try:
        body = loads_strict(raw)
    except json.JSONDecodeError as exc:
        invalid = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error",
                   "input": {}, "ctx": {"error": exc.msg}}
        raise RequestValidationError([invalid]) from None
    if body is None:  # a JSON null: FastAPI reports a missing body
        raise RequestValidationError([_MISSING])
    return body



class DirectLaneAPI(FastAPI):
    """A FastAPI app whose :class:`DirectRoute` routes skip FastAPI's stack (see above).

    A request takes the lane when it is a POST to a direct route's exact path
    and the app is not served under a ``root_path`` (then the router's
    matching decides, as for every other request). The lane is entered before
    FastAPI's own ``__call__``, which asks OpenTelemetry's three providers
    whether it is configured (three environment lookups) on every request: so
    FastAPI's own OpenTelemetry instrumentation, if configured, does not see
    these two routes (the service's metrics and access log do).
    ``lane = False`` serves every request through the stack.
    """

    lane = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] == "POST" and self.lane
                and not self.root_path and not scope.get("root_path")):
            paths, lane = self._direct
            if scope["path"] in paths:
                scope["app"] = self
                await lane(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    @functools.cached_property
    def _direct(self) -> tuple[frozenset[str], ASGIApp]:
        """The direct routes' paths, and the lane: their handlers in the app's own
        middlewares, wrapped as Starlette wraps the stack (built on the first request,
        when the middlewares are all added)."""
        routes = {route.path: route for route in self.router.routes
                  if isinstance(route, DirectRoute) and "POST" in (route.methods or ())}
        lane: ASGIApp = _Lane(self, routes)
        for middleware in reversed(self.user_middleware):
            lane = middleware.cls(lane, *middleware.args, **middleware.kwargs)
        return frozenset(routes), lane


class _Lane:
    """The direct routes' handlers, with the app's exception handlers as Starlette's
    middlewares apply them: the handler of the exception's nearest class; with none
    but ``Exception``'s (the 500), its response is sent and the exception raised
    again, for the server to log, as Starlette's error middleware does."""

    def __init__(self, app: FastAPI, routes: dict[str, DirectRoute]) -> None:
        self.app = app
        self.routes = {path: (route, route.get_route_handler()) for path, route in routes.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route, handler = self.routes[scope["path"]]
        scope["route"], scope["endpoint"], scope["path_params"] = route, route.endpoint, {}
        request = Request(scope, receive, send)
        try:
            response = await handler(request)
        except Exception as exc:
            handled = self._handled_as(exc)
            if handled is None:
                raise
            if handled is Exception:  # unexpected: a 500, and the server logs it
                await self._unexpected(request, exc, send)
                raise
            try:
                response = await self.app.exception_handlers[handled](  # type: ignore[misc]
                    request, exc)  # (the app's handlers are async)
            except Exception as failure:  # a handler that fails: as unexpected, as the stack
                await self._unexpected(request, failure, send)
                raise
        await response(scope, receive, send)

    async def _unexpected(self, request: Request, exc: Exception, send: Send) -> None:
        """Send the 500 handler's response, if the app has one (Starlette's error
        middleware's role; the caller raises ``exc`` again). Unlike the stack's, it
        passes through the app's middlewares: the 500 has its X-Request-ID."""
        on_error = self.app.exception_handlers.get(Exception)
        if on_error is not None:
            response = await on_error(request, exc)  # type: ignore[misc]
            await response(request.scope, request.receive, send)

    def _handled_as(self, exc: Exception) -> type | None:
        """The nearest class of ``exc`` that has a handler."""
        return next((cls for cls in type(exc).__mro__ if cls in self.app.exception_handlers),
                    None)
