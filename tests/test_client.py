"""linreboot.client: its retry schedule, then against the real service.

- the schedule and the retry rules, as pure functions (no network);
- every error class from a real answer of the app (``httpx.ASGITransport``),
  each after exactly one request (a 4xx is never retried); batches in chunks;
  a duplicate reward reported as counted; unknown answer fields ignored;
- every method, sync and async, against ``linreboot serve``;
- retries against ``linreboot serve`` on a redis-server these tests pause
  (SIGSTOP past the service's deadline) and fill (maxmemory): a reward gets
  through the stall and counts once, after waiting ``Retry-After``; a
  ``/choose`` is not retried after a 503 ``store_unavailable`` or a timeout
  unless asked, but is after a refused connection; ``store_full`` refuses
  the write whole, so every call is retried through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from linreboot.client import (
    NO_RETRY,
    ApiError,
    AsyncClient,
    Client,
    Conflict,
    Decision,
    DecisionNotFound,
    Experiment,
    Forbidden,
    InvalidInput,
    NotFound,
    Retry,
    RewardConflict,
    RewardResult,
    StoreFull,
    TooLarge,
    TransportError,
    Unavailable,
    UnsupportedMediaType,
)
from linreboot.client._core import DEFAULT_MAX_BATCH_REWARDS, Core
from linreboot.client._errors import error_from_response, retry_after_seconds
from linreboot.client._retry import Attempts, Retryable, Wait
from loadtest.faults import RedisProcess, redis_process
from loadtest.server import free_port, server_process
from service.settings import Settings
from tests.conftest import ADMIN_TOKEN

pytestmark = pytest.mark.anyio

DEADLINE_SECONDS = 0.5  # the service's LINREBOOT_REDIS_TIMEOUT_SECONDS here
RETRY_AFTER_SECONDS = 1  # its LINREBOOT_RETRY_AFTER_SECONDS (the default)
STALL_SECONDS = DEADLINE_SECONDS + 0.7  # a bit longer than the deadline: 503s, then recovery
# The client's own backoff in these tests is at most 0.05 s: a wait of a
# second or more after a 503 is Retry-After's.
PATIENT = Retry(attempts=20, deadline_seconds=30.0, backoff_seconds=0.05,
                max_backoff_seconds=0.05)
MAX_BATCH = 3  # the quick app's LINREBOOT_MAX_BATCH_REWARDS
MAX_BODY = 4000  # and its LINREBOOT_MAX_BODY_BYTES


# -- the schedule, pure -----------------------------------------------------------


@pytest.mark.parametrize(("retry", "u", "expected"), [
    (1, 0.0, 0.1), (1, 1.0, 0.2), (2, 0.0, 0.2), (3, 1.0, 0.8), (3, 0.5, 0.6),
    (4, 0.5, 1.125), (5, 1.0, 1.5), (9, 0.0, 0.75),  # capped at max_backoff_seconds = 1.5
])
def test_backoff_doubles_up_to_the_cap_with_equal_jitter(retry: int, u: float,
                                                         expected: float) -> None:
    policy = Retry(backoff_seconds=0.2, max_backoff_seconds=1.5)
    assert policy.wait(retry, None, u) == pytest.approx(expected)


def test_retry_after_is_a_floor_with_a_bounded_jitter() -> None:
    policy = Retry(backoff_seconds=0.2, max_backoff_seconds=10.0, retry_after_jitter=0.1)
    assert policy.wait(1, 2.0, 0.0) == pytest.approx(2.0)
    assert policy.wait(1, 2.0, 1.0) == pytest.approx(2.2)
    assert policy.wait(6, 2.0, 1.0) == pytest.approx(6.4)  # the backoff, when longer


@pytest.mark.parametrize(("header", "seconds"), [("3", 3.0), ("0.5", 0.5), ("-2", 0.0),
                                                 ("soon", None)])
def test_retry_after_header(header: str, seconds: float | None) -> None:
    assert retry_after_seconds({"retry-after": header}) == seconds
    assert retry_after_seconds({}) is None


def test_retry_after_as_a_date() -> None:
    in_ten = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 10))
    assert retry_after_seconds({"retry-after": in_ten}) == pytest.approx(10, abs=1.5)


@pytest.mark.parametrize("kwargs", [{"attempts": 0}, {"deadline_seconds": 0.0},
                                    {"backoff_seconds": -1.0}, {"retry_after_jitter": -0.1}])
def test_retry_refuses_bad_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Retry(**kwargs)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _attempts(retryable: Retryable, retry: Retry | None = None,
              clock: FakeClock | None = None, timeout: float = 10.0) -> Attempts:
    return Attempts(retry or Retry(), retryable, httpx.Timeout(timeout),
                    clock=clock or FakeClock())


def _unavailable(error: str = "store_unavailable") -> ApiError:
    return error_from_response(503, {"retry-after": "1"},
                               f'{{"error": "{error}", "message": "m"}}'.encode())


FAILURES: dict[str, Callable[[Attempts], Wait]] = {
    "refused": lambda a: a.failed(httpx.ConnectError("refused")),
    "pool timeout": lambda a: a.failed(httpx.PoolTimeout("no connection free")),
    "store_full": lambda a: a.refused(_unavailable("store_full")),
    "read timeout": lambda a: a.failed(httpx.ReadTimeout("slow")),
    "dropped": lambda a: a.failed(httpx.RemoteProtocolError("disconnected")),
    "store_unavailable": lambda a: a.refused(_unavailable()),
}
SAFE = {"refused", "pool timeout", "store_full"}  # surely not applied


@pytest.mark.parametrize("honoured", [False, True])
@pytest.mark.parametrize("retryable", list(Retryable))
@pytest.mark.parametrize("failure", list(FAILURES))
def test_which_failures_are_retried(retryable: Retryable, failure: str, honoured: bool) -> None:
    """``honoured``: the service has said a change's Idempotency-Key back."""
    attempts = _attempts(retryable)
    attempts.key_honoured = honoured
    attempts.next_timeout()
    keyed = retryable is Retryable.IF_KEY_HONOURED
    retried = retryable is Retryable.ALWAYS or (keyed and honoured) or (
        retryable in (Retryable.IF_NOT_APPLIED, Retryable.IF_KEY_HONOURED) and failure in SAFE)
    if retried:
        assert isinstance(FAILURES[failure](attempts), Wait)
        return
    with pytest.raises((ApiError, TransportError)):
        FAILURES[failure](attempts)


def test_a_transport_error_says_whether_the_request_may_have_arrived() -> None:
    attempts = _attempts(Retryable.IF_NOT_APPLIED, Retry(attempts=2))
    attempts.next_timeout()
    FAILURES["refused"](attempts)
    attempts.next_timeout()
    with pytest.raises(TransportError) as refused:
        FAILURES["refused"](attempts)
    assert (refused.value.sent, refused.value.attempts) == (False, 2)
    assert isinstance(refused.value.__cause__, httpx.ConnectError)
    attempts = _attempts(Retryable.IF_NOT_APPLIED)
    attempts.next_timeout()
    with pytest.raises(TransportError) as timed_out:
        FAILURES["read timeout"](attempts)
    assert (timed_out.value.sent, timed_out.value.attempts) == (True, 1)


def test_attempts_are_bounded() -> None:
    attempts = _attempts(Retryable.ALWAYS, Retry(attempts=3))
    for _ in range(2):
        attempts.next_timeout()
        assert isinstance(FAILURES["store_unavailable"](attempts), Wait)
    attempts.next_timeout()
    with pytest.raises(Unavailable) as raised:
        FAILURES["store_unavailable"](attempts)
    assert raised.value.attempts == 3


def test_no_retry_makes_one_attempt() -> None:
    attempts = _attempts(Retryable.ALWAYS, NO_RETRY)
    attempts.next_timeout()
    with pytest.raises(TransportError):
        FAILURES["refused"](attempts)


def test_the_deadline_bounds_waits_and_timeouts() -> None:
    clock = FakeClock()
    retry = Retry(attempts=100, deadline_seconds=5.0, backoff_seconds=0.4,
                  max_backoff_seconds=0.4, retry_after_jitter=0.0)
    attempts = _attempts(Retryable.ALWAYS, retry, clock, timeout=2.0)
    assert attempts.next_timeout() is None  # 2 s fits in the 5 s left
    clock.now = 3.5
    cut = attempts.next_timeout()
    assert cut is not None and cut.read == pytest.approx(1.5) and cut.connect == pytest.approx(1.5)
    clock.now = 4.0
    # Retry-After 1 s would end past the deadline: give up now rather than wait.
    with pytest.raises(Unavailable):
        FAILURES["store_unavailable"](attempts)


# -- quick: real answers of the app ----------------------------------------------


@pytest.fixture
async def small_app(redis_db: str) -> AsyncIterator[FastAPI]:
    """The app with small limits, so that 413 and chunking are cheap to reach."""
    from app.main import create_app

    settings = Settings(redis_url=redis_db, admin_token=SecretStr(ADMIN_TOKEN),
                        max_batch_rewards=MAX_BATCH, max_body_bytes=MAX_BODY)
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@dataclass
class Requests:
    """The requests an httpx client sent (its event hooks): (time, method, path), and the
    answers: (time, status)."""

    sent: list[tuple[float, str, str]] = field(default_factory=list)
    answers: list[tuple[float, int]] = field(default_factory=list)

    async def on_request(self, request: httpx.Request) -> None:
        self.sent.append((time.monotonic(), request.method, request.url.path))

    async def on_response(self, response: httpx.Response) -> None:
        self.answers.append((time.monotonic(), response.status_code))

    def sync_hooks(self) -> dict[str, list[Callable[..., Any]]]:
        def request(r: httpx.Request) -> None:
            self.sent.append((time.monotonic(), r.method, r.url.path))

        def response(r: httpx.Response) -> None:
            self.answers.append((time.monotonic(), r.status_code))

        return {"request": [request], "response": [response]}

    def async_hooks(self) -> dict[str, list[Callable[..., Any]]]:
        return {"request": [self.on_request], "response": [self.on_response]}

    @property
    def statuses(self) -> list[int]:
        return [status for _, status in self.answers]

    def clear(self) -> None:
        self.sent.clear()
        self.answers.clear()


@dataclass
class Quick:
    """Clients of the app over ASGITransport, with one record of every request."""

    http: httpx.AsyncClient
    requests: Requests

    def client(self, **kwargs: Any) -> AsyncClient:
        kwargs.setdefault("admin_token", ADMIN_TOKEN)
        kwargs.setdefault("retry", Retry(attempts=5))
        return AsyncClient(http=self.http, **kwargs)


@pytest.fixture
async def quick(small_app: FastAPI) -> AsyncIterator[Quick]:
    requests = Requests()
    transport = httpx.ASGITransport(app=small_app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test",
                                 event_hooks=requests.async_hooks()) as http:
        yield Quick(http, requests)


async def _covariates(lrb: AsyncClient, experiment_id: str = "cov") -> str:
    created = await lrb.create_experiment(experiment_id, setting="covariates", dim=2,
                                          arms=["a", "b"], seed=1)
    return created.api_key


async def _errors(quick: Quick) -> dict[str, tuple[Callable[[], Any], type[ApiError], int, str]]:
    lrb = quick.client()
    key = await _covariates(lrb)
    decided = await lrb.choose("cov", context=[0.1, 0.2], api_key=key)
    await lrb.reward("cov", decided.decision_id, 1.0, api_key=key)
    return {
        "invalid input": (lambda: lrb.choose("cov", context=[0.1, 0.2], eligible=["no way!"],
                                             api_key=key), InvalidInput, 422, "invalid_input"),
        "wrong dimension": (lambda: lrb.choose("cov", context=[0.1], api_key=key),
                            InvalidInput, 422, "invalid_input"),
        "no experiment": (lambda: lrb.get_experiment("nope"), NotFound, 404, "not_found"),
        "no arm": (lambda: lrb.retire_arms("cov", ["zz"]), NotFound, 404, "not_found"),
        "no decision": (lambda: lrb.reward("cov", "f00", 1.0, api_key=key), DecisionNotFound,
                        404, "not_found"),
        "no token": (lambda: quick.client(admin_token=None).list_experiments(), Forbidden,
                     401, "unauthorized"),
        "wrong token": (lambda: quick.client(admin_token="wrong").list_experiments(),
                        Forbidden, 403, "forbidden"),
        "wrong key": (lambda: lrb.choose("cov", context=[0.1, 0.2], api_key="wrong"),
                      Forbidden, 403, "forbidden"),
        "id taken": (lambda: _covariates(lrb), Conflict, 409, "conflict"),
        "arm taken": (lambda: lrb.add_arms("cov", ["a"]), Conflict, 409, "conflict"),
        "other reward": (lambda: lrb.reward("cov", decided.decision_id, 0.0, api_key=key),
                         RewardConflict, 409, "conflict"),
        "too large": (lambda: lrb.add_arms("cov", [f"arm-{i}" for i in range(500)]),
                      TooLarge, 413, "too_large"),
    }


ERROR_CASES = ["invalid input", "wrong dimension", "no experiment", "no arm", "no decision",
               "no token", "wrong token", "wrong key", "id taken", "arm taken", "other reward",
               "too large"]


@pytest.mark.parametrize("case", ERROR_CASES)
async def test_each_error_class_from_a_real_answer_after_one_request(
    quick: Quick, case: str
) -> None:
    call, cls, status, error = (await _errors(quick))[case]
    quick.requests.clear()
    with pytest.raises(cls) as raised:
        await call()
    assert type(raised.value) is cls
    assert (raised.value.status, raised.value.error) == (status, error)
    assert raised.value.message and raised.value.attempts == 1
    assert len(quick.requests.sent) == 1  # never retried, though Retry(attempts=5)
    if case == "invalid input":
        assert raised.value.details[0]["loc"] == ["body", "eligible", 0]
    if case == "no decision":
        assert isinstance(raised.value, DecisionNotFound) and raised.value.decision_id == "f00"


async def test_unsupported_media_type_from_a_real_answer(quick: Quick) -> None:
    # The client always sends JSON; a form post shows what a 415 becomes.
    response = await quick.http.post("/experiments", content=b"id=cov", headers={
        "Content-Type": "application/x-www-form-urlencoded",
        "Authorization": f"Bearer {ADMIN_TOKEN}"})
    error = error_from_response(response.status_code, response.headers, response.content)
    assert type(error) is UnsupportedMediaType
    assert (error.status, error.error) == (415, "unsupported_media_type")


async def test_a_duplicate_reward_counts_as_success(quick: Quick) -> None:
    lrb = quick.client()
    key = await _covariates(lrb)
    decided = await lrb.choose("cov", context=[0.1, 0.2], api_key=key)
    # The first send got through but its reply was lost: the client sends again.
    lost = await quick.http.post("/reward", headers={"X-API-Key": key}, json={
        "experiment_id": "cov", "decision_id": decided.decision_id, "reward": 1.0})
    assert lost.json()["status"] == "applied"
    again = await lrb.reward("cov", decided.decision_id, 1.0, api_key=key)
    assert (again.status, again.counted) == ("duplicate", True)
    view = await lrb.get_experiment("cov")
    assert (view.rewards, view.duplicates) == (1, 1)


async def test_the_experiment_says_how_it_was_created(quick: Quick) -> None:
    """The settings fixed at creation come back in the client's Experiment, the opt-out of
    propensities included (its decisions then carry None)."""
    lrb = quick.client()
    created = await lrb.create_experiment(
        "off", setting="covariates", dim=2, arms=["a", "b"], seed=1, propensities=False,
        default_reward=0.0, log_max_entries=500, log_max_age_seconds=3600)
    view = await lrb.get_experiment("off")
    assert (view.propensities, view.default_reward, view.log_max_entries,
            view.log_max_age_seconds, view.log_all_contexts) == (False, 0.0, 500, 3600, False)
    decided = await lrb.choose("off", context=[0.1, 0.2], api_key=created.api_key)
    assert decided.propensity is None
    assert (await lrb.get_experiment("off")).decisions == 1


async def test_batches_go_in_chunks_of_max_batch_rewards(quick: Quick) -> None:
    lrb = quick.client(max_batch_rewards=MAX_BATCH)
    key = await _covariates(lrb)
    decisions = [await lrb.choose("cov", context=[0.1, float(i)], api_key=key)
                 for i in range(7)]
    items = [(d.decision_id, float(i)) for i, d in enumerate(decisions)]
    quick.requests.clear()
    results = await lrb.reward_batch("cov", [*items[:6], ("unknown", 1.0), *items[6:]],
                                     api_key=key)
    assert len(quick.requests.sent) == 3  # 8 items: 3 + 3 + 2
    assert [r.decision_id for r in results] == [d for d, _ in items[:6]] + [
        "unknown", items[6][0]]
    assert [r.status for r in results] == ["applied"] * 6 + ["not_found", "applied"]
    assert (await lrb.get_experiment("cov")).rewards == 7
    # A client that does not know the server's limit sends one chunk, refused whole.
    with pytest.raises(InvalidInput):
        await quick.client().reward_batch("cov", dict(items), api_key=key)
    assert await lrb.reward_batch("cov", [], api_key=key) == []


async def test_a_404_after_an_ambiguous_delete_means_it_was_done(quick: Quick) -> None:
    await _covariates(quick.client())
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    first = await quick.http.delete("/experiments/cov", headers=admin)  # its reply "lost"
    retried = await quick.http.delete("/experiments/cov", headers=admin)
    assert (first.status_code, retried.status_code) == (204, 404)
    core = Core(ADMIN_TOKEN, None, Retry(), DEFAULT_MAX_BATCH_REWARDS)
    call = core.delete_experiment("cov")
    after_timeout = core.attempts(call, httpx.Timeout(1.0))
    after_timeout.next_timeout()
    assert isinstance(after_timeout.failed(httpx.ReadTimeout("reply lost")), Wait)
    after_timeout.next_timeout()
    assert core.answered(call, after_timeout, retried) is None
    first_try = core.attempts(call, httpx.Timeout(1.0))  # nothing ambiguous before
    first_try.next_timeout()
    with pytest.raises(NotFound):
        core.answered(call, first_try, retried)


async def test_answer_fields_the_client_does_not_know_are_ignored(quick: Quick) -> None:
    lrb = quick.client()
    key = await _covariates(lrb)
    choose = await quick.http.post("/choose", headers={"X-API-Key": key},
                                   json={"experiment_id": "cov", "context": [0.1, 0.2]})
    newer = choose.text[:-1] + ', "confidence": 0.5, "log": {"kept": true}}'
    decision = Decision.model_validate_json(newer)
    assert decision.decision_id == choose.json()["decision_id"]
    view = (await quick.http.get("/experiments/cov",
                                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})).text
    assert Experiment.model_validate_json(view[:-1] + ', "defaulted": 3}').id == "cov"
    late = RewardResult.model_validate_json(b'{"decision_id": "d", "status": "late"}')
    assert not late.counted  # a status this client does not know is not taken as counted


# -- every method, sync and async, against `linreboot serve` ----------------------


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    with redis_process(tmp_path_factory.mktemp("client"), free_port()) as server:
        yield server


def _service_env(redis_server: RedisProcess) -> dict[str, str]:
    return {"LINREBOOT_REDIS_URL": redis_server.url, "LINREBOOT_ADMIN_TOKEN": ADMIN_TOKEN,
            "LINREBOOT_REDIS_TIMEOUT_SECONDS": str(DEADLINE_SECONDS),
            "LINREBOOT_RETRY_AFTER_SECONDS": str(RETRY_AFTER_SECONDS),
            "LINREBOOT_LOG_LEVEL": "error"}


@pytest.fixture(scope="module")
def service_url(redis_server: RedisProcess) -> Iterator[str]:
    with server_process(_service_env(redis_server)) as url:
        yield url


@pytest.fixture
def served(redis_server: RedisProcess, service_url: str) -> Iterator[str]:
    """The service's URL, its Redis emptied and accepting writes."""
    with redis_server.client() as client:
        client.flushdb()
    try:
        yield service_url
    finally:
        with redis_server.client() as client:
            client.config_set("maxmemory", 0)


class Threaded:
    """The sync :class:`Client`'s methods as coroutines run in a thread, so that one
    scenario drives both clients."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.client, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)

        return call


async def _all_experiments(lrb: Any, page_size: int) -> list[str]:
    if isinstance(lrb, Threaded):
        experiments = await asyncio.to_thread(lambda: list(lrb.client.iter_experiments(page_size)))
        return [e.id for e in experiments]
    return [e.id async for e in lrb.iter_experiments(page_size)]


@contextlib.asynccontextmanager
async def _client(kind: str, url: str, **kwargs: Any) -> AsyncIterator[Any]:
    """A sync (threaded) or async client of ``url`` with the admin token."""
    kwargs.setdefault("admin_token", ADMIN_TOKEN)
    if kind == "sync":
        with Client(url, **kwargs) as sync:
            yield Threaded(sync)
    else:
        async with AsyncClient(url, **kwargs) as lrb:
            yield lrb


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_every_method(served: str, kind: str) -> None:
    async with _client(kind, served) as lrb:
        assert (await lrb.healthz()).status == "ok"
        assert (await lrb.readyz()).status == "ready"
        cov = await lrb.create_experiment(
            "cov", setting="covariates", dim=3, arms=["a", "b"], policy="linreboot",
            hyperparameters={"sigma_omega": 0.5, "spread": "paper", "first_pass": True}, seed=1,
            reward_window_seconds=600, max_stale_rewards=0)  # a first pass: index None
        assert cov.experiment.hyperparameters == {"sigma_omega": 0.5, "spread": "paper",
                                                  "first_pass": True}
        assert cov.experiment.config["first_pass"] is True
        assert (cov.experiment.reward_window_seconds, cov.experiment.seed) == (600, 1)
        sto = await lrb.create_experiment(
            "sto", setting="stochastic", dim=2,
            arms=[{"id": "x", "features": np.array([1.0, 0.0])},
                  {"id": "y", "features": [0.0, 1.0]}])
        assert [a.features for a in sto.experiment.arms] == [[1.0, 0.0], [0.0, 1.0]]
        ctx = await lrb.create_experiment("ctx", setting="contextual", dim=2,
                                          arms=["p", "q", "r"], policy="lints-g")
        assert ctx.experiment.policy == "lints-g"

        d_cov = await lrb.choose("cov", context=np.array([0.2, -1.0, 0.5]), api_key=cov.api_key)
        d_sto = await lrb.choose("sto", excluded=["x"], api_key=sto.api_key)
        d_ctx = await lrb.choose("ctx", arm_contexts={"p": [1.0, 0.0], "q": [0.0, 1.0]},
                                 eligible=["p", "q"], api_key=ctx.api_key)
        assert d_sto.arm_id == "y" and d_ctx.arm_id in ("p", "q")
        assert d_cov.exploring and d_cov.index is None and d_cov.decision_number == 1
        # Uniform among the eligible arms never pulled.
        assert (d_cov.propensity, d_sto.propensity, d_ctx.propensity) == (0.5, 1.0, 0.5)

        applied = await lrb.reward("cov", d_cov.decision_id, 1.0, api_key=cov.api_key)
        again = await lrb.reward("cov", d_cov.decision_id, 1.0, api_key=cov.api_key)
        assert [(r.status, r.counted) for r in (applied, again)] == [
            ("applied", True), ("duplicate", True)]
        batch = await lrb.reward_batch("sto", [(d_sto.decision_id, 0.5), ("gone", 1.0)],
                                       api_key=sto.api_key, chunk_size=1)
        assert [(r.status, r.counted) for r in batch] == [("applied", True),
                                                          ("not_found", False)]
        by_dict = await lrb.reward_batch("ctx", {d_ctx.decision_id: 0.25}, api_key=ctx.api_key)
        assert [r.status for r in by_dict] == ["applied"]
        ranked = await lrb.rank("ctx", 2, arm_contexts={"p": [1.0, 0.0], "q": [0.0, 1.0],
                                                       "r": [0.5, 0.5]}, api_key=ctx.api_key)
        assert len(set(ranked.arm_ids)) == 2 and [s.slot for s in ranked.slots] == [1, 2]
        slot_reward = await lrb.reward("ctx", ranked.slots[1].decision_id, 1.0,
                                       api_key=ctx.api_key)
        assert slot_reward.status == "applied"

        view = await lrb.get_experiment("cov")
        assert (view.decisions, view.rewards, view.duplicates) == (1, 1, 1)
        assert {a.id: a.pulls for a in view.arms}[d_cov.arm_id] == 1
        added = await lrb.add_arms("cov", ["c"])
        assert [a.id for a in added.arms] == ["a", "b", "c"]
        retired = await lrb.retire_arms("cov", ["a"])
        assert [a.active for a in retired.arms] == [False, True, True]
        patched = await lrb.update_settings("cov", epsilon=0.25, reward_window_seconds=900)
        assert (patched.config["epsilon"], patched.reward_window_seconds) == (0.25, 900)
        new_key = await lrb.rotate_key("cov")
        context = np.array([0.2, -1.0, 0.5])
        for key in (cov.api_key, new_key):  # both valid until the old one is revoked
            assert (await lrb.choose("cov", context=context, api_key=key)).arm_id
        assert await lrb.revoke_previous_key("cov") is True
        assert await lrb.revoke_previous_key("cov") is False
        with pytest.raises(Forbidden):
            await lrb.choose("cov", context=context, api_key=cov.api_key)

        first = await lrb.list_experiments(limit=2)
        assert ([e.id for e in first.experiments], first.next_after) == (["cov", "ctx"], "ctx")
        last = await lrb.list_experiments(limit=2, after=first.next_after)
        assert ([e.id for e in last.experiments], last.next_after) == (["sto"], None)
        assert await _all_experiments(lrb, 1) == ["cov", "ctx", "sto"]
        assert "linreboot_decisions_total" in await lrb.metrics()

        assert await lrb.delete_experiment("ctx") is None
        with pytest.raises(NotFound):
            await lrb.get_experiment("ctx")
        assert await _all_experiments(lrb, 100) == ["cov", "sto"]


# -- retries against `linreboot serve` on a Redis that stalls or fills ------------


@contextlib.contextmanager
def _stalled(redis_server: RedisProcess, seconds: float) -> Iterator[None]:
    """SIGSTOP Redis now and SIGCONT it after ``seconds`` (in a thread), whatever happens."""
    redis_server.pause()
    timer = threading.Timer(seconds, redis_server.resume)
    timer.start()
    try:
        yield
    finally:
        timer.join()


Opener = Callable[..., Any]


@pytest.fixture
async def recorded() -> AsyncIterator[Opener]:
    """Opens clients of a URL that record their requests (sync ones threaded), with the
    admin token; closes them after the test."""
    opened: list[httpx.Client | httpx.AsyncClient] = []

    def open_client(kind: str, url: str, requests: Requests, **kwargs: Any) -> Any:
        kwargs.setdefault("admin_token", ADMIN_TOKEN)
        if kind == "sync":
            http = httpx.Client(base_url=url, timeout=10.0, event_hooks=requests.sync_hooks())
            opened.append(http)
            return Threaded(Client(http=http, **kwargs))
        http_async = httpx.AsyncClient(base_url=url, timeout=10.0,
                                       event_hooks=requests.async_hooks())
        opened.append(http_async)
        return AsyncClient(http=http_async, **kwargs)

    yield open_client
    for http in opened:
        if isinstance(http, httpx.AsyncClient):
            await http.aclose()
        else:
            http.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_reward_gets_through_a_redis_stall_and_counts_once(
    served: str, redis_server: RedisProcess, recorded: Opener, kind: str
) -> None:
    requests = Requests()
    lrb = recorded(kind, served, requests, retry=PATIENT)
    key = await _covariates(lrb)
    decided = await lrb.choose("cov", context=[0.1, 0.2], api_key=key)
    requests.clear()
    with _stalled(redis_server, STALL_SECONDS):
        result = await lrb.reward("cov", decided.decision_id, 0.75, api_key=key)
    # The first attempt timed out in Redis (503) but ran after SIGCONT; the retry
    # finds it applied: either way the caller is told it counts.
    assert result.counted, result
    assert requests.statuses[0] == 503 and requests.statuses[-1] == 200
    assert len(requests.sent) == len(requests.answers) >= 2
    view = await lrb.get_experiment("cov")
    assert view.rewards == 1 and sum(a.pulls for a in view.arms) == 1
    assert {a.id: a.mean_reward for a in view.arms}[decided.arm_id] == 0.75
    # Retry-After honoured: each retry after a 503 waited at least its seconds
    # (the client's own backoff here is at most 0.05 s).
    waits = [sent - answered for (answered, status), (sent, _, _) in
             zip(requests.answers, requests.sent[1:], strict=False) if status == 503]
    assert waits and min(waits) >= RETRY_AFTER_SECONDS
    # ... and not much more: Retry-After plus its 10 % jitter, plus generous slack
    # for a loaded machine.
    assert max(waits) <= RETRY_AFTER_SECONDS * 1.1 + 1.0


@pytest.mark.slow
async def test_choose_is_retried_through_a_stall_and_recorded_once(
    served: str, redis_server: RedisProcess, recorded: Opener
) -> None:
    """Issue 29: a ``/choose`` whose reply was lost could not be retried (a retry recorded
    a second decision). It names its decision id now: retried through a stall, each
    call is recorded once, even when a stalled attempt runs after SIGCONT."""
    requests = Requests()
    lrb = recorded("async", served, requests, retry=PATIENT)
    key = await _covariates(lrb)
    await lrb.choose("cov", context=[0.1, 0.2], api_key=key)  # the worker's view is fresh
    before = (await lrb.get_experiment("cov")).decisions
    requests.clear()
    with _stalled(redis_server, STALL_SECONDS):
        decisions = await asyncio.gather(*(
            lrb.choose("cov", context=[0.3, 0.1 * i], api_key=key) for i in range(3)))
    assert all(isinstance(d, Decision) for d in decisions)
    assert 503 in requests.statuses and len(requests.sent) > 3  # retried through the stall
    assert len({d.decision_id for d in decisions}) == 3
    assert (await lrb.get_experiment("cov")).decisions - before == 3  # each once
    again = await lrb.choose("cov", context=[0.3, 0.1], api_key=key,
                             decision_id=decisions[1].decision_id)
    assert again == decisions[1]


@pytest.mark.slow
async def test_delete_is_retried_through_a_stall(served: str, redis_server: RedisProcess,
                                                  recorded: Opener) -> None:
    requests = Requests()
    lrb = recorded("async", served, requests, retry=PATIENT)
    await _covariates(lrb)
    requests.clear()
    with _stalled(redis_server, STALL_SECONDS):
        await lrb.delete_experiment("cov")
    # 503, then 404 if the stalled attempt ran after SIGCONT (taken as done), else 204.
    assert requests.statuses[0] == 503 and requests.statuses[-1] in (204, 404)
    with pytest.raises(NotFound):
        await lrb.get_experiment("cov")
    assert [e async for e in lrb.iter_experiments()] == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_changes_are_retried_through_a_stall_and_made_once(
    served: str, redis_server: RedisProcess, recorded: Opener, kind: str
) -> None:
    """A creation, a key rotation and an addition of arms answered 503 were not retried
    (the first attempt may have been made: a retry answered 409, or rotated twice). Each
    goes under an Idempotency-Key of its own now, and is retried through a stall: made
    once, the keys it answers valid."""
    requests = Requests()
    lrb = recorded(kind, served, requests, retry=PATIENT)
    with _stalled(redis_server, STALL_SECONDS):
        created = await lrb.create_experiment("cov", setting="covariates", dim=2,
                                              arms=["a", "b"])
    with _stalled(redis_server, STALL_SECONDS):
        rotated = await lrb.rotate_key("cov")
    with _stalled(redis_server, STALL_SECONDS):
        view = await lrb.add_arms("cov", ["c"])
    assert requests.statuses.count(503) >= 3 and requests.statuses[-1] == 200
    assert [a.id for a in view.arms] == ["a", "b", "c"]
    # Rotated once: the key it replaced is still valid, as the one before it.
    for key in (created.api_key, rotated):
        await lrb.choose("cov", context=[0.1, 0.2], api_key=key)
    assert (await lrb.get_experiment("cov")).decisions == 2
    assert await lrb.revoke_previous_key("cov") is True


class LosesReplies(httpx.AsyncBaseTransport):
    """A network that delivers every request but loses the reply to the first attempt
    of each change sent under an Idempotency-Key (once a key)."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._seen: set[str] = set()
        self.losing = True
        self.lost = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        key = request.headers.get("Idempotency-Key")
        if key is None or key in self._seen or not self.losing:
            return response
        self._seen.add(key)
        await response.aread()  # made by the service; the reply never arrives
        await response.aclose()
        self.lost += 1
        raise httpx.ReadTimeout("the reply was lost", request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_changes_whose_replies_are_lost_are_answered_as_made(served: str) -> None:
    """A creation, a rotation and an addition of arms made by the service whose replies
    were lost: sent again under their Idempotency-Key, each is answered as made (the
    same API key back, nothing made twice), once the client knows the service says
    such keys back; before that (a service that may ignore the header), not retried."""
    network = LosesReplies()
    async with httpx.AsyncClient(base_url=served, transport=network, timeout=10.0) as http:
        lrb = AsyncClient(http=http, admin_token=ADMIN_TOKEN, retry=PATIENT)
        with pytest.raises(TransportError) as unknown:  # nothing said back yet
            await _covariates(lrb, "first")
        assert unknown.value.sent and unknown.value.attempts == 1
        network.losing = False  # a reply that arrives says its key back: later changes'
        await lrb.add_arms("first", ["c"])  # retries are safe
        network.losing = True
        created = await lrb.create_experiment("cov", setting="covariates", dim=2,
                                              arms=["a", "b"])
        rotated = await lrb.rotate_key("cov")
        view = await lrb.add_arms("cov", ["c"])
        assert network.lost == 4
    async with AsyncClient(served, admin_token=ADMIN_TOKEN) as admin:
        assert [a.id for a in view.arms] == ["a", "b", "c"]
        for key in (created.api_key, rotated):  # rotated once: both valid
            await admin.choose("cov", context=[0.1, 0.2], api_key=key)
        assert (await admin.get_experiment("cov")).decisions == 2
        assert await admin.revoke_previous_key("cov") is True


@pytest.mark.slow
async def test_a_refused_connection_is_retried_even_for_choose(
    served: str, redis_server: RedisProcess, recorded: Opener
) -> None:
    async with AsyncClient(served, admin_token=ADMIN_TOKEN) as admin:
        key = await _covariates(admin)
    port = free_port()  # nothing listens there yet
    requests = Requests()
    lrb = recorded("async", f"http://127.0.0.1:{port}", requests,
                   retry=Retry(attempts=1000, deadline_seconds=60.0, backoff_seconds=0.05,
                               max_backoff_seconds=0.2))
    up, done = threading.Event(), threading.Event()

    def serve_later() -> None:
        with server_process(_service_env(redis_server), port=port):
            up.set()
            done.wait(60)

    thread = threading.Thread(target=serve_later)
    thread.start()
    try:
        decision = await lrb.choose("cov", context=[0.1, 0.2], api_key=key)
    finally:
        done.set()
        thread.join()
    assert up.is_set() and isinstance(decision, Decision)
    assert len(requests.sent) > 1 and requests.statuses == [200]  # refused, refused, ..., 200
    async with AsyncClient(served, admin_token=ADMIN_TOKEN) as admin:
        assert (await admin.get_experiment("cov")).decisions == 1


async def test_nothing_listening_is_a_transport_error_that_was_not_sent() -> None:
    retry = Retry(attempts=3, backoff_seconds=0.01, max_backoff_seconds=0.01)
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", retry=retry) as lrb:
        with pytest.raises(TransportError) as raised:
            await lrb.choose("cov", context=[0.1], api_key="k")
    assert (raised.value.sent, raised.value.attempts) == (False, 3)
    assert isinstance(raised.value.__cause__, httpx.ConnectError)


@pytest.mark.slow
async def test_store_full_refuses_the_write_whole_so_every_call_is_retried(
    served: str, redis_server: RedisProcess, recorded: Opener
) -> None:
    requests = Requests()
    lrb = recorded("async", served, requests, retry=PATIENT)
    key = await _covariates(lrb)
    decided = await lrb.choose("cov", context=[0.1, 0.2], api_key=key)
    with redis_server.client() as client:
        client.config_set("maxmemory", 1)  # far below the use: every write is refused
    with pytest.raises(StoreFull) as full:
        await lrb.readyz()  # a probe: one attempt, whatever the retries
    assert full.value.attempts == 1
    assert (full.value.status, full.value.error) == (503, "store_full")
    requests.clear()

    def free_memory() -> None:
        with redis_server.client() as client:
            client.config_set("maxmemory", 0)

    timer = threading.Timer(1.5, free_memory)
    timer.start()
    try:
        created, chosen, rewarded = await asyncio.gather(
            lrb.create_experiment("other", setting="covariates", dim=2, arms=["a"]),
            lrb.choose("cov", context=[0.3, 0.4], api_key=key),
            lrb.reward("cov", decided.decision_id, 0.5, api_key=key))
    finally:
        timer.join()
    assert 503 in requests.statuses and isinstance(chosen, Decision)
    assert created.experiment.id == "other" and rewarded.status == "applied"
    view = await lrb.get_experiment("cov")
    assert (view.decisions, view.rewards) == (2, 1)
