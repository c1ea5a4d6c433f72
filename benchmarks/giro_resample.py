"""The authors' LinGIRO played literally: every row kept, resampled at every decision.

``policies.authors`` draws the authors' LinGIRO from the normal with the first
two moments of its resample's perturbation (sums up to fourth order in ``x``,
a cost per decision independent of the history). This plays their
``Linear_GIRO`` as their ``Algorithms.py`` writes it: each reward's row plus
``a`` rows ``(x, +U)`` and ``a`` rows ``(x, -U)`` (none for the shared model's
first pass over the arms), then at every decision a with-replacement resample
of each model's ``s`` rows (``np.random.choice(s, s)``) fitted by ridge
regression, an arm never pulled scoring 0 with a model per arm (no first
pass: ``--first-pass`` adds ours). The worlds are those of
``simulate --policies lingiro --baselines authors --centres once`` with the same
``--seed``, so the two runs differ by the draw alone. O(t d^2) per decision:
for checks, not for the tables.

Usage::

    python -m benchmarks.giro_resample --setting covariates --dim 5 --reps 20 --horizon 3000
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from numpy.typing import NDArray

from loadtest.environments import Environment, Setting, split_rngs
from loadtest.simulate import Cell, cell_seed
from policies.ridge import Array

Indices = NDArray[np.int64]


class History:
    """Each model's rows per repetition, ``x`` (B, capacity, d) and ``y``, grown by doubling."""

    def __init__(self, reps: int, models: int, dim: int) -> None:
        self.x = [np.zeros((reps, 16, dim)) for _ in range(models)]
        self.y = [np.zeros((reps, 16)) for _ in range(models)]
        self.count = np.zeros((reps, models), dtype=np.int64)

    def add(self, reps: Indices, models: Indices, x: Array, y: Array) -> None:
        """One row per entry of ``reps`` (repetition), into model ``models``."""
        for m in np.unique(models):
            chosen = models == m
            b = reps[chosen]
            at = self.count[b, m]
            capacity = self.x[m].shape[1]
            if at.max() >= capacity:
                self.x[m] = np.concatenate([self.x[m], np.zeros_like(self.x[m])], axis=1)
                self.y[m] = np.concatenate([self.y[m], np.zeros_like(self.y[m])], axis=1)
            self.x[m][b, at] = x[chosen]
            self.y[m][b, at] = y[chosen]
            self.count[b, m] = at + 1

    def resampled_theta(self, m: int, reg: float, rng: np.random.Generator) -> Array:
        """Ridge on a with-replacement resample of model ``m``'s rows, shape (B, d); 0 if none."""
        count = self.count[:, m]
        rows = int(count.max())
        reps, _, dim = self.x[m].shape
        if rows == 0:
            return np.zeros((reps, dim))
        # s_b picks among its s_b rows per repetition (a shorter history draws fewer):
        # the multinomial counts of np.random.choice(s, s). Unused picks go to a spare bin.
        picks = np.floor(rng.random((reps, rows)) * count[:, None]).astype(np.int64)
        offsets = picks + np.arange(reps)[:, None] * rows
        offsets[np.arange(rows)[None, :] >= count[:, None]] = reps * rows
        weights = np.bincount(offsets.ravel(), minlength=reps * rows + 1)[:-1]
        weights = weights.reshape(reps, rows).astype(float)
        x, y = self.x[m][:, :rows], self.y[m][:, :rows]
        gram = np.matmul(np.swapaxes(x * weights[..., None], 1, 2), x) + reg * np.eye(dim)
        xty = np.einsum("bn,bn,bnd->bd", weights, y, x)
        return np.linalg.solve(gram, xty[..., None])[..., 0]


def play(cell: Cell, reps: int, horizon: int, seed: int, first_pass: bool) -> Array:
    """Cumulative regret (reps, horizon) of the literal resample in the cell's worlds."""
    config = cell.config()
    spec = cell.env_spec(seed)
    env_rngs, _ = split_rngs(cell_seed(seed, cell), reps)
    env = Environment(spec, env_rngs)
    rng = np.random.default_rng([seed, 11])
    k, a = spec.n_arms, int(config.giro_a)
    assert a == config.giro_a, "the authors' a is a whole number of pseudo-row pairs"
    models = 1 if config.shared else k
    history = History(reps, models, spec.dim)
    rows = np.arange(reps, dtype=np.int64)
    regret = np.empty((reps, horizon))
    for t in range(horizon):
        contexts = env.contexts()
        if (config.shared or first_pass) and t < k:
            arms = np.full(reps, t)
        else:
            thetas = np.stack([history.resampled_theta(m, config.reg, rng)
                               for m in range(models)], axis=1)  # (B, M, d)
            scores = np.einsum("bkd,bkd->bk", contexts, np.broadcast_to(thetas, contexts.shape))
            arms = np.argmax(scores, axis=1)
        means = env.means(contexts)
        regret[:, t] = means.max(axis=1) - means[rows, arms]
        rewards = env.rewards(contexts, arms)
        x = contexts[rows, arms]
        model = np.zeros(reps, dtype=np.int64) if config.shared else arms.astype(np.int64)
        history.add(rows, model, x, rewards)
        if not (config.shared and t < k):
            for _ in range(a):
                history.add(rows, model, x, np.full(reps, config.reward_bound))
                history.add(rows, model, x, np.full(reps, -config.reward_bound))
    return np.cumsum(regret, axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=["contextual", "covariates"], default="covariates")
    parser.add_argument("--dim", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--horizon", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first-pass", action="store_true",
                        help="pull each arm once first, as every policy here does")
    args = parser.parse_args()
    setting: Setting = args.setting
    cell = Cell(setting, args.dim, "lingiro", overrides=(("variant", "authors"),),
                centres="once")
    start = time.perf_counter()
    cumulative = play(cell, args.reps, args.horizon, args.seed, args.first_pass)
    seconds = time.perf_counter() - start
    print(f"{setting} d={args.dim} reps={args.reps} first_pass={args.first_pass} "
          f"({seconds:.0f} s)")
    for t in sorted({min(args.horizon, r) for r in (500, 1000, 3000, 5000, args.horizon)}):
        column = cumulative[:, t - 1]
        se = column.std() / math.sqrt(args.reps)  # as the authors report: np.std / sqrt(n)
        print(f"  after {t:>6} rounds: {column.mean():8.1f} ± {se:.1f}")


if __name__ == "__main__":
    main()
