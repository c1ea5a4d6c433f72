"""An experiment's last hour, minute by minute (recent.lua, ExperimentView.recent): the
decisions, rewards and default rewards each script counts add up to the experiment's
counters, on one member or several; a minute's field is begun afresh when it comes
round an hour later, and one an hour old is never shown. ``/ui``'s list shows them."""

from __future__ import annotations

import asyncio
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


@pytest.mark.unsharded  # (it writes the home's minute fields)
async def test_a_minutes_field_is_begun_afresh_and_an_hour_old_one_is_not_shown(
        api: Api, redis_db: str) -> None:
    key = await api.create({"id": "act", "setting": "covariates", "dim": 2, "seed": 4,
                            "arms": [{"id": "a"}, {"id": "b"}], "shards": 1})
    client = redis.Redis.from_url(redis_db)
    try:
        minute, into = _minute_of(client)
        if into > 50:  # not across a minute's end: the fields below are this minute's
            await asyncio.sleep(61 - into)
            minute, _ = _minute_of(client)
        stats = keys.stats(shards.member("act", 0))
        def ring(*slots: tuple[int, int, int, int]) -> bytes:
            """recent.lua's field with these (minute, decisions, rewards, defaults)."""
            packed = bytearray(16 * 60)
            for slot in slots:
                struct.pack_into("<4I", packed, 16 * (slot[0] % 60), *slot)
            return bytes(packed)

        client.hset(stats, mapping={"recent": ring(
            (minute - 60, 7, 7, 7),  # this minute's slot, an hour ago
            (minute - 61, 9, 9, 9),  # an hour and a minute ago
            (minute - 2, 5, 4, 1))})  # two minutes ago
        await api.decide(key, {"experiment_id": "act", "context": [0.1, 0.2]})
        now = client.hget(stats, "recent")
        assert now == ring((minute, 1, 0, 0), (minute - 61, 9, 9, 9), (minute - 2, 5, 4, 1))
    finally:
        client.close()
    recent = (await api.http.get("/experiments/act", headers=ADMIN)).json()["recent"]
    assert recent == [
        {"minute": 60 * (minute - 2), "decisions": 5, "rewards": 4, "defaulted": 1},
        {"minute": 60 * minute, "decisions": 1, "rewards": 0, "defaulted": 0}]


def test_the_minutes_are_redis_s_should_its_clock_run_ahead() -> None:
    """A ring whose newest minute is ahead of this clock's is read by that minute (none
    lost), and a member without a ring adds nothing."""
    from service.lifecycle import recent_minutes

    ring = bytearray(16 * 60)
    for minute, counts in ((1000, (1, 1, 0)), (1003, (2, 0, 0)), (942, (5, 5, 5))):
        struct.pack_into("<4I", ring, 16 * (minute % 60), minute, *counts)
    minutes = recent_minutes([{"recent": bytes(ring)}, {}], now=1001 * 60 + 5)
    assert [(m.start // 60, m.decisions) for m in minutes] == [(1000, 1), (1003, 2)]
    # A slot stamped far ahead (a clock since set back) does not hide the hour.
    struct.pack_into("<4I", ring, 16 * (1030 % 60), 1030, 4, 0, 0)
    minutes = recent_minutes([{"recent": bytes(ring)}], now=1001 * 60 + 5)
    assert [m.start // 60 for m in minutes] == [1000, 1003, 1030]
    assert recent_minutes([{}], now=0.0) == ()
