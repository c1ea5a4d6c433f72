"""What returning and logging propensities costs ``/choose``, in the service, in-process.

Usage::

    python -m benchmarks.bench_propensity_service [--blocks 7] [--decisions 300] [--warmup 1000]

Starts an embedded Redis and one :class:`service.experiments.ExperimentService`
(the code a worker runs behind ``POST /choose``, without HTTP), creates
experiments with K = 100 arms, d = 20, plays ``--warmup`` rewarded decisions
in each, and times, in alternate blocks:

* ``with``: the service as it is (each decision's propensity computed, or
  taken from the view's cache while the statistics and contexts stay the same);
* ``without``: the same with ``View.propensity`` replaced by a constant (what
  the service did before propensities).

Workloads: *stochastic, choose only* (fixed features: a propensity per arm
and statistics version), *stochastic, choose + reward* (each decision
rewarded before the next: every decision sees new statistics, the worst
case), and *covariates, choose + reward* (a fresh context per decision).
Each block makes ``--decisions`` decisions of each workload; the table
gives the median over blocks of decisions per second and the ratio with /
without. HTTP, which this leaves out, costs the same with or without, so
over HTTP the ratio is nearer 1 than here.
"""

from __future__ import annotations

import argparse
import asyncio
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from loadtest.server import free_port
from policies import POLICIES, Setting
from policies.config import PolicyName
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec
from service.embedded import EmbeddedRedis
from service.experiments import ExperimentService, View
from service.settings import Settings

ARMS, DIM = 100, 20


async def _constant(self: View, ready: object, position: int) -> float:
    return 1.0


def _spec(
    name: str, setting: Setting, policy: PolicyName, rng: np.random.Generator
) -> ExperimentSpec:
    arms = tuple(ArmSpec(f"a{i}", tuple(rng.normal(size=DIM)) if setting == "stochastic"
                         else None) for i in range(ARMS))
    return ExperimentSpec(id=name, setting=setting, dim=DIM, arms=arms, policy=policy,
                          log_max_entries=10_000)


async def _workload(service: ExperimentService, name: str, setting: Setting, reward: bool,
                    decisions: int, rng: np.random.Generator) -> float:
    """Decisions per second of one block."""
    start = time.perf_counter()
    for _ in range(decisions):
        context = None if setting == "stochastic" else tuple(rng.normal(size=DIM))
        decision = await service.choose(name, ChooseRequest(context=context))
        if reward:
            await service.reward(name, [(decision.decision_id, float(rng.normal()))])
    return decisions / (time.perf_counter() - start)


async def run(blocks: int, decisions: int, warmup: int, policy: PolicyName) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        embedded = EmbeddedRedis(Path(tmp), port=free_port()).start()
        try:
            service = await ExperimentService.open(Settings(redis_url=embedded.url))
            rng = np.random.default_rng(0)
            workloads: dict[str, tuple[str, Setting, bool]] = {
                "stochastic, choose only": ("s", "stochastic", False),
                "stochastic, choose + reward": ("s", "stochastic", True),
                "covariates, choose + reward": ("c", "covariates", True),
            }
            settings: tuple[tuple[str, Setting], ...] = (("s", "stochastic"), ("c", "covariates"))
            for name, setting in settings:
                await service.create(_spec(name, setting, policy, rng))
                await _workload(service, name, setting, True, warmup, rng)
            results: dict[tuple[str, str], list[float]] = {}
            original = View.propensity
            for _ in range(blocks):
                for variant, method in (("with", original), ("without", _constant)):
                    View.propensity = method  # type: ignore[method-assign]
                    for label, (name, setting, reward) in workloads.items():
                        rate = await _workload(service, name, setting, reward, decisions, rng)
                        results.setdefault((label, variant), []).append(rate)
            View.propensity = original  # type: ignore[method-assign]
            await service.close()
        finally:
            embedded.stop()
    print(f"{policy}, K = {ARMS}, d = {DIM}, after {warmup} rewarded decisions; decisions "
          f"per second in-process (median of {blocks} blocks of {decisions})\n")
    print("| workload | with propensities | without | ratio |")
    print("|---|---:|---:|---:|")
    for label in workloads:
        with_ = statistics.median(results[(label, "with")])
        without = statistics.median(results[(label, "without")])
        print(f"| {label} | {with_:.0f} | {without:.0f} | {with_ / without:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--decisions", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=1000,
                        help="rewarded decisions before timing (at least K: every arm pulled)")
    parser.add_argument("--policy", default="linreboot", choices=POLICIES)
    args = parser.parse_args()
    asyncio.run(run(args.blocks, args.decisions, args.warmup, args.policy))


if __name__ == "__main__":
    main()
