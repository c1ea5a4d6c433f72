"""CPU time of a decision's propensity next to the prepare and draw it goes with, in-process.

Usage::

    python -m benchmarks.bench_propensity [--rounds 1000 10000] [--arms 100] [--dim 20]
                                          [--policies linreboot ...] [--settings ...]

For each policy and setting, plays the paper's world (``loadtest.environments``,
K arms, dimension d, one seeded repetition) for ``rounds`` rounds, then, on
fresh contexts, times what the service does per decision: ``prepare`` (once
per statistics and contexts), ``draw``, and the propensity of the drawn arm
(``policies.propensity.propensities(ready, [arm], accuracy=SERVICE)``,
as the service asks for it; "all arms" at the default accuracy), which the service
computes once per prepared state and arm; the function itself keeps
nothing, so every call here computes afresh), as process CPU time per call:
the least of ``--repeats`` batches (the machine is shared: the least is the
cost, the rest is other processes). The arms are those of 20 draws, in turn.
"all arms" is the propensity of every arm at once.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import time
from collections.abc import Callable
from itertools import cycle
from typing import Any

import numpy as np

from loadtest.environments import Environment, make_spec
from policies import (
    SETTINGS,
    Ready,
    choose,
    draw,
    init_state,
    paper_config,
    prepare,
    update,
)
from policies.config import PolicyName, Setting
from policies.propensity import SERVICE, propensities


def cpu_us(call: Callable[[], object], calls: int, repeats: int) -> float:
    """Least process CPU time per call over ``repeats`` batches of ``calls``, in µs."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            call()
        best = min(best, (time.process_time() - start) / calls)
    return best * 1e6


def played(policy: PolicyName, setting: Setting, arms: int, dim: int, rounds: int,
           **hyperparameters: Any) -> tuple[Ready, Callable[[], Ready], np.random.Generator]:
    """The prepared decision after ``rounds`` rounds, and a function that prepares it again
    (the paper's configuration, with ``hyperparameters`` changed)."""
    config = paper_config(policy, setting, dim, **hyperparameters)
    rng = np.random.default_rng(0)
    env = Environment(make_spec(setting, dim, n_arms=arms), [np.random.default_rng(1)])
    state = init_state(config, arms)
    for _ in range(rounds):
        contexts = env.contexts()
        chosen = choose(config, state, contexts, [rng]).arms
        rewards = env.rewards(contexts, chosen)
        update(config, state, chosen, contexts[np.arange(1), chosen], rewards)
    contexts = env.contexts()
    return prepare(config, state, contexts), lambda: prepare(config, state, contexts), rng


def measure(policy: PolicyName, setting: Setting, arms: int, dim: int, rounds: int,
            repeats: int) -> dict[str, float]:
    ready, again, rng = played(policy, setting, arms, dim, rounds)
    drawn = [np.array([int(draw(ready, [rng]).arms[0])]) for _ in range(20)]
    values = propensities(ready)[0]
    heavy = ready.config.shared and policy in ("lints-g", "lints-ig", "linphe", "lingiro")
    calls = 2 if heavy else 50
    arm = cycle(drawn)
    return {
        "prepare": cpu_us(again, calls, repeats),
        "draw": cpu_us(lambda: draw(ready, [rng]), calls, repeats),
        "propensity": cpu_us(lambda: propensities(ready, next(arm), accuracy=SERVICE),
                             calls, repeats),
        "all": cpu_us(lambda: propensities(ready), max(1, calls // 10), repeats),
        "contenders": float(np.sum(values > 1e-6)),
        "top": float(values.max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", nargs="+", default=["linreboot"])
    parser.add_argument("--settings", nargs="+", default=["stochastic", "covariates"],
                        choices=SETTINGS)
    parser.add_argument("--rounds", nargs="+", type=int, default=[1000, 10000])
    parser.add_argument("--arms", type=int, default=100)
    parser.add_argument("--dim", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"K = {args.arms}, d = {args.dim}; process CPU µs per call (least of "
          f"{args.repeats} batches)\n")
    print("| policy | setting | rounds played | prepare | draw | propensity (drawn arm) "
          "| propensity / prepare | all arms | arms with p > 1e-6 | largest p |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for policy in args.policies:
        for setting in args.settings:
            for rounds in args.rounds:
                m = measure(policy, setting, args.arms, args.dim, rounds, args.repeats)
                print(f"| {policy} | {setting} | {rounds} | {m['prepare']:.0f} | "
                      f"{m['draw']:.0f} | {m['propensity']:.0f} | "
                      f"{m['propensity'] / m['prepare']:.2f} | {m['all'] / 1000:.1f} ms | "
                      f"{m['contenders']:.0f} | {m['top']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
