"""The ``linreboot`` command line: simulate, serve, replay, loadtest, demo."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from policies import PAPER_POLICIES, POLICIES, SETTINGS

_PAPER_DIMS = (5, 10, 20)


def _add_simulate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay the paper's environments in-process (batched) and plot regret",
        description="Reproduce the paper's Figure 1 and runtime table in-process.",
    )
    p.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    p.add_argument("--dims", nargs="+", type=int, default=list(_PAPER_DIMS))
    p.add_argument("--policies", nargs="+", choices=POLICIES, default=list(PAPER_POLICIES))
    p.add_argument("--reps", type=int, default=100, help="repetitions per cell (default 100)")
    p.add_argument("--horizon", type=int, default=10_000, help="rounds (default 10000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--sigma-omega", nargs="+", type=float, default=None,
        help="LinReBoot sigma_omega values to sweep (default: the paper's per setting and d)",
    )
    p.add_argument("--residuals", choices=("current", "observed"), default=None,
                   help="LinReBoot residuals (default: current, as Algorithm 2)")
    p.add_argument("--reading", choices=("authors", "literal"), default="authors",
                   help="environment reading of the appendix (default: the authors' code)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--time-single-runs", action="store_true",
                   help="also time one unbatched run per cell (runtime table)")
    p.add_argument("--out", type=Path, default=Path("results/simulate"))


def _simulate(args: argparse.Namespace) -> int:
    from loadtest.experiment import run_grid, write_outputs
    from loadtest.simulate import grid

    for value in (args.reps, args.horizon, args.jobs):
        if value < 1:
            raise SystemExit("--reps, --horizon and --jobs must be positive")
    if args.reps < 2:
        print("note: with one repetition the standard error is reported as 0", file=sys.stderr)
    overrides: tuple[tuple[str, object], ...] = (
        (("residuals", args.residuals),) if args.residuals else ()
    )
    cells = grid(args.settings, args.dims, args.policies, args.sigma_omega, args.reading, overrides)
    run = run_grid(cells, args.reps, args.horizon, args.seed, args.jobs,
                   time_single=args.time_single_runs)
    title = (f"In-process: {args.reps} repetitions x {args.horizon} rounds, "
             f"{args.reading} reading, seed {args.seed}")
    paths = write_outputs(run, args.out, title)
    print(paths["tables"].read_text())
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="run the HTTP service (uvicorn); embedded Redis unless REDIS_URL is set",
        description="Run the decision service. Settings come from LINREBOOT_* variables "
        "(see README); flags override them.",
    )
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default LINREBOOT_PORT or 8000)")
    p.add_argument("--workers", type=int, default=None, help="uvicorn worker processes")
    p.add_argument("--data-dir", type=Path, default=None, help="embedded Redis data directory")


def _serve(args: argparse.Namespace) -> int:
    from app.server import serve

    return serve(host=args.host, port=args.port, workers=args.workers, data_dir=args.data_dir)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="linreboot",
        description="LinReBoot recommendation service: simulator, server and load replays.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_simulate(sub)
    _add_serve(sub)
    return parser


_COMMANDS = {"simulate": _simulate, "serve": _serve}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return _COMMANDS[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
