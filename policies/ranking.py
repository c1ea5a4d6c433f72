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

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import special

from policies.authors import index_of
from policies.policy import Ready, _highest, _uniform, draw
from policies.propensity import FINE, SMOOTH, Accuracy
from policies.ridge import Array

_WIDEST = 0.75  # the smooth rule's spacing with few arms counted (policies.propensity's)
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
    if k > 1 and ready.config.epsilon == 0.0 and not ready.unexplored.any():
        # No arm to explore, no epsilon: each next position is the highest score left,
        # drawing nothing unless scores tie (then the loop below, which splits ties
        # with the generators). One sort instead of k - 1 passes; the same arms.
        masked = np.where(left, first.scores, -np.inf)
        order = np.argsort(-masked, axis=1, kind="stable")[:, :k]
        top = np.take_along_axis(masked, order, axis=1)
        if np.all(top[:, :-1] > top[:, 1:]):  # k - 1 placed and the next: no tie
            arms[:, 1:] = order[:, :k - 1]
            return Ranking(arms=arms, scores=first.scores)
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
                          seed: int = 20261128, accuracy: Accuracy = FINE) -> Array:
    """The probability that :func:`rank` of ``ready`` puts each of ``ranking``'s arms at
    its position, shape (B, k): :func:`placement_propensities` of the ranking made (so
    an estimate counts it among its draws)."""
    positions = np.broadcast_to(np.arange(ranking.arms.shape[1]), ranking.arms.shape)
    return placement_propensities(ready, ranking.arms, positions, draws=draws, seed=seed,
                                  made=True, accuracy=accuracy)


def placement_propensities(ready: Ready, arms: NDArray[np.int64], positions: NDArray[np.int64],
                           *, draws: int = 4096, seed: int = 20261128,
                           made: bool = False, accuracy: Accuracy = FINE) -> Array:
    """The probability that :func:`rank` of ``ready`` puts ``arms[b, i]`` at position
    ``positions[b, i]`` (from 0), shape (B, n): what a slate's estimator asks of a
    target that did not make the ranking. The integral where it serves (module notes);
    for a deterministic index (every spread 0: LinUCB, greedy) 1 or 0 by the order of
    the scores, unless scores tie; else estimated from ``draws`` rankings drawn with a
    generator seeded by ``seed`` (and the experiment's row), each estimate within
    ``sqrt(p (1 - p) / draws)`` of the probability at one standard error; with
    ``made``, the placements are a ranking this law made, counted among the draws (so
    that an arm placed never gets 0, which inverse-propensity weights could not use:
    ``+ 1 / draws`` at most). ``accuracy``: the integral's (:data:`policies.propensity.FINE`,
    below 1e-4: 1e-6 against adaptive quadrature in the tests; ``SERVICE``, below
    1e-3)."""
    exact = _normal_positions(ready, arms, positions, accuracy)
    if exact is None:
        exact = _ordered_positions(ready, arms, positions)
    if exact is not None:
        return exact
    return _estimated(ready, arms, positions, draws, seed, made)


def _normal_positions(ready: Ready, placed: NDArray[np.int64], positions: NDArray[np.int64],
                      accuracy: Accuracy = FINE) -> Array | None:
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
        values = _at_positions(mean, spread, np.searchsorted(arms, placed[row]),
                               positions[row], accuracy)
        if values is None:
            return None
        out[row] = values
    return out


def _ordered_positions(ready: Ready, arms: NDArray[np.int64],
                       positions: NDArray[np.int64]) -> Array | None:
    """A deterministic index's placements (every eligible arm's spread 0, no epsilon,
    nothing to explore): 1 where the arm's score is the position's in the order of the
    scores, else 0; None where that does not serve (another law; scores that tie)."""
    if ready.config.epsilon > 0.0 or ready.exploring_rows.size:
        return None
    law = index_of(ready.config).law(ready.config, ready.prepared)
    if law.spread is None or law.loadings is not None:
        return None
    out = np.empty(arms.shape)
    for row in range(arms.shape[0]):
        eligible = np.flatnonzero(ready.eligible[row])
        if np.any(law.spread[row, eligible] != 0.0):
            return None
        scores = law.mean[row, eligible]
        if np.unique(scores).size < scores.size:
            return None  # ties split at random
        order = eligible[np.argsort(-scores, kind="stable")]
        out[row] = order[positions[row]] == arms[row]
    return out


def _at_positions(mean: Array, spread: Array, placed: NDArray[np.int64],
                  positions: NDArray[np.int64] | None = None,
                  accuracy: Accuracy = FINE) -> Array | None:
    """``P(placed[i] at positions[i])`` (from 0; default i) among independent normal
    indices, for every i at once (the module notes' integral), on each placed arm's own
    nodes.

    For arm a at position j, an arm whose window (mean +- ``accuracy.z`` spreads) lies above
    arm a's is above it for sure: it only shifts how many of the others must score
    higher (``j`` less those); below the (j + 1)-th highest window start among the
    others, j + 1 arms score higher for sure (the integrand is 0: the integral starts
    there, as :func:`policies.propensity.propensities` starts at its floor); an arm
    whose window ends below that start is below for sure. Only the arms left, those
    that may cross arm a's nodes, enter the Poisson-binomial recursion, so after some
    learning (windows apart) a ranking of 10 of 100 arms counts a few arms, not 99.
    Nodes are :func:`policies.propensity`'s smooth trapezoid rule, spaced
    ``accuracy.ranked_step / sqrt(n)`` (at most 0.75; n the arms counted) of the
    narrowest counted spread (arm a's at most) in arm a's standard units: the integrand
    narrows as arms crowd (K identical arms: tests/test_ranking.py), from the start to
    +``accuracy.z`` (the
    tail beyond holds ``Phi(-z)``), or the finer ``accuracy.step`` where a counted arm
    is narrower than ``SMOOTH`` times arm a; None (the estimate instead) where that
    would take more than ``_MAX_NODES``."""
    size, z = mean.size, accuracy.z
    low, high = mean - z * spread, mean + z * spread
    grids, owners, columns, counted, steps = [], [], [], [], []
    at = np.arange(placed.size) if positions is None else positions
    for i, (position, arm) in enumerate(zip(at.tolist(), placed.tolist(), strict=True)):
        others = np.arange(size) != arm
        surely_above = others & (low > high[arm])
        column = position - int(np.count_nonzero(surely_above))
        starts = np.sort(low[others & ~surely_above])[::-1]
        # Below the (column + 1)-th highest start, that many more score higher for sure.
        start = max(float(low[arm]), float(starts[column])
                    if 0 <= column < starts.size else -np.inf)
        crossing = others & ~surely_above & (high > start)
        ratio = float(spread[crossing].min(initial=np.inf)) / float(spread[arm])
        # The integrand is a bump of arm a's density and the probability that exactly
        # `column` of n counted arms score higher: about 1 / sqrt(n) as wide as arm a's
        # spread (K identical arms: 0.15 spreads at n = 100 holds 6e-8 relative, 0.25 only
        # 3e-4), so the nodes close in as sqrt(n) grows.
        # (in the narrowest counted spread's units either way: a crowd of narrow arms
        # narrows it as much; review, session 16)
        crowd = accuracy.ranked_step / math.sqrt(max(int(np.count_nonzero(crossing)), 1))
        step = (min(_WIDEST, crowd) * min(ratio, 1.0) if ratio >= SMOOTH
                else min(accuracy.step, crowd) * ratio)
        first = math.ceil((start - mean[arm]) / spread[arm] / step)
        last = math.floor(z / step)
        if column < 0 or last < first:  # an arm surely above it, or no room: probability 0
            first, last = 1, 0
        if last - first > _MAX_NODES:
            return None
        g = np.arange(first, last + 1) * step
        grids.append(g)
        owners.append(np.full(g.size, i))
        columns.append(max(column, 0))
        counted.append(crossing)
        steps.append(step)
    g, owner = np.concatenate(grids), np.concatenate(owners)
    arms = np.flatnonzero(np.any(counted, axis=0))  # counted for some placed arm
    t = mean[placed][owner] + spread[placed][owner] * g
    # below[n, b]: arm b's index below node n's t; 1 where arm b is not counted for
    # node n's arm (surely above: in the column's shift; surely below; the arm itself).
    below = special.ndtr((t - mean[arms, None]) / spread[arms, None])  # (arms, nodes)
    below = np.where(np.asarray(counted)[:, arms].T[:, owner], below, 1.0)
    above = 1.0 - below
    count = np.zeros((max(columns) + 1, t.size))  # P(exactly m counted arms above), by m
    count[0] = 1.0
    shifted = np.empty_like(count[:-1])
    for under, over in zip(below, above, strict=True):
        np.multiply(count[:-1], over, out=shifted)
        count *= under
        count[1:] += shifted
    out = np.zeros(placed.size)
    density = np.exp(-0.5 * g * g) * count[np.asarray(columns)[owner], np.arange(t.size)]
    np.add.at(out, owner, density)
    return np.clip(out * np.asarray(steps) / np.sqrt(2.0 * np.pi), 0.0, 1.0)


def _estimated(ready: Ready, arms: NDArray[np.int64], positions: NDArray[np.int64],
               draws: int, seed: int, made: bool) -> Array:
    batch = arms.shape[0]
    rngs = [np.random.default_rng([seed, row]) for row in range(batch)]
    k = int(positions.max()) + 1
    rows = np.arange(batch)[:, None]
    hits = np.ones(arms.shape) if made else np.zeros(arms.shape)
    for _ in range(draws):
        hits += rank(ready, rngs, k).arms[rows, positions] == arms
    return hits / (draws + 1 if made else draws)
