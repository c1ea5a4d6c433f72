"""One experiment over several hash slots (service.shards), on a plain Redis and a cluster."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections import Counter
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import redis
from pydantic import SecretStr
from redis.cluster import RedisCluster
from redis.crc import key_slot

from app.main import create_app
from policies import draw
from service import keys, shards
from service.decisions import Decisions, _decision_rng
from service.domain import ArmSpec, ChooseRequest, Decision, ExperimentSpec
from service.errors import Forbidden, InvalidInput, NotFound, StoreUnavailable
from service.experiments import ExperimentService
from service.settings import Settings
from tests import records, reruns
from tests.cluster import LocalCluster, local_cluster
from tests.conftest import (
    ADMIN,
    ADMIN_TOKEN,
    TEST_REDIS_ENV,
    TEST_SHARDS_ENV,
    Api,
    decision_key,
    decision_numbers,
    key_pattern,
)

pytestmark = pytest.mark.anyio
S = 3
def _one_on_each_member(prefix: str) -> list[str]:
    """Decision ids a caller may choose, one on each member of an experiment of S shards."""
    return [next(f"{prefix}{n}" for n in range(100) if shards.shard_of(f"{prefix}{n}", S) == s)
            for s in range(S)]


_ON_EVERY_MEMBER = _one_on_each_member("id")
FEATURES = [(1.0, 0.0, 0.2), (0.0, 1.0, -0.3), (0.6, 0.6, 0.1), (-0.5, 0.2, 0.9)]


def _spec(experiment_id: str, count: int = S, **fields: object) -> ExperimentSpec:
    base: dict[str, object] = {
        "id": experiment_id, "setting": "stochastic", "dim": 3, "seed": 11, "shards": count,
        "arms": tuple(ArmSpec(f"a{i}", f) for i, f in enumerate(FEATURES)), **fields}
    return ExperimentSpec(**base)  # type: ignore[arg-type]


def _reward(arm_id: str, t: int) -> float:
    """A fixed reward per (arm, round): both runs of a comparison see the same."""
    return float(np.sin(3.0 * int(arm_id[1:]) + 0.7 * t))


def _keys(url: str, experiment_id: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return list(client.scan_iter(match=key_pattern(experiment_id)))
    finally:
        client.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestWarning")  # anyio marks a sync test
@pytest.mark.rerun("tests/test_app_api.py", "tests/test_idempotent_choose.py",
                   "tests/test_live_settings.py", "tests/test_key_rotation.py",
                   "tests/test_rank.py", "tests/test_default_rewards.py",
                   "tests/test_decision_log.py", "tests/test_idempotency_key.py",
                   env={TEST_SHARDS_ENV: str(S)},
                   unset=[TEST_REDIS_ENV])
def test_the_api_tests_pass_on_sharded_experiments(rerun: reruns.Finished) -> None:
    """The API, idempotency (of decisions and of changes), live-settings, key-rotation,
    ranking, default-reward and decision-log tests again, every experiment they create
    with three shards (a subprocess, tests/reruns.py: the shard count is read at start,
    tests/conftest.py; on a Redis of its own)."""
    assert rerun.returncode == 0, rerun.tail()
    passed = re.search(r"\b(\d+) passed\b", rerun.stdout)
    # (of 207: a few do not apply to a sharded experiment and skip)
    assert passed and int(passed.group(1)) >= 198, rerun.stdout[-1000:]


@pytest.mark.member_runs
async def test_decisions_and_their_keys_spread_over_the_members(
    service: ExperimentService, redis_db: str
) -> None:
    """A worker's decisions go RUN in a row on one member, then on the next: any S x RUN
    in a row, RUN on each member."""
    _, key = await service.create(_spec("spread"))
    made = [await service.choose("spread", ChooseRequest(), key)
            for _ in range(S * shards.RUN)]
    members = [shards.shard_of(d.decision_id, S) for d in made]
    assert sorted(Counter(members).values()) == [shards.RUN] * S
    assert sum(a != b for a, b in itertools.pairwise(members)) <= S  # runs, not scattered
    # Each decision is recorded on its member, numbered there: s + S, s + 2S, ...
    found = set(_keys(redis_db, "spread"))
    assert {decision_key("spread", d.decision_id, S).encode() for d in made} <= found
    assert [d.decision_number for d in made] == decision_numbers(
        [d.decision_id for d in made], S)
    assert len({d.decision_number for d in made}) == len(made)
    slots = {key_slot(keys.meta(shards.member("spread", s)).encode()) for s in range(S)}
    assert len(slots) == S  # three hash slots: on a cluster, up to three masters


def test_fresh_ids_land_on_the_member_asked_for() -> None:
    for count in (2, S, shards.MAX_SHARDS):
        for shard in range(count):
            made = [shards.new_decision_id(shard, count) for _ in range(20)]
            assert all(shards.shard_of(i, count) == shard for i in made)
            assert all(re.fullmatch("[0-9a-f]{32}", i) for i in made)
            assert len(set(made)) == len(made)


@pytest.mark.member_runs
def test_an_experiment_s_ids_go_in_runs_on_each_member_in_turn() -> None:
    """Any S x RUN ids in a row of an experiment: RUN on each member, in S runs at most
    (from wherever its start is), whatever other experiments' ids come between."""
    runs = shards.Runs()
    for count in (2, S):
        made: dict[str, list[int]] = {"a": [], "b": []}
        for t in range(4 * count * shards.RUN):
            experiment = "a" if t % 2 or t % 7 == 0 else "b"  # interleaved, unevenly
            made[experiment].append(shards.shard_of(runs.new_id(experiment + str(count),
                                                                count), count))
        for members in made.values():
            for begin in (0, 5, 17):
                window = members[begin:begin + count * shards.RUN]
                assert sorted(Counter(window).values()) == [shards.RUN] * count
                assert sum(a != b for a, b in itertools.pairwise(window)) <= count


@pytest.mark.member_runs
def test_ids_move_on_from_a_member_that_refused_one() -> None:
    runs = shards.Runs(start=lambda bound: 3)  # the fourth of member 0's run
    assert shards.shard_of(runs.new_id("e", S), S) == 0
    runs.move_on("e", 0, S)
    runs.move_on("e", 0, S)  # the same again (another decision in flight): moved once
    assert [shards.shard_of(runs.new_id("e", S), S) for _ in range(shards.RUN + 1)] == \
        [1] * shards.RUN + [2]
    runs.move_on("e", 1, S)  # refused by member 1 once its run had passed: stays on 2
    assert shards.shard_of(runs.new_id("e", S), S) == 2


@pytest.mark.member_runs
async def test_a_decision_refused_503_moves_the_next_ones_to_the_next_member(
    service: ExperimentService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member's master that does not answer (failing over) refuses a decision 503: the
    worker's next fresh ids go to the next member, so a retry is not sent there again."""
    _, key = await service.create(_spec("moving", seed=None))
    service.decisions.runs = shards.Runs(start=lambda bound: 0)
    first = await service.choose("moving", ChooseRequest(), key)
    assert shards.shard_of(first.decision_id, S) == 0
    choose = Decisions._choose

    async def unavailable(*args: object, **kwargs: object) -> Decision:
        raise StoreUnavailable("the member's master does not answer")

    monkeypatch.setattr(Decisions, "_choose", unavailable)
    with pytest.raises(StoreUnavailable):
        await service.choose("moving", ChooseRequest(), key)
    monkeypatch.setattr(Decisions, "_choose", choose)
    retried = await service.choose("moving", ChooseRequest(), key)
    assert shards.shard_of(retried.decision_id, S) == 1


@pytest.mark.member_runs
async def test_a_batch_of_decisions_goes_to_one_member_as_one_call(
    service: ExperimentService, redis_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decisions made together by a worker land on one member (the ids it makes), so that
    its batch goes to Redis as one script call, not one a member. (Unseeded: seeded
    decisions made together predict the same number, and all but one decide again. The
    other members' views are not read again meanwhile, however slow the machine.)"""
    monkeypatch.setattr(shards, "SYNC_SECONDS", 3600.0)
    _, key = await service.create(_spec("together", seed=None))
    await service.choose("together", ChooseRequest(), key)  # the views read
    service.decisions.runs = shards.Runs(start=lambda bound: 0)  # at a run's start
    client = redis.Redis.from_url(redis_db)
    try:
        before = _script_calls(client)
        made = await asyncio.gather(*(service.choose("together", ChooseRequest(), key)
                                      for _ in range(12)))
        calls = _script_calls(client) - before
    finally:
        client.close()
    assert {shards.shard_of(d.decision_id, S) for d in made} == {0}
    assert calls == 1, calls  # one decide call for the twelve


def _script_calls(client: redis.Redis) -> int:
    stats: dict[str, dict[str, int]] = client.info("commandstats")  # type: ignore[assignment]
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0)
               for name in ("evalsha", "eval", "fcall", "fcall_ro"))


async def test_rewards_count_exactly_once_on_their_members(service: ExperimentService) -> None:
    _, key = await service.create(_spec("once"))
    made = [await service.choose("once", ChooseRequest(), key) for _ in range(30)]
    items = [(d.decision_id, 0.5) for d in made]
    first = await service.reward("once", items, key)
    assert {o.status for o in first} == {"applied"}
    again = await service.reward("once", [*items[:10], (made[10].decision_id, 0.7)], key)
    assert [o.status for o in again] == ["duplicate"] * 10 + ["conflict"]
    unknown = await service.reward("once", [("no-such-decision", 1.0)], key)
    assert [o.status for o in unknown] == ["not_found"]
    view = await service.get("once")
    assert (view.decisions, view.rewards, view.duplicates) == (30, 30, 10)
    assert sum(a.pulls for a in view.arms) == 30


@pytest.mark.parametrize("on_cluster", [False, True])
async def test_a_batch_is_whole_on_each_member_and_counts_once_when_sent_again(
    request: pytest.FixtureRequest, redis_db: str, on_cluster: bool
) -> None:
    """A batch's rewards go to their members, one script each: each member's part is
    written whole or not at all, but the parts are separate writes (on a cluster, on
    separate masters). When one part fails, the call fails once every part is done (here
    the third member's master is paused meanwhile), the others' parts applied; the batch
    sent again counts each reward once."""
    experiment_id, url = "parts", redis_db
    client: redis.Redis | RedisCluster = redis.Redis.from_url(redis_db)
    if on_cluster:
        cluster: LocalCluster = request.getfixturevalue("cluster")
        experiment_id = next(f"parts{n}" for n in range(1000)
                             if len(_on_masters(cluster, f"parts{n}", S)) == S)
        url, client = cluster.url, RedisCluster.from_url(cluster.url)
    service = await ExperimentService.open(Settings(redis_url=url,
                                                    admin_token=SecretStr(ADMIN_TOKEN)))
    try:
        _, key = await service.create(_spec(experiment_id))
        made = [await service.choose(experiment_id, ChooseRequest(decision_id=i), key)
                for i in _ON_EVERY_MEMBER]
        damaged = records.key(client, experiment_id, made[1].decision_id)
        raw: bytes = client.get(damaged)  # type: ignore[assignment]
        kind_and_incarnation, _number, rest = raw.split(b"\n", 2)
        client.set(damaged, b"\n".join((kind_and_incarnation, b"seven", rest)), keepttl=True)
        if on_cluster:  # the third part's master answers 0.3 s after the second part fails
            third = cluster.owner(keys.meta(shards.member(experiment_id, 2)))
            cluster.node(third).execute_command("CLIENT", "PAUSE", 300, "WRITE")
        batch = [(d.decision_id, 0.5) for d in made]
        with pytest.raises(redis.ResponseError, match="not a number"):
            await service.reward(experiment_id, batch, key)
        states = [records.parse(client.get(records.key(  # type: ignore[arg-type]
            client, experiment_id, d.decision_id))) for d in made]
        assert [s["status"] for s in states] == ["rewarded", "pending", "rewarded"]
        client.set(damaged, raw, keepttl=True)  # repaired: the batch again
        again = await service.reward(experiment_id, batch, key)
        assert [o.status for o in again] == ["duplicate", "applied", "duplicate"]
        view = await service.get(experiment_id)
        assert (view.rewards, sum(a.pulls for a in view.arms)) == (3, 3)
        await service.delete(experiment_id)
    finally:
        client.close()
        await service.close()


@pytest.mark.unsharded  # (its unsharded experiment stays so: the fixture leaves it)
async def test_the_same_rewards_in_the_same_order_give_the_unsharded_decisions(
    service: ExperimentService,
) -> None:
    """A sharded and an unsharded experiment see the same (arm, context, reward) in the
    same order (the unsharded one is made to pull the sharded one's arm): their
    statistics agree to rounding, and for every decision number they draw the same arm.
    The numbers themselves differ (member s numbers s + S, s + 2S, ...)."""
    _, key = await service.create(_spec("sh"))
    _, plain_key = await service.create(_spec("un", 1))
    for t in range(80):
        decision = await service.choose("sh", ChooseRequest(), key)
        same = await service.choose("un", ChooseRequest(eligible=(decision.arm_id,)), plain_key)
        reward = _reward(decision.arm_id, t)
        assert (await service.reward("sh", [(decision.decision_id, reward)], key))[0].status \
            == "applied"
        assert (await service.reward("un", [(same.decision_id, reward)], plain_key))[0].status \
            == "applied"
    sharded, plain = await service.get("sh"), await service.get("un")
    assert [a.pulls for a in sharded.arms] == [a.pulls for a in plain.arms]
    for a, b in zip(sharded.arms, plain.arms, strict=True):
        # 80 rewards of |r| <= 1 summed in two orders: a few ulps of 80
        assert a.mean_reward == pytest.approx(b.mean_reward, abs=1e-12)
    np.testing.assert_allclose(sharded.theta_hat["shared"], plain.theta_hat["shared"],
                               rtol=1e-9, atol=1e-12)
    views = service.views  # each view with this worker's last reward added, as choose does
    home = await views.current("sh", await views.view_for("sh", None), None, 0)
    basis = await views.merged("sh", home, "sh")
    alone = await views.current("un", await views.view_for("un", None), None, 0)
    assert basis.state["n"][0, 0] == alone.state["n"][0, 0] == 80
    _, _, merged_ready = basis.ready(ChooseRequest(), 1e6)
    _, _, plain_ready = alone.ready(ChooseRequest(), 1e6)
    for number in range(1, 301):
        arms = [int(draw(ready, [_decision_rng(11, number)]).arms[0])
                for ready in (merged_ready, plain_ready)]
        assert arms[0] == arms[1], number


async def test_another_workers_rewards_count_within_the_sync_interval(
    service: ExperimentService, other_service: ExperimentService,
) -> None:
    """A decision sees every outcome of its own member (max_stale_rewards 0), and the
    other members' as of at most SYNC_SECONDS before it."""
    _, key = await service.create(_spec("sync"))
    await other_service.choose("sync", ChooseRequest(), key)  # the other worker holds views
    made = [await service.choose("sync", ChooseRequest(), key) for _ in range(20)]
    await service.reward("sync", [(d.decision_id, 1.0) for d in made], key)
    await asyncio.sleep(shards.SYNC_SECONDS * 1.5)
    await other_service.choose("sync", ChooseRequest(), key)
    held = [other_service.views.get(m) for m in shards.members("sync", S)]
    assert all(v is not None for v in held)
    assert sum(v.rewards for v in held if v is not None) == 20


async def test_default_rewards_settle_on_every_member(service: ExperimentService) -> None:
    _, key = await service.create(_spec("dflt", default_reward=0.0, reward_window_seconds=1))
    made = [await service.choose("dflt", ChooseRequest(decision_id=f"d{i}"), key)
            for i in range(24)]
    assert {shards.shard_of(d.decision_id, S) for d in made} == set(range(S))
    await service.reward("dflt", [(made[0].decision_id, 1.0)], key)
    await asyncio.sleep(1.1)
    assert await service.sweep() == 23
    assert await service.sweep() == 0  # once
    late = await service.reward("dflt", [(made[1].decision_id, 1.0)], key)
    assert [o.status for o in late] == ["late"]
    view = await service.get("dflt")
    assert (view.rewards, view.defaulted, view.late) == (1, 23, 1)
    assert sum(a.pulls for a in view.arms) == 24


async def test_the_log_is_every_members_in_order_page_by_page(
    service: ExperimentService,
) -> None:
    _, key = await service.create(_spec("log", log_max_entries=1000))
    made = [await service.choose("log", ChooseRequest(), key) for _ in range(25)]
    await service.reward("log", [(d.decision_id, 0.25) for d in made[:10]], key)
    await service.update_settings("log", {"epsilon": 0.1})
    entries, after = [], None
    while True:
        page, after = await service.read_log("log", after=after, limit=4)
        assert len(page) <= 4
        entries += page
        if after is None:
            break
    # In time order (Redis's clock, to the ms: two members' entries of one ms in either
    # order); each member's in the order they happened.
    ids = [e.entry_id for e in entries]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    logged = [e.decision_id for e in entries if e.type == "decision"]
    assert sorted(logged) == sorted(d.decision_id for d in made)
    for s in range(S):
        assert [i for i in logged if shards.shard_of(i, S) == s] == \
            [d.decision_id for d in made if shards.shard_of(d.decision_id, S) == s]
    assert sorted(e.decision_id for e in entries if e.type == "reward") == \
        sorted(d.decision_id for d in made[:10])
    assert [e.type for e in entries].count("settings") == 1  # once, not once per member


async def test_changes_reach_every_member(service: ExperimentService) -> None:
    _, key = await service.create(_spec("chg"))
    await service.add_arms("chg", [ArmSpec("new", (0.3, 0.3, 0.3))])
    await service.update_settings("chg", {"reward_window_seconds": 120})
    await service.retire_arms("chg", ["a0"])
    for member_id in shards.members("chg", S):
        definition = await service.views.definition(member_id)
        assert [a.id for a in definition.active_arms] == ["a1", "a2", "a3", "new"]
        assert definition.spec.reward_window_seconds == 120
    picked = {(await service.choose("chg", ChooseRequest(eligible=("new",)), key)).arm_id
              for _ in range(6)}
    assert picked == {"new"}
    new_key = await service.rotate_key("chg")
    assert await service.revoke_previous_key("chg")
    made = [await service.choose("chg", ChooseRequest(decision_id=i), new_key)
            for i in _ON_EVERY_MEMBER]
    assert {shards.shard_of(d.decision_id, S) for d in made} == set(range(S))


async def test_delete_removes_every_member_and_a_creation_replaces_stray_ones(
    service: ExperimentService, redis_db: str
) -> None:
    _, key = await service.create(_spec("gone", default_reward=0.0))
    for _ in range(12):
        await service.choose("gone", ChooseRequest(), key)
    await service.delete("gone")
    assert _keys(redis_db, "gone") == []
    # A deletion that stopped after the home: the other members stay behind...
    store = service.decisions._store
    await service.create(_spec("gone"))
    await store.delete("gone")
    assert _keys(redis_db, "gone") != []
    # ... and the experiment is gone; created again, it replaces them;
    _, key = await service.create(_spec("gone"))
    assert (await service.choose("gone", ChooseRequest(), key)).arm_id
    # or deleted again, they go (a 404: the experiment was gone).
    await store.delete("gone")
    with pytest.raises(NotFound):
        await service.delete("gone")
    assert _keys(redis_db, "gone") == []


async def test_one_of_two_concurrent_creations_wins_whole(
    service: ExperimentService, other_service: ExperimentService,
) -> None:
    results = await asyncio.gather(service.create(_spec("race")),
                                   other_service.create(_spec("race")),
                                   return_exceptions=True)
    # the other: 409 if it came after, 503 (retry) if it met the first's claim
    losers = [type(r).__name__ for r in results if not isinstance(r, tuple)]
    assert len(losers) == 1 and losers[0] in ("Conflict", "StoreUnavailable")
    incarnations = {(await service.views.definition(m)).incarnation
                    for m in shards.members("race", S)}
    assert len(incarnations) == 1
    key = next(r for r in results if isinstance(r, tuple))[1]
    assert (await service.choose("race", ChooseRequest(), key)).arm_id


async def test_a_change_copied_halfway_is_completed_by_the_next_decision(
    service: ExperimentService,
) -> None:
    """The home holds the definition; a change that reached it but not the other members
    (a worker stopped between) is copied by the next decision that sees them differ."""
    _, key = await service.create(_spec("half"))
    for i in _ON_EVERY_MEMBER:
        await service.choose("half", ChooseRequest(decision_id=i), key)
    store = service.decisions._store
    record = json.dumps({"active": True, "features": [0.3, 0.3, 0.3]})
    assert await store.add_arms("half", {"new": record}, 100) > 0  # the home alone
    made = [await service.choose("half", ChooseRequest(decision_id=f"n{i}", eligible=("new",)),
                                 key) for i in range(6)]
    assert {d.arm_id for d in made} == {"new"}
    for member_id in shards.members("half", S):
        definition = await service.views.definition(member_id)
        assert [a.id for a in definition.arms][-1] == "new"
        assert definition.version == (await service.views.definition("half")).version


async def test_what_cannot_be_sharded_is_refused(service: ExperimentService) -> None:
    with pytest.raises(InvalidInput, match="forgetting"):
        await service.create(_spec("f", hyperparameters={"discount": 0.99}))
    with pytest.raises(InvalidInput, match="between 1 and 16"):
        await service.create(_spec("many", 17))


async def test_the_api_takes_and_shows_shards(api: Api) -> None:
    body = {"id": "web", "setting": "covariates", "dim": 2, "shards": S,
            "arms": [{"id": "a"}, {"id": "b"}]}
    key = await api.create(body)
    assert (await api.experiment("web"))["shards"] == S
    refused = await api.http.post("/experiments", json={**body, "id": "w2", "shards": 0},
                                  headers=ADMIN)
    assert refused.status_code == 422 and "shards" in refused.text
    decided = [await api.decide(key, {"experiment_id": "web", "context": [0.1, 0.2]})
               for _ in range(6)]
    rewards = [{"decision_id": d, "reward": 1.0} for d in decided]
    reply = await api.reward(key, {"experiment_id": "web", "rewards": rewards})
    assert [r["status"] for r in reply.json()["results"]] == ["applied"] * 6


# -- on a Redis Cluster -----------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("cluster")) as started:
        yield started


def _on_masters(cluster: LocalCluster, experiment_id: str, count: int) -> set[int]:
    return {cluster.owner(keys.meta(m)) for m in shards.members(experiment_id, count)}


async def test_a_sharded_experiment_spreads_over_a_clusters_masters(
    cluster: LocalCluster,
) -> None:
    cluster.flush()
    experiment_id = next(f"hot{n}" for n in range(1000)
                         if len(_on_masters(cluster, f"hot{n}", S)) == S)
    app = create_app(Settings(redis_url=cluster.url, admin_token=SecretStr(ADMIN_TOKEN)))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            api = Api(http)
            key = await api.create({"id": experiment_id, "setting": "covariates", "dim": 2,
                                    "shards": S, "default_reward": 0.0,
                                    "log_max_entries": 100,
                                    "arms": [{"id": "a"}, {"id": "b"}]})
            body = {"experiment_id": experiment_id, "context": [0.3, -0.1]}
            decided = [await api.decide(key, body) for _ in range(30)]
            rewards = [{"decision_id": d, "reward": 0.5} for d in decided]
            reply = await api.reward(key, {"experiment_id": experiment_id, "rewards": rewards})
            assert [r["status"] for r in reply.json()["results"]] == ["applied"] * 30
            view = await api.experiment(experiment_id)
            assert (view["decisions"], view["rewards"]) == (30, 30)
            seen: list[tuple[str, str]] = []
            after: str | None = None
            while True:  # pages of 7, by next_after (each shard's position)
                params: dict[str, str | int] = {"limit": 7, **({"after": after} if after else {})}
                log = await http.get(f"/experiments/{experiment_id}/log", params=params,
                                     headers=ADMIN)
                assert log.status_code == 200, log.text
                seen += [(e["type"], e["decision_id"]) for e in log.json()["entries"]]
                after = log.json()["next_after"]
                if after is None:
                    break
            assert len(seen) == len(set(seen)) == 60  # 30 decisions and their rewards, once
            per_master = {port: int(cluster.node(port).dbsize())  # type: ignore[arg-type]
                          for port in cluster.masters}
            assert all(size > 0 for size in per_master.values()), per_master
            deleted = await http.delete(f"/experiments/{experiment_id}", headers=ADMIN)
            assert deleted.status_code == 204
    assert cluster.keys() == 0


async def test_a_worker_learns_the_shard_count_from_the_scripts(
    service: ExperimentService, other_service: ExperimentService,
) -> None:
    """A worker that never read the experiment routes rewards as unsharded; the script
    refuses them, writing nothing, with the count; so does one whose view predates a
    deletion and creation under the same id with another count."""
    _, key = await service.create(_spec("learn"))
    made = [await service.choose("learn", ChooseRequest(decision_id=i), key)
            for i in _ON_EVERY_MEMBER]
    items = [(d.decision_id, 1.0) for d in made]
    assert other_service.views.get("learn") is None
    assert [o.status for o in await other_service.reward("learn", items, key)] == \
        ["applied"] * S
    assert (await service.get("learn")).rewards == S
    # Created again with one shard: the first worker's view still says three.
    await other_service.delete("learn")
    _, key = await other_service.create(_spec("learn", 1))
    again = [await other_service.choose("learn", ChooseRequest(decision_id=i), key)
             for i in _ON_EVERY_MEMBER]  # (by the old count, one on each of its members)
    assert service.views.get("learn") is not None
    rewarded = await service.reward("learn", [(d.decision_id, 1.0) for d in again], key)
    assert [o.status for o in rewarded] == ["applied"] * S
    assert (await service.get("learn")).rewards == S


async def test_an_entry_a_member_writes_after_a_page_is_on_the_next(
    service: ExperimentService, redis_db: str
) -> None:
    """The cursor holds each member's position: an entry a member writes after a page was
    read, with an id before entries the page showed (another member's clock, or the same
    millisecond), is on the next page, not lost."""
    await service.create(_spec("tail", log_max_entries=100))
    client = redis.Redis.from_url(redis_db)
    try:
        def logged(shard: int, entry_id: str) -> None:
            client.xadd(keys.log(shards.member("tail", shard)),
                        {"type": "reward", "id": f"d{entry_id}", "reward": "1.0"}, id=entry_id)

        logged(0, "1000-0")
        logged(0, "3000-0")
        logged(1, "2000-0")
        page, after = await service.read_log("tail", limit=2)
        assert [e.entry_id for e in page] == ["1000-0", "2000-0"] and after is not None
        logged(2, "1500-0")  # before 2000-0, which the page showed
        rest, last = await service.read_log("tail", after=after, limit=10)
        assert [e.entry_id for e in rest] == ["1500-0", "3000-0"] and last is None
    finally:
        client.close()


async def test_a_revoke_that_reached_only_the_home_is_copied_by_the_next_decisions(
    service: ExperimentService,
) -> None:
    _, old_key = await service.create(_spec("rev"))
    new_key = await service.rotate_key("rev")
    for i in _one_on_each_member("o"):  # every member's view held, accepting both keys
        await service.choose("rev", ChooseRequest(decision_id=i), old_key)
    assert await service.decisions._store.revoke_previous_key("rev") == 1  # the home alone
    for i in _one_on_each_member("n"):  # one on the home: it sees the change, copies it
        await service.choose("rev", ChooseRequest(decision_id=i), new_key)
    for i in _one_on_each_member("x"):
        with pytest.raises(Forbidden):
            await service.choose("rev", ChooseRequest(decision_id=i), old_key)


async def test_a_revoke_sent_again_after_its_copy_failed_reaches_every_member(
    service: ExperimentService,
) -> None:
    """A revoke whose copy to the other members failed (the caller got a 503; here: the
    home revoked alone) is sent again: the home has nothing left to revoke, but the
    copy is made, so the old key's rewards are refused on every member."""
    _, old_key = await service.create(_spec("again"))
    await service.rotate_key("again")
    made = [await service.choose("again", ChooseRequest(decision_id=i), old_key)
            for i in _one_on_each_member("o")]
    assert await service.decisions._store.revoke_previous_key("again") == 1  # the home alone

    assert not await service.revoke_previous_key("again")  # sent again: none left at home

    for decision in made:
        with pytest.raises(Forbidden):
            await service.reward("again", [(decision.decision_id, 1.0)], old_key)
    assert (await service.get("again")).rewards == 0


async def test_creation_and_deletion_of_an_id_wait_for_each_other(
    service: ExperimentService,
) -> None:
    store = service.decisions._store
    token = await store.claim("held")
    assert token is not None
    with pytest.raises(StoreUnavailable, match="being created or deleted"):  # a 503: retry
        await service.create(_spec("held"))
    with pytest.raises(StoreUnavailable, match="being created or deleted"):
        await service.delete("held")
    await store.release("held", "another-token")  # not the holder's: kept
    assert await store.claim("held") is None
    await store.release("held", token)
    await service.create(_spec("held"))
    await service.delete("held")


async def test_rewards_routed_are_applied_when_a_member_is_gone_from_under_its_home(
    service: ExperimentService,
) -> None:
    """A member deleted from under a live home (by hand): the rewards of the other members'
    decisions are applied and reported so; those of the lost member are not_found."""
    _, key = await service.create(_spec("lost"))
    made = [await service.choose("lost", ChooseRequest(decision_id=i), key)
            for i in _ON_EVERY_MEMBER]
    await service.decisions._store.delete(shards.member("lost", 2))
    outcomes = await service.reward("lost", [(d.decision_id, 1.0) for d in made], key)
    assert [o.status for o in outcomes] == ["applied", "applied", "not_found"]
