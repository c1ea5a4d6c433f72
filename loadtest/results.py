"""The one results format shared by the in-process and HTTP drivers.

A results file is a CSV in long form: one row per (cell, recorded round) with
the mean cumulative regret over repetitions and its standard error
(std / sqrt(reps), as the authors report). Curves are recorded at a fixed
number of evenly spaced rounds (always including the last), which keeps the
file small while the plot stays smooth.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.floating[Any]]

COLUMNS = (
    "source", "setting", "dim", "policy", "label", "reading", "reps", "horizon",
    "round", "mean_regret", "se_regret", "wall_seconds",
)


@dataclass(frozen=True)
class Curve:
    """Mean cumulative regret of one cell (setting x dim x policy), per recorded round.

    Attributes
    ----------
    rounds : ndarray of int, shape (P,), 1-based round numbers.
    mean, se : ndarray, shape (P,)
    wall_seconds : wall time of the whole batch of repetitions.
    """

    source: str
    setting: str
    dim: int
    policy: str
    label: str
    reading: str
    reps: int
    horizon: int
    rounds: NDArray[np.int64]
    mean: Array
    se: Array
    wall_seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def final_mean(self) -> float:
        return float(self.mean[-1])

    @property
    def final_se(self) -> float:
        return float(self.se[-1])


def recorded_rounds(horizon: int, points: int = 200) -> NDArray[np.int64]:
    """Evenly spaced 1-based rounds to record, always ending at ``horizon``."""
    points = max(1, min(points, horizon))
    return np.unique(np.linspace(1, horizon, points).round().astype(np.int64))


def summarise(cumulative: Array, rounds: NDArray[np.int64]) -> tuple[Array, Array]:
    """Mean and standard error over repetitions at the recorded rounds.

    Parameters
    ----------
    cumulative : ndarray, shape (reps, horizon)
        Cumulative regret of every repetition after every round.
    """
    picked = cumulative[:, rounds - 1]
    reps = picked.shape[0]
    mean = picked.mean(axis=0)
    se = picked.std(axis=0, ddof=1) / math.sqrt(reps) if reps > 1 else np.zeros_like(mean)
    return mean, se


def write_curves(path: Path, curves: Iterable[Curve]) -> None:
    """Write curves to ``path`` (CSV, one row per recorded round)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for c in curves:
            for rnd, m, s in zip(c.rounds, c.mean, c.se, strict=True):
                writer.writerow([
                    c.source, c.setting, c.dim, c.policy, c.label, c.reading, c.reps,
                    c.horizon, int(rnd), f"{m:.6g}", f"{s:.6g}", f"{c.wall_seconds:.4f}",
                ])


def read_curves(path: Path) -> list[Curve]:
    """Read a results CSV written by :func:`write_curves`."""
    groups: dict[tuple[str, ...], list[dict[str, str]]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            key = tuple(row[c] for c in ("source", "setting", "dim", "label", "reading"))
            groups.setdefault(key, []).append(row)
    curves = []
    for rows in groups.values():
        first = rows[0]
        curves.append(Curve(
            source=first["source"], setting=first["setting"], dim=int(first["dim"]),
            policy=first["policy"], label=first["label"], reading=first["reading"],
            reps=int(first["reps"]), horizon=int(first["horizon"]),
            rounds=np.array([int(r["round"]) for r in rows], dtype=np.int64),
            mean=np.array([float(r["mean_regret"]) for r in rows]),
            se=np.array([float(r["se_regret"]) for r in rows]),
            wall_seconds=float(first["wall_seconds"]),
        ))
    return curves


def final_regret_table(curves: Sequence[Curve]) -> str:
    """Markdown table of final regret (mean +- s.e.), one row per setting and dim."""
    labels = list(dict.fromkeys(c.label for c in curves))
    cells = {(c.setting, c.dim, c.label): c for c in curves}
    rows = sorted({(c.setting, c.dim) for c in curves}, key=_cell_order)
    lines = [
        "| setting | d | " + " | ".join(labels) + " |",
        "|---|---|" + "---|" * len(labels),
    ]
    for setting, dim in rows:
        present = [cells[(setting, dim, lab)] for lab in labels if (setting, dim, lab) in cells]
        best = min(c.final_mean for c in present)
        entries = []
        for lab in labels:
            c = cells.get((setting, dim, lab))
            if c is None:
                entries.append("")
                continue
            text = f"{c.final_mean:.1f} ± {c.final_se:.1f}"
            entries.append(f"**{text}**" if c.final_mean == best else text)
        lines.append(f"| {setting} | {dim} | " + " | ".join(entries) + " |")
    return "\n".join(lines)


def runtime_table(curves: Sequence[Curve], single: dict[tuple[str, int, str], float]) -> str:
    """Markdown table: seconds per run alone and amortised in the batch, per cell."""
    labels = list(dict.fromkeys(c.label for c in curves))
    cells = {(c.setting, c.dim, c.label): c for c in curves}
    rows = sorted({(c.setting, c.dim) for c in curves}, key=_cell_order)
    head = " | ".join(f"{lab} (1 run / batched)" for lab in labels)
    lines = ["| setting | d | " + head + " |", "|---|---|" + "---|" * len(labels)]
    for setting, dim in rows:
        entries = []
        for lab in labels:
            c = cells.get((setting, dim, lab))
            alone = single.get((setting, dim, lab))
            batched = c.wall_seconds / c.reps if c else None
            entries.append(
                f"{_fmt(alone)} / {_fmt(batched)}" if c or alone else ""
            )
        lines.append(f"| {setting} | {dim} | " + " | ".join(entries) + " |")
    return "\n".join(lines)


def _fmt(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds:.3g}"


_SETTING_ORDER = {"stochastic": 0, "contextual": 1, "covariates": 2}


def _cell_order(cell: tuple[str, int]) -> tuple[int, int]:
    return (_SETTING_ORDER.get(cell[0], 9), cell[1])
