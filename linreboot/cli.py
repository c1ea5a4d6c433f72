"""The ``linreboot`` command line: simulate, serve, replay, loadtest, demo."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from policies import PAPER_POLICIES, POLICIES, SETTINGS

if TYPE_CHECKING:
    from loadtest.results import Curve
    from loadtest.simulate import Cell

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


def _add_grid_args(p: argparse.ArgumentParser, *, settings: Sequence[str], dims: Sequence[int],
                   policies: Sequence[str], reps: int, horizon: int) -> None:
    p.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(settings))
    p.add_argument("--dims", nargs="+", type=int, default=list(dims))
    p.add_argument("--policies", nargs="+", choices=POLICIES, default=list(policies))
    p.add_argument("--reps", type=int, default=reps, help=f"repetitions per cell (default {reps})")
    p.add_argument("--horizon", type=int, default=horizon, help=f"rounds (default {horizon})")
    p.add_argument("--seed", type=int, default=0)


def _add_http_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None,
                   help="a running service (default: start one on embedded Redis)")
    p.add_argument("--admin-token", default=None, help="admin token of the service at --url")
    p.add_argument("--workers", type=int, default=1, help="uvicorn workers of a started service")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight at most")
    p.add_argument("--max-seconds", type=float, default=3600.0, help="time bound per cell")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --url (replays send many requests)")


def _add_replay(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="replay the paper's environments over HTTP and compute regret",
        description="One experiment per repetition on the service; regret from the "
        "environment's true means. --compare also runs the same cells in-process.",
    )
    _add_grid_args(p, settings=("stochastic",), dims=(5,), policies=("linreboot",),
                   reps=20, horizon=2_000)
    _add_http_args(p)
    p.add_argument("--compare", action="store_true",
                   help="also run in-process with the service's seeding and compare")
    p.add_argument("--out", type=Path, default=Path("results/replay"))


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="the main job: start the service, replay the stochastic environment over HTTP, "
        "print the regret table and write the plot",
    )
    _add_grid_args(p, settings=("stochastic",), dims=(5,),
                   policies=(*PAPER_POLICIES, "greedy", "linucb-const"), reps=5, horizon=500)
    _add_http_args(p)
    p.add_argument("--out", type=Path, default=Path("results/demo"))


def _cells(args: argparse.Namespace) -> list[Cell]:
    from loadtest.simulate import grid

    for value in (args.reps, args.horizon):
        if value < 1:
            raise SystemExit("--reps and --horizon must be positive")
    return grid(args.settings, args.dims, args.policies)


def _replay(args: argparse.Namespace) -> int:
    from loadtest.http_driver import Limits, require_loopback
    from loadtest.replay import compare, http_curves, service, write_comparison

    cells = _cells(args)
    limits = Limits(concurrency=args.concurrency, max_seconds=args.max_seconds)
    if args.url:
        require_loopback(args.url, args.allow_remote)
    with service(args.url, args.admin_token, args.workers) as (url, token):
        if args.compare:
            rows = compare(url, token, cells, args.reps, args.horizon, args.seed, limits)
            print(write_comparison(rows, args.out))
        else:
            curves = http_curves(url, token, cells, args.reps, args.horizon, args.seed, limits)
            _write_http(curves, args.out, f"HTTP replay: {args.reps} repetitions x "
                        f"{args.horizon} rounds, seed {args.seed}")
    print(f"results in {args.out}/")
    return 0


def _demo(args: argparse.Namespace) -> int:
    import time

    start = time.perf_counter()
    _replay(argparse.Namespace(**vars(args), compare=False))
    print(f"demo finished in {time.perf_counter() - start:.0f} s; plot: {args.out / 'regret.png'}")
    return 0


def _write_http(curves: list[Curve], out: Path, title: str) -> None:
    from loadtest.plots import regret_grid
    from loadtest.results import final_regret_table, write_curves

    write_curves(out / "results.csv", curves)
    regret_grid(curves, out / "regret.png", title)
    table = final_regret_table(curves)
    (out / "tables.md").write_text(f"# {title}\n\n{table}\n")
    print(f"\n{title}\nFinal cumulative regret (mean ± s.e.; best in bold)\n\n{table}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="linreboot",
        description="LinReBoot recommendation service: simulator, server and load replays.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_simulate(sub)
    _add_serve(sub)
    _add_replay(sub)
    _add_demo(sub)
    return parser


_COMMANDS = {
    "simulate": _simulate, "serve": _serve, "replay": _replay, "demo": _demo,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return _COMMANDS[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
