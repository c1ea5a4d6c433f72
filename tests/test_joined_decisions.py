"""The decisions of one experiment in a turn go to Redis as one decide.lua call, against a
real Redis: each answered, and Redis left, as if each had come alone in turn; a part
whose own command fails fails alone; the list of decisions is tidied once the call
crosses a multiple of 64.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from redis.exceptions import ResponseError

from service import keys
from service.domain import ArmSpec, ChooseRequest, Decision, ExperimentSpec
from service.errors import Conflict
from service.experiments import ExperimentService
from service.store import DecideReply, Store, _joined_decisions

# The store's calls on one member's keys: its experiments stay unsharded.
pytestmark = [pytest.mark.anyio, pytest.mark.unsharded]

RECORD = b"model:a\narm:a\na\n1\n0\n0.0\n0.5\n" + b"\0" * 16  # a record's end, d = 2


def _client(url: str) -> Any:
    """A Redis client (its commands' replies as untyped as redis-py's annotations allow)."""
    return redis.Redis.from_url(url)


async def _experiment(service: ExperimentService, url: str, experiment_id: str,
                      default_reward: float | None) -> tuple[str, tuple[int, int]]:
    """An experiment with one decision rewarded: its incarnation and (version, outcomes)."""
    spec = ExperimentSpec(id=experiment_id, setting="covariates", dim=2,
                          arms=(ArmSpec("a"), ArmSpec("b"), ArmSpec("c")),
                          default_reward=default_reward, log_max_entries=100)
    _, key = await service.create(spec)
    made = await service.choose(experiment_id, ChooseRequest(context=(1.0, 0.0)), key)
    assert (await service.reward(experiment_id, [(made.decision_id, 1.0)], key)
            )[0].status == "applied"
    client = _client(url)
    try:
        meta = client.hmget(keys.meta(experiment_id), "incarnation", "version")
    finally:
        client.close()
    return meta[0].decode(), (int(meta[1]), 1)


def _common(incarnation: str, seen: tuple[int, int] | None, ttl_seconds: int = 60
            ) -> dict[str, Any]:
    """What a decide call of these tests takes but the decision's id and its own."""
    return {"key_hash": None, "incarnation": incarnation, "seen": seen, "number": None,
            "reserved": False, "ttl_seconds": ttl_seconds, "max_lag": 0, "grace_seconds": 30,
            "record": RECORD}


def _turn(incarnation: str, seen: tuple[int, int]) -> list[dict[str, Any]]:
    """A turn's decide calls that meet each other: a decision, one whose predicted
    number the first took, a repeat of the first, a ranking, one from a view too far
    behind (a full reply), caller ids answered, repeated and conflicting."""
    version, outcomes = seen
    common = _common(incarnation, seen, ttl_seconds=4_000)

    def call(decision_id: str, **kwargs: Any) -> dict[str, Any]:
        logged = {"type": "decision", "id": decision_id, "arm": "a"}
        return {**common, "decision_id": decision_id, "logged": logged, **kwargs}

    return [
        call("d1"),
        call("d2", number=2, held=1),  # predicted the number d1 takes
        call("d1", seen=None),  # d1 again: its reply was lost
        call("r1", ranked=True, later_records=(RECORD, RECORD), ttl_seconds=4_100,
             logged={"type": "ranking", "id": "r1", "arms": "a,b,c"}),
        call("d5", seen=(version, outcomes - 1)),  # a view a reward behind, unknown held
        call("q1", request=("digest", "a\n\n", 60)),
        call("q1", request=("digest", "a\n\n", 60)),  # its retry: the same answer
        call("q1", request=("other", "b\n\n", 60)),  # another request under its id
        call("d9", number=7, reserved=True, seen=None),  # a number set aside earlier
        call("x1"),  # a decision, then a ranking under its id: spent
        call("x1", request=("ranked", "a\n\n\nb\n\n", 60), ranked=True,
             later_records=(RECORD,), logged={"type": "ranking", "id": "x1", "arms": "a,b"}),
    ]


def _answer(reply: DecideReply) -> tuple[Any, ...]:
    """What a reply says, without what differs between two experiments (times)."""
    progress, snapshot = reply.progress, reply.snapshot
    return (reply.status, reply.number, reply.answer, reply.reserved, len(reply.windows_left),
            None if progress is None else (progress.rewards, progress.decision_seq,
                                           progress.folded, progress.skipped,
                                           len(progress.unfolded)),
            None if snapshot is None else (snapshot.rewards, snapshot.stats["decision_seq"],
                                           snapshot.stats["decisions"]))


def _state(url: str, experiment_id: str) -> tuple[Any, ...]:
    """What the calls left in Redis, without times."""
    client = _client(url)
    try:
        stats = client.hmget(keys.stats(experiment_id), "decision_seq", "decisions")
        # (but the decision rewarded before the turn, its id random)
        entries = [e.split(b" ") for e in client.lrange(keys.pending(experiment_id), 0, -1)][1:]
        listed = [entry[1] for entry in entries]
        deadlines = [float(entry[0]) for entry in entries]
        log = [(e[1][b"type"], e[1].get(b"number"), e[1].get(b"id"))
               for e in client.xrange(keys.log(experiment_id))][2:]
        numbers = {
            i: (client.get(keys.decision(experiment_id, i)) or b"").split(b"\n")[1]
            for i in ("d1", "d2", "d5", "q1", "d9", "r1#0")
            if client.exists(keys.decision(experiment_id, i))}
        # In deadline order (with a default reward: a window that lags a longer one waits)
        ordered = deadlines == sorted(deadlines)
        # (in 100 s: r1's window and a second, or -1: none)
        expires = client.ttl(keys.pending(experiment_id)) // 100
        log_expires = client.ttl(keys.log(experiment_id)) > 0
        return stats, listed, log, numbers, expires, ordered, log_expires
    finally:
        client.close()


@pytest.mark.parametrize("default_reward", [None, 0.0], ids=["no default", "default"])
async def test_a_turn_of_decisions_is_one_call_answered_as_each_alone_in_turn(
    service: ExperimentService, redis_db: str, pipelines: list[int], default_reward: float | None,
) -> None:
    joined: dict[str, Any] = {}
    alone: dict[str, Any] = {}
    for name, answers in (("joined", joined), ("alone", alone)):
        incarnation, seen = await _experiment(service, redis_db, name, default_reward)
        calls = _turn(incarnation, seen)
        store: Store = service._store
        client = _client(redis_db)
        client.persist(keys.log(name))  # the turn's calls give it its expiry again
        client.close()
        pipelines.clear()
        if name == "joined":
            replies = await asyncio.gather(*(store.decide(name, **c) for c in calls))
            assert pipelines == [1]  # one pipeline of one call
        else:
            replies = [await store.decide(name, **c) for c in calls]
            assert pipelines == [1] * len(calls)
        answers["replies"] = [_answer(r) for r in replies]
        answers["state"] = _state(redis_db, name)

    assert joined == alone
    statuses = [r[0] for r in joined["replies"]]
    assert statuses == ["recorded", "stale", "recorded", "recorded", "stale", "recorded",
                        "repeat", "conflict", "recorded", "recorded", "spent"]
    numbers = [r[1] for r in joined["replies"]]
    assert (numbers[0], numbers[2], numbers[3], numbers[5], numbers[6], numbers[8],
            numbers[9]) == (2, 2, 4, 5, 5, 7, 6)
    assert joined["replies"][1][3] == 3  # d2: 3 set aside for it
    assert joined["replies"][1][5][1] == 3  # its progress's decision_seq: after that
    assert joined["replies"][4][6] == (1, b"4", b"5")  # d5: the statistics after r1
    stats, listed, log, _, expires, ordered, log_expires = joined["state"]
    # (windows longer than the first decision's 3,600 s, r1's longer than those after it)
    assert ordered == (default_reward is not None)
    # Without a default reward, with the longest window (r1's); with, never (settle.lua
    # must find every entry).
    assert expires == (-1 if default_reward is not None else 41)
    assert log_expires
    assert stats == [b"6", b"8"]  # d9's number was set aside; a ranking's slots count
    assert listed == [b"d1", b"r1#1", b"r1#2", b"r1#3", b"q1", b"d9", b"x1"]
    assert log == [(b"decision", b"2", b"d1"), (b"ranking", b"4", b"r1"),
                   (b"decision", b"5", b"q1"), (b"decision", b"7", b"d9"),
                   (b"decision", b"6", b"x1")]


async def test_a_part_whose_own_command_fails_fails_alone(
    service: ExperimentService, redis_db: str, pipelines: list[int],
) -> None:
    incarnation, seen = await _experiment(service, redis_db, "broken", 0.0)
    client = _client(redis_db)
    try:
        client.hset(keys.request("broken", "q2"), "not", "a string")  # GET: WRONGTYPE
        common = _common(incarnation, seen)
        pipelines.clear()
        replies = await asyncio.gather(
            service._store.decide("broken", "d1", **common),
            service._store.decide("broken", "q2", request=("digest", "a\n\n", 60), **common),
            service._store.decide("broken", "d3", **common), return_exceptions=True)
        assert pipelines == [1]
        first, broken, third = replies
        assert isinstance(broken, ResponseError) and "WRONGTYPE" in str(broken)
        assert isinstance(first, DecideReply) and isinstance(third, DecideReply)
        assert (first.status, first.number, third.status, third.number) == (
            "recorded", 2, "recorded", 3)
        assert client.hmget(keys.stats("broken"), "decision_seq", "decisions") == [b"3", b"3"]
        assert [e.split(b" ")[1] for e in client.lrange(keys.pending("broken"), 0, -1)][1:] == [
            b"d1", b"d3"]
        assert client.get(keys.decision("broken", "q2")) is None
    finally:
        client.close()


async def test_caller_ids_met_in_one_turn(service: ExperimentService) -> None:
    """Two requests under one caller's id in a turn: the second is the first's retry
    (the same answer) or another request (409); a ranking under a decision's id, 409."""
    spec = ExperimentSpec(id="ids", setting="covariates", dim=2,
                          arms=(ArmSpec("a"), ArmSpec("b"), ArmSpec("c")))
    _, key = await service.create(spec)
    await service.choose("ids", ChooseRequest(context=(1.0, 0.0)), key)  # the view read
    asked = ChooseRequest(context=(1.0, 0.0), decision_id="x" * 16)
    other = ChooseRequest(context=(0.0, 1.0), decision_id="x" * 16)
    ranked = ChooseRequest(context=(1.0, 0.0), decision_id="x" * 16, slots=2)
    first, again, conflict, spent = await asyncio.gather(
        service.choose("ids", asked, key), service.choose("ids", asked, key),
        service.choose("ids", other, key), service.rank("ids", ranked, key),
        return_exceptions=True)
    assert isinstance(first, Decision) and isinstance(again, Decision)
    assert (again.arm_id, again.decision_number, again.propensity, again.index) == (
        first.arm_id, first.decision_number, first.propensity, first.index)
    assert isinstance(conflict, Conflict) and isinstance(spent, Conflict)
    assert (await service.get("ids")).decisions == 2


@pytest.mark.parametrize(("expired", "ranked"), [(61, 0), (189, 63)],
                         ids=["one multiple", "two multiples"])
async def test_a_joined_call_that_crosses_64_listed_drops_the_expired(
    service: ExperimentService, redis_db: str, expired: int, ranked: int,
) -> None:
    """Up to 128 expired entries go for each multiple of 64 the call's entries cross."""
    incarnation, seen = await _experiment(service, redis_db, "tidy", None)
    client = _client(redis_db)
    try:
        client.lpush(keys.pending("tidy"), *(f"{1_000 + i} expired{i}" for i in range(expired)))
        before = client.llen(keys.pending("tidy"))  # with the first decision's
        common = _common(incarnation, seen)
        calls = [service._store.decide("tidy", f"t{i}", **common) for i in range(3)]
        if ranked:  # a ranking of 64 slots among them: 67 entries in all
            calls.append(service._store.decide("tidy", "r", ranked=True,
                                               later_records=(RECORD,) * ranked, **common))
        replies = await asyncio.gather(*calls)
        assert [r.status for r in replies] == ["recorded"] * len(calls)
        added = 3 + (1 + ranked if ranked else 0)
        crossed = (before + added) // 64 - before // 64
        assert crossed == (2 if ranked else 1) and expired <= 128 * crossed
        listed: list[bytes] = client.lrange(keys.pending("tidy"), 0, -1)
        assert not any(b"expired" in e for e in listed) and len(listed) == 1 + added
    finally:
        client.close()


def test_joined_arguments_are_the_first_call_then_each_further_parts() -> None:
    def argv(part: str, count: int) -> list[Any]:
        args = [f"{part}-arg{i}" for i in range(count)]
        return [8, "meta", "stats", f"{part}-record", "pending", "log", "outcomes",
                f"{part}-request", f"{part}-other", "hash", *args, count, 1]

    assert _joined_decisions([argv("a", 2), argv("b", 3), argv("c", 1)]) == [
        14, "meta", "stats", "a-record", "pending", "log", "outcomes", "a-request", "a-other",
        "b-record", "b-request", "b-other", "c-record", "c-request", "c-other",
        "hash", "a-arg0", "a-arg1", "b-arg0", "b-arg1", "b-arg2", "c-arg0", 2, 3, 1, 3]
