"""Durability and exactly-once rewards, against a real Redis.

- a reward sent many times at once counts once (through the app and the service);
- a reward whose Redis reply was lost, and that the client resent, counts once
  (a resent call, and a genuine lost reply through a TCP proxy that drops it);
- two ``linreboot serve`` worker processes lose no update;
- the embedded Redis restarts from its AOF with every statistic and pending decision;
- seeded experiments decide reproducibly, and like the in-process simulator.

Two tests pin bugs found on the way and since fixed: a stale decision counting
in a re-created experiment, and EmbeddedRedis.stop() on Redis 6.2.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np
import pytest
import redis
from fastapi import FastAPI
from redis.backoff import NoBackoff
from redis.retry import Retry

from linreboot.client import AsyncClient
from loadtest.http_driver import HttpDriver
from loadtest.server import server_process
from loadtest.simulate import Cell, play
from policies import PolicyConfig, Setting, State, init_state, raw_reward_sums, update
from policies.ridge import ridge
from service import keys
from service.codec import assemble_state, unpack
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec
from service.embedded import EmbeddedRedis
from service.errors import InvalidInput
from service.experiments import ExperimentService
from service.folding import fields_of, folded_blobs, split_records
from service.settings import Settings
from service.store import _BATCHED, _ONCE, Store, _script
from tests import records
from tests.conftest import ADMIN, ADMIN_TOKEN, CONTEXTUAL, Api, key_pattern

# Its experiments stay unsharded under LINREBOOT_TEST_SHARDS: the tests replay one
# member's sums and seeded numbers 1, 2, 3 (sharded replays: tests/test_shards.py).
pytestmark = [pytest.mark.anyio, pytest.mark.unsharded]

COPIES = 50  # concurrent copies of one reward


# -- helpers ------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    arm: int  # index in registration order
    x: np.ndarray  # shape (d,)
    reward: float
    number: int | None = None  # the decision's number (used with forgetting)


def expected_state(config: PolicyConfig, n_arms: int, observations: Sequence[Observation]) -> State:
    """The statistics the policies hold after ``observations``, batch of one."""
    state = init_state(config, n_arms, 1)
    for o in observations:
        numbers = None if o.number is None else np.array([float(o.number)])
        update(config, state, np.array([o.arm]), o.x[None, :], np.array([o.reward]), numbers)
    return state


def stored_stats(url: str, experiment_id: str) -> dict[str, bytes]:
    """The stats hash as stored, its blobs with the unfolded outcomes added
    (``service.folding``: the statistics every view reads)."""
    client = redis.Redis.from_url(url)
    try:
        return stats_with_unfolded(client, experiment_id)
    finally:
        client.close()


def drop_outcomes(client: Any, experiment_id: str) -> None:
    """Forget the outcomes recorded but not yet in the sums (as a version that added
    every outcome to the sums left an experiment: no outcomes key, no folded counter)."""
    client.delete(keys.outcomes(experiment_id))
    client.hdel(keys.stats(experiment_id), keys.FOLDED)


def stats_with_unfolded(client: Any, experiment_id: str) -> dict[str, bytes]:
    """:func:`stored_stats` through a (sync) client: a Redis or a RedisCluster."""
    raw: dict[bytes, bytes] = client.hgetall(keys.stats(experiment_id))
    stats = {k.decode(): v for k, v in raw.items()}
    entries, _ = split_records(client.get(keys.outcomes(experiment_id)) or b"")
    if entries:
        config = PolicyConfig(**json.loads(client.hget(keys.meta(experiment_id), "config")))
        fields = fields_of(entries)
        stats |= folded_blobs(config, fields, [stats.get(f) for f in fields], entries)
    return stats


SHIFTED = (("pulls", "shift_r", "sum_dr", "sum_dr2"), ("n", "shift_y", "sum_dy", "sum_dy2"))


def order_free(fields: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Fields whose values do not depend on the order of the rewards: raw sums for shifted ones."""
    out = dict(fields)
    for count, shift, sum_d, sum_d2 in SHIFTED:
        if count in out:
            total, squares = raw_reward_sums(out[count], out.pop(shift), out.pop(sum_d),
                                             out.pop(sum_d2))
            out[f"raw {sum_d}"], out[f"raw {sum_d2}"] = total, squares
    return out


def assert_stats_equal(
    config: PolicyConfig, arm_ids: Sequence[str], stats: dict[str, bytes], expected: State,
    rtol: float = 0.0,
) -> None:
    """Every stored blob equals the policies' state (exactly unless ``rtol``).

    With ``rtol`` the rewards may have been applied in another order, so each
    blob's shift (its first reward) may differ: the shifted sums are compared
    as the raw sums they stand for.
    """
    for k, arm_id in enumerate(arm_ids):
        slot = 0 if config.shared else k
        blobs = [("arm", keys.arm_field(arm_id), k)]
        if not config.shared or k == 0:
            blobs.append(("model", keys.model_field(None if config.shared else arm_id), slot))
        for axis, name, index in blobs:
            stored = unpack(config, axis, stats.get(name))  # type: ignore[arg-type]
            wanted = {f: v[0, index] for f, v in expected.items() if f in stored}
            if rtol:
                stored, wanted = order_free(stored), order_free(wanted)
            for field_name, value in stored.items():
                want = wanted[field_name]
                if rtol:
                    scale = max(float(np.max(np.abs(want))), 1e-300)
                    err = float(np.max(np.abs(value - want))) / scale
                    assert err <= rtol, (name, field_name, err)
                else:
                    assert np.array_equal(value, want), (name, field_name, value, want)


def expected_theta(config: PolicyConfig, state: State) -> np.ndarray:
    """Ridge estimates, shape (M, d): one shared model or one per arm."""
    theta = ridge(state["xtx"][0], state["xty"][0], config.reg)
    return np.asarray(theta)


def statuses(bodies: Sequence[dict[str, Any]]) -> Counter[str]:
    return Counter(str(b["status"]) for b in bodies)


# -- 1. the same reward, many times at once -----------------------------------


async def test_concurrent_copies_of_a_reward_through_the_app_count_once(
    api: Api, redis_db: str
) -> None:
    key = await api.create(CONTEXTUAL)
    arm_contexts = {"a": [0.3, -0.7], "b": [1.0, 0.25], "c": [-0.5, 0.5]}
    decision = (await api.choose(key, {"experiment_id": "ctx", "arm_contexts": arm_contexts}))
    assert decision.status_code == 200
    chosen = decision.json()
    body = {"experiment_id": "ctx", "decision_id": chosen["decision_id"], "reward": 0.8125}

    responses = await asyncio.gather(*(api.reward(key, body) for _ in range(COPIES)))

    assert [r.status_code for r in responses] == [200] * COPIES
    assert statuses([r.json() for r in responses]) == {"applied": 1, "duplicate": COPIES - 1}
    view = await api.experiment("ctx")
    assert (view["decisions"], view["rewards"], view["duplicates"]) == (1, 1, COPIES - 1)
    config = PolicyConfig(**view["config"])
    arm_ids = ["a", "b", "c"]
    picked = arm_ids.index(chosen["arm_id"])
    once = expected_state(config, 3, [Observation(picked, np.array(arm_contexts[arm_ids[picked]]),
                                                  0.8125)])
    arms = {a["id"]: a for a in view["arms"]}
    assert [arms[i]["pulls"] for i in arm_ids] == once["pulls"][0].tolist()
    assert arms[chosen["arm_id"]]["mean_reward"] == 0.8125
    np.testing.assert_allclose(
        view["theta_hat"]["shared"], expected_theta(config, once)[0], rtol=1e-12
    )
    assert_stats_equal(config, arm_ids, stored_stats(redis_db, "ctx"), once)


async def test_concurrent_copies_of_a_reward_through_the_service_count_once(
    service: ExperimentService, redis_db: str
) -> None:
    arm_ids = ["a", "b", "c", "d"]
    spec = ExperimentSpec(id="cov", setting="covariates", dim=3,
                          arms=tuple(ArmSpec(a) for a in arm_ids), seed=5)
    await service.create(spec)
    context = (0.25, -1.5, 2.0)
    decision = await service.choose("cov", ChooseRequest(context=context))

    outcomes = await asyncio.gather(
        *(service.reward("cov", [(decision.decision_id, -0.375)]) for _ in range(COPIES))
    )

    assert Counter(o[0].status for o in outcomes) == {"applied": 1, "duplicate": COPIES - 1}
    # A batch naming one decision twice: the second copy is a duplicate too.
    second = await service.choose("cov", ChooseRequest(context=context))
    batch = await service.reward("cov", [(second.decision_id, 1.5), (second.decision_id, 1.5)])
    assert [o.status for o in batch] == ["applied", "duplicate"]

    view = await service.get("cov")
    assert (view.decisions, view.rewards, view.duplicates) == (2, 2, COPIES)
    config = PolicyConfig(**view.config)  # type: ignore[arg-type]
    x = np.array(context)
    once = expected_state(config, 4, [
        Observation(arm_ids.index(decision.arm_id), x, -0.375),
        Observation(arm_ids.index(second.arm_id), x, 1.5),
    ])
    assert [a.pulls for a in view.arms] == once["pulls"][0].tolist()
    theta = expected_theta(config, once)
    for k, arm_id in enumerate(arm_ids):
        np.testing.assert_allclose(view.theta_hat[arm_id], theta[k], rtol=1e-12, atol=1e-300)
    assert_stats_equal(config, arm_ids, stored_stats(redis_db, "cov"), once)


async def test_concurrent_different_rewards_apply_exactly_one(
    service: ExperimentService, redis_db: str
) -> None:
    """Two values race for one decision: one wins, its copies are duplicates, the rest conflict."""
    spec = ExperimentSpec(id="sto", setting="stochastic", dim=2, seed=3,
                          arms=(ArmSpec("a", (1.0, 0.0)), ArmSpec("b", (0.0, 1.0))))
    await service.create(spec)
    decision = await service.choose("sto", ChooseRequest())
    values = [0.25 if i % 2 else 0.75 for i in range(COPIES)]

    outcomes = await asyncio.gather(
        *(service.reward("sto", [(decision.decision_id, v)]) for v in values)
    )

    applied = [v for v, o in zip(values, outcomes, strict=True) if o[0].status == "applied"]
    assert len(applied) == 1
    winner = applied[0]
    for v, o in zip(values, outcomes, strict=True):
        if o[0].status != "applied":
            assert o[0].status == ("duplicate" if v == winner else "conflict")
    view = await service.get("sto")
    assert view.rewards == 1
    assert view.duplicates == values.count(winner) - 1
    config = PolicyConfig(**view.config)  # type: ignore[arg-type]
    k = ["a", "b"].index(decision.arm_id)
    once = expected_state(config, 2, [Observation(k, np.array(spec.arms[k].features), winner)])
    assert_stats_equal(config, ["a", "b"], stored_stats(redis_db, "sto"), once)


async def test_a_decision_from_before_delete_and_recreate_does_not_count(
    service: ExperimentService,
) -> None:
    old = ExperimentSpec(id="again", setting="covariates", dim=2, seed=1,
                         arms=(ArmSpec("a"), ArmSpec("b")))
    await service.create(old)
    stale = await service.choose("again", ChooseRequest(context=(1.0, 2.0)))
    await service.delete("again")
    await service.create(dataclasses.replace(old, dim=3))

    outcome = await service.reward("again", [(stale.decision_id, 1.0)])

    view = await service.get("again")  # raises ValueError (a 72-byte blob) with the bug
    assert outcome[0].status != "applied"
    assert (view.decisions, view.rewards) == (0, 0)
    assert [a.pulls for a in view.arms] == [0, 0]


@pytest.mark.parametrize(("setting", "hyperparameters"), [
    ("stochastic", {}),
    ("contextual", {"residuals": "observed"}),  # per-arm Gram matrices in the arm blobs
    ("covariates", {}),
])
async def test_many_rewards_add_up_bit_for_bit_to_the_policies_update(
    service: ExperimentService, redis_db: str, setting: Setting,
    hyperparameters: dict[str, float | str],
) -> None:
    """The stored sums with the recorded outcomes added, reward after reward, are
    exactly policies.update's."""
    rng = np.random.default_rng(11)
    dim, arm_ids = 10, ["a", "b", "c"]  # 80 bytes of context: two chunks
    features = rng.normal(size=(3, dim)) if setting == "stochastic" else None
    arms = tuple(ArmSpec(a, None if features is None else tuple(features[i]))
                 for i, a in enumerate(arm_ids))
    await service.create(ExperimentSpec(id="exact", setting=setting, dim=dim, arms=arms,
                                        hyperparameters=hyperparameters))
    observations = []
    for _ in range(40):
        request = (ChooseRequest() if setting == "stochastic"
                   else _round_request(setting, arm_ids, rng, dim))
        decision = await service.choose("exact", request)
        arm = arm_ids.index(decision.arm_id)
        if setting == "stochastic":
            x = features[arm]  # type: ignore[index]
        elif setting == "contextual":
            x = np.array(request.arm_contexts[decision.arm_id])  # type: ignore[index]
        else:
            x = np.array(request.context)
        reward = float(rng.normal())
        assert (await service.reward("exact", [(decision.decision_id, reward)]))[0].status \
            == "applied"
        observations.append(Observation(arm, x, reward))
    config = PolicyConfig(**(await service.get("exact")).config)  # type: ignore[arg-type]
    assert_stats_equal(config, arm_ids, stored_stats(redis_db, "exact"),
                       expected_state(config, 3, observations))


@pytest.mark.parametrize(("setting", "hyperparameters"), [
    ("stochastic", {}),
    ("contextual", {"residuals": "observed"}),
    ("covariates", {"discount": 0.9}),  # forgetting: each blob aged to the decision's number
])
async def test_batched_rewards_add_up_bit_for_bit_to_the_policies_update(
    service: ExperimentService, redis_db: str, setting: Setting,
    hyperparameters: dict[str, float | str],
) -> None:
    """A batch's outcomes are recorded in the batch's order: the sums are those of
    policies.update, reward after reward in that order; a decision twice in one
    batch counts once (its repeat is a duplicate)."""
    rng = np.random.default_rng(12)
    dim, arm_ids = 10, ["a", "b", "c"]
    forgets = "discount" in hyperparameters
    features = rng.normal(size=(3, dim)) if setting == "stochastic" else None
    arms = tuple(ArmSpec(a, None if features is None else tuple(features[i]))
                 for i, a in enumerate(arm_ids))
    await service.create(ExperimentSpec(id="exact", setting=setting, dim=dim, arms=arms,
                                        hyperparameters=hyperparameters))
    made = []
    for _ in range(40):
        request = (ChooseRequest() if setting == "stochastic"
                   else _round_request(setting, arm_ids, rng, dim))
        decision = await service.choose("exact", request)
        arm = arm_ids.index(decision.arm_id)
        if setting == "stochastic":
            x = features[arm]  # type: ignore[index]
        elif setting == "contextual":
            x = np.array(request.arm_contexts[decision.arm_id])  # type: ignore[index]
        else:
            x = np.array(request.context)
        made.append((decision.decision_id, Observation(
            arm, x, float(rng.normal()), decision.decision_number if forgets else None)))
    order = rng.permutation(len(made))  # rewards arrive in another order than decisions
    observations = []
    for start in range(0, len(order), 7):
        batch = [made[i] for i in order[start:start + 7]]
        items = [(d, o.reward) for d, o in batch] + [(batch[0][0], batch[0][1].reward)]
        statuses = [s.status for s in await service.reward("exact", items)]
        assert statuses == ["applied"] * len(batch) + ["duplicate"]
        observations += [o for _, o in batch]
    view = await service.get("exact")
    assert (view.rewards, view.duplicates) == (40, 6)
    config = PolicyConfig(**view.config)  # type: ignore[arg-type]
    assert_stats_equal(config, arm_ids, stored_stats(redis_db, "exact"),
                       expected_state(config, 3, observations))


# -- 2. a lost reply and the client's retry ------------------------------------


async def test_resent_reward_script_after_a_lost_reply_counts_once(
    service: ExperimentService, redis_db: str
) -> None:
    """The script ran, the caller never saw its answer and sends the same call again."""
    arm_ids = ["a", "b", "c"]
    await service.create(ExperimentSpec(id="cov", setting="covariates", dim=2,
                                        arms=tuple(ArmSpec(a) for a in arm_ids), seed=9))
    context = (0.5, -2.0)
    decision = await service.choose("cov", ChooseRequest(context=context))
    config = PolicyConfig(**(await service.get("cov")).config)  # type: ignore[arg-type]
    item = (decision.decision_id, repr(0.625))
    store = Store.from_url(redis_db, 2.0)
    try:
        first = await store.apply_rewards("cov", None, [item])  # reply "lost"
        assert first.statuses == ["applied"]
        assert (await store.apply_rewards("cov", None, [item])).statuses == ["duplicate"]
    finally:
        await store.close()
    # And a client resending through the service (as an HTTP retry would).
    again = await service.reward("cov", [(decision.decision_id, 0.625)])
    assert again[0].status == "duplicate"

    view = await service.get("cov")
    assert (view.rewards, view.duplicates) == (1, 2)
    once = expected_state(config, 3, [
        Observation(arm_ids.index(decision.arm_id), np.array(context), 0.625)])
    assert [a.pulls for a in view.arms] == once["pulls"][0].tolist()
    assert_stats_equal(config, arm_ids, stored_stats(redis_db, "cov"), once)


@dataclass
class LosesFirstReply:
    """A TCP proxy to Redis that lets the first request naming ``marker`` run but loses its reply.

    The request is forwarded and Redis's answer read (so the command has run);
    then the client's connection is closed instead of answering: what a client
    sees when the reply is lost after the server committed. Later connections
    and commands pass through untouched.
    """

    upstream: tuple[str, int]
    marker: bytes = b"EVALSHA"
    armed: bool = True
    lost_reply: bytes = b""
    connections: int = 0
    _requests: list[bytearray] = field(default_factory=list)
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)

    @property
    def marked_requests(self) -> int:
        """How many commands naming ``marker`` the clients sent, retries included."""
        return sum(bytes(r).count(self.marker) for r in self._requests)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[int]:
        """Listen on a free loopback port; yields it."""
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        try:
            yield int(server.sockets[0].getsockname()[1])
        finally:
            server.close()
            for writer in self._writers:
                writer.close()
            await server.wait_closed()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
                      ) -> None:
        self.connections += 1
        up_r, up_w = await asyncio.open_connection(*self.upstream)
        self._writers += [client_w, up_w]
        received = bytearray()
        self._requests.append(received)
        lose = asyncio.Event()

        async def requests() -> None:
            while data := await client_r.read(65536):
                received.extend(data)
                if self.armed and self.marker in received[-(len(data) + len(self.marker)):]:
                    self.armed = False
                    lose.set()  # before forwarding: the next bytes back are its reply
                up_w.write(data)
                await up_w.drain()

        async def replies() -> None:
            while data := await up_r.read(65536):
                if lose.is_set():
                    self.lost_reply = data
                    break
                client_w.write(data)
                await client_w.drain()
            client_w.close()
            up_w.close()

        await asyncio.gather(requests(), replies(), return_exceptions=True)


def _proxied(url: str, port: int) -> str:
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


async def test_reward_whose_reply_is_lost_in_the_network_counts_once(
    service: ExperimentService, app_settings: Settings, redis_db: str
) -> None:
    """redis-py's own retry (Store.from_url) resends the script after the connection drops."""
    parts = urlsplit(redis_db)
    if parts.scheme != "redis" or parts.hostname is None or parts.port is None:
        pytest.skip("the proxy needs a redis://host:port test Redis")
    arm_ids = ["a", "b"]
    await service.create(ExperimentSpec(id="sto", setting="stochastic", dim=2, seed=4,
                                        arms=(ArmSpec("a", (0.6, 0.8)), ArmSpec("b", (1.0, 0.0)))))
    decision = await service.choose("sto", ChooseRequest())

    with redis.Redis.from_url(redis_db) as client:
        # cached, as after any earlier reward: the first EVALSHA runs (Redis 7 runs a function)
        client.script_load(_script("reward", uses=_BATCHED["reward"]))
        major = int(client.info("server")["redis_version"].split(".")[0])
    proxy = LosesFirstReply((parts.hostname, parts.port),
                            marker=b"FCALL" if major >= 7 else b"EVALSHA")
    async with proxy.running() as port:
        store = Store.from_url(_proxied(redis_db, port), app_settings.redis_timeout_seconds)
        through_proxy = ExperimentService(store, app_settings)
        try:
            outcome = await through_proxy.reward("sto", [(decision.decision_id, 2.5)])
        finally:
            await through_proxy.close()

    assert b"applied" in proxy.lost_reply  # the first attempt ran the script
    assert proxy.marked_requests == 2  # and redis-py sent it again on a new connection
    assert proxy.connections >= 2
    assert outcome[0].status == "duplicate"  # the retry found the reward applied
    view = await service.get("sto")
    assert (view.rewards, view.duplicates) == (1, 1)
    config = PolicyConfig(**view.config)  # type: ignore[arg-type]
    k = arm_ids.index(decision.arm_id)
    features = (0.6, 0.8) if k == 0 else (1.0, 0.0)
    once = expected_state(config, 2, [Observation(k, np.array(features), 2.5)])
    assert [a.pulls for a in view.arms] == once["pulls"][0].tolist()
    assert_stats_equal(config, arm_ids, stored_stats(redis_db, "sto"), once)


# Each change of an experiment, made with its script's reply lost: its script, the call.
_LIFECYCLE_CALLS: dict[str, tuple[str, Any]] = {
    "add arms": ("add_arms", lambda s: s.add_arms("lc", [ArmSpec("c", (0.1, 0.3))])),
    "retire arms": ("retire_arms", lambda s: s.retire_arms("lc", ["b"])),
    "update settings": ("settings", lambda s: s.update_settings("lc", {"epsilon": 0.25})),
    "rotate the key": ("keys", lambda s: s.rotate_key("lc")),
    "revoke the previous key": ("keys", lambda s: s.revoke_previous_key("lc")),
    "delete": ("delete", lambda s: s.delete("lc")),
}


@pytest.mark.parametrize("change", list(_LIFECYCLE_CALLS))
async def test_a_change_whose_reply_is_lost_in_the_network_answers_as_made_once(
    service: ExperimentService, app_settings: Settings, redis_db: str, change: str
) -> None:
    """The store resends a lifecycle script whose reply was lost (its connection's
    retry, Store.from_url): the caller is told the change was made (not 409, 404 or
    "nothing to revoke"), and it was made once: the version went up once, the
    settings were logged once."""
    parts = urlsplit(redis_db)
    if parts.scheme != "redis" or parts.hostname is None or parts.port is None:
        pytest.skip("the proxy needs a redis://host:port test Redis")
    script, call = _LIFECYCLE_CALLS[change]
    _, old_key = await service.create(ExperimentSpec(
        id="lc", setting="stochastic", dim=2, seed=4, log_max_entries=100,
        arms=(ArmSpec("a", (0.6, 0.8)), ArmSpec("b", (1.0, 0.0)))))
    if change == "revoke the previous key":
        await service.rotate_key("lc")
    with redis.Redis.from_url(redis_db) as client:
        sha = client.script_load(_script(script, _ONCE))  # cached, as after an earlier change
        version = int(client.hget(keys.meta("lc"), "version") or 0)
        logged = len(client.xrange(keys.log("lc")))
    proxy = LosesFirstReply((parts.hostname, parts.port), marker=sha.encode())
    async with proxy.running() as port:
        store = Store.from_url(_proxied(redis_db, port), app_settings.redis_timeout_seconds)
        through_proxy = ExperimentService(store, app_settings)
        try:
            answer = await call(through_proxy)
        finally:
            await through_proxy.close()

    assert proxy.lost_reply.startswith(b":")  # the first attempt ran the script
    assert proxy.marked_requests == 2  # and the store sent it again on a new connection
    with redis.Redis.from_url(redis_db) as client:
        if change == "delete":
            assert answer is None  # not NotFound
            assert list(client.scan_iter(match=key_pattern("lc"))) == []  # the calls hash too
            return
        assert int(client.hget(keys.meta("lc"), "version") or 0) == version + 1
        entries = client.xrange(keys.log("lc"))
        assert 0 < client.ttl(keys.calls("lc")) <= 60  # the answers kept a minute
    kinds = [fields[b"type"] for _, fields in entries[logged:]]
    assert kinds == ([b"settings"] if change == "update settings" else [])
    view = await service.get("lc")
    if change == "add arms":
        assert [a.id for a in view.arms] == ["a", "b", "c"]
    elif change == "retire arms":
        assert [a.active for a in view.arms] == [True, False]
    elif change == "update settings":
        assert view.config["epsilon"] == 0.25
    elif change == "rotate the key":  # the new key and the one before it
        assert view.previous_key_valid
        service.views.forget("lc")
        await service.choose("lc", ChooseRequest(), answer)
        await service.choose("lc", ChooseRequest(), old_key)
    else:
        assert answer is True  # revoked (not "there was none")
        assert not view.previous_key_valid


async def test_the_answers_kept_for_resends_are_bounded(
    service: ExperimentService, redis_db: str
) -> None:
    """once.lua keeps at most 256 answers of an experiment's changes (a minute each at
    most); past that the older half goes: through 600 rotations the latest 128 are
    always kept (a burst of changes, each sent again at once, is answered as made), and
    never more than 256; answers an earlier version kept (a bare answer) go first, and
    answers numbered high (as a clock set ahead would have left them, had they been
    ordered by time) do not make the newest go."""
    await service.create(ExperimentSpec(id="many", setting="covariates", dim=2,
                                        arms=(ArmSpec("a"), ArmSpec("b"))))
    current = await service._store.key_hash("many")
    assert current is not None
    earlier = {f"earlier{i}".encode(): b"1" for i in range(190)}
    earlier |= {f"ahead{i}".encode(): b"9000000000000000 1" for i in range(10)}
    made: list[bytes] = [*earlier]  # the calls' tokens, in turn
    with redis.Redis.from_url(redis_db) as client:
        client.hset(keys.calls("many"), mapping=earlier)
        for n in range(600):
            assert await service._store.rotate_key("many", f"{n:064x}", current, "") == 1
            current = f"{n:064x}"
            kept = client.hgetall(keys.calls("many"))
            (new,) = set(kept) - set(made[-255:])
            made.append(new)
            assert len(kept) <= 256 and all(value.split()[-1] == b"1" for value in kept.values())
            assert set(made[len(earlier):][-128:]) <= set(kept)
            if n == 55:  # 256 answers kept: the next change drops the older half
                assert set(earlier) <= set(kept)
            if n == 56:  # the bare ones
                assert not set(earlier) & set(kept) - {t for t in earlier if b"ahead" in t}
        assert set(kept) == set(made[-len(kept):])  # the latest, and only those
        assert 0 < client.ttl(keys.calls("many")) <= 60


# -- 3. two worker processes ----------------------------------------------------

LOAD_PAIRS = 2_000
LOAD_IN_FLIGHT = 32
LOAD_DUPLICATE_EVERY = 10  # every tenth reward is also sent twice more, concurrently


@dataclass
class LoadTally:
    applied: list[tuple[str, float]] = field(default_factory=list)  # (arm id, reward)
    duplicates: int = 0
    other: list[str] = field(default_factory=list)


def workers_that_decided(metrics_dir: Path) -> int:
    """How many processes counted a decision (prometheus multiprocess files, one per pid)."""
    from prometheus_client.mmap_dict import MmapedDict

    served = 0
    for path in metrics_dir.glob("counter_*.db"):
        values = MmapedDict.read_all_values_from_file(str(path))
        if any(json.loads(key)[1] == "linreboot_decisions_total" and value > 0
               for key, value, *_ in values):
            served += 1
    return served


async def _drive(url: str, api_key: str, pairs: Iterator[int],
                 rewards: np.ndarray, tally: LoadTally) -> None:
    # A client per task: one shared httpx pool of many connections costs the
    # test process more CPU than the two workers spend serving. No keep-alive:
    # every request is a new connection that either worker may accept, so a
    # decision made by one worker is often rewarded through the other (and a
    # worker that finished starting late still gets its share).
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits) as http:
        await _drive_with(http, api_key, pairs, rewards, tally)


async def _drive_with(http: httpx.AsyncClient, api_key: str, pairs: Iterator[int],
                      rewards: np.ndarray, tally: LoadTally) -> None:
    headers = {"X-API-Key": api_key}
    for i in pairs:
        chosen = await http.post("/choose", json={"experiment_id": "load"}, headers=headers)
        assert chosen.status_code == 200, chosen.text
        decision = chosen.json()
        body = {"experiment_id": "load", "decision_id": decision["decision_id"],
                "reward": float(rewards[i])}
        copies = 3 if i % LOAD_DUPLICATE_EVERY == 0 else 1
        answers = await asyncio.gather(*(
            http.post("/reward", json=body, headers=headers) for _ in range(copies)
        ))
        for answer in answers:
            status = answer.json().get("status") if answer.status_code == 200 else None
            if status == "applied":
                tally.applied.append((decision["arm_id"], float(rewards[i])))
            elif status == "duplicate":
                tally.duplicates += 1
            else:
                tally.other.append(f"{answer.status_code} {answer.text}")


@pytest.mark.slow
async def test_two_workers_lose_no_update(redis_db: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(2024)
    n_arms, dim = 10, 5
    features = rng.uniform(0.0, 1.0, (n_arms, dim))
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    arm_ids = [f"arm{k}" for k in range(n_arms)]
    rewards = rng.normal(0.5, 1.0, LOAD_PAIRS)
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = {
        "LINREBOOT_REDIS_URL": redis_db,
        "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN,
        "LINREBOOT_LOG_LEVEL": "warning",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    }
    spec = {"id": "load", "setting": "stochastic", "dim": dim, "seed": 11,
            "arms": [{"id": a, "features": f.tolist()} for a, f in zip(arm_ids, features,
                                                                        strict=True)]}
    tally = LoadTally()
    with server_process(env, workers=2) as url:
        limits = httpx.Limits(keepalive_expiry=1.0)
        async with httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits) as http:
            created = await http.post("/experiments", json=spec, headers=ADMIN)
            assert created.status_code == 201, created.text
            api_key = created.json()["api_key"]
            pairs = iter(range(LOAD_PAIRS))  # shared: each task takes the next pair
            await asyncio.gather(*(
                _drive(url, api_key, pairs, rewards, tally) for _ in range(LOAD_IN_FLIGHT)
            ))
            got = await http.get("/experiments/load", headers=ADMIN)
            assert got.status_code == 200
            view = got.json()
        served = workers_that_decided(metrics_dir)

    assert tally.other == []
    assert len(tally.applied) == LOAD_PAIRS  # every decision's reward acknowledged once
    sent_copies = 2 * len(range(0, LOAD_PAIRS, LOAD_DUPLICATE_EVERY))
    assert tally.duplicates == sent_copies
    assert (view["decisions"], view["rewards"], view["duplicates"]) == (
        LOAD_PAIRS, LOAD_PAIRS, sent_copies)
    pulls = Counter(arm for arm, _ in tally.applied)
    assert [a["pulls"] for a in view["arms"]] == [pulls[a] for a in arm_ids]
    assert sum(a["pulls"] for a in view["arms"]) == len(tally.applied)

    config = PolicyConfig(**view["config"])
    acknowledged = expected_state(config, n_arms, [
        Observation(arm_ids.index(arm), features[arm_ids.index(arm)], r)
        for arm, r in tally.applied
    ])
    # Sums in another order: equal up to rounding.
    assert_stats_equal(config, arm_ids, stored_stats(redis_db, "load"), acknowledged,
                       rtol=1e-9)
    np.testing.assert_allclose(view["theta_hat"]["shared"],
                               expected_theta(config, acknowledged)[0], rtol=1e-9, atol=1e-12)
    assert served == 2, "both worker processes should have made decisions"


# -- 4. restart from the AOF ----------------------------------------------------


def _covariate_context(rng: np.random.Generator, dim: int) -> tuple[float, ...]:
    return tuple(float(v) for v in rng.normal(size=dim))


async def test_state_survives_an_embedded_redis_restart_from_its_aof(tmp_path: Path) -> None:
    data_dir = tmp_path / "redis"
    rng = np.random.default_rng(99)
    arm_ids = ["a", "b", "c"]
    spec = ExperimentSpec(id="persist", setting="covariates", dim=3, seed=12,
                          arms=tuple(ArmSpec(a) for a in arm_ids), reward_window_seconds=600)

    embedded = EmbeddedRedis(data_dir).start()
    try:
        service = await ExperimentService.open(Settings(redis_url=embedded.url))
        try:
            assert service.persistence_warnings == []
            await service.create(spec)
            for _ in range(25):
                decision = await service.choose(
                    "persist", ChooseRequest(context=_covariate_context(rng, 3)))
                reward = float(rng.normal())
                assert (await service.reward("persist", [(decision.decision_id, reward)])
                        )[0].status == "applied"
            pending = await service.choose(
                "persist", ChooseRequest(context=_covariate_context(rng, 3)))
            before = await service.get("persist")
        finally:
            await service.close()
    finally:
        embedded.stop()  # SHUTDOWN: the AOF is written and fsynced

    # Restart from the AOF alone: without the RDB snapshot SHUTDOWN also wrote.
    assert (data_dir / "appendonly.aof").stat().st_size > 0
    (data_dir / "linreboot.rdb").unlink(missing_ok=True)
    embedded = EmbeddedRedis(data_dir).start()
    try:
        service = await ExperimentService.open(Settings(redis_url=embedded.url))
        try:
            after = await service.get("persist")
            assert after == before
            assert after.decisions == 26 and after.rewards == 25
            # The pending decision is still within its window and counts once.
            outcome = await service.reward("persist", [(pending.decision_id, 0.5)])
            assert outcome[0].status == "applied"
            again = await service.reward("persist", [(pending.decision_id, 0.5)])
            assert again[0].status == "duplicate"
            rewarded = await service.get("persist")
            pulls = {a.id: a.pulls for a in before.arms}
            pulls[pending.arm_id] += 1
            assert {a.id: a.pulls for a in rewarded.arms} == pulls
            assert rewarded.rewards == 26
            # Decision numbers continue where they stopped.
            assert (await service.choose("persist", ChooseRequest(
                context=_covariate_context(rng, 3)))).decision_number == 27
        finally:
            await service.close()
    finally:
        embedded.stop()


def test_embedded_stop_shuts_redis_down_while_another_client_is_connected(
    tmp_path: Path,
) -> None:
    embedded = EmbeddedRedis(tmp_path / "redis").start()
    # No retries: a refused connection must fail now, not after redis-py's backoff.
    other = redis.Redis.from_url(embedded.url, retry=Retry(NoBackoff(), 0))
    pid = int(other.info("server")["process_id"])  # type: ignore[index]
    try:
        other.set("k", "v")
        embedded.stop()
        with pytest.raises(redis.ConnectionError):
            other.ping()
    finally:
        other.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)  # the server this test started, if stop() left it


# -- 5. seeded decisions are reproducible ---------------------------------------


def _round_request(setting: str, arm_ids: Sequence[str], rng: np.random.Generator, dim: int
                   ) -> ChooseRequest:
    if setting == "covariates":
        return ChooseRequest(context=_covariate_context(rng, dim))
    return ChooseRequest(arm_contexts={a: _covariate_context(rng, dim) for a in arm_ids})


@pytest.mark.parametrize("setting", ["contextual", "covariates"])
async def test_same_seed_same_decisions(service: ExperimentService, setting: str) -> None:
    arm_ids = ["a", "b", "c", "d", "e"]
    dim, rounds = 3, 100
    seeds = {"first": 314, "twin": 314, "other": 315}
    for experiment_id, seed in seeds.items():
        await service.create(ExperimentSpec(
            id=experiment_id, setting=setting, dim=dim,  # type: ignore[arg-type]
            arms=tuple(ArmSpec(a) for a in arm_ids), seed=seed,
            hyperparameters={"sigma_omega": 5.0}))
    world = np.random.default_rng(1)
    theta = world.normal(size=dim)
    arms: dict[str, list[str]] = {e: [] for e in seeds}
    scores: dict[str, list[float | None]] = {e: [] for e in seeds}
    for _ in range(rounds):
        request = _round_request(setting, arm_ids, world, dim)
        noise = float(world.normal(scale=0.1))
        for experiment_id in seeds:  # interleaved: decision numbers are per experiment
            decision = await service.choose(experiment_id, request)
            x = (request.context if request.context is not None
                 else request.arm_contexts[decision.arm_id])  # type: ignore[index]
            reward = float(np.dot(x, theta)) + noise
            await service.reward(experiment_id, [(decision.decision_id, reward)])
            arms[experiment_id].append(decision.arm_id)
            scores[experiment_id].append(decision.index)

    assert arms["first"] == arms["twin"]
    assert scores["first"] == scores["twin"]
    first, twin = await service.get("first"), await service.get("twin")
    assert first.theta_hat == twin.theta_hat
    assert arms["other"] != arms["first"]


async def _replay(app: FastAPI, settings: Settings, cell: Cell, reps: int, horizon: int,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=True)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        lrb = AsyncClient(http=http, admin_token=settings.admin_token.get_secret_value())
        driver = HttpDriver(lrb)
        played = await driver.replay(cell, reps, horizon, seed)
    return played.arms, played.cumulative


@pytest.mark.parametrize("cell", [
    Cell("stochastic", 5, "linreboot"),
    Cell("contextual", 5, "linreboot"),
    Cell("covariates", 5, "linreboot"),
    # Forgetting, in a world that switches: the store's sums and the view's clock
    # are the simulator's, so every decision is too.
    Cell("stochastic", 5, "linreboot", overrides=(("discount", 0.95),), switch_every=60),
    Cell("covariates", 5, "lints-g", overrides=(("discount", 0.9),), switch_every=60),
], ids=lambda cell: cell.setting + (" forgetting" if cell.overrides else ""))
async def test_service_decides_like_the_simulator_with_per_decision_rngs(
    patient_app: FastAPI, app_settings: Settings, cell: Cell
) -> None:
    reps, horizon, seed = 2, 150, 8
    simulated = play(cell, reps=reps, horizon=horizon, seed=seed, per_decision_rng=True)
    arms, cumulative = await _replay(patient_app, app_settings, cell, reps, horizon, seed)
    mismatch = np.argwhere(arms != simulated.arms)
    assert mismatch.size == 0, f"first differing (rep, round): {mismatch[:3].tolist()}"
    np.testing.assert_array_equal(cumulative, simulated.cumulative)


# -- upgrading what an earlier version stored ------------------------------------


def _unpacked(config: PolicyConfig, stats: dict[str, bytes]) -> State:
    """A covariates experiment's stored blobs of arms a and b as a state (batch of one)."""
    return assemble_state(config, [stats.get(keys.model_field(a)) for a in "ab"],
                          [stats.get(keys.arm_field(a)) for a in "ab"])


# What earlier versions stored: raw reward sums, Gram matrices whole (the first
# two) or as their upper triangle (the third), in their layout's order.
_LEGACY_RECIPES = {
    "absent": None,
    "whole Gram": {"model_recipe": "outer,r_x,r2,one,r", "arm_recipe": "one,r,r2"},
    "raw sums": {"model_recipe": "outer_upper,r_x,r2,one,r", "arm_recipe": "one,r,r2"},
}


def _legacy_blob(config: PolicyConfig, axis: str, blob: bytes, whole_gram: bool) -> bytes:
    fields = order_free(unpack(config, axis, blob))  # type: ignore[arg-type]
    if axis == "model":
        gram = fields["xtx"] if whole_gram else fields["xtx"][np.triu_indices(config.dim)]
        parts = [gram, fields["xty"], fields["raw sum_dy2"], fields["n"], fields["raw sum_dy"]]
    else:
        parts = [fields["pulls"], fields["raw sum_dr"], fields["raw sum_dr2"]]
    return np.concatenate([np.ravel(v) for v in parts]).astype("<f8").tobytes()


@pytest.mark.parametrize("recipes", list(_LEGACY_RECIPES))
async def test_experiments_stored_by_earlier_versions_are_upgraded_at_start_up(
    app_settings: Settings, redis_db: str, recipes: str
) -> None:
    """The first version stored no recipes, the next ones whole Gram matrices or raw sums."""
    spec = ExperimentSpec(id="legacy", setting="covariates", dim=3,
                          arms=(ArmSpec("a"), ArmSpec("b")), seed=2)
    service = await ExperimentService.open(app_settings)
    try:
        _, key = await service.create(spec)
        _, fresh_key = await service.create(dataclasses.replace(spec, id="fresh"))  # no reward
        await service.create(dataclasses.replace(spec, id="broken"))
        for context in ((1.0, 0.5, -0.25), (0.5, 2.0, 1.0), (-1.0, 0.0, 3.0)):
            decision = await service.choose("legacy", ChooseRequest(context=context), key)
            await service.reward("legacy", [(decision.decision_id, sum(context))], key)
        pending = await service.choose("legacy", ChooseRequest(context=(0.25, 0.5, 1.0)), key)
        config = PolicyConfig(**(await service.get("legacy")).config)  # type: ignore[arg-type]
    finally:
        await service.close()
    current = stored_stats(redis_db, "legacy")

    # What an earlier version left: old recipes, no field names, old blobs.
    client = redis.Redis.from_url(redis_db)
    legacy_recipes = _LEGACY_RECIPES[recipes]
    try:
        for experiment_id in ("legacy", "fresh", "broken"):
            if legacy_recipes is None:
                client.hdel(keys.meta(experiment_id), "model_recipe", "arm_recipe")
            else:
                client.hset(keys.meta(experiment_id), mapping=legacy_recipes)
        # the context whole, in one field
        records.make_legacy(client, "legacy", pending.decision_id, chunked=False)
        client.hdel(keys.decision("legacy", pending.decision_id), "model_field", "arm_field")
        for name, blob in current.items():
            axis = "model" if name.startswith("model") else "arm" if name.startswith("arm:") else ""
            if axis:
                legacy = _legacy_blob(config, axis, blob, whole_gram=recipes != "raw sums")
                client.hset(keys.stats("legacy"), mapping={name: legacy})
        client.hset(keys.stats("broken"), mapping={keys.model_field("a"): "\0" * 8})
        drop_outcomes(client, "legacy")  # those versions added every reward to the sums
    finally:
        client.close()

    upgraded = await ExperimentService.open(app_settings)
    again = await ExperimentService.open(app_settings)  # a second worker: nothing left to do
    try:
        assert upgraded.upgraded == ["fresh", "legacy"] and again.upgraded == []
        assert [f.split(":")[0] for f in upgraded.upgrade_failures] == ["broken"]
        # The same sums, now about each blob's mean reward instead of its first.
        assert_stats_equal(config, ["a", "b"], stored_stats(redis_db, "legacy"),
                           _unpacked(config, current), rtol=1e-12)
        outcome = await upgraded.reward("legacy", [(pending.decision_id, 0.5)], key)
        assert outcome[0].status == "applied"
        assert (await upgraded.choose("legacy", ChooseRequest(context=(1.0, 1.0, 1.0)), key))
        assert (await upgraded.get("legacy")).rewards == 4
        fresh = await upgraded.choose("fresh", ChooseRequest(context=(1.0, 1.0, 1.0)), fresh_key)
        assert (await upgraded.reward("fresh", [(fresh.decision_id, 1.0)], fresh_key))[0].status \
            == "applied"
    finally:
        await upgraded.close()
        await again.close()


async def test_a_resent_creation_is_recognised_and_another_is_refused(redis_db: str) -> None:
    # The client resends a script whose reply was lost: the resend must not turn
    # a creation into a 409 (the API key, shown once, would be lost).
    store = Store.from_url(redis_db, 2.0)
    try:
        meta = {"incarnation": "aaaa", "version": "1", "spec": "{}"}
        assert await store.create("twice", meta, {"a": "{}"})
        assert await store.create("twice", meta, {"a": "{}"})  # the resend
        assert not await store.create("twice", {**meta, "incarnation": "bbbb"}, {"a": "{}"})
        assert await store.list_ids() == ["twice"]
    finally:
        await store.close()


async def test_concurrent_retirements_and_additions_keep_the_experiments_limits(
    service: ExperimentService, other_service: ExperimentService, app_settings: Settings
) -> None:
    # Each request alone is valid; the limits must hold for them together,
    # so they are checked in the scripts that change the arms.
    arms = tuple(ArmSpec(a) for a in "abc")
    await service.create(ExperimentSpec(id="few", setting="covariates", dim=2, arms=arms))
    await other_service.get("few")
    results = await asyncio.gather(service.retire_arms("few", ["a", "b"]),
                                   other_service.retire_arms("few", ["c"]),
                                   return_exceptions=True)
    assert sum(isinstance(r, InvalidInput) for r in results) == 1, results
    assert any(a.active for a in (await service.get("few")).arms)

    room = app_settings.max_arms - 3
    first = [ArmSpec(f"x{i}") for i in range(room)]
    second = [ArmSpec(f"y{i}") for i in range(room)]
    results = await asyncio.gather(service.add_arms("few", first),
                                   other_service.add_arms("few", second),
                                   return_exceptions=True)
    assert sum(isinstance(r, InvalidInput) for r in results) == 1, results
    assert len((await service.get("few")).arms) == app_settings.max_arms
