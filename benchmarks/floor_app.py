"""The floor for the service benchmark: a minimal FastAPI endpoint, one Redis round trip.

Run under the same uvicorn settings as the service, it measures what the web
framework, the event loop and one Redis call cost with nothing else. Its
garbage collector is settled as the service's is (:mod:`app.heap`), so that
the ratios compare the requests' work, not one side's collector settings.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio as aioredis
from fastapi import FastAPI, Request

from app.heap import settle


def create_app() -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.redis = aioredis.Redis.from_url(os.environ["LINREBOOT_REDIS_URL"])
        settle()
        yield
        await app.state.redis.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/floor")
    async def floor(request: Request) -> dict[str, int]:
        await request.body()
        value = await request.app.state.redis.incr("lrb-bench:floor")  # bench_service.FLOOR_KEY
        return {"value": int(value)}

    return app
