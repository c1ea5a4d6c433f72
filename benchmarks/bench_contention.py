"""Workers on one hot experiment, in one process: how often a decision is made twice.

Usage::

    python -m benchmarks.bench_contention [--workers 1 2 4] [--loops 32] [--pairs 2000]
                                          [--max-stale-rewards 0]

Each worker is an :class:`service.experiments.ExperimentService` with views of its own,
all on one embedded Redis and one event loop; ``--loops`` tasks, spread over the
workers in turn, each choose on one worker and reward the decision at once through the
next (so that every reward is another worker's to the decisions of the one that made
it), on the stochastic K = 100, d = 20 experiment of ``benchmarks.bench_service``
(default spread), until ``--pairs`` decisions are rewarded. Reports, per worker count:

- decide calls per decision, and how many of them were a second attempt (the first
  met a view made stale by another worker's rewards): each second attempt is a
  decision prepared, drawn and its propensity computed again;
- the reads first (``Store.probe_progress``) per decision, where the revision has them;
- process CPU µs per pair.

The counts are what this host's noise does not move (bench_scale's CPU per pair over
HTTP moves by a quarter between runs here): the decisions made again are the work more
workers add, and what a machine with a core per worker would show as lost scaling.
One event loop interleaves the workers more finely than separate processes do, so the
counts are an upper bound on what separate workers see.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from app.schemas import CreateExperimentIn
from benchmarks.bench_service import World
from service.domain import ChooseRequest
from service.embedded import EmbeddedRedis
from service.experiments import ExperimentService
from service.settings import Settings
from service.store import Store, _script, _ScriptBatcher


@dataclass
class Counts:
    decides: int = 0
    again: int = 0  # decide calls recorded whatever the statistics: a second attempt
    probes: int = 0


@contextlib.contextmanager
def counting() -> Iterator[Counts]:
    """Count the decide calls (a second attempt has ``seen`` None) and the reads first
    that go to Redis (joined: one for the decisions of a batch), meanwhile."""
    counts = Counts()
    decide, send = Store.decide, _ScriptBatcher._pipeline
    reads = _script("progress", ["tail"])

    async def decide_counted(self: Store, *args: Any, **kwargs: Any) -> Any:
        counts.decides += 1
        counts.again += kwargs["seen"] is None
        return await decide(self, *args, **kwargs)

    async def sent_counted(self: _ScriptBatcher, calls: list[Any], *args: Any) -> list[Any]:
        counts.probes += sum(script.script == reads for script, _ in calls)
        return await send(self, calls, *args)

    Store.decide = decide_counted  # type: ignore[method-assign]
    _ScriptBatcher._pipeline = sent_counted  # type: ignore[method-assign,assignment]
    try:
        yield counts
    finally:
        Store.decide = decide  # type: ignore[method-assign]
        _ScriptBatcher._pipeline = send  # type: ignore[method-assign]


async def run(url: str, workers: int, loops: int, pairs: int, max_stale: int,
              counts: Counts) -> dict[str, float]:
    settings = Settings(redis_url=url, admin_token=SecretStr("bench"))
    services = [await ExperimentService.open(settings) for _ in range(workers)]
    first, experiment = services[0], f"hot{workers}"
    try:
        body = {"id": experiment, "setting": "stochastic", "dim": World.dim, "policy": "linreboot",
                "arms": World().arm_specs(), "max_stale_rewards": max_stale}
        _, key = await first.create(CreateExperimentIn.model_validate(body).to_domain(settings))
        for service in services:  # every view read, every script loaded
            made = await service.choose(experiment, ChooseRequest(), key)
            await service.reward(experiment, [(made.decision_id, 0.5)], key)
        done = 0

        async def loop(index: int) -> None:
            nonlocal done
            chooser = services[index % workers]
            rewarder = services[(index + 1) % workers]
            while done < pairs:
                made = await chooser.choose(experiment, ChooseRequest(), key)
                await rewarder.reward(experiment, [(made.decision_id, 1.0)], key)
                done += 1

        counts.decides = counts.again = counts.probes = 0
        started = time.process_time()
        await asyncio.gather(*(loop(i) for i in range(loops)))
        cpu = time.process_time() - started
        decisions = counts.decides - counts.again
        return {"decide calls": counts.decides / decisions, "again": counts.again / decisions,
                "reads first": counts.probes / decisions, "cpu": 1e6 * cpu / done}
    finally:
        for service in reversed(services):
            await service.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--loops", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--max-stale-rewards", type=int, default=0)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f} at the start; "
          f"stochastic LinReBoot (default spread), K = 100, d = 20, {args.loops} loops of "
          f"choose on one worker and reward on the next, {args.pairs} pairs, "
          f"max_stale_rewards {args.max_stale_rewards}\n")
    print("| workers | decide calls / decision | made again / decision | reads first / decision "
          "| CPU µs / pair |")
    print("|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as directory, counting() as counts:
        embedded = EmbeddedRedis(Path(directory)).start()
        try:
            for workers in args.workers:
                row = asyncio.run(run(embedded.url, workers, args.loops, args.pairs,
                                      args.max_stale_rewards, counts))
                print(f"| {workers} | {row['decide calls']:.3f} | {row['again']:.3f} | "
                      f"{row['reads first']:.3f} | {row['cpu']:,.0f} |")
        finally:
            embedded.stop()


if __name__ == "__main__":
    main()
