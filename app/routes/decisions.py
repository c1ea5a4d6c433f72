"""Decisions and rewards, for the holder of the experiment's API key."""

from __future__ import annotations

from fastapi import APIRouter, Response

from app.deps import ExperimentCallerDep
from app.direct_route import DirectRoute, Trusted
from app.responses import KEY_ERRORS, REWARD_RESPONSES
from app.schemas import (
    ChooseIn,
    DecisionOut,
    RankIn,
    RankingOut,
    RewardBatchOut,
    RewardIn,
    RewardOut,
)
from service.domain import RewardOutcome, RewardStatus

router = APIRouter(tags=["decisions"], responses=KEY_ERRORS, route_class=DirectRoute)

# A single reward's status is also its HTTP status; a batch is always 200. A late
# reward is a 409 like a conflict: the decision's outcome is settled (its default
# counts), the request cannot change it, and a retry would not either.
REWARD_HTTP_STATUS: dict[RewardStatus, int] = {
    "applied": 200, "duplicate": 200, "conflict": 409, "late": 409, "not_found": 404,
}


@router.post("/choose", summary="Choose an arm", response_model=DecisionOut)
async def choose(body: ChooseIn, caller: ExperimentCallerDep) -> Trusted:
    caller.names(body.experiment_id)
    request = body.to_domain(caller.settings)
    decision = await caller.service.choose(body.experiment_id, request, caller.key)
    caller.traces([decision.decision_id])
    caller.metrics.record_decision()
    return Trusted(DecisionOut.fields_of(decision))


@router.post("/rank", summary="Rank k arms, each slot rewarded on its own",
             response_model=RankingOut)
async def rank(body: RankIn, caller: ExperimentCallerDep) -> Trusted:
    caller.names(body.experiment_id)
    request = body.to_domain(caller.settings)
    ranking = await caller.service.rank(body.experiment_id, request, caller.key)
    caller.traces([ranking.decision_id])
    caller.metrics.record_decision()
    return Trusted(RankingOut.fields_of(ranking))


@router.post("/reward", summary="Report rewards, exactly once each", responses=REWARD_RESPONSES,
             response_model=RewardOut | RewardBatchOut)
async def reward(body: RewardIn, response: Response, caller: ExperimentCallerDep) -> Trusted:
    caller.names(body.experiment_id)
    items = body.to_domain(caller.settings)
    caller.traces([decision_id for decision_id, _ in items])
    outcomes = await caller.service.reward(body.experiment_id, items, caller.key)
    caller.metrics.record_rewards(outcomes)
    return _reward_response(body.is_batch, outcomes, response)


def _reward_response(batch: bool, outcomes: list[RewardOutcome], response: Response) -> Trusted:
    if batch:
        return Trusted(RewardBatchOut.fields_of(outcomes))
    response.status_code = REWARD_HTTP_STATUS[outcomes[0].status]
    return Trusted(RewardOut.fields_of(outcomes[0]))
