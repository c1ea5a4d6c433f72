"""Run time of one 10,000-round run, alone and amortised in a batch of 100.

Usage::

    python -m benchmarks.bench_policies [--settings ...] [--dims ...] [--policies ...]
        [--horizon 10000] [--batch 100] [--repeats 3]

For every cell: the wall time of a single run (B = 1) and of a batch of B
repetitions, in the same process, best of ``repeats``; the ratio between them
is what this machine's noise does not change much. The paper's own per-run
times (appendix, "Computational Cost") are printed alongside.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from loadtest.simulate import Cell, play
from policies import PAPER_POLICIES, SETTINGS

# Appendix table "Computational Cost": seconds per 10,000-round run.
PAPER_SECONDS = {
    ("stochastic", 5): dict(zip(PAPER_POLICIES, (3.2, 1.8, 2.2, 6.5, 4.0, 6.2), strict=True)),
    ("stochastic", 10): dict(zip(PAPER_POLICIES, (3.5, 2.1, 2.5, 10.3, 4.7, 6.6), strict=True)),
    ("stochastic", 20): dict(zip(PAPER_POLICIES, (4.8, 3.9, 3.8, 24.6, 5.6, 7.4), strict=True)),
    ("contextual", 5): dict(zip(PAPER_POLICIES, (3.3, 1.8, 2.2, 6.5, 4.0, 6.3), strict=True)),
    ("contextual", 10): dict(zip(PAPER_POLICIES, (3.5, 2.1, 2.5, 10.2, 4.7, 6.6), strict=True)),
    ("contextual", 20): dict(zip(PAPER_POLICIES, (3.8, 3.1, 3.6, 24.1, 5.2, 6.9), strict=True)),
    ("covariates", 5): dict(zip(PAPER_POLICIES, (1.4, 7.8, 12.9, 10.3, 5.2, 1.2), strict=True)),
    ("covariates", 10): dict(zip(PAPER_POLICIES, (1.5, 9.4, 14.1, 11.5, 5.9, 1.4), strict=True)),
    ("covariates", 20): dict(zip(PAPER_POLICIES, (1.6, 14.2, 18.9, 15.2, 7.4, 1.5), strict=True)),
}


def best_of(repeats: int, cell: Cell, reps: int, horizon: int) -> float:
    return min(play(cell, reps, horizon, seed=0).seconds for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", default=["stochastic"], choices=SETTINGS)
    parser.add_argument("--dims", nargs="+", type=int, default=[20])
    parser.add_argument("--policies", nargs="+", default=["linreboot"])
    parser.add_argument("--horizon", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| setting | d | policy | paper s/run | 1 run s | batch of "
          f"{args.batch}: s/run | batch speed-up | vs paper |")
    print("|---|---|---|---|---|---|---|---|")
    for setting in args.settings:
        for dim in args.dims:
            for policy in args.policies:
                cell = Cell(setting, dim, policy)
                alone = best_of(args.repeats, cell, 1, args.horizon)
                batched = best_of(args.repeats, cell, args.batch, args.horizon) / args.batch
                paper = PAPER_SECONDS.get((setting, dim), {}).get(policy)
                versus = f"{paper / batched:.0f}x" if paper else "–"
                print(f"| {setting} | {dim} | {policy} | {paper or '–'} | {alone:.2f} | "
                      f"{batched:.4f} | {alone / batched:.0f}x | {versus} |", flush=True)


if __name__ == "__main__":
    main()
