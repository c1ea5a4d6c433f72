"""``/choose``, ``/rank`` and ``/reward`` answer :class:`app.direct_route.Trusted` fields,
serialised without validation: each answer must be exactly what its response model
would make of it (the same bytes), and valid under that model (a propensity in [0, 1],
an index or null, every field present), whatever the decision or outcome."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import BaseModel

from app.direct_route import Trusted
from app.schemas import DecisionOut, RankingOut, RewardBatchOut, RewardOut
from service.domain import Decision, RankedDecision, RewardOutcome
from tests.conftest import Api

pytestmark = pytest.mark.anyio

ARMS = [{"id": f"arm-{k}"} for k in range(5)]


def remade(model: type[BaseModel], content: bytes) -> bytes:
    """What the model makes of an answer it validates (a ValidationError if it does not)."""
    return model.model_validate_json(content).model_dump_json().encode()


def experiment(experiment_id: str, *, propensities: bool, first_pass: bool) -> dict[str, Any]:
    return {"id": experiment_id, "setting": "covariates", "dim": 3, "seed": 4, "arms": ARMS,
            "propensities": propensities,
            "hyperparameters": {"spread": "paper", "first_pass": first_pass}}


@pytest.mark.parametrize(("propensities", "first_pass"), [(True, True), (True, False),
                                                          (False, True)])
async def test_answers_are_what_their_models_make_of_them(
    api: Api, propensities: bool, first_pass: bool
) -> None:
    key = await api.create(experiment("t", propensities=propensities, first_pass=first_pass))
    headers = {"X-API-Key": key}
    seen_exploring, seen_index, rewarded = False, False, []
    for step in range(12):
        context = [math.sin(step), math.cos(step), 0.5]
        chosen = await api.choose(key, {"experiment_id": "t", "context": context})
        assert chosen.status_code == 200, chosen.text
        assert chosen.content == remade(DecisionOut, chosen.content)
        ranked = await api.http.post("/rank", json={"experiment_id": "t", "context": context,
                                                     "k": 3}, headers=headers)
        assert ranked.status_code == 200, ranked.text
        assert ranked.content == remade(RankingOut, ranked.content)
        slots = ranked.json()["slots"]
        seen_exploring |= any(slot["exploring"] for slot in slots)
        seen_index |= any(slot["index"] is not None for slot in slots)
        assert all((slot["propensity"] is not None) == propensities for slot in slots)
        rewarded.append(chosen.json()["decision_id"])
        single = await api.reward(key, {"experiment_id": "t", "decision_id": rewarded[-1],
                                        "reward": 0.25 * step})
        assert single.status_code == 200, single.text
        assert single.content == remade(RewardOut, single.content)
        batch = await api.reward(key, {"experiment_id": "t", "rewards": [
            {"decision_id": rewarded[-1], "reward": 0.25 * step},  # duplicate
            {"decision_id": slots[0]["decision_id"], "reward": 1.0},  # applied
            {"decision_id": "unknown", "reward": 1.0}]})  # not_found
        assert batch.status_code == 200, batch.text
        assert batch.content == remade(RewardBatchOut, batch.content)
        assert [r["status"] for r in batch.json()["results"]] == [
            "duplicate", "applied", "not_found"]
    missing = await api.reward(key, {"experiment_id": "t", "decision_id": "unknown",
                                     "reward": 1.0})
    assert missing.status_code == 404
    assert missing.content == remade(RewardOut, missing.content)
    assert seen_exploring == first_pass  # the first pass explores: index null
    assert seen_index


def serialised(fields: dict[str, Any]) -> bytes:
    return Trusted(fields).json()


@pytest.mark.parametrize("value", [0.1, 1e-7, 5e-324, 1.0, 0.0, -0.0, 1 / 3,
                                   0.9999999999999999, 123456789.125, -2.5, None])
def test_fields_serialise_as_their_models(value: float | None) -> None:
    propensity = None if value is None else min(abs(value), 1.0)
    decision = Decision("d", "arm", value, value is None, 7, 60, propensity)
    fields = DecisionOut.fields_of(decision)
    assert serialised(fields) == DecisionOut.model_validate(fields).model_dump_json().encode()
    ranking = RankedDecision("r", 7, 60, ("a", "b"), (value, None), (0.5, propensity), (60, 0))
    fields = RankingOut.fields_of(ranking)
    assert serialised(fields) == RankingOut.model_validate(fields).model_dump_json().encode()
    outcomes = [RewardOutcome("d", "late", "too late"), RewardOutcome("e", "applied", "ok")]
    fields = RewardBatchOut.fields_of(outcomes)
    assert serialised(fields) == RewardBatchOut.model_validate(fields).model_dump_json().encode()


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_score_is_null_as_the_model_makes_it(value: float) -> None:
    """A NaN score (statistics gone wrong) must still give valid JSON: null, as the model
    serialises it, never the bare NaN a JSON parser refuses."""
    fields = DecisionOut.fields_of(Decision("d", "arm", value, False, 7, 60, 0.5))
    assert serialised(fields) == DecisionOut.model_validate(fields).model_dump_json().encode()
    assert b'"index":null' in serialised(fields)
