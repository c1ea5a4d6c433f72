"""Rankings (issue 28): ``/rank`` orders k distinct arms from one draw of the policy's
index, records each slot as a decision of its own (all or none, one decision number)
and takes each slot's reward exactly once; a ranking of one is ``/choose``'s decision."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from typing import Any

import numpy as np
import pytest
import redis
from scipy import stats

from linreboot.export import fetch
from policies import PolicyName
from service import decision_log, keys, shards
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec, RankedDecision
from service.errors import Conflict, InvalidInput
from service.experiments import ExperimentService
from service.off_policy import bandit_feedback, evaluate, in_application_order, join
from service.settings import Settings
from tests import records
from tests.conftest import ADMIN, ADMIN_TOKEN, TEST_SHARDS, Api

pytestmark = pytest.mark.anyio

ARMS = tuple(ArmSpec(f"arm-{i}") for i in range(5))
SERVICE_ERROR = 1e-3  # policies.propensity.SERVICE's bound on a propensity's error
_TAIL = 6.3e-5  # two-sided, as 4 standard errors of a normal: 2 Phi(-4); see its use
COVARIATES = ExperimentSpec(id="shelf", setting="covariates", dim=2, arms=ARMS, seed=11,
                            log_max_entries=10_000)


def _context(rng: np.random.Generator) -> ChooseRequest:
    return ChooseRequest(context=tuple(float(v) for v in rng.normal(size=2)))


async def test_a_ranking_of_one_is_the_decision_of_choose(service: ExperimentService) -> None:
    """Two experiments alike, one asked /choose, the other /rank with k = 1, rewarded
    alike: the same arm, score, propensity and number at every step, for a randomised
    and an optimistic policy, while exploring and after."""
    for policy in ("linreboot", "lints-g", "linucb"):
        chosen = dataclasses.replace(COVARIATES, id=f"c-{policy}", policy=policy)
        ranked = dataclasses.replace(chosen, id=f"r-{policy}")
        await service.create(chosen)
        await service.create(ranked)
        rng = np.random.default_rng(5)
        for step in range(40):
            # (the same id routes both to the same member when the tests run sharded)
            request = dataclasses.replace(_context(rng), decision_id=f"step-{step}")
            one = await service.choose(chosen.id, request)
            ranking = await service.rank(ranked.id, dataclasses.replace(request, slots=1))
            (slot,) = ranking.slots
            assert (slot.arm_id, slot.index, slot.propensity, slot.decision_number) == (
                one.arm_id, one.index, one.propensity, one.decision_number), (policy, step)
            assert slot.decision_id == keys.slot_id(ranking.decision_id, 1)
            reward = float(rng.normal())
            await service.reward(chosen.id, [(one.decision_id, reward)])
            (outcome,) = await service.reward(ranked.id, [(slot.decision_id, reward)])
            assert outcome.status == "applied", outcome


async def _trained(service: ExperimentService, spec: ExperimentSpec, rounds: int = 30) -> None:
    """The experiment created, and every arm past its first pull."""
    await service.create(spec)
    rng = np.random.default_rng(3)
    for _ in range(rounds):
        request = ChooseRequest() if spec.setting == "stochastic" else _context(rng)
        decision = await service.choose(spec.id, request)
        await service.reward(spec.id, [(decision.decision_id, float(rng.normal()))])


async def test_k_distinct_eligible_arms_each_slot_a_decision_of_its_own(
    service: ExperimentService, redis_db: str
) -> None:
    await _trained(service, COVARIATES)
    before = (await service.get("shelf")).decisions
    ranking = await service.rank("shelf", ChooseRequest(context=(0.5, -0.5), slots=3,
                                                         excluded=("arm-1",)))
    arms = [slot.arm_id for slot in ranking.slots]
    assert len(set(arms)) == 3 and "arm-1" not in arms
    assert [s.decision_id for s in ranking.slots] == [
        keys.slot_id(ranking.decision_id, j) for j in (1, 2, 3)]
    assert {s.decision_number for s in ranking.slots} == {ranking.decision_number}
    assert all(s.propensity is not None and 0.0 < s.propensity <= 1.0 for s in ranking.slots)
    # ordered by the one draw's index (no arm left to explore)
    scores = [s.index for s in ranking.slots]
    assert all(score is not None for score in scores)
    assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    assert (await service.get("shelf")).decisions == before + 3  # each slot counts
    member = shards.member("shelf", shards.shard_of(ranking.decision_id, TEST_SHARDS))
    client = redis.Redis.from_url(redis_db)
    try:
        pending: list[bytes] = client.lrange(keys.pending(member), 0, -1)  # type: ignore[assignment]
        listed = [e.split()[1].decode() for e in pending]
        assert listed[-3:] == [s.decision_id for s in ranking.slots]
    finally:
        client.close()
    log, _ = await service.read_log("shelf", limit=10_000)
    entries = [e for e in log if e.decision_id.startswith(ranking.decision_id)]
    assert [(e.decision_id, e.arm_id, e.position, e.propensity, e.number) for e in entries] == [
        (s.decision_id, s.arm_id, j, s.propensity, ranking.decision_number)
        for j, s in enumerate(ranking.slots, 1)]
    assert all(e.context == (0.5, -0.5) and "arm-1" not in (e.eligible or ()) for e in entries)


async def test_rankings_that_arrive_together_compute_one_placement_table(
    service: ExperimentService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second ranking from a view's statistics computes every arm's placements (a
    table) in a thread; the rankings that arrive while it does wait for that table
    rather than each compute their own (25 did, BENCHMARKS.md §32), and take their
    propensities from it."""
    from service import views

    features = np.random.default_rng(2).normal(size=(6, 2))
    spec = ExperimentSpec(id="aisle", setting="stochastic", dim=2,  # kept from one to the next
                          arms=tuple(ArmSpec(f"arm-{i}", tuple(f)) for i, f in enumerate(features)))
    await _trained(service, spec)
    tables: list[Any] = []  # what each table was computed from
    real = views.placement_table

    def counted(ready: Any, *args: Any, **kwargs: Any) -> Any:
        tables.append(ready)
        return real(ready, *args, **kwargs)

    monkeypatch.setattr(views, "placement_table", counted)
    request = ChooseRequest(slots=3)
    await service.rank("aisle", request)  # the first: its own placements
    together = await asyncio.gather(*(service.rank("aisle", request) for _ in range(8)))
    assert len(tables) == 1
    by_placement = {(slot.arm_id, j): slot.propensity
                    for ranking in together for j, slot in enumerate(ranking.slots)}
    table = real(tables[0], 3, accuracy=views.SERVICE)
    assert table is not None
    arm_ids = [a.id for a in spec.arms]
    for (arm_id, j), propensity in by_placement.items():
        if j:  # (the first slot's is the decision's own: policies.propensity)
            assert propensity == table[0, arm_ids.index(arm_id), j]


async def test_a_failed_placement_table_is_computed_again_and_rankings_of_one_need_none(
    service: ExperimentService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table whose computation failed is not kept: that ranking fails, the next computes
    the table again. A ranking of one (its slot /choose's) computes no table."""
    from service import views

    features = np.random.default_rng(4).normal(size=(5, 2))
    spec = ExperimentSpec(id="bay", setting="stochastic", dim=2,
                          arms=tuple(ArmSpec(f"arm-{i}", tuple(f)) for i, f in enumerate(features)))
    await _trained(service, spec)
    real = views.placement_table
    asked: list[int] = []

    def failing_once(ready: Any, k: int, **kwargs: Any) -> Any:
        asked.append(k)
        if len(asked) == 1:
            raise RuntimeError("the first table fails")
        return real(ready, k, **kwargs)

    monkeypatch.setattr(views, "placement_table", failing_once)
    for _ in range(3):
        await service.rank("bay", ChooseRequest(slots=1))
    assert asked == []
    # (after those, a ranking of 3 is not the first from these statistics: the table)
    with pytest.raises(RuntimeError, match="the first table fails"):
        await service.rank("bay", ChooseRequest(slots=3))
    ranking = await service.rank("bay", ChooseRequest(slots=3))
    assert asked == [3, 3]
    assert all(slot.propensity is not None and 0 < slot.propensity <= 1
               for slot in ranking.slots)


async def test_each_slot_is_rewarded_exactly_once(service: ExperimentService) -> None:
    await _trained(service, COVARIATES)
    ranking = await service.rank("shelf", ChooseRequest(context=(0.1, 0.2), slots=3))
    first, second, third = (s.decision_id for s in ranking.slots)
    before = await service.get("shelf")
    outcomes = await service.reward("shelf", [(second, 1.0), (first, 0.0), (second, 1.0)])
    assert [o.status for o in outcomes] == ["applied", "applied", "duplicate"]
    outcomes = await service.reward("shelf", [
        (second, 0.5), (first, 0.0), (keys.slot_id(ranking.decision_id, 4), 1.0),
        (ranking.decision_id, 1.0)])
    assert [o.status for o in outcomes] == ["conflict", "duplicate", "not_found", "not_found"]
    after = await service.get("shelf")
    assert after.rewards == before.rewards + 2
    pulls = {arm.id: arm.pulls for arm in after.arms}
    earlier = {arm.id: arm.pulls for arm in before.arms}
    for slot in ranking.slots[:2]:  # the arms at the rewarded slots, one pull each
        assert pulls[slot.arm_id] == earlier[slot.arm_id] + 1
    assert pulls[ranking.slots[2].arm_id] == earlier[ranking.slots[2].arm_id]
    assert [o.status for o in await service.reward("shelf", [(third, 2.0)])] == ["applied"]


async def test_unrewarded_slots_get_the_default_reward(service: ExperimentService) -> None:
    spec = dataclasses.replace(COVARIATES, reward_window_seconds=1, default_reward=0.0)
    await _trained(service, spec, rounds=8)
    ranking = await service.rank("shelf", ChooseRequest(context=(0.1, 0.2), slots=3))
    await service.reward("shelf", [(ranking.slots[1].decision_id, 1.0)])
    await asyncio.sleep(1.3)
    assert await service.sweep() == 2
    log, _ = await service.read_log("shelf", limit=10_000)
    outcomes = {e.decision_id: e.type for e in log
                if e.type != "decision" and e.decision_id.startswith(ranking.decision_id)}
    slots = [s.decision_id for s in ranking.slots]
    assert outcomes == {slots[0]: "default", slots[1]: "reward", slots[2]: "default"}
    late = await service.reward("shelf", [(slots[2], 1.0)])
    assert late[0].status == "late"


async def test_a_repeated_ranking_reports_each_slots_window(
    service: ExperimentService,
) -> None:
    """A ranking asked again under the caller's id answers, per slot, how long its reward
    may still come in: 0 for a slot rewarded since, the window for the others (and the
    ranking the longest of them), not its first slot's for every slot."""
    await _trained(service, COVARIATES)
    request = ChooseRequest(context=(0.2, 0.1), slots=3, decision_id="page-10")
    first = await service.rank("shelf", request)
    await service.reward("shelf", [(first.slots[0].decision_id, 1.0)])

    again = await service.rank("shelf", request)

    assert isinstance(again, RankedDecision)
    assert again.slots[0].expires_in_seconds == 0
    assert all(0 < s.expires_in_seconds <= first.expires_in_seconds for s in again.slots[1:])
    assert again.expires_in_seconds == max(s.expires_in_seconds for s in again.slots)


async def test_a_ranking_under_the_callers_id_is_idempotent(
    service: ExperimentService, other_service: ExperimentService
) -> None:
    await _trained(service, COVARIATES)
    request = ChooseRequest(context=(0.3, 0.4), slots=3, decision_id="page-9")
    first = await service.rank("shelf", request)
    decided = (await service.get("shelf")).decisions
    other = await service.choose("shelf", ChooseRequest(context=(1.0, 1.0)))
    await service.reward("shelf", [(other.decision_id, 1.0)])
    again = [await w.rank("shelf", request) for w in (other_service, service)]
    for ranking in again:
        assert isinstance(ranking, RankedDecision)
        assert [dataclasses.replace(s, expires_in_seconds=0) for s in ranking.slots] == [
            dataclasses.replace(s, expires_in_seconds=0) for s in first.slots]
        assert ranking.decision_number == first.decision_number
    assert (await service.get("shelf")).decisions == decided + 1  # the one /choose
    with pytest.raises(Conflict):  # another k, or /choose, under the same id
        await service.rank("shelf", dataclasses.replace(request, slots=2))
    with pytest.raises(Conflict):
        await service.choose("shelf", dataclasses.replace(request, slots=None))


async def test_more_slots_than_eligible_arms_is_refused_and_records_nothing(
    service: ExperimentService,
) -> None:
    await _trained(service, COVARIATES, rounds=6)
    before = (await service.get("shelf")).decisions
    with pytest.raises(InvalidInput, match="more than the 2 eligible arms"):
        await service.rank("shelf", ChooseRequest(context=(0.1, 0.2), slots=3,
                                                  eligible=("arm-0", "arm-2")))
    assert (await service.get("shelf")).decisions == before


@pytest.mark.parametrize(("policy", "setting"), [
    ("linreboot", "covariates"), ("lints-g", "covariates"), ("linreboot", "stochastic")])
async def test_slot_propensities_are_the_frequencies_of_the_placements(
    service: ExperimentService, policy: PolicyName, setting: str
) -> None:
    """With the statistics fixed (no reward in between), ranking again and again: the
    share of rankings that put an arm at a position is the propensity every slot that
    put it there reported (an integral for LinReBoot, rankings drawn again for LinTS-G),
    within 4 standard errors of the share and the estimate's own error. With fixed
    features (stochastic) the worker keeps what it prepared, and from the second
    ranking on every slot's propensity is its table's (View.slot_propensities), the
    same to the bit."""
    spec = dataclasses.replace(COVARIATES, policy=policy, seed=None)
    request = ChooseRequest(context=(0.4, 0.1), slots=3)
    if setting == "stochastic":
        features = np.random.default_rng(8).normal(size=(len(ARMS), 2))
        spec = dataclasses.replace(spec, setting="stochastic", arms=tuple(
            ArmSpec(a.id, tuple(float(v) for v in f)) for a, f in zip(ARMS, features,
                                                                      strict=True)))
        request = ChooseRequest(slots=3)
    await _trained(service, spec, rounds=40)
    rankings = [await service.rank("shelf", request) for _ in range(600)]
    seen: Counter[tuple[str, int]] = Counter()
    reported: dict[tuple[str, int], set[float]] = {}
    for ranking in rankings:
        for j, slot in enumerate(ranking.slots, 1):
            seen[slot.arm_id, j] += 1
            assert slot.propensity is not None
            reported.setdefault((slot.arm_id, j), set()).add(slot.propensity)
    estimate_se = 0.0 if policy == "linreboot" else np.sqrt(0.25 / 1024) + 1 / 1024
    for placement, propensities in reported.items():
        # The same statistics, the same value to the integral's error: the grid depends
        # on the other placed arms (they share it), and each value is within SERVICE's
        # 1e-3 of the integral (tests/test_ranking.py), so two differ by at most 2e-3.
        # (Usually far less: 1e-6 was exceeded once, by LinTS-G's widely spread arms.)
        assert max(propensities) - min(propensities) <= 2 * SERVICE_ERROR, placement
        # The table's, from the second ranking on (sharded: until the members' views are
        # read again, every shards.SYNC_SECONDS, and the merged view with them).
        if setting == "stochastic" and TEST_SHARDS == 1:
            later = {slot.propensity for ranking in rankings[1:] for j, slot in
                     enumerate(ranking.slots, 1) if (slot.arm_id, j) == placement}
            assert len(later) <= 1, placement
        # The count against its binomial law, exactly: no further out than a two-sided
        # tail of _TAIL for all the placements together (Bonferroni: each its share; about
        # 4.6 standard errors for 15 placements) at the most favourable p within 4 of the
        # estimate's standard errors (the highest for a count that may be too high, the
        # lowest for one that may be too low). A normal bound fails rare placements: seen
        # once in 600 at p = 7e-5 is 23 of its standard errors off, yet happens 4 % of the
        # time (a CI run, session 22). With _TAIL for each placement, about one run in 300
        # of the three cases failed somewhere by chance (one CI run did, session 23, at
        # 4.2 standard errors, stochastic LinReBoot; 2,250 placements of 150 such
        # experiments, 20,000 rankings each, were all within 3.5 of their table).
        p = float(np.mean(list(propensities)))
        count, n = seen[placement], len(rankings)
        low, high = max(p - 4 * estimate_se, 0.0), min(p + 4 * estimate_se, 1.0)
        tail = _TAIL / len(reported)
        assert stats.binom.sf(count - 1, n, high) >= tail / 2, (placement, count, n, p)
        assert stats.binom.cdf(count, n, low) >= tail / 2, (placement, count, n, p)


async def test_rank_over_http(api: Api) -> None:
    key = await api.create({"id": "web", "setting": "covariates", "dim": 2,
                            "arms": [{"id": f"a{i}"} for i in range(4)]})
    headers = {"X-API-Key": key}
    body = {"experiment_id": "web", "context": [0.2, 0.3], "k": 3}
    reply = await api.http.post("/rank", json=body, headers=headers)
    assert reply.status_code == 200, reply.text
    ranking = reply.json()
    assert [s["slot"] for s in ranking["slots"]] == [1, 2, 3]
    assert len({s["arm_id"] for s in ranking["slots"]}) == 3
    second = ranking["slots"][1]["decision_id"]
    assert second == f"{ranking['decision_id']}#2"
    rewarded = await api.reward(key, {"experiment_id": "web", "decision_id": second,
                                      "reward": 1.0})
    assert rewarded.status_code == 200 and rewarded.json()["status"] == "applied"
    batch = await api.reward(key, {"experiment_id": "web", "rewards": [
        {"decision_id": second, "reward": 1.0},
        {"decision_id": ranking["slots"][0]["decision_id"], "reward": 0.0}]})
    assert [r["status"] for r in batch.json()["results"]] == ["duplicate", "applied"]


@pytest.mark.parametrize(("change", "says"), [
    ({"k": 0}, "greater than or equal to 1"),
    ({"k": 65}, "less than or equal to 64"),
    ({"k": 5}, "more than the 4 eligible arms"),
    ({"k": 2, "eligible": ["a0"]}, "more than the 1 eligible arms"),
    ({"k": 2.0}, "valid integer"),
    ({"k": None}, "valid integer"),
    ({"k": 2, "decision_id": "x#1"}, "should match pattern"),
    ({"k": 2, "context": [0.1]}, "context"),
])
async def test_bad_rankings_are_refused_and_change_nothing(
    api: Api, change: dict[str, object], says: str
) -> None:
    key = await api.create({"id": "web", "setting": "covariates", "dim": 2,
                            "arms": [{"id": f"a{i}"} for i in range(4)]})
    before = await api.state("web")
    body = {"experiment_id": "web", "context": [0.2, 0.3], **change}
    reply = await api.http.post("/rank", json=body, headers={"X-API-Key": key})
    assert reply.status_code == 422, reply.text
    assert says in reply.text
    assert await api.state("web") == before


@pytest.mark.parametrize("decision_id", ["abc#0", "abc#100", "abc#", "#1", "abc#1#2", "a#b"])
async def test_a_reward_names_a_decision_or_a_slot(api: Api, decision_id: str) -> None:
    key = await api.create({"id": "web", "setting": "covariates", "dim": 2,
                            "arms": [{"id": f"a{i}"} for i in range(4)]})
    reply = await api.reward(key, {"experiment_id": "web", "decision_id": decision_id,
                                   "reward": 1.0})
    assert reply.status_code == 422, reply.text


async def test_position_weights_scale_what_each_slot_teaches(service: ExperimentService) -> None:
    """Slot j's reward r is modelled as w_j x'theta: the statistics learn r / w_j (a
    slot beyond the weights takes the last), from a reward and from a default alike;
    the log and the reply keep r."""
    spec = dataclasses.replace(COVARIATES, arms=ARMS[:4], position_weights=(1.0, 0.5, 0.25),
                               reward_window_seconds=1, default_reward=0.1)
    await service.create(spec)
    ranking = await service.rank("shelf", ChooseRequest(context=(1.0, 0.0), slots=4))
    slots = [s.decision_id for s in ranking.slots]
    await service.reward("shelf", [(slots[0], 0.3), (slots[1], 0.3), (slots[2], 0.3)])
    await asyncio.sleep(1.3)
    assert await service.sweep() == 1  # slot 4: the default 0.1, at the last weight
    means = {arm.id: arm.mean_reward for arm in (await service.get("shelf")).arms}
    learnt = [means[s.arm_id] for s in ranking.slots]
    assert learnt == [0.3, 0.3 / 0.5, 0.3 / 0.25, 0.1 / 0.25]
    log, _ = await service.read_log("shelf", limit=100)
    assert sorted(e.reward for e in log if e.reward is not None) == [0.1, 0.3, 0.3, 0.3]
    assert (await service.get("shelf")).spec.position_weights == (1.0, 0.5, 0.25)


@pytest.mark.unsharded  # (damages the experiment's own meta)
async def test_a_damaged_position_weight_refuses_the_rewards_before_any_is_written(
    service: ExperimentService, redis_db: str
) -> None:
    """reward.lua divides a slot's reward by its position weight after its first writes:
    a weight that is not a positive number refuses the call while it reads (DAMAGED),
    so the decision's reward before it in the call is not written either."""
    spec = dataclasses.replace(COVARIATES, arms=ARMS[:4], position_weights=(1.0, 0.5))
    await service.create(spec)
    decision = await service.choose("shelf", ChooseRequest(context=(1.0, 0.0)))
    ranking = await service.rank("shelf", ChooseRequest(context=(1.0, 0.0), slots=2))
    client = redis.Redis.from_url(redis_db)
    try:
        client.hset(keys.meta("shelf"), "position_weights", "1,0")
        with pytest.raises(redis.ResponseError, match=r"^DAMAGED .*position weight"):
            await service.reward("shelf", [(decision.decision_id, 1.0),
                                           (ranking.slots[1].decision_id, 1.0)])
        assert client.hget(keys.stats("shelf"), keys.REWARDS) in (None, b"0")
        assert client.get(keys.outcomes("shelf")) in (None, b"")
    finally:
        client.close()
    assert [o.status for o in await service.reward("shelf", [(decision.decision_id, 1.0)])] \
        == ["applied"]  # its slot 1 weight is whole


@pytest.mark.parametrize(("weights", "says"), [
    ([0.5, 0.8], "must not increase"),
    ([1.0, 0.0], "greater than 0"),
    ([1.5], "less than or equal to 1"),
    ([], "at least 1 item"),
    ([1.0] * 65, "at most 64 items"),
    ([1.0, "0.5"], "valid number"),
])
async def test_bad_position_weights_are_refused(
    api: Api, weights: list[object], says: str
) -> None:
    reply = await api.http.post("/experiments", headers=ADMIN, json={
        "id": "web", "setting": "covariates", "dim": 2, "arms": [{"id": "a"}],
        "position_weights": weights})
    assert reply.status_code == 422, reply.text
    assert says in reply.text
    assert await api.ids() == []


async def test_a_ranking_is_one_log_entry_shown_slot_by_slot(
    service: ExperimentService, redis_db: str
) -> None:
    """decide.lua logs a ranking as one stream entry (one XADD, not one per slot; it
    counts once against log_max_entries); the log shows each slot as a decision's entry
    under its own id, in slot order, sharing the entry's id, with the slot's arm,
    context and propensity; a page holds a ranking whole, and the next page goes on
    after it (and after the last, nothing)."""
    await _trained(service, COVARIATES, rounds=6)
    log, _ = await service.read_log("shelf", limit=10_000)
    rankings = [await service.rank("shelf", ChooseRequest(context=(0.1 * i, 0.5), slots=4))
                for i in range(3)]
    client = redis.Redis.from_url(redis_db)
    try:
        stored = [fields for member in records.member_ids(client, "shelf")
                  for _, fields in client.xrange(keys.log(member))]  # type: ignore[union-attr]
    finally:
        client.close()
    ranked = [f for f in stored if f[b"type"] == b"ranking"]
    assert sorted(f[b"id"].decode() for f in ranked) == sorted(r.decision_id for r in rankings)
    assert len(stored) == len(log) + 3
    after = log[-1].entry_id if TEST_SHARDS == 1 else None
    for i, ranking in enumerate(rankings):
        if TEST_SHARDS > 1:
            break  # (a sharded log's cursor is per member: the first test covers it)
        page, after = await service.read_log("shelf", after=after, limit=1)
        assert [e.decision_id for e in page] == [s.decision_id for s in ranking.slots]
        assert [e.position for e in page] == [1, 2, 3, 4]
        assert {e.entry_id for e in page} == {page[0].entry_id}
        assert [(e.arm_id, e.propensity) for e in page] == [
            (s.arm_id, s.propensity) for s in ranking.slots]
        assert all(e.context == (0.1 * i, 0.5) and e.number == ranking.decision_number
                   for e in page)
    if TEST_SHARDS == 1:
        assert await service.read_log("shelf", after=after, limit=1) == ([], None)


async def test_a_log_pages_size_estimate_covers_a_rankings_slots(
    service: ExperimentService, redis_db: str
) -> None:
    """A page stops at about LINREBOOT_LOG_PAGE_MAX_BYTES by an estimate of each stored
    entry's JSON: for a ranking's one entry, its slots' entries as shown, each with the
    fields they share (and for a decision of /choose, or a reward, its one): about
    their JSON (0.75 to 2 times: a ranking's k-fold fields counted once per slot would
    make it k times at k = 64)."""
    await _trained(service, COVARIATES, rounds=6)
    await service.rank("shelf", ChooseRequest(context=(0.25, -0.5), slots=4))
    definition = await service.views.definition("shelf")
    size = decision_log._log_entry_size(definition)
    client = redis.Redis.from_url(redis_db)
    try:
        stored = [(_text(i), fields) for member in records.member_ids(client, "shelf")
                  for i, fields in client.xrange(keys.log(member))]  # type: ignore[union-attr]
    finally:
        client.close()
    kinds = set()
    for entry_id, fields in stored:
        shown = decision_log._log_entries(
            definition, [(entry_id, {_text(k): v for k, v in fields.items()})])
        actual = sum(len(json.dumps(dataclasses.asdict(e))) for e in shown)
        estimate = size({_text(k): v for k, v in fields.items()})
        assert 0.75 * actual <= estimate <= 2 * actual, (fields[b"type"], actual, estimate)
        kinds.add(fields[b"type"])
    assert {b"ranking", b"decision", b"reward"} <= kinds


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def test_the_log_and_its_export_carry_each_slot(api: Api) -> None:
    """Every slot logged with its position, arm and propensity; the OBP export's rounds
    carry position (from 0), slate_id and the slot's propensity as pscore."""
    key = await api.create({"id": "web", "setting": "covariates", "dim": 2,
                            "arms": [{"id": f"a{i}"} for i in range(4)],
                            "log_max_entries": 1000, "position_weights": [1.0, 0.5]})
    headers = {"X-API-Key": key}
    slots: dict[str, dict[str, Any]] = {}
    for i in range(4):
        reply = await api.http.post("/rank", headers=headers, json={
            "experiment_id": "web", "context": [0.3, float(i)], "k": 3})
        ranking = reply.json()
        for slot in ranking["slots"]:
            slots[slot["decision_id"]] = {**slot, "ranking": ranking["decision_id"]}
        rewards = [{"decision_id": s["decision_id"], "reward": 1.0 * i}
                   for s in reversed(ranking["slots"])]
        assert (await api.reward(key, {"experiment_id": "web", "rewards": rewards})).json()
    experiment, entries = await fetch(api.http, "web", ADMIN_TOKEN)
    logged = {e["decision_id"]: e for e in entries if e["type"] == "decision"}
    assert {i: (e["position"], e["arm_id"], e["propensity"]) for i, e in logged.items()} == {
        i: (s["slot"], s["arm_id"], s["propensity"]) for i, s in slots.items()}
    feedback = bandit_feedback(experiment, join(experiment, entries))
    rounds = in_application_order(join(experiment, entries))
    assert feedback["position"].tolist() == [slots[r["decision_id"]]["slot"] - 1 for r in rounds]
    assert feedback["pscore"].tolist() == [slots[r["decision_id"]]["propensity"] for r in rounds]
    rankings = [slots[r["decision_id"]]["ranking"] for r in rounds]
    ids = feedback["slate_id"].tolist()
    assert all((ids[i] == ids[j]) == (rankings[i] == rankings[j])
               for i in range(len(ids)) for j in range(len(ids)))
    assert feedback["position_weights"].tolist() == [1.0, 0.5]


def test_evaluate_estimates_a_log_of_rankings_as_rankings() -> None:
    """A log of /rank is evaluated ranking by ranking (independent IPS over its slots;
    the statistics are tests/test_slate_evaluation.py's); without slate_id, refused."""
    rng = np.random.default_rng(0)
    slates, k, arms = 40, 2, 3
    actions = np.concatenate([rng.permutation(arms)[:k] for _ in range(slates)])
    rewards = rng.random(slates * k)
    feedback: dict[str, Any] = {
        "n_rounds": slates * k, "n_actions": arms, "action": actions,
        "reward": rewards, "pscore": np.full(slates * k, 1 / arms),
        "context": rng.normal(size=(slates * k, 2)), "position": np.tile(np.arange(k), slates),
        "slate_id": np.repeat(np.arange(slates), k), "eligible": np.ones((slates * k, arms), bool),
        "decision_number": np.repeat(np.arange(1, slates + 1), k),
        "setting": "covariates",  # as load_bandit_feedback gives them
        "config": json.dumps({"name": "linreboot", "dim": 2, "epsilon": 0.0})}
    report = evaluate(feedback, "linucb-const", {})
    assert (report.unit, report.train_rounds, report.rounds) == ("rankings", 20, 20)
    assert set(report.estimates) == {"iips"} and "IIPS" in report.markdown()
    sums = rewards[slates:].reshape(-1, k).sum(axis=1)  # the last 20 rankings
    assert report.logged.value == pytest.approx(sums.mean())
    del feedback["slate_id"]
    with pytest.raises(ValueError, match="lacks slate_id"):
        evaluate(feedback, None, {})


async def test_an_id_taken_on_one_route_is_refused_on_the_other_while_it_lives(
    app_settings: Settings,
) -> None:
    """A caller's id names one decision: once its answer is no longer kept (its request
    key gone, LINREBOOT_IDEMPOTENCY_SECONDS), /rank under a /choose's live id (and the
    reverse) is refused, not a second decision under the same id (review, session 16)."""
    service = await ExperimentService.open(app_settings.model_copy(
        update={"idempotency_seconds": 1}))
    try:
        await service.create(dataclasses.replace(COVARIATES, seed=None))
        chosen = ChooseRequest(context=(0.1, 0.2), decision_id="one-id")
        ranked = ChooseRequest(context=(0.1, 0.2), decision_id="other-id", slots=2)
        await service.choose("shelf", chosen)
        await service.rank("shelf", ranked)
        with pytest.raises(Conflict):  # within the second: another request under the id
            await service.rank("shelf", dataclasses.replace(chosen, slots=2))
        await asyncio.sleep(1.3)
        with pytest.raises(Conflict, match="no longer kept"):
            await service.rank("shelf", dataclasses.replace(chosen, slots=2))
        with pytest.raises(Conflict, match="no longer kept"):
            await service.choose("shelf", dataclasses.replace(ranked, slots=None))
        assert (await service.get("shelf")).decisions == 3
    finally:
        await service.close()


def test_evaluate_refuses_rankings_without_logged_propensities() -> None:
    """Slots without a logged propensity among the evaluated rankings: refused, saying
    why, not a NaN estimate (review, session 16)."""
    feedback = {"n_rounds": 8, "n_actions": 3, "action": np.array([0, 1] * 4),
                "reward": np.ones(8), "pscore": np.array([0.5] * 4 + [np.nan] * 4),
                "context": np.zeros((8, 2)), "position": np.tile([0, 1], 4),
                "slate_id": np.repeat(np.arange(4), 2), "eligible": np.ones((8, 3), bool),
                "decision_number": np.repeat(np.arange(1, 5), 2), "setting": "covariates",
                "config": json.dumps({"name": "linreboot", "dim": 2})}
    with pytest.raises(ValueError, match="no logged propensity"):
        evaluate(feedback, "linucb-const", {})


def test_a_training_rankings_missing_propensity_does_not_refuse_the_log() -> None:
    """Rows are in the order outcomes came: a training ranking's slot may come after
    the row split. Only the evaluated rankings need propensities (review, session 16)."""
    pscore = np.full(8, 0.5)
    pscore[[0, 5]] = np.nan  # ranking 0's slots (training): one of them past the row split
    feedback = {"n_rounds": 8, "n_actions": 3, "action": np.array([0, 1] * 4),
                "reward": np.ones(8), "pscore": pscore,
                "context": np.zeros((8, 2)), "position": np.array([0, 0, 1, 0, 1, 1, 0, 1]),
                "slate_id": np.array([0, 1, 1, 2, 2, 0, 3, 3]),
                "eligible": np.ones((8, 3), bool),
                "decision_number": np.array([1, 2, 2, 3, 3, 1, 4, 4]), "setting": "covariates",
                "config": json.dumps({"name": "linreboot", "dim": 2})}
    report = evaluate(feedback, "linucb-const", {})
    assert (report.unit, report.train_rounds, report.rounds) == ("rankings", 2, 2)
