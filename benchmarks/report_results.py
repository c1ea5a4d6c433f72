"""Merge simulate result files into the tables and figures of RESULTS.md.

Usage::

    python -m benchmarks.report_results results/paper results/reference results/observed \
        --out docs
"""

from __future__ import annotations

import argparse
from pathlib import Path

from loadtest.plots import regret_grid
from loadtest.results import Curve, final_regret_table, read_curves

PAPER = ("linreboot", "lints-g", "lints-ig", "lingiro", "linphe", "linucb")
ZOOM = ("linreboot", "lints-g", "lints-ig", "linucb", "greedy", "linucb-const")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="simulate output directories")
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args()
    curves: list[Curve] = [c for d in args.dirs for c in read_curves(d / "results.csv")]
    paper = [c for c in curves if c.label in PAPER]
    zoom = [c for c in curves if c.label in ZOOM]
    regret_grid(paper, args.out / "figure1.png",
                "Figure 1 reproduced: cumulative regret, 100 repetitions (±1 s.e.)")
    regret_grid(zoom, args.out / "figure1-zoom.png",
                "Without LinGIRO and LinPHE, with the reference rows greedy and LinUCB (α = 1)")
    print(final_regret_table(curves))


if __name__ == "__main__":
    main()
