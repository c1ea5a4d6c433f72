"""Experiment management, for the holder of the admin token."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Response

from app.deps import AdminDep, ExperimentIdPath, IdempotencyDep, ServiceDep, SettingsDep
from app.responses import ADMIN_ERRORS
from app.schemas import (
    LOG_CURSOR_PATTERN,
    AddArmsIn,
    CreateExperimentIn,
    ExperimentCreatedOut,
    ExperimentListOut,
    ExperimentOut,
    KeyOut,
    LogEntryOut,
    LogPageOut,
    RetireArmsIn,
    RevokedOut,
    SettingsPatchIn,
)
from app.strict_json import StrictJSONRoute
from service.domain import EXPERIMENT_ID_PATTERN

router = APIRouter(
    prefix="/experiments",
    tags=["experiments"],
    dependencies=[AdminDep],
    responses=ADMIN_ERRORS,
    route_class=StrictJSONRoute,
)


@router.post("", status_code=201, summary="Create an experiment; returns its API key once")
async def create_experiment(
    body: CreateExperimentIn, service: ServiceDep, settings: SettingsDep,
    idempotency: IdempotencyDep,
) -> ExperimentCreatedOut:
    view, api_key = await service.create(body.to_domain(settings), idempotency)
    return ExperimentCreatedOut(api_key=api_key, experiment=ExperimentOut.from_domain(view))


@router.get("", summary="List experiments, a page at a time")
async def list_experiments(
    service: ServiceDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="experiments per page")] = 100,
    after: Annotated[
        str | None,
        Query(pattern=EXPERIMENT_ID_PATTERN, description="the previous page's next_after"),
    ] = None,
) -> ExperimentListOut:
    views, next_after = await service.list(limit, after)
    return ExperimentListOut(
        experiments=[ExperimentOut.from_domain(v) for v in views], next_after=next_after
    )


@router.get("/{experiment_id}", summary="An experiment and what it has learnt")
async def get_experiment(experiment_id: ExperimentIdPath, service: ServiceDep) -> ExperimentOut:
    return ExperimentOut.from_domain(await service.get(experiment_id))


@router.patch("/{experiment_id}",
              summary="Change live settings (epsilon, reward window, default reward, ...)")
async def update_settings(
    experiment_id: ExperimentIdPath, body: SettingsPatchIn, service: ServiceDep,
    settings: SettingsDep,
) -> ExperimentOut:
    changes = body.to_domain(settings)
    return ExperimentOut.from_domain(await service.update_settings(experiment_id, changes))


@router.delete("/{experiment_id}", status_code=204, summary="Delete an experiment and its state")
async def delete_experiment(experiment_id: ExperimentIdPath, service: ServiceDep) -> Response:
    await service.delete(experiment_id)
    return Response(status_code=204)


@router.post("/{experiment_id}/keys", status_code=201,
             summary="A new API key; the current one stays valid until revoked")
async def rotate_key(experiment_id: ExperimentIdPath, service: ServiceDep,
                     idempotency: IdempotencyDep) -> KeyOut:
    return KeyOut(api_key=await service.rotate_key(experiment_id, idempotency))


@router.delete("/{experiment_id}/keys/previous",
               summary="Revoke the key a rotation kept valid (at once, on every worker)")
async def revoke_previous_key(experiment_id: ExperimentIdPath, service: ServiceDep) -> RevokedOut:
    return RevokedOut(revoked=await service.revoke_previous_key(experiment_id))


@router.post("/{experiment_id}/arms", summary="Add arms")
async def add_arms(
    experiment_id: ExperimentIdPath, body: AddArmsIn, service: ServiceDep, settings: SettingsDep,
    idempotency: IdempotencyDep,
) -> ExperimentOut:
    arms = body.to_domain(settings)
    return ExperimentOut.from_domain(await service.add_arms(experiment_id, arms, idempotency))


@router.post("/{experiment_id}/arms/retire", summary="Retire arms (they keep their history)")
async def retire_arms(
    experiment_id: ExperimentIdPath, body: RetireArmsIn, service: ServiceDep, settings: SettingsDep
) -> ExperimentOut:
    arm_ids = body.to_domain(settings)
    return ExperimentOut.from_domain(await service.retire_arms(experiment_id, arm_ids))


@router.get("/{experiment_id}/log", summary="The decision log, a page at a time",
            response_model=LogPageOut)
async def read_log(
    experiment_id: ExperimentIdPath,
    service: ServiceDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="entries per page at most (a "
                                "ranking counts once and comes whole, one entry per slot); "
                                "a page also stops at about LINREBOOT_LOG_PAGE_MAX_BYTES of "
                                "JSON (at least one entry)")] = 100,
    after: Annotated[
        str | None,
        Query(pattern=LOG_CURSOR_PATTERN,
              description="the previous page's next_after: the page starts after it (an "
              "entry_id also serves; on a sharded experiment next_after holds every "
              "shard's position)"),
    ] = None,
) -> Response:
    entries, next_after = await service.read_log(experiment_id, after, limit)
    # Megabytes of contexts at the page's size limit: rendered off the event loop.
    body = await asyncio.to_thread(lambda: LogPageOut(
        entries=[LogEntryOut.from_domain(e) for e in entries],
        next_after=next_after).model_dump_json())
    return Response(body, media_type="application/json")
