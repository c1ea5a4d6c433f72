"""Load replay: many experiments on a running service, with realistic delayed feedback.

Creates ``N`` experiments in one of the paper's settings (one seeded repetition
of :mod:`loadtest.environments` per experiment, so rewards are realistic), then
drives ``/choose`` either in an open loop (Poisson arrivals at a target rate)
or a closed loop (a fixed number of requests in flight), for a bounded time and
number of decisions. Each decision's reward goes back after an exponential
delay; a fraction is never sent and a fraction is sent twice, as a client retry
would. At the end it waits (bounded) for the outstanding rewards and checks the
service's counters against what it sent and what the service acknowledged (see
`ExperimentCheck`).

Requests go through :class:`linreboot.client.AsyncClient` without retries, so
that each call is one request, measured and tallied as such. Latency is
measured client-side around each call with ``time.perf_counter``; the client
runs in Python on the same machine as the service, so the figures include its
overhead and its share of the CPUs.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
import numpy as np
from tqdm import tqdm

from linreboot.client import (
    NO_RETRY,
    ApiError,
    AsyncClient,
    Conflict,
    NotFound,
    TransportError,
    Unavailable,
)
from loadtest.environments import Environment, Setting, make_spec, split_rngs
from loadtest.http_driver import choose_args, experiment_spec
from loadtest.simulate import Cell, cell_seed, decision_seed
from policies import PolicyName

__all__ = [
    "CHOOSE",
    "CLIENT_NOTE",
    "REWARD",
    "ClientPool",
    "CounterCheck",
    "ExperimentCheck",
    "Feedback",
    "FeedbackModel",
    "LoadConfig",
    "LoadReport",
    "LoadRunner",
    "RouteStats",
    "Tally",
    "expected_counters",
    "latency_summary",
    "percentile",
    "poisson_arrivals",
    "post_timed",
    "run_load",
    "timed",
    "write_report",
]

T = TypeVar("T")

Mode = Literal["open", "closed"]
ADMIN_TIMEOUT = 60.0  # set-up, check and clean-up: not what --timeout is about
CHOOSE, REWARD = "/choose", "/reward"
CLIENT_NOTE = (
    "latency measured client-side with time.perf_counter around each request (queueing in "
    "the client's connection pool included); the Python client shares the machine and its "
    "CPUs with the service, so figures include client overhead and contention"
)


# --------------------------------------------------------------------------- pure pieces


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least ``q`` % of values at or below.

    Parameters
    ----------
    sorted_values : sequence of float, ascending, non-empty
    q : float
        Percent, in ``[0, 100]``.

    Returns
    -------
    float
        An element of ``sorted_values`` (never an interpolation).
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must lie in [0, 100], got {q}")
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return float(sorted_values[rank - 1])


def latency_summary(seconds: Iterable[float]) -> dict[str, float | None]:
    """p50, p95, p99, max and mean of latencies, in milliseconds (None when empty).

    Parameters
    ----------
    seconds : iterable of float
        Latencies in seconds.

    Returns
    -------
    dict
        Keys ``p50_ms``, ``p95_ms``, ``p99_ms``, ``max_ms``, ``mean_ms``.
    """
    values = sorted(seconds)
    keys = ("p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms")
    if not values:
        return dict.fromkeys(keys)
    ms = [1e3 * percentile(values, q) for q in (50, 95, 99, 100)]
    return dict(zip(keys, [*ms, 1e3 * sum(values) / len(values)], strict=True))


def poisson_arrivals(
    rate: float, duration: float, rng: np.random.Generator, limit: int
) -> np.ndarray:
    """Arrival times of a Poisson process of ``rate`` per second on ``[0, duration)``.

    Inter-arrival gaps are i.i.d. exponential with mean ``1 / rate``.

    Parameters
    ----------
    rate : float
        Arrivals per second, > 0.
    duration : float
        Seconds, > 0.
    rng : numpy.random.Generator
    limit : int
        At most this many arrivals (the first ``limit``).

    Returns
    -------
    ndarray, shape (n,), ascending, seconds from the start; ``n <= limit``.
    """
    if rate <= 0 or duration <= 0 or limit < 0:
        raise ValueError("need rate > 0, duration > 0 and limit >= 0")
    expected = rate * duration
    chunk = int(min(limit, expected + 6 * math.sqrt(expected) + 16))
    times = np.cumsum(rng.exponential(1.0 / rate, size=chunk))
    while times.size < limit and (times.size == 0 or times[-1] < duration):
        more = times[-1] if times.size else 0.0
        gaps = rng.exponential(1.0 / rate, size=max(chunk, 16))
        times = np.concatenate([times, more + np.cumsum(gaps)])
    return times[(times < duration)][:limit]


@dataclass(frozen=True)
class Feedback:
    """What happens to one decision's reward.

    Attributes
    ----------
    delay : float or None
        Seconds from the decision to the first send; None if the reward is never sent.
    duplicate_delay : float or None
        Seconds from the first send to a second, identical send; None if sent once.
    """

    delay: float | None
    duplicate_delay: float | None = None


@dataclass(frozen=True)
class FeedbackModel:
    """How rewards come back: exponential delays, some dropped, some sent twice.

    Parameters
    ----------
    delay_mean : float
        Mean of the exponential delay before a reward is sent, seconds.
    drop_fraction : float
        Probability that a reward is never sent.
    duplicate_fraction : float
        Probability that a reward is sent twice (disjoint from dropping).
    duplicate_delay_mean : float
        Mean of the exponential delay between the two sends, seconds.
    """

    delay_mean: float = 0.2
    drop_fraction: float = 0.1
    duplicate_fraction: float = 0.05
    duplicate_delay_mean: float = 0.05

    def __post_init__(self) -> None:
        if self.delay_mean < 0 or self.duplicate_delay_mean < 0:
            raise ValueError("reward delays must be >= 0")
        fractions = (self.drop_fraction, self.duplicate_fraction)
        if min(fractions) < 0 or sum(fractions) > 1:
            raise ValueError("drop and duplicate fractions must be >= 0 and sum to at most 1")

    def draw(self, rng: np.random.Generator) -> Feedback:
        """One decision's fate: one uniform picks dropped / duplicated / sent once."""
        u = rng.random()
        if u < self.drop_fraction:
            return Feedback(None)
        delay = float(rng.exponential(self.delay_mean)) if self.delay_mean > 0 else 0.0
        if u < self.drop_fraction + self.duplicate_fraction:
            again = self.duplicate_delay_mean
            return Feedback(delay, float(rng.exponential(again)) if again > 0 else 0.0)
        return Feedback(delay)


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class LoadConfig:
    """One load replay. Exactly one of ``rate`` (open loop) and ``concurrency`` (closed).

    Parameters
    ----------
    experiments : int
        Experiments created, one environment repetition each.
    setting, dim, n_arms, policy
        The paper's setting, dimension d, arms K (None: the paper's) and policy.
    rate : float or None
        Open loop: Poisson arrivals of ``/choose`` per second.
    concurrency : int or None
        Closed loop: ``/choose`` requests in flight.
    duration : float
        Seconds of load (arrivals stop after it).
    max_requests : int
        At most this many ``/choose`` requests (each leads to at most two ``/reward``).
    feedback : FeedbackModel
    drain_seconds : float
        At most this long, after the load, for outstanding requests and delayed rewards.
    timeout : float
        httpx timeout of each phase of a request (connect, write, read, pool), seconds.
    connections : int
        Connections of the client in all.
    clients : int
        ``httpx.AsyncClient`` instances sharing them (see `ClientPool`).
    seed : int
        Environments, experiment picks, arrivals and feedback all derive from it.
    """

    experiments: int = 20
    setting: Setting = "stochastic"
    dim: int = 20
    n_arms: int | None = None
    policy: PolicyName = "linreboot"
    rate: float | None = None
    concurrency: int | None = None
    duration: float = 30.0
    max_requests: int = 100_000
    feedback: FeedbackModel = field(default_factory=FeedbackModel)
    drain_seconds: float = 10.0
    timeout: float = 30.0
    connections: int = 256
    clients: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("give exactly one of rate (open loop) and concurrency (closed loop)")
        if self.rate is not None and not self.rate > 0:
            raise ValueError("rate must be > 0")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        positive = (self.experiments, self.dim, self.max_requests, self.connections, self.clients)
        if min(positive) < 1 or not all(t > 0 for t in (self.duration, self.timeout)):
            raise ValueError("experiments, dim, max_requests, connections, clients, duration "
                             "and timeout must be positive")
        if self.drain_seconds < 0:
            raise ValueError("drain_seconds must be >= 0")
        if self.n_arms is not None and self.n_arms < 1:
            raise ValueError("n_arms must be >= 1")

    @property
    def mode(self) -> Mode:
        return "open" if self.rate is not None else "closed"

    @property
    def cell(self) -> Cell:
        return Cell(self.setting, self.dim, self.policy)

    def describe(self) -> str:
        load = (f"open loop at {self.rate:g} decisions/s" if self.rate is not None
                else f"closed loop at concurrency {self.concurrency}")
        k = make_spec(self.setting, self.dim, n_arms=self.n_arms).n_arms
        return (f"{load}; {self.experiments} experiments, {self.setting} K={k} d={self.dim}, "
                f"{self.policy}; {self.duration:g} s")


# --------------------------------------------------------------------------- recording


@dataclass
class RouteStats:
    """Latencies and outcomes of one route, as seen by the client."""

    latencies: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    first_start: float = math.inf
    last_end: float = -math.inf

    def record(self, outcome: str, start: float, end: float, timed: bool) -> None:
        """One request: ``outcome`` is the status code or the exception name."""
        self.statuses[outcome] += 1
        if timed:
            self.latencies.append(end - start)
        self.first_start = min(self.first_start, start)
        self.last_end = max(self.last_end, end)

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    @property
    def errors(self) -> dict[str, int]:
        """Counts of statuses >= 400 and of transport errors (timeouts, resets)."""
        return {k: v for k, v in self.statuses.items() if not (k.isdigit() and int(k) < 400)}

    @property
    def window(self) -> float:
        return max(self.last_end - self.first_start, 0.0)

    def summary(self) -> dict[str, Any]:
        rps = self.requests / self.window if self.window > 0 else 0.0
        return {"requests": self.requests, "requests_per_second": rps,
                "latency": latency_summary(self.latencies), "statuses": dict(self.statuses),
                "errors": self.errors}


async def post_timed(
    client: httpx.AsyncClient, stats: RouteStats, path: str, body: dict[str, Any],
    headers: dict[str, str],
) -> httpx.Response | None:
    """POST with a bare httpx client and record it in ``stats``; None when no response
    came (timeout, reset). For routes the service client does not know (the floor's).

    Latency is ``time.perf_counter`` around the call, so it includes waiting for a
    connection from the client's pool.
    """
    start = time.perf_counter()
    try:
        response = await client.post(path, json=body, headers=headers)
    except httpx.HTTPError as exc:
        stats.record(type(exc).__name__, start, time.perf_counter(), timed=False)
        return None
    stats.record(str(response.status_code), start, time.perf_counter(), timed=True)
    return response


async def timed(stats: RouteStats, call: Awaitable[T]) -> T:
    """Await one call of the service client and record it in ``stats``, as
    :func:`post_timed` does: "200", the error's HTTP status, or the name of the httpx
    exception when no answer came (not timed). Exceptions are raised on.
    """
    start = time.perf_counter()
    try:
        result = await call
    except ApiError as exc:
        stats.record(str(exc.status), start, time.perf_counter(), timed=True)
        raise
    except TransportError as exc:
        stats.record(type(exc.__cause__).__name__, start, time.perf_counter(), timed=False)
        raise
    stats.record("200", start, time.perf_counter(), timed=True)
    return result


class ClientPool:
    """Several service clients used in turn, sharing ``connections`` between them.

    Each :class:`linreboot.client.AsyncClient` has its own ``httpx.AsyncClient``
    (its ``http``) and no retries: a call is one request. ``admin`` is one more,
    with the admin token, a long timeout and the default retries, for set-up,
    the check and clean-up.

    One client with one large pool slows down sharply under concurrency (a known
    limitation, encode/httpx#3215): driving the floor app on loopback with 32
    requests in flight, one client served 120-250 requests/s with a p99 near 1 s,
    16 clients of 16 connections about 440 requests/s with a p99 near 0.12 s.

    Parameters
    ----------
    base_url : str
    connections : int
        Connections in all, split evenly (rounded up) between the clients.
    timeout : float
        httpx timeout of each phase of a request (connect, write, read, pool), seconds.
    clients : int
        Number of clients.
    admin_token : str, optional
        The service's ``LINREBOOT_ADMIN_TOKEN``, for ``admin``.
    """

    def __init__(self, base_url: str, connections: int, timeout: float, clients: int = 16,
                 admin_token: str | None = None):
        per = max(1, math.ceil(connections / clients))
        pool = httpx.Limits(max_connections=per, max_keepalive_connections=per)
        self.clients = [
            AsyncClient(http=httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(timeout),
                                               limits=pool), retry=NO_RETRY)
            for _ in range(clients)
        ]
        self.admin = AsyncClient(base_url, admin_token=admin_token, timeout=ADMIN_TIMEOUT)
        self.base_url = base_url
        self._turn = itertools.cycle(self.clients)

    def next(self) -> AsyncClient:
        """The client whose turn it is (round robin)."""
        return next(self._turn)

    async def __aenter__(self) -> ClientPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.gather(self.admin.aclose(),
                             *(client.http.aclose() for client in self.clients))


@dataclass
class Tally:
    """What one experiment was sent and what the service acknowledged."""

    choose_ok: int = 0
    choose_unknown: int = 0  # no response: the service may or may not have decided
    applied_acks: Counter[str] = field(default_factory=Counter)  # decision id -> "applied"s
    counted: set[str] = field(default_factory=set)  # acknowledged applied or duplicate
    duplicate_acks: int = 0
    reward_unknown: set[str] = field(default_factory=set)  # a send without a response
    unexpected: Counter[str] = field(default_factory=Counter)  # conflict, not_found, others

    def acknowledge(self, decision_id: str, status: str) -> None:
        if status == "applied":
            self.applied_acks[decision_id] += 1
        elif status == "duplicate":
            self.duplicate_acks += 1
        else:
            self.unexpected[status] += 1
            return
        self.counted.add(decision_id)


# --------------------------------------------------------------------------- counter check


@dataclass(frozen=True)
class ExperimentCheck:
    """One experiment's counters: the service's and the range the client's record allows.

    Each range is ``(low, high)``: requests that got no answer (timeouts, resets, or
    cancelled at the drain) widen it; without them it is exact (``low == high``). An
    answer with an error status counts as nothing changed, as ``docs/API.md`` promises
    ("a refused request changes nothing"). ``rewards`` counts distinct decisions
    acknowledged ``applied`` or ``duplicate`` (a duplicate proves one application).
    """

    experiment_id: str
    decisions: int
    decisions_expected: tuple[int, int]
    rewards: int
    rewards_expected: tuple[int, int]
    duplicates: int
    duplicates_expected: tuple[int, int]
    applied_twice: int  # decisions acknowledged "applied" more than once: a double count
    unexpected_acks: int  # conflict / not_found for rewards this client sent correctly

    @property
    def passed(self) -> bool:
        pairs = ((self.decisions, self.decisions_expected), (self.rewards, self.rewards_expected),
                 (self.duplicates, self.duplicates_expected))
        in_range = all(low <= value <= high for value, (low, high) in pairs)
        return in_range and self.applied_twice == 0 and self.unexpected_acks == 0


def expected_counters(experiment_id: str, tally: Tally, view: dict[str, Any]) -> ExperimentCheck:
    """Compare ``GET /experiments/{id}`` (``view``) with what the client saw."""
    unknown_rewards = len(tally.reward_unknown - tally.counted)
    counted = len(tally.counted)
    return ExperimentCheck(
        experiment_id=experiment_id,
        decisions=int(view["decisions"]),
        decisions_expected=(tally.choose_ok, tally.choose_ok + tally.choose_unknown),
        rewards=int(view["rewards"]),
        rewards_expected=(counted, counted + unknown_rewards),
        duplicates=int(view["duplicates"]),
        duplicates_expected=(tally.duplicate_acks,
                             tally.duplicate_acks + len(tally.reward_unknown)),
        applied_twice=sum(1 for n in tally.applied_acks.values() if n > 1),
        unexpected_acks=sum(tally.unexpected.values()),
    )


@dataclass(frozen=True)
class CounterCheck:
    """Every experiment's check; ``problems`` lists the failures in words."""

    experiments: list[ExperimentCheck]
    problems: list[str]

    @property
    def passed(self) -> bool:
        return not self.problems and all(e.passed for e in self.experiments)

    @property
    def exact(self) -> bool:
        """True when no request went unanswered, so every range is a single value."""
        return all(e.decisions_expected[0] == e.decisions_expected[1]
                   and e.rewards_expected[0] == e.rewards_expected[1]
                   for e in self.experiments)

    def totals(self) -> dict[str, list[int]]:
        """Service total, expected low, expected high, per counter."""
        out = {}
        for name in ("decisions", "rewards", "duplicates"):
            ranges = [getattr(e, f"{name}_expected") for e in self.experiments]
            out[name] = [sum(getattr(e, name) for e in self.experiments),
                         sum(r[0] for r in ranges), sum(r[1] for r in ranges)]
        return out

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        parts = []
        for name, (service, low, high) in self.totals().items():
            sent = f"{low}" if low == high else f"{low}..{high}"
            parts.append(f"{name} service {service} / client {sent}")
        failing = [e.experiment_id for e in self.experiments if not e.passed]
        tail = f"; failing: {', '.join(failing)}" if failing else ""
        tail += "".join(f"; {p}" for p in self.problems)
        return (f"Counter check ({len(self.experiments)} experiments): {verdict}: "
                f"{', '.join(parts)}{tail}")


# --------------------------------------------------------------------------- the runner


@dataclass
class _Target:
    id: str
    api_key: str
    env: Environment
    tally: Tally = field(default_factory=Tally)


@dataclass
class LoadReport:
    """Everything a run measured; ``to_json`` is the report file."""

    config: LoadConfig
    base_url: str
    routes: dict[str, RouteStats]
    load_seconds: float
    total_seconds: float
    max_arrival_lag_ms: float | None  # open loop only
    planned: Counter[str]
    abandoned: int
    check: CounterCheck

    def acks(self) -> dict[str, int]:
        targets = self.check.experiments
        return {"applied_decisions": sum(e.rewards_expected[0] for e in targets),
                "duplicate": sum(e.duplicates_expected[0] for e in targets),
                "unexpected": sum(e.unexpected_acks for e in targets)}

    def totals(self) -> dict[str, float]:
        requests = sum(r.requests for r in self.routes.values())
        starts = [r.first_start for r in self.routes.values()]
        ends = [r.last_end for r in self.routes.values()]
        window = max(max(ends) - min(starts), 0.0) if requests else 0.0
        return {"requests": requests, "requests_per_second": requests / window if window else 0.0}

    def to_json(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config), "base_url": self.base_url,
            "load_seconds": self.load_seconds, "total_seconds": self.total_seconds,
            "throughput_note": "requests per second over each route's own window, first "
                               "request start to last response",
            "routes": {name: r.summary() for name, r in self.routes.items()},
            "total": self.totals(),
            "feedback": {"planned": dict(self.planned), "abandoned_at_drain": self.abandoned},
            "reward_acks": self.acks(),
            "counter_check": {"passed": self.check.passed, "exact": self.check.exact,
                              "totals": self.check.totals(), "problems": self.check.problems,
                              "experiments": [asdict(e) for e in self.check.experiments]},
            "client": {"library": f"linreboot.client on httpx {httpx.__version__}",
                       "max_arrival_lag_ms": self.max_arrival_lag_ms, "note": CLIENT_NOTE},
        }

    def markdown(self) -> str:
        return markdown_report(self)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _lag_note(lag_ms: float | None) -> str:
    return "" if lag_ms is None else f" (open loop: arrivals at most {lag_ms:.1f} ms late)"


def markdown_report(report: LoadReport) -> str:
    """The run as a markdown table of routes, then feedback and the counter check."""
    lines = [f"Load replay: {report.config.describe()}", "",
             "| route | requests | req/s | p50 ms | p95 ms | p99 ms | max ms | errors |",
             "|---|---|---|---|---|---|---|---|"]
    for name, stats in report.routes.items():
        s = stats.summary()
        lat = s["latency"]
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(s["errors"].items())) or "0"
        lines.append(f"| {name} | {s['requests']} | {s['requests_per_second']:.1f} "
                     f"| {_ms(lat['p50_ms'])} | {_ms(lat['p95_ms'])} | {_ms(lat['p99_ms'])} "
                     f"| {_ms(lat['max_ms'])} | {errors} |")
    total = report.totals()
    lines.append(f"| total | {total['requests']:.0f} | {total['requests_per_second']:.1f} "
                 "| | | | | |")
    acks, planned = report.acks(), report.planned
    lines += ["",
              f"Feedback: {planned['once']} sent once, {planned['twice']} twice, "
              f"{planned['dropped']} dropped; {report.abandoned} abandoned at the drain. "
              f"Acknowledged: {acks['applied_decisions']} rewards counted, "
              f"{acks['duplicate']} duplicates, {acks['unexpected']} unexpected.",
              report.check.line(),
              f"Note: {CLIENT_NOTE}{_lag_note(report.max_arrival_lag_ms)}."]
    return "\n".join(lines)


class LoadRunner:
    """Drives one load replay against the service behind ``client``.

    Parameters
    ----------
    clients : ClientPool
        Clients of the service (its ``admin`` with the admin token).
    config : LoadConfig
    progress : bool
        Show a tqdm bar over the duration.
    """

    def __init__(self, clients: ClientPool, config: LoadConfig, progress: bool = True) -> None:
        self._clients = clients
        self.config = config
        self._progress = progress
        root = np.random.SeedSequence([config.seed, 0x10AD])
        self._rng = np.random.default_rng(root)
        self.routes = {CHOOSE: RouteStats(), REWARD: RouteStats()}
        self.targets: list[_Target] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._failures: list[str] = []
        self._issued = 0
        self._lag = 0.0
        self.planned: Counter[str] = Counter(once=0, twice=0, dropped=0)

    # -- setup and teardown

    async def setup(self) -> None:
        """Create the experiments: repetition ``i`` of the seeded environment is experiment i."""
        cfg = self.config
        spec = make_spec(cfg.setting, cfg.dim, n_arms=cfg.n_arms)
        env_rngs, _ = split_rngs(cell_seed(cfg.seed, cfg.cell), cfg.experiments)
        tag = uuid.uuid4().hex[:8]
        envs = [Environment(spec, [rng]) for rng in env_rngs]
        self.targets = list(await asyncio.gather(*(
            self._create(f"load-{tag}-{i}", i, env) for i, env in enumerate(envs)
        )))

    async def _create(self, experiment_id: str, rep: int, env: Environment) -> _Target:
        spec = experiment_spec(self.config.cell, env, 0, self.config.seed)
        spec["seed"] = decision_seed(self.config.seed, self.config.cell, rep)
        created = await self._clients.admin.create_experiment(experiment_id, **spec)
        return _Target(experiment_id, created.api_key, env)

    async def delete(self) -> None:
        """Delete the experiments this run created."""
        for target in self.targets:
            await self._clients.admin.delete_experiment(target.id)

    # -- one decision and its feedback

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A bug of the client or a malformed answer: the check must not pass silently.
            self._failures.append(f"client task failed: {task.exception()!r}")

    async def _decide(self) -> None:
        target = self.targets[int(self._rng.integers(len(self.targets)))]
        contexts = target.env.contexts()
        choose = self._clients.next().choose(
            target.id, **choose_args(self.config.cell, contexts[0]), api_key=target.api_key)
        try:
            decision = await timed(self.routes[CHOOSE], choose)
        except (asyncio.CancelledError, TransportError, Unavailable) as exc:
            # No answer, or "outcome unknown" (docs/API.md): may have been recorded.
            target.tally.choose_unknown += 1
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        except ApiError:
            return
        target.tally.choose_ok += 1
        arm = np.array([int(decision.arm_id[1:])])
        reward = float(target.env.rewards(contexts, arm)[0])
        self._schedule_feedback(target, decision.decision_id, reward)

    def _schedule_feedback(self, target: _Target, decision_id: str, reward: float) -> None:
        plan = self.config.feedback.draw(self._rng)
        if plan.delay is None:
            self.planned["dropped"] += 1
            return
        self.planned["once" if plan.duplicate_delay is None else "twice"] += 1
        self._spawn(self._send_reward(target, decision_id, reward, plan.delay))
        if plan.duplicate_delay is not None:
            # Its own task: the copy may race the first send, as a client retry can.
            delay = plan.delay + plan.duplicate_delay
            self._spawn(self._send_reward(target, decision_id, reward, delay))

    async def _send_reward(self, target: _Target, decision_id: str, reward: float,
                           delay: float) -> None:
        await asyncio.sleep(delay)
        send = self._clients.next().reward(target.id, decision_id, reward,
                                           api_key=target.api_key)
        try:
            result = await timed(self.routes[REWARD], send)
        except (asyncio.CancelledError, TransportError, Unavailable) as exc:
            target.tally.reward_unknown.add(decision_id)
            if isinstance(exc, asyncio.CancelledError):
                raise
        except (NotFound, Conflict) as exc:  # the single reward's not_found and conflict
            target.tally.acknowledge(decision_id, exc.error)
        except ApiError:
            pass
        else:
            target.tally.acknowledge(decision_id, result.status)

    # -- the two loops

    def _budget(self) -> bool:
        """Take one /choose from the closed loop's budget; False when it is spent."""
        if self._issued >= self.config.max_requests:
            return False
        self._issued += 1
        return True

    async def _open_loop(self, start: float) -> None:
        cfg = self.config
        assert cfg.rate is not None
        for at in poisson_arrivals(cfg.rate, cfg.duration, self._rng, cfg.max_requests):
            wait = start + float(at) - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            self._lag = max(self._lag, -wait)
            self._spawn(self._decide())

    async def _closed_loop(self, start: float) -> None:
        assert self.config.concurrency is not None
        deadline = start + self.config.duration

        async def worker() -> None:
            while time.perf_counter() < deadline and self._budget():
                await self._decide()

        await asyncio.gather(*(worker() for _ in range(self.config.concurrency)))

    async def _ticker(self, start: float) -> None:
        total = self.config.duration
        with tqdm(total=total, desc="load", unit="s", bar_format="{l_bar}{bar}| "
                  "{n:.1f}/{total:g} s{postfix}", disable=not self._progress) as bar:
            try:
                while True:
                    self._tick(bar, time.perf_counter() - start)
                    await asyncio.sleep(0.25)
            finally:
                self._tick(bar, time.perf_counter() - start)

    def _tick(self, bar: tqdm[Any], elapsed: float) -> None:
        decisions = self.routes[CHOOSE].requests
        errors = sum(sum(r.errors.values()) for r in self.routes.values())
        bar.n = min(elapsed, self.config.duration)
        bar.set_postfix_str(f"{decisions} decisions, {decisions / max(elapsed, 1e-9):.0f}/s, "
                            f"{errors} errors")

    async def _drain(self) -> int:
        """Wait (bounded) for decisions in flight and delayed rewards; cancel the rest."""
        deadline = time.perf_counter() + self.config.drain_seconds
        while self._tasks and (left := deadline - time.perf_counter()) > 0:
            # Decisions in flight spawn reward tasks, so wait again until none are left.
            await asyncio.wait(set(self._tasks), timeout=left)
        abandoned = list(self._tasks)
        for task in abandoned:
            task.cancel()
        await asyncio.gather(*abandoned, return_exceptions=True)
        return len(abandoned)

    async def _check(self) -> CounterCheck:
        checks, problems = [], list(dict.fromkeys(self._failures))
        for target in self.targets:
            try:
                view = await self._clients.admin.get_experiment(target.id)
            except ApiError as exc:
                problems.append(f"GET /experiments/{target.id} answered {exc.status}")
                continue
            checks.append(expected_counters(target.id, target.tally, view.model_dump()))
        return CounterCheck(checks, problems)

    async def run(self) -> LoadReport:
        """Set up, load, drain, check. Experiments are left for the caller to delete."""
        await self.setup()
        start = time.perf_counter()
        ticker = asyncio.ensure_future(self._ticker(start))
        try:
            await (self._open_loop(start) if self.config.mode == "open"
                   else self._closed_loop(start))
        finally:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
        load_seconds = time.perf_counter() - start
        abandoned = await self._drain()
        total_seconds = time.perf_counter() - start
        lag = 1e3 * self._lag if self.config.mode == "open" else None
        return LoadReport(self.config, self._clients.base_url, self.routes, load_seconds,
                          total_seconds, lag, self.planned, abandoned,
                          await self._check())


async def run_load(base_url: str, admin_token: str, config: LoadConfig, *,
                   progress: bool = True, keep: bool = False) -> LoadReport:
    """Run one load replay against ``base_url`` and return its report.

    Parameters
    ----------
    base_url : str
    admin_token : str
    config : LoadConfig
    progress : bool
        Show a tqdm bar over the duration.
    keep : bool
        Keep the experiments afterwards (default: delete them).

    Returns
    -------
    LoadReport
    """
    pool = ClientPool(base_url, config.connections, config.timeout, config.clients, admin_token)
    async with pool:
        runner = LoadRunner(pool, config, progress)
        try:
            return await runner.run()
        finally:
            if not keep:
                await runner.delete()


def write_report(report: LoadReport, out: Path) -> Path:
    """Write the JSON report (creating its directory); returns ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return out
