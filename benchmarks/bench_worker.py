"""A serving worker's CPU per request, in-process: the app without an HTTP server or wrk.

Usage::

    python -m benchmarks.bench_worker [--blocks 8] [--requests 300] [--concurrency 30]
                                      [--loads LOAD ...]

``benchmarks.bench_service`` measures the service under wrk; on a small machine wrk and
Redis share a core, and its req/s ratios move by 0.1 between runs. This one calls the
ASGI app directly (``app.main.create_app``, its lifespan running, an embedded Redis) from
``--concurrency`` loops in one process, and reports this process's CPU time (all its
threads) per request and Redis's (INFO cpu) per request: the worker's cost alone,
without HTTP parsing or sockets. The world is bench_service's (stochastic, K = 100,
d = 20, LinReBoot with the service's default spread, propensities on).

Loads, in turn in every block (so that the machine's drift weighs on all alike):

* ``/choose`` and ``/rank`` (k = 10): decisions only, from unchanged statistics;
* ``choose + reward``: every decision rewarded (a normal reward), the statistics
  changing all along;
* ``rank + reward``: every ranking's ten slots rewarded in one batch;
* ``/rank after rewards``: rankings only again, right after the rewards above (the
  block that found rankings computing a placement table each, BENCHMARKS.md §32).

The report gives each load's median over the blocks, per request (a pair's two
requests counted as one pair).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from fastapi import FastAPI
from pydantic import SecretStr

from app.main import create_app
from benchmarks.bench_service import World
from loadtest.server import free_port
from service.embedded import EmbeddedRedis
from service.settings import Settings

TOKEN = "bench-worker-token"
LOADS = ("/choose", "/rank k=10", "choose + reward", "rank + reward", "/rank after rewards")
EXPERIMENT = "bench"
Headers = list[tuple[bytes, bytes]]


async def _post(app: FastAPI, path: str, body: dict[str, Any], headers: Headers) -> Any:
    """POST ``body`` to the app as an HTTP server would hand it over; the JSON answer."""
    raw = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("bench", 80),
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(raw)).encode()), *headers]}
    messages: list[dict[str, Any]] = [{"type": "http.request", "body": raw, "more_body": False}]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client stays: never disconnects
        raise AssertionError("unreachable")

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = sent[0]["status"]
    answer = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    if status != 200 and not (status == 201 and path == "/experiments"):
        raise SystemExit(f"{path} answered {status}: {answer}")
    return answer


def _loads(app: FastAPI, headers: Headers, rng: np.random.Generator
           ) -> dict[str, Callable[[], Awaitable[None]]]:
    """Each load's one request (or pair)."""
    def reward() -> float:
        return float(rng.normal(0.5, 0.3))

    async def choose() -> None:
        await _post(app, "/choose", {"experiment_id": EXPERIMENT}, headers)

    async def rank() -> None:
        await _post(app, "/rank", {"experiment_id": EXPERIMENT, "k": 10}, headers)

    async def choose_reward() -> None:
        decision = await _post(app, "/choose", {"experiment_id": EXPERIMENT}, headers)
        await _post(app, "/reward", {"experiment_id": EXPERIMENT, "reward": reward(),
                                     "decision_id": decision["decision_id"]}, headers)

    async def rank_reward() -> None:
        ranking = await _post(app, "/rank", {"experiment_id": EXPERIMENT, "k": 10}, headers)
        await _post(app, "/reward", {"experiment_id": EXPERIMENT, "rewards": [
            {"decision_id": slot["decision_id"], "reward": reward()}
            for slot in ranking["slots"]]}, headers)

    return dict(zip(LOADS, (choose, rank, choose_reward, rank_reward, rank), strict=True))


async def _block(call: Callable[[], Awaitable[None]], requests: int, concurrency: int,
                 redis_cpu: Callable[[], Awaitable[float]]) -> tuple[float, float]:
    """This process's and Redis's CPU µs per request (or pair) over ``requests`` of them."""
    async def loop() -> None:
        for _ in range(requests // concurrency):
            await call()

    worker, server = time.process_time(), await redis_cpu()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    done = requests // concurrency * concurrency
    return ((time.process_time() - worker) / done * 1e6,
            (await redis_cpu() - server) / done * 1e6)


async def run(blocks: int, requests: int, concurrency: int, only: list[str] | None = None
              ) -> dict[str, list[tuple[float, float]]]:
    results: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        embedded = EmbeddedRedis(Path(tmp), port=free_port()).start()
        client = aioredis.Redis.from_url(embedded.url)

        async def redis_cpu() -> float:
            info = await client.info("cpu")
            return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        try:
            settings = Settings(redis_url=embedded.url, admin_token=SecretStr(TOKEN),
                                log_level="warning")
            app = create_app(settings)
            async with app.router.lifespan_context(app):
                admin = [(b"authorization", f"Bearer {TOKEN}".encode())]
                created = await _post(app, "/experiments", {
                    "id": EXPERIMENT, "setting": "stochastic", "dim": World().dim,
                    "policy": "linreboot", "arms": World().arm_specs()}, admin)
                loads = _loads(app, [(b"x-api-key", created["api_key"].encode())],
                               np.random.default_rng(0))
                loads = {name: call for name, call in loads.items()
                         if only is None or name in only or name == "/choose"}
                for call in loads.values():  # warm: every code path, the arms past exploring
                    await _block(call, 2 * concurrency, concurrency, redis_cpu)
                for block in range(blocks):
                    for name, call in loads.items():
                        results.setdefault(name, []).append(
                            await _block(call, requests, concurrency, redis_cpu))
                    print(f"block {block + 1} of {blocks}", flush=True)
            await client.aclose()
        finally:
            embedded.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--requests", type=int, default=300, help="requests (pairs) a block")
    parser.add_argument("--concurrency", type=int, default=30, help="loops in flight")
    parser.add_argument("--loads", nargs="+", choices=LOADS, default=None,
                        help="only these (and /choose, the reference); default: all")
    args = parser.parse_args()
    results = asyncio.run(run(args.blocks, args.requests, args.concurrency, args.loads))
    choose = statistics.median(w for w, _ in results["/choose"])
    print(f"\nstochastic, K = 100, d = 20, default spread; {args.concurrency} loops; "
          f"median of {args.blocks} blocks of {args.requests}\n")
    print("| load | worker CPU µs a request (pair) | against /choose | Redis µs |")
    print("|---|---:|---:|---:|")
    for name, rows in results.items():
        worker = statistics.median(w for w, _ in rows)
        server = statistics.median(s for _, s in rows)
        print(f"| {name} | {worker:.0f} | {choose / worker:.2f} | {server:.1f} |")


if __name__ == "__main__":
    main()
