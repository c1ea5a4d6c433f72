"""Decisions and rewards, for the holder of the experiment's API key."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.deps import ExperimentKeyDep, MetricsDep, ServiceDep, SettingsDep
from app.responses import KEY_ERRORS, REWARD_RESPONSES
from app.schemas import ChooseIn, DecisionOut, RewardBatchOut, RewardIn, RewardOut
from app.strict_json import StrictJSONRoute
from service.domain import RewardOutcome, RewardStatus

router = APIRouter(tags=["decisions"], responses=KEY_ERRORS, route_class=StrictJSONRoute)

# A single reward's status is also its HTTP status; a batch is always 200.
REWARD_HTTP_STATUS: dict[RewardStatus, int] = {
    "applied": 200, "duplicate": 200, "conflict": 409, "not_found": 404,
}


@router.post("/choose", summary="Choose an arm")
async def choose(
    body: ChooseIn,
    key: ExperimentKeyDep,
    service: ServiceDep,
    settings: SettingsDep,
    metrics: MetricsDep,
) -> DecisionOut:
    await key.authorize(body.experiment_id)
    decision = await service.choose(body.experiment_id, body.to_domain(settings), key.key)
    metrics.record_decision()
    return DecisionOut.from_domain(decision)


@router.post("/reward", summary="Report rewards, exactly once each", responses=REWARD_RESPONSES)
async def reward(
    body: RewardIn,
    response: Response,
    key: ExperimentKeyDep,
    service: ServiceDep,
    settings: SettingsDep,
    metrics: MetricsDep,
) -> RewardOut | RewardBatchOut:
    await key.authorize(body.experiment_id)
    outcomes = await service.reward(body.experiment_id, body.to_domain(settings), key.key)
    metrics.record_rewards(outcomes)
    return _reward_response(body.is_batch, outcomes, response)


def _reward_response(
    batch: bool, outcomes: list[RewardOutcome], response: Response
) -> RewardOut | RewardBatchOut:
    if batch:
        return RewardBatchOut.from_domain(outcomes)
    response.status_code = REWARD_HTTP_STATUS[outcomes[0].status]
    return RewardOut.from_domain(outcomes[0])
