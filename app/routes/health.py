"""Liveness, readiness and Prometheus metrics; no credentials."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response

from app.deps import MetricsDep, ServiceDep
from app.metrics import CONTENT_TYPE_LATEST
from app.responses import STORE_ERRORS
from app.schemas import StatusOut
from service.errors import StoreFull, StoreUnavailable

router = APIRouter(tags=["operations"])
logger = logging.getLogger("linreboot.app")


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
    except Exception:  # a scrape never fails for the store: it says not ready
        logger.exception("/metrics: the readiness check failed")
    memory: list[tuple[str, int, int]] = []
    if answers:
        try:
            memory = await service.memory()
        except StoreUnavailable:
            pass
        except Exception:
            logger.exception("/metrics: reading Redis's memory failed")
    metrics.record_store(ready, full, memory)
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
