"""JSON request bodies: declared as JSON, and parsed strictly (only finite numbers).

Python's :func:`json.loads` accepts the non-standard tokens ``NaN``,
``Infinity`` and ``-Infinity`` and turns ``1e309`` into ``inf``. Pydantic's
``allow_inf_nan=False`` would catch those in ``float`` fields, but refusing
them while parsing keeps them out of every field, whatever its type. Routes
opt in with ``APIRouter(route_class=StrictJSONRoute)``.

A body must say it is JSON (``Content-Type: application/json`` or
``application/*+json``); any other type, or none, is a 415 that says so.
Reading JSON whatever the declared type would accept what ``curl -d`` sends
by default, but it would also turn a cross-site form post (``text/plain``,
``application/x-www-form-urlencoded``: no CORS preflight) into a valid call.
The credentials are headers today, which a browser does not add on its own;
the content type keeps that second guard. :mod:`app.direct_route` applies
the same rule to ``/choose`` and ``/reward``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

__all__ = ["StrictJSONRoute", "is_json", "loads_strict", "not_json"]

_NON_FINITE = "non-finite numbers are not allowed; send finite JSON numbers"
_TOO_MANY_DIGITS = (
    f"an integer has more than {sys.get_int_max_str_digits()} digits; no field takes one that long"
)
_TOO_LARGE = "an integer is beyond 1.8e308, the largest number any field takes"
_NOT_JSON = "the body must be JSON: send it with Content-Type: application/json"


class _NonFinite(ValueError):
    pass


class _TooManyDigits(ValueError):
    pass


class _TooLarge(ValueError):
    pass


def _reject_constant(_name: str) -> float:
    raise _NonFinite


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # e.g. 1e309 overflows to inf
        raise _NonFinite
    return value


def _bounded_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:  # longer than sys.get_int_max_str_digits() (4300 by default)
        raise _TooManyDigits from None
    if len(text) > 300:  # a float field would say only "not a valid number"
        try:
            float(value)
        except OverflowError:
            raise _TooLarge from None
    return value


# One decoder for every body: json.loads with hooks builds a decoder and its scanner per
# call (half of its time on a /reward body).
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float,
                            parse_int=_bounded_int)


def _loads(data: bytes | str) -> Any:
    """:func:`json.loads`'s steps, with :data:`_DECODER`."""
    if isinstance(data, bytes | bytearray):
        data = data.decode(json.detect_encoding(data), "surrogatepass")
    elif data.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", data, 0)
    return _DECODER.decode(data)


def loads_strict(data: bytes | str) -> Any:
    """Parse a JSON document, refusing NaN, Infinity and numbers that overflow.

    Raises
    ------
    json.JSONDecodeError
        For any document that is not strict JSON. The message never quotes the
        document (FastAPI turns this error into a 422 listing what is wrong).
    """
    try:
        return _loads(data)
    except _NonFinite:
        raise json.JSONDecodeError(_NON_FINITE, "", 0) from None
    except json.JSONDecodeError as exc:
        raise json.JSONDecodeError(exc.msg, "", exc.pos) from None
    except RecursionError:
        raise json.JSONDecodeError("the document is nested too deeply", "", 0) from None
    except _TooManyDigits:
        raise json.JSONDecodeError(_TOO_MANY_DIGITS, "", 0) from None
    except _TooLarge:
        raise json.JSONDecodeError(_TOO_LARGE, "", 0) from None
    except ValueError:  # bytes that are not UTF-8 (nor UTF-16/32)
        raise json.JSONDecodeError("not valid UTF-8 JSON", "", 0) from None


def is_json(content_type: str | None) -> bool:
    """``application/json`` or ``application/*+json``, parameters ignored (as FastAPI)."""
    if not content_type:
        return False
    media_type = content_type.split(";", 1)[0].strip().lower()
    maintype, _, subtype = media_type.partition("/")
    return maintype == "application" and (subtype == "json" or subtype.endswith("+json"))


def not_json() -> HTTPException:
    """The 415 for a body whose content type is not JSON."""
    return HTTPException(415, _NOT_JSON)


class StrictJSONRequest(Request):
    """A request whose ``json()`` is :func:`loads_strict`."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_strict(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """An ``APIRoute`` that hands its endpoint a :class:`StrictJSONRequest`.

    FastAPI hands the body model the raw bytes when the content type is not
    JSON, and the model refuses them ("Input should be a valid dictionary"):
    that refusal becomes the 415 that names the content type. Credentials
    are checked first (FastAPI solves the dependencies before it reports
    the body's errors), as on ``/choose``.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def strict_handler(request: Request) -> Response:
            strict = StrictJSONRequest(request.scope, request.receive)
            try:
                return await handler(strict)
            except RequestValidationError:
                content_type = strict.headers.get("content-type")
                if takes_body and not is_json(content_type) and await strict.body():
                    raise not_json() from None
                raise

        return strict_handler
