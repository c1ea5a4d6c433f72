"""Rankings: k distinct arms in order, from the same random index as one decision.

:func:`rank` orders k eligible arms per experiment. Its first position is
:func:`policies.draw`'s choice, from the same generators used in the same
order, so that k = 1 is a decision of ``/choose`` bit for bit; each later
position is what ``draw`` would choose were the arms not yet placed the only
eligible ones, from the *same* draw of the index: an unexplored arm first
(uniformly, with the paper's first pass), else the highest score (equal
scores split evenly), and with probability ``epsilon`` a uniformly random
remaining eligible arm instead. Every policy ranks by its own randomised (or,
LinUCB, optimistic) index.

:func:`position_propensities` gives the marginal probability that each placed
arm is at its position (what the independent IPS estimator of a slate needs:
Li et al. 2018, "Offline evaluation of ranking policies with click models";
Open Bandit Pipeline's ``pscore_item_position``). Where the arms' indices are
independent normals (LinReBoot; the baselines with a model per arm), every
arm random, no epsilon and no arm left to explore, it is a one-dimensional
integral: arm a is at position j when exactly j - 1 of the others score
higher, so ``P(a at j) = int phi_a(t) PB_(j-1)(t) dt`` with ``PB_m(t)`` the
Poisson-binomial probability that m of the other arms exceed t (each with
probability ``1 - F_b(t)``), by the trapezoidal rule on arm a's normal grid
(a recursion over the other arms per node; for j = 1 the product of their
CDFs, :func:`policies.propensity.propensities`' integrand). Elsewhere it is
estimated by drawing the ranking again with a seeded generator: a standard
error of at most ``sqrt(p (1 - p) / draws)``, the same for the same statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import special

from policies.authors import index_of
from policies.policy import Ready, _highest, _uniform, draw
from policies.ridge import Array

_Z = 6.0  # each arm's grid spans its mean +- this many spreads (tails 1e-9)
_STEP = 0.25  # node spacing, in the narrowest spread's units (at most arm a's own)
_MAX_NODES = 20_000  # beyond (spreads many orders apart), the estimate instead


@dataclass(frozen=True)
class Ranking:
    """Rankings for a batch of experiments.

    Attributes
    ----------
    arms : ndarray of int, shape (B, k)
        The arm at each position, the first the most preferred.
    scores : ndarray, shape (B, K)
        The index of every arm the ranking was made from (as ``Choice.scores``).
    """

    arms: NDArray[np.int64]
    scores: Array


def rank(ready: Ready, rngs: Sequence[np.random.Generator], k: int) -> Ranking:
    """Order ``k`` distinct eligible arms per experiment (see the module notes).

    Raises
    ------
    ValueError
        If an experiment has fewer than ``k`` eligible arms, or ``k < 1``.
    """
    eligible_counts = ready.eligible.sum(axis=1)
    if k < 1 or (eligible_counts < k).any():
        fewest = int(eligible_counts.min())
        raise ValueError(f"k must be between 1 and the eligible arms ({fewest})")
    first = draw(ready, rngs)
    batch = ready.eligible.shape[0]
    arms = np.empty((batch, k), dtype=np.int64)
    arms[:, 0] = first.arms
    rows = np.arange(batch)
    left = ready.eligible.copy()
    left[rows, first.arms] = False
    for position in range(1, k):
        arms[:, position] = _next(ready, first.scores, left, rngs)
        left[rows, arms[:, position]] = False
    return Ranking(arms=arms, scores=first.scores)


def _next(ready: Ready, scores: Array, left: NDArray[np.bool_],
          rngs: Sequence[np.random.Generator]) -> NDArray[np.int64]:
    """Each experiment's next arm among those ``left``, from the same ``scores``."""
    unexplored = ready.unexplored & left
    exploring = np.flatnonzero(unexplored.any(axis=1))
    masked = np.where(left, np.where(unexplored, np.inf, scores), -np.inf)
    arms = _highest(masked, exploring, rngs)
    if exploring.size:
        arms[exploring] = _uniform(rngs, exploring, unexplored[exploring])
    if ready.config.epsilon > 0.0:
        for row in range(arms.shape[0]):
            if rngs[row].random() < ready.config.epsilon:
                arms[row] = _uniform(rngs, np.array([row]), left[row: row + 1])[0]
    return arms


def position_propensities(ready: Ready, ranking: Ranking, *, draws: int = 4096,
                          seed: int = 20261128) -> Array:
    """The probability that :func:`rank` of ``ready`` puts each of ``ranking``'s arms at
    its position, shape (B, k): the integral where it serves (module notes), else
    estimated from ``draws`` rankings drawn with a generator seeded by ``seed`` (and
    the experiment's row) and the ranking itself (so that an arm placed never gets 0,
    which inverse-propensity weights could not use), each estimate within
    ``sqrt(p (1 - p) / draws) + 1 / draws`` of the probability at one standard error."""
    exact = _normal_positions(ready, ranking.arms)
    return exact if exact is not None else _estimated(ready, ranking, draws, seed)


def _normal_positions(ready: Ready, placed: NDArray[np.int64]) -> Array | None:
    """The integral of the module notes for every experiment, or None where it does
    not serve (another law, epsilon, an arm to explore, a point mass, spreads too far
    apart)."""
    if ready.config.epsilon > 0.0 or ready.exploring_rows.size:
        return None
    law = index_of(ready.config).law(ready.config, ready.prepared)
    if law.spread is None or law.dof is not None or law.loadings is not None:
        return None
    out = np.empty(placed.shape)
    for row in range(placed.shape[0]):
        arms = np.flatnonzero(ready.eligible[row])
        mean, spread = law.mean[row, arms], law.spread[row, arms]
        if not np.all(spread > 0.0):
            return None
        values = _at_positions(mean, spread, np.searchsorted(arms, placed[row]))
        if values is None:
            return None
        out[row] = values
    return out


def _at_positions(mean: Array, spread: Array, placed: NDArray[np.int64]) -> Array | None:
    """``P(placed[j] at position j)`` among independent normal indices, for every j at
    once: one grid per placed arm (its own normal's nodes), one recursion over the
    arms for all the grids' nodes."""
    grids, owners, weights = [], [], []
    for arm in placed.tolist():
        others = np.arange(mean.size) != arm
        step = _STEP * min(1.0, float(spread[others].min(initial=np.inf)) / float(spread[arm]))
        if 2 * _Z / step > _MAX_NODES:
            return None
        g = np.arange(-_Z, _Z + step / 2, step)
        grids.append(mean[arm] + spread[arm] * g)
        owners.append(np.full(g.size, arm))
        weights.append(np.exp(-0.5 * g * g) * (step / np.sqrt(2.0 * np.pi)))
    t, owner = np.concatenate(grids), np.concatenate(owners)
    # count[n, m]: the probability that exactly m arms other than node n's own score
    # above its t (m <= k - 1): the Poisson-binomial recursion over the arms, an arm
    # counting as below its own nodes.
    count = np.zeros((t.size, placed.size))
    count[:, 0] = 1.0
    for b in range(mean.size):
        below = np.where(owner == b, 1.0, special.ndtr((t - mean[b]) / spread[b]))
        above = 1.0 - below
        count[:, 1:] = count[:, 1:] * below[:, None] + count[:, :-1] * above[:, None]
        count[:, 0] *= below
    out = np.empty(placed.size)
    start = 0
    for position, w in enumerate(weights):
        nodes = slice(start, start + w.size)
        out[position] = min(max(float(w @ count[nodes, position]), 0.0), 1.0)
        start += w.size
    return out


def _estimated(ready: Ready, ranking: Ranking, draws: int, seed: int) -> Array:
    batch, k = ranking.arms.shape
    rngs = [np.random.default_rng([seed, row]) for row in range(batch)]
    hits = np.ones((batch, k))  # the ranking made counts among the draws: never 0
    for _ in range(draws):
        hits += rank(ready, rngs, k).arms == ranking.arms
    return hits / (draws + 1)
