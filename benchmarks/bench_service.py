"""Throughput and latency of /choose and /reward next to a floor, measured with wrk.

Usage::

    python -m benchmarks.bench_service [--duration 10] [--connections 32] [--workers 1]
                                       [--rounds 3] [--spread paper|default] [--cluster]
                                       [--setting stochastic|covariates] [--arms K] [--dim D]
                                       [--pin]

Starts one embedded Redis, the service and a floor app (a minimal FastAPI
endpoint doing one Redis round trip) under the same uvicorn settings, then
drives each with wrk (a C load generator, so the client is not the bottleneck)
on loopback, in rounds: floor, /choose, /reward, a mixed run in which every
decision is rewarded (with max_stale_rewards 0, then 100), floor again. Each
run's ratio to the mean of its round's two floor runs is what to compare
across machines; the report gives the median over rounds (the shared machine
drifts by 10-20 % between runs). Each run also gives the serving workers' CPU
per request (from /proc) and its ratio to the floor's: what one worker with a
core of its own would serve, where wrk, Redis and the worker share few cores.
Stochastic setting, K = 100 arms, d = 20 unless ``--setting``, ``--arms``,
``--dim`` say otherwise (covariates: one context with each /choose),
LinReBoot (``--spread``: the paper's, or the service's default), an unseeded
experiment.

``--cluster`` then measures the same on a local Redis Cluster (3 masters and
a replica, tests/cluster.py), in the same run: one table per store. The
experiments live on one master, as any experiment does. "Redis µs/request" is
the servers' main-thread CPU (INFO cpu: commands and their clients' I/O, each
counted once; :func:`server_cpu_us`), summed over the masters.

``--pin`` gives the serving workers (the floor's and the service's, one at a
time under load) the machine's last core and everything else (Redis, wrk,
this process) the others, as ``bench_scale --pin`` does: on a small machine
the req/s ratios then compare the workers' own work rather than their
contention with Redis and wrk for the same cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np
import redis

from loadtest.server import free_port
from service.embedded import EmbeddedRedis

HERE = Path(__file__).resolve().parent
LAG = 100  # max_stale_rewards of the second mixed run's experiment
FLOOR_KEY = "lrb-bench:floor"  # what benchmarks/floor_app.py increments


@dataclass
class WrkResult:
    name: str
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    errors: int
    requests: int = 0
    redis_us_per_request: float = 0.0  # Redis server CPU (INFO cpu, its main thread)
    worker_us_per_request: float = 0.0  # the serving processes' CPU (user + system)


def _unit_ms(value: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", value)
    if match is None:
        raise ValueError(f"cannot read the wrk latency {value!r}")
    number, unit = match.groups()
    return float(number) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def run_wrk(name: str, url: str, duration: int, connections: int, script: Path,
            args: list[str], threads: int = 1) -> WrkResult:
    out = subprocess.run(wrk_command(url, duration, connections, script, args, threads),
                         capture_output=True, text=True, check=True)
    return read_wrk(name, out.stdout + out.stderr)


def run_wrks(name: str, runs: list[tuple[str, list[str], int]], duration: int,
             connections: int, script: Path) -> WrkResult:
    """wrk against several servers at once, each run (url, script arguments, threads)
    with ``connections`` of its own: the requests and errors summed, the worst p50 and p99."""
    procs: list[subprocess.Popen[str]] = []
    results = []
    try:
        for url, args, threads in runs:
            procs.append(subprocess.Popen(
                wrk_command(url, duration, connections, script, args, threads),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for proc in procs:  # (wrk prints a few lines: no pipe fills while another is read)
            text, _ = proc.communicate()
            if proc.returncode:
                raise subprocess.CalledProcessError(proc.returncode, proc.args, text)
            results.append(read_wrk(name, text))
    finally:  # none left to load the next run
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return WrkResult(name, sum(r.requests_per_second for r in results),
                     max(r.p50_ms for r in results), max(r.p99_ms for r in results),
                     sum(r.errors for r in results), sum(r.requests for r in results))


def wrk_command(url: str, duration: int, connections: int, script: Path, args: list[str],
                threads: int = 1) -> list[str]:
    return ["wrk", f"-t{threads}", f"-c{max(connections, threads)}", f"-d{duration}s",
            "--latency", "-s", str(script), url, "--", *args]


def read_wrk(name: str, text: str) -> WrkResult:
    """What wrk (run with --latency) printed."""
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    # The "Latency Distribution" block (after --latency), not the thread stats.
    block = text.split("Latency Distribution", 1)[-1]
    p50 = _unit_ms(re.search(r"50%\s+(\S+)", block).group(1))  # type: ignore[union-attr]
    p99 = _unit_ms(re.search(r"99%\s+(\S+)", block).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    errors = (int(bad.group(1)) if bad else 0) + (sum(map(int, sock.groups())) if sock else 0)
    requests = int(re.search(r"(\d+) requests in", text).group(1))  # type: ignore[union-attr]
    return WrkResult(name, rps, p50, p99, errors, requests)


def with_redis_cost(servers: list[redis.Redis], run: Callable[[], WrkResult]) -> WrkResult:
    """``run()``, with the Redis servers' CPU per request during it (:func:`server_cpu_us`)."""
    before = [server_cpu_us(server) for server in servers]
    result = run()
    busy_us = sum(server_cpu_us(server) - b for server, b in zip(servers, before, strict=True))
    return dataclasses.replace(result, redis_us_per_request=busy_us / max(result.requests, 1))


def server_cpu_us(server: redis.Redis) -> float:
    """The CPU (µs, user + system) the server's main thread has used (INFO cpu): its
    commands and its clients' reads and writes. Not INFO commandstats' command time,
    which counts a script's own commands twice (in the script's time and again as
    commands) and, as wall time, counts the moments the server waited for a core."""
    cpu: dict[str, float] = server.info("cpu")  # type: ignore[assignment]
    main = ("used_cpu_user_main_thread", "used_cpu_sys_main_thread")
    names = main if all(name in cpu for name in main) else ("used_cpu_user", "used_cpu_sys")
    return 1e6 * sum(float(cpu[name]) for name in names)


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants (uvicorn's workers), from
    /proc: what the serving side spent, whatever else shares the machine's cores."""
    return sum(tree_cpu_by_process(pid).values())


def tree_cpu_by_process(pid: int) -> dict[int, float]:
    """:func:`tree_cpu_seconds` by process of the tree."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, of in parents.items() if of == parent]
        tree.update(children)
        frontier.extend(children)
    return {p: times.get(p, 0.0) for p in tree}


def with_worker_cost(pid: int, run: Callable[[], WrkResult]) -> WrkResult:
    """``run()``, with the CPU the process tree ``pid`` spent per request during it."""
    before = tree_cpu_seconds(pid)
    result = run()
    spent = tree_cpu_seconds(pid) - before
    return dataclasses.replace(result, worker_us_per_request=1e6 * spent / max(result.requests, 1))


def _store(stack: ExitStack, tmp: Path, cluster: bool) -> tuple[str, str, list[redis.Redis]]:
    """A Redis (embedded) or a local Redis Cluster: its URL, the URL for the floor app
    (a plain client: on a cluster, the master of its key) and the primaries."""
    if cluster:
        from tests.cluster import local_cluster  # test infrastructure: a real local cluster

        started = stack.enter_context(local_cluster(tmp / "cluster"))
        servers = [started.node(port) for port in started.masters]
        url = started.url
        floor_url = started.url_of(started.owner(FLOOR_KEY))
    else:
        embedded = EmbeddedRedis(tmp / "redis", port=free_port()).start()
        stack.callback(embedded.stop)
        servers = [redis.Redis.from_url(embedded.url)]
        url = floor_url = embedded.url
    for server in servers:
        stack.callback(server.close)
    return url, floor_url, servers


def _start(stack: ExitStack, cmd: list[str], env: dict[str, str], port: int,
           probe: str) -> tuple[str, int]:
    """The server's URL, once it answers ``probe``, and its process id."""
    proc = subprocess.Popen(cmd, env={**os.environ, **env})
    stack.callback(proc.wait, timeout=30)  # callbacks run last-in first-out:
    stack.callback(proc.terminate)  # terminate, then wait
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.request("GET" if probe != "/floor" else "POST", url + probe, timeout=1)
            return url, proc.pid
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(f"{cmd} did not start")


@dataclass(frozen=True)
class World:
    """What the benchmark's experiments decide over: the issue's K = 100, d = 20
    stochastic world by default; covariates sends one context with each /choose."""

    setting: str = "stochastic"
    arms: int = 100
    dim: int = 20

    def arm_specs(self) -> list[dict[str, object]]:
        if self.setting != "stochastic":
            return [{"id": f"a{k}"} for k in range(self.arms)]
        features = np.random.default_rng(0).random((self.arms, self.dim))
        features /= np.linalg.norm(features, axis=1, keepdims=True)
        return [{"id": f"a{k}", "features": f.tolist()} for k, f in enumerate(features)]

    def choose_body(self, experiment_id: str, k: int | None = None) -> str:
        """A /choose body; with ``k``, a /rank body of k slots."""
        body: dict[str, object] = {"experiment_id": experiment_id,
                                   **({} if k is None else {"k": k})}
        if self.setting == "covariates":
            context = np.random.default_rng(1).normal(size=self.dim)
            body["context"] = (context / np.linalg.norm(context)).round(6).tolist()
        return json.dumps(body, separators=(",", ":"))


def _experiment(url: str, token: str, experiment_id: str = "bench",
                max_stale_rewards: int = 0, spread: str = "paper",
                world: World = World(), shards: int = 1) -> tuple[str, str]:
    body = {
        "id": experiment_id, "setting": world.setting, "dim": world.dim, "policy": "linreboot",
        "arms": world.arm_specs(),
        "max_stale_rewards": max_stale_rewards, "shards": shards,
        # "paper": as BENCHMARKS.md measured it before issue 26; "default": the service's
        # default (pooled), what issue 26's targets are about.
        "hyperparameters": {} if spread == "default" else {"spread": spread},
    }
    r = httpx.post(f"{url}/experiments", json=body,
                   headers={"Authorization": f"Bearer {token}"}, timeout=30)
    r.raise_for_status()
    return experiment_id, r.json()["api_key"]


def pin_serving() -> list[str]:
    """The serving workers on the machine's last core, everything else on the others: this
    process from now on (Redis and wrk, started after, inherit it); returns the command
    prefix that starts a server on that last core (``--pin``)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or shutil.which("taskset") is None:
        raise SystemExit("--pin needs two cores and taskset")
    os.sched_setaffinity(0, cores[:-1])
    return ["taskset", "-c", str(cores[-1])]


def measure(duration: int, connections: int, workers: int, rounds: int,
            cluster: bool = False, spread: str = "paper",
            world: World = World(), rank: int | None = None,
            pin: bool = False) -> list[list[WrkResult]]:
    """``rounds`` rounds of floor, /choose, (with ``rank`` k: /rank of k slots),
    /reward, the two mixed runs, floor."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install wrk")
    token = "bench-token"
    pinned = pin_serving() if pin else []
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        url, floor_url, servers = _store(stack, tmp, cluster)
        env = {"LINREBOOT_REDIS_URL": url, "LINREBOOT_ADMIN_TOKEN": token,
               "LINREBOOT_LOG_LEVEL": "warning"}
        floor_port, service_port = free_port(), free_port()
        uvicorn_opts = ["--workers", str(workers), "--log-level", "warning", "--no-access-log"]
        floor, floor_pid = _start(stack, [*pinned, sys.executable, "-m", "uvicorn", "--factory",
                               "benchmarks.floor_app:create_app", "--port", str(floor_port),
                               *uvicorn_opts], {**env, "LINREBOOT_REDIS_URL": floor_url},
                       floor_port, "/floor")
        service, service_pid = _start(stack, [*pinned, sys.executable, "-m", "linreboot", "serve",
                                              "--port",
                                 str(service_port), "--workers", str(workers)],
                         env, service_port, "/readyz")
        experiment, key = _experiment(service, token, spread=spread, world=world)
        lagging, lagging_key = _experiment(service, token, "bench-lag", LAG, spread, world)
        floor_lua = tmp / "floor.lua"
        floor_lua.write_text('wrk.method = "POST"\nwrk.body = "{}"\n'
                             'wrk.headers["Content-Type"] = "application/json"\n')
        choose_body = world.choose_body(experiment)
        run_wrk("warm-up", f"{service}/choose", 2, connections, HERE / "wrk_choose.lua",
                [choose_body, key, str(tmp)])
        all_rounds = []
        for n in range(rounds):
            ids = tmp / f"ids-{n}"
            ids.mkdir()
            runs: list[tuple[str, str, int, Path, list[str]]] = [
                ("floor", f"{floor}/floor", duration, floor_lua, []),
                # Three times as long: /reward needs one fresh decision id per request,
                # and a reward may be served at more than twice the rate of a decision.
                ("/choose", f"{service}/choose", 3 * duration, HERE / "wrk_choose.lua",
                 [choose_body, key, str(ids)]),
                # Its ids apart: /reward takes the /choose run's.
                *([(f"/rank k={rank}", f"{service}/rank", duration, HERE / "wrk_choose.lua",
                    [world.choose_body(experiment, rank), key, str(tmp)])] if rank else []),
                ("/reward", f"{service}/reward", duration, HERE / "wrk_reward.lua",
                 [experiment, key, str(ids), "1"]),
                # Not in the target: each decision rewarded, so views go stale.
                ("choose+reward", f"{service}/choose", duration, HERE / "wrk_pairs.lua",
                 [experiment, key, choose_body]),
                (f"choose+reward, lag {LAG}", f"{service}/choose", duration,
                 HERE / "wrk_pairs.lua", [lagging, lagging_key, world.choose_body(lagging)]),
                ("floor", f"{floor}/floor", duration, floor_lua, []),
            ]
            all_rounds.append([
                with_redis_cost(servers, functools.partial(
                    with_worker_cost, floor_pid if name == "floor" else service_pid,
                    functools.partial(run_wrk, name, url, seconds, connections, script,
                                      script_args)))
                for name, url, seconds, script, script_args in runs
            ])
        return all_rounds


def report(rounds: list[list[WrkResult]], workers: int) -> str:
    """One row per endpoint: the median over rounds of req/s, ratio, p50, p99, and of
    the CPU per request of the serving workers and of Redis.

    A round's ratio divides by the mean of that round's two floor runs, so the
    machine's drift between rounds cancels. The CPU ratio divides the floor's
    worker CPU per request by the endpoint's: the throughput ratio of a worker
    with a core of its own (on a machine where wrk, Redis and the worker share
    few cores, the req/s ratio also carries their contention).
    """
    ratios: dict[str, list[float]] = {}
    cpu_ratios: dict[str, list[float]] = {}
    rows: dict[str, list[WrkResult]] = {}
    floors, floor_cpus = [], []
    for results in rounds:
        floor_runs = [r for r in results if r.name == "floor"]
        floor_rps = statistics.mean(r.requests_per_second for r in floor_runs)
        floor_cpu = statistics.mean(r.worker_us_per_request for r in floor_runs)
        floors.append(floor_rps)
        floor_cpus.append(floor_cpu)
        for r in results:
            if r.name != "floor":
                ratios.setdefault(r.name, []).append(r.requests_per_second / floor_rps)
                cpu_ratios.setdefault(r.name, []).append(
                    floor_cpu / r.worker_us_per_request if r.worker_us_per_request else 0.0)
                rows.setdefault(r.name, []).append(r)
    lines = [
        f"uvicorn workers: {workers}; {len(rounds)} rounds; floor (median of the rounds' "
        f"means): {statistics.median(floors):.0f} req/s",
        "",
        "| endpoint | req/s | ratio to floor (median) | ratios by round | p50 ms | p99 ms "
        "| worker µs/request | CPU ratio (median) | CPU ratios by round | Redis µs/request "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    floor_runs = [r for results in rounds for r in results if r.name == "floor"]
    lines.append(
        f"| floor | {statistics.median(floors):.0f} | 1.00 | | "
        f"{statistics.median(r.p50_ms for r in floor_runs):.2f} | "
        f"{statistics.median(r.p99_ms for r in floor_runs):.2f} | "
        f"{statistics.median(floor_cpus):.0f} | 1.00 | | "
        f"{statistics.median(r.redis_us_per_request for r in floor_runs):.1f} | "
        f"{sum(r.errors for r in floor_runs)} |"
    )
    for name, results in rows.items():
        by_round = ", ".join(f"{x:.2f}" for x in ratios[name])
        cpu_by_round = ", ".join(f"{x:.2f}" for x in cpu_ratios[name])
        lines.append(
            f"| {name} | {statistics.median(r.requests_per_second for r in results):.0f} | "
            f"**{statistics.median(ratios[name]):.2f}** | {by_round} | "
            f"{statistics.median(r.p50_ms for r in results):.2f} | "
            f"{statistics.median(r.p99_ms for r in results):.2f} | "
            f"{statistics.median(r.worker_us_per_request for r in results):.0f} | "
            f"**{statistics.median(cpu_ratios[name]):.2f}** | {cpu_by_round} | "
            f"{statistics.median(r.redis_us_per_request for r in results):.1f} | "
            f"{sum(r.errors for r in results)} |"
        )
    for name in (n for n in rows if n.startswith("/rank")):
        against = [r / c for r, c in zip(ratios[name], ratios["/choose"], strict=True)]
        cpu = [r / c for r, c in zip(cpu_ratios[name], cpu_ratios["/choose"], strict=True)]
        lines += ["", f"{name} against /choose in the same round: req/s "
                  f"**{statistics.median(against):.2f}** ({', '.join(f'{x:.2f}' for x in against)}"
                  f"), worker CPU **{statistics.median(cpu):.2f}** "
                  f"({', '.join(f'{x:.2f}' for x in cpu)})"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per run")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of every run; the report gives medians")
    parser.add_argument("--json", type=Path, default=None, help="also write raw figures here")
    parser.add_argument("--spread", choices=("paper", "default"), default="paper",
                        help="LinReBoot's spread: the paper's (as earlier runs) or the "
                             "service's default (pooled)")
    parser.add_argument("--setting", choices=("stochastic", "covariates"), default="stochastic")
    parser.add_argument("--arms", type=int, default=100, help="K")
    parser.add_argument("--dim", type=int, default=20, help="d")
    parser.add_argument("--rank", type=int, default=None, metavar="K",
                        help="also /rank of K slots, after /choose in each round")
    parser.add_argument("--cluster", action="store_true",
                        help="then the same on a local Redis Cluster, in the same run")
    parser.add_argument("--pin", action="store_true",
                        help="the serving workers on the last core, Redis and wrk on the others")
    args = parser.parse_args()
    stores = [False, True] if args.cluster else [False]
    measured = {}
    for cluster in stores:
        rounds = measure(args.duration, args.connections, args.workers, args.rounds, cluster,
                         args.spread, World(args.setting, args.arms, args.dim), args.rank,
                         args.pin)
        measured["cluster" if cluster else "redis"] = rounds
        print(("On a Redis Cluster (3 masters)" if cluster else "On one Redis") + ":")
        print(report(rounds, args.workers), flush=True)
    if args.json:
        raw = {store: [[asdict(r) for r in rs] for rs in rounds]
               for store, rounds in measured.items()}
        args.json.write_text(json.dumps(raw if args.cluster else raw["redis"], indent=2))


if __name__ == "__main__":
    main()
