"""An experiment's last hour, minute by minute (recent.lua, ExperimentView.recent): the
decisions, rewards and default rewards add up to the experiment's counters, on one
member or several; a minute is marked once, its mark taking over the slot of the minute
an hour before, and a minute an hour old is never shown. ``/ui``'s list shows them."""

from __future__ import annotations

import asyncio
import math
import struct
import time

import pytest
import redis

from service import keys, shards
from service.experiments import ExperimentService
from tests.conftest import ADMIN, Api

pytestmark = pytest.mark.anyio
WINDOW = 1  # seconds: the shortest reward window, so that defaults come soon


def _minute_of(client: redis.Redis) -> tuple[int, float]:
    """Redis's minute and the seconds into it."""
    seconds, micros = client.time()  # type: ignore[misc]
    now = seconds + micros / 1e6
    return int(now // 60), now % 60


@pytest.mark.parametrize("count", [1, 3], ids=["one member", "three shards"])
async def test_the_minutes_add_up_to_the_counters(
        api: Api, service: ExperimentService, count: int) -> None:
    key = await api.create({"id": "act", "setting": "covariates", "dim": 2, "seed": 4,
                            "arms": [{"id": a} for a in "abc"], "shards": count,
                            "reward_window_seconds": WINDOW, "default_reward": 0.0})
    body = {"experiment_id": "act", "context": [0.3, -0.2]}
    decided = [await api.decide(key, body) for _ in range(6)]
    for decision_id in decided[:4]:
        await api.reward(key, {"experiment_id": "act", "decision_id": decision_id,
                               "reward": 1.0})
    await asyncio.sleep(WINDOW + 0.1)
    while await service.sweep():  # the other 2 get the default
        pass
    ranked = await api.http.post("/rank", json={**body, "k": 2},
                                 headers={"X-API-Key": key})
    assert ranked.status_code == 200, ranked.text
    experiment = (await api.http.get("/experiments/act", headers=ADMIN)).json()
    assert (experiment["decisions"], experiment["rewards"], experiment["defaulted"]) == (8, 4, 2)
    recent = experiment["recent"]
    assert 1 <= len(recent) <= 2  # (the run may straddle a minute's end)
    assert sum(m["decisions"] for m in recent) == 8
    assert sum(m["rewards"] for m in recent) == 4
    assert sum(m["defaulted"] for m in recent) == 2
    now = time.time()
    for minute in recent:
        assert minute["minute"] % 60 == 0 and now - 3600 < minute["minute"] <= now + 60


def _marks(*marks: tuple[int, int, int, int]) -> bytes:
    """recent.lua's field with these marks: (minute, decisions, rewards, defaulted) as it
    began."""
    packed = bytearray(28 * 60)
    for minute, *counters in marks:
        struct.pack_into("<I3d", packed, 28 * (minute % 60), minute, *counters)
    return bytes(packed)


@pytest.mark.unsharded  # (it writes the home's minute fields)
async def test_a_minute_is_marked_once_and_an_hour_old_one_is_not_shown(
        api: Api, redis_db: str) -> None:
    """A minute's first decision marks it (the counters before it, over the mark of the
    minute an hour before; earlier versions' fields of the minute dropped), the
    minute's next decisions write nothing; a minute's counts are the next mark's
    counters less its own, and a minute an hour old is not shown."""
    key = await api.create({"id": "act", "setting": "covariates", "dim": 2, "seed": 4,
                            "arms": [{"id": "a"}, {"id": "b"}], "shards": 1})
    body = {"experiment_id": "act", "context": [0.1, 0.2]}
    client = redis.Redis.from_url(redis_db)
    try:
        minute, into = _minute_of(client)
        if into > 50:  # not across a minute's end: the marks below are this minute's
            await asyncio.sleep(61 - into)
        for i in range(3):
            decision_id = await api.decide(key, body)
            if i < 2:
                await api.reward(key, {"experiment_id": "act", "decision_id": decision_id,
                                       "reward": 1.0})
        minute, _ = _minute_of(client)
        stats = keys.stats(shards.member("act", 0))
        assert client.hmget(stats, [keys.DECISIONS, keys.REWARDS, keys.RECENT_MINUTE]) == [
            b"3", b"2", str(minute).encode()]
        # As if all that came two minutes ago (one decision before, one an hour
        # before, whose mark this minute's takes over) and an earlier version counted.
        client.hset(stats, mapping={
            keys.RECENT_MARKS: _marks((minute - 61, 0, 0, 0), (minute - 60, 1, 0, 0),
                                      (minute - 2, 1, 0, 0)),
            keys.RECENT_MINUTE: minute - 2, keys.RECENT_OLD: b"\0" * 960,
            # (a version before counted in a field a minute: this minute's and another's)
            f"recent:d:{minute % 60}": 5, f"recent:r:{(minute + 1) % 60}": 5})
        await api.decide(key, body)
        marked = _marks((minute - 61, 0, 0, 0), (minute - 2, 1, 0, 0), (minute, 3, 2, 0))
        assert client.hget(stats, keys.RECENT_MARKS) == marked
        assert client.hget(stats, keys.RECENT_MINUTE) == str(minute).encode()
        assert not client.hexists(stats, keys.RECENT_OLD)
        assert not client.hexists(stats, f"recent:d:{minute % 60}")
        assert client.hexists(stats, f"recent:r:{(minute + 1) % 60}")  # (its minute's mark)
        await api.decide(key, body)  # the minute's next decision: no mark
        assert client.hget(stats, keys.RECENT_MARKS) == marked
    finally:
        client.close()
    recent = (await api.http.get("/experiments/act", headers=ADMIN)).json()["recent"]
    assert recent == [
        {"minute": 60 * (minute - 2), "decisions": 2, "rewards": 2, "defaulted": 0},
        {"minute": 60 * minute, "decisions": 2, "rewards": 0, "defaulted": 0}]


@pytest.mark.unsharded  # (it writes the home's minute fields)
async def test_a_reward_or_a_default_that_marks_a_minute_marks_the_counters_before_it(
        api: Api, service: ExperimentService, redis_db: str) -> None:
    """A minute's first call that counts may be a reward (reward.lua) or a default
    (settle.lua): its mark holds the counters before its own outcomes."""
    key = await api.create({"id": "act", "setting": "covariates", "dim": 2, "seed": 4,
                            "arms": [{"id": a} for a in "abc"], "shards": 1,
                            "reward_window_seconds": WINDOW, "default_reward": 0.0})
    body = {"experiment_id": "act", "context": [0.3, -0.2]}
    decided = [await api.decide(key, body) for _ in range(3)]
    stats = keys.stats(shards.member("act", 0))
    client = redis.Redis.from_url(redis_db)

    def newest_mark() -> tuple[int, ...]:
        ring: bytes = client.hget(stats, keys.RECENT_MARKS)  # type: ignore[assignment]
        marks = [struct.unpack_from("<I3d", ring, 28 * i) for i in range(60)]
        _, *counters = max(marks)
        return tuple(int(c) for c in counters)

    try:
        client.hset(stats, keys.RECENT_MINUTE, "0")  # as if no minute were marked yet
        await api.reward(key, {"experiment_id": "act", "decision_id": decided[0],
                               "reward": 1.0})
        assert newest_mark() == (3, 0, 0)  # (decisions, rewards, defaulted) before it
        client.hset(stats, keys.RECENT_MINUTE, "0")
        await asyncio.sleep(WINDOW + 0.1)
        while await service.sweep():  # the other two get the default
            pass
        assert newest_mark() == (3, 1, 0)
        assert client.hmget(stats, [keys.REWARDS, keys.DEFAULTED]) == [b"1", b"2"]
    finally:
        client.close()


def test_the_minutes_are_redis_s_should_its_clock_run_ahead() -> None:
    """A ring whose newest minute is ahead of this clock's is read by that minute (none
    lost); the marks are taken in the counters' order, so a clock set back since does not
    mix the minutes' counts up; a member without a ring adds nothing."""
    from service.lifecycle import recent_minutes

    def counters(decisions: int) -> dict[str, bytes]:
        return {keys.DECISIONS: str(decisions).encode(), keys.REWARDS: b"6",
                keys.DEFAULTED: b"5"}

    marks = [(942, 0, 0, 0), (1000, 5, 5, 5), (1003, 6, 6, 5)]
    minutes = recent_minutes([{keys.RECENT_MARKS: _marks(*marks), **counters(8)}, {}],
                             now=1001 * 60 + 5)
    assert [(m.start // 60, m.decisions, m.rewards, m.defaulted) for m in minutes] == [
        (1000, 1, 1, 0), (1003, 2, 0, 0)]  # (942: an hour before 1003, not shown)
    # A mark far ahead (a clock since set back) does not hide the hour.
    marks.append((1030, 8, 6, 5))
    minutes = recent_minutes([{keys.RECENT_MARKS: _marks(*marks), **counters(12)}],
                             now=1001 * 60 + 5)
    assert [(m.start // 60, m.decisions) for m in minutes] == [(1000, 1), (1003, 2), (1030, 4)]
    # The clock back: minute 1004 marked after 1030's.
    marks.append((1004, 12, 6, 5))
    minutes = recent_minutes([{keys.RECENT_MARKS: _marks(*marks), **counters(13)}],
                             now=1004 * 60 + 5)
    assert [(m.start // 60, m.decisions) for m in minutes] == [
        (1000, 1), (1003, 2), (1004, 1), (1030, 4)]
    assert recent_minutes([{}], now=0.0) == ()
    # A damaged ring (a counter not a count) is read as none, not a failure.
    broken = bytearray(_marks(*marks))
    struct.pack_into("<I3d", broken, 28 * (1004 % 60), 1004, math.nan, 6, 5)
    assert recent_minutes([{keys.RECENT_MARKS: bytes(broken), **counters(13)}],
                          now=1004 * 60 + 5) == ()
