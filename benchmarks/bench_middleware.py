"""Per-request cost of the access-log middleware (request id, metrics, log line).

Usage::

    python -m benchmarks.bench_middleware [--requests 2000] [--batches 60]

Calls :class:`app.middleware.AccessLogMiddleware` around an ASGI app that only
answers, in one process, with the access log off (level warning) and on
(level info, records dropped by a null handler, so the JSON formatting is not
counted). Reports the best batch's mean: the minimum filters out a shared
machine's noise. To compare two versions, run it in each checkout
(``PYTHONPATH=<checkout>``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

from starlette.types import Message, Receive, Scope, Send

from app.metrics import Metrics
from app.middleware import AccessLogMiddleware

_HEADERS = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
            (b"x-api-key", b"k" * 43), (b"content-length", b"60")]


class _Route:
    path = "/choose"


async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
    scope["route"] = _Route
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def _receive() -> Message:
    return {"type": "http.request", "body": b""}


async def _send(message: Message) -> None:
    pass


async def microseconds_per_request(requests: int, batches: int, access_log: bool) -> float:
    root = logging.getLogger()
    root.setLevel(logging.INFO if access_log else logging.WARNING)
    root.handlers = [logging.NullHandler()]
    middleware = AccessLogMiddleware(_answer, Metrics())
    best = float("inf")
    for _ in range(batches):
        started = time.perf_counter()
        for _ in range(requests):
            scope = {"type": "http", "method": "POST", "path": "/choose", "headers": _HEADERS}
            await middleware(scope, _receive, _send)
        best = min(best, (time.perf_counter() - started) / requests * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per batch")
    parser.add_argument("--batches", type=int, default=60)
    args = parser.parse_args()
    for access_log in (False, True):
        cost = asyncio.run(microseconds_per_request(args.requests, args.batches, access_log))
        print(f"access log {'on ' if access_log else 'off'}: {cost:.2f} us/request")


if __name__ == "__main__":
    main()
