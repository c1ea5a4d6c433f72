"""What a ranking costs the policy math, against a decision of one arm in the same process.

Usage::

    python -m benchmarks.bench_ranking [--repeats 200]

For K = 100, d = 20 (the service benchmark's world), statistics after 3,000 rewards:
``policies.ranking.rank`` against ``policies.draw`` (the same first draw), and the
slots' propensities (``position_propensities``, positions 2..k as the service asks
them) against the first position's (``policies.propensity.propensities``), both at the
service's accuracy (``SERVICE``), at k = 3 and 10; and ``placement_table`` (every arm
at every position below k: what a worker keeps from a statistics version's second
ranking on). Median µs per call over ``--repeats`` calls,
each pair timed in turn (the machine's drift cancels in the ratio).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import numpy as np

from policies import Ready, draw, paper_config, prepare
from policies.propensity import SERVICE, propensities
from policies.ranking import Ranking, placement_table, position_propensities, rank
from policies.state import apply_sequence, init_state

K, D, OBSERVED = 100, 20, 3000
CASES: tuple[tuple[str, str, dict[str, object]], ...] = (
    ("linreboot", "stochastic", {"spread": "pooled"}),
    ("linreboot", "covariates", {"spread": "pooled"}),
    ("lints-g", "covariates", {}), ("lints-g", "stochastic", {}))


def _ready(name: str, setting: str, extra: dict[str, object]) -> Ready:
    config = paper_config(name, setting, D, **extra)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    state = init_state(config, K)
    arms = rng.integers(0, K, size=OBSERVED)
    x = rng.normal(size=(OBSERVED, D)) / 2
    apply_sequence(config, state, arms, x,
                   x @ rng.normal(size=D) / 4 + rng.normal(size=OBSERVED) / 4)
    return prepare(config, state, rng.normal(size=(1, K, D)) / 2)


def _median_us(calls: list[Callable[[], object]], repeats: int) -> list[float]:
    """Each call's median time, the calls timed in turn."""
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for own, call in zip(times, calls, strict=True):
            start = time.perf_counter()
            call()
            own.append(time.perf_counter() - start)
    return [statistics.median(t) * 1e6 for t in times]


def _row(ready: Ready, k: int, repeats: int) -> list[float]:
    """draw, rank, the first position's propensity, the slots' and every arm's at every
    position below k (the table a worker keeps while the statistics stay the same) (µs)."""
    rngs = [np.random.default_rng(1)]
    ranking: Ranking = rank(ready, rngs, k)
    first = ranking.arms[:, 0]
    return _median_us([
        functools.partial(draw, ready, rngs), functools.partial(rank, ready, rngs, k),
        functools.partial(propensities, ready, first, accuracy=SERVICE),
        functools.partial(position_propensities, ready, ranking, draws=1024,
                          accuracy=SERVICE),
        functools.partial(placement_table, ready, k, accuracy=SERVICE)], repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    print("| policy, setting | k | draw µs | rank µs | ratio | first position's propensity "
          "µs | slots 2..k µs | ratio | table µs (none: estimated) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, setting, extra in CASES:
        ready = _ready(name, setting, extra)
        # a shared model's slots are estimated from rankings drawn again: a few calls
        repeats = args.repeats if name == "linreboot" or setting == "covariates" else 5
        for k in (3, 10):
            drawn, ranked, single, slots, table = _row(ready, k, repeats)
            none = "" if placement_table(ready, k, accuracy=SERVICE) is not None else " (none)"
            print(f"| {name}{'' if not extra else ' (pooled)'}, {setting} | {k} | "
                  f"{drawn:.0f} | {ranked:.0f} | {ranked / drawn:.1f} | {single:.0f} | "
                  f"{slots:.0f} | {slots / single:.1f} | {table:.0f}{none} |", flush=True)


if __name__ == "__main__":
    main()
