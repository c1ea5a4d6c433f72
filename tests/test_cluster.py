"""The service on a real Redis Cluster: 3 masters and a replica (tests/cluster.py).

The API tests of test_app_api.py run here again on the cluster, where their
experiments ``cov``, ``sto`` and ``ctx`` live on the three masters; then what
is the cluster's own: starting against any node, readiness and persistence
over every primary, deletion across nodes, and a slot migrating under load.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from fastapi import FastAPI
from pydantic import SecretStr
from redis.cluster import RedisCluster
from redis.crc import key_slot

import tests.test_app_api as api_tests
from app.main import create_app
from policies import PolicyConfig
from service import keys
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec
from service.experiments import ExperimentService
from service.settings import Settings
from service.store import Store
from tests import records
from tests.cluster import LocalCluster, id_on, local_cluster
from tests.conftest import ADMIN, ADMIN_TOKEN, CONTEXTUAL, COVARIATES, STOCHASTIC, Api
from tests.test_service_durability import (
    _LEGACY_RECIPES,
    _legacy_blob,
    _unpacked,
    assert_stats_equal,
    drop_outcomes,
    stats_with_unfolded,
)

pytestmark = pytest.mark.anyio

# The API tests, collected again in this module, where the fixtures below put
# them on the cluster. Left out: those that read Redis through a plain client
# (redis_db), which sees one node of a cluster; deletion has its own test here.
for _name, _test in list(vars(api_tests).items()):
    if (_name.startswith("test_") and inspect.iscoroutinefunction(_test)
            and "redis_db" not in inspect.signature(_test).parameters):
        globals()[_name] = _test

COV_CONTEXT = {"experiment_id": "cov", "context": [0.5, -0.2, 1.0]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("cluster")) as started:
        yield started


@pytest.fixture
def redis_db(cluster: LocalCluster) -> str:
    """The cluster, emptied, through its first master (the app finds the others)."""
    cluster.flush()
    return cluster.url


def _settings(url: str) -> Settings:
    return Settings(redis_url=url, admin_token=SecretStr(ADMIN_TOKEN))


def test_the_api_tests_experiments_live_on_three_masters(cluster: LocalCluster) -> None:
    owners = [cluster.owner(f"lrb:{{{spec['id']}}}:meta")
              for spec in (COVARIATES, STOCHASTIC, CONTEXTUAL)]
    assert sorted(owners) == sorted(cluster.masters)
    assert "test_choose_in_every_setting" in globals()  # the API tests were collected


@pytest.mark.parametrize("node", ["master-1", "master-2", "master-3", "replica"])
async def test_the_service_starts_against_any_node_and_serves_every_experiment(
    cluster: LocalCluster, redis_db: str, node: str
) -> None:
    """Detected as a cluster (no setting), from any node; every route on every master."""
    port = cluster.replica if node == "replica" else cluster.masters[int(node[-1]) - 1]
    app = create_app(_settings(cluster.url_of(port)))
    async with app.router.lifespan_context(app):
        assert app.state.service.store_is_cluster
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            api = Api(http)
            ids = [id_on(cluster, master, "exp") for master in cluster.masters]
            for experiment_id in ids:
                await _use_every_route(api, experiment_id)
            assert await api.ids() == sorted(ids)
            assert (await http.get("/readyz")).status_code == 200
            for experiment_id in ids:
                deleted = await http.delete(f"/experiments/{experiment_id}", headers=ADMIN)
                assert deleted.status_code == 204
            assert await api.ids() == []
    assert cluster.keys() == 0


async def test_a_masters_calls_wait_for_its_batch_in_flight_and_only_for_it(
    cluster: LocalCluster, redis_db: str
) -> None:
    """Each master has its lane, one batch in flight at a time: rewards made turn after
    turn while their master's batch is stalled go after it as one script call (not one
    call each), and a decision on another master, made in the same turn as one of them,
    is answered meanwhile (it waited for the stalled master when a batch spanned both)."""
    slow, quick = cluster.masters[1], cluster.masters[2]
    slow_id = id_on(cluster, slow, "slow")
    quick_id = id_on(cluster, quick, "quick", [slow_id])
    service = await ExperimentService.open(_settings(cluster.url))
    node = cluster.node(slow)
    try:
        api_keys = {}
        for experiment_id in (slow_id, quick_id):
            _, api_keys[experiment_id] = await service.create(ExperimentSpec(
                id=experiment_id, setting="stochastic", dim=2,
                arms=(ArmSpec("a", (1.0, 0.0)), ArmSpec("b", (0.0, 1.0)))))
        key = api_keys[slow_id]
        made = [await service.choose(slow_id, ChooseRequest(), key) for _ in range(10)]
        await service.choose(quick_id, ChooseRequest(), api_keys[quick_id])
        unknown = await service.reward(slow_id, [("0" * 32, 0.0)], key)  # loads the script
        assert unknown[0].status == "not_found"
        node.config_resetstat()
        node.execute_command("CLIENT", "PAUSE", 1500, "ALL")  # (the deadline is 2 s)
        rewards = []
        for decision in made[:9]:  # a turn each: the first sent and stalled, the rest queued
            rewards.append(asyncio.ensure_future(
                service.reward(slow_id, [(decision.decision_id, 1.0)], key)))
            await asyncio.sleep(0.005)
        # A decision on the other master in the same turn as one more reward of the
        # stalled one: answered at once, not with the stalled master's batch.
        started = asyncio.get_running_loop().time()
        rewards.append(asyncio.ensure_future(
            service.reward(slow_id, [(made[9].decision_id, 1.0)], key)))
        await service.choose(quick_id, ChooseRequest(), api_keys[quick_id])
        assert asyncio.get_running_loop().time() - started < 0.6  # not behind the pause
        assert not rewards[0].done()  # the stalled batch is still stalled
        assert not any(reward.done() for reward in rewards)
        outcomes = await asyncio.gather(*rewards)
        assert [outcome[0].status for outcome in outcomes] == ["applied"] * 10
        stats: dict[str, Any] = node.info("commandstats")  # type: ignore[assignment]
        assert stats["cmdstat_evalsha"]["calls"] == 2  # the stalled one, then the rest
    finally:
        node.execute_command("CLIENT", "UNPAUSE")
        node.close()
        await service.close()


async def test_a_decision_made_while_its_workers_reward_is_in_flight_is_made_once(
    cluster: LocalCluster, redis_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a single Redis: a decision made while its worker's reward to the experiment
    is in flight on the master's lane waits for the reply and decides from it, rather
    than go after it from a view without it and be made again."""
    seen: list[Any] = []
    decide = Store.decide

    async def counted(self: Store, *args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["seen"])
        return await decide(self, *args, **kwargs)

    monkeypatch.setattr(Store, "decide", counted)
    experiment_id = id_on(cluster, cluster.masters[1], "fly")
    service = await ExperimentService.open(_settings(cluster.url))
    try:
        _, key = await service.create(ExperimentSpec(
            id=experiment_id, setting="stochastic", dim=2,
            arms=(ArmSpec("a", (1.0, 0.0)), ArmSpec("b", (0.0, 1.0)))))
        made = await service.choose(experiment_id, ChooseRequest(), key)
        unknown = await service.reward(experiment_id, [("0" * 32, 0.0)], key)  # loads it
        assert unknown[0].status == "not_found"
        seen.clear()
        rewarding = asyncio.ensure_future(
            service.reward(experiment_id, [(made.decision_id, 1.0)], key))
        for _ in range(100):
            await asyncio.sleep(0)
            if service._store.batch_in_flight:
                break
        assert service._store.batch_in_flight
        await service.choose(experiment_id, ChooseRequest(), key)
        assert (await rewarding)[0].status == "applied"
        assert len(seen) == 1 and seen[0] is not None  # made once, at its first attempt
    finally:
        await service.close()


async def _use_every_route(api: Api, experiment_id: str) -> None:
    key = await api.create({**COVARIATES, "id": experiment_id})
    again = await api.http.post("/experiments", json={**COVARIATES, "id": experiment_id},
                                headers=ADMIN)
    assert again.status_code == 409
    context = {**COV_CONTEXT, "experiment_id": experiment_id}
    decisions = [await api.decide(key, context) for _ in range(3)]
    batch = [{"decision_id": d, "reward": 1.0} for d in decisions[1:]]
    single = await api.reward(key, {"experiment_id": experiment_id,
                                    "decision_id": decisions[0], "reward": 0.5})
    assert single.json()["status"] == "applied"
    many = await api.reward(key, {"experiment_id": experiment_id, "rewards": batch})
    assert [r["status"] for r in many.json()["results"]] == ["applied", "applied"]
    arms = f"/experiments/{experiment_id}/arms"
    assert (await api.http.post(arms, json={"arms": [{"id": "c"}]},
                                headers=ADMIN)).status_code == 200
    retired = await api.http.post(f"{arms}/retire", json={"arm_ids": ["c"]}, headers=ADMIN)
    assert retired.status_code == 200
    view = await api.experiment(experiment_id)
    assert (view["decisions"], view["rewards"]) == (3, 3)
    log = await api.http.get(f"/experiments/{experiment_id}/log", headers=ADMIN)
    assert log.status_code == 200
    assert len(log.json()["entries"]) == 6  # three decisions, three rewards


async def test_a_setting_that_says_cluster_for_a_single_redis_is_one_line(
    redis_url_single: str,
) -> None:
    from service.errors import StartupError

    with pytest.raises(StartupError, match=r"^LINREBOOT_REDIS_CLUSTER: .*not a Redis Cluster"):
        await ExperimentService.open(
            Settings(redis_url=redis_url_single, redis_cluster=True,
                     admin_token=SecretStr(ADMIN_TOKEN)))


@pytest.fixture
def redis_url_single(redis_url: str) -> str:
    """The session's single Redis (conftest), not the cluster."""
    return redis_url


async def test_delete_removes_the_experiments_keys_on_every_node(
    cluster: LocalCluster, redis_db: str, api: Api
) -> None:
    ids = [id_on(cluster, master, "del") for master in cluster.masters]
    for experiment_id in ids:
        key = await api.create({**COVARIATES, "id": experiment_id})
        context = {**COV_CONTEXT, "experiment_id": experiment_id}
        decision = await api.decide(key, context)
        await api.decide(key, context)
        await api.reward(key, {"experiment_id": experiment_id, "decision_id": decision,
                               "reward": 1.0})
    for experiment_id in ids:
        assert (await api.http.delete(f"/experiments/{experiment_id}",
                                      headers=ADMIN)).status_code == 204
    assert cluster.keys() == 0  # decisions and index entries included


async def test_readiness_and_persistence_warnings_ask_every_primary(
    cluster: LocalCluster, redis_db: str
) -> None:
    """One primary out of memory: not ready; one without AOF: a warning naming it."""
    last = cluster.node(cluster.masters[2])
    try:
        last.config_set("appendonly", "no")
        service = await ExperimentService.open(_settings(redis_db))
        try:
            warnings = service.persistence_warnings
            assert len(warnings) == 1
            assert f"127.0.0.1:{cluster.masters[2]}" in warnings[0]
            assert "appendonly" in warnings[0]
            await service.ready()
            for port in cluster.masters:
                cluster.node(port).config_set("maxmemory", "1")
                with pytest.raises(Exception, match="out of memory"):
                    await service.ready()
                cluster.node(port).config_set("maxmemory", "0")
            await service.ready()
        finally:
            await service.close()
    finally:
        last.config_set("appendonly", "yes")
        for port in cluster.masters:
            cluster.node(port).config_set("maxmemory", "0")


# -- a slot migrating ----------------------------------------------------------


async def _begin_migration(cluster: LocalCluster, slot: int, source: int, target: int) -> None:
    target_node, source_node = _node(cluster, target), _node(cluster, source)
    await target_node.execute_command("CLUSTER SETSLOT", slot, "IMPORTING",
                                      cluster.node_id(source))
    await source_node.execute_command("CLUSTER SETSLOT", slot, "MIGRATING",
                                      cluster.node_id(target))
    await target_node.aclose()
    await source_node.aclose()


async def _move_keys(cluster: LocalCluster, slot: int, source: int, target: int,
                     pause: float) -> int:
    """MIGRATE the slot's keys one at a time, ``pause`` seconds apart; how many."""
    source_node = _node(cluster, source)
    moved = 0
    try:
        while found := await source_node.execute_command("CLUSTER GETKEYSINSLOT", slot, 1):
            await source_node.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000,
                                              "KEYS", *found)
            moved += len(found)
            await asyncio.sleep(pause)
    finally:
        await source_node.aclose()
    return moved


async def _end_migration(cluster: LocalCluster, slot: int, owner: int) -> None:
    """The slot is ``owner``'s, on every master (the owner first, as redis-cli does),
    and stable (SETSLOT NODE leaves a source that keeps the slot migrating)."""
    owner_id = cluster.node_id(owner)
    for port in sorted(cluster.masters, key=lambda p: p != owner):
        node = _node(cluster, port)
        await node.execute_command("CLUSTER SETSLOT", slot, "NODE", owner_id)
        await node.execute_command("CLUSTER SETSLOT", slot, "STABLE")
        await node.aclose()


def _node(cluster: LocalCluster, port: int) -> aioredis.Redis:
    return aioredis.Redis(host="127.0.0.1", port=port)


@pytest.fixture
async def cluster_app(cluster: LocalCluster, redis_db: str) -> AsyncIterator[FastAPI]:
    app = create_app(_settings(redis_db))
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def cluster_api(cluster_app: FastAPI) -> AsyncIterator[Api]:
    transport = httpx.ASGITransport(app=cluster_app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield Api(http)


@pytest.mark.unsharded  # (it migrates the home's slot only)
async def test_a_slot_in_migration_answers_503_with_retry_after_then_recovers(
    cluster: LocalCluster, cluster_api: Api
) -> None:
    """TRYAGAIN (a decision's new key while its slot migrates) is 503, not 500;
    reads of keys still on the source are served; the slot stable again, all is 200."""
    key = await cluster_api.create(COVARIATES)
    decision = await cluster_api.decide(key, COV_CONTEXT)
    slot = key_slot(b"lrb:{cov}:meta")
    source = cluster.owner("lrb:{cov}:meta")
    target = next(p for p in cluster.masters if p != source)
    await _begin_migration(cluster, slot, source, target)
    try:
        refused = await cluster_api.choose(key, COV_CONTEXT)
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["error"] == "store_unavailable"
        assert (await cluster_api.experiment("cov"))["decisions"] == 1
        rewarded = await cluster_api.reward(key, {"experiment_id": "cov",
                                                  "decision_id": decision, "reward": 1.0})
        assert rewarded.status_code == 200
    finally:
        await _end_migration(cluster, slot, source)  # nothing moved: back to the source
    assert (await cluster_api.choose(key, COV_CONTEXT)).status_code == 200
    assert (await cluster_api.experiment("cov"))["rewards"] == 1
    assert (await cluster_api.experiment("cov"))["rewards"] == 1


@pytest.mark.unsharded  # (it migrates the home's slot only)
async def test_a_live_experiment_migrates_during_a_replay_exactly_once(
    cluster: LocalCluster, cluster_api: Api
) -> None:
    """A choose/reward replay, the experiment's slot moved to another master midway.

    The ledger records every decision the service confirmed (200) and the
    reward each was given once confirmed (retried on 503 until 200). In the
    end the statistics count each of them once (0 lost, 0 counted twice),
    per arm; only 200 and 503 were answered; and after the migration every
    request succeeds at once, served by the new owner.
    """
    key = await cluster_api.create(COVARIATES)
    slot = key_slot(b"lrb:{cov}:meta")
    source = cluster.owner("lrb:{cov}:meta")
    target = next(p for p in cluster.masters if p != source)
    statuses: list[int] = []
    ledger: dict[str, tuple[str, float]] = {}  # decision id -> (arm, reward)
    counter = itertools.count()

    async def confirmed(send: Any) -> httpx.Response:
        while True:
            response = await send()
            statuses.append(response.status_code)
            if response.status_code == 200:
                return response
            assert response.status_code == 503, response.text
            assert response.headers["Retry-After"] == "1"
            await asyncio.sleep(0.01)

    async def pair() -> None:
        n = next(counter)
        context = {"experiment_id": "cov", "context": [n % 3 - 1.0, 0.5, 1.0]}
        chosen = (await confirmed(lambda: cluster_api.choose(key, context))).json()
        reward = float(n % 4)  # small integers: the sums are exact
        body = {"experiment_id": "cov", "decision_id": chosen["decision_id"], "reward": reward}
        result = (await confirmed(lambda: cluster_api.reward(key, body))).json()
        # A reward whose 503 hid an applied one is confirmed as a duplicate.
        assert result["status"] in {"applied", "duplicate"}
        ledger[chosen["decision_id"]] = (chosen["arm_id"], reward)

    async def replay(pairs: int, concurrency: int) -> None:
        for _ in range(pairs // concurrency):
            await asyncio.gather(*(pair() for _ in range(concurrency)))

    await replay(40, 8)  # before
    await _begin_migration(cluster, slot, source, target)
    during = asyncio.ensure_future(replay(400, 8))
    moved = await _move_keys(cluster, slot, source, target, pause=0.005)
    await _end_migration(cluster, slot, target)
    await during
    assert moved >= 40  # meta, arms, stats, log, pending list and the decisions
    assert cluster.owner("lrb:{cov}:meta") == target
    assert 503 in statuses  # the replay did meet the migration
    assert set(statuses) == {200, 503}

    statuses.clear()
    await replay(40, 8)  # after: served by the new owner at once
    assert set(statuses) == {200}

    view = await cluster_api.experiment("cov")
    assert view["rewards"] == len(ledger) == 480
    for arm in view["arms"]:
        mine = [reward for chosen, reward in ledger.values() if chosen == arm["id"]]
        assert arm["pulls"] == len(mine)
        if mine:
            assert arm["mean_reward"] * len(mine) == pytest.approx(sum(mine), abs=1e-9)
    plain = redis.Redis(host="127.0.0.1", port=target)
    try:
        assert plain.exists("lrb:{cov}:meta") == 1  # the experiment is on the target now
    finally:
        plain.close()


def _stats(client: RedisCluster, experiment_id: str) -> dict[str, bytes]:
    return stats_with_unfolded(client, experiment_id)


async def test_the_start_up_upgrade_reaches_experiments_on_every_master(
    cluster: LocalCluster, redis_db: str
) -> None:
    """What an earlier version stored (raw sums, old recipes, pending decisions without
    field names), on all three masters: one worker upgrades every experiment, its
    sums are the same, and each pending decision (found by SCAN on its own master)
    still takes its reward."""
    settings = _settings(redis_db)
    ids = [id_on(cluster, master, "old") for master in cluster.masters]
    service = await ExperimentService.open(settings)
    pending: dict[str, tuple[str, str]] = {}
    try:
        for experiment_id in ids:
            _, key = await service.create(ExperimentSpec(
                id=experiment_id, setting="covariates", dim=3,
                arms=(ArmSpec("a"), ArmSpec("b")), seed=2))
            for context in ((1.0, 0.5, -0.25), (0.5, 2.0, 1.0), (-1.0, 0.0, 3.0)):
                decision = await service.choose(experiment_id, ChooseRequest(context=context),
                                                key)
                await service.reward(experiment_id, [(decision.decision_id, sum(context))], key)
            waiting = await service.choose(experiment_id, ChooseRequest(context=(0.2, 0.4, 1.0)),
                                           key)
            pending[experiment_id] = (key, waiting.decision_id)
        config = PolicyConfig(**(await service.get(ids[0])).config)  # type: ignore[arg-type]
    finally:
        await service.close()

    client = RedisCluster.from_url(redis_db)
    try:
        current = {e: _stats(client, e) for e in ids}
        for experiment_id in ids:  # as the version that stored raw sums left them
            client.hset(keys.meta(experiment_id), mapping=_LEGACY_RECIPES["raw sums"])
            records.make_legacy(client, experiment_id, pending[experiment_id][1])
            client.hdel(keys.decision(experiment_id, pending[experiment_id][1]),
                        "model_field", "arm_field")
            drop_outcomes(client, experiment_id)  # it added every reward to the sums
            for name, blob in current[experiment_id].items():
                axis = "model" if name.startswith("model") else "arm" if name.startswith(
                    "arm:") else ""
                if axis:
                    client.hset(keys.stats(experiment_id),
                                mapping={name: _legacy_blob(config, axis, blob, False)})
    finally:
        client.close()

    upgraded = await ExperimentService.open(settings)
    again = await ExperimentService.open(settings)  # a second worker: nothing left to do
    try:
        assert upgraded.upgraded == sorted(ids) and again.upgraded == []
        assert upgraded.upgrade_failures == []
        client = RedisCluster.from_url(redis_db)
        try:
            for experiment_id in ids:
                assert_stats_equal(config, ["a", "b"], _stats(client, experiment_id),
                                   _unpacked(config, current[experiment_id]), rtol=1e-12)
        finally:
            client.close()
        for experiment_id, (key, decision_id) in pending.items():
            outcome = await upgraded.reward(experiment_id, [(decision_id, 0.5)], key)
            assert outcome[0].status == "applied"
            assert (await upgraded.get(experiment_id)).rewards == 4
    finally:
        await upgraded.close()
        await again.close()
