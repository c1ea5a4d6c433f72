"""The ``linreboot`` command line: simulate, serve, replay, loadtest, demo, export, evaluate."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from policies import PAPER_POLICIES, POLICIES, RANGES, SETTINGS
from service.errors import StartupError

if TYPE_CHECKING:
    from loadtest.results import Curve
    from loadtest.simulate import Cell

_PAPER_DIMS = (5, 10, 20)


class _Parser(argparse.ArgumentParser):
    """Reports a wrong argument in one line (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _add_simulate(sub: argparse._SubParsersAction[_Parser]) -> None:
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
    _add_spreads(p)
    _add_first_pass(p, "on", "the paper's reproduction: every algorithm pulls each arm once "
                    "first")
    p.add_argument(
        "--sigma-omega", nargs="+", type=float, default=None,
        help="LinReBoot sigma_omega values to sweep (default: the paper's per setting and d)",
    )
    p.add_argument("--residuals", choices=("current", "observed"), default=None,
                   help="LinReBoot residuals (default: current, as Algorithm 2)")
    p.add_argument("--reading", choices=("authors", "literal"), default="authors",
                   help="environment reading of the appendix (default: the authors' code)")
    p.add_argument("--discount", nargs="+", type=float, default=[1.0],
                   help="discount values to sweep, every policy once per value (default 1: "
                   "no forgetting; see policies.state)")
    p.add_argument("--switch-every", type=int, default=0, metavar="ROUNDS",
                   help="a drifting world: theta is drawn afresh every ROUNDS rounds "
                   "(default 0: never)")
    p.add_argument("--baselines", choices=("project", "authors"), default="project",
                   help="LinReBoot, LinTS-G, LinTS-IG, LinPHE, LinGIRO and LinUCB as this project "
                   "implements them (default) or as the paper's authors' code runs them "
                   "(policies.authors)")
    p.add_argument("--centres", choices=("per-repetition", "once"), default="per-repetition",
                   help="arm features / context centres drawn per repetition (default) or "
                   "once per cell, as the authors' contextual script does")
    _add_slots(p)
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
    bounds = RANGES["discount"]
    if not all(bounds.holds(value) for value in args.discount):
        raise SystemExit(f"--discount values must be from {bounds.low:g} to {bounds.high:g}")
    if args.switch_every < 0:
        raise SystemExit("--switch-every must be 0 (never) or a positive number of rounds")
    weights = _position_weights(args)
    if args.reps < 2:
        print("note: with one repetition the standard error is reported as 0", file=sys.stderr)
    overrides: tuple[tuple[str, object], ...] = (
        (("residuals", args.residuals),) if args.residuals else ()
    )
    if args.baselines == "authors" and args.discount != [1.0]:
        raise SystemExit("--baselines authors runs without forgetting: leave --discount at 1")
    cells = grid(args.settings, args.dims, args.policies, args.sigma_omega, args.reading, overrides,
                 discounts=args.discount, switch_every=args.switch_every,
                 baselines=args.baselines, centres=args.centres, spreads=args.spreads,
                 first_pass=args.first_pass == "on", slots=args.slots,
                 position_weights=weights)
    run = run_grid(cells, args.reps, args.horizon, args.seed, args.jobs,
                   time_single=args.time_single_runs)
    drift = f", theta switching every {args.switch_every} rounds" if args.switch_every else ""
    drift += ", the authors' baselines" if args.baselines == "authors" else ""
    drift += ", centres drawn once" if args.centres == "once" else ""
    drift += ", no first pass" if args.first_pass == "off" else ""
    title = (f"In-process: {args.reps} repetitions x {args.horizon} rounds, "
             f"{args.reading} reading{drift}, seed {args.seed}")
    paths = write_outputs(run, args.out, title)
    print(paths["tables"].read_text())
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _add_serve(sub: argparse._SubParsersAction[_Parser]) -> None:
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
                   policies: Sequence[str], reps: int, horizon: int,
                   spreads: Sequence[str] = ("paper",)) -> None:
    p.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(settings))
    p.add_argument("--dims", nargs="+", type=int, default=list(dims))
    p.add_argument("--policies", nargs="+", choices=POLICIES, default=list(policies))
    p.add_argument("--reps", type=int, default=reps, help=f"repetitions per cell (default {reps})")
    p.add_argument("--horizon", type=int, default=horizon, help=f"rounds (default {horizon})")
    p.add_argument("--seed", type=int, default=0)
    _add_spreads(p, spreads)
    _add_first_pass(p, "off", "every policy scores an arm never pulled from its prior, as "
                    "the service does")


def _add_slots(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slots", nargs="+", type=int, default=[1], metavar="K",
                   help="rankings of K arms per round, each slot's reward seen (a K-slot "
                   "semi-bandit; regret against the best K-list); several values also plot "
                   "regret against K (default 1: one arm per round)")
    p.add_argument("--position-weights", nargs="+", type=float, default=None, metavar="W",
                   help="with --slots: slot j's arm is examined with probability W_j "
                   "(w_1 >= w_2 >= ... in (0, 1]; beyond the list, the last), its reward "
                   "learnt as r / W_j (the service's position_weights)")


def _position_weights(args: argparse.Namespace) -> tuple[float, ...] | None:
    """--slots and --position-weights checked; the weights as a Cell takes them."""
    if any(k < 1 for k in args.slots):
        raise SystemExit("--slots values must be 1 or more")
    weights = args.position_weights
    if weights is not None and not (
            all(0.0 < w <= 1.0 for w in weights)
            and all(b <= a for a, b in itertools.pairwise(weights))):
        raise SystemExit("--position-weights must be in (0, 1], none above the one before")
    return None if weights is None else tuple(weights)


def _add_spreads(p: argparse.ArgumentParser, default: Sequence[str] = ("paper",)) -> None:
    p.add_argument("--spreads", nargs="+", choices=("paper", "pooled"), default=list(default),
                   help="LinReBoot once per spread rule: paper (Section 3.3) and/or pooled "
                   f"(no tuning; docs/API.md); default {' '.join(default)}")


def _add_first_pass(p: argparse.ArgumentParser, default: str, why: str) -> None:
    p.add_argument("--first-pass", choices=("on", "off"), default=default,
                   help="on: every policy pulls each arm once before any competes (the "
                   "paper's first K rounds); off: none does. The same for every policy of "
                   f"the run (default {default}: {why})")


def _add_http_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None,
                   help="a running service (default: start one on embedded Redis)")
    p.add_argument("--admin-token", default=None, help="admin token of the service at --url")
    p.add_argument("--workers", type=int, default=1, help="uvicorn workers of a started service")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight at most")
    p.add_argument("--max-seconds", type=float, default=3600.0, help="time bound per cell")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --url (replays send many requests)")


def _add_replay(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "replay",
        help="replay the paper's environments over HTTP and compute regret",
        description="One experiment per repetition on the service; regret from the "
        "environment's true means. --compare also runs the same cells in-process.",
    )
    _add_grid_args(p, settings=("stochastic",), dims=(5,), policies=("linreboot",),
                   reps=20, horizon=2_000)
    _add_slots(p)
    _add_http_args(p)
    p.add_argument("--compare", action="store_true",
                   help="also run in-process with the service's seeding and compare")
    p.add_argument("--out", type=Path, default=Path("results/replay"))


def _add_demo(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "demo",
        help="the main job: start the service, replay the stochastic environment over HTTP, "
        "print the regret table and write the plot",
    )
    _add_grid_args(p, settings=("stochastic",), dims=(5,),
                   policies=(*PAPER_POLICIES, "greedy", "linucb-const"), reps=4, horizon=400,
                   spreads=("paper", "pooled"))
    _add_slots(p)
    _add_http_args(p)
    p.add_argument("--out", type=Path, default=Path("results/demo"))


def _cells(args: argparse.Namespace) -> list[Cell]:
    from loadtest.simulate import grid

    for value in (args.reps, args.horizon):
        if value < 1:
            raise SystemExit("--reps and --horizon must be positive")
    return grid(args.settings, args.dims, args.policies, spreads=args.spreads,
                first_pass=args.first_pass == "on", slots=args.slots,
                position_weights=_position_weights(args))


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


def _add_loadtest(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "loadtest",
        help="load replay: drive many experiments with delayed, dropped and duplicated "
        "rewards; report throughput and latency; check the service's counters",
        description="Create experiments in one of the paper's settings, drive /choose in an "
        "open loop (--rate) or a closed loop (--concurrency) for a bounded time, send each "
        "reward after a random delay (some dropped, some twice), then check every "
        "experiment's counters against what was sent. Exit code 1 if the check fails.",
    )
    p.add_argument("--url", default=None,
                   help="a running service (default: start one on embedded Redis)")
    p.add_argument("--admin-token", default=None, help="admin token of the service at --url")
    p.add_argument("--workers", type=int, default=1, help="uvicorn workers of a started service")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback --url (a load test sends many requests)")
    p.add_argument("--experiments", type=int, default=20, help="experiments (default 20)")
    p.add_argument("--setting", choices=SETTINGS, default="stochastic")
    p.add_argument("--dim", type=int, default=20, help="context dimension d (default 20)")
    p.add_argument("--arms", type=int, default=None,
                   help="arms K (default: the paper's, 100 or 10 for covariates)")
    p.add_argument("--policy", choices=POLICIES, default="linreboot")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, default=None,
                      help="open loop: Poisson arrivals of /choose per second "
                      "(default 100 if --concurrency is not given)")
    load.add_argument("--concurrency", type=int, default=None,
                      help="closed loop: /choose requests in flight")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load (default 30)")
    p.add_argument("--max-requests", type=int, default=100_000,
                   help="at most this many /choose requests (default 100000)")
    p.add_argument("--reward-delay-mean", type=float, default=0.2,
                   help="mean exponential delay before a reward is sent, s (default 0.2)")
    p.add_argument("--drop-fraction", type=float, default=0.1,
                   help="fraction of rewards never sent (default 0.1)")
    p.add_argument("--duplicate-fraction", type=float, default=0.05,
                   help="fraction of rewards sent twice (default 0.05)")
    p.add_argument("--duplicate-delay-mean", type=float, default=0.05,
                   help="mean exponential delay before the second send, s (default 0.05)")
    p.add_argument("--drain-seconds", type=float, default=10.0,
                   help="wait at most this long for outstanding rewards (default 10)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="httpx timeout of each phase of a request (connect, write, read, "
                   "pool wait), s (default 30)")
    p.add_argument("--connections", type=int, default=256,
                   help="client connections in all (default 256)")
    p.add_argument("--clients", type=int, default=16,
                   help="httpx clients sharing the connections (default 16; one big pool "
                   "slows the client down under concurrency)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep-experiments", action="store_true",
                   help="do not delete the experiments afterwards")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--out", type=Path, default=Path("results/loadtest/report.json"),
                   help="JSON report (default results/loadtest/report.json)")


def _loadtest(args: argparse.Namespace) -> int:
    import asyncio

    from loadtest.http_driver import require_loopback
    from loadtest.load import FeedbackModel, LoadConfig, run_load, write_report
    from loadtest.replay import service

    try:
        feedback = FeedbackModel(args.reward_delay_mean, args.drop_fraction,
                                 args.duplicate_fraction, args.duplicate_delay_mean)
        config = LoadConfig(
            experiments=args.experiments, setting=args.setting, dim=args.dim,
            n_arms=args.arms, policy=args.policy,
            rate=100.0 if args.rate is None and args.concurrency is None else args.rate,
            concurrency=args.concurrency, duration=args.duration,
            max_requests=args.max_requests, feedback=feedback,
            drain_seconds=args.drain_seconds, timeout=args.timeout,
            connections=args.connections, clients=args.clients, seed=args.seed,
        )
        if args.url:
            require_loopback(args.url, args.allow_remote)
    except ValueError as exc:
        raise SystemExit(f"linreboot loadtest: {exc}") from None
    with service(args.url, args.admin_token, args.workers) as (url, token):
        report = asyncio.run(run_load(url, token, config, progress=not args.no_progress,
                                      keep=args.keep_experiments))
    print(report.markdown())
    print(f"report: {write_report(report, args.out)}")
    return 0 if report.check.passed else 1


def _add_export(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "export",
        help="write an experiment's decision log as JSON lines or Open Bandit Pipeline's "
        "bandit feedback",
        description="Read an experiment's decision log from a running service (admin token) "
        "and write it: jsonl, one JSON object per decision with its outcome; obp, Open Bandit "
        "Pipeline's bandit-feedback dict as a NumPy .npz file (one round per decision with an "
        "outcome).",
    )
    p.add_argument("--url", required=True, help="the service, e.g. http://localhost:8000")
    p.add_argument("--experiment", required=True, help="the experiment id")
    p.add_argument("--out", type=Path, required=True, help="the file to write")
    p.add_argument("--format", choices=("jsonl", "obp"), default="jsonl",
                   help="jsonl (default) or obp (.npz)")
    p.add_argument("--admin-token", default=None,
                   help="the service's admin token (default: LINREBOOT_ADMIN_TOKEN)")
    p.add_argument("--timeout", type=float, default=30.0, help="per request, s (default 30)")


def _export(args: argparse.Namespace) -> int:
    import asyncio

    import httpx

    from linreboot.export import export

    token = args.admin_token or os.environ.get("LINREBOOT_ADMIN_TOKEN")
    if not token:
        raise StartupError("give the admin token: --admin-token or LINREBOOT_ADMIN_TOKEN")

    async def run() -> int:
        async with httpx.AsyncClient(base_url=args.url, timeout=args.timeout) as http:
            return await export(http, args.experiment, token, args.out, args.format)

    try:
        written = asyncio.run(run())
    except (ValueError, httpx.HTTPError) as exc:
        print(f"linreboot export: {exc}", file=sys.stderr)
        return 1
    what = "decisions" if args.format == "jsonl" else "rounds"
    print(f"{written} {what} written to {args.out}")
    return 0


# Run as written by tests/test_decision_log.py (with home.npz an exported log).
EVALUATE_EXAMPLES = """examples:
  linreboot evaluate --log home.npz
  linreboot evaluate --log home.npz --policy greedy --json
  linreboot evaluate --log home.npz --policy linucb-const --set ucb_alpha=0.5 epsilon=0.1
  linreboot evaluate --log home.npz --policy linreboot --set spread=pooled
  linreboot evaluate --log home.npz --policy lints-ig --set ig_alpha=1 --train-fraction 0.3
"""


def _add_evaluate(sub: argparse._SubParsersAction[_Parser]) -> None:
    p = sub.add_parser(
        "evaluate",
        help="estimate another policy's value from an exported log (IPS, SNIPS, DR)",
        description="Off-policy evaluation of an exported log (linreboot export --format obp): "
        "the target policy is fitted on the log's first rounds and held fixed (so it takes "
        "no first pass: an arm the training rounds never tried is scored from the prior); "
        "its mean reward on the other rounds is estimated by IPS, self-normalised IPS and "
        "doubly robust (per-arm ridge reward model), each with a 95% interval.",
        epilog=EVALUATE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--log", type=Path, required=True, help="the .npz that export wrote")
    p.add_argument("--policy", choices=POLICIES, default=None,
                   help="the target policy (default: the logged experiment's, with its "
                   "hyperparameters); a named policy takes the paper's defaults, so "
                   "--policy linreboot is the paper's spread: add --set spread=pooled for "
                   "the service's default")
    p.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE",
                   help="the target's hyperparameters, numbers or choices (spread=pooled, "
                   "residuals=observed); a wrong name or value is refused in one line that "
                   "says what the policy takes")
    p.add_argument("--train-fraction", type=float, default=0.5,
                   help="share of the log the target is fitted on (default 0.5)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _evaluate(args: argparse.Namespace) -> int:
    import json

    from linreboot.export import load_bandit_feedback
    from service.off_policy import evaluate, parse_overrides

    try:
        feedback = load_bandit_feedback(args.log)
    except (OSError, ValueError) as exc:
        print(f"linreboot evaluate: cannot read {args.log}: {exc}", file=sys.stderr)
        return 1
    try:
        report = evaluate(feedback, args.policy, parse_overrides(args.set), args.train_fraction)
    except (ValueError, TypeError) as exc:
        print(f"linreboot evaluate: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report.as_dict()) if args.json else report.markdown())
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
    parser = _Parser(
        prog="linreboot",
        description="LinReBoot recommendation service: simulator, server, load replays and "
        "log export.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_simulate(sub)
    _add_serve(sub)
    _add_replay(sub)
    _add_demo(sub)
    _add_loadtest(sub)
    _add_export(sub)
    _add_evaluate(sub)
    return parser


_COMMANDS = {
    "simulate": _simulate, "serve": _serve, "replay": _replay, "demo": _demo,
    "loadtest": _loadtest, "export": _export, "evaluate": _evaluate,
}


_PLOTTING = {"simulate", "replay", "demo"}
_STARTING_A_SERVICE = {"replay", "demo", "loadtest"}  # unless given --url


def _require_extras(args: argparse.Namespace) -> None:
    """Refuse at once, in one line, a command whose optional dependencies are missing."""
    if args.command in _PLOTTING and importlib.util.find_spec("matplotlib") is None:
        raise StartupError("the plots need matplotlib: pip install 'linreboot[plots]'")
    if args.command in _STARTING_A_SERVICE and not args.url:
        from service.embedded import find_redis_server

        find_redis_server()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _require_extras(args)
        return _COMMANDS[args.command](args)
    except StartupError as exc:
        print(f"linreboot {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
