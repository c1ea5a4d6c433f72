"""The floor: a minimal batched NumPy round of each policy, in the same worlds.

The least work a round of each algorithm needs, written plainly: raw sums
(no shifts), ``np.linalg.solve`` on the stacked ``X'X + lambda I`` (no
equilibration, no fallback), ``np.linalg.cholesky`` where a draw needs a
square root, one generator for the whole batch, unexplored arms first by an
infinite score (the lowest index, not a uniform one), no eligibility, no
forgetting, no input checks. It plays the same :class:`loadtest.environments.Environment`
for the same horizon as :func:`loadtest.simulate.rounds`, so
``project seconds / floor seconds`` is what the project's generality and
robustness cost on this machine. Its regret is reported too, as a check that
it runs the same algorithm.

Per round (``A = X'X + lambda I``, ``G`` the perturbed policies' Gram,
``R = chol(X'X + 1e-8 I)``):

* LinReBoot, greedy: ``theta = solve(A, X'y)``; ``mu + sigma_omega sqrt(RSS) / s z``.
* LinTS-G: ``L = chol(A)``; ``theta = solve(A, X'y + v L z)`` (``A^-1 L z ~ N(0, A^-1)``).
* LinTS-IG: ``L = chol(A)``; ``[theta_hat, w] = solve(A, [X'y, L z])``; ``theta_hat + sigma w``.
* LinPHE: ``theta = solve(G, X'y + c R z)``.
* LinGIRO: ``[theta_bar, w] = solve(G, [X'y, R z])``; ``theta_bar + c w``.
* LinUCB: one model ``[theta, A^-1] = solve(A, [X'y, I])``, then ``x_k' A^-1 x_k``;
  a model per arm ``[theta_k, A_k^-1 x_k] = solve(A_k, [X'y_k, x_k])``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loadtest.environments import Environment, split_rngs
from loadtest.simulate import Cell, cell_seed
from policies import PolicyConfig

Array = NDArray[np.floating[Any]]


@dataclass
class Sums:
    """Raw sufficient statistics: per model (M = 1 or K) and per arm."""

    xtx: Array  # (B, M, d, d)
    xty: Array  # (B, M, d)
    n: Array  # (B, M)
    y: Array  # (B, M)
    yy: Array  # (B, M)
    pulls: Array  # (B, K)
    r: Array  # (B, K)
    rr: Array  # (B, K)


def _zeros(batch: int, models: int, arms: int, d: int) -> Sums:
    return Sums(np.zeros((batch, models, d, d)), np.zeros((batch, models, d)),
                *(np.zeros((batch, models)) for _ in range(3)),
                *(np.zeros((batch, arms)) for _ in range(3)))


def _means(theta: Array, contexts: Array) -> Array:
    """``x_k' theta`` (one model) or ``x_k' theta_k`` (a model per arm), (B, K)."""
    if theta.shape[1] == 1:
        return np.matmul(contexts, theta[:, 0, :, None])[..., 0]
    return np.einsum("bkd,bkd->bk", contexts, theta)


def _linreboot(c: PolicyConfig, s: Sums, x: Array, rng: np.random.Generator) -> Array:
    theta = np.linalg.solve(s.xtx + c.reg * np.eye(c.dim), s.xty[..., None])[..., 0]
    mu = _means(theta, x)
    if c.sigma_omega == 0.0:
        return mu
    rss = np.maximum(s.rr - 2.0 * mu * s.r + s.pulls * mu * mu, 0.0)
    spread = c.sigma_omega * np.sqrt(rss) / np.maximum(s.pulls, 1.0)
    return mu + spread * rng.standard_normal(mu.shape)


def _lints_g(c: PolicyConfig, s: Sums, x: Array, rng: np.random.Generator) -> Array:
    a = s.xtx + c.reg * np.eye(c.dim)
    root = np.linalg.cholesky(a)
    mean = s.y / np.maximum(s.n, 1.0)
    var = np.where(s.n > 1, (s.yy - s.y * mean) / np.maximum(s.n - 1.0, 1.0), 1.0)
    z = rng.standard_normal(s.xty.shape)
    noise = np.sqrt(np.maximum(var, 0.0))[..., None] * np.matmul(root, z[..., None])[..., 0]
    return _means(np.linalg.solve(a, (s.xty + noise)[..., None])[..., 0], x)


def _lints_ig(c: PolicyConfig, s: Sums, x: Array, rng: np.random.Generator) -> Array:
    a = s.xtx + c.ig_prior_precision * np.eye(c.dim)
    root = np.linalg.cholesky(a)
    z = rng.standard_normal(s.xty.shape)
    solved = np.linalg.solve(a, np.stack([s.xty, np.matmul(root, z[..., None])[..., 0]], -1))
    theta, w = solved[..., 0], solved[..., 1]
    fit = np.einsum("bmd,bmd->bm", theta, s.xty)  # theta' A theta, as A theta = X'y
    rate = c.ig_beta + 0.5 * np.maximum(s.yy - fit, 0.0)
    sigma = np.sqrt(rate / rng.standard_gamma(c.ig_alpha + 0.5 * s.n))
    return _means(theta + sigma[..., None] * w, x)


def _root(xtx: Array) -> Array:
    return np.linalg.cholesky(xtx + 1e-8 * np.eye(xtx.shape[-1]))


def _linphe(c: PolicyConfig, s: Sums, x: Array, rng: np.random.Generator) -> Array:
    z = rng.standard_normal(s.xty.shape)
    noise = math.sqrt(c.phe_a) * c.reward_bound * np.matmul(_root(s.xtx), z[..., None])
    g = (1.0 + c.phe_a) * s.xtx + c.reg * np.eye(c.dim)
    return _means(np.linalg.solve(g, s.xty[..., None] + noise)[..., 0], x)


def _lingiro(c: PolicyConfig, s: Sums, x: Array, rng: np.random.Generator) -> Array:
    a = c.giro_a
    z = rng.standard_normal(s.xty.shape)
    noise = np.matmul(_root(s.xtx), z[..., None])[..., 0]
    g = (1.0 + 2.0 * a) * s.xtx + c.reg * np.eye(c.dim)
    solved = np.linalg.solve(g, np.stack([s.xty, noise], -1))
    theta, w = solved[..., 0], solved[..., 1]
    fit = np.einsum("bmi,bmij,bmj->bm", theta, s.xtx, theta)
    rss = np.maximum(s.yy - 2.0 * np.einsum("bmd,bmd->bm", theta, s.xty) + fit, 0.0)
    scale = np.sqrt(2.0 * a * c.reward_bound**2 + (rss + 2.0 * a * fit) / np.maximum(s.n, 1.0))
    return _means(theta + scale[..., None] * w, x)


def _linucb(c: PolicyConfig, s: Sums, x: Array, rng: np.random.Generator) -> Array:
    a = s.xtx + c.reg * np.eye(c.dim)
    if c.name == "linucb-const":
        radius = np.full(s.n.shape, c.ucb_alpha)
    else:
        log_det = c.dim * np.log1p(s.n * c.context_bound**2 / (c.reg * c.dim))
        radius = (c.noise_sd * np.sqrt(2.0 * math.log(1.0 / c.ucb_delta) + log_det)
                  + math.sqrt(c.reg) * c.theta_bound)
    if s.xtx.shape[1] == 1:  # theta and V^-1 from d + 1 right-hand sides, not K + 1
        d = c.dim
        solved = np.linalg.solve(a[:, 0], np.concatenate(
            [s.xty[:, 0, :, None], np.broadcast_to(np.eye(d), (len(x), d, d))], axis=-1))
        theta = solved[:, None, :, 0]
        squares = np.vecdot(np.matmul(x, solved[..., 1:]), x)
    else:
        solved = np.linalg.solve(a, np.stack([s.xty, x], axis=-1))
        theta, squares = solved[..., 0], np.einsum("bkd,bkd->bk", solved[..., 1], x)
    return _means(theta, x) + radius * np.sqrt(np.maximum(squares, 0.0))


SCORES: dict[str, Callable[[PolicyConfig, Sums, Array, np.random.Generator], Array]] = {
    "linreboot": _linreboot, "greedy": _linreboot, "lints-g": _lints_g,
    "lints-ig": _lints_ig, "linphe": _linphe, "lingiro": _lingiro,
    "linucb": _linucb, "linucb-const": _linucb,
}


def _update(s: Sums, model: Any, rows: Any, arms: Any, x: Array, r: Array) -> None:
    s.xtx[model] += x[:, :, None] * x[:, None, :]
    s.xty[model] += r[:, None] * x
    s.n[model] += 1.0
    s.y[model] += r
    s.yy[model] += r * r
    s.pulls[rows, arms] += 1.0
    s.r[rows, arms] += r
    s.rr[rows, arms] += r * r


@dataclass
class FloorPlayer:
    """One cell's floor: its sums and its one generator, playing round by round in
    worlds that it may share with other players (as ``loadtest.simulate`` shares them)."""

    config: PolicyConfig
    sums: Sums
    rng: np.random.Generator
    rows: NDArray[np.int64]
    regret: Array  # (reps, horizon), for a caller to record each round's

    @classmethod
    def of(cls, cell: Cell, reps: int, seed: int, horizon: int = 0) -> FloorPlayer:
        config = cell.config()
        k = cell.env_spec().n_arms
        rng = split_rngs(cell_seed(seed, cell), reps)[1][0]
        return cls(config, _zeros(reps, 1 if config.shared else k, k, config.dim), rng,
                   np.arange(reps), np.empty((reps, horizon)))

    def choose(self, contexts: Array) -> NDArray[np.int64]:
        """This round's arms: unexplored arms first, then the highest score."""
        score = SCORES[self.config.name](self.config, self.sums, contexts, self.rng)
        return np.argmax(np.where(self.sums.pulls == 0.0, np.inf, score), axis=1)

    def learn(self, contexts: Array, arms: NDArray[np.int64], rewards: Array) -> None:
        rows = self.rows
        model = (slice(None), 0) if self.config.shared else (rows, arms)
        _update(self.sums, model, rows, arms, contexts[rows, arms], rewards)


def floor_rounds(
    cell: Cell, reps: int, horizon: int, seed: int
) -> Iterator[tuple[Array, NDArray[np.int64]]]:
    """The floor's run of ``cell`` round by round: each round's regret and arms, shape (reps,).

    The worlds of :func:`loadtest.simulate.rounds`, which plays the project.
    """
    env = Environment(cell.env_spec(), split_rngs(cell_seed(seed, cell), reps)[0])
    player = FloorPlayer.of(cell, reps, seed)
    rows = player.rows
    for _ in range(horizon):
        contexts = env.contexts()
        arms = player.choose(contexts)
        means = env.means(contexts)
        yield means.max(axis=1) - means[rows, arms], arms
        player.learn(contexts, arms, env.rewards(contexts, arms))
