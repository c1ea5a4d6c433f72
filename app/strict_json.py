"""JSON request bodies parsed strictly: only finite numbers, as JSON itself says.

Python's :func:`json.loads` accepts the non-standard tokens ``NaN``,
``Infinity`` and ``-Infinity`` and turns ``1e309`` into ``inf``. Pydantic's
``allow_inf_nan=False`` would catch those in ``float`` fields, but refusing
them while parsing keeps them out of every field, whatever its type. Routes
opt in with ``APIRouter(route_class=StrictJSONRoute)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

__all__ = ["StrictJSONRoute", "loads_strict"]

_NON_FINITE = "non-finite numbers are not allowed; send finite JSON numbers"


class _NonFinite(ValueError):
    pass


def _reject_constant(_name: str) -> float:
    raise _NonFinite


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # e.g. 1e309 overflows to inf
        raise _NonFinite
    return value


def loads_strict(data: bytes | str) -> Any:
    """Parse a JSON document, refusing NaN, Infinity and numbers that overflow.

    Raises
    ------
    json.JSONDecodeError
        For any document that is not strict JSON. The message never quotes the
        document (FastAPI turns this error into a 422 listing what is wrong).
    """
    try:
        return json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)
    except _NonFinite:
        raise json.JSONDecodeError(_NON_FINITE, "", 0) from None
    except json.JSONDecodeError as exc:
        raise json.JSONDecodeError(exc.msg, "", exc.pos) from None
    except RecursionError:
        raise json.JSONDecodeError("the document is nested too deeply", "", 0) from None
    except ValueError:  # undecodable bytes, or an integer with thousands of digits
        raise json.JSONDecodeError("not valid UTF-8 JSON", "", 0) from None


class StrictJSONRequest(Request):
    """A request whose ``json()`` is :func:`loads_strict`."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_strict(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """An ``APIRoute`` that hands its endpoint a :class:`StrictJSONRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler
