"""A decision's propensity in the service: the single-experiment path against the general one.

Usage::

    python -m benchmarks.bench_propensity_one [--rounds 1000] [--repeats 9]

``policies.propensity`` computes the propensity of one experiment's drawn arm
(B = 1, independent normal indices, no point mass) by :func:`_one_normal`, the
smooth rule on K values with a third of the array operations of the general
path (the same numbers). This plays the paper's worlds (``loadtest.environments``,
one seeded repetition) for ``--rounds`` rounds with the service's default and
the paper's LinReBoot, then times ``propensities(ready, [arm], accuracy=SERVICE)``
for 20 drawn arms in turn, with the single path and with it turned off (the
general path, as before issue 26), in alternate batches of the same process:
least process CPU time per call over ``--repeats`` batches, and the ratio.
It also checks that both give the same values, bit for bit.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from collections.abc import Iterator
from itertools import cycle
from typing import Any
from unittest import mock

import numpy as np
from numpy.typing import NDArray

import policies.propensity as propensity
from benchmarks.bench_propensity import cpu_us, played
from policies import Ready, draw
from policies.config import Setting
from policies.propensity import SERVICE, propensities

CASES: tuple[tuple[str, Setting, int, dict[str, object]], ...] = (
    ("default (pooled)", "stochastic", 100, {"spread": "pooled"}),
    ("default (pooled)", "contextual", 100, {"spread": "pooled"}),
    ("default (pooled)", "covariates", 10, {"spread": "pooled"}),
    ("default (pooled)", "covariates", 100, {"spread": "pooled"}),
    ("paper", "stochastic", 100, {}),
    ("paper", "covariates", 10, {}),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    print(f"d = {args.dim}, {args.rounds} rounds played; process CPU µs per call (least of "
          f"{args.repeats} batches of 200)\n")
    print("| LinReBoot | setting | K | general path | single path | ratio | same bits |")
    print("|---|---|---:|---:|---:|---:|---|")
    for label, setting, arms, overrides in CASES:
        ready, _, rng = played("linreboot", setting, arms, args.dim, args.rounds, **overrides)
        drawn = [np.array([int(draw(ready, [rng]).arms[0])]) for _ in range(20)]
        arm = cycle(drawn)

        def call(ready: Ready = ready, arm: Iterator[NDArray[np.int64]] = arm
                 ) -> NDArray[np.floating[Any]]:
            return propensities(ready, next(arm), accuracy=SERVICE)

        fast = [call() for _ in range(20)]
        with mock.patch.object(propensity, "_one_normal", lambda *a: None):
            general = [call() for _ in range(20)]
        same = all(np.array_equal(a, b) for a, b in zip(fast, general, strict=True))
        times = {"general": np.inf, "single": np.inf}
        for _ in range(args.repeats):  # alternate, so that both meet the same load
            with mock.patch.object(propensity, "_one_normal", lambda *a: None):
                times["general"] = min(times["general"], cpu_us(call, 200, 1))
            times["single"] = min(times["single"], cpu_us(call, 200, 1))
        print(f"| {label} | {setting} | {arms} | {times['general']:.0f} | "
              f"{times['single']:.0f} | {times['single'] / times['general']:.2f} | "
              f"{'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
