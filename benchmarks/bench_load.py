"""The load replay (closed loop) next to a floor, both driven by the same Python client.

Usage::

    python -m benchmarks.bench_load [--duration 15] [--concurrency 32] [--workers 1 2]

Starts one embedded Redis on a loopback TCP port; then, for each uvicorn worker
count, the floor app (``benchmarks/floor_app.py``: one FastAPI endpoint, one
Redis round trip) and the service (``linreboot serve``), both with that many
workers and the same Redis. Each is driven through the same pool of
``httpx.AsyncClient`` at the same concurrency, latency with
``time.perf_counter`` around each request (the floor with
:func:`loadtest.load.post_timed`, the service through :mod:`linreboot.client`
with :func:`loadtest.load.timed`): floor, load replay, floor again.
The service run is ``linreboot loadtest`` in closed loop: 20 experiments,
stochastic K = 100, d = 20, LinReBoot, realistic feedback (delays, drops,
duplicates), and its counter check must pass. The ratio to the mean of the two
floor runs is what to compare across machines; unlike ``bench_service`` (wrk)
the client here is Python and shares the CPUs, so both sides carry its cost.

Note that ``--concurrency`` bounds the ``/choose`` requests in flight; the
delayed rewards are sent on top of them, so the service sees somewhat more
requests in flight than the floor does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from loadtest.load import (
    CHOOSE,
    CLIENT_NOTE,
    REWARD,
    ClientPool,
    LoadConfig,
    RouteStats,
    latency_summary,
    post_timed,
    run_load,
)
from loadtest.server import free_port, server_process
from service.embedded import EmbeddedRedis

TOKEN = "bench-load-token"


@dataclass(frozen=True)
class Row:
    """One line of the table: a route's throughput and latency under one worker count."""

    workers: int
    route: str
    requests_per_second: float
    ratio_to_floor: float
    p50_ms: float | None
    p99_ms: float | None
    errors: int


@contextmanager
def floor_process(env: dict[str, str], workers: int) -> Iterator[str]:
    """The floor app under uvicorn with ``workers`` workers; yields its base URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "benchmarks.floor_app:create_app",
           "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
           "--log-level", "warning", "--no-access-log"]
    proc = subprocess.Popen(cmd, env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_floor(url, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _wait_floor(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"floor app exited with code {proc.returncode}")
        try:
            if httpx.post(f"{url}/floor", json={}, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"floor app at {url} not ready after {timeout:.0f} s")


async def floor_run(url: str, concurrency: int, seconds: float) -> RouteStats:
    """Closed loop of ``POST /floor``: the load replay's clients, concurrency and timing."""
    stats = RouteStats()
    defaults = LoadConfig(concurrency=concurrency)
    async with ClientPool(url, defaults.connections, defaults.timeout, defaults.clients) as pool:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                await post_timed(pool.next().http, stats, "/floor", {}, {})

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return stats


def _merge(runs: list[RouteStats]) -> tuple[float, RouteStats]:
    """Mean requests/s of the runs, and their pooled latencies and statuses."""
    pooled = RouteStats()
    for run in runs:
        pooled.latencies += run.latencies
        pooled.statuses.update(run.statuses)
    rps = sum(r.summary()["requests_per_second"] for r in runs) / len(runs)
    return rps, pooled


def _row(workers: int, route: str, rps: float, floor_rps: float, stats: RouteStats) -> Row:
    latency = latency_summary(stats.latencies)
    return Row(workers, route, rps, rps / floor_rps, latency["p50_ms"], latency["p99_ms"],
               sum(stats.errors.values()))


def measure(workers: int, redis_url: str, concurrency: int, seconds: float) -> list[Row]:
    """Floor, load replay, floor, with ``workers`` uvicorn workers each; the table rows."""
    env = {"LINREBOOT_REDIS_URL": redis_url, "LINREBOOT_ADMIN_TOKEN": TOKEN,
           "LINREBOOT_LOG_LEVEL": "warning"}
    config = LoadConfig(concurrency=concurrency, duration=seconds, max_requests=10_000_000)
    warm = LoadConfig(concurrency=concurrency, duration=2.0, seed=1)
    with ExitStack() as stack:
        floor = stack.enter_context(floor_process(env, workers))
        service = stack.enter_context(server_process(env, workers=workers))
        asyncio.run(floor_run(floor, concurrency, 1.0))
        floors = [asyncio.run(floor_run(floor, concurrency, seconds))]
        asyncio.run(run_load(service, TOKEN, warm, progress=False))
        report = asyncio.run(run_load(service, TOKEN, config, progress=False))
        floors.append(asyncio.run(floor_run(floor, concurrency, seconds)))
    print(report.check.line(), file=sys.stderr)
    if not report.check.passed:
        raise SystemExit("the load replay's counter check failed")
    floor_rps, pooled = _merge(floors)
    routes = report.routes
    total = RouteStats(latencies=routes[CHOOSE].latencies + routes[REWARD].latencies,
                       statuses=routes[CHOOSE].statuses + routes[REWARD].statuses)
    return [
        _row(workers, "floor", floor_rps, floor_rps, pooled),
        *(_row(workers, name, routes[name].summary()["requests_per_second"], floor_rps,
               routes[name]) for name in (CHOOSE, REWARD)),
        _row(workers, "/choose + /reward", report.totals()["requests_per_second"], floor_rps,
             total),
    ]


def table(rows: list[Row], concurrency: int, seconds: float) -> str:
    """The markdown table for BENCHMARKS.md."""
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = [
        f"Load replay, closed loop at concurrency {concurrency} (/choose in flight; delayed "
        f"rewards on top), {seconds:g} s per run; 20 experiments, stochastic K=100 d=20, "
        "LinReBoot; floor = mean of two runs of benchmarks/floor_app.py, same client.",
        "",
        "| workers | route | req/s | ratio to floor | p50 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r.workers} | {r.route} | {r.requests_per_second:.0f} | "
              f"{r.ratio_to_floor:.2f} | {ms(r.p50_ms)} | {ms(r.p99_ms)} | {r.errors} |"
              for r in rows]
    lines += ["", f"Note: {CLIENT_NOTE}; {os.cpu_count()} CPUs."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per run")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        redis = EmbeddedRedis(Path(tmp) / "redis", port=free_port()).start()
        try:
            for workers in args.workers:
                rows += measure(workers, redis.url, args.concurrency, args.duration)
        finally:
            redis.stop()
    print(table(rows, args.concurrency, args.duration))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")


if __name__ == "__main__":
    main()
