"""Default rewards, against a real Redis: applied once to every decision whose window
ends without a reward, whatever the number of workers; late rewards change nothing.

Every test audits with a ledger: what the clients were told (applied, late)
and what the decision log says was applied, against the stored statistics.
Windows are the shortest allowed (1 s), so each test waits a second or two.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
from pydantic import SecretStr

from loadtest.faults import redis_process
from loadtest.server import free_port, server_process
from policies import PolicyConfig
from service import keys, shards
from service.domain import ArmSpec, ChooseRequest, Decision, ExperimentSpec, LogEntry
from service.errors import InvalidInput, StoreUnavailable
from service.experiments import ExperimentService
from service.settings import Settings
from service.store import Store
from service.sweeper import Sweeper, Swept
from tests import records
from tests.conftest import ADMIN, ADMIN_TOKEN, Api, key_pattern
from tests.replay import assert_members_stats

pytestmark = pytest.mark.anyio

ARMS = ("a", "b", "c")
WINDOW = 1  # seconds: the shortest window there is
DEFAULT = -0.25


@pytest.fixture
def app_settings(redis_db: str) -> Settings:
    """The tests' settings, with the app's background sweeper as good as off (a first
    tick after 30 s): these tests sweep when they mean to."""
    return Settings(redis_url=redis_db, admin_token=SecretStr(ADMIN_TOKEN),
                    sweep_interval_seconds=60)


def spec(experiment_id: str = "dflt", /, **changes: object) -> ExperimentSpec:
    fields: dict[str, object] = {
        "id": experiment_id, "setting": "covariates", "dim": 3, "seed": 4,
        "arms": tuple(ArmSpec(a) for a in ARMS), "reward_window_seconds": WINDOW,
        "default_reward": DEFAULT, "log_max_entries": 100_000, **changes,
    }
    return ExperimentSpec(**fields)  # type: ignore[arg-type]


def context(rng: np.random.Generator) -> ChooseRequest:
    return ChooseRequest(context=tuple(float(v) for v in rng.normal(size=3)))


async def whole_log(service: ExperimentService, experiment_id: str) -> list[LogEntry]:
    entries: list[LogEntry] = []
    after = None
    while True:
        page, after = await service.read_log(experiment_id, after, limit=50)
        entries += page
        if after is None:
            return entries


async def audit(service: ExperimentService, redis_url: str, experiment_id: str,
                rewarded: dict[str, float], decisions: Sequence[Decision]) -> None:
    """Each decision counted once: its acknowledged reward, else the default; the
    statistics are exactly those of the log's outcomes, in the log's order."""
    view = await service.get(experiment_id)
    log = await whole_log(service, experiment_id)
    outcomes = Counter(e.decision_id for e in log if e.type in ("reward", "default"))
    assert outcomes == Counter(d.decision_id for d in decisions), "not exactly one outcome each"
    for entry in log:
        if entry.type == "reward":
            assert rewarded[entry.decision_id] == entry.reward
        elif entry.type == "default":
            assert entry.decision_id not in rewarded and entry.reward == DEFAULT
    assert (view.decisions, view.rewards, view.defaulted) == (
        len(decisions), len(rewarded), len(decisions) - len(rewarded))
    assert_members_stats(redis_url, experiment_id, PolicyConfig(**view.config),  # type: ignore[arg-type]
                         ARMS, log)


async def until_windows_end() -> None:
    """Sleep until the windows of the decisions made so far are over."""
    await asyncio.sleep(WINDOW + 0.1)


async def test_defaults_are_applied_once_by_two_workers_sweeping_together(
    service: ExperimentService, other_service: ExperimentService, redis_db: str
) -> None:
    rng = np.random.default_rng(1)
    await service.create(spec())
    decisions: list[Decision] = []
    rewarded: dict[str, float] = {}
    for i in range(60):
        d = await (service, other_service)[i % 2].choose("dflt", context(rng))
        decisions.append(d)
        if i % 3 == 0:  # a third rewarded in time
            value = float(rng.normal())
            assert (await service.reward("dflt", [(d.decision_id, value)]))[0].status == "applied"
            rewarded[d.decision_id] = value
    await until_windows_end()

    # Both workers sweep, several times each, at the same moment: every sweep
    # reads the same due entries and races to settle them.
    counts = await asyncio.gather(*(w.sweep() for w in (service, other_service) * 4))

    assert sum(counts) == len(decisions) - len(rewarded)
    assert await service.sweep() == 0  # nothing left to do
    await audit(service, redis_db, "dflt", rewarded, decisions)
    client = redis.Redis.from_url(redis_db)
    try:  # settled: the pending list is empty, every decision sits on the settled list
        assert records.list_length(client, "dflt", keys.pending) == 0
        assert records.list_length(client, "dflt", keys.settled) == len(decisions)
    finally:
        client.close()


async def test_a_default_counts_once_when_two_sweepers_hold_the_same_entries(
    service: ExperimentService, redis_db: str
) -> None:
    """The claim in settle.lua, not the list, makes a default count once: a sweeper that
    read the head before another settled it, and a decision listed twice (as a resent
    decide would list it if the list were not keyed by decision), still count once."""
    rng = np.random.default_rng(2)
    await service.create(spec())
    decisions = [await service.choose("dflt", context(rng)) for _ in range(5)]
    await until_windows_end()
    store = Store.from_url(redis_db, 2.0)
    client = redis.Redis.from_url(redis_db)
    try:
        due, defaulted = 0, [0, 0, 0]
        for member in records.member_ids(client, "dflt"):  # each member settles its own decisions
            first = await store.settle(member, [], 100, 3600)
            assert first is not None
            due += len(first.due)
            if not first.due:
                continue
            # Two sweepers with the same entries, one after the other.
            done = await store.settle(member, first.due, 0, 3600)
            again = await store.settle(member, first.due, 0, 3600)
            assert done is not None and again is not None
            # The same decision entries pushed back onto the list: settled, not counted.
            client.rpush(keys.pending(member), *first.due)
            replay = await store.settle(member, first.due, 0, 3600)
            assert replay is not None
            for i, reply in enumerate((done, again, replay)):
                defaulted[i] += reply.defaulted
        assert due == 5
        assert defaulted == [5, 0, 0]
    finally:
        client.close()
        await store.close()
    await audit(service, redis_db, "dflt", {}, decisions)


@pytest.mark.parametrize("legacy", [False, True], ids=["records", "hashes of an earlier version"])
async def test_a_reward_after_the_window_is_late_and_changes_nothing(
    api: Api, service: ExperimentService, redis_db: str, legacy: bool
) -> None:
    key = await api.create({"id": "late", "setting": "covariates", "dim": 3, "seed": 1,
                            "arms": [{"id": a} for a in ARMS], "reward_window_seconds": WINDOW,
                            "default_reward": DEFAULT})
    body = {"experiment_id": "late", "context": [0.5, -1.0, 2.0]}
    early, late = await api.decide(key, body), await api.decide(key, body)
    if legacy:  # pending when this version started: rewarded, defaulted, late all the same
        client = redis.Redis.from_url(redis_db)
        try:
            for decision_id in (early, late):
                records.make_legacy(client, "late", decision_id)
        finally:
            client.close()
    assert (await api.reward(key, {"experiment_id": "late", "decision_id": early,
                                   "reward": 1.0})).status_code == 200
    await asyncio.sleep(WINDOW + 0.1)

    # Before the sweeper got to it: late already, and nothing changes; its
    # default is still to come.
    before = await api.state("late")
    response = await api.reward(key, {"experiment_id": "late", "decision_id": late,
                                      "reward": 1.0})
    assert response.status_code == 409 and response.json()["status"] == "late"
    assert await api.state("late") == before
    assert await service.sweep() == 1
    # After the default: late again, and a batch says so too. The rewarded
    # decision is still known after its window: a resend is a duplicate.
    batch = await api.reward(key, {"experiment_id": "late", "rewards": [
        {"decision_id": late, "reward": 0.5}, {"decision_id": early, "reward": 1.0}]})
    assert [r["status"] for r in batch.json()["results"]] == ["late", "duplicate"]

    # A decision's late reward counts (and is logged) once, however often it
    # or another value comes again.
    view = await api.experiment("late")
    assert (view["decisions"], view["rewards"], view["defaulted"], view["late"]) == (2, 1, 1, 1)
    assert view["default_reward"] == DEFAULT
    log = await whole_log(service, "late")
    assert [e.type for e in log] == ["decision", "decision", "reward", "late", "default"]
    assert [e.reward for e in log if e.type == "late"] == [1.0]
    outcomes = {e.decision_id: e.reward for e in log if e.type in ("reward", "default")}
    assert outcomes == {early: 1.0, late: DEFAULT}
    assert_members_stats(redis_db, "late", PolicyConfig(**view["config"]), ARMS, log)
    # settled, each keeps what a repeat is checked against, not its context
    client = redis.Redis.from_url(redis_db)
    try:
        if legacy:
            names: list[bytes] = client.hkeys(records.key(client, "late", late))  # type: ignore[assignment]
            assert {n.decode() for n in names} == {"status", "incarnation", "reward", "number",
                                                   "late_reward"}
        else:
            settled = records.read(redis_db, "late", late)
            assert settled is not None and (settled["status"], settled["late"]) == (
                "defaulted", True)
    finally:
        client.close()


async def test_rewards_racing_the_default_count_exactly_one_of_them(
    service: ExperimentService, other_service: ExperimentService, redis_db: str
) -> None:
    """Rewards sent around the end of the window, while both workers sweep: each
    decision gets its reward (before the deadline) or the default (after), never both."""
    rng = np.random.default_rng(3)
    await service.create(spec())
    decisions, made = [], []  # made: when each choose returned (its window began before)
    for _ in range(40):
        decisions.append(await service.choose("dflt", context(rng)))
        made.append(time.monotonic())
    values = {d.decision_id: float(rng.normal()) for d in decisions}

    async def send(d: Decision, at: float) -> tuple[str, str]:
        await asyncio.sleep(at - time.monotonic())
        outcome = await other_service.reward("dflt", [(d.decision_id, values[d.decision_id])])
        return d.decision_id, outcome[0].status

    async def sweep_until(end: float) -> None:
        while time.monotonic() < end:
            await asyncio.gather(service.sweep(), other_service.sweep())
            await asyncio.sleep(0.01)

    # Each reward 0.8 s to 1.4 s after its decision: across its deadline.
    delays = np.linspace(WINDOW - 0.2, WINDOW + 0.4, len(decisions))
    replies, _ = await asyncio.gather(
        asyncio.gather(*(send(d, t + float(delay))
                         for d, t, delay in zip(decisions, made, delays, strict=True))),
        sweep_until(made[-1] + WINDOW + 0.5),
    )
    await service.sweep()

    statuses = dict(replies)
    assert set(statuses.values()) <= {"applied", "late"}
    assert "applied" in statuses.values() and "late" in statuses.values()
    rewarded = {i: values[i] for i, s in statuses.items() if s == "applied"}
    await audit(service, redis_db, "dflt", rewarded, decisions)
    assert (await service.get("dflt")).late == len(decisions) - len(rewarded)


async def test_the_sweeper_recovers_after_a_redis_restart(tmp_path: Path) -> None:
    """Redis is killed before the windows end and comes back after: the background
    sweeper goes on and applies every default once (the pending list is in the AOF)."""
    rng = np.random.default_rng(4)
    with redis_process(tmp_path / "redis", free_port()) as server:
        settings = Settings(redis_url=server.url, sweep_interval_seconds=0.2,
                            redis_timeout_seconds=0.5)
        service = await ExperimentService.open(settings)
        try:
            service.start_sweeper()
            await service.create(spec())
            decisions = [await service.choose("dflt", context(rng)) for _ in range(20)]
            server.kill()
            await asyncio.sleep(WINDOW + 0.5)  # sweeps fail meanwhile
            server.start()
            view = await service.get("dflt")
            for _ in range(100):  # the sweeper's next ticks (0.1-0.3 s apart)
                if view.defaulted == len(decisions):
                    break
                await asyncio.sleep(0.1)
                view = await service.get("dflt")
            assert (view.decisions, view.defaulted, view.defaults_missed) == (20, 20, 0)
            await audit(service, server.url, "dflt", {}, decisions)
        finally:
            await service.close()


async def test_delete_removes_pending_settled_and_logged_decisions(
    api: Api, service: ExperimentService, redis_db: str
) -> None:
    key = await api.create({"id": "gone", "setting": "covariates", "dim": 3,
                            "arms": [{"id": a} for a in ARMS], "reward_window_seconds": WINDOW,
                            "default_reward": 0.0})
    body = {"experiment_id": "gone", "context": [0.5, -1.0, 2.0]}
    first = [await api.decide(key, body) for _ in range(3)]
    await api.reward(key, {"experiment_id": "gone", "decision_id": first[0], "reward": 1.0})
    await asyncio.sleep(WINDOW + 0.1)
    assert await service.sweep() == 2  # settled: kept for late rewards
    await api.decide(key, body)  # pending
    client = redis.Redis.from_url(redis_db)
    try:
        assert records.list_length(client, "gone", keys.settled) == 3
        assert records.list_length(client, "gone", keys.pending) == 1
        assert records.list_length(client, "gone", keys.log) == 7
        assert client.sismember(keys.DEFAULT_REWARD_INDEX, "gone")

        assert (await api.http.delete("/experiments/gone", headers=ADMIN)).status_code == 204

        assert list(client.scan_iter(match=key_pattern("gone"))) == []
        assert not client.sismember(keys.DEFAULT_REWARD_INDEX, "gone")
    finally:
        client.close()
    assert await service.sweep() == 0


async def test_settled_decisions_keep_no_context_and_expire_from_their_list(
    service: ExperimentService, redis_db: str
) -> None:
    """A settled decision keeps its marker (for late rewards) and its time to live, not
    its context; the settled list forgets decisions once they have expired."""
    rng = np.random.default_rng(5)
    await service.create(spec())
    decision = await service.choose("dflt", context(rng))
    await until_windows_end()
    await service.sweep()
    record = records.read(redis_db, "dflt", decision.decision_id)
    assert record is not None
    assert (record["status"], record["number"], float(record["reward"])) == (
        "defaulted", str(decision.decision_number).encode(), DEFAULT)
    assert set(record) == {"status", "late", "incarnation", "number", "reward"}
    client = redis.Redis.from_url(redis_db)
    try:
        record_key = records.key(client, "dflt", decision.decision_id)
        ttl: int = client.ttl(record_key)  # type: ignore[assignment]
        assert WINDOW < ttl <= WINDOW + Settings().default_reward_grace_seconds
        # As if its grace period were over: the next settle call drops it from the list.
        client.delete(record_key)
        settled_list = keys.settled(records.member_of(client, "dflt", decision.decision_id))
        client.lset(settled_list, 0, f"1000.000 {decision.decision_id}")
        count = records.shard_count(client, "dflt")
    finally:
        client.close()
    # The next decision on the same member (a caller's id routes it there).
    same = next(f"later{n}" for n in range(1000) if shards.shard_of(f"later{n}", count)
                == shards.shard_of(decision.decision_id, count))
    later = await service.choose("dflt", dataclasses.replace(context(rng), decision_id=same))
    await until_windows_end()
    await service.sweep()
    client = redis.Redis.from_url(redis_db)
    try:
        entries: list[bytes] = client.lrange(settled_list, 0, -1)  # type: ignore[assignment]
        listed = [e.decode().split(" ")[1] for e in entries]
        assert listed == [later.decision_id]
    finally:
        client.close()


async def test_a_rewarded_decision_waits_a_week_longer_for_its_settle_only_with_a_default(
    service: ExperimentService, redis_db: str
) -> None:
    """reward.lua gives a rewarded decision of an experiment with a default reward seven
    days more to live (settle.lua gives back the time it had), so that after an outage
    longer than the grace period the sweeper finds it rewarded, not gone; without a
    default reward the record keeps the time it had."""
    rng = np.random.default_rng(6)
    week_ms = 7 * 24 * 3600 * 1000
    client = redis.Redis.from_url(redis_db)
    try:
        for experiment_id, default in (("dflt", DEFAULT), ("plain", None)):
            await service.create(spec(experiment_id, default_reward=default,
                                      reward_window_seconds=60))
            decision = await service.choose(experiment_id, context(rng))
            record_key = records.key(client, experiment_id, decision.decision_id)
            before: int = client.pttl(record_key)  # type: ignore[assignment]
            [outcome] = await service.reward(experiment_id, [(decision.decision_id, 1.0)])
            after: int = client.pttl(record_key)  # type: ignore[assignment]
            assert outcome.status == "applied"
            record = records.read(redis_db, experiment_id, decision.decision_id)
            assert record is not None and record["status"] == "rewarded"
            longer = week_ms if default is not None else 0
            # The two reads are moments apart: the record's clock ran on between them.
            assert before + longer - 5_000 < after <= before + longer, (experiment_id, before,
                                                                        after)
    finally:
        client.close()


async def test_a_decision_that_expired_unsettled_is_counted_as_missed(
    service: ExperimentService, redis_db: str
) -> None:
    rng = np.random.default_rng(6)
    await service.create(spec())
    decisions = [await service.choose("dflt", context(rng)) for _ in range(3)]
    client = redis.Redis.from_url(redis_db)
    try:  # as if the service had been stopped for longer than the grace period
        client.delete(records.key(client, "dflt", decisions[1].decision_id))
    finally:
        client.close()
    await until_windows_end()
    assert await service.sweep() == 2
    view = await service.get("dflt")
    assert (view.defaulted, view.defaults_missed) == (2, 1)


async def test_a_damaged_decision_is_counted_missed_and_the_later_ones_get_their_default(
    service: ExperimentService, redis_db: str
) -> None:
    """A pending decision whose record is damaged (here its number) cannot be given the
    default. settle.lua refused its whole call for it, so every sweep failed for as long
    as its entry headed the pending list and no later decision got its default; now it
    is counted missed, its record left as it is, and the others are settled."""
    rng = np.random.default_rng(7)
    await service.create(spec())
    decisions = [await service.choose("dflt", context(rng)) for _ in range(3)]
    client = redis.Redis.from_url(redis_db)
    try:
        key = records.key(client, "dflt", decisions[0].decision_id)
        raw: bytes = client.get(key)  # type: ignore[assignment]
        head, _, rest = raw.split(b"\n", 2)
        damaged = b"\n".join((head, b"seven", rest))
        client.set(key, damaged, keepttl=True)
        await until_windows_end()
        assert await service.sweep() == 2
        assert client.get(key) == damaged
    finally:
        client.close()
    view = await service.get("dflt")
    assert (view.defaulted, view.defaults_missed) == (2, 1)
    assert await service.sweep() == 0  # its entry went with the others'
    assert (await service.get("dflt")).defaults_missed == 1


async def test_an_experiment_key_of_another_type_holds_the_defaults_back_losing_none(
    service: ExperimentService, redis_db: str
) -> None:
    """The outcomes string left holding another type (by hand): settle.lua refuses before
    it writes (a write there failed it after the decisions were marked defaulted, their
    outcomes lost), so no default is applied; once the key is mended, every decision
    gets its default, once."""
    rng = np.random.default_rng(8)
    await service.create(spec())
    decisions = [await service.choose("dflt", context(rng)) for _ in range(3)]
    client = redis.Redis.from_url(redis_db)
    try:
        names = [keys.outcomes(member) for member in records.member_ids(client, "dflt")]
        kept: list[bytes | None] = [client.dump(name) for name in names]  # type: ignore[misc]
        for name in names:  # (each member's, when the tests shard every experiment)
            client.delete(name)
            client.sadd(name, "x")
        await until_windows_end()
        assert await service.sweep() == 0  # refused: logged, the other experiments go on
        for decision in decisions:
            record = records.read(redis_db, "dflt", decision.decision_id)
            assert record is not None and record["status"] == "pending"
        for name, dumped in zip(names, kept, strict=True):
            client.delete(name)
            if dumped is not None:
                client.restore(name, 0, dumped)
    finally:
        client.close()
    assert await service.sweep() == 3
    view = await service.get("dflt")
    assert (view.defaulted, view.defaults_missed) == (3, 0)


@pytest.mark.parametrize("both_due", [False, True])
async def test_a_callers_id_used_again_after_its_decision_expired_unsettled_waits_its_window(
    service: ExperimentService, redis_db: str, both_due: bool
) -> None:
    """The pending list still holds the expired decision's entry (the sweepers stopped for
    longer than the grace period); the new decision under the same id must not get the
    default from it, early, which would make its reward within its window late."""
    rng = np.random.default_rng(9)
    await service.create(spec())
    request = dataclasses.replace(context(rng), decision_id="again")
    old = await service.choose("dflt", request)
    client = redis.Redis.from_url(redis_db)
    try:  # its record and its request expired, unsettled
        member = records.member_of(client, "dflt", old.decision_id)
        client.delete(records.key(client, "dflt", old.decision_id),
                      keys.request(member, old.decision_id))
    finally:
        client.close()
    await until_windows_end()
    new = await service.choose("dflt", dataclasses.replace(context(rng), decision_id="again"))
    assert new.decision_number != old.decision_number
    if both_due:  # both entries due in one sweep: the new decision gets its default once
        await until_windows_end()
        assert await service.sweep() == 1
        view = await service.get("dflt")
        assert (view.defaulted, view.defaults_missed) == (1, 1)
        return
    assert await service.sweep() == 0
    view = await service.get("dflt")
    assert (view.defaulted, view.defaults_missed) == (0, 1)
    [outcome] = await service.reward("dflt", [("again", 0.5)])
    assert outcome.status == "applied"
    await until_windows_end()
    assert await service.sweep() == 0  # its own entry: rewarded, nothing to apply
    view = await service.get("dflt")
    assert (view.rewards, view.defaulted, view.defaults_missed) == (1, 0, 1)
    assert view.rewards + view.defaulted + view.defaults_missed == view.decisions


async def test_decisions_of_an_outage_longer_than_the_grace_period_are_all_counted_missed(
    app_settings: Settings,
) -> None:
    # The records expire one grace period after their window; the list of
    # pending decisions must not, or the sweeper never learns they existed.
    service = await ExperimentService.open(
        app_settings.model_copy(update={"default_reward_grace_seconds": 1}))
    try:
        rng = np.random.default_rng(8)
        await service.create(spec())
        made = [await service.choose("dflt", context(rng)) for _ in range(3)]
        # Issue 25: one of them rewarded in time, which the counters must not count
        # among the defaults missed: rewards + defaulted + missed = decisions.
        assert (await service.reward("dflt", [(made[0].decision_id, 0.5)]))[0].status == \
            "applied"
        await asyncio.sleep(WINDOW + 1 + 1.5)  # no sweep meanwhile: as if every worker were down
        await service.sweep()
        view = await service.get("dflt")
        assert (view.rewards, view.defaulted, view.defaults_missed) == (1, 0, 2)
        assert view.rewards + view.defaulted + view.defaults_missed == view.decisions
        # The rewarded decision, its grace period over, is gone rather than kept.
        client = redis.Redis.from_url(app_settings.redis_url or "")
        try:
            assert not client.exists(keys.decision("dflt", made[0].decision_id))
            assert client.llen(keys.pending("dflt")) == 0
        finally:
            client.close()
    finally:
        await service.close()


@pytest.mark.slow
async def test_two_serve_processes_apply_each_default_once_within_five_seconds(
    redis_db: str,
) -> None:
    """Two ``linreboot serve`` replicas, each with its background sweeper, on one Redis."""
    env = {"LINREBOOT_REDIS_URL": redis_db, "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN,
           "LINREBOOT_LOG_LEVEL": "warning"}
    with server_process(env) as first, server_process(env) as second:
        async with httpx.AsyncClient(timeout=30.0) as http:
            created = await http.post(f"{first}/experiments", headers=ADMIN, json={
                "id": "two", "setting": "covariates", "dim": 3, "seed": 2,
                "arms": [{"id": a} for a in ARMS], "reward_window_seconds": WINDOW,
                "default_reward": DEFAULT})
            assert created.status_code == 201, created.text
            api_key = {"X-API-Key": created.json()["api_key"]}
            rewarded = 0
            for i in range(40):
                url = (first, second)[i % 2]
                chosen = await http.post(f"{url}/choose", headers=api_key, json={
                    "experiment_id": "two", "context": [0.1 * i, -1.0, 2.0]})
                assert chosen.status_code == 200
                if i % 4 == 0:
                    reply = await http.post(f"{url}/reward", headers=api_key, json={
                        "experiment_id": "two", "decision_id": chosen.json()["decision_id"],
                        "reward": 1.0})
                    assert reply.json()["status"] == "applied"
                    rewarded += 1
            view = (await http.get(f"{first}/experiments/two", headers=ADMIN)).json()
            for _ in range(80):  # the bound below, and more
                if view["defaulted"] >= 40 - rewarded:
                    break
                await asyncio.sleep(0.1)
                view = (await http.get(f"{second}/experiments/two", headers=ADMIN)).json()
            log = (await http.get(f"{first}/experiments/two/log?limit=1000",
                                  headers=ADMIN)).json()["entries"]
    assert (view["decisions"], view["rewards"], view["defaulted"]) == (40, rewarded, 40 - rewarded)
    made = {e["decision_id"]: e["time"] for e in log if e["type"] == "decision"}
    defaults = [e for e in log if e["type"] == "default"]
    assert len(defaults) == len({e["decision_id"] for e in defaults}) == 40 - rewarded
    # The bound: a default lands within 5 s of the end of its window
    # (the sweepers tick every 0.5-1.5 s; the log's times are Redis's clock, to the ms).
    delays = [e["time"] - (made[e["decision_id"]] + WINDOW) for e in defaults]
    assert min(delays) >= -0.002 and max(delays) <= 5.0, delays


@pytest.mark.parametrize("changes", [
    {"default_reward": math.nan}, {"default_reward": math.inf}, {"default_reward": 1e7},
    {"log_max_entries": -1}, {"log_max_age_seconds": 0},
])
async def test_a_bad_default_reward_or_log_bound_is_refused_in_process(
    service: ExperimentService, changes: dict[str, float],
) -> None:
    with pytest.raises(InvalidInput):
        await service.create(spec(**changes))
    assert await service.list() == ([], None)


async def test_an_experiment_created_again_without_a_default_is_left_alone(
    service: ExperimentService, redis_db: str
) -> None:
    """A sweeper that still lists the id (a DELETE that stopped half-way) settles nothing
    of an experiment that has no default reward now."""
    rng = np.random.default_rng(7)
    await service.create(spec())
    await service.delete("dflt")
    await service.create(spec(default_reward=None))
    decision = await service.choose("dflt", context(rng))
    client = redis.Redis.from_url(redis_db)
    try:
        client.sadd(keys.DEFAULT_REWARD_INDEX, "dflt")
    finally:
        client.close()
    await until_windows_end()
    store = Store.from_url(redis_db, 2.0)
    try:  # nothing to settle: not even a due entry to try
        assert await store.settle("dflt", [], 100, 3600) is None
    finally:
        await store.close()
    assert await service.sweep() == 0
    view = await service.get("dflt")
    assert (view.defaulted, view.decisions) == (0, 1)
    assert (await service.reward("dflt", [(decision.decision_id, 1.0)]))[0].status == "not_found"


class _SwallowingSweeper(Sweeper):
    """A sweep whose Redis client turns the task's cancellation into a connection error."""

    async def sweep(self) -> Swept:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise StoreUnavailable("connection lost") from None
        return Swept(experiments=0)


async def test_stop_ends_the_sweeper_even_if_a_sweep_swallows_the_cancellation() -> None:
    """Before, the loop caught the StoreUnavailable and slept again: stop() (and the event
    loop's shutdown, which cancels every task and waits) never returned."""
    sweeper = _SwallowingSweeper(store=None, interval=0.001)  # type: ignore[arg-type]
    sweeper.start()
    await asyncio.sleep(0.05)  # inside the sweep
    await asyncio.wait_for(sweeper.stop(), timeout=5)


@pytest.mark.parametrize("sweeper", ["same worker", "other worker"])
async def test_decisions_after_defaults_are_those_after_equal_rewards(
    service: ExperimentService, other_service: ExperimentService, sweeper: str
) -> None:
    """Issue 25: a default changes the statistics as a reward does, so it makes every
    view stale as a reward does. Two seeded experiments with the same arms: in one,
    rounds of decisions end in the default (5) for each; in the other each is rewarded
    5. Decision n draws from the same seed in both, so every decision (arm,
    propensity, index) and what its log entry says it saw must be the same; before the
    fix the first experiment kept deciding from a view without the defaults. (The ids
    are the caller's, the same in both: sharded, each decision then goes to the same
    member, numbered the same, in both.)"""
    arms = (ArmSpec("x", (1.0, 0.0)), ArmSpec("y", (0.0, 1.0)))
    for name, default in (("defaults", 5.0), ("rewards", None)):
        await service.create(ExperimentSpec(
            id=name, setting="stochastic", dim=2, arms=arms, policy="greedy", seed=7,
            reward_window_seconds=WINDOW, log_max_entries=1000, default_reward=default))
    sweeping = service if sweeper == "same worker" else other_service
    seen: dict[str, list[tuple[str, float | None, float | None]]] = {"defaults": [], "rewards": []}
    for round_ in range(4):
        made = {name: [await service.choose(name, ChooseRequest(decision_id=f"d{round_}-{i}"))
                       for i in range(4)]
                for name in seen}
        for name, decisions in made.items():
            seen[name] += [(d.arm_id, d.propensity, d.index) for d in decisions]
        await service.reward("rewards", [(d.decision_id, 5.0) for d in made["rewards"]])
        await until_windows_end()
        assert await sweeping.sweep() == 4
    assert seen["defaults"] == seen["rewards"]
    assert len({arm for arm, _, _ in seen["defaults"][4:]}) >= 1
    counted = [await service.get(name) for name in seen]
    assert [(v.rewards, v.defaulted, v.decisions) for v in counted] == [(0, 16, 16),
                                                                         (16, 0, 16)]
    logs = {name: [e.rewards_seen for e in await whole_log(service, name)
                   if e.type == "decision"] for name in seen}
    assert logs["defaults"] == logs["rewards"]
    if counted[0].spec.shards == 1:  # (sharded, each member counts its own outcomes)
        assert logs["defaults"] == [0] * 4 + [4] * 4 + [8] * 4 + [12] * 4
