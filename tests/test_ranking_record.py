"""A ranking kept as one record (``service/lua/outcomes.lua``), against a real Redis: its
slots' states in it until a slot is rewarded, then that slot's record of its own; the
same outcomes, exactly once each, as when every slot had a record from the start (as an
earlier version kept them, which this version still rewards and settles)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import redis

from service import keys
from service.domain import ChooseRequest, Decision, RankedDecision
from service.errors import Conflict
from service.experiments import ExperimentService
from tests import records
from tests.test_default_rewards import DEFAULT, WINDOW, audit, context, spec

pytestmark = pytest.mark.anyio

WEEK_MS = 7 * 24 * 3600 * 1000


def ranking_request(rng: np.random.Generator, slots: int = 3,
                    decision_id: str | None = None) -> ChooseRequest:
    return ChooseRequest(context=context(rng).context, slots=slots, decision_id=decision_id)


def decision_keys(client: redis.Redis, experiment_id: str) -> set[str]:
    """The ids of the decision records the experiment holds."""
    prefix = keys.decision(experiment_id, "")
    return {k.decode().removeprefix(prefix)
            for k in client.scan_iter(match=keys.decision(experiment_id, "*"))}


def states(client: redis.Redis, experiment_id: str, ranking: RankedDecision) -> str:
    """The slots' states as the ranking's record holds them."""
    raw = client.get(keys.decision(experiment_id, keys.slot_id(ranking.decision_id, 0)))
    assert isinstance(raw, bytes)
    return raw.split(b"\n", 4)[3].decode()


async def test_a_ranking_is_one_record_until_a_slot_is_rewarded(
    service: ExperimentService, redis_db: str
) -> None:
    rng = np.random.default_rng(1)
    await service.create(spec("one", reward_window_seconds=60))
    ranking = await service.rank("one", ranking_request(rng))
    first, second, third = (slot.decision_id for slot in ranking.slots)
    client = redis.Redis.from_url(redis_db)
    try:
        assert decision_keys(client, "one") == {keys.slot_id(ranking.decision_id, 0)}
        pending: list[bytes] = client.lrange(keys.pending("one"), 0, -1)  # type: ignore[assignment]
        assert [e.decode().split(" ")[1] for e in pending] == [first, second, third]
        ranking_key = keys.decision("one", keys.slot_id(ranking.decision_id, 0))
        before: int = client.pttl(ranking_key)  # type: ignore[assignment]

        [applied] = await service.reward("one", [(second, 0.5)])
        assert applied.status == "applied"
        # The rewarded slot has its record; the others are still its ranking's.
        assert decision_keys(client, "one") == {keys.slot_id(ranking.decision_id, 0), second}
        assert states(client, "one", ranking) == "psp"
        own: int = client.pttl(keys.decision("one", second))  # type: ignore[assignment]
        assert before + WEEK_MS - 5_000 < own <= before + WEEK_MS  # as a decision's: a week more
        for slot_id, status in ((first, "pending"), (second, "rewarded"), (third, "pending")):
            record = records.read(redis_db, "one", slot_id)
            assert record is not None and record["status"] == status
        assert records.read(redis_db, "one", first)["arm"] == ranking.slots[0].arm_id.encode()  # type: ignore[index]

        outcomes = await service.reward("one", [(second, 0.5), (second, 0.75), (first, 1.0)])
        assert [o.status for o in outcomes] == ["duplicate", "conflict", "applied"]
        assert states(client, "one", ranking) == "ssp"
        # Reward slot 0, the ranking's own record: no such decision, and nothing changes.
        [unknown] = await service.reward("one", [(keys.slot_id(ranking.decision_id, 0), 1.0)])
        assert unknown.status == "not_found"
        assert states(client, "one", ranking) == "ssp"
        await service.reward("one", [(third, 0.0)])
        # No slot left pending: the record keeps its states, not its slots' contexts.
        raw = client.get(ranking_key)
        assert isinstance(raw, bytes) and raw.endswith(b"\nsss")
    finally:
        client.close()
    view = await service.get("one")
    assert (view.decisions, view.rewards, view.defaulted) == (3, 3, 0)


async def test_unrewarded_slots_take_the_default_and_late_rewards_count_once(
    service: ExperimentService, other_service: ExperimentService, redis_db: str
) -> None:
    rng = np.random.default_rng(2)
    await service.create(spec())
    rankings = [await service.rank("dflt", ranking_request(rng)) for _ in range(4)]
    slots: list[Decision] = [slot for ranking in rankings for slot in ranking.slots]
    rewarded = {slots[0].decision_id: 1.0, slots[4].decision_id: -0.5}
    outcomes = await service.reward("dflt", list(rewarded.items()))
    assert [o.status for o in outcomes] == ["applied", "applied"]
    await asyncio.sleep(WINDOW + 0.1)
    # Late, before the default: counted once, and its default is still to come.
    late = slots[1].decision_id
    for value in (2.0, 3.0):
        assert [o.status for o in await service.reward("dflt", [(late, value)])] == ["late"]

    counts = await asyncio.gather(*(w.sweep() for w in (service, other_service) * 3))

    assert sum(counts) == len(slots) - len(rewarded)
    client = redis.Redis.from_url(redis_db)
    try:
        assert [states(client, "dflt", r) for r in rankings] == ["sDd", "dsd", "ddd", "ddd"]
        assert records.list_length(client, "dflt", keys.pending) == 0
        assert records.list_length(client, "dflt", keys.settled) == len(slots)
        whole = client.get(keys.decision("dflt", keys.slot_id(rankings[2].decision_id, 0)))
        assert isinstance(whole, bytes) and whole.endswith(b"\nddd")  # no contexts kept
    finally:
        client.close()
    # After the default: a defaulted slot's late reward counts once too.
    batch = [(slots[2].decision_id, 0.1), (slots[2].decision_id, 0.2), (late, 4.0),
             (slots[0].decision_id, 1.0)]
    assert [o.status for o in await service.reward("dflt", batch)] == [
        "late", "late", "late", "duplicate"]
    view = await service.get("dflt")
    assert view.late == 2
    await audit(service, redis_db, "dflt", rewarded, slots)


async def test_a_repeated_ranking_tells_each_slot_how_long_its_reward_may_take(
    service: ExperimentService, redis_db: str
) -> None:
    rng = np.random.default_rng(3)
    await service.create(spec("again", reward_window_seconds=60))
    request = ranking_request(rng, decision_id="mine")
    made = await service.rank("again", request)
    await service.reward("again", [(made.slots[1].decision_id, 1.0)])

    repeated = await service.rank("again", request)

    assert [s.arm_id for s in repeated.slots] == [s.arm_id for s in made.slots]
    left = [s.expires_in_seconds for s in repeated.slots]
    assert left[1] == 0 and all(55 <= s <= 60 for s in (left[0], left[2])), left
    # The same id on /choose names the live ranking: refused, nothing recorded.
    with pytest.raises(Conflict, match="decision_id"):
        await service.choose("again", ChooseRequest(context=request.context, decision_id="mine"))
    assert (await service.get("again")).decisions == 3


async def test_delete_removes_a_rankings_records(
    service: ExperimentService, redis_db: str
) -> None:
    rng = np.random.default_rng(4)
    await service.create(spec("gone", reward_window_seconds=60))
    ranking = await service.rank("gone", ranking_request(rng))
    await service.reward("gone", [(ranking.slots[0].decision_id, 1.0)])
    client = redis.Redis.from_url(redis_db)
    try:
        assert len(decision_keys(client, "gone")) == 2

        await service.delete("gone")

        assert decision_keys(client, "gone") == set()
    finally:
        client.close()


async def test_slots_recorded_one_by_one_by_an_earlier_version_are_rewarded_and_settled(
    service: ExperimentService, redis_db: str
) -> None:
    """Rankings made before this version kept a record per slot (``<id>#<slot>``, in a
    pending decision's format): rewarded and given the default as before."""
    rng = np.random.default_rng(5)
    await service.create(spec())
    ranking = await service.rank("dflt", ranking_request(rng))
    client = redis.Redis.from_url(redis_db)
    try:  # the ranking's record split into its slots' as the earlier version wrote them
        ranking_key = keys.decision("dflt", keys.slot_id(ranking.decision_id, 0))
        ttl: int = client.pttl(ranking_key)  # type: ignore[assignment]
        raw = client.get(ranking_key)
        assert isinstance(raw, bytes)
        for j, slot in enumerate(ranking.slots, 1):
            own = records.slot_of_ranking(raw, j)
            assert own is not None
            client.set(keys.decision("dflt", slot.decision_id), own, px=ttl)
        client.delete(ranking_key)
    finally:
        client.close()
    rewarded = {ranking.slots[1].decision_id: 0.5}
    assert [o.status for o in await service.reward("dflt", list(rewarded.items()))] == [
        "applied"]
    await asyncio.sleep(WINDOW + 0.1)
    assert await service.sweep() == 2
    assert (await service.reward("dflt", [(ranking.slots[0].decision_id, 1.0)]))[0].status \
        == "late"
    await audit(service, redis_db, "dflt", rewarded, list(ranking.slots))
    record = records.read(redis_db, "dflt", ranking.slots[2].decision_id)
    assert record is not None and record["status"] == "defaulted"
    assert float(record["reward"]) == DEFAULT


async def test_a_slot_left_by_a_deleted_experiment_does_not_hide_a_new_rankings_slot(
    service: ExperimentService, redis_db: str
) -> None:
    """A DELETE that stopped halfway leaves records to expire on their own; a ranking made
    again under the same caller's id is not hidden by them (a slot's own record is read
    first)."""
    rng = np.random.default_rng(6)
    await service.create(spec("again", reward_window_seconds=60))
    left_over = keys.decision("again", "abc#2")
    client = redis.Redis.from_url(redis_db)
    try:
        client.set(left_over, b"rgone\n7\n1.0", px=60_000)  # another incarnation's, rewarded
        ranking = await service.rank("again", ranking_request(rng, decision_id="abc"))
        assert client.get(left_over) is None
    finally:
        client.close()
    outcomes = await service.reward("again", [(s.decision_id, 0.5) for s in ranking.slots])
    assert [o.status for o in outcomes] == ["applied"] * 3


async def test_a_caller_id_whose_slot_outlives_its_ranking_stays_taken(
    service: ExperimentService, redis_db: str
) -> None:
    """A rewarded slot's record outlives its ranking's (a week more, for settle.lua), as do
    an earlier version's slots' records: while one lives, its id is taken, on /rank and
    /choose alike, as when the ranking's record lives."""
    rng = np.random.default_rng(7)
    await service.create(spec(reward_window_seconds=60))
    request = ranking_request(rng, decision_id="mine")
    ranking = await service.rank("dflt", request)
    await service.reward("dflt", [(ranking.slots[0].decision_id, 1.0)])
    client = redis.Redis.from_url(redis_db)
    try:  # the ranking's record and its answer for retries gone, its first slot's not
        client.delete(keys.decision("dflt", keys.slot_id("mine", 0)), keys.request("dflt", "mine"))
    finally:
        client.close()
    with pytest.raises(Conflict, match="decision_id"):
        await service.rank("dflt", request)
    with pytest.raises(Conflict, match="decision_id"):
        await service.choose("dflt", ChooseRequest(context=request.context, decision_id="mine"))
    assert (await service.get("dflt")).decisions == 3


async def test_a_decision_listed_twice_is_settled_once(
    service: ExperimentService, redis_db: str
) -> None:
    rng = np.random.default_rng(8)
    await service.create(spec())
    decision = await service.choose("dflt", context(rng))
    client = redis.Redis.from_url(redis_db)
    try:
        [entry] = client.lrange(keys.pending("dflt"), 0, -1)  # type: ignore[misc]
        client.rpush(keys.pending("dflt"), entry)
        await asyncio.sleep(WINDOW + 0.1)

        assert await service.sweep() == 1

        assert client.llen(keys.pending("dflt")) == 0
    finally:
        client.close()
    view = await service.get("dflt")
    assert (view.decisions, view.defaulted, view.defaults_missed) == (1, 1, 0)
    await audit(service, redis_db, "dflt", {}, [decision])


def test_a_propensitys_text_is_its_repr_made_once_and_the_memo_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The slots' propensity texts (records, log) are repr's, '' for none, whether made or
    remembered; past its bound the memo starts again rather than grow."""
    from service import decisions

    monkeypatch.setattr(decisions, "_TEXTS", {None: ""})
    monkeypatch.setattr(decisions, "_TEXTS_MOST", 8)
    values = [0.1, None, 1 / 3, 0.1, 2.5e-7, None]
    expected = ["" if p is None else repr(p) for p in values]
    assert decisions._texts_of(values) == expected
    assert decisions._texts_of(values) == expected  # remembered
    assert decisions._TEXTS[1 / 3] == repr(1 / 3)
    many = [j / 7 for j in range(20)]
    assert decisions._texts_of(many) == [repr(p) for p in many]
    assert decisions._texts_of(values) == expected  # emptied past the bound, made again
    assert len(decisions._TEXTS) <= 8 + 1 + len(values)
