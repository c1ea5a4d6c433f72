"""Run a grid of cells in parallel processes and write results, plot and tables."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from loadtest.plots import regret_by_slots, regret_grid, slots_of
from loadtest.results import Curve, final_regret_table, runtime_table, write_curves
from loadtest.simulate import Cell, cell_seed, play, play_together, to_curve

# The matrices are tiny (d <= 20): BLAS threads only fight the worker processes.
_SINGLE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


@dataclass(frozen=True)
class GridRun:
    curves: list[Curve]
    single_run_seconds: dict[tuple[str, int, str], float]
    wall_seconds: float


def _run_group_job(
    cells: Sequence[Cell], reps: int, horizon: int, seed: int, points: int, ticks: Any
) -> list[Curve]:
    played = play_together(cells, reps, horizon, seed, progress=ticks.put)
    return [to_curve("in-process", cell, p, points) for cell, p in zip(cells, played, strict=True)]


def _groups(cells: Sequence[Cell], seed: int, jobs: int = 1) -> list[list[Cell]]:
    """The cells by the worlds they play (setting, d, reading, ...), largest d first.

    Fewer than two groups per job: each group is split, so that every job has work.
    Largest first (d, then the group's size), so that no large group starts last.
    """
    groups: dict[tuple[object, ...], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.env_spec(seed), cell_seed(seed, cell), cell.slots,
                           cell.position_weights), []).append(cell)
    # About two units of work per job at least, or one large group would end last alone.
    parts = -(-2 * jobs // len(groups)) if groups and len(groups) < 2 * jobs else 1
    split = [group[i::parts] for group in groups.values() for i in range(min(parts, len(group)))]
    return sorted(split, key=lambda group: (group[0].dim, len(group)), reverse=True)


def _time_single_job(cell: Cell, horizon: int, seed: int) -> float:
    return play(cell, 1, horizon, seed).seconds


def run_grid(
    cells: Sequence[Cell],
    reps: int,
    horizon: int,
    seed: int,
    jobs: int,
    points: int = 200,
    time_single: bool = False,
) -> GridRun:
    """Play every cell (``jobs`` processes) with one progress bar over all rounds.

    The cells that play the same worlds (every policy of a setting and d) are
    played together, one job each (:func:`loadtest.simulate.play_together`).
    """
    os.environ.update(_SINGLE_THREAD)
    start = time.perf_counter()
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        ticks = manager.Queue()
        groups = _groups(cells, seed, jobs)
        futures = [pool.submit(_run_group_job, group, reps, horizon, seed, points, ticks)
                   for group in groups]
        _drain(futures, ticks, total=len(cells) * horizon, desc="simulate")
        by_cell = {id(cell): curve for group, f in zip(groups, futures, strict=True)
                   for cell, curve in zip(group, f.result(), strict=True)}
        curves = [by_cell[id(cell)] for cell in cells]
        single: dict[tuple[str, int, str], float] = {}
        if time_single:
            timed = {(c.setting, c.dim, c.label): pool.submit(_time_single_job, c, horizon, seed)
                     for c in cells}
            for key, fut in tqdm(timed.items(), desc="single runs", unit="run"):
                single[key] = fut.result()
    return GridRun(curves, single, time.perf_counter() - start)


def _drain(futures: Sequence[Future[Any]], ticks: Any, total: int, desc: str) -> None:
    with tqdm(total=total, desc=desc, unit="round", unit_scale=True, smoothing=0.05) as bar:
        while not all(f.done() for f in futures):
            with contextlib.suppress(queue.Empty):
                bar.update(ticks.get(timeout=0.5))
        while not ticks.empty():
            bar.update(ticks.get())
    for f in futures:
        f.result()  # re-raise a worker's error here, not later


def write_outputs(run: GridRun, out: Path, title: str) -> dict[str, Path]:
    """Write results.csv, the regret grid PNG and the markdown tables under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "results": out / "results.csv",
        "figure": out / "regret.png",
        "tables": out / "tables.md",
    }
    write_curves(paths["results"], run.curves)
    regret_grid(run.curves, paths["figure"], title)
    if len({slots_of(c.label) for c in run.curves}) > 1:
        paths["by_slots"] = regret_by_slots(run.curves, out / "regret_by_k.png", title)
    tables = [
        f"# {title}\n",
        f"Wall time of the whole grid: {run.wall_seconds:.1f} s.\n",
        "## Final cumulative regret (mean ± s.e.; best of a row in bold)\n",
        final_regret_table(run.curves),
        "\n## Run time in seconds: one run alone / amortised per run in the batch\n",
        runtime_table(run.curves, run.single_run_seconds),
        "",
    ]
    paths["tables"].write_text("\n".join(tables))
    return paths
