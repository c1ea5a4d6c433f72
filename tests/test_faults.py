"""Redis faults, against a redis-server these tests start, pause, kill and fill.

- the fault suite: a real ``linreboot serve`` on a Redis that is killed (-9)
  and restarted from its AOF, stalled (SIGSTOP) past the deadline, restarted
  cleanly with its script cache flushed, and filled to ``maxmemory``. Clients
  drive ``/choose`` and ``/reward`` through each fault and keep a ledger; the
  audit finds no acknowledged reward lost or counted twice, only 200, 4xx or
  503 with Retry-After, the first 503 within the deadline plus 0.5 s, and the
  same service serving again once the fault is undone (loadtest.faults);
- at the memory limit every write is whole or refused whole, on Redis 6.2 and 7:
  Redis refuses a script at its first write (7, a function that may write
  before it runs), so a refused reward, decision or creation changes nothing,
  and answers 503 ``store_full``; readiness says so;
- a stalled Redis fails each store call at its deadline, retries included,
  in the auto-pipelining batcher too, and the same store serves again after.

The deadline is 1 s here (``LINREBOOT_REDIS_TIMEOUT_SECONDS``) to keep the
suite fast; the bound on the first 503 is the one the issue sets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

import httpx
import pytest
from pydantic import SecretStr

from loadtest.faults import (
    Fault,
    Outcome,
    RedisProcess,
    faults,
    redis_7_binary,
    redis_process,
    run_scenario,
)
from loadtest.server import free_port, server_process
from service import keys
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec
from service.errors import StoreFull, StoreUnavailable
from service.experiments import ExperimentService
from service.settings import Settings
from service.store import Store, _translated
from tests.conftest import ADMIN, ADMIN_TOKEN

pytestmark = pytest.mark.anyio

DEADLINE_SECONDS = 1.0
# Spins for three whole seconds, timed to the microsecond: timed in whole seconds
# it ran anywhere from 1 to 2 s, and a short run ended inside the 1.3 s the
# reward below waits (0.3 s + the deadline), which then succeeded.
BUSY_FOR_3_SECONDS = (
    "local function now() local t = redis.call('TIME') "
    "return tonumber(t[1]) * 1000000 + tonumber(t[2]) end "
    "local stop = now() + 3000000 while now() < stop do end return 1")
STALL_SECONDS = 2.5  # longer than the deadline: the stall must show as 503s
FIRST_503_SLACK_SECONDS = 0.5  # the bound: the deadline plus 0.5 s


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    with redis_process(tmp_path_factory.mktemp("faults"), free_port()) as server:
        yield server


@pytest.fixture(scope="module")
def service_url(redis_server: RedisProcess) -> Iterator[str]:
    env = {
        "LINREBOOT_REDIS_URL": redis_server.url,
        "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN,
        "LINREBOOT_REDIS_TIMEOUT_SECONDS": str(DEADLINE_SECONDS),
        "LINREBOOT_LOG_LEVEL": "error",
    }
    with server_process(env) as url:
        yield url


def _set_maxmemory(server: RedisProcess, value: int) -> None:
    with server.client() as client:
        client.config_set("maxmemory", value)


@pytest.fixture(scope="module")
def redis_7_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    binary = redis_7_binary()
    if binary is None:
        pytest.skip("no redis-server 7 on PATH: install Debian's redis-server package "
                    "(./dev test does, as root)")
    with redis_process(tmp_path_factory.mktemp("faults7"), free_port(), binary) as server:
        yield server


@pytest.fixture(params=["6.2", "7"])
def memory_limit(request: pytest.FixtureRequest) -> Iterator[RedisProcess]:
    """A Redis 6.2 (scripts by EVALSHA) and a Redis 7 (functions by FCALL, which Redis
    refuses out of memory before they run when they may write), its maxmemory lifted
    again after the test whatever happens."""
    server: RedisProcess = request.getfixturevalue(
        "redis_server" if request.param == "6.2" else "redis_7_server")
    try:
        yield server
    finally:
        _set_maxmemory(server, 0)


# -- the fault suite --------------------------------------------------------------


def _assert_survived(outcome: Outcome, slots: int = 1) -> None:
    statuses = outcome.statuses
    assert all(s == 200 or 400 <= s < 500 or s == 503 for s in statuses), statuses
    assert outcome.refused_without_retry_after == 0
    assert outcome.recovered_at is not None, "the service did not serve again"
    assert outcome.refused_after_recovery == 0
    assert outcome.readiness_last() == 200
    # The ledger against the stored statistics.
    assert outcome.unresolved == 0  # every 503'd reward, resent, was applied or duplicate
    assert outcome.acknowledged > 0
    assert (outcome.lost, outcome.counted_twice) == (0, 0)
    assert outcome.stored_rewards == outcome.acknowledged
    # Every /choose named its decision id and was sent again until answered: each id is
    # one decision, none recorded twice by a retry, none lost (issue 29).
    assert outcome.ledger.unanswered_ids == set()
    # (a ranking's slots each count as a decision)
    assert outcome.stored_decisions == slots * len(outcome.ledger.chosen_ids) > 0
    assert outcome.sums_match
    assert outcome.audit_statuses == {"duplicate": outcome.acknowledged}


@pytest.mark.slow
@pytest.mark.parametrize("fault", faults(STALL_SECONDS), ids=["kill", "stall", "restart", "oom"])
async def test_the_service_survives_the_fault_without_losing_or_doubling_a_reward(
    service_url: str, redis_server: RedisProcess, fault: Fault, request: pytest.FixtureRequest
) -> None:
    experiment_id = f"faults-{request.node.callspec.id}"
    outcome = await run_scenario(service_url, ADMIN_TOKEN, redis_server, fault, experiment_id)

    _assert_survived(outcome)
    first_503 = outcome.first_503_seconds
    if fault.hold_seconds > DEADLINE_SECONDS:  # every fault but the quick clean restart
        assert first_503 is not None, "a fault held past the deadline gave no 503"
    if first_503 is not None:
        assert first_503 <= DEADLINE_SECONDS + FIRST_503_SLACK_SECONDS
    if fault.name.startswith("maxmemory"):  # every write refused while it held
        refused = {r.error for r in outcome.ledger.replies if r.status == 503}
        assert refused == {"store_full"}
        assert outcome.readiness_during()["503 store_full"] > 0
        assert outcome.metrics_during == "linreboot_store_full 1.0"
        assert outcome.metrics_after == "linreboot_store_full 0.0"


@pytest.mark.slow
@pytest.mark.parametrize("fault", faults(STALL_SECONDS), ids=["kill", "stall", "restart", "oom"])
async def test_every_slot_of_a_ranking_is_rewarded_exactly_once_through_the_fault(
    service_url: str, redis_server: RedisProcess, fault: Fault, request: pytest.FixtureRequest
) -> None:
    """/rank of 3 arms under the fault, every slot rewarded: no slot's acknowledged reward
    lost or counted twice, every ranking recorded once with its 3 slots (issue 28)."""
    experiment_id = f"ranked-{request.node.callspec.id}"
    outcome = await run_scenario(service_url, ADMIN_TOKEN, redis_server, fault, experiment_id,
                                 slots=3)
    _assert_survived(outcome, slots=3)
    assert {d.rpartition("#")[2] for d in outcome.ledger.decisions} == {"1", "2", "3"}


# -- the memory limit ---------------------------------------------------------------


@pytest.fixture
async def service_on(memory_limit: RedisProcess) -> AsyncIterator[ExperimentService]:
    with memory_limit.client() as client:
        client.flushdb()
    settings = Settings(redis_url=memory_limit.url, redis_timeout_seconds=DEADLINE_SECONDS)
    opened = await ExperimentService.open(settings)
    try:
        yield opened
    finally:
        await opened.close()


def _dump(server: RedisProcess, names: Sequence[str] | None = None) -> dict[bytes, bytes | None]:
    """The keys (all of them by default) and their serialised values (TTLs aside).

    A set is its sorted members: DUMP writes them in hash-table order, which
    an SADD taken back by an SREM may change (the table grew on the way).
    """
    with server.client() as client:
        listed = client.keys("*") if names is None else [n.encode() for n in names]
        return {k: b"\n".join(sorted(client.smembers(k))) if client.type(k) == b"set"
                else client.dump(k) for k in listed}


def _used_memory(server: RedisProcess) -> int:
    with server.client() as client:
        return int(client.info("memory")["used_memory"])


SPEC = ExperimentSpec(id="mem", setting="covariates", dim=3, arms=(ArmSpec("a"), ArmSpec("b")))


async def test_out_of_memory_refuses_writes_whole_and_recovers(
    service_on: ExperimentService, memory_limit: RedisProcess
) -> None:
    service = service_on
    await service.create(SPEC)
    rewarded = await service.choose("mem", ChooseRequest(context=(1.0, 2.0, 3.0)))
    await service.reward("mem", [(rewarded.decision_id, 0.5)])
    pending = await service.choose("mem", ChooseRequest(context=(0.5, -1.0, 2.0)))
    before = _dump(memory_limit)
    _set_maxmemory(memory_limit, 1)  # far below what Redis uses: every write is refused

    async def three_decisions() -> None:  # one joined decide.lua call: each refused
        made = await asyncio.gather(*(
            service.choose("mem", ChooseRequest(context=(1.0, 1.0, float(i))))
            for i in range(3)), return_exceptions=True)
        assert all(isinstance(m, StoreFull) for m in made), made
        raise made[0]  # type: ignore[misc]

    attempts: dict[str, Callable[[], Awaitable[object]]] = {
        "reward": lambda: service.reward("mem", [(pending.decision_id, 1.5)]),
        "duplicate and new": lambda: service.reward(
            "mem", [(rewarded.decision_id, 0.5), (pending.decision_id, 1.5)]),
        "choose": lambda: service.choose("mem", ChooseRequest(context=(1.0, 1.0, 1.0))),
        "choose, three in one call": three_decisions,
        "create": lambda: service.create(ExperimentSpec(id="other", setting="covariates", dim=2,
                                                        arms=(ArmSpec("a"),))),
        "ready": service.ready,
    }
    for name, attempt in attempts.items():
        with pytest.raises(StoreFull):
            await attempt()
        assert _dump(memory_limit) == before, name

    _set_maxmemory(memory_limit, 0)
    await service.ready()
    assert (await service.reward("mem", [(pending.decision_id, 1.5)]))[0].status == "applied"
    view = await service.get("mem")
    assert (view.decisions, view.rewards, sum(a.pulls for a in view.arms)) == (2, 2, 2)
    assert [e.spec.id for e in (await service.list())[0]] == ["mem"]


@pytest.mark.unsharded  # (its calls name the experiment's own keys)
async def test_out_of_memory_a_joined_call_answers_what_needs_no_write(
    service_on: ExperimentService, memory_limit: RedisProcess
) -> None:
    """One decide.lua call of three decisions, out of memory: a decision recorded before
    (a resent call) is answered; one whose predicted number was taken (a number set aside
    for it) and a new one are refused; nothing is written."""
    service = service_on
    await service.create(SPEC)
    made = await service.choose("mem", ChooseRequest(context=(1.0, 2.0, 3.0)))
    with memory_limit.client() as client:
        incarnation = client.hget(keys.meta("mem"), "incarnation").decode()
    before = _dump(memory_limit)
    _set_maxmemory(memory_limit, 1)
    common = {"key_hash": None, "incarnation": incarnation, "seen": None, "reserved": False,
              "ttl_seconds": 60, "max_lag": 0, "grace_seconds": 30,
              "record": b"model:a\narm:a\na\n1\n0\n0.0\n0.5\n" + b"\0" * 24}
    again, predicted, new = await asyncio.gather(
        service._store.decide("mem", made.decision_id, number=None, **common),
        service._store.decide("mem", "p" * 32, number=made.decision_number, **common),
        service._store.decide("mem", "n" * 32, number=None, **common),
        return_exceptions=True)
    assert not isinstance(again, BaseException)
    assert (again.status, again.number) == ("recorded", made.decision_number)
    assert isinstance(predicted, StoreFull) and isinstance(new, StoreFull)
    assert _dump(memory_limit) == before


@pytest.mark.unsharded  # (its call names the experiment's own keys)
async def test_out_of_memory_a_read_first_is_answered(
    service_on: ExperimentService, memory_limit: RedisProcess
) -> None:
    """progress.lua writes nothing: out of memory, a worker's read first
    (Store.probe_progress) is still answered (by EVALSHA on 6.2; on Redis 7 a function
    flagged no-writes); nothing is written."""
    service = service_on
    await service.create(SPEC)
    made = await service.choose("mem", ChooseRequest(context=(1.0, 2.0, 3.0)))
    assert (await service.reward("mem", [(made.decision_id, 1.0)]))[0].status == "applied"
    before = _dump(memory_limit)
    _set_maxmemory(memory_limit, 1)
    progress = await service._store.probe_progress("mem", held=0)
    assert progress is not None
    assert (progress.rewards, len(progress.unfolded)) == (1, 1)
    assert _dump(memory_limit) == before


def _experiment_keys(experiment_id: str, decision_ids: Sequence[str] = ()) -> list[str]:
    return [keys.meta(experiment_id), keys.arms(experiment_id), keys.stats(experiment_id),
            *(keys.decision(experiment_id, d) for d in decision_ids)]


# Around the limit: Redis counts the buffers of the command it is about to run
# (and frees idle ones in the background), so INFO's figure moves by some KB.
MARGINS = (-1_000_000, -16_000, -4_000, 0, 2_000, 4_000, 8_000, 12_000, 16_000, 24_000, 32_000)


@pytest.mark.unsharded  # (it lists stored experiments by their meta keys: members too)
async def test_at_the_memory_limit_each_write_is_whole_or_refused_whole(
    service_on: ExperimentService, memory_limit: RedisProcess
) -> None:
    """Limits around what Redis uses: each batch of rewards, each creation, whole or nothing.

    Redis decides at a script's start whether it is out of memory, and then
    refuses the script's first write only: one that has written goes on to
    its end, past the limit if need be. So whatever the order of a script's
    writes, a refused script has changed nothing.
    """
    service = service_on
    await service.create(SPEC)
    outcomes: dict[str, set[str]] = {"rewards": set(), "create": set()}
    big_arms = tuple(ArmSpec(f"arm-{i:04d}") for i in range(200))  # about 10 KB of arms
    for step, margin in enumerate(MARGINS):
        decisions = [await service.choose("mem", ChooseRequest(context=(1.0, 0.5, float(i))))
                     for i in range(30)]
        touched = _experiment_keys("mem", [d.decision_id for d in decisions])
        before, counted = _dump(memory_limit, touched), (await service.get("mem")).rewards
        _set_maxmemory(memory_limit, _used_memory(memory_limit) + margin)
        try:
            statuses = await service.reward("mem", [(d.decision_id, 1.0) for d in decisions])
            assert [s.status for s in statuses] == ["applied"] * len(decisions)
            outcomes["rewards"].add("whole")
        except StoreFull:
            assert _dump(memory_limit, touched) == before
            outcomes["rewards"].add("refused")
        spec = ExperimentSpec(id=f"big{step}", setting="covariates", dim=2, arms=big_arms)
        touched = [*_experiment_keys(spec.id), keys.EXPERIMENT_INDEX]
        before = _dump(memory_limit, touched)
        try:
            view, _ = await service.create(spec)
            assert len(view.arms) == len(big_arms)
            outcomes["create"].add("whole")
        except StoreFull:
            assert _dump(memory_limit, touched) == before
            outcomes["create"].add("refused")
        _set_maxmemory(memory_limit, 0)
        assert (await service.get("mem")).rewards in (counted, counted + len(decisions))
    listed = {e.spec.id for e in (await service.list(limit=1000))[0]}
    with memory_limit.client() as client:
        stored = {m.decode() for m in client.smembers(keys.EXPERIMENT_INDEX)}
        existing = {k.decode().split("{")[1].split("}")[0] for k in client.keys("lrb:{*}:meta")}
    assert listed == stored == existing  # listed if and only if it exists
    assert outcomes == {"rewards": {"whole", "refused"}, "create": {"whole", "refused"}}


async def test_readiness_says_full_while_writes_are_refused_near_the_limit(
    service_on: ExperimentService, memory_limit: RedisProcess
) -> None:
    """INFO reads just under the limit, but writes were refused just now: not ready.

    Near the limit a write's own arguments tip Redis over while INFO, a few
    bytes, reads under it; a refusal of the last seconds decides there.
    """
    service = service_on
    await service.create(SPEC)
    _set_maxmemory(memory_limit, 1)
    with pytest.raises(StoreFull):
        await service.choose("mem", ChooseRequest(context=(1.0, 2.0, 3.0)))
    _set_maxmemory(memory_limit, _used_memory(memory_limit) + 100_000)  # 100 kB to spare
    with pytest.raises(StoreFull):
        await service.ready()
    _set_maxmemory(memory_limit, _used_memory(memory_limit) + 2**22)  # 4 MiB to spare
    await service.ready()


# (a sharded creation refused halfway leaves members nobody can use, which the next
# creation of the id removes first: Lifecycle._create_members)
@pytest.mark.unsharded
async def test_a_creation_whose_index_write_is_refused_is_undone(
    service_on: ExperimentService, memory_limit: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory runs out between the creation script and the index write (other traffic)."""
    store = service_on._store
    write = store._write

    async def then_memory_runs_out(script: object, *args: object) -> object:
        answer = await write(script, *args)  # type: ignore[arg-type]
        if script is store._create:
            _set_maxmemory(memory_limit, 1)
        return answer

    monkeypatch.setattr(store, "_write", then_memory_runs_out)
    with pytest.raises(StoreFull):
        await service_on.create(SPEC)
    assert _dump(memory_limit) == {}  # nobody has its key: nothing may be left
    _set_maxmemory(memory_limit, 0)
    monkeypatch.undo()
    view, _ = await service_on.create(SPEC)  # the id is free
    assert [e.spec.id for e in (await service_on.list())[0]] == [view.spec.id]


async def test_the_app_answers_503_store_full_and_readiness_says_so(
    memory_limit: RedisProcess
) -> None:
    from app.main import create_app

    redis_server = memory_limit
    with redis_server.client() as client:
        client.flushdb()
    settings = Settings(redis_url=redis_server.url, admin_token=SecretStr(ADMIN_TOKEN),
                        redis_timeout_seconds=DEADLINE_SECONDS)
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            spec = {"id": "app", "setting": "covariates", "dim": 2, "arms": [{"id": "a"}]}
            created = await http.post("/experiments", json=spec, headers=ADMIN)
            key = {"X-API-Key": created.json()["api_key"]}
            chosen = await http.post("/choose", json={"experiment_id": "app",
                                                      "context": [1.0, 2.0]}, headers=key)
            _set_maxmemory(redis_server, 1)
            answers = [
                await http.post("/choose", json={"experiment_id": "app", "context": [1.0, 2.0]},
                                headers=key),
                await http.post("/reward", json={"experiment_id": "app", "reward": 1.0,
                                                 "decision_id": chosen.json()["decision_id"]},
                                headers=key),
                await http.post("/experiments", json={**spec, "id": "app2"}, headers=ADMIN),
                await http.get("/readyz"),
            ]
            # Reads are a script that writes nothing, which Redis runs out of memory.
            assert (await http.get("/experiments/app", headers=ADMIN)).status_code == 200
            for answer in answers:
                assert answer.status_code == 503, answer.text
                assert answer.headers["retry-after"] == str(settings.retry_after_seconds)
                assert answer.json()["error"] == "store_full"
                assert "memory" in answer.json()["message"]
            assert "linreboot_store_full 1.0" in (await http.get("/metrics")).text

            _set_maxmemory(redis_server, 0)
            assert (await http.get("/readyz")).status_code == 200
            assert "linreboot_store_full 0.0" in (await http.get("/metrics")).text
            again = await http.post("/reward", json={
                "experiment_id": "app", "reward": 1.0,
                "decision_id": chosen.json()["decision_id"]}, headers=key)
            assert again.json()["status"] == "applied"


@pytest.mark.parametrize("fault", ["replica", "busy script"])
async def test_redis_refusing_commands_for_now_is_503_and_readiness_says_so(
    redis_server: RedisProcess, fault: str
) -> None:
    """A failover (READONLY) or another client's long script (BUSY) is 503, not 500."""
    from app.main import create_app

    with redis_server.client() as client:
        client.flushdb()
    settings = Settings(redis_url=redis_server.url, admin_token=SecretStr(ADMIN_TOKEN),
                        redis_timeout_seconds=DEADLINE_SECONDS)
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            spec = {"id": "app", "setting": "covariates", "dim": 2, "arms": [{"id": "a"}]}
            created = await http.post("/experiments", json=spec, headers=ADMIN)
            key = {"X-API-Key": created.json()["api_key"]}
            body = {"experiment_id": "app", "context": [1.0, 2.0]}
            chosen = await http.post("/choose", json=body, headers=key)
            reward = {"experiment_id": "app", "reward": 1.0,
                      "decision_id": chosen.json()["decision_id"]}
            with redis_server.client() as client:
                if fault == "replica":
                    client.execute_command("REPLICAOF", "127.0.0.1", "1")  # nobody there
                    answers = [await http.post("/choose", json=body, headers=key),
                               await http.post("/reward", json=reward, headers=key),
                               await http.get("/readyz")]
                    client.execute_command("REPLICAOF", "NO", "ONE")
                else:
                    client.config_set("lua-time-limit", 50)
                    blocker = asyncio.create_task(asyncio.to_thread(
                        client.eval, BUSY_FOR_3_SECONDS, 0))
                    await asyncio.sleep(0.3)
                    answers = [await http.post("/reward", json=reward, headers=key)]
                    await blocker
            for answer in answers:
                assert answer.status_code == 503, answer.text
                assert answer.headers["retry-after"] == str(settings.retry_after_seconds)
            assert (await http.get("/readyz")).status_code == 200
            again = await http.post("/reward", json=reward, headers=key)
            assert again.json()["status"] == "applied"


# -- the deadline -----------------------------------------------------------------


async def test_a_stalled_redis_fails_each_call_at_its_deadline_and_the_store_recovers(
    redis_server: RedisProcess,
) -> None:
    """Through the batcher (decisions, rewards) and plain calls alike; one deadline each."""
    deadline = 0.5
    with redis_server.client() as client:
        client.flushdb()
    service = await ExperimentService.open(
        Settings(redis_url=redis_server.url, redis_timeout_seconds=deadline))
    try:
        await service.create(SPEC)
        context = ChooseRequest(context=(1.0, 2.0, 3.0))
        pending = [await service.choose("mem", context) for _ in range(5)]
        redis_server.pause()
        try:
            started = time.monotonic()
            calls: list[Awaitable[object]] = [service.choose("mem", context) for _ in range(5)]
            calls += [service.reward("mem", [(d.decision_id, 1.0)]) for d in pending]
            calls += [service.get("mem"), service.ready()]
            results = await asyncio.gather(*calls, return_exceptions=True)
            elapsed = time.monotonic() - started
        finally:
            redis_server.resume()
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        assert elapsed <= deadline + FIRST_503_SLACK_SECONDS
        # The same store, its pool and its batcher serve again.
        replies = await asyncio.gather(*(service.reward("mem", [(d.decision_id, 1.0)])
                                         for d in pending))
        assert {r[0].status for r in replies} <= {"applied", "duplicate"}  # sent before, maybe
        assert (await service.get("mem")).rewards == 5
        decision = await service.choose("mem", context)
        assert (await service.reward("mem", [(decision.decision_id, 2.0)]))[0].status == "applied"
    finally:
        await service.close()


async def test_a_connection_closed_under_the_client_is_a_503_not_a_500(
    redis_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py's asyncio cluster client can write to a connection another task is
    closing (seen in a slot migration): ``AttributeError: 'NoneType' object has no
    attribute 'writelines'`` from inside redis-py. That is the store unavailable, as
    a dropped connection is; an AttributeError of our own stays a bug."""
    from redis.asyncio import Redis
    from redis.asyncio.connection import Connection

    store = Store.from_url(redis_db, 2.0)
    try:
        await store.ping()
        monkeypatch.setattr(Connection, "is_connected", property(lambda self: True))
        assert isinstance(store._client, Redis)
        for connection in store._client.connection_pool._available_connections:
            connection._writer = None  # closed by "another task"
        with pytest.raises(StoreUnavailable):
            await store.ping()
        monkeypatch.undo()

        async def ours(self: Store) -> None:
            raise AttributeError("a bug of ours")

        monkeypatch.setattr(Store, "list_ids", _translated(ours))
        with pytest.raises(AttributeError, match="a bug of ours"):
            await store.list_ids()
    finally:
        await store.close()


def test_a_transport_closed_under_a_command_is_a_503_under_uvloop(
    redis_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25: in a cluster failover redis-py closes the connections of the node that
    failed while commands still write to them, and uvloop (the event loop uvicorn runs)
    raises ``RuntimeError: unable to perform operation on <TCPTransport closed=True
    ...>; the handler is closed``. That is a dropped connection: 503, not a 500. Here
    the transports are closed by hand just before a command writes to them; an
    unrelated RuntimeError stays a bug."""
    import uvloop
    from redis.asyncio.connection import Connection

    async def scenario() -> None:
        store = Store.from_url(redis_db, 2.0)
        try:
            await store.ping()
            monkeypatch.setattr(Connection, "is_connected", property(lambda self: True))
            pool = store._client.connection_pool  # type: ignore[union-attr]
            for connection in pool._available_connections:
                assert connection._writer is not None
                connection._writer.transport.close()  # no await: still "connected"
            with pytest.raises(StoreUnavailable) as caught:
                await store.ping()
            assert "the handler is closed" in str(caught.value.__cause__)
            monkeypatch.undo()

            async def ours(self: Store) -> None:
                raise RuntimeError("a bug of ours")

            monkeypatch.setattr(Store, "list_ids", _translated(ours))
            with pytest.raises(RuntimeError, match="a bug of ours"):
                await store.list_ids()
        finally:
            await store.close()

    uvloop.run(scenario())
