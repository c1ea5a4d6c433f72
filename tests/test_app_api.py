"""Every endpoint's happy path, the credentials rules, reward statuses, metrics and errors."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import redis
from fastapi import FastAPI
from threadpoolctl import threadpool_info, threadpool_limits

from app.logs import JsonFormatter, request_id
from app.main import create_app
from app.schemas import Hyperparameters
from policies import HYPERPARAMETERS, RANGES, PolicyConfig
from policies.config import SIMULATION_ONLY
from service.errors import StartupError, StoreUnavailable
from service.experiments import ExperimentService
from service.settings import Settings
from tests.conftest import (
    ADMIN,
    ADMIN_TOKEN,
    CONTEXTUAL,
    COVARIATES,
    STOCHASTIC,
    TEST_SHARDS,
    Api,
    decision_key,
    decision_numbers,
    key_pattern,
)

pytestmark = pytest.mark.anyio

COV_CONTEXT = {"experiment_id": "cov", "context": [0.1, 0.2, 0.3]}
_REPO = Path(__file__).resolve().parents[1]


# -- operations -------------------------------------------------------------


async def test_healthz_readyz(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready"}


async def test_readyz_is_503_with_retry_after_when_redis_fails(
    app: FastAPI, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def down() -> None:
        raise StoreUnavailable("Redis did not answer")

    monkeypatch.setattr(app.state.service, "ready", down)
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert response.json()["error"] == "store_unavailable"
    assert (await client.get("/healthz")).status_code == 200  # alive, just not ready


async def test_store_failure_mid_request_is_503(
    app: FastAPI, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = await api.create(COVARIATES)

    async def down(*_args: object) -> None:
        raise StoreUnavailable("Redis did not answer")

    monkeypatch.setattr(app.state.service, "choose", down)
    response = await api.choose(key, COV_CONTEXT)
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"


async def test_unexpected_error_is_500_without_a_stack_trace(
    app: FastAPI, api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    key = await api.create(COVARIATES)

    async def broken(*_args: object) -> None:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(app.state.service, "choose", broken)
    with caplog.at_level(logging.ERROR, logger="linreboot.app"):
        response = await api.choose(key, COV_CONTEXT)
    assert response.status_code == 500
    assert response.json() == {"error": "internal_error", "message": "internal server error"}
    assert "secret" not in response.text
    assert "Traceback" not in response.text
    assert any(r.exc_info and "secret" in str(r.exc_info[1]) for r in caplog.records)


async def test_unknown_route_and_method_are_json(client: httpx.AsyncClient) -> None:
    missing = await client.get("/nowhere")
    assert missing.status_code == 404
    assert missing.json()["error"] == "not_found"
    wrong_method = await client.put("/choose")
    assert wrong_method.status_code == 405
    assert set(wrong_method.json()) == {"error", "message"}


async def test_405_allow_lists_every_method_of_the_path(client: httpx.AsyncClient) -> None:
    """Allow is what the OpenAPI document says the path takes."""
    spec = (await client.get("/openapi.json")).json()
    assert len(spec["paths"]) >= 9
    for template, operations in spec["paths"].items():
        path = template.replace("{experiment_id}", "cov")
        allowed = {m.upper() for m in operations}
        for method in sorted({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
                             - allowed):
            response = await client.request(method, path, headers=ADMIN)
            assert response.status_code == 405, (method, path)
            assert set(response.headers["Allow"].split(", ")) == allowed, (method, path)
            if method != "HEAD":
                assert response.json()["error"] == "method_not_allowed"


async def test_openapi_documents_the_api(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    for path in ("/experiments", "/experiments/{experiment_id}",
                 "/experiments/{experiment_id}/arms", "/experiments/{experiment_id}/arms/retire",
                 "/choose", "/reward", "/healthz", "/readyz", "/metrics"):
        assert path in spec["paths"], path
    schemas = spec["components"]["schemas"]
    assert schemas["DecisionOut"]["examples"]
    assert schemas["ChooseIn"]["examples"]
    assert spec["paths"]["/choose"]["post"]["responses"]["422"]["content"]


async def test_the_documented_error_example_is_what_the_service_answers(api: Api) -> None:
    """ErrorOut's OpenAPI example and docs/API.md's are this request's real answer."""
    response = await api.http.post(
        "/choose", json={"experiment_id": "homepage", "context": ["0.2", -1.0, 0.5]},
        headers={"X-API-Key": "any-key"},
    )
    spec = (await api.http.get("/openapi.json")).json()
    assert response.json() == spec["components"]["schemas"]["ErrorOut"]["examples"][0]
    docs = (_REPO / "docs" / "API.md").read_text()
    example = docs.split("Every error has the same shape", 1)[1].split("```json\n", 1)[1]
    assert response.json() == json.loads(example.split("```", 1)[0])


def test_wire_hyperparameters_are_the_policy_config_fields() -> None:
    # ``variant`` (the authors' baselines) is for the simulator only.
    fixed = {"name", "setting", "dim", *SIMULATION_ONLY}
    tunable = {f.name for f in dataclasses.fields(PolicyConfig)} - fixed
    assert set(Hyperparameters.model_fields) == tunable
    assert {n for names in HYPERPARAMETERS.values() for n in names} == tunable


def _doc_table(text: str, header: str) -> list[list[str]]:
    lines = text[text.index(header):].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.strip().startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_api_docs_list_each_policys_hyperparameters_and_their_ranges() -> None:
    text = (Path(__file__).parents[1] / "docs" / "API.md").read_text()
    takes = {row[0].strip("`"): re.findall(r"`([a-z_]+)`", row[1])
             for row in _doc_table(text, "| policy | takes |")}
    assert {policy: [n for n in names if n in HYPERPARAMETERS[policy]]  # type: ignore[index]
            for policy, names in takes.items()} == {p: list(n) for p, n in HYPERPARAMETERS.items()}
    ranges = {row[0].strip("`"): (row[1], row[2])
              for row in _doc_table(text, "| hyperparameter | range | meaning |")}
    assert ranges == {name: (f"{r.low:g} to {r.high:g}", r.meaning) for name, r in RANGES.items()}


async def test_openapi_publishes_the_hyperparameter_ranges(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()["components"]["schemas"]
    fields = schema["Hyperparameters"]["properties"]
    for name, bounds in RANGES.items():
        number = next(option for option in fields[name]["anyOf"] if option["type"] == "number")
        assert (number["minimum"], number["maximum"]) == (bounds.low, bounds.high)


# -- experiments ------------------------------------------------------------


async def test_create_get_list_delete(api: Api) -> None:
    response = await api.http.post("/experiments", json=COVARIATES, headers=ADMIN)
    assert response.status_code == 201
    created = response.json()
    assert created["api_key"]
    experiment = created["experiment"]
    assert experiment["id"] == "cov"
    assert experiment["setting"] == "covariates"
    assert experiment["policy"] == "linreboot"
    assert experiment["reward_window_seconds"] == Settings().default_reward_window_seconds
    assert experiment["max_stale_rewards"] == 0  # every decision sees every reward
    assert [a["id"] for a in experiment["arms"]] == ["a", "b"]
    assert all(a["active"] and a["pulls"] == 0 for a in experiment["arms"])
    assert (experiment["decisions"], experiment["rewards"], experiment["duplicates"]) == (0, 0, 0)
    assert await api.experiment("cov") == experiment
    assert "api_key" not in json.dumps(experiment)

    await api.create({**STOCHASTIC, "hyperparameters": {"sigma_omega": 0.25}})
    assert await api.ids() == ["cov", "sto"]
    sto = await api.experiment("sto")
    # LinReBoot without a named spread gets the service's (pooled), in its spec too.
    assert sto["hyperparameters"] == {"sigma_omega": 0.25, "spread": "pooled"}
    assert sto["config"]["sigma_omega"] == 0.25 and sto["config"]["spread"] == "pooled"

    deleted = await api.http.delete("/experiments/cov", headers=ADMIN)
    assert deleted.status_code == 204
    assert deleted.content == b""
    assert (await api.http.get("/experiments/cov", headers=ADMIN)).status_code == 404
    assert (await api.http.delete("/experiments/cov", headers=ADMIN)).status_code == 404
    assert await api.ids() == ["sto"]


def _keys_of(url: str, experiment_id: str) -> set[bytes]:
    client = redis.Redis.from_url(url)
    try:
        found: set[bytes] = set(client.scan_iter(match=key_pattern(experiment_id)))
        return found
    finally:
        client.close()


async def test_delete_removes_the_experiments_decisions_too(api: Api, redis_db: str) -> None:
    """Pending and rewarded decisions (their contexts) go with the experiment, in Redis."""
    key = await api.create(COVARIATES)
    other_key = await api.create({**COVARIATES, "id": "other"})
    decisions = [await api.decide(key, COV_CONTEXT) for _ in range(3)]
    assert (await api.reward(key, {"experiment_id": "cov", "decision_id": decisions[0],
                                   "reward": 1.0})).status_code == 200
    await api.decide(other_key, {**COV_CONTEXT, "experiment_id": "other"})
    before = _keys_of(redis_db, "cov")
    assert {decision_key("cov", d).encode() for d in decisions} <= before
    others = _keys_of(redis_db, "other")

    assert (await api.http.delete("/experiments/cov", headers=ADMIN)).status_code == 204
    assert _keys_of(redis_db, "cov") == set()
    assert _keys_of(redis_db, "other") == others
    # Created again, its decisions are its own, and they go with it in turn.
    key = await api.create(COVARIATES)
    await api.decide(key, COV_CONTEXT)
    assert (await api.http.delete("/experiments/cov", headers=ADMIN)).status_code == 204
    assert _keys_of(redis_db, "cov") == set()


async def test_delete_removes_more_decisions_than_one_round_trip_takes(
    api: Api, redis_db: str
) -> None:
    key = await api.create(COVARIATES)
    await api.decide(key, COV_CONTEXT)
    client = redis.Redis.from_url(redis_db)
    try:  # 2,500 more listed decisions, as decide.lua lists them
        with client.pipeline(transaction=False) as pipe:
            for i in range(2_500):
                pipe.hset(f"lrb:{{cov}}:decision:d{i}", "status", "pending")
                pipe.rpush("lrb:{cov}:pending", f"9999999999 d{i}")
            pipe.execute()
        assert len(_keys_of(redis_db, "cov")) > 2_500
        assert (await api.http.delete("/experiments/cov", headers=ADMIN)).status_code == 204
        assert _keys_of(redis_db, "cov") == set()
    finally:
        client.close()


async def test_the_list_of_decisions_drops_expired_ones(api: Api, redis_db: str) -> None:
    """Every 64th decision drops the expired entries at the list's head (up to 128)."""
    if TEST_SHARDS > 1:
        pytest.skip("one list's tidying, by the decisions on one member: run unsharded")
    key = await api.create(COVARIATES)
    await api.decide(key, COV_CONTEXT)
    client = redis.Redis.from_url(redis_db)
    try:
        client.lpush("lrb:{cov}:pending", *(f"{1_000 + i} expired{i}" for i in range(130)))
        assert client.llen("lrb:{cov}:pending") == 131
        for _ in range(60):  # the list reaches 192 entries with the 61st decision
            await api.decide(key, COV_CONTEXT)
        assert client.llen("lrb:{cov}:pending") == 191
        await api.decide(key, COV_CONTEXT)
        listed: list[bytes] = client.lrange("lrb:{cov}:pending", 0, -1)  # type: ignore[assignment]
        assert len(listed) == 192 - 128 and sum(b"expired" in e for e in listed) == 2
        ttl: int = client.ttl("lrb:{cov}:pending")  # type: ignore[assignment]
        assert 0 < ttl <= Settings().default_reward_window_seconds + 1
    finally:
        client.close()


async def test_create_twice_is_409(api: Api) -> None:
    await api.create(COVARIATES)
    again = await api.http.post("/experiments", json=COVARIATES, headers=ADMIN)
    assert again.status_code == 409
    assert again.json()["error"] == "conflict"


async def test_add_and_retire_arms(api: Api) -> None:
    key = await api.create(COVARIATES)
    added = await api.http.post("/experiments/cov/arms", json={"arms": [{"id": "c"}]},
                                headers=ADMIN)
    assert added.status_code == 200
    assert [a["id"] for a in added.json()["arms"]] == ["a", "b", "c"]

    retired = await api.http.post("/experiments/cov/arms/retire", json={"arm_ids": ["a", "c"]},
                                  headers=ADMIN)
    assert retired.status_code == 200
    assert {a["id"]: a["active"] for a in retired.json()["arms"]} == {
        "a": False, "b": True, "c": False,
    }
    for _ in range(5):
        assert (await api.choose(key, COV_CONTEXT)).json()["arm_id"] == "b"


async def test_added_and_retired_arms_keep_their_features_to_the_last_bit(api: Api) -> None:
    """A double needs 17 significant digits and Redis's cjson writes 14: the arms' records
    are written as the service made them, so an added arm's features and a retired
    arm's are the ones given, bit for bit."""
    exact = [0.30000000000000004, 1.2345678901234567]
    await api.create({**STOCHASTIC, "arms": [{"id": "a", "features": exact},
                                             {"id": "b", "features": [0.0, 1.0]}]})
    added = await api.http.post("/experiments/sto/arms", headers=ADMIN,
                                json={"arms": [{"id": "c", "features": exact[::-1]}]})
    assert added.status_code == 200
    retired = await api.http.post("/experiments/sto/arms/retire", json={"arm_ids": ["a"]},
                                  headers=ADMIN)
    assert retired.status_code == 200
    arms = {a["id"]: (a["features"], a["active"]) for a in retired.json()["arms"]}
    assert arms == {"a": (exact, False), "b": ([0.0, 1.0], True), "c": (exact[::-1], True)}


async def test_a_retired_arms_context_is_ignored_not_refused(api: Api) -> None:
    """Issue 25: a client that still sends a retired arm's context (it has not learnt of
    the retirement yet) gets a decision among the active arms, not a 422; an unknown
    arm's context, or contexts of retired arms only, are still refused."""
    key = await api.create(CONTEXTUAL)
    retired = await api.http.post("/experiments/ctx/arms/retire", json={"arm_ids": ["c"]},
                                  headers=ADMIN)
    assert retired.status_code == 200
    every = {"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [5.0, 5.0]}
    for _ in range(5):
        response = await api.choose(key, {"experiment_id": "ctx", "arm_contexts": every})
        assert response.status_code == 200, response.text
        assert response.json()["arm_id"] in ("a", "b")
    only_retired = await api.choose(key, {"experiment_id": "ctx",
                                          "arm_contexts": {"c": [1.0, 1.0]}})
    assert only_retired.status_code == 422 and "no arm is eligible" in only_retired.text
    unknown = await api.choose(key, {"experiment_id": "ctx",
                                     "arm_contexts": {**every, "z": [1.0, 1.0]}})
    assert unknown.status_code == 422


async def test_unknown_experiment_is_404_for_management(api: Api) -> None:
    for method, path, body in [
        ("GET", "/experiments/ghost", None),
        ("DELETE", "/experiments/ghost", None),
        ("POST", "/experiments/ghost/arms", {"arms": [{"id": "c"}]}),
        ("POST", "/experiments/ghost/arms/retire", {"arm_ids": ["a"]}),
    ]:
        response = await api.http.request(method, path, json=body, headers=ADMIN)
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["error"] == "not_found"


# -- credentials --------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/experiments", COVARIATES),
        ("GET", "/experiments", None),
        ("GET", "/experiments/cov", None),
        ("DELETE", "/experiments/cov", None),
        ("POST", "/experiments/cov/arms", {"arms": [{"id": "c"}]}),
        ("POST", "/experiments/cov/arms/retire", {"arm_ids": ["a"]}),
    ],
)
async def test_management_needs_the_admin_token(
    api: Api, method: str, path: str, body: object
) -> None:
    key = await api.create({**COVARIATES, "id": "cov"}) if path != "/experiments" else "k"
    before = await api.ids()
    cases: list[tuple[dict[str, str], int]] = [
        ({}, 401),
        ({"Authorization": f"Basic {ADMIN_TOKEN}"}, 401),
        ({"Authorization": "Bearer"}, 401),
        ({"X-API-Key": key}, 401),  # an experiment key is not an admin token
        ({"X-API-Key": ADMIN_TOKEN}, 401),
        ({"Authorization": "Bearer wrong-token"}, 403),
        ({"Authorization": f"Bearer {key}"}, 403),
    ]
    for headers, status in cases:
        response = await api.http.request(method, path, json=body, headers=headers)
        assert response.status_code == status, (headers, response.text)
        assert response.json()["error"] in {"unauthorized", "forbidden"}
        assert ADMIN_TOKEN not in response.text
        if status == 401:
            assert response.headers["WWW-Authenticate"] == "Bearer"
    assert await api.ids() == before
    if path.startswith("/experiments/cov"):
        assert (await api.experiment("cov"))["arms"][0]["active"]


async def test_choose_and_reward_need_the_experiments_key(api: Api) -> None:
    cov_key = await api.create(COVARIATES)
    ctx_key = await api.create(CONTEXTUAL)
    decision = await api.decide(cov_key, COV_CONTEXT)
    before = await api.state("cov")
    reward = {"experiment_id": "cov", "decision_id": decision, "reward": 1.0}
    for path, body in [("/choose", COV_CONTEXT), ("/reward", reward)]:
        for headers, status in [
            ({}, 401),
            ({"X-API-Key": ""}, 401),
            ({"Authorization": f"Bearer {ADMIN_TOKEN}"}, 401),  # admin may not decide
            ({"X-API-Key": ADMIN_TOKEN}, 403),
            ({"X-API-Key": "wrong-key"}, 403),
            ({"X-API-Key": ctx_key}, 403),  # another experiment's key
        ]:
            response = await api.http.post(path, json=body, headers=headers)
            assert response.status_code == status, (path, headers, response.text)
            assert cov_key not in response.text
    assert await api.state("cov") == before


@pytest.mark.parametrize("path", ["/choose", "/reward"])
async def test_a_missing_experiment_answers_as_a_wrong_key_does(api: Api, path: str) -> None:
    """Without the key, nobody learns which experiment ids exist."""
    key = await api.create(COVARIATES)
    gone_key = await api.create({**COVARIATES, "id": "gone"})
    decision = await api.decide(key, COV_CONTEXT)
    await api.decide(gone_key, {**COV_CONTEXT, "experiment_id": "gone"})  # a view of "gone"
    assert (await api.http.delete("/experiments/gone", headers=ADMIN)).status_code == 204

    async def call(experiment_id: str, api_key: str) -> tuple[int, object]:
        body = ({**COV_CONTEXT, "experiment_id": experiment_id} if path == "/choose" else
                {"experiment_id": experiment_id, "decision_id": decision, "reward": 1.0})
        response = await api.http.post(path, json=body, headers={"X-API-Key": api_key})
        return response.status_code, response.json()

    wrong_key = await call("cov", "wrong-key")
    assert wrong_key == (403, {"error": "forbidden",
                               "message": "the API key is not valid for this experiment"})
    for experiment_id, api_key in [("ghost", "wrong-key"), ("ghost", key), ("gone", gone_key),
                                   ("gone", "wrong-key")]:
        assert await call(experiment_id, api_key) == wrong_key, (experiment_id, api_key)
    assert (await api.experiment("cov"))["rewards"] == 0


async def test_credentials_are_checked_before_the_body_is_validated(api: Api) -> None:
    """No credentials: 401 even for a body that would be refused (but is JSON)."""
    bad = {"experiment_id": "ev{il}", "context": [True]}
    assert (await api.http.post("/choose", json=bad)).status_code == 401
    assert (await api.http.post("/reward", json=bad)).status_code == 401
    assert (await api.http.post("/experiments", json=bad)).status_code == 401


async def test_a_wrong_key_is_403_before_the_request_is_checked_against_the_experiment(
    api: Api,
) -> None:
    """A caller without the key learns nothing of the experiment (its dim, its arms)."""
    key = await api.create(COVARIATES)
    await api.decide(key, COV_CONTEXT)  # this worker now holds a view of "cov"
    for body in ({"experiment_id": "cov", "context": [1.0]},  # wrong length
                 {**COV_CONTEXT, "eligible": ["no-such-arm"]}):
        wrong = await api.http.post("/choose", json=body, headers={"X-API-Key": "wrong-key"})
        assert wrong.status_code == 403, wrong.text
        assert (await api.choose(key, body)).status_code == 422  # with the key: refused


# -- decisions ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "request_body"),
    [
        (COVARIATES, COV_CONTEXT),
        (CONTEXTUAL, {"experiment_id": "ctx",
                      "arm_contexts": {"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [0.5, 0.5]}}),
        (STOCHASTIC, {"experiment_id": "sto"}),
    ],
    ids=["covariates", "contextual", "stochastic"],
)
async def test_choose_in_every_setting(
    api: Api, spec: dict[str, object], request_body: dict[str, object]
) -> None:
    key = await api.create(spec)
    arm_ids = {a["id"] for a in spec["arms"]}  # type: ignore[attr-defined]
    made, numbers = [], []
    for number in range(1, len(arm_ids) + 3):
        response = await api.choose(key, request_body)
        assert response.status_code == 200, response.text
        decision = response.json()
        assert set(decision) == {"decision_id", "arm_id", "index", "exploring",
                                 "decision_number", "expires_in_seconds", "propensity"}
        assert decision["arm_id"] in arm_ids
        made.append(decision["decision_id"])
        numbers.append(decision["decision_number"])
        assert decision["expires_in_seconds"] == Settings().default_reward_window_seconds
        assert (decision["index"] is None) == decision["exploring"]
        if decision["exploring"]:  # uniform among the arms not pulled yet (one per decision)
            assert decision["propensity"] == 1 / (len(arm_ids) - number + 1)
        assert 0.0 < decision["propensity"] <= 1.0
        reward = {"experiment_id": spec["id"], "decision_id": decision["decision_id"],
                  "reward": 0.5}
        assert (await api.reward(key, reward)).json()["status"] == "applied"
    assert numbers == decision_numbers(made)
    view = await api.experiment(str(spec["id"]))
    assert view["decisions"] == view["rewards"] == len(arm_ids) + 2
    assert sum(a["pulls"] for a in view["arms"]) == len(arm_ids) + 2


async def test_choose_respects_eligible_and_excluded(api: Api) -> None:
    key = await api.create({**COVARIATES, "arms": [{"id": i} for i in "abcd"]})
    for _ in range(8):
        eligible = await api.choose(key, {**COV_CONTEXT, "eligible": ["c", "d"],
                                          "excluded": ["d"]})
        assert eligible.json()["arm_id"] == "c"


_ABC = {**COVARIATES, "arms": [{"id": "a"}, {"id": "b"}, {"id": "c"}]}
_AB_CONTEXTS = {"a": [1.0, 0.0], "b": [0.0, 1.0]}


async def _retire_c(worker: ExperimentService, experiment_id: str) -> None:
    await worker.retire_arms(experiment_id, ["c"])


@pytest.mark.parametrize(
    ("spec", "change", "refused", "good"),
    [
        (_ABC, _retire_c, {**COV_CONTEXT, "eligible": ["c"]}, COV_CONTEXT),
        (_ABC, _retire_c, {**COV_CONTEXT, "excluded": ["a", "b"]}, COV_CONTEXT),
        # (a retired arm's context beside others' is ignored: a valid request)
        (CONTEXTUAL, _retire_c,
         {"experiment_id": "ctx", "arm_contexts": {"c": [0.5, 0.5]}},
         {"experiment_id": "ctx", "arm_contexts": _AB_CONTEXTS}),
    ],
    ids=["eligible names an arm retired since", "excluded leaves only an arm retired since",
         "arm_contexts names only an arm retired since"],
)
async def test_a_refused_choose_on_a_seeded_experiment_takes_no_decision_number(
    api: Api, other_service: ExperimentService, spec: dict[str, object],
    change: Callable[[ExperimentService, str], Awaitable[None]],
    refused: dict[str, object], good: dict[str, object],
) -> None:
    """This worker's view predates an arms change that makes the request invalid."""
    experiment_id = str(spec["id"])
    key = await api.create(spec)
    first = await api.choose(key, refused)  # valid before the change
    # and this worker now holds a view
    assert first.json()["decision_number"] == decision_numbers([first.json()["decision_id"]])[0]
    await change(other_service, experiment_id)  # another worker changes its arms
    before = await api.state(experiment_id)
    response = await api.choose(key, refused)
    assert response.status_code == 422, response.text
    assert await api.state(experiment_id) == before
    second = (await api.choose(key, good)).json()
    assert second["decision_number"] == decision_numbers(
        [first.json()["decision_id"], second["decision_id"]])[1]


# -- rewards -------------------------------------------------------------------


async def test_reward_statuses(api: Api) -> None:
    key = await api.create(COVARIATES)
    other_key = await api.create({**COVARIATES, "id": "other"})
    decision = await api.decide(key, COV_CONTEXT)
    other_decision = await api.decide(other_key, {**COV_CONTEXT, "experiment_id": "other"})

    def body(decision_id: str, reward: float) -> dict[str, object]:
        return {"experiment_id": "cov", "decision_id": decision_id, "reward": reward}

    applied = await api.reward(key, body(decision, 0.75))
    assert (applied.status_code, applied.json()["status"]) == (200, "applied")
    after_first = await api.state("cov")

    duplicate = await api.reward(key, body(decision, 0.75))
    assert (duplicate.status_code, duplicate.json()["status"]) == (200, "duplicate")
    assert "not applied again" in duplicate.json()["message"]

    conflict = await api.reward(key, body(decision, 0.25))
    assert (conflict.status_code, conflict.json()["status"]) == (409, "conflict")

    unknown = await api.reward(key, body("0123456789abcdef0123456789abcdef", 1.0))
    assert (unknown.status_code, unknown.json()["status"]) == (404, "not_found")

    elsewhere = await api.reward(key, body(other_decision, 1.0))  # other experiment's decision
    assert (elsewhere.status_code, elsewhere.json()["status"]) == (404, "not_found")

    for response in (applied, duplicate, conflict, unknown, elsewhere):
        assert set(response.json()) == {"decision_id", "status", "message"}
    state = await api.state("cov")
    assert state["rewards"] == after_first["rewards"] == 1
    assert state["duplicates"] == 1
    assert state["arms"] == after_first["arms"]
    assert (await api.experiment("other"))["rewards"] == 0


@pytest.mark.parametrize(
    ("first", "second", "status"),
    [
        ("0.0", "-0.0", "duplicate"),  # the same number: IEEE -0.0 == 0.0
        ("-0.0", "0.0", "duplicate"),
        ("-0.0", "-0", "duplicate"),
        ("0", "-0.0", "duplicate"),
        ("0.5", "5e-1", "duplicate"),
        ("0.0", "5e-324", "conflict"),  # the smallest float above zero is another reward
        ("-0.0", "-5e-324", "conflict"),
    ],
)
async def test_equal_rewards_are_duplicates_however_written(
    api: Api, first: str, second: str, status: str
) -> None:
    key = await api.create(COVARIATES)
    decision = await api.decide(key, COV_CONTEXT)
    for text, expected in ((first, "applied"), (second, status)):
        body = f'{{"experiment_id": "cov", "decision_id": "{decision}", "reward": {text}}}'
        response = await api.http.post("/reward", content=body.encode(), headers={
            "X-API-Key": key, "Content-Type": "application/json"})
        assert response.json()["status"] == expected, (text, response.text)
    assert (await api.experiment("cov"))["rewards"] == 1


async def test_reward_batch_reports_each_item(api: Api) -> None:
    key = await api.create(COVARIATES)
    first, second, third = [await api.decide(key, COV_CONTEXT) for _ in range(3)]
    assert (await api.reward(key, {"experiment_id": "cov", "decision_id": third,
                                   "reward": 1.0})).status_code == 200
    response = await api.reward(key, {"experiment_id": "cov", "rewards": [
        {"decision_id": first, "reward": 1.0},
        {"decision_id": first, "reward": 1.0},
        {"decision_id": second, "reward": 0.0},
        {"decision_id": third, "reward": 0.5},
        {"decision_id": "0123456789abcdef0123456789abcdef", "reward": 1.0},
    ]})
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["decision_id"] for r in results] == [first, first, second, third,
                                                  "0123456789abcdef0123456789abcdef"]
    assert [r["status"] for r in results] == [
        "applied", "duplicate", "applied", "conflict", "not_found",
    ]
    view = await api.experiment("cov")
    assert (view["decisions"], view["rewards"], view["duplicates"]) == (3, 3, 1)


async def test_a_recreated_experiment_is_seen_by_every_worker(app_settings: Settings) -> None:
    first, second = create_app(app_settings), create_app(app_settings)  # two workers
    async with first.router.lifespan_context(first), second.router.lifespan_context(second):
        one = Api(httpx.AsyncClient(transport=httpx.ASGITransport(app=first), base_url="http://a"))
        two = Api(httpx.AsyncClient(transport=httpx.ASGITransport(app=second),
                                    base_url="http://b"))
        old_key = await one.create(COVARIATES)
        await two.decide(old_key, COV_CONTEXT)  # the second worker now knows "cov"
        assert (await one.http.delete("/experiments/cov", headers=ADMIN)).status_code == 204
        new_key = await one.create({**COVARIATES, "arms": [{"id": "x"}, {"id": "y"}]})
        assert (await two.choose(old_key, COV_CONTEXT)).status_code == 403
        assert (await two.choose(new_key, COV_CONTEXT)).json()["arm_id"] in {"x", "y"}


# -- metrics and logs --------------------------------------------------------------


async def test_metrics_count_decisions_rewards_errors_and_latency(api: Api) -> None:
    key = await api.create(COVARIATES)
    decision = await api.decide(key, COV_CONTEXT)
    reward = {"experiment_id": "cov", "decision_id": decision, "reward": 1.0}
    await api.reward(key, reward)
    await api.reward(key, reward)
    await api.choose("wrong-key", COV_CONTEXT)
    await api.reward("wrong-key", reward)
    response = await api.http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert "linreboot_decisions_total 1.0" in text
    # A reward's fate is its "outcome"; "code" is always an HTTP status code.
    assert 'linreboot_rewards_total{outcome="applied"} 1.0' in text
    assert 'linreboot_rewards_total{outcome="duplicate"} 1.0' in text
    assert 'linreboot_rewards_total{outcome="not_found"} 0.0' in text
    assert 'linreboot_errors_total{code="403",route="/choose"} 1.0' in text
    assert 'linreboot_errors_total{code="403",route="/reward"} 1.0' in text
    choose = 'linreboot_request_duration_seconds_count{code="%s",method="POST",route="/choose"}'
    assert f"{choose % 200} 1.0" in text
    assert f"{choose % 403} 1.0" in text
    assert 'route="/experiments/{experiment_id}"' not in text  # no GET of one experiment yet
    await api.experiment("cov")
    text = (await api.http.get("/metrics")).text
    assert 'route="/experiments/{experiment_id}"' in text  # the template, not the id


async def test_metrics_say_readiness_redis_memory_and_default_rewards(
    api: Api, app: FastAPI
) -> None:
    """What the alert rules of deploy/ read: readiness and each Redis node's memory as of
    the scrape, and the default rewards the sweepers applied."""
    key = await api.create({**COVARIATES, "default_reward": 0.0, "reward_window_seconds": 1})
    await api.decide(key, COV_CONTEXT)
    text = (await api.http.get("/metrics")).text
    assert "linreboot_default_rewards_total 0.0" in text
    await asyncio.sleep(1.3)
    await app.state.service.sweep()  # (or the app's own sweeper did, meanwhile)
    assert (await api.experiment("cov"))["defaulted"] == 1
    text = (await api.http.get("/metrics")).text
    assert "linreboot_default_rewards_total 1.0" in text
    assert "linreboot_ready 1.0" in text and "linreboot_store_full 0.0" in text
    # One Redis: node "redis"; a cluster (tests/test_cluster.py): each primary's address.
    used = dict(re.findall(r'^linreboot_redis_used_memory_bytes\{node="([^"]+)"\} (\S+)$',
                           text, re.M))
    limit = dict(re.findall(r'^linreboot_redis_maxmemory_bytes\{node="([^"]+)"\} (\S+)$',
                            text, re.M))
    assert used and set(used) == set(limit)
    assert all(float(v) > 100_000 for v in used.values())
    assert all(float(v) >= 0 for v in limit.values())


async def test_a_scrape_says_not_ready_rather_than_fail(
    api: Api, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store error the service does not translate (an ACL refusing PING, say) makes
    the scrape say linreboot_ready 0 and export no memory of that moment; never a 500
    (review, session 16)."""
    assert "linreboot_ready 1.0" in (await api.http.get("/metrics")).text

    async def refused() -> None:
        raise redis.exceptions.NoPermissionError("this user has no permissions to run 'ping'")

    monkeypatch.setattr(app.state.service, "ready", refused)
    scrape = await api.http.get("/metrics")
    assert scrape.status_code == 200
    assert "linreboot_ready 0.0" in scrape.text
    assert "linreboot_redis_used_memory_bytes{" not in scrape.text  # nothing stale


def test_metrics_multiprocess_mode(tmp_path: Path) -> None:
    """With PROMETHEUS_MULTIPROC_DIR, /metrics sums what every worker process wrote."""
    script = (
        "from app.metrics import Metrics\n"
        "from service.domain import RewardOutcome\n"
        "m = Metrics()\n"
        "m.record_decision()\n"
        "m.record_rewards([RewardOutcome('d', 'applied', '')])\n"
        "m.observe_request('POST', '/choose', 403, 0.01)\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for _ in range(2):  # two "workers"
        subprocess.run([sys.executable, "-c", script], env=env, cwd=_REPO, check=True)
    reader = "from app.metrics import Metrics\nprint(Metrics().exposition().decode())\n"
    text = subprocess.run([sys.executable, "-c", reader], env=env, cwd=_REPO, check=True,
                          capture_output=True, text=True).stdout
    assert "linreboot_decisions_total 2.0" in text
    assert 'linreboot_rewards_total{outcome="applied"} 2.0' in text
    assert 'linreboot_errors_total{code="403",route="/choose"} 2.0' in text


async def test_one_structured_log_line_per_request(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    key = await api.create(COVARIATES)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="linreboot.access"):
        await api.choose(key, COV_CONTEXT)
        await api.http.get("/experiments/cov", headers=ADMIN)
        await api.http.get("/healthz")
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records
             if r.name == "linreboot.access"]
    assert [(line["method"], line["route"], line["status"]) for line in lines] == [
        ("POST", "/choose", 200),
        ("GET", "/experiments/{experiment_id}", 200),
        ("GET", "/healthz", 200),
    ]
    assert [line.get("experiment_id") for line in lines] == ["cov", "cov", None]
    assert all(line["latency_ms"] >= 0 and line["level"] == "info" for line in lines)


async def test_every_request_has_an_id_in_its_response_and_its_log_lines(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    await api.create(COVARIATES)
    caplog.clear()
    unsafe = ["a b", "x" * 129, "<script>", "ü"]
    with caplog.at_level(logging.INFO, logger="linreboot.access"):
        given = await api.http.get("/healthz", headers={"X-Request-ID": "edge-7f3a:1"})
        made = [await api.http.get("/healthz") for _ in range(2)]
        refused = [await api.http.get("/healthz", headers=[(b"X-Request-ID", bad.encode())])
                   for bad in unsafe]
        wrong_key = await api.choose("wrong-key", COV_CONTEXT)
    assert given.headers["x-request-id"] == "edge-7f3a:1"  # a safe client id is kept
    ids = [r.headers["x-request-id"] for r in (*made, *refused, wrong_key)]
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)  # the others are made here
    assert len(set(ids)) == len(ids)
    logged = [json.loads(JsonFormatter().format(r))["request_id"] for r in caplog.records
              if r.name == "linreboot.access"]
    assert logged == ["edge-7f3a:1", *ids]


def test_lines_logged_while_a_request_runs_carry_its_id() -> None:
    """Not only the access log: an error logged by a route names the request too."""
    record = logging.LogRecord("linreboot.app", logging.ERROR, __file__, 1, "boom", None, None)
    assert "request_id" not in json.loads(JsonFormatter().format(record))
    token = request_id.set("req-42")
    try:
        assert json.loads(JsonFormatter().format(record))["request_id"] == "req-42"
    finally:
        request_id.reset(token)


async def test_choose_and_reward_log_lines_name_their_decisions(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    key = await api.create(COVARIATES)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="linreboot.access"):
        first = await api.decide(key, COV_CONTEXT)
        second = await api.decide(key, COV_CONTEXT)
        await api.reward(key, {"experiment_id": "cov", "decision_id": first, "reward": 1.0})
        await api.reward(key, {"experiment_id": "cov", "rewards": [
            {"decision_id": first, "reward": 1.0}, {"decision_id": second, "reward": 0.0}]})
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records
             if r.name == "linreboot.access"]
    assert [(line["route"], line.get("decision_id"), line.get("decision_ids"))
            for line in lines] == [
        ("/choose", first, None),
        ("/choose", second, None),
        ("/reward", first, None),
        ("/reward", None, [first, second]),
    ]


async def test_persistence_warnings_are_logged_at_start(
    app_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(app_settings)
    with caplog.at_level(logging.WARNING, logger="linreboot.app"):
        async with app.router.lifespan_context(app):
            warnings = list(app.state.service.persistence_warnings)
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for warning in warnings:
        assert any(warning in message for message in logged)
    assert not hasattr(app.state, "service")  # closed and released at shutdown


async def test_a_running_app_keeps_blas_to_one_thread_and_restores_it_at_shutdown(
    app_settings: Settings,
) -> None:
    def blas_threads() -> set[int]:
        return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}

    app = create_app(app_settings)
    with threadpool_limits(limits=2, user_api="blas"):  # as on a machine with 2+ cores
        assert blas_threads() == {2}
        async with app.router.lifespan_context(app):
            assert blas_threads() == {1}
        assert blas_threads() == {2}


def test_create_app_opens_nothing_and_settings_validate_the_log_level() -> None:
    app = create_app(Settings(redis_url="redis://127.0.0.1:1/0"))  # nothing listens there
    assert not hasattr(app.state, "service")
    with pytest.raises(StartupError, match=r"^--log-level: "):
        Settings.load({"redis_url": "redis://127.0.0.1:1/0", "log_level": "chatty"})
    assert Settings.load({"log_level": "WARNING"}).log_level == "warning"


async def test_list_pages_through_experiments_in_id_order(api: Api) -> None:
    for experiment_id in ("e3", "e1", "e5", "e2", "e4"):
        await api.create({**COVARIATES, "id": experiment_id})
    pages, after = [], None
    while True:
        params = {"limit": "2", **({"after": after} if after else {})}
        response = await api.http.get("/experiments", params=params, headers=ADMIN)
        assert response.status_code == 200, response.text
        page = response.json()
        pages.append([e["id"] for e in page["experiments"]])
        after = page["next_after"]
        if after is None:
            break
    assert pages == [["e1", "e2"], ["e3", "e4"], ["e5"]]
    for params in ({"limit": "0"}, {"limit": "1001"}, {"after": "ev{il}"}):
        refused = await api.http.get("/experiments", params=params, headers=ADMIN)
        assert refused.status_code == 422, (params, refused.text)


# -- the interactive docs -----------------------------------------------------------


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_docs_pages_use_only_assets_the_app_serves(api: Api, page: str) -> None:
    """Without internet the pages still work: nothing is loaded from another host."""
    response = await api.http.get(page)
    assert response.status_code == 200
    html = response.text
    urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)
    urls += re.findall(r"""(?:url|spec-url)\s*[:=]\s*["']([^"']+)["']""", html)
    assert not re.search(r"https?://|//cdn|googleapis", html), "an external reference"
    assets = [u for u in urls if u.startswith("/static/")]
    assert len(assets) >= (3 if page == "/docs" else 2), urls  # script (+ css) + favicon
    assert "/openapi.json" in urls
    for url in assets:
        asset = await api.http.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 500, url
    script = next(u for u in assets if u.endswith(".js"))
    assert "javascript" in (await api.http.get(script)).headers["content-type"]
