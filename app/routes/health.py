"""Liveness, readiness and Prometheus metrics; no credentials."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Response

from app.deps import MetricsDep, ServiceDep
from app.metrics import CONTENT_TYPE_LATEST
from app.responses import STORE_ERRORS
from app.schemas import StatusOut
from service.errors import StoreFull, StoreUnavailable

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="The process is alive")
async def healthz() -> StatusOut:
    return StatusOut(status="ok")


@router.get(
    "/readyz", summary="Redis answers and accepts writes (else 503)", responses=STORE_ERRORS
)
async def readyz(service: ServiceDep, metrics: MetricsDep) -> StatusOut:
    await service.ready()  # 503 store_full while Redis is out of memory
    metrics.set_store_full(False)
    return StatusOut(status="ready")


@router.get("/metrics", summary="Prometheus text format", response_class=Response)
async def metrics(service: ServiceDep, metrics: MetricsDep) -> Response:
    # Readiness and Redis's memory as of this scrape, for the alert rules (deploy/);
    # a Redis that does not answer is a 0, not a failed scrape.
    ready = full = answers = False
    try:
        await service.ready()
        ready = answers = True
    except StoreFull:
        full = answers = True
    except StoreUnavailable:
        pass  # (no second call to wait out)
    memory: list[tuple[str, int, int]] = []
    if answers:
        with contextlib.suppress(StoreUnavailable):
            memory = await service.memory()
    metrics.record_store(ready, full, memory)
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
