"""The full reproduction's work at the paper's size: the project against the floor.

Usage::

    python -m benchmarks.bench_reproduction [--reps 100] [--horizon 10000] [--jobs 2]
        [--settings ...] [--dims ...]

The reproduction (``linreboot simulate``) plays every (setting, d) group of
the paper's six policies in one set of worlds, drawn once a round for the
group (:func:`loadtest.simulate.play_together`). Here each group does the
same, and in the same loop every policy's floor
(:class:`benchmarks.policy_floor.FloorPlayer`, a minimal batched NumPy
round) takes its turn after the project's player, in the same worlds; each
part is timed with the process's CPU clock (BLAS single-threaded), which
side goes first alternating from round to round, so load on a shared
machine meets both alike. Reported per group and in total: the
worlds' CPU seconds, the project's policies' and the floor's, and what
either makes a reproduction cost: worlds plus policies, in CPU seconds and
spread over ``jobs`` cores. Both sides run in one process, so each pays
some of the other's cache misses: the project's share came out about 7 %
above the CPU of ``linreboot simulate`` itself on the same code.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from tqdm import tqdm

from benchmarks.policy_floor import Array, FloorPlayer
from loadtest.environments import Environment, split_rngs
from loadtest.simulate import Cell, Player, cell_seed
from policies import PAPER_POLICIES, SETTINGS


def time_group(setting: str, dim: int, reps: int, horizon: int, seed: int = 0
               ) -> dict[str, float]:
    """CPU seconds of one group's worlds, project policies and floor policies."""
    cells = [Cell(setting, dim, policy) for policy in PAPER_POLICIES]  # type: ignore[arg-type]
    env = Environment(cells[0].env_spec(seed), split_rngs(cell_seed(seed, cells[0]), reps)[0])
    players = [Player.of(cell, seed, reps, horizon, False) for cell in cells]
    floors = [FloorPlayer.of(cell, reps, seed, horizon) for cell in cells]
    spent = {"worlds": 0.0, "project": 0.0, "floor": 0.0}
    clock = time.process_time
    for t in range(horizon):
        start = clock()
        contexts = env.contexts()
        means, noise = env.means(contexts), env.noise()
        spent["worlds"] += clock() - start
        for player, floor in zip(players, floors, strict=True):
            # Which goes first alternates, as in bench_policies.time_cell.
            for side in (("project", "floor") if t % 2 == 0 else ("floor", "project")):
                start = clock()
                if side == "project":
                    player.step(t, env, contexts, means, noise)
                else:
                    _floor_step(floor, t, contexts, means, noise, env)
                spent[side] += clock() - start
    return spent


def _floor_step(floor: FloorPlayer, t: int, contexts: Array, means: Array, noise: Array,
                env: Environment) -> None:
    """The floor's round ``t``, with the regret and reward a project's step records."""
    arms = floor.choose(contexts)
    floor.regret[:, t] = means.max(axis=1) - means[floor.rows, arms]
    floor.learn(contexts, arms, env.rewards(contexts, arms, noise))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    parser.add_argument("--dims", nargs="+", type=int, default=[5, 10, 20])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--horizon", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    # The largest first: by d, and within a d the covariates group (whose floor solves
    # every model of every repetition each round), so that no large group starts last.
    groups = sorted(((s, d) for s in args.settings for d in args.dims),
                    key=lambda group: (group[1], group[0] == "covariates"), reverse=True)
    print(f"{args.reps} repetitions x {args.horizon} rounds, {len(PAPER_POLICIES)} policies a "
          f"group, {args.jobs} processes; CPU seconds\n", flush=True)
    # Spawned workers, as ``linreboot simulate``'s: no fork of a process that may hold threads.
    with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(time_group, *group, args.reps, args.horizon): group
                   for group in groups}
        spent = {futures[f]: f.result() for f in tqdm(
            as_completed(futures), total=len(futures), desc="groups", unit="group")}
    print("| setting | d | worlds | project policies | floor policies | **ratio** |")
    print("|---|---|---:|---:|---:|---:|")
    totals = dict.fromkeys(("worlds", "project", "floor"), 0.0)
    for (setting, dim), times in ((group, spent[group]) for group in groups):
        for name in totals:
            totals[name] += times[name]
        print(f"| {setting} | {dim} | {times['worlds']:.4g} | {times['project']:.4g} | "
              f"{times['floor']:.4g} | **{times['project'] / times['floor']:.2f}** |")
    print(f"| all | | {totals['worlds']:.4g} | {totals['project']:.4g} | {totals['floor']:.4g} "
          f"| **{totals['project'] / totals['floor']:.2f}** |\n")
    for name in ("project", "floor"):
        cpu = totals["worlds"] + totals[name]
        print(f"A reproduction by the {name}: {cpu:.0f} CPU seconds, "
              f"{cpu / args.jobs / 60:.1f} minutes on {args.jobs} cores at best")


if __name__ == "__main__":
    main()
