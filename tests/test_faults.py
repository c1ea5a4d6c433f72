"""Redis faults, against a redis-server these tests start, pause, kill and restart.

- the fault suite: a real ``linreboot serve`` on a Redis that is killed (-9)
  and restarted from its AOF, stalled (SIGSTOP) past the deadline, and
  restarted cleanly with its script cache flushed. Clients drive ``/choose``
  and ``/reward`` through each fault and keep a ledger; the audit finds no
  acknowledged reward lost or counted twice, only 200, 4xx or 503 with
  Retry-After, the first 503 within the deadline plus 0.5 s, and the same
  service serving again once the fault is undone (loadtest.faults);
- a stalled Redis fails each store call at its deadline, retries included,
  in the auto-pipelining batcher too, and the same store serves again after.

The deadline is 1 s here (``LINREBOOT_REDIS_TIMEOUT_SECONDS``) to keep the
suite fast; the bound on the first 503 is the one the issue sets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator

import pytest

from loadtest.faults import Fault, Outcome, RedisProcess, faults, redis_process, run_scenario
from loadtest.server import free_port, server_process
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec
from service.errors import StoreUnavailable
from service.experiments import ExperimentService
from service.settings import Settings
from tests.conftest import ADMIN_TOKEN

pytestmark = pytest.mark.anyio

DEADLINE_SECONDS = 1.0
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


@pytest.fixture
def memory_limit(redis_server: RedisProcess) -> Iterator[RedisProcess]:
    """The Redis, its maxmemory lifted again after the test whatever happens."""
    try:
        yield redis_server
    finally:
        _set_maxmemory(redis_server, 0)


# -- the fault suite --------------------------------------------------------------


def _assert_survived(outcome: Outcome) -> None:
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
    assert outcome.sums_match
    assert outcome.audit_statuses == {"duplicate": outcome.acknowledged}


@pytest.mark.slow
@pytest.mark.parametrize("fault", faults(STALL_SECONDS)[:3], ids=["kill", "stall", "restart"])
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


# -- the deadline -----------------------------------------------------------------


SPEC = ExperimentSpec(id="mem", setting="covariates", dim=3, arms=(ArmSpec("a"), ArmSpec("b")))


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
            calls += [service.get("mem"), service.ping()]
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
