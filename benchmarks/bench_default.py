"""LinReBoot with ``spread="pooled"`` against the paper's LinReBoot and the other rows.

Two tables (RESULTS.md, "A LinReBoot that needs no tuning"):

* ``--table synthetic``: the paper's three settings x d, in-process and
  batched (``loadtest.simulate.play``: every policy of a cell sees the same
  worlds); final cumulative regret, mean ± standard error, and the standard
  deviation across repetitions (the spread);
* ``--table data``: supervised-to-bandit reductions of data sets that ship with
  scikit-learn (``loadtest.classification``; needs the ``data`` extra):
  mistakes, mean ± standard error over the seeds.

Policies are named as ``linreboot simulate`` names them, plus ``pooled``
(``linreboot`` with ``spread="pooled"``) and ``pooled:S`` (with
``sigma_omega = S``). Cells run in ``--jobs`` processes. Usage::

    nice -n 10 .venv/bin/python -m benchmarks.bench_default --table synthetic \\
        --reps 20 --horizon 3000 --jobs 2
    nice -n 10 .venv/bin/python -m benchmarks.bench_default --table data \\
        --datasets digits wine --reps 10 --horizon 5000 --jobs 2
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from loadtest.classification import play_classification, sklearn_dataset
from loadtest.environments import split_rngs
from loadtest.simulate import Cell, play
from policies import PolicyName, paper_config

DEFAULT_POLICIES = ("linreboot", "pooled", "greedy", "linucb-const", "lints-g", "lints-ig",
                    "linucb")


def _parse(name: str) -> tuple[PolicyName, tuple[tuple[str, object], ...]]:
    policy, _, sigma = name.partition(":")
    if policy != "pooled":
        return policy, ()  # type: ignore[return-value]
    extra: tuple[tuple[str, object], ...] = (("sigma_omega", float(sigma)),) if sigma else ()
    return "linreboot", (("spread", "pooled"), *extra)


def synthetic_cell(job: tuple[str, int, str, int, int, int]) -> list[float]:
    """Final regret of every repetition of one (setting, d, policy) cell."""
    setting, dim, name, reps, horizon, seed = job
    policy, overrides = _parse(name)
    cell = Cell(setting, dim, policy, overrides=overrides)  # type: ignore[arg-type]
    return [float(v) for v in play(cell, reps, horizon, seed).cumulative[:, -1]]


def data_cell(job: tuple[str, str, int, int, int]) -> list[float]:
    """Mistakes of every seed of one (data set, policy) cell."""
    dataset, name, reps, horizon, seed = job
    data = sklearn_dataset(dataset)
    policy, overrides = _parse(name)
    config = paper_config(policy, "covariates", data.dim, **dict(overrides))
    return [float(v) for v in play_classification(config, data, split_rngs(seed, reps), horizon)]


def _cell_text(values: Sequence[float]) -> str:
    v = np.asarray(values)
    sd = float(v.std(ddof=1))
    return f"{v.mean():.1f} ± {sd / math.sqrt(v.size):.1f} (sd {sd:.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", choices=("synthetic", "data"), default="synthetic")
    parser.add_argument("--settings", nargs="+", default=["stochastic", "contextual",
                                                          "covariates"])
    parser.add_argument("--dims", nargs="+", type=int, default=[5, 10, 20])
    parser.add_argument("--datasets", nargs="+", default=["digits", "wine"])
    parser.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--horizon", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--paired", default="pooled",
                        help="also print this policy's difference to every other, seed by "
                        "seed (every policy of a row sees the same worlds)")
    args = parser.parse_args()
    if args.table == "synthetic":
        rows = [(s, d) for s in args.settings for d in args.dims]
        jobs = [(s, d, p, args.reps, args.horizon, args.seed) for s, d in rows
                for p in args.policies]
        fn = synthetic_cell
        head = "| setting | d | "
    else:
        rows = [(name, 0) for name in args.datasets]
        jobs = [(name, p, args.reps, args.horizon, args.seed) for name, _ in rows  # type: ignore[misc]
                for p in args.policies]
        fn = data_cell  # type: ignore[assignment]
        head = "| data set | | "
    print(f"{args.reps} repetitions x {args.horizon} rounds, seed {args.seed}; mean ± s.e. "
          "(sd across repetitions)")
    print(head + " | ".join(args.policies) + " |")
    print("|---" * (len(args.policies) + 2) + "|")
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(fn, jobs))
    per_row = len(args.policies)
    for i, (a, b) in enumerate(rows):
        cells = [_cell_text(r) for r in results[i * per_row:(i + 1) * per_row]]
        print(f"| {a} | {b or ''} | " + " | ".join(cells) + " |", flush=True)
    if args.paired not in args.policies:
        return
    own = args.policies.index(args.paired)
    print(f"\n{args.paired} minus each policy, seed by seed: mean ± s.e. of the difference")
    print(head + " | ".join(args.policies) + " |")
    print("|---" * (len(args.policies) + 2) + "|")
    for i, (a, b) in enumerate(rows):
        block = [np.asarray(r) for r in results[i * per_row:(i + 1) * per_row]]
        cells = [_difference(block[own] - other) for other in block]
        print(f"| {a} | {b or ''} | " + " | ".join(cells) + " |", flush=True)


def _difference(values: np.ndarray) -> str:
    if not values.any():
        return "0"
    return f"{values.mean():+.1f} ± {values.std(ddof=1) / math.sqrt(values.size):.1f}"


if __name__ == "__main__":
    main()
