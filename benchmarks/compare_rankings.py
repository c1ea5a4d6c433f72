"""Rankings against the baselines (issue 28's acceptance): k-slot semi-bandits, paired.

Plays each of the paper's settings with rankings of ``--k`` arms (every slot's reward
seen; regret against the best k-list; ``loadtest.simulate.Cell(slots=k)``): the
service's default LinReBoot (``spread=pooled``), the paper's LinReBoot, top-k LinUCB
(alpha = 1) and LinTS-G, none with a forced first pass (every row alike), in the same
worlds (the same contexts and noise for every row of a setting). Prints each row's final
regret (mean +- s.e. over the repetitions) and the default minus the row, paired by
repetition (mean +- paired s.e.): the default passes a row when its regret is at most
the row's plus one paired s.e.

    python -m benchmarks.compare_rankings --k 5 --dims 5 20 --reps 20 --horizon 3000 --seed 1
"""

from __future__ import annotations

import argparse
import math
import time

from loadtest.simulate import Cell, play_together
from policies import Setting

SETTINGS: tuple[Setting, ...] = ("stochastic", "contextual", "covariates")


def rows(setting: Setting, dim: int, k: int) -> list[Cell]:
    return [Cell(setting, dim, "linreboot", overrides=(("spread", "pooled"),), slots=k),
            Cell(setting, dim, "linreboot", slots=k),
            Cell(setting, dim, "linucb", overrides=(("ucb_alpha", 1.0),), slots=k),
            Cell(setting, dim, "lints-g", slots=k)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--dims", type=int, nargs="+", default=[5])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--horizon", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(f"rankings of k = {args.k}, {args.reps} repetitions x {args.horizon} rounds, "
          f"seed {args.seed}, no first pass\n")
    print("| setting | d | row | final regret | default - row (paired) | default passes |")
    print("|---|---|---|---:|---:|---|")
    for dim in args.dims:
        for setting in SETTINGS:
            cells = rows(setting, dim, args.k)
            start = time.perf_counter()
            final = [p.cumulative[:, -1] for p in play_together(cells, args.reps, args.horizon,
                                                                 args.seed)]
            for cell, regret in zip(cells, final, strict=True):
                diff = final[0] - regret
                se = float(diff.std(ddof=1) / math.sqrt(diff.size)) if diff.any() else 0.0
                passes = "" if cell is cells[0] else (
                    "yes" if diff.mean() <= se else "**no**")
                print(f"| {setting} | {dim} | {cell.label} | {regret.mean():.1f} ± "
                      f"{regret.std(ddof=1) / math.sqrt(regret.size):.1f} | "
                      f"{diff.mean():+.1f} ± {se:.1f} | {passes} |")
            print(f"<!-- {setting} d={dim}: {time.perf_counter() - start:.0f} s -->")


if __name__ == "__main__":
    main()
