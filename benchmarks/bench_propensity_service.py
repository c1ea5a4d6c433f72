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

Rewards come from the paper's worlds (``loadtest.environments``), so some
arms are better than others. Workloads: *stochastic, choose only* (fixed
features: a propensity per arm and statistics version), *stochastic, choose + reward* (each decision
rewarded before the next: every decision sees new statistics, the worst
case), and *covariates, choose + reward* (a fresh context per decision).
Each block makes ``--decisions`` decisions of each workload with, then
without (or the other way round, in turn); the table gives the median over
blocks of decisions per second and of the block's ratio with / without.
HTTP, which this leaves out, costs the same with or without, so over HTTP
the ratio is nearer 1 than here.
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

from loadtest.environments import Environment, make_spec
from loadtest.server import free_port
from policies import POLICIES, Setting
from policies.config import PolicyName
from service.domain import ArmSpec, ChooseRequest, ExperimentSpec
from service.embedded import EmbeddedRedis
from service.experiments import ExperimentService
from service.settings import Settings
from service.views import View

ARMS, DIM = 100, 20


async def _constant(self: View, ready: object, position: int) -> float:
    return 1.0


def _world(setting: Setting) -> Environment:
    """The paper's world for ``setting`` (K = 100, d = 20): some arms are better than others."""
    return Environment(make_spec(setting, DIM, n_arms=ARMS), [np.random.default_rng(1)])


def _spec(name: str, world: Environment, policy: PolicyName) -> ExperimentSpec:
    setting = world.spec.setting
    features = world.contexts()[0] if setting == "stochastic" else None
    arms = tuple(ArmSpec(f"a{i}", None if features is None else tuple(features[i]))
                 for i in range(ARMS))
    # LinReBoot with the paper's spread, as BENCHMARKS.md measured it (the service's
    # default is pooled).
    hyper: dict[str, float | str] = {"spread": "paper"} if policy == "linreboot" else {}
    return ExperimentSpec(id=name, setting=setting, dim=DIM, arms=arms, policy=policy,
                          log_max_entries=10_000, hyperparameters=hyper)


async def _workload(service: ExperimentService, name: str, world: Environment, reward: bool,
                    decisions: int) -> float:
    """Decisions per second of one block; rewards drawn from the world."""
    start = time.perf_counter()
    for _ in range(decisions):
        contexts = world.contexts()  # (1, K, d)
        context = None if world.spec.setting == "stochastic" else tuple(contexts[0, 0])
        decision = await service.choose(name, ChooseRequest(context=context))
        if reward:
            arm = np.array([int(decision.arm_id[1:])])
            value = float(world.rewards(contexts, arm)[0])
            await service.reward(name, [(decision.decision_id, value)])
    return decisions / (time.perf_counter() - start)


async def run(blocks: int, decisions: int, warmup: int, policy: PolicyName) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        embedded = EmbeddedRedis(Path(tmp), port=free_port()).start()
        try:
            service = await ExperimentService.open(Settings(redis_url=embedded.url))
            worlds = {"s": _world("stochastic"), "c": _world("covariates")}
            workloads: dict[str, tuple[str, bool]] = {
                "stochastic, choose only": ("s", False),
                "stochastic, choose + reward": ("s", True),
                "covariates, choose + reward": ("c", True),
            }
            for name, world in worlds.items():
                await service.create(_spec(name, world, policy))
                await _workload(service, name, world, True, warmup)
            results: dict[tuple[str, str], list[float]] = {}
            variants = [("with", View.propensity), ("without", _constant)]
            for block in range(blocks):
                for label, (name, reward) in workloads.items():
                    # Each workload's two variants back to back, in turn first (ABBA):
                    # what the machine does meanwhile weighs on both alike.
                    for variant, method in variants[:: 1 if block % 2 == 0 else -1]:
                        View.propensity = method  # type: ignore[method-assign]
                        rate = await _workload(service, name, worlds[name], reward, decisions)
                        results.setdefault((label, variant), []).append(rate)
            View.propensity = variants[0][1]  # type: ignore[method-assign]
            await service.close()
        finally:
            embedded.stop()
    print(f"{policy}, K = {ARMS}, d = {DIM}, after {warmup} rewarded decisions; decisions "
          f"per second in-process (median of {blocks} blocks of {decisions})\n")
    print("| workload | with propensities | without | ratio |")
    print("|---|---:|---:|---:|")
    for label in workloads:
        with_, without = results[(label, "with")], results[(label, "without")]
        ratio = statistics.median(a / b for a, b in zip(with_, without, strict=True))
        print(f"| {label} | {statistics.median(with_):.0f} | {statistics.median(without):.0f} "
              f"| {ratio:.2f} |")


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
