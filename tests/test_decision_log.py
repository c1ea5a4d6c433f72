"""The decision log, against a real Redis.

- replaying the log's outcomes, in its order, through ``policies.update``
  gives the stored statistics bit for bit (rewards in any order, defaults,
  late rewards, duplicates, in every setting);
- it pages over HTTP, and bad pages are 4xx;
- ``linreboot export`` writes it as JSON lines and as Open Bandit Pipeline's
  bandit feedback, and both replay to the stored statistics;
- its bounds hold: length, and age.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from pydantic import SecretStr

from linreboot.export import export, load_bandit_feedback
from loadtest.server import server_process
from policies import PolicyConfig, Setting, layout, prepare
from policies.config import PolicyName
from policies.propensity import SERVICE, propensities
from service import keys, shards
from service.definition import index_ranges, parse_index_ranges
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec, LogEntry
from service.errors import InvalidInput
from service.experiments import ExperimentService
from service.off_policy import in_application_order
from service.settings import Settings
from tests.conftest import ADMIN, ADMIN_TOKEN, TEST_SHARDS, Api, decision_numbers
from tests.replay import (
    assert_each_members_order,
    assert_members_stats,
    member_logs,
    state_after,
)
from tests.test_service_durability import (
    Observation,
    assert_stats_equal,
    expected_state,
    stored_stats,
)

pytestmark = pytest.mark.anyio

ARMS = ["a", "b", "c"]


@pytest.fixture
def app_settings(redis_db: str) -> Settings:
    """The app's background sweeper as good as off: the tests sweep when they mean to."""
    return Settings(redis_url=redis_db, admin_token=SecretStr(ADMIN_TOKEN),
                    sweep_interval_seconds=60)


async def log_pages(service: ExperimentService, experiment_id: str, limit: int
                    ) -> list[list[LogEntry]]:
    """The log as its pages, each read after the one before, to the end."""
    pages: list[list[LogEntry]] = []
    after = None
    while True:
        page, after = await service.read_log(experiment_id, after, limit=limit)
        pages.append(page)
        if after is None:
            return pages


async def whole_log(service: ExperimentService, experiment_id: str) -> list[LogEntry]:
    return [e for page in await log_pages(service, experiment_id, 7) for e in page]


def request_for(setting: str, rng: np.random.Generator, dim: int) -> ChooseRequest:
    if setting == "stochastic":
        return ChooseRequest()
    if setting == "contextual":
        return ChooseRequest(arm_contexts={
            a: tuple(float(v) for v in rng.normal(size=dim)) for a in ARMS})
    return ChooseRequest(context=tuple(float(v) for v in rng.normal(size=dim)))


@pytest.mark.parametrize(("setting", "hyperparameters"), [
    ("stochastic", {}),
    ("contextual", {"residuals": "observed"}),  # per-arm Gram matrices in the arm blobs
    ("covariates", {}),
    # Forgetting: the rewards' decision numbers, out of order, weigh them.
    ("stochastic", {"discount": 0.95}),
    ("contextual", {"residuals": "observed", "discount": 0.9}),
    ("covariates", {"discount": 0.5}),
])
async def test_replaying_the_log_reproduces_the_stored_sums_bit_for_bit(
    service: ExperimentService, redis_db: str, setting: Setting,
    hyperparameters: dict[str, float | str],
) -> None:
    rng = np.random.default_rng(21)
    dim = 10  # 80 bytes of context: two chunks in the decision record
    features = rng.normal(size=(3, dim)) if setting == "stochastic" else None
    arms = tuple(ArmSpec(a, None if features is None else tuple(features[i]))
                 for i, a in enumerate(ARMS))
    await service.create(ExperimentSpec(
        id="replay", setting=setting, dim=dim, arms=arms, hyperparameters=hyperparameters,
        # 3 s: the rewards below must land within the window on a loaded machine too.
        reward_window_seconds=3, default_reward=0.125, log_max_entries=10_000))
    early = [await service.choose("replay", request_for(setting, rng, dim)) for _ in range(12)]
    random.Random(5).shuffle(early)
    for d in early[:8]:  # rewarded in another order than decided, one of them twice
        await service.reward("replay", [(d.decision_id, float(rng.normal()))])
    await service.reward("replay", [(early[0].decision_id, 99.0)])  # a conflict: not applied
    await asyncio.sleep(3.1)
    assert await service.sweep() == 4
    await service.reward("replay", [(early[9].decision_id, 7.0)])  # late: not applied
    for _ in range(20):  # then decisions rewarded at once, with the defaults' sums in them
        d = await service.choose("replay", request_for(setting, rng, dim))
        await service.reward("replay", [(d.decision_id, float(rng.normal()))])

    log = await whole_log(service, "replay")

    assert [e.type for e in log].count("decision") == 32
    assert sum(e.type == "late" for e in log) == 1
    view = await service.get("replay")
    assert (view.rewards, view.defaulted, view.late) == (28, 4, 1)
    assert_members_stats(redis_db, "replay", PolicyConfig(**view.config),  # type: ignore[arg-type]
                         ARMS, log)


async def test_decision_entries_hold_what_the_decision_was_made_from(
    service: ExperimentService,
) -> None:
    await service.create(ExperimentSpec(
        id="what", setting="covariates", dim=2, arms=tuple(ArmSpec(f"arm{i}") for i in range(6)),
        seed=3, log_max_entries=100, hyperparameters={"spread": "paper", "first_pass": True}))
    await service.retire_arms("what", ["arm2"])
    first = await service.choose("what", ChooseRequest(context=(0.5, -1.0)))
    second = await service.choose("what", ChooseRequest(context=(1e-300, 3.0),
                                                        excluded=("arm0", "arm5")))
    await service.reward("what", [(first.decision_id, 1.0)])
    # Sharded, the other members' sums are as this worker last read them, at most
    # SYNC_SECONDS before: past that, the third decision sees the reward wherever it is.
    await asyncio.sleep(shards.SYNC_SECONDS + 0.01)
    third = await service.choose("what", ChooseRequest(context=(0.1, 0.2),
                                                       eligible=("arm4", "arm1")))

    log, next_after = await service.read_log("what", limit=100)

    assert next_after is None
    assert_each_members_order([(e.type, e.decision_id) for e in log], [
        ("decision", first.decision_id), ("decision", second.decision_id),
        ("reward", first.decision_id), ("decision", third.decision_id)], TEST_SHARDS)
    one, two, three = (next(e for e in log if e.decision_id == d.decision_id)
                       for d in (first, second, third))
    reward = next(e for e in log if e.type == "reward")
    assert [e.number for e in (one, two, three)] == decision_numbers(
        [first.decision_id, second.decision_id, third.decision_id])
    assert (one.arm_id, one.context) == (first.arm_id, (0.5, -1.0))
    assert one.eligible == ("arm0", "arm1", "arm3", "arm4", "arm5")  # arm2 retired
    assert two.eligible == ("arm1", "arm3", "arm4") and two.context == (1e-300, 3.0)
    assert three.eligible == ("arm1", "arm4")
    assert (one.rewards_seen, two.rewards_seen, three.rewards_seen) == (0, 0, 1)
    assert one.version == two.version == three.version
    # Uniform among the eligible arms not pulled yet: 5, then 3 (the first reward
    # comes later), then arm1 and arm4 less the first decision's arm.
    assert (one.propensity, two.propensity) == (first.propensity, second.propensity) == (
        1 / 5, 1 / 3)
    pulled = first.arm_id in ("arm1", "arm4")
    assert three.propensity == third.propensity == (1.0 if pulled else 1 / 2)
    assert reward.reward == 1.0 and reward.time >= one.time


@pytest.mark.parametrize(("policy", "threaded"), [("lints-ig", True), ("linreboot", False)])
async def test_a_propensity_that_takes_milliseconds_is_computed_off_the_event_loop(
    service: ExperimentService, monkeypatch: pytest.MonkeyPatch, policy: PolicyName,
    threaded: bool,
) -> None:
    """LinTS-IG's Student t integral (0.1 s at K = 100, d = 20) runs in a thread, as a
    shared model's estimate does; LinReBoot's microseconds stay on the loop. The value
    is the library's either way."""
    threads: list[str] = []
    to_thread = asyncio.to_thread

    async def recorded(function: Any, *args: Any) -> Any:
        threads.append(getattr(function, "__name__", "?"))
        return await to_thread(function, *args)

    monkeypatch.setattr(asyncio, "to_thread", recorded)
    await service.create(ExperimentSpec(id="t", setting="covariates", dim=2, policy=policy,
                                        arms=tuple(ArmSpec(f"a{i}") for i in range(4)), seed=1))
    for reward in (1.0, 0.0, 0.5, 2.0):
        decision = await service.choose("t", ChooseRequest(context=(0.5, -1.0)))
        await service.reward("t", [(decision.decision_id, reward)])
    threads.clear()
    decision = await service.choose("t", ChooseRequest(context=(0.3, 0.7)))

    assert threads == (["compute"] if threaded else [])
    member_id = shards.member("t", shards.shard_of(decision.decision_id, TEST_SHARDS))
    # (the view of the members' sums merged, sharded: what the decision was made from)
    view = await service.views.merged("t", service.views.held[member_id], member_id)
    ready = view.ready(ChooseRequest(context=(0.3, 0.7)), 1e6)[2]
    arm = [a.id for a in view.definition.arms].index(decision.arm_id)
    assert decision.propensity == float(propensities(ready, np.array([arm]),
                                                     accuracy=SERVICE)[0])


async def test_an_experiment_created_without_propensities_computes_returns_and_logs_none(
    api: Api, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """``"propensities": false`` (for the paper's baselines, whose propensity takes
    milliseconds): no propensity is computed; decisions, their idempotent repeats and
    the log carry none; the export has NaN pscores and evaluation refuses it, saying why."""
    from service.off_policy import evaluate
    from service.views import View

    async def never(*_args: object) -> float:
        raise AssertionError("a propensity was computed")

    monkeypatch.setattr(View, "propensity", never)
    key = await api.create({
        "id": "off", "setting": "stochastic", "dim": 2, "policy": "lints-g", "seed": 4,
        "propensities": False, "log_max_entries": 1000,
        "arms": [{"id": f"a{i}", "features": [np.cos(i), np.sin(i)]} for i in range(5)]})
    assert (await api.experiment("off"))["propensities"] is False
    for i in range(6):
        chosen = await api.choose(key, {"experiment_id": "off", "decision_id": f"d{i}"})
        again = await api.choose(key, {"experiment_id": "off", "decision_id": f"d{i}"})
        assert chosen.status_code == again.status_code == 200
        assert chosen.json()["propensity"] is None and again.json() == chosen.json()
        assert (await api.reward(key, {"experiment_id": "off", "decision_id": f"d{i}",
                                       "reward": float(i % 2)})).status_code == 200
    logged = (await api.http.get("/experiments/off/log", headers=ADMIN)).json()["entries"]
    decisions = [e for e in logged if e["type"] == "decision"]
    assert len(decisions) == 6 and all(e["propensity"] is None for e in decisions)

    npz = tmp_path / "off.npz"
    assert await export(api.http, "off", ADMIN_TOKEN, npz, "obp") == 6
    feedback = load_bandit_feedback(npz)
    assert np.isnan(feedback["pscore"]).all()
    with pytest.raises(ValueError, match="created with propensities false"):
        evaluate(feedback, None, {})


@pytest.mark.parametrize("propensities", [True, False])
async def test_the_stored_spec_names_propensities_only_when_they_are_off(
    service: ExperimentService, redis_db: str, propensities: bool
) -> None:
    """A worker of the version before reads an experiment created with the default (it
    would refuse an unknown key in the spec); an experiment without propensities says so."""
    await service.create(ExperimentSpec(id="s", setting="covariates", dim=2,
                                        arms=(ArmSpec("a"), ArmSpec("b")),
                                        propensities=propensities))
    client = redis.Redis.from_url(redis_db)
    try:
        stored = json.loads(client.hget(keys.meta("s"), "spec"))  # type: ignore[arg-type]
    finally:
        client.close()
    assert ("propensities" in stored) == (not propensities)
    assert (await service.get("s")).spec.propensities == propensities


async def test_log_all_contexts_logs_every_eligible_arms_context(
    service: ExperimentService,
) -> None:
    arms = tuple(ArmSpec(f"arm{i}") for i in range(4))
    await service.create(ExperimentSpec(id="all", setting="contextual", dim=2, arms=arms,
                                        seed=3, log_max_entries=100, log_all_contexts=True))
    await service.create(ExperimentSpec(id="chosen", setting="contextual", dim=2, arms=arms,
                                        seed=3, log_max_entries=100))
    given = {f"arm{i}": (float(i), -0.5 * i) for i in range(4)}
    request = ChooseRequest(arm_contexts={a: x for a, x in given.items() if a != "arm2"},
                            excluded=("arm2",))
    for experiment_id in ("all", "chosen"):
        decision = await service.choose(experiment_id, request)
        (entry,), _ = await service.read_log(experiment_id)
        assert entry.eligible == ("arm0", "arm1", "arm3")
        assert entry.context == given[decision.arm_id]
        assert entry.contexts == (tuple(given[a] for a in entry.eligible)
                                  if experiment_id == "all" else None)
    assert (await service.get("all")).spec.log_all_contexts  # kept with the spec


@pytest.mark.parametrize(("setting", "log_max_entries"), [
    ("covariates", 100), ("stochastic", 100), ("contextual", 0)])
async def test_log_all_contexts_is_refused_where_it_means_nothing(
    service: ExperimentService, setting: str, log_max_entries: int
) -> None:
    arms = tuple(ArmSpec(f"arm{i}", (1.0, float(i)) if setting == "stochastic" else None)
                 for i in range(3))
    with pytest.raises(InvalidInput, match="log_all_contexts needs the contextual setting"):
        await service.create(ExperimentSpec(
            id="nothing", setting=setting, dim=2, arms=arms,  # type: ignore[arg-type]
            log_max_entries=log_max_entries, log_all_contexts=True))
    assert await service.list() == ([], None)


@pytest.mark.parametrize(("setting", "policy"), [("covariates", "linreboot"),
                                                ("stochastic", "linphe")])
async def test_each_logged_propensity_is_the_policys_for_the_statistics_it_used(
    service: ExperimentService, setting: Setting, policy: PolicyName,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The propensity /choose returns and logs is ``policies.propensities`` of the decision's
    statistics (the outcomes applied before it, ``rewards_seen`` of them, replayed from the
    log; sharded, each member's replayed and merged), context and eligible arms, to the
    bit."""
    # Sharded: every decision reads the other members' sums anew (not only when they are
    # SYNC_SECONDS old), so that it sees exactly the rewards applied before it.
    monkeypatch.setattr(shards, "SYNC_SECONDS", 0.0)
    rng = np.random.default_rng(4)
    dim = 3
    features = rng.normal(size=(3, dim)) if setting == "stochastic" else None
    arms = tuple(ArmSpec(a, None if features is None else tuple(features[i]))
                 for i, a in enumerate(ARMS))
    await service.create(ExperimentSpec(
        id="p", setting=setting, dim=dim, arms=arms, policy=policy,
        hyperparameters={"epsilon": 0.05}, seed=5, log_max_entries=1000))
    returned = {}
    applied: list[str] = []
    applied_before: dict[str, list[str]] = {}
    for i in range(24):
        request = dataclasses.replace(request_for(setting, rng, dim),
                                      excluded=("b",) if i % 4 == 3 else ())
        decision = await service.choose("p", request)
        returned[decision.decision_id] = decision.propensity
        applied_before[decision.decision_id] = list(applied)
        if i % 3 != 2:
            await service.reward("p", [(decision.decision_id, float(rng.normal()))])
            applied.append(decision.decision_id)

    log = await whole_log(service, "p")
    config = PolicyConfig(**(await service.get("p")).config)  # type: ignore[arg-type]
    decisions = [e for e in log if e.type == "decision"]
    assert len(decisions) == 24 and len({e.propensity for e in decisions}) > 3
    for entry in decisions:
        assert entry.arm_id and entry.eligible
        before = applied_before[entry.decision_id]
        assert entry.rewards_seen == len(before)
        state = state_after(config, ARMS, log, TEST_SHARDS, set(before))
        take = [ARMS.index(a) for a in entry.eligible]
        state = {name: state[name][:, take] if spec.per_arm(config) else state[name]
                 for name, spec in layout(config).items()}
        contexts = (features[take] if features is not None
                    else np.tile(np.array(entry.context), (len(take), 1)))
        ready = prepare(config, state, contexts[None])
        chosen = np.array([entry.eligible.index(entry.arm_id)])
        expected = propensities(ready, chosen, accuracy=SERVICE)[0]
        assert entry.propensity == returned[entry.decision_id] == expected


@pytest.mark.parametrize(("indexes", "text"), [
    ([], ""), ([0], "0"), ([0, 1, 2], "0-2"), ([0, 2, 3, 4, 7, 9, 10], "0,2-4,7,9-10"),
    (list(range(100)), "0-99"),
])
def test_eligible_arms_are_written_as_index_ranges(indexes: list[int], text: str) -> None:
    assert index_ranges(indexes) == text
    assert parse_index_ranges(text) == indexes


async def test_the_log_pages_over_http(api: Api) -> None:
    key = await api.create({"id": "pages", "setting": "covariates", "dim": 2,
                            "arms": [{"id": a} for a in ARMS], "seed": 1})
    made = [await api.decide(key, {"experiment_id": "pages", "context": [0.5, float(i)]})
            for i in range(5)]
    entries: list[dict[str, Any]] = []
    after = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"after": after} if after else {})}
        response = await api.http.get("/experiments/pages/log", params=params, headers=ADMIN)
        assert response.status_code == 200, response.text
        page = response.json()
        assert len(page["entries"]) <= 2
        entries += page["entries"]
        after = page["next_after"]
        if after is None:
            break
    assert [e["decision_id"] for e in entries] == made
    assert [e["context"] for e in entries] == [[0.5, float(i)] for i in range(5)]
    assert all(e["eligible"] == ARMS and e["reward"] is None for e in entries)
    view = await api.experiment("pages")
    assert (view["log_max_entries"], view["log_max_age_seconds"]) == (
        Settings().default_log_max_entries, Settings().default_log_max_age_seconds)
    # After the last entry: an empty page.
    last = await api.http.get("/experiments/pages/log", params={"after": entries[-1]["entry_id"]},
                              headers=ADMIN)
    assert last.json() == {"entries": [], "next_after": None}


@pytest.mark.parametrize(("params", "status"), [
    ({"after": "abc"}, 422),
    ({"after": "1-2-3"}, 422),
    ({"after": "18446744073709551616-0"}, 422),  # 2**64: beyond a stream id
    ({"after": "99999999999999999999-0"}, 422),  # 20 digits, beyond it too
    ({"limit": 0}, 422),
    ({"limit": 1001}, 422),
])
async def test_bad_log_pages_are_refused(api: Api, params: dict[str, Any], status: int) -> None:
    await api.create({"id": "pages", "setting": "covariates", "dim": 2,
                      "arms": [{"id": a} for a in ARMS]})
    response = await api.http.get("/experiments/pages/log", params=params, headers=ADMIN)
    assert response.status_code == status, response.text
    assert response.json()["error"] == "invalid_input"


async def test_the_published_entry_id_pattern_is_what_the_route_takes(api: Api) -> None:
    """Issue 25: the OpenAPI pattern of ``after`` took 20-digit values above 2^64 - 1
    that the route then refused. Every id it matches is now answered with a page (the
    largest, after which nothing can come, with an empty one), every other with 422."""
    import re

    await api.create({"id": "pages", "setting": "covariates", "dim": 2,
                      "arms": [{"id": a} for a in ARMS]})
    schema = (await api.http.get("/openapi.json")).json()
    parameters = schema["paths"]["/experiments/{experiment_id}/log"]["get"]["parameters"]
    after = next(p for p in parameters if p["name"] == "after")["schema"]
    pattern = re.compile(next(s for s in after["anyOf"] if "pattern" in s)["pattern"])
    top = str(2**64 - 1)
    for ms, seq in ((top, top), (top, "0"), ("0" * 20, "7"), ("1" + "0" * 19, "1"),
                    (str(2**64), "0"), (top + "0", "0"), ("19" + "0" * 18, "0")):
        text = f"{ms}-{seq}"
        matched = bool(pattern.fullmatch(text))
        assert matched == (int(ms) < 2**64 and int(seq) < 2**64 and len(ms) <= 20), text
        response = await api.http.get("/experiments/pages/log", params={"after": text},
                                      headers=ADMIN)
        assert response.status_code == (200 if matched else 422), (text, response.text)
        if matched:
            assert response.json() == {"entries": [], "next_after": None}


async def test_the_log_of_a_missing_experiment_is_404_and_needs_the_admin_token(
    api: Api,
) -> None:
    missing = await api.http.get("/experiments/ghost/log", headers=ADMIN)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    key = await api.create({"id": "pages", "setting": "covariates", "dim": 2,
                            "arms": [{"id": a} for a in ARMS]})
    assert (await api.http.get("/experiments/pages/log")).status_code == 401
    assert (await api.http.get("/experiments/pages/log",
                               headers={"X-API-Key": key})).status_code == 401
    assert (await api.http.get("/experiments/pages/log",
                               headers={"Authorization": f"Bearer {key}"})).status_code == 403


async def test_an_experiment_without_a_log_writes_none(api: Api, redis_db: str) -> None:
    key = await api.create({"id": "quiet", "setting": "covariates", "dim": 2,
                            "arms": [{"id": a} for a in ARMS], "log_max_entries": 0})
    decision = await api.decide(key, {"experiment_id": "quiet", "context": [0.5, 1.0]})
    await api.reward(key, {"experiment_id": "quiet", "decision_id": decision, "reward": 1.0})
    response = await api.http.get("/experiments/quiet/log", headers=ADMIN)
    assert response.json() == {"entries": [], "next_after": None}
    client = redis.Redis.from_url(redis_db)
    try:
        assert not client.exists(keys.log("quiet"))
    finally:
        client.close()


# -- export -------------------------------------------------------------------


async def _ledgered_experiment(api: Api, service: ExperimentService
                               ) -> tuple[list[str], dict[str, float]]:
    """A stochastic experiment with rewards, defaults and a late reward: its decisions, in
    the order made, and the applied rewards."""
    key = await api.create({
        "id": "exp", "setting": "stochastic", "dim": 2, "seed": 9,
        "arms": [{"id": "a", "features": [1.0, 0.0]}, {"id": "b", "features": [0.3, 1.0]},
                 {"id": "c", "features": [-0.5, 0.25]}],
        # 3 s: the rewards below must land within the window on a loaded machine too.
        "reward_window_seconds": 3, "default_reward": 0.0})
    rng = np.random.default_rng(8)
    made = [await api.decide(key, {"experiment_id": "exp"}) for _ in range(10)]
    applied = {}
    for decision_id in made[6:] + made[:3]:  # out of order; three left to their default
        value = float(rng.normal())
        await api.reward(key, {"experiment_id": "exp", "decision_id": decision_id,
                               "reward": value})
        applied[decision_id] = value
    await asyncio.sleep(3.1)
    assert await service.sweep() == 3
    late = await api.reward(key, {"experiment_id": "exp", "decision_id": made[4],
                                  "reward": 5.0})
    assert late.json()["status"] == "late"
    made.append(await api.decide(key, {"experiment_id": "exp"}))  # no outcome yet
    return made, applied


async def test_export_round_trip(
    api: Api, service: ExperimentService, redis_db: str, tmp_path: Path
) -> None:
    made, applied = await _ledgered_experiment(api, service)

    jsonl, npz = tmp_path / "exp.jsonl", tmp_path / "exp.npz"
    assert await export(api.http, "exp", ADMIN_TOKEN, jsonl, "jsonl") == 11
    assert await export(api.http, "exp", ADMIN_TOKEN, npz, "obp") == 10

    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    view = await api.experiment("exp")
    features = np.array([a["features"] for a in view["arms"]])
    numbers = dict(zip(made, decision_numbers(made), strict=True))
    by_id = {r["decision_id"]: r for r in records}
    assert len(records) == 11 and {i: r["number"] for i, r in by_id.items()} == numbers
    assert_each_members_order([r["decision_id"] for r in records], made, TEST_SHARDS)
    for r in records:
        assert r["context"] == features[r["arm_index"]].tolist()
        assert view["arms"][r["arm_index"]]["id"] == r["arm_id"]
    outcomes = {r["decision_id"]: r["outcome"] for r in records}
    assert {i: o["reward"] for i, o in outcomes.items() if o and o["type"] == "reward"} == applied
    assert sum(o is not None and o["type"] == "default" for o in outcomes.values()) == 3
    assert outcomes[made[-1]] is None
    assert [r["late_rewards"] for r in records if r["late_rewards"]] == [
        [{"reward": 5.0, "time": by_id[made[4]]["late_rewards"][0]["time"]}]]

    # Replayed from the JSON lines alone, in the order the outcomes were applied (each
    # member's own, sharded).
    rounds = in_application_order(records)
    config = PolicyConfig(**view["config"])
    for shard, member_id in enumerate(shards.members("exp", TEST_SHARDS)):
        observations = [
            Observation(r["arm_index"], np.array(r["context"]), r["outcome"]["reward"])
            for r in rounds if shards.shard_of(r["decision_id"], TEST_SHARDS) == shard]
        assert_stats_equal(config, ["a", "b", "c"], stored_stats(redis_db, member_id),
                           expected_state(config, 3, observations))

    # Open Bandit Pipeline's bandit feedback: the same rounds.
    feedback = load_bandit_feedback(npz)
    assert (feedback["n_rounds"], feedback["n_actions"]) == (10, 3)
    assert feedback["action"].tolist() == [r["arm_index"] for r in rounds]
    assert feedback["reward"].tolist() == [r["outcome"]["reward"] for r in rounds]
    assert feedback["context"].tolist() == [r["context"] for r in rounds]
    assert feedback["action_context"].tolist() == features.tolist()
    assert feedback["position"].tolist() == [0] * 10
    assert sorted(feedback["slate_id"].tolist()) == list(range(10))  # each its own slate
    assert "position_weights" not in feedback
    assert feedback["defaulted"].tolist() == [r["outcome"]["type"] == "default" for r in rounds]
    assert feedback["decision_number"].tolist() == [r["number"] for r in rounds]
    assert feedback["pscore"].tolist() == [r["propensity"] for r in rounds]
    assert all(0.0 < r["propensity"] <= 1.0 for r in rounds)


def test_the_export_command_writes_both_formats(redis_db: str, tmp_path: Path) -> None:
    """``linreboot export`` as the README runs it, against a real server."""
    env = {"LINREBOOT_REDIS_URL": redis_db, "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN,
           "LINREBOOT_LOG_LEVEL": "warning"}
    with server_process(env) as url:
        created = httpx.post(f"{url}/experiments", headers=ADMIN, json={
            "id": "cli", "setting": "covariates", "dim": 2, "arms": [{"id": a} for a in ARMS]})
        api_key = {"X-API-Key": created.json()["api_key"]}
        for i in range(3):
            chosen = httpx.post(f"{url}/choose", headers=api_key,
                                json={"experiment_id": "cli", "context": [1.0, float(i)]})
            httpx.post(f"{url}/reward", headers=api_key, json={
                "experiment_id": "cli", "decision_id": chosen.json()["decision_id"],
                "reward": 0.5 * i})
        for fmt, name, says in (("jsonl", "cli.jsonl", "3 decisions"),
                                ("obp", "cli.npz", "3 rounds")):
            done = subprocess.run(
                [sys.executable, "-m", "linreboot", "export", "--url", url, "--experiment",
                 "cli", "--out", str(tmp_path / name), "--format", fmt],
                env={"LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN, "PATH": ""}, capture_output=True,
                text=True, timeout=60, check=False)
            assert done.returncode == 0, done.stderr
            assert says in done.stdout
        wrong = subprocess.run(
            [sys.executable, "-m", "linreboot", "export", "--url", url, "--experiment", "cli",
             "--out", str(tmp_path / "x.jsonl"), "--admin-token", "wrong"],
            capture_output=True, text=True, timeout=60, check=False)
    assert wrong.returncode == 1 and "403" in wrong.stderr and "Traceback" not in wrong.stderr
    lines = (tmp_path / "cli.jsonl").read_text().splitlines()
    assert [json.loads(line)["outcome"]["reward"] for line in lines] == [0.0, 0.5, 1.0]
    assert load_bandit_feedback(tmp_path / "cli.npz")["reward"].tolist() == [0.0, 0.5, 1.0]


# -- bounds -------------------------------------------------------------------


def _log_times(url: str, experiment_id: str) -> list[int]:
    client = redis.Redis.from_url(url)
    try:
        entries: list[Any] = client.xrange(keys.log(experiment_id))  # type: ignore[assignment]
        return [int(entry_id.split(b"-")[0]) for entry_id, _ in entries]
    finally:
        client.close()


def _node_entries(url: str) -> int:
    """Redis's bound on the entries of one stream node: '~' trims whole nodes."""
    client = redis.Redis.from_url(url)
    try:
        config: dict[str, str] = client.config_get("stream-node-max-entries")  # type: ignore[assignment]
        return int(config["stream-node-max-entries"])
    finally:
        client.close()


async def test_the_log_keeps_at_most_about_its_length(
    service: ExperimentService, redis_db: str
) -> None:
    """Each member (the experiment itself, unsharded) keeps its share of the length: its
    latest entries, and at most one stream node more."""
    await service.create(ExperimentSpec(
        id="long", setting="covariates", dim=2, arms=tuple(ArmSpec(a) for a in ARMS),
        log_max_entries=150))
    made = [(await service.choose("long", ChooseRequest(context=(0.5, float(i))))).decision_id
            for i in range(400)]
    share = shards.log_share(150, TEST_SHARDS)
    kept = [_log_times(redis_db, m) for m in shards.members("long", TEST_SHARDS)]
    assert all(share <= len(k) <= share + _node_entries(redis_db) for k in kept), kept
    log, _ = await service.read_log("long", limit=1000)
    assert len(log) == sum(map(len, kept))
    for shard, mine in enumerate(member_logs(log, TEST_SHARDS)):
        theirs = [d for d in made if shards.shard_of(d, TEST_SHARDS) == shard]
        assert [e.decision_id for e in mine] == theirs[-len(mine):]


# The log's age in the test below: its last 64 decisions of each member must all be
# younger than it when the member's last trim runs, which took over 1 s on a loaded
# host (3 members x 64 covariates decisions).
AGE = 3


async def test_the_log_drops_entries_older_than_its_age(
    service: ExperimentService, redis_db: str
) -> None:
    await service.create(ExperimentSpec(
        id="old", setting="covariates", dim=2, arms=tuple(ArmSpec(a) for a in ARMS),
        log_max_entries=100_000, log_max_age_seconds=AGE))
    members = shards.members("old", TEST_SHARDS)

    async def decide(n: int, pause: float = 0.0) -> list[int]:
        """``n`` decisions: how many each member made."""
        made = [0] * len(members)
        for i in range(n):
            decision = await service.choose("old", ChooseRequest(context=(0.5, float(i))))
            made[shards.shard_of(decision.decision_id, len(members))] += 1
            await asyncio.sleep(pause)
        return made

    await decide(300)
    # the newest of the first 300 (ms)
    boundary = max(_log_times(redis_db, m)[-1] for m in members)
    await decide(30, pause=0.11)  # 3.3 s on: the first 300 are older than the age
    # Every 64th decision of a member drops its entries older than the age.
    newer = [0] * len(members)
    while min(newer) < 64:
        newer = [a + b for a, b in zip(newer, await decide(16), strict=True)]

    client = redis.Redis.from_url(redis_db)
    try:
        for member_id in members:
            times = _log_times(redis_db, member_id)
            old = [t for t in times if t <= boundary]
            assert len(old) <= _node_entries(redis_db)  # whole nodes go: at most one is left
            assert len(times) - len(old) >= 64
            ttl: int = client.ttl(keys.log(member_id))  # type: ignore[assignment]
            assert 0 < ttl <= AGE
    finally:
        client.close()
    await asyncio.sleep(AGE + 0.1)
    # idle for its age: the whole log is gone
    assert all(_log_times(redis_db, m) == [] for m in members)


# -- off-policy evaluation of an export ---------------------------------------


async def _evaluable_export(
    api: Api, tmp_path: Path, setting: str, log_all_contexts: bool = False
) -> Path:
    """120 decisions of an experiment with epsilon 0.3, rewarded by arm; its obp export.
    (The decisions' ids are named, so that a sharded run routes them, and so numbers
    and draws them, alike every time: a seeded log.)"""
    arms = [{"id": a, **({"features": [1.0, float(i)]} if setting == "stochastic" else {})}
            for i, a in enumerate(ARMS)]
    experiment_id = f"{setting}-all" if log_all_contexts else setting
    key = await api.create({"id": experiment_id, "setting": setting, "dim": 2, "seed": 3,
                            "arms": arms, "hyperparameters": {"epsilon": 0.3},
                            **({"log_all_contexts": True} if log_all_contexts else {})})
    rng = np.random.default_rng(5)
    for t in range(120):
        body: dict[str, Any] = {"experiment_id": experiment_id,
                                "decision_id": f"{experiment_id}-{t}"}
        if setting == "covariates":  # a constant first feature: the arm's mean is learnable
            body["context"] = [1.0, float(rng.normal())]
        if setting == "contextual":  # the second feature names the arm, blurred
            body["arm_contexts"] = {a: [1.0, i + float(rng.normal(scale=0.3))]
                                    for i, a in enumerate(ARMS)}
        decision = (await api.choose(key, body)).json()
        reward = ARMS.index(decision["arm_id"]) * 0.5 + float(rng.normal(scale=0.1))
        await api.reward(key, {"experiment_id": experiment_id,
                               "decision_id": decision["decision_id"], "reward": reward})
    out = tmp_path / f"{experiment_id}.npz"
    assert await export(api.http, experiment_id, ADMIN_TOKEN, out, "obp") == 120
    return out


def _evaluate_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "linreboot", "evaluate", *args],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("setting", ["covariates", "stochastic", "contextual"])
async def test_evaluate_estimates_a_target_from_an_export(
    api: Api, tmp_path: Path, setting: str
) -> None:
    """``linreboot evaluate`` as the docs run it: a table, or JSON; the best arm's value.

    Arm c pays 1.0, b 0.5, a 0.0 (noise 0.1). Greedy fitted on 60 rounds of a
    log that tried every arm picks c: the estimates are near 1.0, and the
    logging policy, which explores, earned less. A contextual experiment
    logs every arm's context for it (``log_all_contexts``).
    """
    npz = await _evaluable_export(api, tmp_path, setting, setting == "contextual")
    table = _evaluate_cli("--log", str(npz), "--policy", "greedy")
    assert table.returncode == 0, table.stderr
    assert "| DR |" in table.stdout and "fitted on the first 60 rounds" in table.stdout
    done = _evaluate_cli("--log", str(npz), "--policy", "greedy", "--json")
    report = json.loads(done.stdout)
    assert report["rounds"] == 60 and report["train_rounds"] == 60
    for name in ("ips", "snips", "dr"):
        estimate = report[name]
        assert estimate["low"] <= estimate["value"] <= estimate["high"]
        assert estimate["low"] <= 1.0 <= estimate["high"] or abs(estimate["value"] - 1) < 0.1
    assert report["logged"]["value"] < report["dr"]["value"]


async def test_evaluate_refuses_what_it_cannot_evaluate(api: Api, tmp_path: Path) -> None:
    """One line saying what is wrong, exit 1, no traceback."""
    covariates = await _evaluable_export(api, tmp_path, "covariates")
    contextual = await _evaluable_export(api, tmp_path, "contextual")
    old = tmp_path / "old.npz"
    jsonl = tmp_path / "home.jsonl"  # the other export, given by mistake (issue 29)
    jsonl.write_text('{"decision_id": "d", "arm_id": "a"}\n')
    feedback = load_bandit_feedback(covariates)
    np.savez(old, **{k: v for k, v in feedback.items() if k not in ("setting", "config")})
    for args, says in (
        (["--log", str(contextual)], "only the chosen arm's context"),
        (["--log", str(old)], "export it again"),
        (["--log", str(tmp_path / "missing.npz")], "cannot read"),
        (["--log", str(jsonl)], "not an obp export (.npz)"),
        (["--log", str(covariates), "--policy", "linucb", "--set", "ucb_alpha=1"],
         "linucb takes only these hyperparameters"),
        (["--log", str(covariates), "--set", "sigma_omega=x"], "sigma_omega must be a number"),
        (["--log", str(covariates), "--set", "spread=wide"],
         "spread must be one of paper, pooled"),
        (["--log", str(covariates), "--set", "first_pass=true"], "takes no first pass"),
        (["--log", str(covariates), "--set", "sigma=1"],
         "linreboot takes only these hyperparameters: reg, sigma_omega"),
        (["--log", str(covariates), "--train-fraction", "1"], "--train-fraction"),
    ):
        done = _evaluate_cli(*args)
        assert done.returncode == 1, (args, done.stdout)
        assert says in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1


def _help_examples() -> list[list[str]]:
    """Every ``linreboot ...`` line of every subcommand's ``--help``, as argument lists."""
    from linreboot.cli import build_parser

    parser = build_parser()
    subcommands = next(a for a in parser._actions if a.choices and a.dest == "command")
    found = []
    for name, sub in subcommands.choices.items():  # type: ignore[union-attr]
        for line in sub.format_help().splitlines():
            words = line.split()
            if words[:2] == ["linreboot", name]:
                found.append(words[1:])
    return found


async def test_every_help_example_runs_as_written(api: Api, tmp_path: Path) -> None:
    """Issue 24: the examples a --help prints run, home.npz being an exported log."""
    examples = _help_examples()
    assert any("spread=pooled" in e for e in examples)  # the one evaluate --help prescribed
    npz = await _evaluable_export(api, tmp_path, "covariates")
    for words in examples:
        assert words[0] == "evaluate", words  # the only subcommand with examples so far
        done = _evaluate_cli(*[str(npz) if w == "home.npz" else w for w in words[1:]])
        assert done.returncode == 0, (words, done.stderr)
        assert "DR" in done.stdout or '"dr"' in done.stdout


async def test_a_page_is_bounded_by_bytes_and_says_where_to_go_on(redis_db: str) -> None:
    """Issue 25: with every arm's context logged, a page of 1,000 entries was 85 MB.
    A page stops at about LINREBOOT_LOG_PAGE_MAX_BYTES of JSON (at least one entry), its
    next_after goes on, and the pages together are the whole log; Redis is read a few
    entries at a time, not 1,000."""
    n_arms, dim, decisions = 120, 16, 24
    entry_bytes = n_arms * dim * 8 * 3  # an entry's contexts as JSON, about
    settings = Settings(redis_url=redis_db, admin_token=SecretStr(ADMIN_TOKEN),
                        sweep_interval_seconds=60, log_page_max_bytes=3 * entry_bytes)
    service = await ExperimentService.open(settings)
    monitor = redis.Redis.from_url(redis_db)
    try:
        arms = tuple(ArmSpec(f"arm{i}") for i in range(n_arms))
        await service.create(ExperimentSpec(id="wide", setting="contextual", dim=dim, arms=arms,
                                            log_max_entries=1000, log_all_contexts=True))
        rng = np.random.default_rng(8)
        for _ in range(decisions):
            contexts = {a.id: tuple(rng.normal(size=dim).tolist()) for a in arms}
            await service.choose("wide", ChooseRequest(arm_contexts=contexts))
        monitor.config_resetstat()
        pages = await log_pages(service, "wide", 1000)
        stats: dict[str, Any] = monitor.info("commandstats")  # type: ignore[assignment]
        calls = int(stats["cmdstat_xrange"]["calls"])
    finally:
        monitor.close()
        await service.close()
    sizes = [len(p) for p in pages]
    assert sum(sizes) == decisions and all(1 <= s <= 3 for s in sizes), sizes
    ids = [e.decision_id for p in pages for e in p]
    assert len(set(ids)) == decisions  # the pages, in order, are the whole log once
    # The first read of a page takes 16 entries at most, the next are sized by them (on
    # each member, sharded).
    assert calls <= TEST_SHARDS * (2 * len(pages) + 1), (calls, len(pages))


async def test_a_page_smaller_than_its_limit_still_ends_the_log(service: ExperimentService
                                                                 ) -> None:
    await service.create(ExperimentSpec(id="short", setting="covariates", dim=2,
                                        arms=(ArmSpec("a"), ArmSpec("b")),
                                        log_max_entries=100))
    for _ in range(3):
        await service.choose("short", ChooseRequest(context=(0.5, 1.0)))
    page, after = await service.read_log("short", None, limit=10)
    assert len(page) == 3 and after is None
    page, after = await service.read_log("short", None, limit=3)
    assert len(page) == 3 and after is not None  # the limit reached: maybe more
    if TEST_SHARDS == 1:  # (sharded, each member's position)
        assert after == page[-1].entry_id
    assert await service.read_log("short", after, limit=3) == ([], None)


async def test_a_page_counts_the_eligible_arms_ids_it_writes(redis_db: str) -> None:
    """The eligible arms are stored as index ranges ("0-299") but written as their ids:
    with many long ids they are most of an entry's JSON, and a page's size must count
    them (a review measured 478 estimated bytes against 67,296 written)."""
    from app.schemas import LogEntryOut, LogPageOut

    n_arms, decisions = 300, 30
    id_of = [f"{i:03d}-" + "x" * 56 for i in range(n_arms)]  # 60 characters each
    entry_bytes = n_arms * (60 + 3)
    limit_bytes = 3 * entry_bytes
    settings = Settings(redis_url=redis_db, admin_token=SecretStr(ADMIN_TOKEN),
                        sweep_interval_seconds=60, log_page_max_bytes=limit_bytes)
    service = await ExperimentService.open(settings)
    try:
        await service.create(ExperimentSpec(id="ids", setting="covariates", dim=2,
                                            arms=tuple(ArmSpec(i) for i in id_of),
                                            log_max_entries=1000))
        for _ in range(decisions):
            await service.choose("ids", ChooseRequest(context=(0.5, 1.0)))
        pages = await log_pages(service, "ids", 1000)
    finally:
        await service.close()
    assert sum(len(p) for p in pages) == decisions and len(pages) >= decisions // 4
    for page in pages:
        written = len(LogPageOut(entries=[LogEntryOut.from_domain(e) for e in page],
                                 next_after=None).model_dump_json())
        assert written <= 1.5 * limit_bytes or len(page) == 1, (written, len(page))


def test_ranges_are_counted_as_they_are_listed() -> None:
    from service.definition import ranges_count as _ranges_count

    rng = random.Random(4)
    for _ in range(500):
        chosen = sorted(rng.sample(range(2000), rng.randint(0, 300)))
        text = index_ranges(chosen)
        assert _ranges_count(text) == len(chosen) == len(parse_index_ranges(text))
