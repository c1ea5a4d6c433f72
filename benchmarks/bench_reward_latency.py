"""How long a ``/reward`` waits, with its fold in the background or waited for.

Usage::

    python -m benchmarks.bench_reward_latency [--blocks 6] [--pairs 320]

Every ``FOLD_EVERY`` rewards one worker writes the sums back
(:mod:`service.folding`). This starts an embedded Redis and one
:class:`service.experiments.ExperimentService` (a worker, without HTTP),
creates a LinReBoot experiment with K = 100 arms, d = 20 (stochastic), and
times each reward of choose + reward pairs, in alternate blocks with the fold
started in the background (the service) or awaited by the reward that
crossed the multiple (as before issue 26). Prints each mode's median, 90th,
99th percentile and mean reward latency, over all its blocks; one process,
one machine load for both.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from service.domain import ArmSpec, ChooseRequest, ExperimentSpec
from service.experiments import ExperimentService
from service.settings import Settings

K, D = 100, 20


async def _block(service: ExperimentService, key: str, pairs: int, awaited: bool) -> list[float]:
    """Each reward's latency; ``awaited``: the reward's fold, if it started one, is waited
    for before the reward counts as answered (as before issue 26)."""
    original = service.decisions._fold_soon
    started: list[tuple[str, int, int]] = []
    if awaited:
        service.decisions._fold_soon = lambda *call: started.append(call)  # type: ignore[method-assign]
    latencies = []
    try:
        for _ in range(pairs):
            decision = await service.choose("lat", ChooseRequest(), key)
            start = time.perf_counter()
            await service.reward("lat", [(decision.decision_id, 0.5)], key)
            for call in started:
                await service.fold_if_due(*call)
            started.clear()
            latencies.append(time.perf_counter() - start)
        await service.drain()
    finally:
        service.decisions._fold_soon = original  # type: ignore[method-assign]
    return latencies


async def main(blocks: int, pairs: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        settings = Settings(data_dir=Path(directory), sweep_interval_seconds=60)
        service = await ExperimentService.open(settings)
        try:
            rng = np.random.default_rng(0)
            arms = tuple(ArmSpec(f"a{k}", tuple(rng.uniform(size=D).tolist())) for k in range(K))
            _, key = await service.create(ExperimentSpec(
                id="lat", setting="stochastic", dim=D, arms=arms,
                hyperparameters={"spread": "paper", "first_pass": False}))
            await _block(service, key, pairs, False)  # warm-up
            found: dict[str, list[float]] = {"background": [], "awaited": []}
            for b in range(blocks):
                awaited = b % 2 == 1
                found["awaited" if awaited else "background"] += await _block(
                    service, key, pairs, awaited)
        finally:
            await service.close()
    print(f"K = {K}, d = {D}, {blocks} blocks x {pairs} pairs, reward latency in ms")
    print("| fold | median | p90 | p99 | mean |")
    print("|---|---:|---:|---:|---:|")
    for mode, values in found.items():
        ms = sorted(v * 1000 for v in values)
        q = statistics.quantiles(ms, n=100)
        print(f"| {mode} | {statistics.median(ms):.2f} | {q[89]:.2f} | {q[98]:.2f} | "
              f"{statistics.fmean(ms):.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=320)
    args = parser.parse_args()
    asyncio.run(main(args.blocks, args.pairs))
